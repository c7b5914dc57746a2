"""Where a file tool may look, and how it gets there: a path is resolved and checked to lie
inside the allowed folders (:func:`resolve`), then opened without following any link
(:func:`open_folder`, :func:`open_file_inside`), so swapping a name for a link meanwhile
cannot lead outside.

resolve() checks a path, but the name can be swapped for a link before it is opened.

* Linux and macOS (os.open takes dir_fd): the checked, link-free path is opened one name
  at a time from its allowed folder's descriptor with O_NOFOLLOW, so no link is followed
  after the check; a name swapped for one fails to open instead of leading outside.
* Windows (no dir_fd): a file is opened by path, then the handle's final path
  (GetFinalPathNameByHandleW) must lie inside the allowed folders. Folders are listed by
  path, so a folder swapped for a link mid-call can show names, never contents, outside.

The allowed folders themselves are trusted, and opened by path.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path

from iris_desktop.core.tools.limits import ToolError

_OPEN_BY_DIR_FD = (
    os.open in os.supports_dir_fd and os.scandir in os.supports_fd and hasattr(os, "O_NOFOLLOW")
)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
# O_NONBLOCK: opening a FIFO must not wait for a writer. O_BINARY: no newline translation.
_FILE_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)


def inside(path: Path, roots: Sequence[Path]) -> bool:
    return any(path.is_relative_to(root) for root in roots)


def folders(roots: Sequence[Path]) -> str:
    """The allowed folders as a tool's text names them."""
    return ", ".join(str(root) for root in roots)


def reason(exc: OSError) -> str:
    """Why an open or read failed, in words for the model."""
    if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a link where resolve() had found none
        return "it was swapped for a link while being opened; refused"
    return exc.strerror or str(exc)


def resolve(raw: str, roots: Sequence[Path]) -> Path:
    """``raw`` resolved (symlinks followed); ToolError unless inside ``roots``. A relative
    path starts at the first allowed folder."""
    if not raw.strip():
        raise ToolError("path must not be empty")
    try:
        candidate = Path(raw).expanduser()
    except RuntimeError:  # "~someone" with no such user, or no home folder known
        raise ToolError(f"cannot resolve path {raw!r}: {_home_of(raw)} is not known "
                        "here; give the path without it") from None
    except ValueError:
        raise ToolError(f"cannot resolve path {raw!r}: it is not a valid path") from None
    try:
        if not candidate.is_absolute():
            candidate = roots[0] / candidate
        resolved = candidate.resolve()
    except OSError as exc:  # its text names the path, which may lie outside: say why only
        raise ToolError(f"cannot resolve path {raw!r}: {exc.strerror or 'not readable'}") from None
    except RuntimeError:
        raise ToolError(f"cannot resolve path {raw!r}: it is a loop of links") from None
    except ValueError:
        raise ToolError(f"cannot resolve path {raw!r}: it is not a valid path") from None
    if not inside(resolved, roots):
        # Never say where a link leads: what lies outside is none of the model's business
        # (and with a server backend, this text is sent to the server).
        if inside(Path(os.path.normpath(candidate)), roots):
            raise ToolError(f"{raw!r} is a link that leads outside the allowed folders "
                            f"({folders(roots)})")
        raise ToolError(f"{raw!r} is outside the allowed folders ({folders(roots)})")
    try:  # a name too long for the system failed later, as "read_file failed: OSError"
        resolved.stat()
    except OSError as exc:
        if exc.errno not in _MISSING:
            raise ToolError(f"cannot resolve path {raw!r}: {exc.strerror or 'not readable'}"
                            ) from None
    return resolved


#: what a path that does not lie there (yet) gives: each tool says that in its own words
_MISSING = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)


def _home_of(raw: str) -> str:
    """The ``~`` or ``~user`` that ``raw`` starts with, as a phrase."""
    head = raw.replace("\\", "/").split("/", 1)[0]
    return "the home folder" if head == "~" else f"the user {head[1:]!r}"


def display(path: Path, roots: Sequence[Path]) -> str:
    """How a path is shown: relative to the first folder when under it, so it can be
    passed straight back to another tool; absolute otherwise."""
    if path != roots[0] and path.is_relative_to(roots[0]):
        return path.relative_to(roots[0]).as_posix()
    return str(path)


class Folder:
    """A folder being looked into: by descriptor where ``os.open`` takes ``dir_fd``, by path
    elsewhere. Names in it are opened without following links. Closes on exit."""

    def __init__(self, path: Path, fd: int | None) -> None:
        self.path = path  # for showing, and for resolving the links found in it
        self.fd = fd

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *_: object) -> None:
        if self.fd is not None:
            os.close(self.fd)

    def entries(self) -> list[os.DirEntry[str]]:
        """Its entries, unsorted; their ``stat()`` goes through the descriptor."""
        with os.scandir(self.path if self.fd is None else self.fd) as scan:
            return list(scan)

    def subfolder(self, name: str) -> Folder:
        """The folder ``name`` in this one, open; OSError when it is a link or not a folder."""
        if self.fd is None:
            return Folder(self.path / name, None)
        fd = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=self.fd)
        return Folder(self.path / name, fd)

    def open_file(self, name: str, roots: Sequence[Path]) -> int:
        """A descriptor to read ``name`` in this folder; OSError when it is a link (on
        Windows: a link that leads outside ``roots``)."""
        if self.fd is not None:
            return os.open(name, _FILE_FLAGS | os.O_NOFOLLOW, dir_fd=self.fd)
        fd = os.open(self.path / name, _FILE_FLAGS)
        try:
            if not inside(_final_path(fd), roots):
                raise PermissionError(errno.EACCES, "it leads outside the allowed folders", name)
        except OSError:
            os.close(fd)
            raise
        return fd

    def lstat(self, name: str) -> os.stat_result:
        """``lstat`` of ``name`` in this folder."""
        where = self.path / name if self.fd is None else name
        return os.stat(where, dir_fd=self.fd, follow_symlinks=False)


def open_folder(path: Path, roots: Sequence[Path]) -> Folder:
    """The folder at ``path`` (resolved, inside ``roots``), reached from its allowed folder
    one name at a time without following a link. OSError when that fails."""
    if not _OPEN_BY_DIR_FD:
        return Folder(path, None)
    root = next((root for root in roots if path.is_relative_to(root)), None)
    if root is None:
        raise PermissionError(errno.EACCES, "outside the allowed folders", str(path))
    folder = Folder(root, os.open(root, _DIR_FLAGS))
    for name in path.relative_to(root).parts:
        with folder:  # the parent closes once its child is open, or failed to open
            folder = folder.subfolder(name)
    return folder


def open_file_inside(path: Path, roots: Sequence[Path]) -> int:
    """A descriptor to read the file at ``path`` (resolved, inside ``roots``, not an allowed
    folder itself), reached without following a link. OSError when that fails."""
    with open_folder(path.parent, roots) as folder:
        return folder.open_file(path.name, roots)


def lstat_inside(path: Path, roots: Sequence[Path]) -> os.stat_result:
    """``lstat`` of ``path`` (resolved, inside ``roots``), reached without following a link."""
    if path in roots:  # its parent is outside, and the allowed folders are trusted
        return os.stat(path)
    with open_folder(path.parent, roots) as folder:
        return folder.lstat(path.name)


def _final_path(fd: int) -> Path:
    """Where the open file ``fd`` really is, links resolved (Windows only)."""
    import ctypes
    import msvcrt
    from ctypes import wintypes

    get_path = ctypes.WinDLL("kernel32", use_last_error=True).GetFinalPathNameByHandleW
    get_path.argtypes = (wintypes.HANDLE, wintypes.LPWSTR, wintypes.DWORD, wintypes.DWORD)
    get_path.restype = wintypes.DWORD
    buffer = ctypes.create_unicode_buffer(32768)  # the longest path Windows allows
    length = get_path(msvcrt.get_osfhandle(fd), buffer, len(buffer), 0)
    if not 0 < length < len(buffer):
        raise ctypes.WinError(ctypes.get_last_error())
    # An extended path, \\?\C:\dir or \\?\UNC\server\share\dir, as resolve() does not give.
    path = buffer.value
    if path.startswith("\\\\?\\UNC\\"):
        return Path("\\\\" + path[len("\\\\?\\UNC\\") :])
    return Path(path.removeprefix("\\\\?\\"))
