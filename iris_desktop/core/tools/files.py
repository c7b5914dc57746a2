"""The tools that read one file or one folder: ``read_file`` and ``list_directory``.

Each takes the allowed folders (resolved, at least one) and the path the model gave, and
reaches it through :mod:`.safe_files`; a refusal is a ToolError.
"""

from __future__ import annotations

import io
import os
import stat
import threading
from collections.abc import Sequence
from pathlib import Path

from iris_desktop.core.tools import limits
from iris_desktop.core.tools.limits import ToolError, check_cancel
from iris_desktop.core.tools.safe_files import (
    Folder,
    display,
    inside,
    lstat_inside,
    open_file_inside,
    open_folder,
    reason,
    resolve,
)
from iris_desktop.core.tools.text import CappedText, is_binary, numbered_lines


def read_file(
    roots: Sequence[Path], path: str, offset: int, limit: int, cancel: threading.Event
) -> str:
    """Lines ``offset+1`` to ``offset+limit`` of the file at ``path``, numbered, under a
    header that says which and how many there are."""
    target = resolve(path, roots)
    shown = display(target, roots)
    with _open_regular_file(target, roots, shown) as handle:
        size = os.fstat(handle.fileno()).st_size
        if is_binary(handle.read(limits.BINARY_SNIFF_BYTES)):
            return f"{shown} is a binary file ({size} bytes); not shown"
        handle.seek(0)
        try:
            body, lines_read, at_end = numbered_lines(
                handle, offset, limit, size <= limits.LINE_COUNT_MAX_BYTES, cancel
            )
        except UnicodeDecodeError:
            return f"{shown} is a binary file ({size} bytes, not valid UTF-8); not shown"
        except OSError as exc:
            raise ToolError(f"cannot read {shown}: {reason(exc)}") from None
    if lines_read == 0:
        return f"{shown} is empty (0 lines)"
    if offset >= lines_read:
        return f"{shown} has {lines_read} lines; offset {offset} is past the end"
    last = min(lines_read, offset + limit)
    if not at_end:  # a large file, read only this far: its size tells how much is left
        header = (
            f"{shown}: lines {offset + 1}-{last} "
            f"(file is {size:,} bytes; continue with offset={last})"
        )
    else:
        header = f"{shown}: lines {offset + 1}-{last} of {lines_read}"
        if last < lines_read:
            header += f" (continue with offset={last})"
    return header + "\n" + body.rstrip("\n")


def _open_regular_file(target: Path, roots: Sequence[Path], shown: str) -> io.BufferedReader:
    """``target`` (resolved, inside ``roots``) open for reading; ToolError unless it is a
    regular file reached without following a link."""
    if target.is_dir():  # the allowed folders too; fstat below catches a folder swapped in
        raise ToolError(f"{shown} is a folder; use list_directory")
    try:
        handle = open(open_file_inside(target, roots), "rb")
    except FileNotFoundError:
        raise ToolError(f"{shown} does not exist") from None
    except OSError as exc:
        raise ToolError(f"cannot read {shown}: {reason(exc)}") from None
    if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):  # FIFOs, devices: may never end
        handle.close()
        raise ToolError(f"{shown} is not a regular file")
    return handle


def list_directory(roots: Sequence[Path], path: str, cancel: threading.Event) -> str:
    """The folder at ``path``, one entry a line, sorted by name."""
    target = resolve(path, roots)
    shown = display(target, roots)
    body = CappedText()
    try:
        with open_folder(target, roots) as folder:
            entries = sorted(folder.entries(), key=lambda e: (e.name.casefold(), e.name))
            for entry in entries:
                check_cancel(cancel)
                body.write(_describe_entry(folder, entry, roots) + "\n")
    except FileNotFoundError:
        raise ToolError(f"{shown} does not exist") from None
    except NotADirectoryError:
        raise ToolError(f"{shown} is not a folder; use read_file") from None
    except OSError as exc:
        raise ToolError(f"cannot list {shown}: {reason(exc)}") from None
    if not entries:
        return f"{shown}: empty folder"
    noun = "entry" if len(entries) == 1 else "entries"
    return f"{shown}: {len(entries)} {noun}\n" + body.getvalue().rstrip("\n")


def _describe_entry(folder: Folder, entry: os.DirEntry[str], roots: Sequence[Path]) -> str:
    """One line of a listing. A link is described by its target when that is inside
    ``roots``, found without following links again."""
    try:
        if entry.is_symlink():
            target = (folder.path / entry.name).resolve()
            if not inside(target, roots):
                # Name it, but say nothing about what lies outside.
                return f"{entry.name} -> (link outside the allowed folders)"
            try:
                info = lstat_inside(target, roots)
            except FileNotFoundError:
                return f"{entry.name} -> (broken link)"
        else:
            info = entry.stat(follow_symlinks=False)
    except (OSError, RuntimeError):
        return f"{entry.name} (unreadable)"
    if stat.S_ISDIR(info.st_mode):
        return f"{entry.name}/"
    if stat.S_ISREG(info.st_mode):
        return f"{entry.name} ({info.st_size} bytes)"
    if stat.S_ISLNK(info.st_mode):  # swapped for a link after it was listed or resolved
        return f"{entry.name} (changed while listing)"
    return f"{entry.name} (special file)"
