"""Whether a chat being imported is in the history already (the same export imported
again): the same messages in the same order, at the same times where both say; as this
Iris reads the chat, or as an earlier one read it (and stored it).

Read by :func:`iris_desktop.core.foreign.import_conversations`: the history once, out of
the write transaction; then, inside the transaction that would store the chat, what was
written since and the few threads that may hold it, so that two imports at once store it
once.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any, NamedTuple

from iris_desktop.core.store import Store, iso_timestamp, row_to_message
from iris_desktop.core.store.rows import TIMESTAMP_KEYS
from iris_desktop.tokens import Message


class StoredThreads:
    """The threads a chat being imported may already be in, found by a key of who said
    what (:func:`_key`, times left out: they are compared where both say), so that a chat
    is compared with the few threads that share its key, not with every thread of its
    size (0.09 s a chat, each more with a longer history). The stored threads are read
    once, out of the write transaction (:meth:`prepare`); then only the threads written
    since, found by the messages' ids (never given again: migration 16)."""

    def __init__(self, store: Store, again: bool):
        self.store, self.again = store, again
        self.sizes: dict[int, list[int]] = {}
        self.titles: dict[int, str] = {}
        self.keys: dict[tuple[int, int], list[int]] = {}
        self.key_of: dict[int, tuple[int, int]] = {}
        self.indexed: set[int] = set()  # the sizes whose threads are all keyed
        #: the newest message id looked at: a thread written since has a newer one
        self.high: int | None = None
        #: stored threads compared message by message (what a test counts)
        self.compared = 0

    def prepare(self, sizes: Iterable[int], own: list[int]) -> None:
        """Out of the write transaction: learn the threads there (by another process too,
        since the last look) and key those of ``sizes`` (the chats' message counts)."""
        if self.again:
            return
        self.catch_up(own)
        for size in set(sizes) - self.indexed:
            self._index_size(size)

    def catch_up(self, own: list[int]) -> None:
        """Learn the threads written since the last look (by another process too), but
        for ``own``, this import's: a file that holds a chat twice stores it twice. The
        first look lists every thread; each later one reads only the messages newer than
        the newest seen (none: one lookup in the id index)."""
        if self.again:
            return
        mine = set(own)
        newest = self.store.newest_message_id() or 0
        if self.high is None:
            self.high = newest
            for thread in self.store.threads():
                if thread["id"] not in mine:
                    self.sizes.setdefault(thread["messages"], []).append(thread["id"])
                    self.titles[thread["id"]] = thread["title"]
            return
        if newest <= self.high:
            return
        written = self.store.chats_of(range(self.high + 1, newest + 1))
        self.high = newest
        for thread_id, title in written:
            if thread_id not in mine:
                self.titles[thread_id] = title
                self._rekey(thread_id)

    def seen_own(self) -> None:
        """The messages this import just wrote (in its open transaction) are its own:
        the next :meth:`catch_up` starts after them."""
        if not self.again:
            self.high = self.store.newest_message_id() or 0

    def _index_size(self, size: int) -> None:
        self.indexed.add(size)
        for thread_id in self.sizes.get(size, []):
            if thread_id not in self.key_of:
                self._rekey(thread_id)

    def _rekey(self, thread_id: int) -> None:
        """(Re)key a thread by its messages as stored now (none: deleted)."""
        old = self.key_of.pop(thread_id, None)
        if old is not None and thread_id in self.keys.get(old, []):
            self.keys[old].remove(thread_id)
        said = _stored(self.store, thread_id)
        if said:
            self.key_of[thread_id] = key = _key(said)
            self.keys.setdefault(key, []).append(thread_id)

    def holding(self, messages: list[Message], before: list[Message] | None = None
                ) -> int | None:
        """The thread that holds ``messages`` already, or None; or ``before``: the same
        chat as an earlier Iris read it (without the documents its replies wrote, with
        ChatGPT's markers: :attr:`~iris_desktop.core.foreign_parts.Chat.before`), the way
        that Iris stored it. Only the threads with the same key are read again (as they
        are now: written to, or deleted, since they were keyed) and compared."""
        for form in (messages, before) if before else (messages,):
            said = _said(form)
            if len(said) not in self.indexed:
                self._index_size(len(said))
            for thread_id in list(self.keys.get(_key(said), [])):
                self.compared += 1
                stored = _stored(self.store, thread_id)
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


def _stored(store: Store, thread_id: int) -> list[_Said]:
    return [_Said(m.get("role") or "", m.get("content") or "", _instant(r["sent_at"]))
            for r in store.all_messages(thread_id) for m in [row_to_message(r)]]


def _key(said: list[_Said]) -> tuple[int, int]:
    """How many messages, and a hash of who said what (not when: a time is compared only
    where both say one); equal for two chats :meth:`_Said.same` finds the same."""
    return len(said), hash(tuple((s.role, s.content if isinstance(s.content, str)
                                  else repr(s.content)) for s in said))
