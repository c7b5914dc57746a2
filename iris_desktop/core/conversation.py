"""Reading and writing conversations in the OpenAI chat-message format.

Accepted on import: a JSON array of messages, a JSON object with a ``messages`` array
(other keys ignored, as in the test corpus), or JSONL with one message per line, read
from a regular file (a device or a named pipe is refused by its type, never read). Every
message is checked before anything is written; the error names the line or index.
Content given as OpenAI content parts (``[{"type": "text", "text": …}, …]``) is stored as
the text it holds, the parts one after the other with a newline between; a part that is
not text (an image, audio, a file) is refused: Iris reads text only.

An export is an object ``{"title": …, "messages": […]}`` (the shape OpenAI's fine-tuning
files use for a chat), with ``"system_prompt"`` when the thread has its own: import gives
the chat both back (a plain list, as exports were before, lost them). Its
``"created_at"`` and ``"updated_at"`` (ISO 8601) are when the thread began and was last
written to: import puts the chat in the list there, also when its messages carry no
time (an export without them is dated by its messages, as before). A thread with
branches (regenerated replies, edited messages) exports every branch, with ``"format":
"iris-branches"``, its messages each carrying ``"iris": {"id": …, "parent_id": …,
"active": …}`` (``active``: on the active branch); import rebuilds the same tree with the
same branch active. A reply that was stopped carries ``"status": "interrupted"``, one that
failed (the model or the server failed while it was written) ``"status": "error"``, one
cut off at its token cap ``"finish_reason": "length"``: imported, each can be continued
(the store keeps an imported reply's ``"status"``); one a server's content filter cut
carries ``"finish_reason": "content_filter"`` (kept on import, not continued). A reply imported from another app
carries ``"imported_from"``: the app (``"ChatGPT"``), which the window and the Markdown
export name in its place (never sent to a model: the request keeps a message's role,
content, tool calls and name only); Iris's own replies carry none.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import stat
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from iris_desktop.core.attachments import (
    NotTextError,
    decode_text,
    message_text,
    read_as,
    read_message_text,
    record_problem,
)
from iris_desktop.core.store import ROLES, Store, ThreadGone, iso_timestamp, row_to_message, sent_at_of
from iris_desktop.core.store.messages import one_line_title
from iris_desktop.core.store.rows import TIMESTAMP_KEYS, ContentPartsError, not_in_future, parts_text
from iris_desktop.files import NotAFileError, TooLargeError, atomic_write, read_regular_file
from iris_desktop.tokens import Message

#: the ``format`` of an export that holds every branch of a thread
BRANCHES_FORMAT = "iris-branches"
#: where a branched export keeps a message's place in the tree
TREE_KEY = "iris"
#: where a reply imported from another app keeps the app's name ("ChatGPT", "Claude"):
#: a key of the store's ``extra``, which no request to a model carries
IMPORTED_FROM = "imported_from"
#: a reply a server's content filter cut short (finish reason "content_filter"), as a
#: clause: the window's status line, the CLI and the Markdown export say it so
CONTENT_FILTERED = "the server's content filter stopped the reply"

MAX_IMPORT_BYTES = 512 * 1024 * 1024
#: the deepest a message's values may nest (a message and its tool calls use four
#: levels): each read of a stored message parses its JSON again, recursively, wherever
#: it runs, so deeper values would fail there and not here
MAX_NESTING = 64
TOO_LONG_NUMBER = (f"a number has more than {sys.get_int_max_str_digits():,} digits, "
                    "which is not a value a conversation holds")


class ConversationFormatError(ValueError):
    """A malformed conversation; the message says where."""


class DatedMessages(list):
    """A conversation's messages, and ``times``: when the chat began and was last written
    to (seconds) as an Iris export says, or None. :func:`import_messages` dates the
    thread by them (they pass through :mod:`iris_desktop.core.foreign` in the list)."""

    times: tuple[float, float] | None = None
    #: characters :func:`load_conversation`'s ``mend`` replaced
    mended: int = 0


def load_conversation(path: str | Path, text: str | None = None,
                      mend: Callable[[Any], tuple[Any, int]] | None = None
                      ) -> tuple[list[Message], str | None, str | None]:
    """Parse and validate a conversation file (``text``: its text, already read).
    Returns (messages, title from the file, the chat's own system prompt from an Iris
    export), each message's content text (or None): content parts become the text they
    hold. ``mend``: a value → (the value mended, how many characters were replaced) run
    over the messages, title and prompt before they are checked (an import's halves of
    UTF-16 pairs, :func:`~iris_desktop.core.foreign_text.mend_value`); the messages'
    ``mended`` says how many. Raises ConversationFormatError, and nothing else, for any
    file."""
    path = Path(path)
    text = read_text_file(path, MAX_IMPORT_BYTES) if text is None else text
    replaced = 0
    try:  # (a text of any depth is read: _loads; its values, walked here, may be too deep)
        messages, (title, system_prompt, times), where = _parse(path, text)
        if mend is not None:
            (messages, title, system_prompt), replaced = mend([messages, title, system_prompt])
        validate_messages(messages, where)
    except RecursionError:
        raise ConversationFormatError(f"{path}: JSON nested too deeply to be a "
                                      "conversation") from None
    if title is not None:
        _check_storable(title, f"{path}: title")
    if system_prompt is not None:
        _check_storable(system_prompt, f"{path}: system_prompt")
    out = DatedMessages(_with_text(m) for m in messages)
    out.times, out.mended = times, replaced
    return out, title, system_prompt


def _thread_times(data: dict[str, Any]) -> tuple[float, float] | None:
    """An export's ``created_at`` and ``updated_at`` (either stands for both), or None
    where it has neither, or one that is not a time or is in the future (another app's
    key, a hand-edited file: the messages' dates serve instead)."""
    said = [data.get(key) for key in ("created_at", "updated_at")]
    try:
        stamps = [_seconds(value) for value in said if value is not None]
    except (ValueError, OverflowError, OSError):
        return None
    return (min(stamps), max(stamps)) if stamps else None


#: a chat dated before 1971 is dated with a placeholder (Go's zero time, epoch 0 read in any
#: time zone: 1970-01-01T00:00:00 without one is 18,000 s in New York)
PLACEHOLDER_BEFORE = 365 * 86_400


def _seconds(value: Any) -> float:
    """A time as :func:`iso_timestamp` reads it, in seconds since the epoch, to the
    millisecond an export writes. Raises ValueError: not a time, or one in the future."""
    not_in_future(iso_timestamp(value))
    if isinstance(value, str):
        seconds = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00")).timestamp()
    else:
        seconds = value / 1000 if value > 1e11 else float(value)
    if seconds < PLACEHOLDER_BEFORE:  # 1970 or before: a placeholder, not when the chat was
        raise ValueError(f"not a chat's time: {value!r}")
    return seconds


def read_text_file(path: Path, limit: int, *, message: bool = False,
                   said: list[str] | None = None) -> str:
    """A UTF-8 text file of at most ``limit`` bytes; ConversationFormatError for
    anything else (a folder, a device, a named pipe, an unreadable file, a UTF-16 file,
    other bytes). ``message``: the text of a message (``chat --file``), read as an
    attached file is (:func:`~iris_desktop.core.attachments.read_message_text`: a NUL
    byte refused, line endings ``\\n``; with ``said``, Windows-1252 text read as that,
    which is added to ``said`` as a clause). Never blocks and never reads more than ``limit`` + 1
    bytes (:func:`~iris_desktop.files.read_regular_file`)."""
    try:
        data = read_regular_file(path, limit)
    except NotAFileError as exc:
        if exc.kind == "a folder":
            raise ConversationFormatError(f"{path} is a folder; give a file") from None
        raise ConversationFormatError(f"{path} is {exc.kind}, not a regular file; give a "
                                      "file") from None
    except TooLargeError as exc:
        if exc.size is None:
            raise ConversationFormatError(
                f"{path}: it grew past the limit of {limit:,} bytes while it was read") from None
        raise ConversationFormatError(
            f"{path}: {exc.size:,} bytes is larger than the limit of {limit:,}") from None
    except OSError as exc:
        raise ConversationFormatError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    try:
        if not message or said is None:
            return message_text(data) if message else decode_text(data)
        text, encoding = read_message_text(data)
    except NotTextError as exc:
        raise ConversationFormatError(f"{path}: {exc}") from None
    if encoding and said is not None:
        said.append(read_as(encoding))
    return text


def json_error(exc: json.JSONDecodeError, text: str) -> str:
    """Where and what a JSON syntax error is, as a sentence: "the file ends early (line
    215)", "a string that starts at line 3, column 9 is not closed", "invalid JSON at line
    4, column 5: Expecting ',' delimiter", "… a NUL character (U+0000) inside a string".
    A file over the size limit read without its line breaks and indentation (``text`` a
    :class:`~iris_desktop.core.foreign_text.Squeezed`) has no lines and columns of its own:
    where is said as a character of that text, and that it was read so."""
    squeezed = getattr(text, "squeezed", False)
    where = (f"character {exc.pos + 1:,} of the file read without its line breaks and "
             "indentation (as a file over the size limit is read)") if squeezed \
        else f"line {exc.lineno}, column {exc.colno}"
    if not text[exc.pos:].strip():
        return "the file ends early" + ("" if squeezed else f" (line {exc.lineno})")
    if exc.msg.startswith("Unterminated string"):
        return f"a string that starts at {where} is not closed"
    return f"invalid JSON at {where}: {json_what(exc)}"


#: the control characters a JSON string may hold only as an escape, as a sentence names them
_CONTROLS = {"\0": "a NUL character", "\t": "a tab", "\n": "a line break", "\r": "a carriage return"}


def json_what(exc: json.JSONDecodeError) -> str:
    """What a JSON syntax error is: json's own words, but a control character in a string
    named ("a NUL character (U+0000) inside a string…", not "Invalid control character
    at")."""
    if not exc.msg.startswith("Invalid control character") or exc.pos >= len(exc.doc):
        return exc.msg
    char = exc.doc[exc.pos]
    name = _CONTROLS.get(char, "a control character")
    return (f"{name} (U+{ord(char):04X}) inside a string, which JSON allows only as an "
            f"escape (\\u{ord(char):04x})")


def _parse(path: Path, text: str):
    stripped = text.lstrip()
    if not stripped:
        raise ConversationFormatError(f"{path}: the file is empty")
    if stripped[0] in "[{":
        try:
            data = _loads(text)
        except json.JSONDecodeError as exc:
            if stripped[0] == "{" and "\n" in stripped.strip() and _first_line_parses(stripped):
                return _parse_jsonl(path, text)  # JSONL whose first line is an object
            # a pretty-printed object with an error: where the error is, not "line 1"
            raise ConversationFormatError(f"{path}: {json_error(exc, text)}") from None
        except ValueError:  # json raises it for a number too long to convert
            raise ConversationFormatError(f"{path}: {TOO_LONG_NUMBER}") from None
        if isinstance(data, list):
            return data, (None, None, None), lambda i: f"{path}: message index {i}"
        if isinstance(data, dict) and isinstance(data.get("messages"), list):
            title, prompt = (data.get(k) if isinstance(data.get(k), str) else None
                             for k in ("title", "system_prompt"))
            return data["messages"], (title, prompt, _thread_times(data)), \
                lambda i: f"{path}: messages[{i}]"
        if isinstance(data, dict) and "role" in data:
            return [data], (None, None, None), lambda i: f"{path}: line 1"
        raise ConversationFormatError(
            f"{path}: expected a JSON array of messages or an object with a 'messages' array"
        )
    return _parse_jsonl(path, text)


def _loads(text: str) -> Any:
    """``json.loads``, and a text nested deeper than it reads (Python's recursion limit)
    read by :func:`deep_loads` at any depth: its syntax errors are said as a shallow
    file's (before, any such file, an export cut short too, was "nested too deeply")."""
    try:
        return json.loads(text)
    except RecursionError:
        return deep_loads(text)


#: the whitespace JSON allows between its tokens
_JSON_SPACE = re.compile(r"[ \t\n\r]*")
#: JSON's numbers and the constants json.loads accepts, as it reads them
_JSON_NUMBER = re.compile(r"(-?(?:0|[1-9][0-9]*))(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_JSON_CONSTANTS = (("null", None), ("true", True), ("false", False), ("NaN", float("nan")),
              ("Infinity", float("inf")), ("-Infinity", float("-inf")))


def deep_loads(text: str) -> Any:
    """``text`` as JSON, as ``json.loads`` reads it, at any depth: LibreChat's export (a
    "recursive" one, its export dialog's default) nests each reply inside the message
    before it, so a chat of 500 messages is 1,000 levels deep, past what ``json.loads``
    reads (Python's recursion limit; before, such a chat was refused, "nested too deeply").
    One loop and a stack of the open arrays and objects, no recursion; strings by json's
    own scanner. Used only where ``json.loads`` gave up: it is slower (about 10 MB a
    second). Long because one loop reads every kind of value; its parts share the stack.
    (Here, not in :mod:`.big_json`, which reads through it: :func:`_loads` reads a single
    conversation file with it, and big_json imports this module.)"""
    stack: list[tuple[list[Any] | dict[str, Any], str]] = []
    at = _JSON_SPACE.match(text).end()
    while True:
        if text.startswith("{", at):
            at = _JSON_SPACE.match(text, at + 1).end()
            if not text.startswith("}", at):
                key, at = _key(text, at)
                stack.append(({}, key))
                continue
            value: Any = {}
            at += 1
        elif text.startswith("[", at):
            at = _JSON_SPACE.match(text, at + 1).end()
            if not text.startswith("]", at):
                stack.append(([], ""))
                continue
            value, at = [], at + 1
        else:
            value, at = _leaf(text, at)
        while True:  # the value goes into the innermost open array or object
            at = _JSON_SPACE.match(text, at).end()
            if not stack:
                if at != len(text):
                    raise json.JSONDecodeError("Extra data", text, at)
                return value
            container, key = stack[-1]
            if isinstance(container, list):
                container.append(value)
            else:
                container[key] = value
            if text.startswith(",", at):
                at = _JSON_SPACE.match(text, at + 1).end()
                if isinstance(container, dict):
                    key, at = _key(text, at)
                    stack[-1] = (container, key)
                break
            if not text.startswith("]" if isinstance(container, list) else "}", at):
                raise json.JSONDecodeError("Expecting ',' delimiter", text, at)
            at += 1
            stack.pop()
            value = container


def _key(text: str, at: int) -> tuple[str, int]:
    """An object's key at ``at`` and where its value starts (after the colon)."""
    if not text.startswith('"', at):
        raise json.JSONDecodeError("Expecting property name enclosed in double quotes", text, at)
    key, at = json.decoder.scanstring(text, at + 1)
    at = _JSON_SPACE.match(text, at).end()
    if not text.startswith(":", at):
        raise json.JSONDecodeError("Expecting ':' delimiter", text, at)
    return key, _JSON_SPACE.match(text, at + 1).end()


def _leaf(text: str, at: int) -> tuple[Any, int]:
    """A string, number or constant at ``at``, and where it ends."""
    if text.startswith('"', at):
        return json.decoder.scanstring(text, at + 1)
    number = _JSON_NUMBER.match(text, at)
    if number and not text.startswith("-Infinity", at):
        whole, fraction, exponent = number.groups()
        if fraction or exponent:
            return float(number.group()), number.end()
        return int(whole), number.end()  # (ValueError past Python's digit limit, as json's)
    for name, value in _JSON_CONSTANTS:
        if text.startswith(name, at):
            return value, at + len(name)
    raise json.JSONDecodeError("Expecting value", text, at)


def _first_line_parses(text: str) -> bool:
    """Is the first line of ``text`` a JSON value by itself (JSONL, not a pretty-printed
    object that opens with a lone "{")?"""
    try:
        _loads(text.split("\n", 1)[0])
    except ValueError:
        return False
    return True


def _parse_jsonl(path: Path, text: str):
    messages: list[Any] = []
    lines: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            messages.append(_loads(line))
        except json.JSONDecodeError as exc:
            if not messages and not line.lstrip().startswith(("{", "[", '"')):
                # not JSON from its first line on: plain text, a document, another format
                raise ConversationFormatError(
                    f"{path}: not a conversation file: it is not JSON (Iris imports chat "
                    "exports in JSON or JSONL: OpenAI messages, its own exports, ChatGPT, "
                    "Claude, Open WebUI, LM Studio, Jan)") from None
            raise ConversationFormatError(
                f"{path}: line {number}: invalid JSON at column {exc.colno}: {json_what(exc)}"
            ) from None
        except ValueError:  # json raises it for a number too long to convert
            raise ConversationFormatError(f"{path}: line {number}: {TOO_LONG_NUMBER}") from None
        lines.append(number)
    return messages, (None, None, None), lambda i: f"{path}: line {lines[i]}"


def validate_messages(messages: list[Any], where=lambda i: f"message index {i}") -> None:
    """Check roles, field types, content (text, or content parts that are all text),
    ``attachments`` records, and that every tool result answers an earlier call (in a
    branched export, a call on its own branch)."""
    if not messages:
        raise ConversationFormatError(f"{where(0).rsplit(':', 1)[0]}: no messages")
    open_calls: set[str] = set()
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ConversationFormatError(f"{where(i)}: a message must be a JSON object")
        role = message.get("role")
        if role not in ROLES:
            raise ConversationFormatError(
                f"{where(i)}: unknown role {role!r}; expected one of {', '.join(ROLES)}"
            )
        _check_content(message, where(i))
        calls = message.get("tool_calls")
        if calls is not None:
            if role != "assistant" or not isinstance(calls, list):
                raise ConversationFormatError(
                    f"{where(i)}: tool_calls must be a list on an assistant message"
                )
            for call in calls:
                if not isinstance(call, dict) or not isinstance(call.get("id"), str):
                    raise ConversationFormatError(f"{where(i)}: every tool call needs an 'id'")
                function = call.get("function")
                if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                    raise ConversationFormatError(
                        f"{where(i)}: tool call {call.get('id')} needs function.name"
                    )
                open_calls.add(call["id"])
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str):
                raise ConversationFormatError(f"{where(i)}: a tool result needs a tool_call_id")
            if call_id not in open_calls:
                raise ConversationFormatError(
                    f"{where(i)}: tool result {call_id!r} has no matching tool call before it"
                )
        for key in ("tool_call_id", "name"):
            if message.get(key) is not None and not isinstance(message[key], str):
                raise ConversationFormatError(f"{where(i)}: {key} must be a string")
        try:
            sent_at_of(message)
        except (ValueError, OverflowError, OSError) as exc:
            raise ConversationFormatError(
                f"{where(i)}: its time is not a date ({exc}); use ISO 8601 such as "
                "2024-03-04T19:30:00+01:00, or seconds since 1970") from None
        if _too_deep(message):
            raise ConversationFormatError(f"{where(i)}: nested more than {MAX_NESTING} levels "
                                          "deep, deeper than a conversation holds")
        _check_storable(message, where(i))
    validate_tree(messages, where)


def _check_content(message: dict[str, Any], where: str) -> None:
    """Content is text, null, or content parts that are all text; an ``attachments``
    record is one Iris could have written for that text."""
    content = message.get("content")
    if content is not None and not isinstance(content, (str, list)):
        raise ConversationFormatError(f"{where}: content must be a string, a list or null")
    if isinstance(content, list):
        try:
            content = parts_text(content)
        except ContentPartsError as exc:
            sep = " " if str(exc).startswith("holds") else ": "  # "… index 2 holds an image"
            raise ConversationFormatError(f"{where}{sep}{exc}") from None
    if message.get("attachments") is not None:
        problem = record_problem(message["attachments"], content)
        if problem:
            raise ConversationFormatError(
                f"{where}: its 'attachments' is not a record of attached files Iris can show "
                f"({problem}); fix it or remove the key")


def validate_tree(messages: list[Message], where=lambda i: f"message index {i}") -> None:
    """A branched export's tree (``TREE_KEY`` on every message, or on none): unique ids,
    each parent an earlier message, ``active`` a boolean, and each tool result's call on
    its own branch (made by one of its ancestors)."""
    marked = [TREE_KEY in m for m in messages]
    if not any(marked):
        return
    seen: set[Any] = set()
    for i, message in enumerate(messages):
        node = message.get(TREE_KEY)
        if not isinstance(node, dict) or isinstance(node.get("id"), bool) or \
                not isinstance(node.get("id"), int):
            raise ConversationFormatError(f"{where(i)}: a branched export needs "
                                          f"'{TREE_KEY}': {{'id': …}} on every message")
        parent = node.get("parent_id")
        if parent is not None and parent not in seen:
            raise ConversationFormatError(f"{where(i)}: parent_id {parent!r} is not an earlier message")
        if node["id"] in seen:
            raise ConversationFormatError(f"{where(i)}: id {node['id']} appears twice")
        if not isinstance(node.get("active", False), bool):
            raise ConversationFormatError(f"{where(i)}: 'active' must be true or false")
        seen.add(node["id"])
    _check_calls_per_branch(messages, where)


def _check_calls_per_branch(messages: list[Message], where) -> None:
    """Every tool result answers a call made above it on its own branch: the engine keeps
    a call and its result together along a path, and a result whose call is on another
    branch would be sent with no call. One walk of the tree (no recursion: a branch may be
    a hundred thousand messages long), counting the calls on the path to each message."""
    children: dict[Any, list[int]] = {}
    for i, message in enumerate(messages):
        children.setdefault(message[TREE_KEY].get("parent_id"), []).append(i)
    on_path: dict[str, int] = {}
    stack: list[tuple[int, bool]] = [(i, False) for i in reversed(children.get(None, []))]
    while stack:
        i, leaving = stack.pop()
        message = messages[i]
        calls = [call["id"] for call in message.get("tool_calls") or []]
        if leaving:
            for call_id in calls:
                on_path[call_id] -= 1
            continue
        call_id = message.get("tool_call_id")
        if message.get("role") == "tool" and not on_path.get(call_id):
            raise ConversationFormatError(
                f"{where(i)}: tool result {call_id!r} answers a call made on another branch; "
                "a tool result must follow its call on the same branch")
        for call_id in calls:
            on_path[call_id] = on_path.get(call_id, 0) + 1
        stack.append((i, True))
        stack.extend((c, False) for c in reversed(children.get(message[TREE_KEY]["id"], [])))


def _with_text(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` (validated) with content parts as the text they hold."""
    if isinstance(message.get("content"), list):
        return {**message, "content": parts_text(message["content"])}
    return message


def export_messages(store: Store, thread_id: int) -> dict[str, Any]:
    """What a JSON export of the thread holds: its title, its own system prompt if it has
    one, and its messages: the active branch's for one branch, every branch (see the
    module docstring) when it has more."""
    thread = store.thread(thread_id)
    head: dict[str, Any] = {"title": thread["title"]}
    for key in ("created_at", "updated_at"):  # (an undated chat's place in the list)
        head[key] = dt.datetime.fromtimestamp(thread[key]).astimezone().isoformat("T", "milliseconds")
    if prompt := store.system_prompt_of(thread_id):
        head["system_prompt"] = prompt
    cut = store.cut_off_replies(thread_id)
    if not store.has_branches(thread_id):
        messages = [_exported(r, cut) for r in store.messages(thread_id)]
        _still_there(store, thread_id, thread)
        return {**head, "messages": messages}
    messages = [{**_exported(r, cut), TREE_KEY: {"id": r["id"], "parent_id": r["parent_id"],
                                                "active": bool(r["on_path"])}}
                for r in store.all_messages(thread_id)]
    _still_there(store, thread_id, thread)
    return {"format": BRANCHES_FORMAT, **head, "messages": messages}


def _still_there(store: Store, thread_id: int, thread: dict[str, Any]) -> None:
    """ThreadGone when the chat read in several statements (its title first, its messages
    last) was deleted by another window or command between them: each read is its own
    snapshot, and an export of the title with no message was written as a good one (over
    an earlier export of the chat, with ``-o``). A delete is one transaction, so a chat
    still there after the last read (the same chat: made at the same moment) was there
    for all of them."""
    if store.thread(thread_id)["created_at"] != thread["created_at"]:
        raise ThreadGone(thread_id)


def imported_from(message: Message) -> str:
    """The app an imported reply was written in ("ChatGPT"), as one short line; "" for
    Iris's own replies and for any other message."""
    app = message.get(IMPORTED_FROM) if message.get("role") == "assistant" else None
    return " ".join(app[:240].split())[:60] if isinstance(app, str) else ""  # (a 10 MB one:
    # only its start is read, at every transcript build)


def _exported(row: dict[str, Any], cut_off: Mapping[int, str] = MappingProxyType({})) -> Message:
    """A stored row as exported: the message as it was imported or written, with the time
    Iris knows it was written as ``created_at`` where it says none, a reply that was
    stopped marked ``"status": "interrupted"``, one that failed ``"status": "error"`` (the
    word of the row, which keeps no sentence of the failure), and one cut off at its token
    cap (its id in ``cut_off``) ``"finish_reason": "length"``, one a server's content
    filter cut ``"finish_reason": "content_filter"``: import gives them all back
    (before, an export imported again lost every date Iris had, and Continue on a stopped,
    failed or cut-off reply; the content filter's cut was not said at all)."""
    message = row_to_message(row)
    if row.get("sent_at") and not any(key in message for key in TIMESTAMP_KEYS):
        message["created_at"] = row["sent_at"]
    if row.get("status") in ("interrupted", "streaming") and "status" not in message:
        message["status"] = "interrupted"  # (a reply still being written is partial too)
    elif row.get("status") == "error" and "status" not in message:
        message["status"] = "error"  # (it looked finished: an audit)
    elif row.get("id") in cut_off and "finish_reason" not in message:
        # OpenAI's words: "length" (cut at max_tokens), "content_filter" (a server's filter)
        message["finish_reason"] = cut_off[row["id"]]
    return message


def import_messages(store: Store, messages: list[Message], title: str,
                    system_prompt: str | None = None) -> int:
    """Store validated ``messages`` as a new thread (with its own ``system_prompt``, if
    given), in one transaction; a branched export's tree is rebuilt with the same branch
    active. Returns the thread's id."""
    title = one_line_title(title) or "Imported chat"  # a title is a list's row
    with store.transaction():
        thread_id = store.create_thread(title)
        if system_prompt and system_prompt.strip():
            store.set_system_prompt(thread_id, system_prompt)
        if not any(TREE_KEY in m for m in messages):
            store.add_messages(thread_id, messages)
            _date(store, thread_id, messages)
            return thread_id
        ids: dict[Any, int] = {}
        active = None
        for message in messages:
            node = message[TREE_KEY]
            plain = {k: v for k, v in message.items() if k != TREE_KEY}
            parent = ids[node["parent_id"]] if node.get("parent_id") is not None else None
            ids[node["id"]] = store.add_messages(thread_id, [plain], parent_id=parent)[0]
            if node.get("active"):
                active = ids[node["id"]]
        store.set_head(thread_id, active if active is not None else max(ids.values()))
        _date(store, thread_id, messages)
    return thread_id


def _date(store: Store, thread_id: int, messages: list[Message]) -> None:
    """The thread's times as an Iris export gives them (:class:`DatedMessages`), else from
    its messages' dates, where they give them: an imported chat takes its place in the
    list by when it was last written to, not by when it came in."""
    if times := getattr(messages, "times", None):
        store.date_thread(thread_id, *times)
        return
    stamps = []
    latest = dt.datetime.now().timestamp() + 86_400  # a time in the future does not date it
    for message in messages:
        try:
            when = sent_at_of(message)
        except (ValueError, OverflowError, OSError):
            continue
        stamp = dt.datetime.fromisoformat(when).timestamp() if when is not None else None
        if stamp is not None and PLACEHOLDER_BEFORE <= stamp <= latest:  # (the year 5138 sorted the chat above
            stamps.append(stamp)  # every other for good; 0001-01-01, Go's zero time, or 1970:
            # a placeholder, as in _seconds; the message keeps the time it gives)
    if stamps:
        store.date_thread(thread_id, min(stamps), max(stamps))


def _too_deep(value: Any) -> bool:
    """Whether lists and objects in ``value`` nest more than MAX_NESTING levels (walked
    without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > MAX_NESTING:
                    return True
                stack.append((child, depth + 1))
    return False


def _check_storable(value: Any, where: str) -> None:
    """Refuse what JSON can carry but UTF-8 text cannot: a lone surrogate escape
    (``\\ud800``), or nesting deeper than can be written back."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start:exc.end].encode("unicode_escape").decode("ascii")
        raise ConversationFormatError(
            f"{where}: holds {bad}, half of a UTF-16 surrogate pair, which is not text; "
            "fix that escape in the file") from None
    except RecursionError:
        raise ConversationFormatError(f"{where}: nested too deeply to be stored") from None


def write_private(path: Path, text: str) -> None:
    """Write an export atomically (:func:`iris_desktop.files.atomic_write`): a kill or a
    full disk leaves the earlier file whole. A new file is private (0600), an existing
    one keeps its mode. Something that is not a regular file (a pipe, a terminal,
    ``/dev/stdout``) is written to as it is, never replaced. Raises OSError. The hidden
    temporary files killed writes left beside a file go first (``files.clean_leftovers``;
    one a live export is writing stays): before, each kill left one there for good."""
    from iris_desktop.files import clean_leftovers

    try:
        kind = os.stat(path).st_mode
    except FileNotFoundError:
        kind = None
    if kind is not None and not stat.S_ISREG(kind):
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        return
    clean_leftovers(path.parent)
    atomic_write(path, text, keep_mode=True)


def title_from(messages: list[Message], limit: int = 60) -> str:
    """A thread title from the first user message: its typed text, else the names of the
    files it carries (never their ``<file name=…>`` blocks)."""
    from iris_desktop.core.attachments import shown

    for message in messages:
        if message.get("role") == "user" and isinstance(message.get("content"), str):
            typed, files = shown(message)
            text = " ".join(typed.split()) or ", ".join(" ".join(name.split()) for name, _ in files)
            if text:
                return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"
    return "Imported chat"


def markdown_export(store: Store, thread_id: int) -> str:
    """The Markdown export of a thread (the window's and the CLI's): its active branch,
    its own system prompt, a stopped, failed or cut-off reply marked, and a note when other
    branches exist (the JSON export holds them)."""
    thread = store.thread(thread_id)
    rows, cut = store.messages(thread_id), store.cut_off_replies(thread_id)
    prompt, others = store.system_prompt_of(thread_id), store.has_branches(thread_id)
    _still_there(store, thread_id, thread)
    return to_markdown(thread["title"], [_exported(r, cut) for r in rows],
                       system_prompt=prompt, other_branches=others)


def _fence(text: str) -> str:
    """A code fence longer than any run of backticks in ``text`` (CommonMark's rule: a
    tool output holding ``` closed a fixed fence early, and what followed became
    headings)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _body(text: str) -> str:
    """A message's text as Markdown that keeps the export's structure: a line starting
    with # outside the message's own code blocks is escaped (a reply's "## User" line
    looked like a message boundary), and a code block left open is closed (an attached
    file's unclosed fence swallowed the next message)."""
    lines, fence = [], None
    for line in text.split("\n"):
        stripped = line.lstrip()
        marker = re.match(r"(`{3,}|~{3,})", stripped)
        if fence is None and marker:
            fence = marker.group(1)
        elif fence is not None and stripped.startswith(fence) and not stripped[len(fence):].strip():
            fence = None
        elif fence is None and stripped.startswith("#"):
            line = line.replace("#", "\\#", 1)
        lines.append(line)
    if fence is not None:
        lines.append(fence)
    return "\n".join(lines)


def to_markdown(title: str, messages: list[Message], system_prompt: str | None = None,
                other_branches: bool = False) -> str:
    """A readable export; the JSON export is the exact one."""
    out = [f"# {title}", ""]
    if other_branches:
        out += ["*This chat has other branches (regenerated or edited messages); this file "
                "holds the one shown. The JSON export holds them all.*", ""]
    if system_prompt:
        out += ["## System prompt (this chat's own)", "", _body(system_prompt), ""]
    for message in messages:
        role = message["role"]
        heading = {"user": "User", "assistant": "Assistant", "system": "System", "tool": "Tool"}[
            role
        ]
        if role == "tool" and message.get("name"):
            heading += f" ({message['name']})"
        if role == "assistant" and message.get("status") == "interrupted":
            heading += " (stopped)"
        elif role == "assistant" and message.get("status") == "error":
            heading += " (failed)"  # the model or the server failed: Continue goes on
        elif role == "assistant" and message.get("finish_reason") == "length":
            heading += " (cut off)"  # at its token cap: Continue goes on, as after a stop
        elif role == "assistant" and message.get("finish_reason") == "content_filter":
            heading += f" (cut off: {CONTENT_FILTERED})"  # as the window said it
        if imported_from(message):  # not written by Iris: the app it was written in
            heading += f" — imported from {imported_from(message)}"
        out.append(f"## {heading}")
        out.append("")
        content = message.get("content")
        if isinstance(content, list):
            content = json.dumps(content, ensure_ascii=False)
        if content:
            fence = _fence(content)
            out.append(_body(content) if role != "tool" else f"{fence}\n{content}\n{fence}")
            out.append("")
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            arguments = str(function.get("arguments"))
            fence = _fence(arguments)
            out.append(f"Tool call `{function.get('name')}`:")
            out.append("")
            out.append(f"{fence}json\n{arguments}\n{fence}")
            out.append("")
    return "\n".join(out).rstrip() + "\n"
