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
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

#: every temporary file of the writer ends so; :func:`clean_leftovers` looks for it
TEMP_SUFFIX = ".iris-tmp"


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
    exception: written to :func:`temp_name`, fsynced, renamed over ``path``, the folder
    fsynced. On any exception the temporary file is removed and ``path`` is untouched.
    A new file gets ``mode`` (private by default); with ``keep_mode`` an existing
    regular file keeps its own. Raises OSError (the folder must exist)."""
    path = Path(path)
    if keep_mode:
        with contextlib.suppress(OSError):
            current = os.stat(path)
            if stat.S_ISREG(current.st_mode):
                mode = stat.S_IMODE(current.st_mode)
    tmp = temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write(path: str | os.PathLike[str], data: bytes | str, mode: int = 0o600,
                 keep_mode: bool = False) -> None:
    """Replace ``path`` with ``data`` (text is written as UTF-8) atomically; see
    :func:`atomic_output`. Raises OSError."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_output(path, mode=mode, keep_mode=keep_mode) as handle:
        handle.write(payload)


def clean_leftovers(folder: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary files that a killed write left in ``folder`` (those of a
    live write of this process are left alone: its pid is in the name). Returns what was
    removed; a folder that cannot be read removes nothing."""
    removed: list[Path] = []
    mine = f".{os.getpid()}-"
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return removed
    for entry in entries:
        name = entry.name
        if not (name.startswith(".") and name.endswith(TEMP_SUFFIX)) or mine in name:
            continue
        with contextlib.suppress(OSError):
            entry.unlink()
            removed.append(entry)
    return removed


def free_bytes(folder: str | os.PathLike[str]) -> int | None:
    """Bytes free for this user where ``folder`` is (its nearest existing parent);
    None when the system does not say."""
    current = Path(folder)
    while not current.exists() and current.parent != current:
        current = current.parent
    try:
        usage = os.statvfs(current)
    except (OSError, AttributeError):  # no statvfs on Windows
        try:
            import shutil

            return shutil.disk_usage(current).free
        except OSError:
            return None
    return usage.f_bavail * usage.f_frsize
