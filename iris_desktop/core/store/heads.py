"""The first bytes of a database file, read without dropping this process's locks on it.

SQLite keeps its locks on a database as POSIX advisory locks, and POSIX drops every lock a
process holds on a file when the process closes *any* descriptor of that file. So a
``with open(iris.db, "rb")`` while a connection of this process has the history open
takes away that connection's shared lock: the next Iris process to close its connection
then believes itself the last one, checkpoints, and deletes the ``-wal`` and ``-shm`` this
process still writes to. Both go on writing, to two logs: the history was damaged and a
whole import lost (the s67 data-safety audit: a search for text holding a NUL failed, and
its explanation read the file's header that way). SQLite itself never closes such a
descriptor while a lock on the file is held; here, likewise, a regular file is read
through a descriptor kept open for the life of the process, one per file (device and
inode), with ``os.pread``: never closed while the file exists, so no lock is ever dropped.
A descriptor of a file that has been deleted (a history converted or put back: no path
leads to it, so no other process can lock it) is closed at the next read.

Elsewhere (Windows: its locks are not dropped so, and an open handle would keep a file
from being replaced) and for what is not a regular file (a named pipe is opened without
waiting), the file is opened, read and closed as before.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

#: (device, inode) → the descriptor kept open to read that file's first bytes
_KEPT: dict[tuple[int, int], int] = {}
_LOCK = threading.Lock()
_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)


def head(path: Path, size: int) -> bytes:
    """The first ``size`` bytes of ``path`` (fewer for a shorter file; raises OSError
    as ``open`` does: FileNotFoundError for a missing file)."""
    if os.name != "posix":
        return _opened_and_closed(path, size)
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        return _opened_and_closed(path, size)
    with _LOCK:
        _forget_deleted()
        fd = _KEPT.get((info.st_dev, info.st_ino))
        if fd is None:
            fd = os.open(path, _FLAGS)
            opened = os.fstat(fd)  # (replaced between the two looks: kept for what was opened)
            # a file kept already (replaced by one kept before, between the two looks):
            # its descriptor is read, and this one is left open, never closed (the module)
            fd = _KEPT.setdefault((opened.st_dev, opened.st_ino), fd)
        return os.pread(fd, size, 0)


def kept_count() -> int:
    """How many descriptors are kept (for tests)."""
    with _LOCK:
        return len(_KEPT)


def _forget_deleted() -> None:
    """Close the kept descriptors of files no path leads to any more."""
    for where, fd in list(_KEPT.items()):
        try:
            gone = os.fstat(fd).st_nlink == 0
        except OSError:
            gone = True
        if gone:
            del _KEPT[where]
            try:
                os.close(fd)
            except OSError:
                pass


def _opened_and_closed(path: Path, size: int) -> bytes:
    fd = os.open(path, _FLAGS)
    with open(fd, "rb") as handle:
        return handle.read(size) or b""
