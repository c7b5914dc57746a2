"""Reading an import's JSON files, and a large export beside a window (:mod:`.foreign`).

The window's import runs on a thread of its own, but Python runs one thread at a time, and
three things held the window still while a large export was read: ``json.loads`` over the
whole file is one call (the window's thread waits until it returns); the cyclic garbage
collector, set off by the millions of objects the export becomes, walked all of them
again and again while they were made, and the chats made from them while those were
stored (most of the reading time, in pauses of a second or more); and the parsed values
were freed all at once at the end. So a top-level array (ChatGPT's and Claude's exports:
one item per chat) is read an item at a time (:func:`parse`); while an export is read
and stored (:func:`kept_apart`) the values that live on are kept out of the collector's
walks (it is :func:`paused` while they are made, and they are frozen, ``gc.freeze``,
until the block ends; reference counting still frees them: JSON values hold no cycles);
and :mod:`.foreign` lets go of each chat's parsed values once it is converted. Measured in
docs/benchmarks.md ("Importing a large export beside the window").
"""

from __future__ import annotations

import contextlib
import gc
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from iris_desktop.core.conversation import (
    MAX_IMPORT_BYTES,
    TOO_LONG_NUMBER,
    ConversationFormatError,
    read_text_file,
)
from iris_desktop.core.conversation import deep_loads as _deep

_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")
#: how many :func:`kept_apart` blocks are under way (parse freezes only inside one)
_apart = 0
_apart_lock = threading.Lock()


def parse(text: str) -> Any:
    """``text`` as JSON, as ``json.loads`` reads it (the same values, the same ValueError
    or RecursionError), a top-level array an item at a time, the collector
    :func:`paused` meanwhile."""
    with paused():
        start = _SPACE.match(text).end()
        try:
            if not text.startswith("[", start):
                return json.loads(text)
            return _array(text, _SPACE.match(text, start + 1).end())
        except RecursionError:  # deeper than Python's recursion limit (about 1,000)
            return _deep(text)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """The collector paused while the block makes values that live on (an export's parsed
    values, its chats); inside :func:`kept_apart` they are frozen after it, out of its
    walks until that ends."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if _apart:
            gc.freeze()
        if enabled:
            gc.enable()


def _array(text: str, at: int) -> list[Any]:
    """The JSON array whose first item (or closing bracket) is at ``at``, to the end of
    ``text``, item by item; ValueError where it is not valid JSON (as json.loads)."""
    items: list[Any] = []
    if text.startswith("]", at):
        at += 1
    else:
        while True:
            item, at = _DECODER.raw_decode(text, at)
            items.append(item)
            at = _SPACE.match(text, at).end()
            if text.startswith("]", at):
                at += 1
                break
            if not text.startswith(",", at):
                raise json.JSONDecodeError("Expecting ',' delimiter", text, at)
            at = _SPACE.match(text, at + 1).end()
    end = _SPACE.match(text, at).end()
    if end != len(text):
        raise json.JSONDecodeError("Extra data", text, end)
    return items


@contextlib.contextmanager
def kept_apart() -> Iterator[None]:
    """The block reads or stores an export: what lives now (the chats read, when they are
    stored) and what :func:`paused` makes inside it are frozen out of the collector's
    walks. When the last such block ends they are walked again (what is left of them:
    the parsed values are gone by then, and the chats once nothing holds them)."""
    global _apart
    with _apart_lock:
        _apart += 1
        gc.freeze()
    try:
        yield
    finally:
        with _apart_lock:
            _apart -= 1
            if not _apart:
                gc.unfreeze()


# -- the JSON files of an import -----------------------------------------------------------


def value_of(text: str) -> Any:
    """The parsed JSON, or None when it is not one JSON value (conversation.py, or the
    JSONL reader, says what is wrong); read beside the window (:mod:`.big_json`)."""
    try:
        return parse(text)
    except (ValueError, RecursionError):
        return None


def values_of_lines(text: str) -> list[Any] | None:
    """One JSON value per non-empty line, or None when a line is not one."""
    values = []
    for line in text.splitlines():
        if line.strip():
            try:
                values.append(json.loads(line))
            except (ValueError, RecursionError):
                return None
    return values


def read_json(path: Path, soft: bool = False) -> tuple[Any, str | None]:
    """A JSON file beside the one imported (Jan's thread.json), and what was wrong with it;
    with ``soft``, (None, None) when it is missing and (None, the reason) when it cannot
    be read, instead of raising."""
    try:
        if soft and not path.is_file():
            return None, None
        value = value_of(read_text_file(path, MAX_IMPORT_BYTES))
    except OSError as exc:  # is_file on a folder one may not look into
        if soft:
            return None, f"{path}: cannot read it ({exc.strerror or exc})"
        raise ConversationFormatError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except ConversationFormatError as exc:
        if soft:
            return None, str(exc)
        raise
    if value is None:
        if not soft:
            raise ConversationFormatError(f"{path}: not valid JSON")
        return None, f"{path}: not valid JSON"
    if soft and not isinstance(value, dict):
        return None, f"{path}: not a Jan thread (a JSON object)"
    return value, None


def read_jsonl(path: Path) -> list[Any]:
    """Jan's messages.jsonl (none: the thread has no messages yet)."""
    try:
        if not path.is_file():
            return []
    except OSError:
        return []
    text = read_text_file(path, MAX_IMPORT_BYTES)
    values = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                values.append(json.loads(line))
            except json.JSONDecodeError:
                raise ConversationFormatError(f"{path}: line {number} is not valid JSON") from None
            except ValueError:  # json raises it for a number too long to convert
                raise ConversationFormatError(f"{path}: line {number}: {TOO_LONG_NUMBER}") from None
            except RecursionError:
                raise ConversationFormatError(f"{path}: line {number} is nested too deeply") from None
    return values
