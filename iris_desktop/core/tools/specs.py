"""The tools the model may call and the arguments each takes: their OpenAI definitions,
their usage line for an error, and the checking of a call's arguments against them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from iris_desktop.core.tools import limits
from iris_desktop.core.tools.limits import ToolError

TOOL_NAMES = ("read_file", "list_directory", "search_files", "run_shell")
FILE_TOOLS = frozenset({"read_file", "list_directory", "search_files"})
DEFAULT_ENABLED = ("read_file", "list_directory", "search_files")

_REQUIRED: Any = object()


@dataclass(frozen=True)
class Param:
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
class Spec:
    name: str
    description: str
    params: tuple[Param, ...]

    def usage(self) -> str:
        return f"{self.name}({', '.join(p.usage() for p in self.params)})"

    def definition(self, description: str) -> dict[str, Any]:
        """The OpenAI ``tools`` entry for this tool, described as ``description``."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": description,
                "parameters": {
                    "type": "object",
                    "properties": {p.name: p.schema() for p in self.params},
                    "required": [p.name for p in self.params if p.required],
                    "additionalProperties": False,
                },
            },
        }


SPECS: dict[str, Spec] = {
    spec.name: spec
    for spec in (
        Spec(
            "read_file",
            "Read a UTF-8 text file. Returns lines offset+1 to offset+limit, each prefixed "
            "with its line number, and the file's total number of lines (its size in bytes "
            f"when it is large). Lines over {limits.MAX_READ_LINE_BYTES} bytes are cut.",
            (
                Param("path", str, "File path, relative to the first allowed folder or absolute."),
                Param("offset", int, "Lines to skip from the start.", 0, minimum=0),
                Param("limit", int, "Most lines to return.", limits.DEFAULT_READ_LIMIT, minimum=1),
            ),
        ),
        Spec(
            "list_directory",
            "List a folder, sorted by name: folders end with '/', files show their size.",
            (
                Param(
                    "path",
                    str,
                    "Folder path, relative to the first allowed folder or absolute.",
                    ".",
                ),
            ),
        ),
        Spec(
            "search_files",
            "Search text files under a folder, recursively, for a regular expression (an "
            f"invalid one is searched literally). Returns 'path:line: text', at most "
            f"{limits.MAX_SEARCH_MATCHES} matches.",
            (
                Param("pattern", str, "Python regular expression to look for."),
                Param(
                    "path",
                    str,
                    "Folder or file to search, relative to the first allowed folder or absolute.",
                    ".",
                ),
            ),
        ),
        Spec(
            "run_shell",
            "Run a shell command in the first allowed folder once the user confirms it. "
            "Returns the exit code, stdout and stderr.",
            (Param("command", str, "The shell command line."),),
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


def _bad_arguments(spec: Spec, problem: str) -> ToolError:
    return ToolError(f"bad arguments for {spec.name}: {problem}; expected {spec.usage()}")


def parse_arguments(spec: Spec, arguments: Any) -> dict[str, Any]:
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
    return {param.name: _value(spec, param, arguments.get(param.name)) for param in spec.params}


def _value(spec: Spec, param: Param, value: Any) -> Any:
    """``value`` checked against ``param``, or its default when it is None."""
    if value is None:  # null is read as "not given": models often send it for defaults
        if param.required:
            raise _bad_arguments(spec, f"missing required argument {param.name!r}")
        return param.default
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
    return value
