"""The data folder's log (``logs/iris.log``): one private, rotating file for the CLI and
the desktop app. Tracebacks go there, never to the user's stderr (``-v`` adds stderr)."""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
from pathlib import Path

from iris_desktop.files import file_kind
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

    #: the log's place holds what is no file (a named pipe): said once, nothing logged
    gave_up = False

    def _open(self):
        make_private_dir(Path(self.baseFilename).parent)
        # O_NONBLOCK: a named pipe in the log's place never holds the open (before, every
        # command waited for ever for a reader of logs/iris.log)
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND
                     | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0), 0o600)
        try:
            kind = file_kind(os.fstat(fd).st_mode)
            if kind:
                raise IsADirectoryError(f"{self.baseFilename} is {kind}")
            if os.name == "posix":
                os.set_blocking(fd, True)
                os.fchmod(fd, 0o600)  # a log written before this rule existed
        except OSError:
            os.close(fd)
            raise
        return open(fd, self.mode, encoding=self.encoding, errors="backslashreplace")

    def emit(self, record: logging.LogRecord) -> None:
        if self.gave_up:
            return
        if self.stream is None:
            try:
                kind = file_kind(os.stat(self.baseFilename).st_mode)
            except OSError:  # none yet (it is made), or none that can be looked at
                kind = None
            if kind:  # (looked at before the open too: a pipe with a reader takes records)
                self._give_up(kind)
                return
        super().emit(record)

    def _give_up(self, kind: str) -> None:
        """No log file for this run, said once on stderr (a log is never a reason to fail)."""
        self.gave_up = True
        try:
            print(f"iris-desktop: warning: the log {self.baseFilename} is {kind}, not a file; "
                  "nothing is logged this run (move it away)", file=sys.stderr)
        except (OSError, ValueError, AttributeError):  # no stderr (a launcher)
            pass

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
