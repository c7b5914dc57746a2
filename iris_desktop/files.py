"""The ground floor for files Iris writes: one atomic, fsynced, private writer.

Every file Iris writes whole (settings, exports, records, sidecars, downloaded or derived
model files, KV states) goes through :func:`atomic_output` or :func:`atomic_write`: the
bytes go to a temporary file beside the target, named by :func:`temp_name` (one rule, so
:func:`clean_leftovers` can find what a killed process left), are flushed and fsynced,
and only then replace the target with ``os.replace``; the folder is fsynced after, so the
rename itself survives a power cut. A failure on the way (a full disk, a kill) leaves the
old file as it was, never half of a new one. Nothing here imports the rest of Iris:
``core`` and ``runtime`` both stand on it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

#: every temporary file of the writer ends so; :func:`clean_leftovers` looks for it
TEMP_SUFFIX = ".iris-tmp"
#: where files cannot be locked, a temporary file untouched this long is a killed write's
UNLOCKED_STALE_S = 3600


def private_file(path: str | os.PathLike[str]) -> None:
    """Make ``path`` a file only its owner may read (0600), created empty when missing: a
    file another library then writes in place, or replaces keeping its mode (Qt's
    QSettings does both), stays private whatever the umask."""
    if os.name != "posix":
        return
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        os.chmod(path, 0o600)
    except OSError:  # an unwritable folder: the writer will say so itself
        pass


def temp_name(path: Path) -> Path:
    """The temporary file a write of ``path`` goes to first: hidden, beside it, unique to
    this write (pid and a random part), ending with TEMP_SUFFIX."""
    return path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}{TEMP_SUFFIX}")


def fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # Windows cannot open a folder; its renames are durable already
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str], mode: int = 0o600,
                  keep_mode: bool = False) -> Iterator[BinaryIO]:
    """A binary handle whose bytes replace ``path`` only when the block ends without an
    exception: written to :func:`temp_name` (locked by this process while it is written,
    so :func:`clean_leftovers` in another process leaves it alone), fsynced, renamed over
    ``path``, the folder fsynced. On any exception the temporary file is removed and
    ``path`` is untouched. A new file gets ``mode`` (private by default); with
    ``keep_mode`` an existing regular file keeps its own. Raises OSError (the folder must
    exist)."""
    path = Path(path)
    if keep_mode:
        with contextlib.suppress(OSError):
            current = os.stat(path)
            if stat.S_ISREG(current.st_mode):
                mode = stat.S_IMODE(current.st_mode)
    tmp, fd = _open_locked(path, mode)
    try:
        with os.fdopen(fd, "wb") as handle:  # closing it releases the lock, after the rename
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
            if fcntl is not None:
                os.replace(tmp, path)
        if fcntl is None:  # Windows cannot rename a file that is open (WinError 32)
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def commit_partial(partial: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Give a file written in place over time (a resumable download's ``.partial``) its
    final name, as :func:`atomic_output` does: its bytes fsynced, the rename, the folder
    fsynced. Raises OSError."""
    with open(partial, "rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(partial, target)
    fsync_dir(Path(target).parent)


def move_file(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Move a whole file to another name in the same file system (an older layout's
    download to where it is kept now), durably: the rename, then both folders fsynced.
    Raises OSError."""
    os.replace(source, target)
    fsync_dir(Path(target).parent)
    fsync_dir(Path(source).parent)


def atomic_write(path: str | os.PathLike[str], data: bytes | str, mode: int = 0o600,
                 keep_mode: bool = False) -> None:
    """Replace ``path`` with ``data`` (text is written as UTF-8) atomically; see
    :func:`atomic_output`. Raises OSError."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_output(path, mode=mode, keep_mode=keep_mode) as handle:
        handle.write(payload)


def _open_locked(path: Path, mode: int) -> tuple[Path, int]:
    """A new temporary file for ``path``, open for writing and locked by this process."""
    while True:
        tmp = temp_name(path)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), mode)
        if fcntl is None:
            return tmp, fd  # Windows: an open file cannot be deleted
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a file system without locks: no cleaner can take it either
            return tmp, fd
        except BaseException:
            os.close(fd)
            raise
        try:
            # a cleaner may have taken it between the open and the lock: then write another
            if os.path.samestat(os.fstat(fd), os.stat(tmp)):
                return tmp, fd
        except FileNotFoundError:
            pass
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def _delete_if_abandoned(tmp: Path) -> bool:
    """Delete ``tmp`` if no process is writing it (its writer was killed); True if it
    was. OSError when it vanished meanwhile."""
    if fcntl is None:  # Windows: the file of a live writer is open, and cannot be deleted
        try:
            tmp.unlink()
        except PermissionError:
            return False
        return True
    fd = os.open(tmp, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # its writer is alive
        except OSError:  # a file system without locks: only its age tells (a write takes seconds)
            if time.time() - os.fstat(fd).st_mtime < UNLOCKED_STALE_S:
                return False
        if not os.path.samestat(os.fstat(fd), os.stat(tmp)):
            return False  # renamed into place meanwhile, and the name taken again
        tmp.unlink()
        return True
    finally:
        os.close(fd)


@dataclass
class Leftovers:
    """What :func:`clean_leftovers` found: the files it removed, and the bytes of the
    temporary files still being written by a live process."""

    removed: list[Path] = field(default_factory=list)
    held_bytes: int = 0


def clean_leftovers(folder: str | os.PathLike[str], *legacy: str) -> Leftovers:
    """Remove the temporary files that killed writes left in ``folder`` (those a live
    writer holds are counted, not touched); ``legacy`` globs name the temporary files of
    older Iris versions, cleaned the same way. A folder that cannot be read removes
    nothing."""
    found = Leftovers()
    try:
        entries = [p for p in Path(folder).glob(f".*{TEMP_SUFFIX}")]
        for pattern in legacy:
            entries += Path(folder).glob(pattern)
    except OSError:
        return found
    for entry in dict.fromkeys(entries):
        try:
            size = entry.stat().st_size
            if not stat.S_ISREG(entry.lstat().st_mode):
                continue
            if _delete_if_abandoned(entry):
                found.removed.append(entry)
                continue
        except OSError:  # vanished meanwhile (its write finished), or not ours to delete
            continue
        found.held_bytes += size
    return found


def free_bytes(folder: str | os.PathLike[str]) -> int | None:
    """Bytes free where ``folder`` is (its nearest existing parent): the one free-space
    measure of every check before a large write; None when the system does not say."""
    current = Path(folder)
    while not current.exists() and current.parent != current:
        current = current.parent
    try:
        return shutil.disk_usage(current).free
    except OSError:
        return None


class Busy(OSError):
    """Another process holds the lock (:func:`exclusive_lock` without waiting)."""


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike[str], wait: bool = False, *,
                   follow: bool = True) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` (created private if missing) for the
    block: one process at a time, across processes, released however the process ends
    (the OS drops the lock with it). ``wait`` False: raise :class:`Busy` at once when
    another process holds it. ``follow`` False: a link in its place is refused (OSError,
    ELOOP), not followed to create or lock a file elsewhere, for a caller that can go on
    without the lock. The lock file itself is left for the next user."""
    nofollow = 0 if follow else getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_BINARY", 0) | nofollow, 0o600)
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                raise Busy(f"{path} is locked by another process") from None
        else:  # Windows
            import msvcrt

            try:
                msvcrt.locking(fd, msvcrt.LK_LOCK if wait else msvcrt.LK_NBLCK, 1)
            except OSError:
                raise Busy(f"{path} is locked by another process") from None
        yield
    finally:
        if fcntl is not None:  # released for every copy of the descriptor: a child forked
            with contextlib.suppress(OSError):  # meanwhile (the search's worker) holds one
                fcntl.flock(fd, fcntl.LOCK_UN)  # until it ends, and closing ours alone kept
        os.close(fd)  # the lock held that long (Windows: closing releases it)


# -- reading a file that may not be one -----------------------------------------------


class NotAFileError(OSError):
    """Something that is not a regular file (a folder, a device, a named pipe, a socket);
    ``kind`` says which, as "a named pipe (FIFO)"."""

    def __init__(self, kind: str):
        super().__init__(kind)
        self.kind = kind


class TooLargeError(OSError):
    """A file larger than the limit; ``size`` is its size, or None when it grew past the
    limit while it was read."""

    def __init__(self, size: int | None):
        super().__init__(size)
        self.size = size


def file_kind(mode: int) -> str | None:
    """What a file of ``mode`` is when it is not a regular file ("a folder", "a named pipe
    (FIFO)", …); None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    for test, kind in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return kind
    return "a special file"


#: O_NONBLOCK: a named pipe swapped in after the check cannot make the open wait for a
#: writer. O_BINARY: no newline translation (Windows).
_READ_FLAGS = (os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
               | getattr(os, "O_BINARY", 0))


def read_regular_file(path: str | Path, limit: int) -> bytes:
    """The bytes of the regular file ``path``, of at most ``limit`` bytes. What is not a
    regular file is refused by its type before it is opened (``/dev/zero`` never ends, a
    named pipe may never be written to), and again once open, without blocking; never
    more than ``limit`` + 1 bytes are read, even from a file that grows meanwhile. Raises
    NotAFileError, TooLargeError or another OSError."""
    kind = file_kind(os.stat(path).st_mode)
    if kind:
        raise NotAFileError(kind)
    fd = os.open(path, _READ_FLAGS)
    try:
        info = os.fstat(fd)
        kind = file_kind(info.st_mode)
        if kind:  # replaced between the two looks
            raise NotAFileError(kind)
        if info.st_size > limit:
            raise TooLargeError(info.st_size)
        chunks: list[bytes] = []
        size = 0
        while size <= limit:  # what the size says and 64 KiB more at a time: a /proc file says 0
            chunk = os.read(fd, min(limit + 1 - size, max(info.st_size - size, 0) + 65536))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise TooLargeError(None)
    return b"".join(chunks)


# -- a JSON record that only helps ----------------------------------------------------


#: the largest small JSON record read (records and settings that only help are kilobytes)
JSON_RECORD_LIMIT = 16 * 2**20


def read_json_object(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON object in ``path``; {} when the file is missing or unreadable, is not
    UTF-8 JSON or holds something other than an object. For records and settings files
    that only help (a download's record, another app's settings): a bad one is passed
    over, never a reason to fail."""
    try:  # (a named pipe in its place waited for ever; nesting too deep raised)
        data = json.loads(read_regular_file(path, JSON_RECORD_LIMIT).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}
