"""Sandboxed local tools the model may call.

A :class:`Sandbox` owns the user's tool settings (allowed folders, enabled tools, shell
switch, shell confirmation) and runs one tool call at a time. Contracts:

* :meth:`Sandbox.run` never raises. A refusal or failure comes back as
  ``ToolResult(ok=False, content="error: ...")``, phrased for the model to read.
* File tools only touch paths that, after ``resolve()`` (symlinks followed), lie inside
  one of the resolved allowed folders. Relative paths start at the first allowed folder.
  Directory recursion never follows symlinks, and a symlinked file is only read when its
  target is inside the allowed folders.
* Text is UTF-8. Binary files (a NUL byte in the first 8 KiB) and files that are not
  valid UTF-8 are reported as such, never decoded into garbage.
* Output is never shortened except at a hard cap of :data:`MAX_OUTPUT_BYTES` UTF-8 bytes,
  marked with ``[output truncated at N bytes of M]``.
* Paths in output are relative to the first allowed folder when under it (so they can be
  passed straight back to a tool), absolute otherwise.
* ``run_shell`` is off unless ``shell=True`` *and* it is enabled, and every call asks
  ``confirm_shell(command)`` first; only ``True`` lets it run. It runs in the first
  allowed folder (the home folder when there is none), in its own process group so a
  timeout kills everything it started. A command that ran is ``ok`` whatever its exit code.
* Nothing here opens a network connection.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOOL_NAMES = ("read_file", "list_directory", "search_files", "run_shell")
FILE_TOOLS = frozenset({"read_file", "list_directory", "search_files"})
DEFAULT_ENABLED = ("read_file", "list_directory", "search_files")

MAX_OUTPUT_BYTES = 1 << 20
"""Hard cap on one tool output, in UTF-8 bytes (the marker comes on top)."""
DEFAULT_READ_LIMIT = 200
MAX_SEARCH_MATCHES = 200
MAX_SEARCH_FILES = 50_000
MAX_SEARCH_FILE_BYTES = 16 << 20
MAX_MATCH_LINE_CHARS = 400
BINARY_SNIFF_BYTES = 8192
SKIPPED_DIRS = frozenset({".git", ".hg", ".svn"})

NO_ROOTS = "no folders are allowed yet; add one in tools.allowed_paths"
SHELL_DISABLED = "run_shell is disabled (tools.shell = false)"


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
            "with its line number, and the file's total number of lines.",
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


_SKIP_NOTES = {
    "files_capped": f"[stopped after scanning {MAX_SEARCH_FILES} files]",
    "not_text": "[skipped {count} binary or non-UTF-8 files]",
    "too_big": f"[skipped {{count}} files over {MAX_SEARCH_FILE_BYTES} bytes]",
    "unreadable": "[skipped {count} unreadable files]",
}


def _text_lines(path: Path) -> tuple[list[str], str | None]:
    """The lines of a UTF-8 text file, or ``([], reason)`` with a ``_SKIP_NOTES`` key."""
    try:
        if path.stat().st_size > MAX_SEARCH_FILE_BYTES:
            return [], "too_big"
        data = path.read_bytes()
    except OSError:
        return [], "unreadable"
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

    def run(self, name: str, arguments: dict[str, Any] | str) -> ToolResult:
        """Run tool ``name``; ``arguments`` is a dict or its JSON text. Never raises."""
        try:
            ok, content = True, self._dispatch(name, arguments)
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

    def _dispatch(self, name: str, arguments: Any) -> str:
        spec = _SPECS.get(name) if isinstance(name, str) else None
        if spec is None:
            raise ToolError(f"unknown tool {name!r}; known tools: {', '.join(TOOL_NAMES)}")
        if name == "run_shell" and not self._shell:
            raise ToolError(SHELL_DISABLED)
        if name not in self._enabled:
            raise ToolError(f"tool {name} is not enabled")
        kwargs = _parse_arguments(spec, arguments)
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
        except (OSError, RuntimeError, ValueError) as exc:
            raise ToolError(f"cannot resolve path {raw!r}: {exc}") from None
        if not _inside(resolved, roots):
            raise ToolError(
                f"{raw!r} resolves to {resolved}, which is outside the allowed folders "
                f"({_folders(roots)})"
            )
        return resolved

    @staticmethod
    def _display(path: Path, roots: Sequence[Path]) -> str:
        """How a path is shown: relative to the first folder when under it, so it can be
        passed straight back to another tool; absolute otherwise."""
        if path != roots[0] and path.is_relative_to(roots[0]):
            return path.relative_to(roots[0]).as_posix()
        return str(path)

    # -- tools --

    def _tool_read_file(self, path: str, offset: int, limit: int) -> str:
        roots = self._require_roots()
        target = self._resolve(path, roots)
        shown = self._display(target, roots)
        if target.is_dir():
            raise ToolError(f"{shown} is a folder; use list_directory")
        if not target.exists():
            raise ToolError(f"{shown} does not exist")
        if not target.is_file():  # FIFOs and devices would block or never end
            raise ToolError(f"{shown} is not a regular file")
        body = _CappedText()
        total = 0
        try:
            with target.open("rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                if _is_binary(handle.read(BINARY_SNIFF_BYTES)):
                    return f"{shown} is a binary file ({size} bytes); not shown"
                handle.seek(0)
                # UTF-8 never puts a newline byte inside a character: decoding per line is exact.
                for total, raw_line in enumerate(handle, start=1):
                    try:
                        line = raw_line.decode("utf-8")
                    except UnicodeDecodeError:
                        return (
                            f"{shown} is a binary file ({size} bytes, not valid UTF-8); not shown"
                        )
                    if offset < total <= offset + limit:
                        if total == 1:
                            line = line.removeprefix("\ufeff")
                        line = line.rstrip("\r\n")
                        body.write(f"{total:>6}\t{line}\n")
        except OSError as exc:
            raise ToolError(f"cannot read {shown}: {exc.strerror or exc}") from None
        if total == 0:
            return f"{shown} is empty (0 lines)"
        if offset >= total:
            return f"{shown} has {total} lines; offset {offset} is past the end"
        last = min(total, offset + limit)
        header = f"{shown}: lines {offset + 1}-{last} of {total}"
        if last < total:
            header += f" (continue with offset={last})"
        return header + "\n" + body.getvalue().rstrip("\n")

    def _tool_list_directory(self, path: str) -> str:
        roots = self._require_roots()
        target = self._resolve(path, roots)
        shown = self._display(target, roots)
        if not target.exists():
            raise ToolError(f"{shown} does not exist")
        if not target.is_dir():
            raise ToolError(f"{shown} is not a folder; use read_file")
        try:
            with os.scandir(target) as scan:
                entries = sorted(scan, key=lambda entry: (entry.name.casefold(), entry.name))
        except OSError as exc:
            raise ToolError(f"cannot list {shown}: {exc.strerror or exc}") from None
        if not entries:
            return f"{shown}: empty folder"
        body = _CappedText()
        for entry in entries:
            body.write(self._describe_entry(entry, roots) + "\n")
        noun = "entry" if len(entries) == 1 else "entries"
        return f"{shown}: {len(entries)} {noun}\n" + body.getvalue().rstrip("\n")

    @staticmethod
    def _describe_entry(entry: os.DirEntry[str], roots: Sequence[Path]) -> str:
        try:
            if entry.is_symlink():
                target = Path(entry.path).resolve()
                if not target.exists():
                    return f"{entry.name} -> (broken link)"
                if not _inside(target, roots):
                    # Name it, but say nothing about what lies outside.
                    return f"{entry.name} -> (link outside the allowed folders)"
            if entry.is_dir():
                return f"{entry.name}/"
            if entry.is_file():
                return f"{entry.name} ({entry.stat().st_size} bytes)"
            return f"{entry.name} (special file)"
        except (OSError, RuntimeError):
            return f"{entry.name} (unreadable)"

    def _walk_files(self, top: Path, roots: Sequence[Path]) -> Iterator[tuple[Path, Path]]:
        """(shown path, real path) of each regular file under ``top``, in sorted order.

        Never descends into symlinked folders; yields a symlinked file only when its
        target is inside ``roots``.
        """
        if top.is_file():
            yield top, top
            return
        for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
            dirnames[:] = sorted(
                name
                for name in dirnames
                if name not in SKIPPED_DIRS and not Path(dirpath, name).is_symlink()
            )
            for name in sorted(filenames):
                path = Path(dirpath, name)
                real = path
                if path.is_symlink():
                    try:
                        real = path.resolve()
                    except (OSError, RuntimeError):
                        continue
                    if not _inside(real, roots):
                        continue
                if real.is_file():
                    yield path, real

    def _tool_search_files(self, pattern: str, path: str) -> str:
        roots = self._require_roots()
        if not pattern:
            raise ToolError("pattern must not be empty")
        target = self._resolve(path, roots)
        shown = self._display(target, roots)
        if not target.exists():
            raise ToolError(f"{shown} does not exist")
        literal = False
        try:
            regex = re.compile(pattern)
        except re.error:
            regex, literal = re.compile(re.escape(pattern)), True

        skipped: Counter[str] = Counter()
        found = self._matches(target, roots, regex, skipped)
        body = _CappedText()
        matches = 0
        for rel, lineno, line in itertools.islice(found, MAX_SEARCH_MATCHES):
            matches += 1
            body.write(f"{rel}:{lineno}: {line}\n")
        capped = next(found, None) is not None

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
        self, top: Path, roots: Sequence[Path], regex: re.Pattern[str], skipped: Counter[str]
    ) -> Iterator[tuple[str, int, str]]:
        """(shown path, line number, clipped line) of each match under ``top``; files left
        out are counted in ``skipped`` by reason (keys of ``_SKIP_NOTES``)."""
        for scanned, (path, real) in enumerate(self._walk_files(top, roots)):
            if scanned == MAX_SEARCH_FILES:
                skipped["files_capped"] += 1
                return
            lines, reason = _text_lines(real)
            if reason:
                skipped[reason] += 1
                continue
            rel = self._display(path, roots)
            for lineno, line in enumerate(lines, start=1):
                if regex.search(line):
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
