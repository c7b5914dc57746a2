"""The data folder's log (``logs/iris.log``): one private, rotating file for the CLI and
the desktop app. Tracebacks go there, never to the user's stderr (``-v`` adds stderr)."""

from __future__ import annotations

import logging
import logging.handlers
import os
from pathlib import Path

from iris_desktop.paths import make_private_dir

#: rotated at 2 MiB, three older files kept
LOG_BYTES, LOG_BACKUPS = 2 * 1024 * 1024, 3


class PrivateLogFile(logging.handlers.RotatingFileHandler):
    """``logs/iris.log``, 0600 in a 0700 folder (the log names threads and files), opened
    at its first record. A log that cannot be written is given up silently: it is never
    a reason to fail or to print."""

    def __init__(self, path: Path):
        super().__init__(path, maxBytes=LOG_BYTES, backupCount=LOG_BACKUPS, encoding="utf-8",
                         delay=True)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(threadName)s] "
                                            "%(message)s"))
        self._iris = True  # one per process: the GUI's setup_logging finds the CLI's

    def _open(self):
        make_private_dir(Path(self.baseFilename).parent)
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        if os.name == "posix":
            os.fchmod(fd, 0o600)  # a log written before this rule existed
        return open(fd, self.mode, encoding=self.encoding, errors="backslashreplace")

    def handleError(self, record: logging.LogRecord) -> None:
        pass

    def flush(self) -> None:
        try:
            super().flush()
        except OSError:  # a full disk: what the log holds unwritten is given up
            pass

    def close(self) -> None:
        try:
            super().close()  # (the file is closed even when its last flush fails)
        except OSError:  # a full disk at exit: the CLI ended with a traceback
            pass
