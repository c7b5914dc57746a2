"""Message vectors for semantic recall, in ``message_vectors`` (schema 7; by model since 11):

    message_vectors(message_id → messages(id) ON DELETE CASCADE, model, vector BLOB,
                    PRIMARY KEY (message_id, model))

A message holds at most one vector per embedding model (``model``: the embedder's
identity). A vector from another model than the current one is searched only while the
current model's are incomplete (a change of embedder: core.semantic), and
:meth:`Vectors.drop_other_vectors` removes them once nothing needs them. These queries
take and return plain ids, rows and bytes: :mod:`iris_desktop.core.semantic` keeps the
floor, the matrices and numpy. Never changes ``messages``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from iris_desktop.core.store.base import Connected

#: a message that has a vector to make (or already has one): final text of a chat turn
_ELIGIBLE = ("m.role IN ('user', 'assistant') AND m.status != 'streaming' "
             "AND m.content IS NOT NULL AND trim(m.content) != ''")
#: read by the small (model, message_id) index, never by the table's key order, whose
#: pages hold the vectors themselves (schema 12)
_NO_VECTOR = ("NOT EXISTS (SELECT 1 FROM message_vectors v INDEXED BY message_vectors_model "
              "WHERE v.model = :model AND v.message_id = m.id)")


def _scope(thread_id: int | None) -> str:
    """The condition for one thread's messages (``:thread``), or none for all threads."""
    return "m.thread_id = :thread AND " if thread_id is not None else ""


class Vectors(Connected):
    """What semantic recall stores: which messages still need a vector, and the vectors."""

    def messages_without_vector(self, thread_id: int | None, after_id: int, model: str,
                                limit: int, through_id: int | None = None) -> list[dict[str, Any]]:
        """Up to ``limit`` messages above ``after_id`` (and at most ``through_id``; of one
        thread, or of all when ``thread_id`` is None) that should have a vector from
        ``model`` and have none: user and assistant messages with final text, oldest
        first, with the columns their text is read from (id, role, content,
        content_is_json, name, sent_at)."""
        cursor = self.conn.execute(
            f"SELECT m.id, m.role, m.content, m.content_is_json, m.name, m.sent_at FROM messages m "
            f"WHERE {_scope(thread_id)}m.id > :floor AND m.id <= :through AND {_ELIGIBLE} "
            f"AND {_NO_VECTOR} ORDER BY m.id LIMIT :limit",
            {"thread": thread_id, "floor": after_id, "model": model, "limit": limit,
             "through": through_id if through_id is not None else 2**63 - 1})
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]

    def messages_with_other_vectors_only(self, model: str, limit: int,
                                         after_id: int = 0) -> list[dict[str, Any]]:
        """Up to ``limit`` messages above ``after_id`` that have a vector from another model
        than ``model`` and none from ``model`` (what a change of embedder re-embeds), oldest
        first, with the columns of :meth:`messages_without_vector`. The vectors are read
        in key order from ``after_id`` on, so a caller that passes the last id it got
        reads each batch without scanning the ones before it."""
        cursor = self.conn.execute(
            "SELECT m.id, m.role, m.content, m.content_is_json, m.name, m.sent_at "
            "FROM message_vectors o JOIN messages m ON m.id = o.message_id "
            f"WHERE o.message_id > :after AND o.model != :model AND {_NO_VECTOR} "
            "GROUP BY o.message_id ORDER BY o.message_id LIMIT :limit",
            {"model": model, "limit": limit, "after": after_id})
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]

    def first_without_vector(self, thread_id: int | None, after_id: int, through_id: int,
                             model: str) -> int | None:
        """The oldest message with ``after_id`` < id ≤ ``through_id`` that should have a
        vector from ``model`` and has none (as :meth:`messages_without_vector`), or None."""
        row = self.conn.execute(
            f"SELECT m.id FROM messages m WHERE {_scope(thread_id)}m.id > :floor AND m.id <= :newest "
            f"AND {_ELIGIBLE} AND {_NO_VECTOR} ORDER BY m.id LIMIT 1",
            {"thread": thread_id, "floor": after_id, "newest": through_id, "model": model}).fetchone()
        return row[0] if row else None

    def count_without_vector(self, thread_id: int, through_id: int, model: str) -> int:
        """How many of the thread's messages up to ``through_id`` should have a vector
        from ``model`` and have none (as :meth:`messages_without_vector`)."""
        (count,) = self.conn.execute(
            f"SELECT count(*) FROM messages m WHERE {_scope(thread_id)}m.id <= :through "
            f"AND {_ELIGIBLE} AND {_NO_VECTOR}",
            {"thread": thread_id, "through": through_id, "model": model}).fetchone()
        return int(count)

    def first_streaming_id(self, thread_id: int | None, after_id: int) -> int | None:
        """The oldest reply above ``after_id`` still being streamed (of one thread, or of
        all when ``thread_id`` is None), or None."""
        # the partial index holds only the few streaming rows
        (streaming,) = self.conn.execute(
            f"SELECT min(m.id) FROM messages m INDEXED BY messages_streaming "
            f"WHERE {_scope(thread_id)}m.status = 'streaming' AND m.id > :floor",
            {"thread": thread_id, "floor": after_id}).fetchone()
        return streaming

    def save_vectors(self, model: str, vectors: Sequence[tuple[int, bytes]]) -> None:
        """Store ``(message id, vector)`` pairs from ``model`` in one transaction,
        replacing that model's vector of the same message (another model's stays). A
        message deleted meanwhile (its thread was) is skipped rather than failing the
        foreign key."""
        rows = [(mid, model, vector, mid) for mid, vector in vectors]
        with self.transaction():
            self.conn.executemany(
                "INSERT OR REPLACE INTO message_vectors(message_id, model, vector) "
                "SELECT ?, ?, ? WHERE EXISTS (SELECT 1 FROM messages WHERE id = ?)", rows)

    def iter_vectors(self, thread_id: int, after_id: int, through_id: int, model: str,
                     block: int) -> Iterator[list[tuple[int, bytes]]]:
        """The thread's ``(message id, vector)`` pairs from ``model`` with ``after_id`` <
        id ≤ ``through_id``, ascending by id, ``block`` rows at a time. The cursor is
        lazy: a caller holds one block at a time, never the whole thread's vectors.

        Where the thread holds most ids of the range (a long chat read from its start),
        the vectors are read in their key order and each checked against the thread's
        index, a sequential read (100,000 vectors: ~300 ms, against ~490 ms by one
        lookup per message); where its messages are scattered among other threads',
        only its own are looked up."""
        (mine,) = self.conn.execute(
            "SELECT count(*) FROM messages WHERE thread_id = ? AND id > ? AND id <= ?",
            (thread_id, after_id, through_id)).fetchone()
        if 2 * mine >= through_id - after_id:  # CROSS JOIN: the vectors' range is the outer loop
            sql = ("SELECT v.message_id, v.vector FROM message_vectors v CROSS JOIN messages m "
                   "ON m.id = v.message_id WHERE v.message_id > :after AND v.message_id <= :through "
                   "AND +v.model = :model AND m.thread_id = :thread ORDER BY v.message_id")
        else:
            sql = ("SELECT v.message_id, v.vector FROM messages m JOIN message_vectors v "
                   "ON v.message_id = m.id WHERE m.thread_id = :thread AND m.id > :after "
                   "AND m.id <= :through AND +v.model = :model ORDER BY m.id")
        cursor = self.conn.execute(sql, {"thread": thread_id, "after": after_id, "through": through_id,
                                         "model": model})
        try:  # (a generator let go of early closes its cursor: its read ends with it)
            while rows := cursor.fetchmany(block):
                yield rows
        finally:
            cursor.close()

    def vector_counts(self, model: str) -> tuple[int, int]:
        """(messages with a vector from ``model``, messages with a vector from another model
        only): how far a change of embedder has come (the second falls to 0)."""
        (current,) = self.conn.execute(
            "SELECT count(*) FROM message_vectors INDEXED BY message_vectors_model WHERE model = ?",
            (model,)).fetchone()
        (others,) = self.conn.execute(
            "SELECT count(DISTINCT o.message_id) FROM message_vectors o INDEXED BY message_vectors_model "
            "WHERE o.model != :model AND NOT EXISTS (SELECT 1 FROM message_vectors v INDEXED BY "
            "message_vectors_model WHERE v.model = :model AND v.message_id = o.message_id)",
            {"model": model}).fetchone()
        return int(current), int(others)

    def count_with_other_vectors(self, model: str, ids: Sequence[int]) -> int:
        """How many of ``ids`` hold a vector from another model than ``model`` (read by key:
        what a batch embedded during a change of embedder took off the waiting count)."""
        if not ids:
            return 0
        marks = ",".join("?" * len(ids))
        (count,) = self.conn.execute(
            f"SELECT count(DISTINCT message_id) FROM message_vectors WHERE message_id IN ({marks}) "
            "AND model != ?", (*ids, model)).fetchone()
        return int(count)

    def other_vector_models(self, model: str) -> list[str]:
        """The models other than ``model`` that vectors are stored from."""
        return [str(m) for (m,) in self.conn.execute(
            "SELECT DISTINCT model FROM message_vectors WHERE model != ? ORDER BY model", (model,))]

    def drop_other_vectors(self, model: str) -> int:
        """Delete every vector not from ``model`` (a change of embedder is complete); returns
        how many."""
        with self.transaction():
            return self.conn.execute("DELETE FROM message_vectors WHERE model != ?", (model,)).rowcount
