"""The window follows the settings file: ``config set`` in a terminal, or an editor's save,
is in force in a running window (a new budget ratio or theme waited until Preferences
was opened, though the help says "Applies at once").

The file and its folder are watched: an editor, and Iris's own writes, replace the file
with a new one (the old one's watch then ends). Changes are read once they pause
(``DELAY_MS``), so an editor that saves as it is typed is read once, not per keystroke,
and a file that cannot be read mid-write keeps the settings in force and is said once
in the status bar, never in a box."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QFileSystemWatcher, QObject, QTimer

from iris_desktop.ui.app_state import AppState, kept

log = logging.getLogger("iris.ui")

#: how long the file must stay unchanged before it is read
DELAY_MS = 400
#: the longest a read waits for the folder to rest
MAX_WAIT_S = 2.0


class ConfigWatch(QObject):
    """Reads ``path`` again when it changes and puts what changed there in force
    (``AppState.follow_file``); ``describe(keys)`` (the window's) words the keys put
    in force."""

    def __init__(self, app_state: AppState, path: Path, parent: QObject | None = None,
                 describe: Callable[[list[str]], str] | None = None):
        super().__init__(parent)
        self.app_state = app_state
        self.path = Path(path)
        #: what the window says of the keys put in force (``Menus.file_followed``)
        self.describe = describe
        self.watcher = QFileSystemWatcher(self)
        self.watcher.fileChanged.connect(self._changed)
        self.watcher.directoryChanged.connect(self._changed)
        self.timer = QTimer(self, singleShot=True, interval=DELAY_MS)
        self.timer.timeout.connect(self.follow)
        self._seen = self._stamp()
        #: what the status bar said last, so that it is said once
        self._said: str | None = None
        self._since = 0.0  # when the changes now waited on began
        self._unreadable = False  # the file could not be read, and that was said
        self.stopped = False
        self._watch()

    def stop(self) -> None:
        """The window shuts down: nothing is watched or followed from now on (before, a
        change made just before quitting was put in force after the host had closed, and
        ``model.kv_cache_mb 0`` deleted the saved states on its way out). Idempotent."""
        self.stopped = True
        self.timer.stop()
        watched = self.watcher.files() + self.watcher.directories()
        if watched:
            self.watcher.removePaths(watched)

    def _watch(self) -> None:
        """Watch the folder, and the file when there is one (again after a replace)."""
        if self.stopped:
            return
        for path in (self.path.parent, self.path):
            name = str(path)
            if name not in self.watcher.files() + self.watcher.directories() and path.exists():
                self.watcher.addPath(name)

    def _stamp(self) -> tuple[int, int, int] | None:
        """The file's identity, time and size: any other file of the folder (the
        database's journal, the window's state) changes nothing of it."""
        try:
            info = os.stat(self.path)
        except OSError:
            return None
        return info.st_ino, info.st_mtime_ns, info.st_size

    def _changed(self, _path: str = "") -> None:
        if self.stopped:
            return
        self._watch()
        now = time.monotonic()
        if not self.timer.isActive():
            self._since = now
        if now - self._since < MAX_WAIT_S:  # again: read once the writes pause, but a
            self.timer.start()  # folder that never rests (the database's journal) waits no more

    def follow(self) -> list[str]:
        """Read the file if it changed since last seen; the keys put in force."""
        if self.stopped:
            return []
        self._watch()
        stamp = self._stamp()
        if stamp == self._seen:
            return []
        self._seen = stamp
        try:
            keys, problems = self.app_state.follow_file()
        except Exception as exc:  # mid-write, broken by hand: the settings in force stay
            log.warning("settings: %s", exc)
            self._say(f"The settings file changed: {exc}")
            self._unreadable = True
            return []
        said = self._followed(keys) if keys else ""
        if self._unreadable and not problems:  # its problems said before it could not be
            problems = [kept(p) for p in self.app_state.file_problems]  # read: they stand again
        self._unreadable = False
        for problem in problems:
            log.warning("settings: %s", problem)
        # one message for one save: what is in force and what is not taken (the problem
        # replaced the keys at once, unsaid); a problem said before and gone now is said
        # gone (its message stayed up after the file was fixed, never taken back)
        fine = self._said is not None and not problems and not self.app_state.file_problems
        if problems:
            self._say(f"{said}. Not taken: {'; '.join(problems)}" if said else
                      "The settings file changed: " + "; ".join(problems))
        elif said or fine:
            self._said = None
            if fine:
                said = f"{said}. It is fine again" if said else "The settings file is fine again"
            self.app_state.show_message(said, 15_000)
        return keys

    def _followed(self, keys: list[str]) -> str:
        """What the window says of ``keys`` (``describe``: ``Menus.file_followed``), to be
        said with the file's problems, or that the file is fine again, in one message
        (two messages cut each other off)."""
        log.info("settings file changed: %s", ", ".join(keys))
        return self.describe(keys) if self.describe is not None else ""

    def _say(self, text: str) -> None:
        if text != self._said:
            self._said = text
            self.app_state.show_message(text, 15_000)
