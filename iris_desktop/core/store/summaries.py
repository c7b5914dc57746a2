"""Summaries, compaction events and leases, and requests: what the engine and compaction
record about a thread. None of it changes a message; a summary only says which messages it
covers (through ``covers_through_id``).

A summary belongs to the branch it was made on: it stands in for the messages up to
``covers_through_id``, so it is the active branch's only while that message is on the
active path (a summary of one branch never stands in for messages of another).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from typing import Any

from iris_desktop.core.store.base import Connected, _same_process, own_process
from iris_desktop.core.store.rows import SummaryRow, _json, _summary, _summary_from

#: whether a row's ``head_id`` is on its thread's active path (``{table}``: its alias)
_HEAD_ON_PATH = ("EXISTS (SELECT 1 FROM thread_paths p WHERE p.thread_id = {table}.thread_id "
                 "AND p.message_id = {table}.head_id)")
#: summaries whose last covered message is on the active branch: ``s`` is summaries
_ON_PATH = ("summaries s JOIN thread_paths p ON p.thread_id = s.thread_id "
            "AND p.message_id = s.covers_through_id")

log = logging.getLogger("iris.store")

#: leases this process is done with but could not delete (the disk was full, or another
#: process held the write lock): by (database file, table), {thread id: token}. They hold
#: nothing against this process (:meth:`Summaries._holder`), and its next take of a lease
#: in that file deletes them (before, the row stayed, and this process's own next turn
#: in the chat was refused as "answering in another Iris window", for TURN_LEASE_S)
_LEFT_BEHIND: dict[tuple[str, str], dict[int, str]] = {}
_LEFT_LOCK = threading.Lock()


class Summaries(Connected):
    """The thread's records beside its messages: summaries, who compacts it and how that
    went, and each request sent to the model."""

    def latest_summary(self, thread_id: int) -> SummaryRow | None:
        """The active branch's summary (None: nothing of it is summarized): of those on
        its path, the one that reaches furthest along it. A message's id is above its
        parent's, so that is the one covering the highest id; the newest of them only
        breaks a tie. (The newest alone was wrong: a summary made on another branch, of
        the part both share, hid this branch's own, longer one when switching back.)"""
        row = self.conn.execute(
            f"SELECT s.* FROM {_ON_PATH} WHERE s.thread_id = ? "
            "ORDER BY s.covers_through_id DESC, s.id DESC LIMIT 1", (thread_id,))
        return _summary(row)

    def summaries(self, thread_id: int) -> list[SummaryRow]:
        """The active branch's summary chain, oldest first: :meth:`latest_summary` and
        the summaries it was chained from (another branch's summary of the shared part,
        on the path too, is not in it)."""
        cur = self.conn.execute(
            f"SELECT s.* FROM {_ON_PATH} WHERE s.thread_id = ? "
            "ORDER BY s.covers_through_id DESC, s.id DESC", (thread_id,))
        cols = [d[0] for d in cur.description]
        rows = [_summary_from(dict(zip(cols, r))) for r in cur.fetchall()]
        by_id = {row.id: row for row in rows}
        chain: list[SummaryRow] = []
        row = rows[0] if rows else None
        while row is not None and len(chain) < len(rows):
            chain.append(row)
            row = by_id.get(row.prev_id) if row.prev_id is not None else None
        return chain[::-1]

    def add_summary(self, thread_id: int, summary: dict[str, Any]) -> int:
        cur = self.conn.execute(
            """
            INSERT INTO summaries(thread_id, prev_id, first_message_id, covers_through_id,
                                  first_turn, last_turn, fields, text, tokens, counter, path,
                                  created_at)
            VALUES (:thread_id, :prev_id, :first_message_id, :covers_through_id, :first_turn,
                    :last_turn, :fields, :text, :tokens, :counter, :path, :created_at)
            """,
            {
                **summary,
                "thread_id": thread_id,
                "fields": json.dumps(summary["fields"], ensure_ascii=False),
                "created_at": time.time(),
            },
        )
        return int(cur.lastrowid)

    # -- who compacts a thread --

    def take_compaction_lease(self, thread_id: int, token: str, seconds: float) -> dict[str, Any] | None:
        """Take the thread's compaction lease for ``seconds`` (atomically). Returns None
        when it is ours now, else the holder's row (``pid``, ``acquired_at``). A lease
        whose time is up, or whose process is gone, is taken over."""
        return self._take_lease("compaction_leases", thread_id, token, seconds)

    def release_compaction_lease(self, thread_id: int, token: str) -> None:
        self._release_lease("compaction_leases", thread_id, token)

    # -- who answers in a thread: one turn at a time, across processes --

    def take_turn_lease(self, thread_id: int, token: str, seconds: float) -> dict[str, Any] | None:
        """Take (or renew) the thread's turn lease for ``seconds``, as
        :meth:`take_compaction_lease`: None when it is ours, else the holder's row."""
        return self._take_lease("turn_leases", thread_id, token, seconds)

    def turn_holder(self, thread_id: int) -> dict[str, Any] | None:
        """Who is answering in the thread now (``pid``, ``acquired_at``), or None: a look,
        nothing taken (a command says so before it loads a model)."""
        return self._holder("turn_leases", thread_id)[0]

    def release_turn_lease(self, thread_id: int, token: str) -> None:
        self._release_lease("turn_leases", thread_id, token)

    def _take_lease(self, table: str, thread_id: int, token: str, seconds: float
                    ) -> dict[str, Any] | None:
        now = time.time()
        left = self._left_behind(table)
        with self.transaction():
            # (this process's leases a full disk kept: gone with this write, or kept with it)
            self.conn.executemany(f"DELETE FROM {table} WHERE thread_id = ? AND token = ?",
                                  list(left.items()))
            holder, acquired = self._holder(table, thread_id, token)
            if holder is None:
                self.conn.execute(
                    f"INSERT OR REPLACE INTO {table}(thread_id, token, pid, pid_start, "
                    "acquired_at, expires_at) VALUES (?, ?, ?, ?, ?, ?)",
                    (thread_id, token, *own_process(), acquired or now, now + seconds))
        if left:
            self._left_behind(table, forget=left)
        return holder

    def _holder(self, table: str, thread_id: int, token: str | None = None
                ) -> tuple[dict[str, Any] | None, float | None]:
        """(another's live lease on the thread: ``pid``, ``acquired_at``, ``expires_at``,
        or None; when ``token``'s own, when it was taken). A lease whose time is up, or
        whose pid now names another process (reused), holds nothing; nor does one this
        process is done with but could not delete (a full disk refused its release)."""
        row = self.conn.execute(f"SELECT token, pid, acquired_at, expires_at, pid_start FROM {table} "
                                "WHERE thread_id = ?", (thread_id,)).fetchone()
        if row is None:
            return None, None
        if row[0] == token:
            return None, row[2]
        if row[0] == self._left_behind(table).get(thread_id):
            return None, None
        if row[3] > time.time() and _same_process(row[1], row[4]):
            return {"pid": row[1], "acquired_at": row[2], "expires_at": row[3]}, None
        return None, None

    def _release_lease(self, table: str, thread_id: int, token: str) -> None:
        """Delete the lease ``token`` took. Never raises for the database (before, a full
        disk just after a reply was saved failed that turn, after its TurnDone): a lease
        the database refuses to delete is remembered, holds nothing against this process,
        and goes at its next take of a lease, in any chat; another process finds it free
        once this one ends, or when its time is up."""
        try:
            with self.transaction():
                self.conn.execute(f"DELETE FROM {table} WHERE thread_id = ? AND token = ?",
                                  (thread_id, token))
        except sqlite3.Error as exc:
            log.warning("the %s of thread %s was not released (%s); this process takes it "
                        "over at its next turn or compaction", table[:-1].replace("_", " "),
                        thread_id, exc)
            with _LEFT_LOCK:
                _LEFT_BEHIND.setdefault(self._lease_file(table), {})[thread_id] = token

    def _left_behind(self, table: str, forget: dict[int, str] | None = None) -> dict[int, str]:
        """This process's leases in ``table`` of this file that a release could not
        delete, {thread id: token} (a copy); ``forget``: those deleted now."""
        if not _LEFT_BEHIND:
            return {}  # (as nearly always: no file name made for every look)
        key = self._lease_file(table)
        with _LEFT_LOCK:
            left = _LEFT_BEHIND.get(key, {})
            for thread_id, token in (forget or {}).items():
                if left.get(thread_id) == token:
                    del left[thread_id]
            if not left:
                _LEFT_BEHIND.pop(key, None)
            return dict(left)

    def _lease_file(self, table: str) -> tuple[str, str]:
        return os.path.realpath(self.path), table

    def add_compaction_event(self, thread_id: int, event: dict[str, Any]) -> int:
        """Record a compaction of the branch ending at ``event["head_id"]`` (default: the
        thread's active branch now)."""
        row = {"thread_id": thread_id, "created_at": time.time(), **event}
        head = row.pop("head_id", None)
        cols, marks = ", ".join(row), ", ".join(f":{c}" for c in row)
        head_sql = ":head_id" if head is not None else \
            "(SELECT head_id FROM threads WHERE id = :thread_id)"
        return int(self.conn.execute(
            f"INSERT INTO compaction_events({cols}, head_id) VALUES ({marks}, {head_sql})",
            {**row, "head_id": head}).lastrowid)

    def compaction_events(self, thread_id: int, branch: bool = False) -> list[dict[str, Any]]:
        """The thread's compactions, oldest first; ``branch``: those of the active branch
        only (what its inspector, chart and reasons describe: a compaction that failed on
        another branch is not why this one's turns are dropped). One belongs to the branch
        when it ran there (its head is on the path) or made a summary of the branch's chain;
        one recorded before heads were kept, and making no summary, is shown everywhere."""
        where = ""
        if branch:
            chain = ", ".join(str(int(s.id)) for s in self.summaries(thread_id))
            where = (f" AND ({_HEAD_ON_PATH.format(table='e')} OR e.summary_id IN ({chain})"
                     " OR (e.head_id IS NULL AND e.summary_id IS NULL))")
        return list(self.db.query(
            f"SELECT e.* FROM compaction_events e WHERE e.thread_id = ?{where} ORDER BY e.id",
            [thread_id]))

    def add_request(self, thread_id: int, request: dict[str, Any]) -> int:
        row = {"thread_id": thread_id, "created_at": time.time(), **request}
        cols = ", ".join(row)
        marks = ", ".join(f":{c}" for c in row)
        cur = self.conn.execute(f"INSERT INTO requests({cols}) VALUES ({marks})", row)
        return int(cur.lastrowid)

    def requests(self, thread_id: int, branch: bool = False) -> list[dict[str, Any]]:
        """The requests sent for the thread, oldest first; ``branch``: those sent on the
        active branch only (their head on its path; one recorded before heads were kept
        counts everywhere)."""
        where = f" AND (r.head_id IS NULL OR {_HEAD_ON_PATH.format(table='r')})" if branch else ""
        return list(self.db.query(
            f"SELECT r.* FROM requests r WHERE r.thread_id = ?{where} ORDER BY r.id", [thread_id]))

    def finish_reason_of(self, reply_id: int) -> str | None:
        """How the request that wrote reply ``reply_id`` ended (stop, length, cancelled,
        error), or None when none is recorded."""
        row = self.conn.execute("SELECT finish_reason FROM requests WHERE reply_id = ? "
                                "ORDER BY id DESC LIMIT 1", (reply_id,)).fetchone()
        return None if row is None else row[0]

    def cut_off_replies(self, thread_id: int) -> dict[int, str]:
        """The thread's replies whose request (the latest that wrote each) was cut off, by
        id, with its finish reason: "length" (the token cap) or "content_filter" (a
        server's content filter stopped it; its reply is stored as written, complete):
        what an export marks cut off. Before, the content filter's went unsaid."""
        return {row[0]: row[1] for row in self.conn.execute(
            "SELECT r.reply_id, r.finish_reason FROM requests r WHERE r.thread_id = ? "
            "AND r.finish_reason IN ('length', 'content_filter') "
            "AND r.id = (SELECT max(q.id) FROM requests q WHERE q.reply_id = r.reply_id)",
            (thread_id,))}

    def filtered_replies(self, reply_ids: Sequence[int]) -> set[int]:
        """Those of ``reply_ids`` whose request (the latest that wrote each) a server's
        content filter ended (finish reason "content_filter"): read by the requests'
        index of replies, so a page of the transcript costs its own rows, not the chat's."""
        return {row[0] for row in self.conn.execute(
            "SELECT r.reply_id FROM requests r INDEXED BY requests_reply "
            "WHERE r.reply_id IN (SELECT value FROM json_each(?)) "
            "AND r.finish_reason = 'content_filter' "
            "AND r.id = (SELECT max(q.id) FROM requests q WHERE q.reply_id = r.reply_id)",
            (json.dumps(list(reply_ids)),))}

    def stopped_reply(self, thread_id: int) -> int | None:
        """The active branch's last message when it is a reply that can be continued: an
        assistant message with text and no tool calls that was stopped, failed, or cut off
        at its token cap (finish reason "length": its request's, or for an imported reply,
        which has none, the ``"finish_reason"`` its export gave); None for a reply that
        ended on its own, or anything else. Raises KeyError for a thread that does not exist."""
        head = self.head(thread_id)
        row = self.conn.execute("SELECT role, content, tool_calls, status, extra FROM messages "
                                "WHERE id = ?", (head,)).fetchone() if head is not None else None
        if row is None or row[0] != "assistant" or row[2] or not row[1]:
            return None
        said = _json(row[4], {})  # an imported message's keys beyond the columns
        reason = self.finish_reason_of(head) or (said.get("finish_reason")
                                                 if isinstance(said, dict) else None)
        stopped = row[3] in ("interrupted", "error") or reason == "length"
        return head if stopped else None

    def last_request(self, thread_id: int, since_summary: int | None) -> dict[str, Any] | None:
        """The newest completed request of the active branch made with the current summary
        in place (a request made before branches existed counts as on it)."""
        rows = list(
            self.db.query(
                """
                SELECT * FROM requests r WHERE r.thread_id = ? AND r.prompt_tokens IS NOT NULL
                AND coalesce(r.summary_id, 0) = ?
                AND (r.head_id IS NULL OR EXISTS (SELECT 1 FROM thread_paths p
                     WHERE p.thread_id = r.thread_id AND p.message_id = r.head_id))
                ORDER BY r.id DESC LIMIT 1
                """,
                [thread_id, since_summary or 0],
            )
        )
        return rows[0] if rows else None
