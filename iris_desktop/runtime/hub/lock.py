"""One download of a file at a time: a lock file beside its record (``flock`` on POSIX,
``msvcrt.locking`` on Windows) that a second download (another window or process) waits
for, saying so; and removing a partial file (:func:`discard_partial`), which takes the
same lock so that it never removes the partial file of a download under way."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from iris_desktop.paths import make_private_dir

from .client import HubError
from .progress import _Meter
from .records import _discard, _lock_file, _partial, _Place, _place, _record, _records_dir

log = logging.getLogger("iris.runtime.hub")

#: how often a download waiting for another download of the same file tries again
LOCK_POLL_S = 0.2


@contextlib.contextmanager
def _download_lock(place: _Place, name: str, cancel: threading.Event | None, meter: _Meter | None,
                   wait: bool) -> Any:
    """Hold the lock of the download of ``place``'s file (another process or window
    downloading the same file waits here, reporting "waiting"; ``wait`` False: HubError
    ``busy``)."""
    target = place.target
    path = _lock_file(place)
    waiting = False
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o600)
        try:
            locked = _try_lock(fd)
        except OSError as exc:  # a file system without locks: go on unguarded, as before
            log.warning("%s: cannot lock (%s); downloading without a lock", path, exc)
            locked = True
        if locked and _still_named(fd, path):
            break
        if locked:
            _unlock(fd)
        os.close(fd)
        if locked:
            continue  # the holder removed the name as it finished: lock the new one
        if not wait:
            raise HubError(f"Another download of {name} is running (another Iris window or "
                           "command); wait for it to end, or stop it first.", "busy")
        if cancel is not None and cancel.is_set():
            raise HubError(f"Stopped while another download of {name} was running; nothing "
                           "of this one was written.", "stopped")
        if not waiting:
            log.info("%s: another download of it is running; waiting", target)
        if meter is not None:
            meter(0, "waiting", force=not waiting)
        waiting = True
        time.sleep(LOCK_POLL_S)
    try:
        yield
    finally:
        if os.name != "nt":  # the name goes while it is locked, so no one locks a stale file
            with contextlib.suppress(OSError):
                path.unlink()
        _unlock(fd)
        os.close(fd)


def discard_partial(models_dir: str | os.PathLike[str], repo: str, file: str) -> bool:
    """Remove the partial download of ``file`` (and its record); True when one was there.
    While ``file`` is being downloaded (another window or command) nothing is removed:
    HubError ``busy`` (the download would fail, and everything it had would be lost)."""
    place = _place(models_dir, repo, file)
    target = place.target
    if not (_partial(target).exists() or _record(target).exists()):
        return False
    make_private_dir(_records_dir(place))
    try:
        with _download_lock(place, target.name, None, None, wait=False):
            return _discard(target)
    except HubError as exc:
        if exc.kind != "busy":
            raise
        raise HubError(f"A download of {target.name} is running in another window or command, so "
                       "its partial file was not removed; stop that download first, then remove "
                       "the partial file.", "busy") from None


def _try_lock(fd: int) -> bool:
    """Lock ``fd`` exclusively without waiting; False when another holds it. OSError when
    the file system cannot lock."""
    if os.name == "nt":
        import msvcrt

        os.lseek(fd, 0, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EDEADLK, getattr(errno, "EDEADLOCK", errno.EDEADLK)):
                return False
            raise
        return True
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _unlock(fd: int) -> None:
    with contextlib.suppress(OSError):
        if os.name == "nt":
            import msvcrt

            os.lseek(fd, 0, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        else:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_UN)


def _still_named(fd: int, path: Path) -> bool:
    """Whether ``path`` is still the file ``fd`` locked (POSIX: a finishing holder removes
    the name; Windows keeps it)."""
    if os.name == "nt":
        return True
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:
        return False
