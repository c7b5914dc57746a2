"""Sandboxed local tools the model may call.

A :class:`Sandbox` owns the user's tool settings (allowed folders, enabled tools, shell
switch, shell confirmation) and runs one tool call at a time. Contracts:

* :meth:`Sandbox.run` never raises. A refusal or failure comes back as
  ``ToolResult(ok=False, content="error: ...")``, phrased for the model to read.
* File tools only touch paths that, after ``resolve()`` (symlinks followed), lie inside
  one of the resolved allowed folders. Relative paths start at the first allowed folder.
  Directory recursion never follows symlinks, and a symlinked file is only read when its
  target is inside the allowed folders. The checked path is then opened without following
  any link (see :func:`_open_folder`), so swapping a name for a link meanwhile cannot
  lead outside.
* File tools stop at their next file, line or entry once the ``cancel`` event passed to
  :meth:`Sandbox.run` is set. A search also stops after :data:`SEARCH_TIME_LIMIT_S`, or
  when the pattern takes over :data:`REGEX_LINE_TIME_LIMIT_S` on one line (the regex
  engine releases the GIL meanwhile); it then says it was cut short. Memory is bounded
  too: a pattern whose repeats would be written out past :data:`MAX_PATTERN_REPEAT` or
  :data:`MAX_PATTERN_SIZE` is refused before it is compiled, and on Linux the search runs
  in a forked child under an address-space limit (:data:`SEARCH_MEMORY_BYTES` on top of
  what the app maps), where running out is a tool error.
* A refusal never says where a link leads outside the allowed folders ("is a link that
  leads outside the allowed folders"): with a server backend, tool output is sent there.
* ``run_shell``'s confirmation is shown with ``iris_desktop.untrusted.show_untrusted``:
  controls, bidi overrides and other invisible characters as escapes, so what is
  approved is what runs.
* Text is UTF-8. Binary files (a NUL byte in the first 8 KiB) and files that are not
  valid UTF-8 are reported as such, never decoded into garbage.
* Output is never shortened except at a hard cap of :data:`MAX_OUTPUT_BYTES` UTF-8 bytes,
  marked with ``[output truncated at N bytes of M]``, and ``read_file`` lines over
  :data:`MAX_READ_LINE_BYTES`, marked with ``[line cut at N of M bytes]``. ``read_file``
  reads only as far as the lines it shows, except that it counts the lines of files up to
  :data:`LINE_COUNT_MAX_BYTES`; memory stays bounded however long a line is.
* Paths in output are relative to the first allowed folder when under it (so they can be
  passed straight back to a tool), absolute otherwise.
* ``run_shell`` is off unless ``shell=True`` *and* it is enabled, and every call asks
  ``confirm_shell(command)`` first; only ``True`` lets it run. It runs in the first
  allowed folder (the home folder when there is none), in its own process group so a
  timeout kills everything it started. A command that ran is ``ok`` whatever its exit code.
* Nothing here opens a network connection.
"""

from __future__ import annotations

import codecs
import errno
import io
import itertools
import json
import os
import re
import re._constants as _re_constants  # the parse tree's opcodes (sre_constants before 3.11)
import re._parser as _re_parser  # Python's own regex parser (sre_parse before 3.11)
import select
import signal
import stat
import subprocess
import sys
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import regex

try:
    import resource
except ImportError:  # Windows: no address-space limit, and the search runs in-thread
    resource = None  # type: ignore[assignment]

TOOL_NAMES = ("read_file", "list_directory", "search_files", "run_shell")
FILE_TOOLS = frozenset({"read_file", "list_directory", "search_files"})
DEFAULT_ENABLED = ("read_file", "list_directory", "search_files")

MAX_OUTPUT_BYTES = 1 << 20
"""Hard cap on one tool output, in UTF-8 bytes (the marker comes on top)."""
DEFAULT_READ_LIMIT = 200
MAX_READ_LINE_BYTES = 4096
"""read_file shows at most this many bytes of a line, then marks the cut and its length."""
LINE_COUNT_MAX_BYTES = 8 << 20
"""read_file counts the lines of files up to this size; of larger ones it gives the size."""
READ_CHUNK_BYTES = 1 << 20
MAX_SEARCH_MATCHES = 200
SEARCH_TIME_LIMIT_S = 20.0
"""A search stops after this long and says it was cut short."""
REGEX_LINE_TIME_LIMIT_S = 0.5
"""A pattern that takes longer on one line (catastrophic backtracking) stops the search."""
MAX_PATTERN_REPEAT = 10_000
"""A search pattern may repeat something at most this many times (``x{10000}``)."""
MAX_PATTERN_SIZE = 20_000
"""A search pattern may stand for at most this many elements once its repeats are counted
out (``(ab){3}`` is six): the regex engine writes each one out when it compiles, at about
600 bytes apiece, so ``a{1000000000}`` would need hundreds of gigabytes."""
MAX_SEARCH_FILES = 50_000
MAX_SEARCH_FILE_BYTES = 16 << 20
MAX_MATCH_LINE_CHARS = 400
BINARY_SNIFF_BYTES = 8192
SKIPPED_DIRS = frozenset({".git", ".hg", ".svn"})

NO_ROOTS = "no folders are allowed yet; add one in tools.allowed_paths"
SHELL_DISABLED = "run_shell is disabled (tools.shell = false)"
STOPPED = "stopped by the user before it finished"


class ToolError(Exception):
    """A refusal or failure; the message is shown to the model and the user."""


@dataclass(frozen=True)
class ToolResult:
    """Outcome of one tool call. ``ok`` is False only for refusals and failures."""

    ok: bool
    content: str


# --- argument specs ------------------------------------------------------------------

_REQUIRED: Any = object()


@dataclass(frozen=True)
class _Param:
    name: str
    type: type  # str or int
    description: str
    default: Any = _REQUIRED
    minimum: int | None = None

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED

    @property
    def json_type(self) -> str:
        return "integer" if self.type is int else "string"

    def schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": self.json_type, "description": self.description}
        if self.minimum is not None:
            schema["minimum"] = self.minimum
        if not self.required:
            schema["default"] = self.default
        return schema

    def usage(self) -> str:
        bits = [self.json_type]
        if self.minimum is not None:
            bits.append(f">= {self.minimum}")
        bits.append("required" if self.required else f"default {json.dumps(self.default)}")
        return f"{self.name} ({', '.join(bits)})"


@dataclass(frozen=True)
class _Spec:
    name: str
    description: str
    params: tuple[_Param, ...]

    def usage(self) -> str:
        return f"{self.name}({', '.join(p.usage() for p in self.params)})"


_SPECS: dict[str, _Spec] = {
    spec.name: spec
    for spec in (
        _Spec(
            "read_file",
            "Read a UTF-8 text file. Returns lines offset+1 to offset+limit, each prefixed "
            "with its line number, and the file's total number of lines (its size in bytes "
            f"when it is large). Lines over {MAX_READ_LINE_BYTES} bytes are cut.",
            (
                _Param("path", str, "File path, relative to the first allowed folder or absolute."),
                _Param("offset", int, "Lines to skip from the start.", 0, minimum=0),
                _Param("limit", int, "Most lines to return.", DEFAULT_READ_LIMIT, minimum=1),
            ),
        ),
        _Spec(
            "list_directory",
            "List a folder, sorted by name: folders end with '/', files show their size.",
            (
                _Param(
                    "path",
                    str,
                    "Folder path, relative to the first allowed folder or absolute.",
                    ".",
                ),
            ),
        ),
        _Spec(
            "search_files",
            "Search text files under a folder, recursively, for a regular expression (an "
            f"invalid one is searched literally). Returns 'path:line: text', at most "
            f"{MAX_SEARCH_MATCHES} matches.",
            (
                _Param("pattern", str, "Python regular expression to look for."),
                _Param(
                    "path",
                    str,
                    "Folder or file to search, relative to the first allowed folder or absolute.",
                    ".",
                ),
            ),
        ),
        _Spec(
            "run_shell",
            "Run a shell command in the first allowed folder once the user confirms it. "
            "Returns the exit code, stdout and stderr.",
            (_Param("command", str, "The shell command line."),),
        ),
    )
}


_JSON_TYPES: tuple[tuple[type | tuple[type, ...], str], ...] = (
    (bool, "boolean"),  # before int: bool is an int subclass
    ((int, float), "number"),
    (str, "string"),
    ((list, tuple), "array"),
    (dict, "object"),
    (type(None), "null"),
)


def _json_type_name(value: Any) -> str:
    for kinds, name in _JSON_TYPES:
        if isinstance(value, kinds):
            return name
    return type(value).__name__


def _bad_arguments(spec: _Spec, problem: str) -> ToolError:
    return ToolError(f"bad arguments for {spec.name}: {problem}; expected {spec.usage()}")


def _parse_arguments(spec: _Spec, arguments: Any) -> dict[str, Any]:
    """Validated keyword arguments for ``spec``, defaults filled in; ToolError otherwise."""
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        arguments = {}
    elif isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise _bad_arguments(spec, f"arguments are not valid JSON ({exc.msg})") from None
        except RecursionError:
            raise _bad_arguments(spec, "arguments are nested too deeply") from None
    if not isinstance(arguments, dict):
        raise _bad_arguments(
            spec, f"arguments must be a JSON object, got {_json_type_name(arguments)}"
        )
    known = {param.name for param in spec.params}
    unknown = [key for key in arguments if key not in known]
    if unknown:
        raise _bad_arguments(spec, f"unknown argument {', '.join(map(repr, unknown))}")
    values: dict[str, Any] = {}
    for param in spec.params:
        value = arguments.get(param.name)
        if value is None:  # null is read as "not given": models often send it for defaults
            if param.required:
                raise _bad_arguments(spec, f"missing required argument {param.name!r}")
            values[param.name] = param.default
            continue
        if param.type is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise _bad_arguments(
                    spec, f"{param.name!r} must be an integer, got {_json_type_name(value)}"
                )
            if param.minimum is not None and value < param.minimum:
                raise _bad_arguments(spec, f"{param.name!r} must be >= {param.minimum}")
        elif not isinstance(value, str):
            raise _bad_arguments(
                spec, f"{param.name!r} must be a string, got {_json_type_name(value)}"
            )
        values[param.name] = value
    return values


# --- helpers ---------------------------------------------------------------------------


class _CappedText:
    """Accumulates output up to ``MAX_OUTPUT_BYTES`` UTF-8 bytes, counting the rest.

    Memory stays bounded however much is written; :meth:`getvalue` appends the
    truncation marker when anything was dropped.
    """

    def __init__(self) -> None:
        self._cap = MAX_OUTPUT_BYTES  # read at call time so tests can lower it
        self._parts: list[str] = []
        self._kept = 0
        self.total = 0

    def write(self, text: str) -> None:
        data = text.encode("utf-8", "replace")
        self.total += len(data)
        room = self._cap - self._kept
        if room <= 0:
            return
        if len(data) > room:
            # Cut on a byte boundary, then drop a split multi-byte character.
            text = data[:room].decode("utf-8", "ignore")
            data = text.encode("utf-8")
        self._parts.append(text)
        self._kept += len(data)

    def getvalue(self) -> str:
        text = "".join(self._parts)
        if self.total > self._kept:
            text += f"\n[output truncated at {self._cap} bytes of {self.total}]"
        return text


def _inside(path: Path, roots: Sequence[Path]) -> bool:
    return any(path.is_relative_to(root) for root in roots)


def _folders(roots: Sequence[Path]) -> str:
    return ", ".join(str(root) for root in roots)


def _is_binary(head: bytes) -> bool:
    return b"\0" in head[:BINARY_SNIFF_BYTES]


def _check_cancel(cancel: threading.Event) -> None:
    if cancel.is_set():
        raise ToolError(STOPPED)


def _reason(exc: OSError) -> str:
    """Why an open or read failed, in words for the model."""
    if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a link where resolve() had found none
        return "it was swapped for a link while being opened; refused"
    return exc.strerror or str(exc)


_SKIP_NOTES = {
    "files_capped": f"[stopped after scanning {MAX_SEARCH_FILES} files]",
    "timed_out": f"[search cut short after {SEARCH_TIME_LIMIT_S:g} s; narrow the path or pattern]",
    "too_slow": (
        f"[search cut short: the pattern took over {REGEX_LINE_TIME_LIMIT_S:g} s on one line; "
        "simplify it (nested repeats such as (a|aa)+ can take exponential time)]"
    ),
    "not_text": "[skipped {count} binary or non-UTF-8 files]",
    "too_big": f"[skipped {{count}} files over {MAX_SEARCH_FILE_BYTES} bytes]",
    "unreadable": "[skipped {count} unreadable files]",
}


_REPEATS = frozenset(
    op for op in (getattr(_re_constants, name, None)
                  for name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")) if op is not None
)
# a {m,n} as the regex module reads it: a count that is not one is a literal brace
_COUNTS = regex.compile(r"\{\s*(\d*)\s*(?:,\s*(\d*)\s*)?\}")


def _pattern_size(items: Any) -> int:
    """How many elements a parsed pattern (``re._parser``'s tree) stands for, its repeats
    counted out; ToolError as soon as a count is over :data:`MAX_PATTERN_REPEAT`."""
    size = 0
    for op, value in items:
        if op in _REPEATS:
            low, high, body = value
            bound = low if high == _re_constants.MAXREPEAT else max(low, high)
            if bound > MAX_PATTERN_REPEAT:
                raise ToolError(_too_many_repeats(bound))
            size += 1 + max(low, 1) * _pattern_size(body)
        else:
            size += 1 + sum(_pattern_size(sub) for sub in _parts(value))
        if size > MAX_PATTERN_SIZE:
            raise ToolError(_too_large_pattern())
    return size


def _parts(value: Any) -> Iterator[Any]:
    """The sub-patterns inside one node's value (groups, branches, lookarounds…)."""
    if isinstance(value, _re_parser.SubPattern):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _parts(item)


def _too_many_repeats(count: int) -> str:
    return (f"the pattern has a repeat count of {count:,}, over the limit of "
            f"{MAX_PATTERN_REPEAT:,} (the regex engine needs memory for every repeat)")


def _too_large_pattern() -> str:
    return (f"the pattern is too large once its repeats are counted out (over "
            f"{MAX_PATTERN_SIZE:,} elements); use smaller counts or fewer nested repeats")


def _check_pattern(pattern: str) -> None:
    """ToolError when compiling ``pattern`` would take unbounded memory: a repeat count over
    :data:`MAX_PATTERN_REPEAT`, or over :data:`MAX_PATTERN_SIZE` elements counted out.

    The pattern is read by Python's own ``re`` parser, whose syntax the regex module
    extends. A pattern only the regex module reads (``\\p{L}``, fuzzy matching) is judged
    from its text alone, more strictly: every count in it multiplied together, as if each
    repeat were nested in the one before.
    """
    if len(pattern) > MAX_PATTERN_SIZE:
        raise ToolError(f"the pattern is {len(pattern):,} characters long; at most "
                        f"{MAX_PATTERN_SIZE:,} are allowed")
    try:
        parsed = _re_parser.parse(pattern)
    except (re.error, RecursionError, OverflowError, ValueError, TypeError):
        parsed = None
    if parsed is not None:
        try:
            _pattern_size(parsed)
        except RecursionError:
            raise ToolError("the pattern is nested too deeply") from None
        return
    size = len(pattern)
    for match in _COUNTS.finditer(pattern):
        low, high = match.group(1), match.group(2)
        counts = [int(text) for text in (low, high) if text]
        if counts and max(counts) > MAX_PATTERN_REPEAT:
            raise ToolError(_too_many_repeats(max(counts)))
        size *= max(int(low or 0), 1)
        if size > MAX_PATTERN_SIZE:
            raise ToolError(_too_large_pattern())


def _text_lines(fd: int) -> tuple[list[str], str | None]:
    """The lines of the open file ``fd`` if it is UTF-8 text, or ``([], reason)`` with a
    ``_SKIP_NOTES`` key. Leaves ``fd`` open."""
    try:
        if os.fstat(fd).st_size > MAX_SEARCH_FILE_BYTES:
            return [], "too_big"
        with open(fd, "rb", closefd=False) as handle:
            data = handle.read(MAX_SEARCH_FILE_BYTES + 1)
    except OSError:
        return [], "unreadable"
    if len(data) > MAX_SEARCH_FILE_BYTES:  # it grew after fstat
        return [], "too_big"
    if _is_binary(data):
        return [], "not_text"
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError:
        return [], "not_text"
    # Split on "\n" only, so line numbers agree with read_file.
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    if lines[-1] == "":
        lines.pop()
    return lines, None


def _capped_lines(
    handle: io.BufferedReader, cancel: threading.Event
) -> Iterator[tuple[bytes, int]]:
    """Each line of ``handle`` as (its first :data:`MAX_READ_LINE_BYTES` bytes, its length in
    bytes), both without the newline.

    Memory stays bounded however long a line is: past the cap, the line is read in chunks
    and only counted.
    """
    cap = MAX_READ_LINE_BYTES
    while True:
        _check_cancel(cancel)
        line = handle.readline(cap + 1)
        if not line:
            return
        length, piece = len(line), line
        while piece and not piece.endswith(b"\n"):  # longer than the cap, or the last line
            _check_cancel(cancel)
            piece = handle.readline(READ_CHUNK_BYTES)
            length += len(piece)
        if piece.endswith(b"\n"):
            length -= 1
        yield line[: min(cap, length)], length


def _shown_line(head: bytes, length: int, first: bool) -> str:
    """A line as read_file shows it, from :func:`_capped_lines`: the byte-order mark and a
    final carriage return dropped, a cut marked. Raises UnicodeDecodeError unless UTF-8."""
    if length > len(head):
        # Not final: the cut may split a character, whose first bytes are then left out.
        text = codecs.getincrementaldecoder("utf-8")().decode(head)
        text += f"… [line cut at {len(head):,} of {length:,} bytes]"
    else:
        text = head.decode("utf-8").removesuffix("\r")
    return text.removeprefix("\ufeff") if first else text


def _numbered_lines(
    handle: io.BufferedReader, offset: int, limit: int, count_all: bool, cancel: threading.Event
) -> tuple[str, int, bool]:
    """Lines ``offset+1`` to ``offset+limit`` of ``handle``, numbered as read_file shows them.

    Returns (that text, the number of lines read, whether the end was reached). Reads no
    further than the last line shown unless ``count_all``. Raises UnicodeDecodeError when a
    shown line is not UTF-8.
    """
    body = _CappedText()
    number = 0
    for number, (head, length) in enumerate(_capped_lines(handle, cancel), start=1):
        if offset < number <= offset + limit:
            body.write(f"{number:>6}\t{_shown_line(head, length, first=number == 1)}\n")
        if number == offset + limit and not count_all:
            return body.getvalue(), number, not handle.peek(1)
    return body.getvalue(), number, True


# --- opening inside the allowed folders ------------------------------------------------
#
# resolve() checks a path, but the name can be swapped for a link before it is opened.
# * Linux and macOS (os.open takes dir_fd): the checked, link-free path is opened one name
#   at a time from its allowed folder's descriptor with O_NOFOLLOW, so no link is followed
#   after the check; a name swapped for one fails to open instead of leading outside.
# * Windows (no dir_fd): a file is opened by path, then the handle's final path
#   (GetFinalPathNameByHandleW) must lie inside the allowed folders. Folders are listed by
#   path, so a folder swapped for a link mid-call can show names, never contents, outside.
# The allowed folders themselves are trusted, and opened by path.

_OPEN_BY_DIR_FD = (
    os.open in os.supports_dir_fd and os.scandir in os.supports_fd and hasattr(os, "O_NOFOLLOW")
)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
# O_NONBLOCK: opening a FIFO must not wait for a writer. O_BINARY: no newline translation.
_FILE_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)


class _Folder:
    """A folder being looked into: by descriptor where ``os.open`` takes ``dir_fd``, by path
    elsewhere. Names in it are opened without following links. Closes on exit."""

    def __init__(self, path: Path, fd: int | None) -> None:
        self.path = path  # for showing, and for resolving the links found in it
        self.fd = fd

    def __enter__(self) -> _Folder:
        return self

    def __exit__(self, *_: object) -> None:
        if self.fd is not None:
            os.close(self.fd)

    def entries(self) -> list[os.DirEntry[str]]:
        """Its entries, unsorted; their ``stat()`` goes through the descriptor."""
        with os.scandir(self.path if self.fd is None else self.fd) as scan:
            return list(scan)

    def subfolder(self, name: str) -> _Folder:
        """The folder ``name`` in this one, open; OSError when it is a link or not a folder."""
        if self.fd is None:
            return _Folder(self.path / name, None)
        fd = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=self.fd)
        return _Folder(self.path / name, fd)

    def open_file(self, name: str, roots: Sequence[Path]) -> int:
        """A descriptor to read ``name`` in this folder; OSError when it is a link (on
        Windows: a link that leads outside ``roots``)."""
        if self.fd is not None:
            return os.open(name, _FILE_FLAGS | os.O_NOFOLLOW, dir_fd=self.fd)
        fd = os.open(self.path / name, _FILE_FLAGS)
        try:
            if not _inside(_final_path(fd), roots):
                raise PermissionError(errno.EACCES, "it leads outside the allowed folders", name)
        except OSError:
            os.close(fd)
            raise
        return fd

    def lstat(self, name: str) -> os.stat_result:
        """``lstat`` of ``name`` in this folder."""
        where = self.path / name if self.fd is None else name
        return os.stat(where, dir_fd=self.fd, follow_symlinks=False)


def _open_folder(path: Path, roots: Sequence[Path]) -> _Folder:
    """The folder at ``path`` (resolved, inside ``roots``), reached from its allowed folder
    one name at a time without following a link. OSError when that fails."""
    if not _OPEN_BY_DIR_FD:
        return _Folder(path, None)
    root = next((root for root in roots if path.is_relative_to(root)), None)
    if root is None:
        raise PermissionError(errno.EACCES, "outside the allowed folders", str(path))
    folder = _Folder(root, os.open(root, _DIR_FLAGS))
    for name in path.relative_to(root).parts:
        with folder:  # the parent closes once its child is open, or failed to open
            folder = folder.subfolder(name)
    return folder


def _open_file_inside(path: Path, roots: Sequence[Path]) -> int:
    """A descriptor to read the file at ``path`` (resolved, inside ``roots``, not an allowed
    folder itself), reached without following a link. OSError when that fails."""
    with _open_folder(path.parent, roots) as folder:
        return folder.open_file(path.name, roots)


def _lstat_inside(path: Path, roots: Sequence[Path]) -> os.stat_result:
    """``lstat`` of ``path`` (resolved, inside ``roots``), reached without following a link."""
    if path in roots:  # its parent is outside, and the allowed folders are trusted
        return os.stat(path)
    with _open_folder(path.parent, roots) as folder:
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


def _decode_output(data: bytes | None) -> str:
    # Process output is not a file the user asked to see verbatim: replace, don't refuse.
    return (data or b"").decode("utf-8", "replace")


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """Kill the shell and everything it started (its own process group / job tree)."""
    try:
        if os.name == "posix":
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            subprocess.run(
                ["taskkill", "/F", "/T", "/PID", str(proc.pid)],
                capture_output=True,
                check=False,
            )
    except (OSError, subprocess.SubprocessError):
        pass
    proc.kill()


# --- the search's worker process --------------------------------------------------------
#
# A regular expression can need far more memory than its text suggests (a repeat is written
# out when it compiles; backtracking over a long line keeps a stack). The pattern is checked
# first (_check_pattern), and on Linux the search then runs in a child forked for it, under
# an address-space limit of what the app already maps plus SEARCH_MEMORY_BYTES: an
# allocation over it fails there as a MemoryError, a tool error, and the app itself never
# grows. The child only walks files and matches lines, and leaves with os._exit. Elsewhere
# (macOS does not enforce RLIMIT_AS; Windows has no fork) it runs on the calling thread.

SEARCH_MEMORY_BYTES = 1 << 30
"""The memory a search may take on top of what the app maps already (Linux)."""
_WORKER_GRACE_S = 15.0
OUT_OF_MEMORY = (
    "the search needed more memory than the {limit} MB it may use; simplify the pattern "
    "(nested or long repeats, alternatives that overlap) or search fewer or smaller files"
)
_MEMORY_EXIT = 86  # the child's exit code when even its report failed for lack of memory
_IN_WORKER = sys.platform.startswith("linux") and hasattr(os, "fork") and resource is not None


def _in_worker(search: Callable[[], str], cancel: threading.Event) -> str:
    """``search()`` run in a memory-limited child process where the OS allows it (see above);
    its ToolError comes back as one. Cancelling ``cancel`` stops the child at once."""
    limit = SEARCH_MEMORY_BYTES  # read at call time so tests can lower it
    pid = -1
    if _IN_WORKER:
        read_end, write_end = os.pipe()
        try:
            with warnings.catch_warnings():  # 3.12+ warns about forking a threaded process:
                warnings.simplefilter("ignore", DeprecationWarning)  # the child only searches
                pid = os.fork()
        except OSError:  # no process to spare: the pattern is checked, search here
            os.close(read_end)
            os.close(write_end)
    if pid < 0:
        try:
            return search()
        except MemoryError:
            raise ToolError("the search ran out of memory; simplify the pattern (nested or long "
                            "repeats, alternatives that overlap) or search fewer or smaller "
                            "files") from None
    if pid == 0:  # the child: never returns
        os.close(read_end)
        _run_child(search, write_end, limit)
    os.close(write_end)
    try:
        data = _read_child(read_end, cancel)
    finally:
        os.close(read_end)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _, status = os.waitpid(pid, 0)
    if data:
        kind, text = json.loads(data)
        if kind == "ok":
            return text
        raise ToolError(text)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == _MEMORY_EXIT:
        raise ToolError(OUT_OF_MEMORY.format(limit=limit >> 20))
    how = (f"was killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
           else f"ended with code {os.WEXITSTATUS(status)}")
    raise ToolError(f"the search process {how} before it finished (most likely for lack of "
                    "memory); simplify the pattern or narrow the path")


def _run_child(search: Callable[[], str], write_end: int, limit: int) -> None:
    code = 0
    try:
        try:
            with open("/proc/self/statm", encoding="ascii") as statm:
                mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            resource.setrlimit(resource.RLIMIT_AS, (mapped + limit, resource.RLIM_INFINITY))
            result = ["ok", search()]
        except ToolError as exc:
            result = ["error", str(exc)]
        except MemoryError:
            result = ["error", OUT_OF_MEMORY.format(limit=limit >> 20)]
        except Exception as exc:  # noqa: BLE001 - told as the tool's failure, like Sandbox.run
            result = ["error", f"search_files failed: {type(exc).__name__}: {exc}"]
        data = json.dumps(result).encode("utf-8", "replace")
        with open(write_end, "wb") as pipe:
            pipe.write(data)
    except MemoryError:
        code = _MEMORY_EXIT
    except BaseException:  # noqa: BLE001 - the child must never return into the app
        code = 1
    finally:
        os._exit(code)


def _read_child(read_end: int, cancel: threading.Event) -> bytes:
    """Everything the child writes, until it closes its end; ToolError once ``cancel`` is
    set, or when the child outlives the search's own time limit by far."""
    chunks: list[bytes] = []
    deadline = time.monotonic() + SEARCH_TIME_LIMIT_S + _WORKER_GRACE_S
    while True:
        _check_cancel(cancel)
        if time.monotonic() > deadline:
            raise ToolError(f"the search did not finish within {SEARCH_TIME_LIMIT_S:g} s and "
                            "was stopped; narrow the path or the pattern")
        ready, _, _ = select.select([read_end], [], [], 0.05)
        if ready:
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


# --- the sandbox -----------------------------------------------------------------------


class Sandbox:
    """The local tools, confined to the user's allowed folders.

    ``allowed_paths`` may use ``~``; ones that do not exist (or are not folders) are
    ignored and re-checked on every call, so a folder created later starts to count.
    Unknown names in ``enabled`` are ignored. ``confirm_shell(command)`` is called before
    every shell command (possibly from a worker thread) and must return ``True`` to run it.
    """

    def __init__(
        self,
        allowed_paths: Sequence[str | Path],
        enabled: Sequence[str] = DEFAULT_ENABLED,
        shell: bool = False,
        confirm_shell: Callable[[str], bool] | None = None,
        shell_timeout_s: float = 60.0,
    ) -> None:
        if isinstance(allowed_paths, (str, Path)):  # a bare string would iterate by character
            allowed_paths = [allowed_paths]
        if isinstance(enabled, str):
            enabled = [enabled]
        if not shell_timeout_s > 0:
            raise ValueError(f"shell_timeout_s must be positive, got {shell_timeout_s!r}")
        self._allowed = tuple(allowed_paths)
        self._enabled = frozenset(enabled) & frozenset(TOOL_NAMES)
        self._shell = bool(shell)
        self._confirm = confirm_shell
        self._timeout = float(shell_timeout_s)

    @classmethod
    def from_config(cls, config: Any, confirm_shell: Callable[[str], bool] | None = None
                    ) -> Sandbox:
        """The sandbox the tool settings describe (a ``core.config.ToolsConfig``)."""
        return cls(list(config.allowed_paths), enabled=list(config.enabled),
                   shell=config.shell, confirm_shell=confirm_shell)

    @property
    def roots(self) -> list[Path]:
        """The allowed folders, resolved, deduplicated, in order; missing ones left out."""
        roots: list[Path] = []
        for raw in self._allowed:
            try:
                root = Path(raw).expanduser().resolve()
                if root.is_dir() and root not in roots:
                    roots.append(root)
            except (OSError, RuntimeError, ValueError):  # bad path, loop, no home dir
                continue
        return roots

    def definitions(self) -> list[dict[str, Any]]:
        """OpenAI ``tools`` entries for the tools usable right now.

        A file tool is usable when enabled and at least one allowed folder exists;
        ``run_shell`` when enabled and ``shell=True``.
        """
        roots = self.roots
        definitions = []
        for name in TOOL_NAMES:
            if not self._usable(name, roots):
                continue
            spec = _SPECS[name]
            description = spec.description
            if name in FILE_TOOLS:
                # Tell the model where it may look, or it guesses paths that get refused.
                description += f" Allowed folders: {_folders(roots)}."
            definitions.append(
                {
                    "type": "function",
                    "function": {
                        "name": name,
                        "description": description,
                        "parameters": {
                            "type": "object",
                            "properties": {p.name: p.schema() for p in spec.params},
                            "required": [p.name for p in spec.params if p.required],
                            "additionalProperties": False,
                        },
                    },
                }
            )
        return definitions

    def run(
        self, name: str, arguments: dict[str, Any] | str, cancel: threading.Event | None = None
    ) -> ToolResult:
        """Run tool ``name``; ``arguments`` is a dict or its JSON text. Never raises.

        Setting ``cancel`` (from another thread, e.g. the turn's Stop) ends a file tool at
        its next file, line or entry, with ``error: stopped by the user before it finished``.
        """
        try:
            ok, content = True, self._dispatch(name, arguments, cancel or threading.Event())
        except ToolError as exc:
            ok, content = False, f"error: {exc}"
        except Exception as exc:  # noqa: BLE001 - a tool bug must not take the chat down
            ok, content = False, f"error: {name} failed: {type(exc).__name__}: {exc}"
        # Undecodable file names arrive as lone surrogates, which JSON and SQLite reject.
        return ToolResult(ok, content.encode("utf-8", "replace").decode("utf-8"))

    # -- plumbing --

    def _usable(self, name: str, roots: Sequence[Path]) -> bool:
        if name not in self._enabled:
            return False
        return bool(roots) if name in FILE_TOOLS else self._shell

    def _dispatch(self, name: str, arguments: Any, cancel: threading.Event) -> str:
        spec = _SPECS.get(name) if isinstance(name, str) else None
        if spec is None:
            raise ToolError(f"unknown tool {name!r}; known tools: {', '.join(TOOL_NAMES)}")
        if name == "run_shell" and not self._shell:
            raise ToolError(SHELL_DISABLED)
        if name not in self._enabled:
            raise ToolError(f"tool {name} is not enabled")
        kwargs = _parse_arguments(spec, arguments)
        if name in FILE_TOOLS:
            kwargs["cancel"] = cancel
        handler: Callable[..., str] = getattr(self, f"_tool_{name}")
        return handler(**kwargs)

    def _require_roots(self) -> list[Path]:
        roots = self.roots
        if not roots:
            raise ToolError(NO_ROOTS)
        return roots

    def _resolve(self, raw: str, roots: Sequence[Path]) -> Path:
        """``raw`` resolved (symlinks followed); ToolError unless inside ``roots``."""
        if not raw.strip():
            raise ToolError("path must not be empty")
        try:
            candidate = Path(raw).expanduser()
            if not candidate.is_absolute():
                candidate = roots[0] / candidate
            resolved = candidate.resolve()
        except OSError as exc:  # its text names the path, which may lie outside: say why only
            raise ToolError(f"cannot resolve path {raw!r}: {exc.strerror or 'not readable'}") from None
        except RuntimeError:
            raise ToolError(f"cannot resolve path {raw!r}: it is a loop of links") from None
        except ValueError:
            raise ToolError(f"cannot resolve path {raw!r}: it is not a valid path") from None
        if not _inside(resolved, roots):
            # Never say where a link leads: what lies outside is none of the model's business
            # (and with a server backend, this text is sent to the server).
            if _inside(Path(os.path.normpath(candidate)), roots):
                raise ToolError(f"{raw!r} is a link that leads outside the allowed folders "
                                f"({_folders(roots)})")
            raise ToolError(f"{raw!r} is outside the allowed folders ({_folders(roots)})")
        return resolved

    @staticmethod
    def _display(path: Path, roots: Sequence[Path]) -> str:
        """How a path is shown: relative to the first folder when under it, so it can be
        passed straight back to another tool; absolute otherwise."""
        if path != roots[0] and path.is_relative_to(roots[0]):
            return path.relative_to(roots[0]).as_posix()
        return str(path)

    # -- tools --

    def _tool_read_file(self, path: str, offset: int, limit: int, cancel: threading.Event) -> str:
        roots = self._require_roots()
        target = self._resolve(path, roots)
        shown = self._display(target, roots)
        with self._open_regular_file(target, roots, shown) as handle:
            size = os.fstat(handle.fileno()).st_size
            if _is_binary(handle.read(BINARY_SNIFF_BYTES)):
                return f"{shown} is a binary file ({size} bytes); not shown"
            handle.seek(0)
            try:
                body, lines_read, at_end = _numbered_lines(
                    handle, offset, limit, size <= LINE_COUNT_MAX_BYTES, cancel
                )
            except UnicodeDecodeError:
                return f"{shown} is a binary file ({size} bytes, not valid UTF-8); not shown"
            except OSError as exc:
                raise ToolError(f"cannot read {shown}: {_reason(exc)}") from None
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

    @staticmethod
    def _open_regular_file(target: Path, roots: Sequence[Path], shown: str) -> io.BufferedReader:
        """``target`` (resolved, inside ``roots``) open for reading; ToolError unless it is a
        regular file reached without following a link."""
        if target.is_dir():  # the allowed folders too; fstat below catches a folder swapped in
            raise ToolError(f"{shown} is a folder; use list_directory")
        try:
            handle = open(_open_file_inside(target, roots), "rb")
        except FileNotFoundError:
            raise ToolError(f"{shown} does not exist") from None
        except OSError as exc:
            raise ToolError(f"cannot read {shown}: {_reason(exc)}") from None
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):  # FIFOs, devices: may never end
            handle.close()
            raise ToolError(f"{shown} is not a regular file")
        return handle

    def _tool_list_directory(self, path: str, cancel: threading.Event) -> str:
        roots = self._require_roots()
        target = self._resolve(path, roots)
        shown = self._display(target, roots)
        body = _CappedText()
        try:
            with _open_folder(target, roots) as folder:
                entries = sorted(folder.entries(), key=lambda e: (e.name.casefold(), e.name))
                for entry in entries:
                    _check_cancel(cancel)
                    body.write(self._describe_entry(folder, entry, roots) + "\n")
        except FileNotFoundError:
            raise ToolError(f"{shown} does not exist") from None
        except NotADirectoryError:
            raise ToolError(f"{shown} is not a folder; use read_file") from None
        except OSError as exc:
            raise ToolError(f"cannot list {shown}: {_reason(exc)}") from None
        if not entries:
            return f"{shown}: empty folder"
        noun = "entry" if len(entries) == 1 else "entries"
        return f"{shown}: {len(entries)} {noun}\n" + body.getvalue().rstrip("\n")

    @staticmethod
    def _describe_entry(folder: _Folder, entry: os.DirEntry[str], roots: Sequence[Path]) -> str:
        """One line of a listing. A link is described by its target when that is inside
        ``roots``, found without following links again."""
        try:
            if entry.is_symlink():
                target = (folder.path / entry.name).resolve()
                if not _inside(target, roots):
                    # Name it, but say nothing about what lies outside.
                    return f"{entry.name} -> (link outside the allowed folders)"
                try:
                    info = _lstat_inside(target, roots)
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

    def _walk_files(self, top: Path, roots: Sequence[Path]) -> Iterator[tuple[Path, int | None]]:
        """(path, descriptor) of each regular file under ``top`` (a folder or one file), in
        sorted order. A descriptor stays open until the next item is asked for; it is None
        for a file that could not be opened.

        Never descends into symlinked folders; yields a symlinked file only when its target
        is inside ``roots``. Nothing is reached through a link swapped in meanwhile.
        """
        if not top.is_dir():
            with _open_folder(top.parent, roots) as folder:
                yield from self._file_in(folder, top.name, roots, is_link=False)
            return
        with _open_folder(top, roots) as folder:
            yield from self._walk_folder(folder, roots)

    def _walk_folder(
        self, folder: _Folder, roots: Sequence[Path]
    ) -> Iterator[tuple[Path, int | None]]:
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
                yield from self._file_in(folder, entry.name, roots, is_link=entry.is_symlink())
        for name in subfolders:
            try:
                subfolder = folder.subfolder(name)
            except OSError:
                continue  # gone, unreadable, or swapped for a link since it was listed
            with subfolder:
                yield from self._walk_folder(subfolder, roots)

    @staticmethod
    def _file_in(
        folder: _Folder, name: str, roots: Sequence[Path], is_link: bool
    ) -> Iterator[tuple[Path, int | None]]:
        """The walk's item for ``name`` in ``folder``, if it is a regular file (see
        :meth:`_walk_files`)."""
        path = folder.path / name
        try:
            if is_link:
                real = path.resolve()
                if not _inside(real, roots) or real.is_dir():  # links to folders are not followed
                    return
                fd = _open_file_inside(real, roots)
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

    def _tool_search_files(self, pattern: str, path: str, cancel: threading.Event) -> str:
        roots = self._require_roots()
        if not pattern:
            raise ToolError("pattern must not be empty")
        _check_pattern(pattern)  # before compiling: the engine writes each repeat out
        return _in_worker(lambda: self._search(pattern, path, roots, cancel), cancel)

    def _search(self, pattern: str, path: str, roots: Sequence[Path], cancel: threading.Event) -> str:
        """search_files itself, once its pattern is checked (in the worker process: the path
        is resolved there, right before it is opened)."""
        target = self._resolve(path, roots)
        shown = self._display(target, roots)
        if not target.exists():
            raise ToolError(f"{shown} does not exist")
        literal = False
        try:
            compiled = regex.compile(pattern)
        except regex.error:
            compiled, literal = regex.compile(regex.escape(pattern)), True
        except RecursionError:
            raise ToolError("the pattern is nested too deeply") from None

        skipped: Counter[str] = Counter()
        body = _CappedText()
        matches = 0
        try:
            with closing(self._matches(target, roots, compiled, skipped, cancel)) as found:
                for rel, lineno, line in itertools.islice(found, MAX_SEARCH_MATCHES):
                    matches += 1
                    body.write(f"{rel}:{lineno}: {line}\n")
                capped = next(found, None) is not None
        except OSError as exc:  # the folder or file searched could not be opened
            raise ToolError(f"cannot search {shown}: {_reason(exc)}") from None

        how = " (invalid regex, searched as literal text)" if literal else ""
        out = [f"{matches} match{'' if matches == 1 else 'es'} for {pattern!r} under {shown}{how}"]
        if matches:
            out.append(body.getvalue().rstrip("\n"))
        if capped:
            out.append(
                f"[stopped after {MAX_SEARCH_MATCHES} matches; narrow the pattern or the path]"
            )
        out.extend(
            note.format(count=skipped[reason])
            for reason, note in _SKIP_NOTES.items()
            if skipped[reason]
        )
        return "\n".join(out)

    def _matches(
        self,
        top: Path,
        roots: Sequence[Path],
        compiled: regex.Pattern[str],
        skipped: Counter[str],
        cancel: threading.Event,
    ) -> Iterator[tuple[str, int, str]]:
        """(shown path, line number, clipped line) of each match under ``top``. Files left
        out, and why the search ended early if it did, are counted in ``skipped`` (keys of
        ``_SKIP_NOTES``). Raises ToolError once ``cancel`` is set."""
        deadline = time.monotonic() + SEARCH_TIME_LIMIT_S
        for scanned, (path, fd) in enumerate(self._walk_files(top, roots)):
            _check_cancel(cancel)
            if scanned == MAX_SEARCH_FILES or time.monotonic() >= deadline:
                skipped["files_capped" if scanned == MAX_SEARCH_FILES else "timed_out"] += 1
                return
            lines, reason = ([], "unreadable") if fd is None else _text_lines(fd)
            if reason:
                skipped[reason] += 1
                continue
            rel = self._display(path, roots)
            for lineno, line in enumerate(lines, start=1):
                _check_cancel(cancel)
                left = deadline - time.monotonic()
                if left <= 0:
                    skipped["timed_out"] += 1
                    return
                try:
                    # concurrent=True releases the GIL while matching: the GUI keeps running.
                    timeout = min(left, REGEX_LINE_TIME_LIMIT_S)
                    found = compiled.search(line, concurrent=True, timeout=timeout)
                except TimeoutError:
                    skipped["too_slow" if left > REGEX_LINE_TIME_LIMIT_S else "timed_out"] += 1
                    return
                if found:
                    clipped = line[:MAX_MATCH_LINE_CHARS]
                    yield rel, lineno, clipped + ("…" if len(line) > len(clipped) else "")

    def _tool_run_shell(self, command: str) -> str:
        if not command.strip():
            raise ToolError("command must not be empty")
        if self._confirm is None or self._confirm(command) is not True:
            raise ToolError(f"the user refused to run: {command}")
        roots = self.roots
        # With no allowed folder yet, the home folder is the least surprising place.
        cwd = roots[0] if roots else Path.home()
        # Own process group, so a timeout kills the commands the shell started too;
        # otherwise a surviving child keeps the pipes open and the wait never ends.
        group: dict[str, Any] = (
            {"start_new_session": True}
            if os.name == "posix"
            else {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP}
        )
        try:
            with subprocess.Popen(
                command,
                shell=True,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                **group,
            ) as proc:
                try:
                    stdout, stderr = proc.communicate(timeout=self._timeout)
                except subprocess.TimeoutExpired:
                    _kill_tree(proc)
                    try:
                        stdout, stderr = proc.communicate(timeout=5)
                    except subprocess.TimeoutExpired:
                        stdout, stderr = b"", b""
                    raise ToolError(
                        f"command timed out after {self._timeout:g} s and was stopped: "
                        f"{command}\n" + self._shell_output(None, stdout, stderr)
                    ) from None
        except OSError as exc:
            raise ToolError(f"cannot run {command!r}: {exc.strerror or exc}") from None
        return self._shell_output(proc.returncode, stdout, stderr)

    @staticmethod
    def _shell_output(code: int | None, stdout: bytes | None, stderr: bytes | None) -> str:
        out = _CappedText()
        if code is not None:
            out.write(f"exit code: {code}\n")
        out_text, err_text = _decode_output(stdout), _decode_output(stderr)
        if out_text:
            out.write("stdout:\n" + out_text.rstrip("\n") + "\n")
        if err_text:
            out.write("stderr:\n" + err_text.rstrip("\n") + "\n")
        if not out_text and not err_text:
            out.write("(no output)\n")
        return out.getvalue().rstrip("\n")
