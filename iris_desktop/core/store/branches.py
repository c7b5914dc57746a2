"""Branches: a thread is a tree of messages, and one path through it is active.

Every message has a parent (None for the first). A regenerated reply, a continued reply
and an edited user message are new messages beside the ones they replace (the same
parent), never changes to them: the store stays append-only. The thread's ``head_id`` is
the newest message of the active branch, and ``thread_paths`` holds that branch's
messages, from the first to the head. Along a path ids only grow (a child is written
after its parent), so "the path up to id X" is "the path's messages with id ≤ X", and
the engine's reads stay what they were, joined with the path.

Alternatives are siblings of one role: the replies to one user message, the versions of
one user message. Switching to another alternative makes the newest branch below it
active.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from iris_desktop.core.store.base import Connected
from iris_desktop.core.store.errors import ThreadBusy, ThreadGone

#: ``:head`` and its ancestors up to the first on thread ``:t``'s path (``placed``), or
#: to the first message when none is: a recursive query, one row a message (SQLite sets
#: no depth limit on it; a 60,000-message chain is tested)
_UP_TO_PATH = """
    WITH RECURSIVE up(id, placed) AS (
        SELECT :head, EXISTS (SELECT 1 FROM thread_paths p WHERE p.thread_id = :t
                              AND p.message_id = :head)
        UNION ALL
        SELECT m.parent_id, EXISTS (SELECT 1 FROM thread_paths p WHERE p.thread_id = :t
                                    AND p.message_id = m.parent_id)
        FROM up JOIN messages m ON m.id = up.id
        WHERE NOT up.placed AND m.parent_id IS NOT NULL)"""


class Branches(Connected):
    """The active branch of each thread, and the alternatives along it."""

    def head(self, thread_id: int) -> int | None:
        """The newest message of the thread's active branch (None: no message yet)."""
        row = self.conn.execute("SELECT head_id FROM threads WHERE id = ?", (thread_id,)).fetchone()
        if row is None:
            raise ThreadGone(thread_id)
        return row[0]

    def parent_of(self, message_id: int) -> int | None:
        row = self.conn.execute("SELECT parent_id FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None:
            raise KeyError(f"no message {message_id}")
        return row[0]

    def on_path(self, thread_id: int, ids: Iterable[int]) -> set[int]:
        """The ones of ``ids`` on the thread's active branch."""
        wanted = list(dict.fromkeys(int(i) for i in ids))
        found: set[int] = set()
        for start in range(0, len(wanted), 500):
            chunk = wanted[start:start + 500]
            rows = self.conn.execute(
                f"SELECT message_id FROM thread_paths WHERE thread_id = ? AND message_id IN "
                f"({','.join('?' * len(chunk))})", (thread_id, *chunk)).fetchall()
            found.update(r[0] for r in rows)
        return found

    def alternatives(self, message_id: int) -> list[int]:
        """The message and its alternatives (same parent, same role), oldest first."""
        row = self.conn.execute("SELECT thread_id, parent_id, role FROM messages WHERE id = ?",
                                (message_id,)).fetchone()
        if row is None:
            raise KeyError(f"no message {message_id}")
        thread_id, parent, role = row
        rows = self.conn.execute(
            "SELECT id FROM messages WHERE thread_id = ? AND parent_id IS ? AND role = ? ORDER BY id",
            (thread_id, parent, role)).fetchall()
        return [r[0] for r in rows]

    def replies_to(self, message_id: int) -> list[int]:
        """The replies (assistant messages) whose parent is ``message_id``, oldest first."""
        rows = self.conn.execute(
            "SELECT id FROM messages WHERE parent_id = ? AND role = 'assistant' ORDER BY id",
            (message_id,)).fetchall()
        return [r[0] for r in rows]

    def editable(self, thread_id: int, message_id: int) -> bool:
        """Is ``message_id`` a user message on the thread's active branch (one an edit may
        replace)?"""
        row = self.conn.execute("SELECT thread_id, role FROM messages WHERE id = ?",
                                (message_id,)).fetchone()
        return (row is not None and tuple(row) == (thread_id, "user")
                and bool(self.on_path(thread_id, [message_id])))

    def branch_points(self, thread_id: int) -> dict[int, tuple[int, int]]:
        """For each message of the active branch that has alternatives: (its 1-based
        place among them, how many there are)."""
        rows = self.conn.execute(
            """
            SELECT m.id, m.parent_id, m.role FROM messages m
            WHERE m.thread_id = ? AND EXISTS (
                SELECT 1 FROM messages o WHERE o.thread_id = m.thread_id
                AND o.parent_id IS m.parent_id AND o.role = m.role AND o.id != m.id)
            ORDER BY m.id
            """, (thread_id,)).fetchall()
        groups: dict[tuple, list[int]] = {}
        for mid, parent, role in rows:
            groups.setdefault((parent, role), []).append(mid)
        path = self.on_path(thread_id, (mid for mid, _, _ in rows))
        return {mid: (ids.index(mid) + 1, len(ids))
                for ids in groups.values() for mid in ids if mid in path}

    def has_branches(self, thread_id: int) -> bool:
        """True when some message of the thread has an alternative."""
        return self.conn.execute(
            """
            SELECT 1 FROM messages m WHERE m.thread_id = ? AND EXISTS (
                SELECT 1 FROM messages o WHERE o.thread_id = m.thread_id
                AND o.parent_id IS m.parent_id AND o.role = m.role AND o.id != m.id)
            LIMIT 1
            """, (thread_id,)).fetchone() is not None

    def newest_leaf(self, message_id: int) -> int:
        """The end of the newest branch below ``message_id``: its newest child, that
        child's newest child, and so on. One query however long the branch (walked one
        statement a message, switching back at an old reply of a 50,000-message chat
        took 200,000 statements and 5 s)."""
        row = self.conn.execute(
            """
            WITH RECURSIVE down(id, next) AS (
                SELECT :start, (SELECT max(c.id) FROM messages c WHERE c.parent_id = :start)
                UNION ALL
                SELECT next, (SELECT max(c.id) FROM messages c WHERE c.parent_id = down.next)
                FROM down WHERE next IS NOT NULL)
            SELECT id FROM down WHERE next IS NULL
            """, {"start": message_id}).fetchone()
        return row[0]

    def set_head(self, thread_id: int, message_id: int | None) -> None:
        """Make the branch ending at ``message_id`` the active one (None: the thread's
        messages are all off the path, as before its first). Only the part of the path
        below the fork (the nearest of ``message_id`` and its ancestors on the path)
        changes: the old branch's messages after it leave, the new one's join. A few
        statements however long either part is (one or more a message before). Raises
        KeyError when ``message_id`` is not a message of ``thread_id``."""
        if message_id is not None:
            owner = self.conn.execute("SELECT thread_id FROM messages WHERE id = ?",
                                      (message_id,)).fetchone()
            if owner is None or owner[0] != thread_id:
                raise KeyError(f"no message {message_id} in thread {thread_id}")
        with self.transaction():
            ids = {"t": thread_id, "head": message_id}
            fork = 0
            if message_id is not None:
                row = self.conn.execute(f"{_UP_TO_PATH} SELECT id FROM up WHERE placed", ids).fetchone()
                fork = row[0] if row is not None else 0
            self.conn.execute("DELETE FROM thread_paths WHERE thread_id = ? AND message_id > ?",
                              (thread_id, fork))
            if message_id is not None and message_id != fork:
                # (the messages below the fork were off the path, and still are: the
                # chain read again is the one above)
                self.conn.execute("INSERT INTO thread_paths(thread_id, message_id) "
                                  f"{_UP_TO_PATH} SELECT :t, id FROM up WHERE NOT placed", ids)
            self.conn.execute("UPDATE threads SET head_id = ? WHERE id = ?", (message_id, thread_id))

    def switch_branch(self, thread_id: int, message_id: int, step: int) -> int:
        """Show the alternative ``step`` places after (or before, negative) ``message_id``:
        the newest branch below it becomes active. Returns the new head. Raises
        KeyError when ``message_id`` is not a message of ``thread_id`` (another thread's
        id would re-point this thread into that one), ValueError when there is no such
        alternative."""
        row = self.conn.execute("SELECT thread_id FROM messages WHERE id = ?",
                                (message_id,)).fetchone()
        if row is None or row[0] != thread_id:
            raise KeyError(f"no message {message_id} in thread {thread_id}")
        siblings = self.alternatives(message_id)
        index = siblings.index(message_id) + step
        if not 0 <= index < len(siblings):
            if len(siblings) == 1:
                raise ValueError(f"message {message_id} has no alternatives")
            place = "first" if index < 0 else "last"
            raise ValueError(f"message {message_id} is the {place} of its {len(siblings)} alternatives "
                             f"(nothing {'before' if index < 0 else 'after'} it)")
        head = self.newest_leaf(siblings[index])
        self.set_head(thread_id, head)
        return head

    def switch_to_alternative(self, thread_id: int, message_id: int, step: int) -> int:
        """:meth:`switch_branch`, returning the alternative switched to (what a view keeps
        in sight: it is not the new head when a reply or more follow it). ThreadBusy while
        another window or command is answering in the chat: its question and reply would
        go on below the head it read, on a branch no longer shown."""
        with self.transaction():
            holder = self.turn_holder(thread_id)  # type: ignore[attr-defined]
            if holder is not None:
                raise ThreadBusy(holder)
            self.switch_branch(thread_id, message_id, step)
        siblings = self.alternatives(message_id)
        return siblings[siblings.index(message_id) + step]


def rebuild_paths(conn: sqlite3.Connection) -> None:
    """After a salvage: a message whose parent was lost hangs below the thread's nearest
    earlier message that is left (a damaged page in the middle of a chat cut it in two
    before, and the part above the gap was no longer on the path the window shows); a
    thread whose messages lost every link (a database older than branches) read as one
    line again, and each thread's active path rebuilt from its head (or its newest
    message)."""
    conn.execute("""
        UPDATE messages SET parent_id = (SELECT max(p.id) FROM messages p
                                         WHERE p.thread_id = messages.thread_id AND p.id < messages.id)
        WHERE parent_id IS NOT NULL AND parent_id NOT IN (SELECT id FROM messages)""")
    conn.execute("""
        UPDATE messages SET parent_id = (SELECT max(p.id) FROM messages p
                                         WHERE p.thread_id = messages.thread_id AND p.id < messages.id)
        WHERE thread_id NOT IN (SELECT thread_id FROM messages WHERE parent_id IS NOT NULL)""")
    conn.execute("UPDATE threads SET head_id = NULL WHERE head_id NOT IN (SELECT id FROM messages)")
    conn.execute("UPDATE threads SET head_id = (SELECT max(id) FROM messages WHERE thread_id = threads.id) "
                 "WHERE head_id IS NULL")
    conn.execute("DELETE FROM thread_paths")
    conn.execute("""
        INSERT INTO thread_paths(thread_id, message_id)
        WITH RECURSIVE up(thread_id, id) AS (
            SELECT t.id, t.head_id FROM threads t WHERE t.head_id IS NOT NULL
            UNION ALL
            SELECT up.thread_id, m.parent_id FROM up JOIN messages m ON m.id = up.id
            WHERE m.parent_id IS NOT NULL)
        SELECT thread_id, id FROM up""")
