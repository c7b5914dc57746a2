"""The ``search_files`` tool: the regular files under a folder walked in sorted order, never
through a link that leads elsewhere, and each text line matched against the pattern, within
the limits of :mod:`.limits` (matches, files, time, time on one line, memory)."""

from __future__ import annotations

import itertools
import os
import stat
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import closing
from pathlib import Path

import regex

from iris_desktop.core.tools import limits
from iris_desktop.core.tools.limits import ToolError, check_cancel
from iris_desktop.core.tools.patterns import check_pattern
from iris_desktop.core.tools.safe_files import (
    Folder,
    display,
    inside,
    open_file_inside,
    open_folder,
    reason,
    resolve,
)
from iris_desktop.core.tools.text import CappedText, text_lines
from iris_desktop.core.tools.worker import in_worker

SKIPPED_DIRS = frozenset({".git", ".hg", ".svn"})

_SKIP_NOTES = {
    "files_capped": f"[stopped after scanning {limits.MAX_SEARCH_FILES} files]",
    "timed_out": (f"[search cut short after {limits.SEARCH_TIME_LIMIT_S:g} s; "
                  "narrow the path or pattern]"),
    "too_slow": (
        f"[search cut short: the pattern took over {limits.REGEX_LINE_TIME_LIMIT_S:g} s on one "
        "line; simplify it (nested repeats such as (a|aa)+ can take exponential time)]"
    ),
    "not_text": "[skipped {count} binary or non-UTF-8 files]",
    "too_big": f"[skipped {{count}} files over {limits.MAX_SEARCH_FILE_BYTES} bytes]",
    "unreadable": "[skipped {count} unreadable files]",
}


def search_files(roots: Sequence[Path], pattern: str, path: str, cancel: threading.Event) -> str:
    """The lines under ``path`` that match ``pattern``, as ``path:line: text``."""
    if not pattern:
        raise ToolError("pattern must not be empty")
    check_pattern(pattern)  # before compiling: the engine writes each repeat out
    return in_worker(lambda: _search(pattern, path, roots, cancel), cancel)


def _search(pattern: str, path: str, roots: Sequence[Path], cancel: threading.Event) -> str:
    """search_files itself, once its pattern is checked (in the worker process: the path
    is resolved there, right before it is opened)."""
    target = resolve(path, roots)
    shown = display(target, roots)
    if not target.exists():
        raise ToolError(f"{shown} does not exist")
    if not target.is_dir() and not stat.S_ISREG(target.stat().st_mode):
        # A pipe or device was left out unsaid, as "0 matches"
        raise ToolError(f"{shown} is not a regular file; not searched")
    literal = False
    try:
        compiled = regex.compile(pattern)
    except regex.error:
        compiled, literal = regex.compile(regex.escape(pattern)), True
    except RecursionError:
        raise ToolError("the pattern is nested too deeply") from None

    skipped: Counter[str] = Counter()
    body = CappedText()
    matches = 0
    try:
        with closing(_matches(target, roots, compiled, skipped, cancel)) as found:
            for rel, lineno, line in itertools.islice(found, limits.MAX_SEARCH_MATCHES):
                matches += 1
                body.write(f"{rel}:{lineno}: {line}\n")
            capped = next(found, None) is not None
    except OSError as exc:  # the folder or file searched could not be opened
        raise ToolError(f"cannot search {shown}: {reason(exc)}") from None

    how = " (invalid regex, searched as literal text)" if literal else ""
    out = [f"{matches} match{'' if matches == 1 else 'es'} for {pattern!r} under {shown}{how}"]
    if matches:
        out.append(body.getvalue().rstrip("\n"))
    if capped:
        out.append(
            f"[stopped after {limits.MAX_SEARCH_MATCHES} matches; narrow the pattern or the path]"
        )
    out.extend(
        note.format(count=skipped[why]) for why, note in _SKIP_NOTES.items() if skipped[why]
    )
    return "\n".join(out)


def _matches(
    top: Path,
    roots: Sequence[Path],
    compiled: regex.Pattern[str],
    skipped: Counter[str],
    cancel: threading.Event,
) -> Iterator[tuple[str, int, str]]:
    """(shown path, line number, clipped line) of each match under ``top``. Files left
    out, and why the search ended early if it did, are counted in ``skipped`` (keys of
    ``_SKIP_NOTES``). Raises ToolError once ``cancel`` is set."""
    deadline = time.monotonic() + limits.SEARCH_TIME_LIMIT_S
    line_limit = limits.REGEX_LINE_TIME_LIMIT_S
    for scanned, (path, fd) in enumerate(_walk_files(top, roots)):
        check_cancel(cancel)
        if scanned == limits.MAX_SEARCH_FILES or time.monotonic() >= deadline:
            skipped["files_capped" if scanned == limits.MAX_SEARCH_FILES else "timed_out"] += 1
            return
        lines, why = ([], "unreadable") if fd is None else text_lines(fd)
        if why:
            skipped[why] += 1
            continue
        rel = display(path, roots)
        for lineno, line in enumerate(lines, start=1):
            check_cancel(cancel)
            left = deadline - time.monotonic()
            if left <= 0:
                skipped["timed_out"] += 1
                return
            try:
                # concurrent=True releases the GIL while matching: the GUI keeps running.
                found = compiled.search(line, concurrent=True, timeout=min(left, line_limit))
            except TimeoutError:
                skipped["too_slow" if left > line_limit else "timed_out"] += 1
                return
            if found:
                clipped = line[: limits.MAX_MATCH_LINE_CHARS]
                yield rel, lineno, clipped + ("…" if len(line) > len(clipped) else "")


def _walk_files(top: Path, roots: Sequence[Path]) -> Iterator[tuple[Path, int | None]]:
    """(path, descriptor) of each regular file under ``top`` (a folder or one file), in
    sorted order. A descriptor stays open until the next item is asked for; it is None
    for a file that could not be opened.

    Never descends into symlinked folders; yields a symlinked file only when its target
    is inside ``roots``. Nothing is reached through a link swapped in meanwhile.
    """
    if not top.is_dir():
        with open_folder(top.parent, roots) as folder:
            yield from _file_in(folder, top.name, roots, is_link=False)
        return
    with open_folder(top, roots) as folder:
        yield from _walk_folder(folder, roots)


def _walk_folder(folder: Folder, roots: Sequence[Path]) -> Iterator[tuple[Path, int | None]]:
    try:
        entries = sorted(folder.entries(), key=lambda entry: entry.name)
    except OSError:
        return  # vanished or unreadable: left out, as os.walk does
    subfolders = []
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            if entry.name not in SKIPPED_DIRS:
                subfolders.append(entry.name)
        else:
            yield from _file_in(folder, entry.name, roots, is_link=entry.is_symlink())
    for name in subfolders:
        try:
            subfolder = folder.subfolder(name)
        except OSError:
            continue  # gone, unreadable, or swapped for a link since it was listed
        with subfolder:
            yield from _walk_folder(subfolder, roots)


def _file_in(
    folder: Folder, name: str, roots: Sequence[Path], is_link: bool
) -> Iterator[tuple[Path, int | None]]:
    """The walk's item for ``name`` in ``folder``, if it is a regular file (see
    :func:`_walk_files`)."""
    path = folder.path / name
    try:
        if is_link:
            real = path.resolve()
            if not inside(real, roots) or real.is_dir():  # links to folders are not followed
                return
            fd = open_file_inside(real, roots)
        else:
            fd = folder.open_file(name, roots)
    except (FileNotFoundError, RuntimeError):  # deleted since listed, broken link, link loop
        return
    except OSError:
        yield path, None
        return
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            yield path, fd
    finally:
        os.close(fd)
