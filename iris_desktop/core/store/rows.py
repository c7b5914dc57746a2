"""Rows and messages: what a stored row becomes, and what a message is stored as.

A message is stored key for key (``extra`` keeps what has no column, and which keys were
present), so that :func:`row_to_message` returns exactly the OpenAI message that was
written. Times: ``created_at`` is when the row was written (seconds since the epoch);
``sent_at`` is when the message was, as ISO 8601 with the writer's UTC offset.
"""

from __future__ import annotations

import codecs
import datetime as dt
import functools
import json
import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from iris_desktop.tokens import Message

ROLES = ("system", "user", "assistant", "tool")
#: keys of an OpenAI chat message that have their own column
_COLUMNS = ("role", "content", "tool_calls", "tool_call_id", "name")
#: the most UTF-8 bytes one token can stand for with any counter Iris uses. Longest tokens
#: measured: cl100k_base 128 bytes, Qwen2.5 32, Gemma 3 31; the heuristic ceil(chars/4)
#: is at most 16 (4 characters of at most 4 bytes). 256 leaves room for other vocabularies.
MAX_BYTES_PER_TOKEN = 256


@dataclass(frozen=True)
class MessageMeta:
    """What the engine needs of a message, without its text."""

    id: int
    turn: int
    role: str
    tokens: int | None
    has_tool_calls: bool
    tool_call_id: str | None
    status: str
    name: str | None = None


def in_flight(metas: Sequence[MessageMeta]) -> list[MessageMeta]:
    """The tool results the model has not answered yet: those that end the newest turn
    (the engine keeps them whole or clips them; compaction counts them as clipped)."""
    results: list[MessageMeta] = []
    for meta in reversed(metas):
        if meta.role != "tool" or meta.turn != metas[-1].turn:
            break
        results.append(meta)
    return results


@dataclass(frozen=True)
class SummaryRow:
    id: int
    thread_id: int
    prev_id: int | None
    first_message_id: int
    covers_through_id: int
    first_turn: int
    last_turn: int
    fields: dict[str, Any]
    text: str
    tokens: int
    counter: str
    path: str
    created_at: float


#: the codec error handler for stored text that is not UTF-8 (a flipped byte on disk):
#: each bad byte reads as U+FFFD, and the reading thread's count of them goes up
DAMAGED_TEXT = "iris-damaged-text"
_seen = threading.local()


def _replace_damaged(exc: UnicodeError) -> tuple[str, int]:
    if not isinstance(exc, UnicodeDecodeError):
        raise exc
    _seen.count = damaged_text_seen() + 1
    return "\ufffd", exc.end


codecs.register_error(DAMAGED_TEXT, _replace_damaged)

#: every connection's ``text_factory``: text as SQLite stores it, decoded in C (as
#: sqlite3 does by default) except that bytes that are not UTF-8 read as U+FFFD instead
#: of failing the whole query (one damaged message would make its thread unreadable)
decode_text = functools.partial(str, encoding="utf-8", errors=DAMAGED_TEXT)


def damaged_text_seen() -> int:
    """How many damaged stretches of text this thread has read so far (compare two
    values to learn whether a query met one)."""
    return getattr(_seen, "count", 0)


def valid_utf8(value: Any) -> bool:
    """Whether a raw stored value is text as it was written (bytes that decode)."""
    if not isinstance(value, bytes):
        return True
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def utf8_length(text: str) -> int:
    """Bytes of ``text`` in UTF-8 (a lone surrogate counts its three bytes)."""
    return len(text.encode("utf-8", "surrogatepass"))


def min_tokens(n_bytes: int) -> int:
    """The fewest tokens ``n_bytes`` of text can be, with any counter Iris uses."""
    return -(-n_bytes // MAX_BYTES_PER_TOKEN)


#: the message keys a source may carry its time in (OpenAI-style exports differ)
TIMESTAMP_KEYS = ("created_at", "create_time", "timestamp")


def now_iso() -> str:
    """Now, as ISO 8601 with the local UTC offset."""
    return dt.datetime.now().astimezone().isoformat(timespec="seconds")


def iso_timestamp(value: Any) -> str:
    """A source's timestamp as ISO 8601 with an offset: ISO text (a missing offset reads as
    local time) or seconds (or milliseconds) since the epoch. Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"not a time: {value!r}")
    if isinstance(value, (int, float)):
        seconds = value / 1000 if value > 1e11 else value  # milliseconds, from JavaScript
        when = dt.datetime.fromtimestamp(seconds).astimezone()
    elif isinstance(value, str):
        when = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        if when.tzinfo is None:
            when = when.astimezone()
    else:
        raise ValueError(f"not a time: {value!r}")
    return when.isoformat(timespec="seconds")


def not_in_future(iso: str, slack_s: float = 86_400) -> str:
    """``iso`` unless it is more than ``slack_s`` ahead of now (ValueError): another app's
    time of 99999999999999 read as the year 5138, and its chat sorted above every other
    for good."""
    if dt.datetime.fromisoformat(iso).timestamp() > dt.datetime.now().timestamp() + slack_s:
        raise ValueError(f"a time in the future: {iso}")
    return iso


def sent_at_of(message: Message) -> str | None:
    """The time a message says it was written, if it says (see TIMESTAMP_KEYS)."""
    for key in TIMESTAMP_KEYS:
        if message.get(key) is not None:
            return iso_timestamp(message[key])
    return None


#: OpenAI content-part types that hold text, and the key the text is under
TEXT_PARTS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal"}
#: content-part types that hold something else, as a sentence names what they hold
MEDIA_PARTS = {"image_url": "an image", "input_image": "an image", "image": "an image",
               "input_audio": "an audio", "audio": "an audio", "file": "a file",
               "input_file": "a file", "video_url": "a video"}
#: what separates a message's text parts once they are one text
PART_SEPARATOR = "\n"


class ContentPartsError(ValueError):
    """Content parts that are not all text; the message (a clause: "holds an image part
    (part 2, 'image_url')…") says which part and why."""


def parts_text(parts: list[Any]) -> str:
    """The text of OpenAI content parts (``text``, ``input_text``, ``output_text``,
    ``refusal``), one part after the other with a newline between. Raises
    ContentPartsError for the first part that is not text."""
    texts = []
    for n, part in enumerate(parts, start=1):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get(TEXT_PARTS[kind]), str):
            texts.append(part[TEXT_PARTS[kind]])
        elif kind in MEDIA_PARTS:
            raise ContentPartsError(f"holds {MEDIA_PARTS[kind]} part (part {n}, {kind!r}); "
                                    "Iris reads text only, so remove it or put what it holds "
                                    "into words")
        elif kind in TEXT_PARTS:
            raise ContentPartsError(f"content part {n} ({kind!r}) has no "
                                    f"'{TEXT_PARTS[kind]}' string")
        elif isinstance(kind, str):
            raise ContentPartsError(f"content part {n} is of type {kind!r}, which Iris cannot "
                                    "read; it reads text parts only")
        else:
            raise ContentPartsError(f"content part {n} is not a content part such as "
                                    '{"type": "text", "text": "…"}')
    return PART_SEPARATOR.join(texts)


def stored_content_text(stored: str) -> str:
    """Content an older Iris stored as JSON (``content_is_json``: OpenAI content parts,
    or any other list) as the text it holds: its text parts joined as :func:`parts_text`
    joins them, a part that holds no text named in brackets; anything else (not parts,
    damaged, nested too deeply to read back) is the stored JSON text itself."""
    try:
        parts = json.loads(stored)
    except (ValueError, RecursionError):
        return stored
    if not isinstance(parts, list):
        return stored
    texts = []
    for part in parts:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get(TEXT_PARTS[kind]), str):
            texts.append(part[TEXT_PARTS[kind]])
        elif kind in MEDIA_PARTS:
            texts.append(f"[{MEDIA_PARTS[kind]} part left out: Iris reads text only]")
        else:
            return stored
    return PART_SEPARATOR.join(texts)


def _message_row(message: Message, default_sent_at: str | None = None) -> dict[str, Any]:
    role = message.get("role")
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; expected one of {', '.join(ROLES)}")
    content = message.get("content")
    content_is_json = 0
    if content is not None and not isinstance(content, str):
        content = json.dumps(content, ensure_ascii=False)
        content_is_json = 1
    calls = message.get("tool_calls")
    extra = {k: v for k, v in message.items() if k not in _COLUMNS}
    # keep key presence exact so that export returns what was imported
    present = [k for k in ("content", "tool_calls", "tool_call_id", "name") if k in message]
    extra["_keys"] = present
    return {
        "role": role,
        "content": content,
        "content_is_json": content_is_json,
        "tool_calls": None if calls is None else json.dumps(calls, ensure_ascii=False),
        "tool_call_id": message.get("tool_call_id"),
        "name": message.get("name"),
        "extra": json.dumps(extra, ensure_ascii=False),
        "sent_at": sent_at_of(message) or default_sent_at,
    }


def _json(text: str | None, default: Any) -> Any:
    """Stored JSON, or ``default`` when damage on disk made it unreadable, or an older
    Iris stored it nested too deeply to parse again here."""
    if text is None:
        return default
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return default


def row_to_message(row: dict[str, Any]) -> Message:
    """A stored row back to the OpenAI message it was made from, key for key, except
    that content is always text (or None): content an older Iris stored as a list (of
    content parts) reads as the text it holds (:func:`stored_content_text`), so every
    reader can join it to other text. A row damaged on disk still gives a message: JSON
    that no longer parses is left out (``extra``, ``tool_calls``)."""
    extra = _json(row.get("extra") or None, {})
    if not isinstance(extra, dict):
        extra = {}
    present = extra.pop("_keys", ["content", "tool_calls", "tool_call_id", "name"])
    if not isinstance(present, list):
        present = ["content", "tool_calls", "tool_call_id", "name"]
    message: Message = {"role": row["role"]}
    content = row["content"]
    if content is not None and row.get("content_is_json"):
        content = stored_content_text(content)
    values = {
        "content": content,
        "tool_calls": _json(row["tool_calls"], None),
        "tool_call_id": row["tool_call_id"],
        "name": row["name"],
    }
    for key in ("content", "tool_calls", "tool_call_id", "name"):
        # a reply that made calls while streaming gains tool_calls after its insert
        if key in present or (key == "tool_calls" and values[key] is not None):
            message[key] = values[key]
    message.update(extra)
    return message


def _summary(cursor: sqlite3.Cursor) -> SummaryRow | None:
    row = cursor.fetchone()
    if row is None:
        return None
    cols = [d[0] for d in cursor.description]
    return _summary_from(dict(zip(cols, row)))


def _summary_from(row: dict[str, Any]) -> SummaryRow:
    row = dict(row)
    row["fields"] = json.loads(row["fields"])
    return SummaryRow(**row)
