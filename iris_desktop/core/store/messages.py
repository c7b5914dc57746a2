"""Threads and their messages: appending, reading back, and what the engine reads.

Messages are append-only. Pruning and compaction never modify or delete them; a summary
only records which messages it covers. The one exception is a reply that is still being
streamed: its row is updated with the partial text until it is complete, and a
``streams`` row names the process writing it, so that a crash can be told from a live
writer. A thread is deleted, with its messages, only on the user's explicit request.

A thread is a tree (:mod:`.branches`): a new message goes below the thread's head
unless it names another parent, and every read here but :meth:`Messages.all_messages`
sees the active branch only.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from iris_desktop.core.store.base import _alive, own_process
from iris_desktop.core.store.branches import Branches
from iris_desktop.core.store.errors import StoreError, ThreadGone, cache_not_written
from iris_desktop.core.store.rows import (
    ROLES,
    MessageMeta,
    _message_row,
    damaged_text_seen,
    now_iso,
    stored_content_text,
    utf8_length,
    valid_utf8,
)
from iris_desktop.tokens import Message

log = logging.getLogger("iris.store")


def wipe_mark(db: os.PathLike[str] | str) -> Path:
    """The empty file beside the history that says a deleted chat's old pages may still be
    in it (a checkpoint held back): the next open or delete checkpoints, then removes it."""
    return Path(f"{os.fspath(db)}-wipe")


def held_back(db: os.PathLike[str] | str) -> str:
    """Why a deleted chat's text is still in the file (``delete_thread`` returned False),
    as the end of a sentence that says it was deleted."""
    return (f"its text stays readable in {Path(db).name} until another program reading the "
            "history lets go of it (an Iris window or command, or another app); the next "
            "command or start of Iris overwrites it then")


#: ``parent_id`` of a new message: below the thread's head (the active branch goes on)
HEAD = object()
#: a chat's title at most (longer ones are clipped with "…"); a title is one line
MAX_TITLE_CHARS = 200
T = TypeVar("T")

#: replies still 'streaming' in a database that this process knows are not being written
#: (left by a process that is gone, or by a turn of this one whose last save failed) but
#: could not mark so, the disk being full or the file read-only: by database file, the id
#: and the status to read them as until a later write marks them (``Messages.end_streams``)
_UNWRITTEN: dict[str, dict[int, str]] = {}
#: held while :data:`_UNWRITTEN` is read and changed (the model thread and the window's
#: poll may end streams at once: neither may drop the other's ids)
_UNWRITTEN_LOCK = threading.Lock()


def _unwritten_key(path: str | os.PathLike[str]) -> str:
    return os.path.abspath(os.fspath(path))


def unwritten_ends(path: str | os.PathLike[str]) -> dict[int, str]:
    """The replies of the database ``path`` read as ended though their rows still say
    'streaming' (id → status), waiting for a write to mark them; {} when none."""
    with _UNWRITTEN_LOCK:
        return dict(_UNWRITTEN.get(_unwritten_key(path), {}))


def _forget_unwritten(key: str, ids: Mapping[int, str]) -> None:
    """``ids`` are marked (or no longer 'streaming'): not read as ended from memory any
    more; what another thread added meanwhile stays."""
    with _UNWRITTEN_LOCK:
        left = _UNWRITTEN.get(key, {})
        for message_id in ids:
            left.pop(message_id, None)
        if not left:
            _UNWRITTEN.pop(key, None)


def one_line_title(title: str) -> str:
    """``title`` as a chat list's row shows it: one line (any run of spaces, tabs and line
    breaks one space), at most :data:`MAX_TITLE_CHARS` characters; "" if nothing is left."""
    title = " ".join(title.split())
    if len(title) > MAX_TITLE_CHARS:  # (an export's title may be any length: 60,000 characters)
        title = title[: MAX_TITLE_CHARS - 1].rstrip() + "…"
    return title


def next_id(table: str) -> str:
    """SQL for the id a new row of ``table`` (threads, messages) takes: one above the
    highest it has ever had, deleted rows' included (schema 16's ``id_marks``), so that
    a deleted chat's id or its messages' is never another's. Read in the INSERT itself,
    under its write lock, so two processes never take the same one."""
    return (f"(SELECT max(coalesce((SELECT max(id) FROM {table}), 0), coalesce("
            f"(SELECT high FROM id_marks WHERE name = '{table}'), 0)) + 1)")


_NEW_THREAD_ID, _NEW_MESSAGE_ID = next_id("threads"), next_id("messages")

#: the active branch's messages, joined: ``p`` is thread_paths, ``m`` messages
_PATH = "thread_paths p JOIN messages m ON m.id = p.message_id"
#: a message's text columns, as the bytes stored (to tell damage from a real U+FFFD)
_RAW_TEXT = ", ".join(f"CAST({c} AS BLOB)" for c in (
    "role", "content", "tool_calls", "tool_call_id", "name", "extra", "status", "sent_at"))


class Messages(Branches):
    """Threads and messages: the part of the Store every turn reads and appends to."""

    # -- threads ----------------------------------------------------------------------------

    def create_thread(self, title: str = "New chat") -> int:
        now = time.time()
        cur = self.conn.execute(
            f"INSERT INTO threads(id, title, created_at, updated_at) VALUES ({_NEW_THREAD_ID}, ?, ?, ?)",
            (one_line_title(title) or "New chat", now, now),
        )
        return int(cur.lastrowid)

    def date_thread(self, thread_id: int, created: float, updated: float) -> None:
        """When an imported chat began and was last written to, as its source says (the
        chat list is ordered by the second)."""
        self.conn.execute("UPDATE threads SET created_at = ?, updated_at = ? WHERE id = ?",
                          (created, updated, thread_id))

    def thread(self, thread_id: int) -> dict[str, Any]:
        row = list(self.db.query("SELECT * FROM threads WHERE id = ?", [thread_id]))
        if not row:
            raise ThreadGone(thread_id)
        return row[0]

    def draft(self, thread_id: int | None) -> str:
        """The unsent text kept for a chat (None: a new chat, not begun); "" when none."""
        return self.draft_with_files(thread_id)[0]

    def draft_with_files(self, thread_id: int | None) -> tuple[str, list[tuple[str, str]]]:
        """The unsent text kept for a chat and the files attached to it, (name, text)
        each; a record that is not what :meth:`save_draft` writes gives no files."""
        row = self.conn.execute("SELECT text, files FROM drafts WHERE key = ?",
                                (thread_id or 0,)).fetchone()
        if not row:
            return "", []
        return row[0], _draft_files(row[1])

    def save_draft(self, thread_id: int | None, text: str,
                   files: Sequence[tuple[str, str]] | None = None) -> None:
        """Keep ``text`` as the chat's draft, and ``files`` (name, text each) as the files
        attached to it (None: those kept already stay). A draft of blank text and no files
        is none; a chat deleted meanwhile keeps none."""
        key = thread_id or 0
        with self.transaction():
            if thread_id is not None and not self.conn.execute(
                    "SELECT 1 FROM threads WHERE id = ?", (thread_id,)).fetchone():
                self.conn.execute("DELETE FROM drafts WHERE key = ?", (key,))
                return
            stored = None if files is None else (
                json.dumps([{"name": name, "text": body} for name, body in files],
                           ensure_ascii=False) if files else None)
            self.conn.execute(
                "INSERT INTO drafts(key, thread_id, text, saved_at, files) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT(key) DO UPDATE SET text = excluded.text, "
                "saved_at = excluded.saved_at" + (", files = excluded.files" if files is not None
                                                  else ""),
                (key, thread_id, text, time.time(), stored))
            if not text.strip():
                self.conn.execute("DELETE FROM drafts WHERE key = ? AND files IS NULL", (key,))

    def message_count(self, thread_id: int) -> int:
        """How many messages the thread stores, every branch (what deleting it removes)."""
        return self.conn.execute("SELECT count(*) FROM messages WHERE thread_id = ?",
                                 (thread_id,)).fetchone()[0]

    def rename_thread(self, thread_id: int, title: str) -> None:
        """Retitle the chat: one line, clipped (:func:`one_line_title`); ValueError for a
        title of nothing but spaces."""
        self.thread(thread_id)
        title = one_line_title(title)
        if not title:
            raise ValueError("a chat's title cannot be empty")
        self.conn.execute("UPDATE threads SET title = ? WHERE id = ?", (title, thread_id))

    def set_system_prompt(self, thread_id: int, text: str | None) -> None:
        """The thread's own system prompt (None or blank: the global ``chat.system_prompt``
        again). It is a setting of the thread, not a message: no message changes."""
        self.thread(thread_id)
        value = text if text and text.strip() else None
        self.conn.execute("UPDATE threads SET system_prompt = ? WHERE id = ?", (value, thread_id))

    def system_prompt_of(self, thread_id: int) -> str | None:
        """The thread's own system prompt, or None (it uses the global one)."""
        row = self.conn.execute("SELECT system_prompt FROM threads WHERE id = ?",
                                (thread_id,)).fetchone()
        return row[0] if row else None

    def delete_thread(self, thread_id: int) -> bool:
        """Delete a whole thread, on the user's explicit request only, and leave no
        readable trace of it in the database files: its messages, summaries, requests,
        compaction events, token counts and vectors go (by cascade) with their bytes
        overwritten (``secure_delete``); the full-text index is rebuilt without its words
        (an FTS5 index keeps deleted terms in old segments until they are merged); the
        WAL, which holds copies of its pages, is checkpointed into the file and
        truncated. Raises KeyError for an unknown thread. False when that checkpoint
        could not complete (another connection is reading the history: its snapshot keeps
        the chat's old pages in the file): the chat is deleted, its text stays readable
        in the file until the next open here or delete checkpoints (``wipe_left``)."""
        self.thread(thread_id)
        free = self.conn.execute("PRAGMA freelist_count").fetchone()[0]
        with self.transaction():
            # the parent links first: a cascade along them is one trigger level per
            # message, and SQLite stops at 1,000 ("too many levels of trigger recursion")
            self.conn.execute("UPDATE messages SET parent_id = NULL WHERE thread_id = ? "
                              "AND parent_id IS NOT NULL", (thread_id,))
            self.conn.execute("DELETE FROM threads WHERE id = ?", (thread_id,))
            self.conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('optimize')")
        self._speakers = None
        try:  # cleared by the checkpoint that overwrites the old pages (made before it:
            wipe_mark(self.path).touch(mode=0o600)  # a full disk may refuse it, or a kill
        except OSError as exc:  # stop it)
            log.warning("cannot mark %s to be checkpointed at the next open: %s", self.path, exc)
        self.reclaim(self.conn.execute("PRAGMA freelist_count").fetchone()[0] - free)
        return self.checkpoint()

    def reclaim(self, freed: int) -> bool:
        """Give the free pages of the file back to the disk (a deleted chat's space stayed
        in the file: 20,000 messages kept 18 MB); ``freed``: the pages the delete just
        made free. A file made by this Iris does it at once (``auto_vacuum =
        INCREMENTAL``); an older one is rewritten once (``VACUUM``, which also makes it
        incremental) when the delete freed a quarter of it or more, or half of it is free,
        so a small delete in a large history does not rewrite it all. False when it was not done (a full disk,
        another process writing, a transaction open here): the space stays in the file,
        nothing of the history changes. The file shrinks at the next checkpoint."""
        if self.conn.in_transaction:  # executescript would commit it
            return False
        mode, pages, free = (self.conn.execute(f"PRAGMA {name}").fetchone()[0]
                             for name in ("auto_vacuum", "page_count", "freelist_count"))
        try:
            if mode == 2:
                # stepped to its end by executescript: execute() frees one page only
                self.conn.executescript("PRAGMA incremental_vacuum;")
            # (or half the file free, whoever freed it: a rewrite killed, or one a full
            # disk refused, is done by a later delete; before, never)
            elif (freed > 0 and freed * 4 >= pages) or (freed > 0 and free * 2 >= pages):
                self.conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
                self.conn.execute("VACUUM")
        except sqlite3.Error as exc:
            log.warning("the space of deleted messages stays in %s: %s", self.path, exc)
            return False
        return True

    def checkpoint(self) -> bool:
        """Copy the WAL into the database file and truncate it to nothing (it waits for
        readers up to the busy timeout). False when another connection kept it busy."""
        busy, _, _ = self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if not busy:  # the pages of every delete before are overwritten in the file now
            wipe_mark(self.path).unlink(missing_ok=True)
        return not busy

    def wipe_left(self) -> bool:
        """At open: overwrite in the file what a delete left readable there (its
        checkpoint was held back by another program reading the history, or refused by a
        full disk: ``wipe_mark``), without waiting for a reader still there (the next
        open tries again). True when nothing is left to overwrite."""
        if not wipe_mark(self.path).exists():
            return True
        wait = self.conn.execute("PRAGMA busy_timeout").fetchone()[0]
        self.conn.execute("PRAGMA busy_timeout = 0")
        try:
            return self.checkpoint()
        except sqlite3.Error as exc:
            log.warning("a deleted chat's pages stay in %s for now: %s", self.path, exc)
            return False
        finally:
            self.conn.execute(f"PRAGMA busy_timeout = {int(wait)}")

    def threads(self) -> list[dict[str, Any]]:
        """Newest first, with message counts (``messages``: every branch's;
        ``branch_messages``: the active branch's), how many replies are being
        written (``streaming``: a window that shows one learns when it is done; a reply
        known to be ended but not yet marked so, :func:`unwritten_ends`, is not; read from
        the partial index of such replies: 0.5 ms for 18,000 messages, 4.8 ms by reading
        each thread's rows) and the newest summary's id (``summary_id``: a compaction by
        another process adds no message, and a window learns of it by this)."""
        return list(
            self.db.query(
                """
                SELECT t.*, (SELECT count(*) FROM messages m WHERE m.thread_id = t.id) AS messages,
                       (SELECT count(*) FROM thread_paths p WHERE p.thread_id = t.id)
                           AS branch_messages,
                       (SELECT count(*) FROM messages m INDEXED BY messages_streaming
                        WHERE m.status = 'streaming' AND m.thread_id = t.id
                          AND m.id NOT IN (SELECT value FROM json_each(:ended))) AS streaming,
                       (SELECT max(s.id) FROM summaries s WHERE s.thread_id = t.id) AS summary_id
                FROM threads t ORDER BY t.updated_at DESC, t.id DESC
                """,
                {"ended": json.dumps(list(unwritten_ends(self.path)))},
            )
        )

    def streaming_ids(self, thread_id: int) -> list[int]:
        """The thread's replies marked as being written (from the partial index of them)."""
        return [r[0] for r in self.conn.execute(
            "SELECT id FROM messages INDEXED BY messages_streaming WHERE status = 'streaming' "
            "AND thread_id = ?", (thread_id,))]

    def newest_thread_id(self, among: Sequence[int] = ()) -> int | None:
        """The chat written to last (the first of :meth:`threads`), or the first of them
        ``among`` those (an import's: the one listed first); None when there is none."""
        if not among:
            row = self.conn.execute("SELECT id FROM threads ORDER BY updated_at DESC, id DESC LIMIT 1").fetchone()
            return row[0] if row else None
        wanted = set(among)
        rows = self.conn.execute("SELECT id FROM threads WHERE id BETWEEN ? AND ? "
                                 "ORDER BY updated_at DESC, id DESC", (min(wanted), max(wanted)))
        return next((row[0] for row in rows if row[0] in wanted), None)

    def data_version(self) -> int:
        """SQLite's ``PRAGMA data_version``: it changes when another connection (another
        thread's Store, the CLI) commits, and not for this connection's own writes. Costs
        no read of the database, so a view may poll it to learn when to refresh."""
        return int(self.conn.execute("PRAGMA data_version").fetchone()[0])

    def thread_token_total(self, thread_id: int, counter: str) -> tuple[int, int]:
        """(sum of cached counts, number of messages without a cached count)."""
        row = self.conn.execute(
            """
            SELECT coalesce(sum(c.tokens), 0), sum(c.tokens IS NULL)
            FROM messages m LEFT JOIN token_counts c ON c.message_id = m.id AND c.counter = ?
            WHERE m.thread_id = ?
            """,
            (counter, thread_id),
        ).fetchone()
        return int(row[0]), int(row[1] or 0)

    def uncounted(self, counter: str, max_chars: int) -> list[MessageMeta]:
        """Messages of any thread without a cached count under ``counter`` whose text
        (content and tool calls) adds up to at most ``max_chars``, stopping at the first
        that does not fit; one larger than ``max_chars`` alone is left for a request to
        count. The threads with the least text to count first, each newest first: a small
        chat is counted at the first listing (a long one, newest, took every listing's
        share, and a two-message chat read "≈0 tokens" for hundreds of listings). Bounds
        what a listing spends on counting."""
        cur = self.conn.execute(
            """
            SELECT id, turn, role, calls, tool_call_id, status, name, chars FROM (
                SELECT m.id, m.turn, m.role, m.tool_calls IS NOT NULL AS calls, m.tool_call_id,
                       m.status, m.name,
                       coalesce(length(m.content), 0) + coalesce(length(m.tool_calls), 0) AS chars,
                       m.thread_id
                FROM messages m LEFT JOIN token_counts c ON c.message_id = m.id AND c.counter = ?
                WHERE c.tokens IS NULL)
            ORDER BY sum(chars) OVER (PARTITION BY thread_id), thread_id, id DESC
            """,
            (counter,),
        )
        chosen: list[MessageMeta] = []
        left = max_chars
        for mid, turn, role, calls, call_id, status, name, chars in cur:
            if chars > max_chars:
                continue
            if chars > left:
                break
            left -= chars
            chosen.append(MessageMeta(mid, turn, role, None, bool(calls), call_id, status, name))
        return chosen

    def thread_state(self, thread_id: int) -> tuple:
        """What a request of the thread depends on, cheaply: the head of its active branch
        (and how far a streaming one got), the newest summary of that branch, the newest
        recorded request, the thread's own system prompt, and which chat it is (when it was
        made: a chat deleted and another given its id, as an older Iris did, is not the same,
        and a request cached for one is never the other's)."""
        return self.conn.execute(
            """
            SELECT m.id, m.status, length(m.content), m.tool_calls IS NOT NULL,
                   (SELECT s.id FROM summaries s JOIN thread_paths p
                      ON p.thread_id = s.thread_id AND p.message_id = s.covers_through_id
                    WHERE s.thread_id = :t ORDER BY s.covers_through_id DESC, s.id DESC
                    LIMIT 1),
                   (SELECT max(id) FROM requests WHERE thread_id = :t),
                   (SELECT system_prompt FROM threads WHERE id = :t),
                   (SELECT created_at FROM threads WHERE id = :t)
            FROM (SELECT 1) LEFT JOIN messages m ON m.id =
                (SELECT head_id FROM threads WHERE id = :t)
            """,
            {"t": thread_id},
        ).fetchone()

    # -- damage -----------------------------------------------------------------------------

    @property
    def damaged(self) -> dict[int, str]:
        """Messages this Store found damaged on disk while reading them (a flipped byte):
        id → what is wrong, in words for the user. They are still returned: the bytes
        that are not text read as U+FFFD, and a damaged role is taken from the index
        that keeps it."""
        found = self.__dict__.get("_damaged")
        if found is None:
            found = self.__dict__["_damaged"] = {}
        return found

    def _query(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        """The rows of a query on messages; rows whose stored text is damaged are named
        in :attr:`damaged` (checked only when the query met bytes that are not text). A
        reply known to be ended whose row could not be marked yet (:func:`unwritten_ends`)
        reads with the status it ended with."""
        seen = damaged_text_seen()
        rows = list(self.db.query(sql, params))
        ended = _UNWRITTEN.get(_unwritten_key(self.path))
        if ended:  # rows still 'streaming' that are known to be ended are read as ended
            for row in rows:
                if row.get("status") == "streaming" and row.get("id") in ended:
                    row["status"] = ended[row["id"]]
        if damaged_text_seen() != seen:
            for row in rows:
                if any(isinstance(v, str) and "\ufffd" in v for v in row.values()):
                    self._check_damage(row)
        return rows

    def _check_damage(self, row: dict[str, Any]) -> None:
        raw = self.conn.execute(f"SELECT {_RAW_TEXT} FROM messages WHERE id = ?",
                                (row["id"],)).fetchone()
        if raw is None or all(valid_utf8(v) for v in raw):
            return  # a real U+FFFD, written as such
        self.damaged[row["id"]] = "part of its stored text is damaged (shown as \ufffd)"
        if row.get("role") not in ROLES:  # the index on (thread, role, id) keeps it too
            kept = self.conn.execute(
                "SELECT role FROM messages INDEXED BY messages_thread_turn "
                "WHERE thread_id = ? AND id = ?", (row.get("thread_id"), row["id"])).fetchone()
            row["role"] = kept[0] if kept and kept[0] in ROLES else "assistant"

    # -- messages ---------------------------------------------------------------------------

    def add_message(self, thread_id: int, message: Message, status: str = "complete",
                    parent_id: Any = HEAD, sent: str | None = None) -> int:
        """Append one message (written now, unless it carries its own timestamp) and
        commit it; it becomes the head of the active branch. ``parent_id``: below the head
        (the default), or below another message (a regenerated reply, an edited user
        message: a new branch; None: a new first message). ``sent``: the text the user
        sent, whose draft (the chat's, or New chat's for a chat's first message) goes in
        the same transaction (an audit: killed just after Enter, the window came back with
        the stored question in the box, to be sent twice). Returns its id."""
        row = _message_row(message, now_iso())
        with self.transaction():
            if sent is not None and sent.strip(" \t\n\r"):
                first = not self.conn.execute("SELECT 1 FROM messages WHERE thread_id = ?",
                                              (thread_id,)).fetchone()
                self.conn.execute("DELETE FROM drafts WHERE key IN (?, ?) AND "
                                  "trim(text, char(32, 9, 10, 13)) = ?",
                                  (thread_id, 0 if first else thread_id, sent.strip(" \t\n\r")))
            return self._insert(thread_id, row, status, parent_id)

    def add_messages(self, thread_id: int, messages: Sequence[Message],
                     parent_id: Any = HEAD) -> list[int]:
        """Append many messages atomically: all or none, each below the one before (the
        first below ``parent_id``: the head by default). An imported message keeps the
        time its source gives (``created_at``, ``create_time`` or ``timestamp``); without
        one, when it was written is unknown (``sent_at`` NULL), not the import time. A
        message an export marked ``"status": "interrupted"`` (a stopped reply) stays so,
        and a reply it marked ``"status": "error"`` (a failed one) stays failed: either
        can be continued (before, a failed reply imported again looked finished)."""
        rows = [(_message_row(m, None), _imported_status(m)) for m in messages]
        with self.transaction():
            ids = []
            for row, status in rows:
                ids.append(self._insert(thread_id, row, status, parent_id if not ids else HEAD))
            return ids

    def _insert(self, thread_id: int, row: dict[str, Any], status: str, parent_id: Any = HEAD) -> int:
        message_id = self._insert_row(thread_id, row, status, parent_id)
        if status == "streaming":
            self.conn.execute(
                "INSERT INTO streams(message_id, pid, pid_start, started_at) VALUES (?, ?, ?, ?)",
                (message_id, *own_process(), time.time()),
            )
        return message_id

    def _insert_row(self, thread_id: int, row: dict[str, Any], status: str,
                    parent_id: Any = HEAD) -> int:
        head = self.head(thread_id)
        parent = head if parent_id is HEAD else parent_id
        above = None if parent is None else self.conn.execute(
            "SELECT turn FROM messages WHERE id = ? AND thread_id = ?", (parent, thread_id)).fetchone()
        if parent is not None and above is None:
            raise KeyError(f"no message {parent} in thread {thread_id}")
        # a turn starts at each user message: the parent's turn, or the next one
        turn = (above[0] if above else 0) + (1 if row["role"] == "user" else 0)
        now = time.time()
        cur = self.conn.execute(
            f"""
            INSERT INTO messages(id, thread_id, turn, role, content, content_is_json, tool_calls,
                                 tool_call_id, name, extra, status, created_at, sent_at, parent_id)
            VALUES ({_NEW_MESSAGE_ID}, :thread_id, :turn, :role, :content, :content_is_json,
                    :tool_calls, :tool_call_id, :name, :extra, :status, :created_at, :sent_at, :parent_id)
            """,
            {**row, "thread_id": thread_id, "turn": turn, "status": status, "created_at": now,
             "parent_id": parent},
        )
        message_id = int(cur.lastrowid)
        if parent == head:  # the active branch goes on: one more message on its path
            self.conn.execute("INSERT INTO thread_paths(thread_id, message_id) VALUES (?, ?)",
                              (thread_id, message_id))
            self.conn.execute("UPDATE threads SET head_id = ?, updated_at = ? WHERE id = ?",
                              (message_id, now, thread_id))
        else:
            self.set_head(thread_id, message_id)
            self.conn.execute("UPDATE threads SET updated_at = ? WHERE id = ?", (now, thread_id))
        return message_id

    def update_streaming(
        self, message_id: int, content: str, status: str = "streaming",
        tool_calls: list[dict] | None = None,
    ) -> None:
        """Save a reply that is still being generated (or finish it). Only such rows change.
        Text UTF-8 cannot hold (a lone surrogate a server sent) is saved with U+FFFD in its
        place: the save never fails on it (it did, and the reply shown was lost)."""
        calls = _storable_json(tool_calls) if tool_calls else None
        cur = self.conn.execute(
            """
            UPDATE messages SET content = ?, status = ?, tool_calls = ?
            WHERE id = ? AND status = 'streaming'
            """,
            (_storable(content), status, calls, message_id),
        )
        if cur.rowcount != 1:
            raise StoreError(f"message {message_id} is not a reply in progress")
        if status != "streaming":
            self.conn.execute("DELETE FROM streams WHERE message_id = ?", (message_id,))

    def mark_interrupted_streams(self, running: bool = False) -> list[int]:
        """At start-up: replies left 'streaming' by a process that is gone (a crash, a
        kill -9) become 'interrupted'; their ids. Replies a live process is writing are
        left alone. ``running``: asked by this process while it runs (a window's poll), so
        its own replies are being written, not left by an earlier process of its pid.
        Where the disk is full or the file read-only, their rows stay as they are, this
        process reads them as interrupted, and a later call marks them
        (:meth:`end_streams`); their ids are returned all the same (before, the error
        failed every start: not even an export to another disk could run)."""
        rows = self.conn.execute(
            """
            SELECT m.id, s.pid, s.pid_start FROM messages m LEFT JOIN streams s ON s.message_id = m.id
            WHERE m.status = 'streaming'
            """
        ).fetchall()
        dead = [mid for mid, pid, started in rows if (pid is None or not _alive(pid, started))
                and not (running and (pid, started) == own_process())]
        if not dead:
            return []  # no write, so a start never waits for another process's write lock
        self.end_streams(dict.fromkeys(dead, "interrupted"))
        return dead

    def end_streams(self, ended: Mapping[int, str]) -> bool:
        """Replies whose writer is done with them (gone, or its turn failed before the
        last save) that are still 'streaming' end with their status in ``ended`` (id →
        "interrupted" or "error"), their text as last saved: a status-only update, small
        enough for the WAL's own space when the disk is full (:meth:`_small_write`).
        Where even that fails on a full disk or a read-only file, it is logged, not
        raised: this process reads them as ended (:func:`unwritten_ends`), and its next
        call (any ``ended``, {} too) marks them with its own. True when marked (or none
        was left to mark); other errors raise."""
        key = _unwritten_key(self.path)
        with _UNWRITTEN_LOCK:
            wanted = merged = {**_UNWRITTEN.get(key, {}), **ended}
        if wanted:  # (those saved meanwhile need no write: no lock taken for nothing)
            marks = ",".join("?" * len(wanted))
            still = {mid for (mid,) in self.conn.execute(
                f"SELECT id FROM messages WHERE status = 'streaming' AND id IN ({marks})",
                list(wanted))}
            wanted = {mid: status for mid, status in wanted.items() if mid in still}
        if not wanted:
            _forget_unwritten(key, merged)
            return True
        try:
            self._small_write(lambda: self._end_streams(wanted))
        except sqlite3.Error as exc:  # (inside a caller's transaction: theirs to handle)
            why = None if self.conn.in_transaction else cache_not_written(exc, self.path)
            if why is None:
                raise
            log.warning("%s: %d reply(ies) no longer being written stay marked as being "
                        "written until a later write; read as ended meanwhile", why, len(wanted))
            with _UNWRITTEN_LOCK:
                _UNWRITTEN.setdefault(key, {}).update(wanted)
            return False
        _forget_unwritten(key, wanted)
        return True

    def _small_write(self, write: Callable[[], T]) -> T:
        """``write()``, and where the disk is full, once more after a checkpoint: one that
        copies the whole WAL into the file (pages the file has already: no new space)
        lets the next write reuse the WAL's own space, so a small write (a status, a
        row deleted) usually succeeds with no byte free."""
        try:
            return write()
        except sqlite3.Error as exc:
            if self.conn.in_transaction or cache_not_written(exc, self.path) is None:
                raise
            try:
                self.conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            except sqlite3.Error:
                raise exc from None
            return write()

    def _end_streams(self, ended: Mapping[int, str]) -> None:
        with self.transaction():
            for mid, status in ended.items():
                self.conn.execute("UPDATE messages SET status = ? WHERE id = ? AND "
                                  "status = 'streaming'", (status, mid))
                self.conn.execute("DELETE FROM streams WHERE message_id = ?", (mid,))

    def drop_empty_thread(self, thread_id: int) -> bool:
        """Delete a chat that holds no message (made for a message that could not be
        stored: a full disk); a chat with messages is left alone. True when it went."""
        def drop() -> int:
            with self.transaction():
                return self.conn.execute(
                    "DELETE FROM threads WHERE id = ? AND NOT EXISTS (SELECT 1 FROM messages m "
                    "WHERE m.thread_id = ?)", (thread_id, thread_id)).rowcount

        dropped = self._small_write(drop)
        self._speakers = None
        return dropped == 1

    def chats_of(self, message_ids: Sequence[int]) -> list[tuple[int, str]]:
        """(thread id, title) of the chats ``message_ids`` are in, each once, in order."""
        chats: dict[int, str] = {}
        for message_id in message_ids:
            row = self.conn.execute(
                "SELECT t.id, t.title FROM messages m JOIN threads t ON t.id = m.thread_id "
                "WHERE m.id = ?", (message_id,)).fetchone()
            if row is not None:
                chats.setdefault(row[0], row[1])
        return list(chats.items())

    def messages(
        self, thread_id: int, after_id: int = 0, through_id: int | None = None
    ) -> list[dict[str, Any]]:
        """The active branch's stored rows, oldest first (with id, turn, status)."""
        sql = f"SELECT m.* FROM {_PATH} WHERE p.thread_id = ? AND p.message_id > ?"
        params: list[Any] = [thread_id, after_id]
        if through_id is not None:
            sql += " AND p.message_id <= ?"
            params.append(through_id)
        return self._query(sql + " ORDER BY p.message_id", params)

    def all_messages(self, thread_id: int) -> list[dict[str, Any]]:
        """Every stored row of the thread, every branch, oldest first (what an export
        writes), each with ``on_path``: on the active branch or not."""
        return self._query(
            "SELECT m.*, EXISTS (SELECT 1 FROM thread_paths p WHERE p.thread_id = m.thread_id "
            "AND p.message_id = m.id) AS on_path FROM messages m WHERE m.thread_id = ? ORDER BY m.id",
            [thread_id])

    def leading_messages(self, thread_id: int, limit: int) -> list[dict[str, Any]]:
        """The active branch's first ``limit`` rows (id, role, content), oldest first:
        where the thread's own system messages are, if it has any. Content an older Iris
        stored as JSON content parts reads as its text."""
        rows = list(self.db.query(
            f"SELECT m.id, m.role, m.content, m.content_is_json FROM {_PATH} WHERE p.thread_id = ? "
            "ORDER BY p.message_id LIMIT ?", [thread_id, limit]))
        for row in rows:
            if row.pop("content_is_json") and row["content"] is not None:
                row["content"] = stored_content_text(row["content"])
        return rows

    def messages_by_id(self, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        result: dict[int, dict[str, Any]] = {}
        for start in range(0, len(ids), 500):
            chunk = list(ids[start : start + 500])
            marks = ",".join("?" * len(chunk))
            for row in self._query(f"SELECT * FROM messages WHERE id IN ({marks})", chunk):
                result[row["id"]] = row
        return result

    def newest_message_id(self, thread_id: int | None = None) -> int | None:
        """The id of the thread's newest message (of any thread when ``thread_id`` is
        None), or None when there is none; one lookup in the id index."""
        if thread_id is None:
            return self.conn.execute("SELECT max(id) FROM messages").fetchone()[0]
        return self.conn.execute(
            "SELECT max(id) FROM messages WHERE thread_id = ?", (thread_id,)
        ).fetchone()[0]

    def turn_anchor_id(self, covered: int) -> int | None:
        """The id of the user message that opens the turn of message ``covered``, when
        that turn goes on after it on the active branch (a summary boundary at
        ``covered`` cuts through the turn); None when the turn ends there or has no user
        message."""
        row = self.conn.execute(
            """
            SELECT o.id FROM messages c
            JOIN thread_paths op ON op.thread_id = c.thread_id
            JOIN messages o ON o.id = op.message_id AND o.turn = c.turn
            WHERE c.id = ? AND o.role = 'user'
              AND EXISTS (SELECT 1 FROM thread_paths np JOIN messages n ON n.id = np.message_id
                          WHERE np.thread_id = c.thread_id AND n.turn = c.turn AND n.id > c.id)
            ORDER BY o.id LIMIT 1
            """, (covered,)).fetchone()
        return None if row is None else int(row[0])

    def newest_user_message(self, thread_id: int) -> int | None:
        """The id of the active branch's newest user message (where its newest turn
        starts), or None."""
        row = self.conn.execute(
            f"SELECT m.id FROM {_PATH} WHERE p.thread_id = ? AND m.role = 'user' "
            "ORDER BY p.message_id DESC LIMIT 1", (thread_id,)).fetchone()
        return None if row is None else int(row[0])

    def user_messages_since(self, thread_id: int, created_at: float) -> int:
        """How many user messages (so turns begun) the thread got after ``created_at``,
        in seconds since the epoch like the rows' own ``created_at``."""
        return self.conn.execute(
            "SELECT count(*) FROM messages WHERE thread_id = ? AND role = 'user' "
            "AND created_at > ?", (thread_id, created_at)).fetchone()[0]

    def iter_meta_desc(
        self, thread_id: int, counter: str, after_id: int = 0
    ) -> Iterator[MessageMeta]:
        """The active branch's messages newest first, without their text; the cursor is
        lazy, so a caller that stops early never reads the rest of a long thread."""
        cur = self.conn.execute(
            f"""
            SELECT m.id, m.turn, m.role, c.tokens, m.tool_calls IS NOT NULL, m.tool_call_id,
                   m.status, m.name
            FROM {_PATH} LEFT JOIN token_counts c ON c.message_id = m.id AND c.counter = ?
            WHERE p.thread_id = ? AND p.message_id > ?
            ORDER BY p.message_id DESC
            """,
            (counter, thread_id, after_id),
        )
        try:  # (a generator closed early closes its cursor: its read ends with it)
            for row in cur:
                yield MessageMeta(row[0], row[1], row[2], row[3], bool(row[4]), *row[5:])
        finally:
            cur.close()

    def meta_range(
        self, thread_id: int, counter: str, through_id: int | None = None, after_id: int = 0
    ) -> list[MessageMeta]:
        """The active branch's messages with after_id < id ≤ through_id (default: all),
        oldest first, without their text."""
        if through_id is None:
            through_id = 2**62
        cur = self.conn.execute(
            f"""
            SELECT m.id, m.turn, m.role, c.tokens, m.tool_calls IS NOT NULL, m.tool_call_id,
                   m.status, m.name
            FROM {_PATH} LEFT JOIN token_counts c ON c.message_id = m.id AND c.counter = ?
            WHERE p.thread_id = ? AND p.message_id > ? AND p.message_id <= ? ORDER BY p.message_id
            """,
            (counter, thread_id, after_id, through_id),
        )
        return [MessageMeta(r[0], r[1], r[2], r[3], bool(r[4]), *r[5:]) for r in cur]

    def turn_span(self, thread_id: int, after_id: int = 0) -> tuple[int, int] | None:
        """(first, last) turn number of the active branch's messages after ``after_id``;
        two index lookups.

        Turn numbers grow by one at each user message along a branch, so the number of
        turns in a range is ``last - first + 1`` without counting rows.
        """
        first = self.conn.execute(
            f"SELECT m.turn FROM {_PATH} WHERE p.thread_id = ? AND p.message_id > ? "
            "ORDER BY p.message_id LIMIT 1",
            (thread_id, after_id),
        ).fetchone()
        if first is None:
            return None
        last = self.conn.execute(
            "SELECT m.turn FROM threads t JOIN messages m ON m.id = t.head_id WHERE t.id = ?",
            (thread_id,)).fetchone()
        return int(first[0]), int(last[0])

    def count_turns(self, thread_id: int, after_id: int = 0) -> int:
        """Turns with at least one message after ``after_id``."""
        span = self.turn_span(thread_id, after_id)
        return 0 if span is None else span[1] - span[0] + 1

    def cache_counts(self, counter: str, counts: dict[int, int]) -> None:
        """Remember token counts; a derived cache, safe to write at any time. A count for
        a reply still being written is ignored (schema 10's trigger), and a message's
        counts are dropped whenever its text changes, so a cached count is always the
        count of the text stored now."""
        if not counts:
            return
        with self.transaction():
            self.conn.executemany(
                "INSERT OR REPLACE INTO token_counts(message_id, counter, tokens) VALUES (?,?,?)",
                [(mid, counter, n) for mid, n in counts.items()],
            )

    def newest_turn_text_bytes(self, thread_id: int, after_id: int = 0) -> int:
        """UTF-8 bytes of the text of the user messages in the thread's newest turn after
        ``after_id``, surrounding whitespace left out (a chat template may trim it).
        Every counter spends a token per MAX_BYTES_PER_TOKEN bytes of that text at most,
        so :func:`min_tokens` of it is a floor on the turn's tokens, known without
        tokenizing. A turn starts at its one user message, so that is the active branch's
        newest user message: read backwards from the head, a turn's messages at most
        (filtering every user message by turn read half a 100k-message thread, 66 ms a
        request)."""
        row = self.conn.execute(
            f"""
            SELECT m.content, m.content_is_json FROM {_PATH}
            WHERE p.thread_id = ? AND m.role = 'user' AND p.message_id > ?
            ORDER BY p.message_id DESC LIMIT 1
            """,
            (thread_id, after_id),
        ).fetchone()
        if row is None or row[1] or row[0] is None:
            return 0
        return utf8_length(row[0].strip())


def _draft_files(stored: str | None) -> list[tuple[str, str]]:
    """The (name, text) files of a draft's ``files`` column; none for NULL or for a record
    :meth:`Messages.save_draft` could not have written (a damaged row)."""
    try:
        files = json.loads(stored) if stored else []
    except ValueError:
        return []
    if not isinstance(files, list):
        return []
    return [(f["name"], f["text"]) for f in files
            if isinstance(f, dict) and isinstance(f.get("name"), str) and f["name"]
            and isinstance(f.get("text"), str)]


def _storable(text: str) -> str:
    """``text`` with every surrogate (which UTF-8, and so SQLite, cannot hold) as U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in text)
    return text


def _storable_json(value: Any) -> str:
    """``json.dumps(value)``, its strings :func:`_storable` (an ``\\ud800`` escape would
    come back as the surrogate it stands for, and fail the next request)."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        value = json.loads(_storable(json.dumps(value, ensure_ascii=False)))
    return json.dumps(value)


def _imported_status(message: Message) -> str:
    """The row status of an imported message: "interrupted" or "error" for a reply its
    export says was stopped or failed, else "complete"."""
    said = message.get("status")  # (a user's message "interrupted" was a "(stopped)" user)
    if said in ("interrupted", "error") and message.get("role") == "assistant":
        return said
    return "complete"
