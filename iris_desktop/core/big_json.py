"""Reading a large JSON export beside a window (:mod:`.foreign`'s imports).

The window's import runs on a thread of its own, but Python runs one thread at a time, and
two things held the window still while a large export was read: ``json.loads`` over the
whole file is one call (the window's thread waits until it returns), and the cyclic
garbage collector, set off by the millions of objects the export becomes, walks all of
them again and again while they are made (most of the reading time, in pauses of a second
or more). So a top-level array (ChatGPT's and Claude's exports: one item per chat) is read
an item at a time (:func:`parse`), and while an export is read and converted
(:func:`kept_apart`) its parsed values are kept out of the collector's walks: it is paused
while they are made and they are frozen (``gc.freeze``) until the read ends, when they are
gone (reference counting frees them: JSON values hold no cycles). Measured in
docs/benchmarks.md ("Importing a large export beside the window").
"""

from __future__ import annotations

import contextlib
import gc
import json
import re
import threading
from collections.abc import Iterator
from typing import Any

_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")
#: how many :func:`kept_apart` blocks are under way (parse freezes only inside one)
_apart = 0
_apart_lock = threading.Lock()


def parse(text: str) -> Any:
    """``text`` as JSON, as ``json.loads`` reads it (the same values, the same ValueError
    or RecursionError), a top-level array an item at a time; the values made meanwhile
    are frozen out of the collector's walks (inside :func:`kept_apart`, until it ends)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        start = _SPACE.match(text).end()
        if not text.startswith("[", start):
            return json.loads(text)
        return _array(text, _SPACE.match(text, start + 1).end())
    finally:
        if _apart:  # what was made: never walked by the collector until kept_apart ends
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
    """The block reads an export (:func:`parse` freezes its values): when it ends, they are
    gone, and what is still frozen (this process's objects of before) is walked again
    once the last such block ends (two imports at once: the second's)."""
    global _apart
    with _apart_lock:
        _apart += 1
    try:
        yield
    finally:
        with _apart_lock:
            _apart -= 1
            if not _apart:
                gc.unfreeze()
