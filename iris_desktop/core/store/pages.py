"""Pages of the active branch: the newest messages of a chat, or those just before a
message already shown, so that opening a 50,000-message chat reads one page of it and
not the whole branch (~1.4 s, and GUI stalls of 350-450 ms while the window took it in).

A branch is a chain along which ids only grow (:mod:`.branches`), so "the page before
message X" is X's ancestors, whatever branch is active now: a page read for a message
shown stays true of it after a branch switch below it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from iris_desktop.core.store.messages import Messages


@dataclass(frozen=True)
class PageRows:
    """One page of the active branch: its rows (oldest first), the id of the branch's
    message just before them (0: none, the page starts the branch) and how many of the
    branch's messages are older than the page (not read)."""

    rows: list[dict[str, Any]]
    previous: int
    older: int


class Pages(Messages):
    """Reads of one page of the active branch."""

    def branch_page(self, thread_id: int, below_id: int | None, size: int,
                    reach: int | None = None) -> PageRows:
        """The newest ``size`` messages of the active branch with ids below ``below_id``
        (None: the whole branch's newest), back to message ``reach`` at least when it is
        older (the newest user message: the turn a reload reads again starts there), and
        to the start of the turn the first of them is in (a page holds whole turns, so
        each tool result's card finds its call)."""
        below = 2**62 if below_id is None else below_id
        row = self.conn.execute(
            "SELECT message_id FROM thread_paths WHERE thread_id = ? AND message_id < ? "
            "ORDER BY message_id DESC LIMIT 1 OFFSET ?", (thread_id, below, max(size, 1) - 1)).fetchone()
        start = 0 if row is None else int(row[0])
        if reach is not None and 0 < reach < below:
            start = min(start, reach) if start else 0
        if start:  # from the user message its turn starts with: a tool result with its call
            turn = self.conn.execute(
                "SELECT m.id FROM messages m WHERE m.thread_id = ? AND m.role = 'user' AND m.id <= ? "
                "AND EXISTS (SELECT 1 FROM thread_paths p WHERE p.thread_id = m.thread_id "
                "AND p.message_id = m.id) ORDER BY m.id DESC LIMIT 1", (thread_id, start)).fetchone()
            start = 0 if turn is None else int(turn[0])
        previous, older = self.conn.execute(
            "SELECT max(message_id), count(*) FROM thread_paths WHERE thread_id = ? AND message_id < ?",
            (thread_id, start)).fetchone() if start else (None, 0)
        rows = self.messages(thread_id, max(start - 1, 0), below - 1)
        return PageRows(rows, int(previous or 0), int(older))

    def page_branch_points(self, thread_id: int, after_id: int, through_id: int) -> dict[int, tuple[int, int]]:
        """``branch_points`` of the active branch's messages with after_id < id ≤ through_id
        only: (1-based place among its alternatives, how many) for each that has some."""
        rows = self.conn.execute(
            """
            SELECT m.id, o.id FROM thread_paths p JOIN messages m ON m.id = p.message_id
            JOIN messages o ON o.thread_id = m.thread_id AND o.parent_id IS m.parent_id
                            AND o.role = m.role
            WHERE p.thread_id = ? AND p.message_id > ? AND p.message_id <= ?
            ORDER BY m.id, o.id
            """, (thread_id, after_id, through_id)).fetchall()
        groups: dict[int, list[int]] = {}
        for mid, other in rows:
            groups.setdefault(mid, []).append(other)
        return {mid: (ids.index(mid) + 1, len(ids)) for mid, ids in groups.items() if len(ids) > 1}
