"""A history's token counts: the messages a chat template reads (:func:`wire_message`)
and the counts the engine needs, tokenized once and cached (:func:`ensure_counts`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from iris_desktop.core.store import MessageMeta, Store, row_to_message
from iris_desktop.core.store.errors import keep_cache
from iris_desktop.tokens import Message, TokenCounter


def wire_message(message: Message) -> Message:
    """Only the keys a chat template understands."""
    wire: Message = {"role": message["role"], "content": message.get("content")}
    for key in ("tool_calls", "tool_call_id", "name"):
        if message.get(key) is not None:
            wire[key] = message[key]
    return wire


def ensure_counts(
    store: Store, counter: TokenCounter, metas: Sequence[MessageMeta]
) -> list[MessageMeta]:
    """Fill in missing token counts (tokenizing only those messages) and cache them;
    a reply still being written is counted for this read but never cached (its text
    grows; the store refuses such a count too). A cache the full disk (or a read-only
    database) refuses is not kept: the counts serve this read (``keep_cache``)."""
    missing = [m.id for m in metas if m.tokens is None]
    if not missing:
        return list(metas)
    rows = store.messages_by_id(missing)
    counts = {mid: counter.count_message(wire_message(row_to_message(rows[mid]))) for mid in missing}
    keep_cache(store, "token counts", lambda: store.cache_counts(counter.name, {
        mid: n for mid, n in counts.items() if rows[mid].get("status") != "streaming"}))
    return [
        m if m.tokens is not None else replace(m, tokens=counts[m.id])  # keeps every field
        for m in metas
    ]
