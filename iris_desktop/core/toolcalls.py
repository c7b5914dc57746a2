"""Tool calls written as text by the model, and the prompt that teaches the format.

Models whose runtime does not return structured tool calls write them inline. Formats
understood by :func:`parse_tool_calls`:

* Hermes / Qwen: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any number
  of blocks; a missing closing tag is tolerated; ``"parameters"`` is a synonym of
  ``"arguments"``; arguments may be a JSON string; one block may hold a list of calls.
* Llama 3 bare JSON: the whole reply (optionally after ``<|python_tag|>`` or inside a
  ```` ```json ```` fence) is a call object, a list of them, or several separated by
  ``;``. It counts as a call only when every object has a string ``name`` and no keys
  beyond ``name``, ``arguments``, ``parameters``, ``type`` ("function") and ``id``, and
  either the name is in ``known_tools`` or, when that is None, an ``arguments`` or
  ``parameters`` key is present; so ordinary JSON answers stay text.
* Mistral: ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`` and the newer
  ``[TOOL_CALLS]name[ARGS]{...}`` (optionally with ``[CALL_ID]id``), repeated.

The OpenAI shape ``{"type": "function", "function": {"name", "arguments"}}`` is accepted
wherever a call object is. Parsing never raises: a malformed call becomes a
:class:`ToolCall` with ``arguments=None`` and ``error`` saying why, for the caller to send
back to the model as a tool error.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

_OPEN = "<tool_call>"
_CLOSE = "</tool_call>"
_MISTRAL = "[TOOL_CALLS]"
_PYTHON_TAG = "<|python_tag|>"
_FENCE = re.compile(r"\A```[A-Za-z]*[ \t]*\n?(.*?)\n?[ \t]*```\Z", re.DOTALL)
_MISTRAL_NAMED = re.compile(r"\s*([A-Za-z0-9_.:-]+)\s*(?:\[CALL_ID\]\s*[^\[\s]*\s*)?\[ARGS\]")
_NAME_IN_BROKEN_JSON = re.compile(r'"name"\s*:\s*"([^"\\]{1,100})"')
_CALL_KEYS = frozenset({"name", "arguments", "parameters", "type", "id"})
_WRAPPER_KEYS = frozenset({"type", "function", "id"})
_SNIPPET_CHARS = 200
#: a call's arguments nest at most this deep (a real call's nest a few levels); deeper is a
#: malformed call: Python's json recurses once per level, and arguments nested 960 deep,
#: parsed on the agent's thread, failed to show on the window's (six tracebacks, replies
#: stuck "streaming"). The same as ``runtime.http.MAX_JSON_DEPTH``, the bound a server's
#: streamed arguments are kept as text past (this layer cannot import that one).
MAX_ARGUMENT_DEPTH = 100

_decoder = json.JSONDecoder()


def _raw_decode(text: str, pos: int = 0) -> tuple[Any, int]:
    """``JSONDecoder.raw_decode`` where absurd nesting is a decode error too."""
    try:
        return _decoder.raw_decode(text, pos)
    except RecursionError:
        raise json.JSONDecodeError("JSON nested too deeply", text, pos) from None


@dataclass
class ToolCall:
    """One call the model asked for. ``arguments`` is None exactly when ``error`` is set."""

    id: str
    name: str
    arguments: dict[str, Any] | None
    error: str | None = None

    def to_openai(self) -> dict[str, Any]:
        """The call as an OpenAI ``tool_calls`` entry (a malformed one sends ``{}``)."""
        return {
            "id": self.id,
            "type": "function",
            "function": {
                "name": self.name,
                "arguments": json.dumps(
                    self.arguments if self.arguments is not None else {}, ensure_ascii=False
                ),
            },
        }


@dataclass
class ParsedReply:
    """A reply split into its visible text and the tool calls it contains."""

    content: str
    calls: list[ToolCall] = field(default_factory=list)


# (name, arguments, error) before ids are assigned
_Found = tuple[str, dict[str, Any] | None, str | None]


def parse_tool_calls(text: str, known_tools: Collection[str] | None = None) -> ParsedReply:
    """Split ``text`` into prose (markup removed, stripped) and tool calls, in order.

    ``known_tools`` only guards the bare-JSON format, where it decides whether a JSON
    reply is a call at all; explicit markup is always a call, so an unknown name there
    reaches the tool runner, which names the tools that exist. Never raises.
    """
    if not text:
        return ParsedReply("", [])
    if _OPEN in text:
        content, found = _parse_hermes(text)
    elif _MISTRAL in text:
        content, found = _parse_mistral(text)
    else:
        bare = _parse_bare(text, known_tools)
        content, found = ("", bare) if bare is not None else (text.strip(), [])
    calls = [
        ToolCall(f"call_{n}", name, arguments, error)
        for n, (name, arguments, error) in enumerate(found, start=1)
    ]
    return ParsedReply(content, calls)


# --- formats ---------------------------------------------------------------------------


def _parse_hermes(text: str) -> tuple[str, list[_Found]]:
    pieces: list[str] = []
    found: list[_Found] = []
    pos = 0
    while (start := text.find(_OPEN, pos)) != -1:
        pieces.append(text[pos:start])
        body_start = start + len(_OPEN)
        close = text.find(_CLOSE, body_start)
        following = text.find(_OPEN, body_start)
        terminated = close != -1 and (following == -1 or close < following)
        if terminated:
            body, pos = text[body_start:close], close + len(_CLOSE)
        else:  # runs to the next block or the end of the text
            end = following if following != -1 else len(text)
            body, pos = text[body_start:end], end
        calls, rest = _calls_from_json_text(body, "<tool_call>")
        # Stray closing brackets are a common slip; other trailing text is not.
        if rest.strip(" \t\r\n}]"):
            if terminated:
                calls = [_malformed(body, "unexpected text after the JSON in <tool_call>")]
            else:  # prose after an unclosed call is still prose
                pieces.append(rest)
        found.extend(calls)
    pieces.append(text[pos:])
    return _join(piece.replace(_CLOSE, "") for piece in pieces), found


def _parse_mistral(text: str) -> tuple[str, list[_Found]]:
    head, *segments = text.split(_MISTRAL)
    pieces = [head]
    found: list[_Found] = []
    for segment in segments:
        stripped = segment.strip()
        if not stripped:
            continue
        if stripped[0] in "[{":
            calls, rest = _calls_from_json_text(stripped, "[TOOL_CALLS]")
            found.extend(calls)
            pieces.append(rest)
        elif match := _MISTRAL_NAMED.match(segment):
            name = match.group(1)
            try:
                arguments, end = _raw_decode(segment, _skip_space(segment, match.end()))
            except json.JSONDecodeError as exc:
                found.append((name, None, f"invalid JSON arguments for {name}: {exc.msg}"))
                continue
            found.append(_with_arguments(name, arguments))
            pieces.append(segment[end:])
        else:
            found.append(_malformed(segment, "could not read the tool call after [TOOL_CALLS]"))
    return _join(pieces), found


def _parse_bare(text: str, known_tools: Collection[str] | None) -> list[_Found] | None:
    """Calls if the whole reply is bare call JSON, else None (the reply is just text)."""
    body = text.strip().removeprefix(_PYTHON_TAG).strip()
    if fenced := _FENCE.match(body):
        body = fenced.group(1).strip()
    if not body.startswith(("{", "[")):
        return None
    items: list[Any] = []
    pos = 0
    try:
        while pos < len(body):
            value, pos = _raw_decode(body, pos)
            items.extend(value if isinstance(value, list) else [value])
            # Llama 3.2 separates parallel calls with ";" (or newlines).
            while pos < len(body) and body[pos] in " \t\r\n;,":
                pos += 1
    except json.JSONDecodeError:
        return None
    if not items or not all(_looks_like_call(item, known_tools) for item in items):
        return None
    return [_normalize(item) for item in items]


# --- helpers ---------------------------------------------------------------------------


def _looks_like_call(item: Any, known_tools: Collection[str] | None) -> bool:
    if not isinstance(item, dict):
        return False
    if "function" in item:  # OpenAI shape
        if set(item) - _WRAPPER_KEYS or not isinstance(item["function"], dict):
            return False
        if item.get("type", "function") != "function":
            return False
        item = item["function"]
    if set(item) - _CALL_KEYS or item.get("type", "function") != "function":
        return False
    name = item.get("name")
    if not isinstance(name, str) or not name.strip():
        return False
    if known_tools is None:
        # Nothing to check the name against: demand an arguments key as well.
        return "arguments" in item or "parameters" in item
    return name.strip() in known_tools


def _calls_from_json_text(body: str, where: str) -> tuple[list[_Found], str]:
    """Calls from the JSON value at the start of ``body``, and the text after it."""
    stripped = body.strip()
    if fenced := _FENCE.match(stripped):
        stripped = fenced.group(1).strip()
    if not stripped:
        return [("", None, f"empty {where} block")], ""
    try:
        value, end = _raw_decode(stripped)
    except json.JSONDecodeError as exc:
        return [_malformed(stripped, f"invalid JSON in {where}: {exc.msg} at char {exc.pos}")], ""
    items = value if isinstance(value, list) else [value]
    if not items:
        return [("", None, f"empty list of calls in {where}")], stripped[end:]
    return [_normalize(item) for item in items], stripped[end:]


def _normalize(item: Any) -> _Found:
    """(name, arguments, error) for one decoded call object."""
    if not isinstance(item, dict):
        return "", None, 'a tool call must be a JSON object with "name" and "arguments"'
    if isinstance(item.get("function"), dict):  # OpenAI shape
        item = item["function"]
    name = item.get("name")
    if not isinstance(name, str) or not name.strip():
        return "", None, 'the tool call has no "name" string'
    name = name.strip()
    arguments = item["arguments"] if "arguments" in item else item.get("parameters")
    return _with_arguments(name, arguments)


def _with_arguments(name: str, arguments: Any) -> _Found:
    if arguments is None:
        return name, {}, None
    too_deep = (f"the arguments of {name} are nested too deeply (more than "
                f"{MAX_ARGUMENT_DEPTH} levels)")
    if isinstance(arguments, str):  # arguments sent as JSON text
        if not arguments.strip():
            return name, {}, None
        try:
            arguments = json.loads(arguments)
        except RecursionError:
            return name, None, too_deep
        except json.JSONDecodeError as exc:
            return name, None, f"the arguments of {name} are not valid JSON: {exc.msg}"
    if not isinstance(arguments, dict):
        return name, None, f"the arguments of {name} must be a JSON object"
    if _nests_deeper(arguments, MAX_ARGUMENT_DEPTH):
        return name, None, too_deep
    return name, arguments, None


def _nests_deeper(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists and objects more than ``limit`` levels deep (walked
    without recursion)."""
    pending = [(value, 1)]
    while pending:
        node, depth = pending.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        pending.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def _malformed(raw: str, error: str) -> _Found:
    # Keep the name when it is legible, so the error reads as being about that tool.
    match = _NAME_IN_BROKEN_JSON.search(raw)
    snippet = raw.strip()[:_SNIPPET_CHARS]
    return (match.group(1) if match else ""), None, f"{error}: {snippet}"


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _join(pieces: Any) -> str:
    return "\n".join(piece.strip() for piece in pieces if piece.strip())


# --- prompt ----------------------------------------------------------------------------

_CALL_FORMAT = """\
To call a tool, write exactly this, one line per call, with nothing else on those lines:
<tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>
Then stop: the result comes back in a tool message. Use only the tools above, never \
invent a result, and answer normally when no tool is needed."""


def tools_system_prompt(definitions: list[dict[str, Any]]) -> str:
    """System-prompt text describing ``definitions`` (OpenAI ``tools`` entries, or bare
    function dicts) and the ``<tool_call>`` format, for chat templates without tool
    support. Compact, since it counts against the context budget. ``""`` for no tools.
    """
    lines = []
    for definition in definitions:
        function = definition.get("function", definition)
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            continue
        description = " ".join(str(function.get("description", "")).split())
        parameters = dict(function.get("parameters") or {"type": "object", "properties": {}})
        # Schema bookkeeping that tells the model nothing costs tokens on every request.
        parameters.pop("additionalProperties", None)
        if not parameters.get("required", True):
            del parameters["required"]
        lines.append(f"- {function['name']}: {description}".rstrip())
        lines.append(
            "  parameters: " + json.dumps(parameters, ensure_ascii=False, separators=(",", ":"))
        )
    if not lines:
        return ""
    return "\n".join(["You can call these tools:", *lines, "", _CALL_FORMAT])
