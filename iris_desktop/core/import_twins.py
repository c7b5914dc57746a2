"""Whether a chat being imported is in the history already (the same export imported
again): the same messages in the same order, at the same times where both say; as this
Iris reads the chat, or as an earlier one read it (and stored it).

Read by :func:`iris_desktop.core.foreign.import_conversations` inside the transaction
that would store the chat, so that two imports at once store it once.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any, NamedTuple

from iris_desktop.core.store import Store, iso_timestamp, row_to_message
from iris_desktop.core.store.rows import TIMESTAMP_KEYS
from iris_desktop.tokens import Message


class StoredThreads:
    """The threads a chat being imported may already be in, by message count; each read
    once, when a chat of its size is first compared."""

    def __init__(self, store: Store, again: bool):
        self.store, self.again = store, again
        self.sizes: dict[int, list[int]] = {}
        self.titles: dict[int, str] = {}
        self.said: dict[int, list[_Said]] = {}

    def catch_up(self, own: list[int]) -> None:
        """Learn the threads written since the last look (by another process too), but
        for ``own``, this import's: a file that holds a chat twice stores it twice."""
        if self.again:
            return
        mine = set(own)
        for thread in self.store.threads():
            if thread["id"] not in self.titles and thread["id"] not in mine:
                self.sizes.setdefault(thread["messages"], []).append(thread["id"])
                self.titles[thread["id"]] = thread["title"]

    def holding(self, messages: list[Message], before: list[Message] | None = None
                ) -> int | None:
        """The thread that holds ``messages`` already, or None; or ``before``: the same
        chat as an earlier Iris read it (without the documents its replies wrote, with
        ChatGPT's markers: :attr:`~iris_desktop.core.foreign_parts.Chat.before`), the way
        that Iris stored it."""
        for form in (messages, before) if before else (messages,):
            said = _said(form)
            for thread_id in self.sizes.get(len(form), []):
                if thread_id not in self.said:
                    self.said[thread_id] = [
                        _Said(m.get("role") or "", m.get("content") or "", _instant(r["sent_at"]))
                        for r in self.store.all_messages(thread_id) for m in [row_to_message(r)]]
                stored = self.said[thread_id]  # (written to, or deleted, since it was counted)
                if len(stored) == len(said) and all(a.same(b) for a, b in zip(stored, said)):
                    return thread_id
        return None


class _Said(NamedTuple):
    role: str
    content: str
    when: dt.datetime | None

    def same(self, other: _Said) -> bool:
        """The same message: who said what, and when, where both say (a chat of "test" and
        "Hello! How can I help?" in another year is another chat)."""
        return (self.role == other.role and self.content == other.content
                and (self.when is None or other.when is None or self.when == other.when))


def _instant(value: Any) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(iso_timestamp(value)) if value is not None else None
    except (ValueError, OverflowError, OSError):
        return None


def _said(messages: Iterable[Message]) -> list[_Said]:
    """Who said what, and when, in order: what makes two chats the same (every branch, in
    the order an import stores them; content is text here, or None)."""
    return [_Said(m.get("role") or "", m.get("content") or "",
                  next((_instant(m[k]) for k in TIMESTAMP_KEYS if m.get(k) is not None), None))
            for m in messages]
