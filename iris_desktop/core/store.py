"""The SQLite store: threads, messages, summaries, compaction events and requests.

Messages are append-only. Pruning and compaction never modify or delete them; a summary
only records which messages it covers. The one exception is a reply that is still being
streamed: its row is updated with the partial text until it is complete.

One file, WAL mode, ``synchronous=FULL`` and a busy timeout, so that the GUI and the CLI
can use one data dir at once. The files are created 0600 on POSIX.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlite_utils

from iris_desktop.core.tokens import Message

ROLES = ("system", "user", "assistant", "tool")
#: keys of an OpenAI chat message that have their own column
_COLUMNS = ("role", "content", "tool_calls", "tool_call_id", "name")

MIGRATIONS: tuple[str, ...] = (
    # 1: the base schema
    """
    CREATE TABLE threads (
        id INTEGER PRIMARY KEY,
        title TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        thread_id INTEGER NOT NULL REFERENCES threads(id) ON DELETE CASCADE,
        turn INTEGER NOT NULL,
        role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant', 'tool')),
        content TEXT,
        content_is_json INTEGER NOT NULL DEFAULT 0,
        tool_calls TEXT,
        tool_call_id TEXT,
        name TEXT,
        extra TEXT,
        status TEXT NOT NULL DEFAULT 'complete'
            CHECK (status IN ('complete', 'streaming', 'interrupted', 'error')),
        created_at REAL NOT NULL
    );
    CREATE INDEX messages_thread ON messages(thread_id, id);
    CREATE INDEX messages_thread_turn ON messages(thread_id, role, id);
    CREATE TABLE token_counts (
        message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
        counter TEXT NOT NULL,
        tokens INTEGER NOT NULL,
        PRIMARY KEY (message_id, counter)
    ) WITHOUT ROWID;
    CREATE TABLE summaries (
        id INTEGER PRIMARY KEY,
        thread_id INTEGER NOT NULL REFERENCES threads(id) ON DELETE CASCADE,
        prev_id INTEGER REFERENCES summaries(id),
        first_message_id INTEGER NOT NULL,
        covers_through_id INTEGER NOT NULL,
        first_turn INTEGER NOT NULL,
        last_turn INTEGER NOT NULL,
        fields TEXT NOT NULL,
        text TEXT NOT NULL,
        tokens INTEGER NOT NULL,
        counter TEXT NOT NULL,
        path TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    CREATE INDEX summaries_thread ON summaries(thread_id, id);
    CREATE TABLE compaction_events (
        id INTEGER PRIMARY KEY,
        thread_id INTEGER NOT NULL REFERENCES threads(id) ON DELETE CASCADE,
        created_at REAL NOT NULL,
        trigger TEXT NOT NULL,
        outcome TEXT NOT NULL,
        path TEXT,
        turns_archived INTEGER,
        messages_archived INTEGER,
        tokens_before INTEGER,
        tokens_after INTEGER,
        kept_turns INTEGER,
        summary_tokens INTEGER,
        duration_s REAL,
        error TEXT,
        summary_id INTEGER REFERENCES summaries(id)
    );
    CREATE INDEX compaction_events_thread ON compaction_events(thread_id, id);
    CREATE TABLE requests (
        id INTEGER PRIMARY KEY,
        thread_id INTEGER NOT NULL REFERENCES threads(id) ON DELETE CASCADE,
        created_at REAL NOT NULL,
        model TEXT,
        window INTEGER,
        counter TEXT,
        summary_id INTEGER,
        predicted_prompt_tokens INTEGER,
        prompt_tokens INTEGER,
        completion_tokens INTEGER,
        reused_tokens INTEGER,
        evaluated_tokens INTEGER,
        time_to_first_token_s REAL,
        tokens_per_s REAL,
        duration_s REAL,
        finish_reason TEXT
    );
    CREATE INDEX requests_thread ON requests(thread_id, id);
    """,
    # 2: full-text search over message text
    """
    CREATE VIRTUAL TABLE messages_fts USING fts5(
        content, content='messages', content_rowid='id', tokenize='unicode61'
    );
    CREATE TRIGGER messages_fts_ai AFTER INSERT ON messages BEGIN
        INSERT INTO messages_fts(rowid, content) VALUES (new.id, coalesce(new.content, ''));
    END;
    CREATE TRIGGER messages_fts_au AFTER UPDATE OF content ON messages BEGIN
        INSERT INTO messages_fts(messages_fts, rowid, content)
            VALUES ('delete', old.id, coalesce(old.content, ''));
        INSERT INTO messages_fts(rowid, content) VALUES (new.id, coalesce(new.content, ''));
    END;
    CREATE TRIGGER messages_fts_ad AFTER DELETE ON messages BEGIN
        INSERT INTO messages_fts(messages_fts, rowid, content)
            VALUES ('delete', old.id, coalesce(old.content, ''));
    END;
    INSERT INTO messages_fts(messages_fts) VALUES ('rebuild');
    """,
    # 3: which process is streaming a reply, so that a crash can be told from a live writer
    """
    CREATE TABLE streams (
        message_id INTEGER PRIMARY KEY REFERENCES messages(id) ON DELETE CASCADE,
        pid INTEGER NOT NULL,
        started_at REAL NOT NULL
    );
    CREATE INDEX messages_streaming ON messages(id) WHERE status = 'streaming';
    """,
    # 4: when a message was written, as ISO 8601 with its UTC offset (the writer's local
    # day), NULL when unknown (an import without timestamps): summaries and recall date
    # facts from it, never from the text's layout
    """
    ALTER TABLE messages ADD COLUMN sent_at TEXT;
    CREATE INDEX messages_thread_name ON messages(thread_id, name);
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


class StoreError(Exception):
    """The database cannot be used (corrupt, newer schema, not a database)."""


@dataclass(frozen=True)
class MessageMeta:
    """What the engine needs of a message, without its text."""

    id: int
    turn: int
    role: str
    tokens: int | None
    has_tool_calls: bool
    tool_call_id: str | None
    status: str
    name: str | None = None


@dataclass(frozen=True)
class SummaryRow:
    id: int
    thread_id: int
    prev_id: int | None
    first_message_id: int
    covers_through_id: int
    first_turn: int
    last_turn: int
    fields: dict[str, Any]
    text: str
    tokens: int
    counter: str
    path: str
    created_at: float


def _create_private(path: Path) -> None:
    """Create the DB file 0600 before SQLite does; SQLite gives -wal/-shm the same mode."""
    if os.name == "posix" and not path.exists():
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.close(fd)


class Store:
    """One connection to the database, used by one thread at a time.

    Threads that work concurrently (the GUI and its workers) each open their own Store.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _create_private(self.path)
        try:
            # handed between threads (a CLI turn runs on a worker) but used by one at a time
            conn = sqlite3.connect(
                self.path, isolation_level=None, timeout=10.0, check_same_thread=False
            )
            conn.execute("PRAGMA busy_timeout = 10000")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA foreign_keys = ON")
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: cannot open the database ({exc})") from exc
        if mode.lower() != "wal":
            raise StoreError(f"{self.path}: could not switch to WAL mode (got {mode})")
        self.conn = conn
        self.db = sqlite_utils.Database(conn)
        self._migrate()

    # -- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """BEGIN IMMEDIATE … COMMIT; everything inside is atomic."""
        if self.conn.in_transaction:
            yield
            return
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    @contextmanager
    def trial(self) -> Iterator[None]:
        """A savepoint that is always rolled back: try a change, look, leave no trace."""
        self.conn.execute("SAVEPOINT trial")
        try:
            yield
        finally:
            self.conn.execute("ROLLBACK TO trial")
            self.conn.execute("RELEASE trial")

    def thread_state(self, thread_id: int) -> tuple:
        """What a request of the thread depends on, cheaply: the newest message (and how
        far a streaming one got), the newest summary and the newest recorded request."""
        return self.conn.execute(
            """
            SELECT m.id, m.status, length(m.content), m.tool_calls IS NOT NULL,
                   (SELECT max(id) FROM summaries WHERE thread_id = :t),
                   (SELECT max(id) FROM requests WHERE thread_id = :t)
            FROM (SELECT 1) LEFT JOIN messages m ON m.id =
                (SELECT max(id) FROM messages WHERE thread_id = :t)
            """,
            {"t": thread_id},
        ).fetchone()

    def _migrate(self) -> None:
        try:
            version = self.conn.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: not a usable database ({exc})") from exc
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path}: schema version {version} is newer than this Iris ({SCHEMA_VERSION});"
                " upgrade Iris Desktop"
            )
        for number in range(version, SCHEMA_VERSION):
            with self.transaction():
                for statement in _split_sql(MIGRATIONS[number]):
                    self.conn.execute(statement)
                self.conn.execute(f"PRAGMA user_version = {number + 1}")

    def integrity_check(self) -> str:
        return self.conn.execute("PRAGMA integrity_check").fetchone()[0]

    @property
    def schema_version(self) -> int:
        return self.conn.execute("PRAGMA user_version").fetchone()[0]

    # -- threads ----------------------------------------------------------------------------

    def create_thread(self, title: str = "New chat") -> int:
        now = time.time()
        cur = self.conn.execute(
            "INSERT INTO threads(title, created_at, updated_at) VALUES (?, ?, ?)",
            (title, now, now),
        )
        return int(cur.lastrowid)

    def thread(self, thread_id: int) -> dict[str, Any]:
        row = list(self.db.query("SELECT * FROM threads WHERE id = ?", [thread_id]))
        if not row:
            raise KeyError(f"no thread {thread_id}")
        return row[0]

    def rename_thread(self, thread_id: int, title: str) -> None:
        self.thread(thread_id)
        self.conn.execute("UPDATE threads SET title = ? WHERE id = ?", (title, thread_id))

    def delete_thread(self, thread_id: int) -> None:
        """Deletes a whole thread, on the user's explicit request only."""
        with self.transaction():
            self.conn.execute("DELETE FROM threads WHERE id = ?", (thread_id,))

    def threads(self) -> list[dict[str, Any]]:
        """Newest first, with message counts."""
        return list(
            self.db.query(
                """
                SELECT t.*, (SELECT count(*) FROM messages m WHERE m.thread_id = t.id) AS messages
                FROM threads t ORDER BY t.updated_at DESC, t.id DESC
                """
            )
        )

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

    def recall_hits(
        self, thread_id: int, through_id: int, fts: str, limit: int = 60
    ) -> list[tuple[int, float]]:
        """(id, bm25 rank) of the thread's user and assistant messages up to
        ``through_id`` that match the FTS5 query ``fts``, best first."""
        if through_id <= 0 or not fts:
            return []
        rows = self.conn.execute(
            """
            SELECT m.id, rank FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid
            WHERE messages_fts MATCH ? AND m.thread_id = ? AND m.id <= ?
              AND m.role IN ('user', 'assistant')
            ORDER BY rank LIMIT ?
            """,
            (fts, thread_id, through_id, limit),
        ).fetchall()
        return [(int(r[0]), float(r[1])) for r in rows]

    def thread_speakers(self, thread_id: int, limit: int = 32) -> list[str]:
        """The names the thread's messages carry (OpenAI's ``name`` field), most used
        first; read from an index, so it costs little on a long thread."""
        rows = self.conn.execute(
            """
            SELECT name FROM messages INDEXED BY messages_thread_name
            WHERE thread_id = ? AND name IS NOT NULL AND role IN ('user', 'assistant')
            GROUP BY name ORDER BY count(*) DESC LIMIT ?
            """,
            (thread_id, limit),
        ).fetchall()
        return [r[0] for r in rows if r[0]]

    def speakers_of(self, ids: Sequence[int]) -> dict[int, str | None]:
        """id → the message's ``name``."""
        return {mid: row.get("name") for mid, row in self.messages_by_id(list(ids)).items()}

    def following(self, thread_id: int, message_id: int, through_id: int, count: int) -> list[int]:
        """Up to ``count`` user or assistant messages right after ``message_id`` (≤
        ``through_id``); stops at anything else (a tool result)."""
        rows = self.conn.execute(
            "SELECT id, role FROM messages WHERE thread_id = ? AND id > ? AND id <= ? "
            "ORDER BY id LIMIT ?",
            (thread_id, message_id, through_id, count),
        ).fetchall()
        out: list[int] = []
        for mid, role in rows:
            if role not in ("user", "assistant"):
                break
            out.append(int(mid))
        return out

    def search(self, query: str, limit: int = 50) -> list[dict[str, Any]]:
        """Threads whose title or message text matches ``query`` (FTS5), best first."""
        terms = [t for t in query.replace('"', " ").split() if t]
        if not terms:
            return []
        fts = " ".join(f'"{t}"*' for t in terms)
        like = "%" + "%".join(terms) + "%"
        return list(
            self.db.query(
                """
                SELECT t.id AS thread_id, t.title, NULL AS message_id, t.title AS snippet
                FROM threads t WHERE t.title LIKE :like
                UNION ALL
                SELECT * FROM (
                    SELECT m.thread_id, t.title, m.id AS message_id,
                           snippet(messages_fts, 0, '[', ']', '…', 12) AS snippet
                    FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid
                    JOIN threads t ON t.id = m.thread_id
                    WHERE messages_fts MATCH :fts ORDER BY rank LIMIT :limit
                )
                """,
                {"like": like, "fts": fts, "limit": limit},
            )
        )

    # -- messages ---------------------------------------------------------------------------

    def add_message(self, thread_id: int, message: Message, status: str = "complete") -> int:
        """Append one message (written now, unless it carries its own timestamp) and
        commit it. Returns its id."""
        row = _message_row(message, now_iso())
        with self.transaction():
            return self._insert(thread_id, row, status)

    def add_messages(self, thread_id: int, messages: Sequence[Message]) -> list[int]:
        """Append many messages atomically: all or none. An imported message keeps the
        time its source gives (``created_at``, ``create_time`` or ``timestamp``); without
        one, when it was written is unknown (``sent_at`` NULL), not the import time."""
        rows = [_message_row(m, None) for m in messages]
        with self.transaction():
            return [self._insert(thread_id, row, "complete") for row in rows]

    def _insert(self, thread_id: int, row: dict[str, Any], status: str) -> int:
        message_id = self._insert_row(thread_id, row, status)
        if status == "streaming":
            self.conn.execute(
                "INSERT INTO streams(message_id, pid, started_at) VALUES (?, ?, ?)",
                (message_id, os.getpid(), time.time()),
            )
        return message_id

    def _insert_row(self, thread_id: int, row: dict[str, Any], status: str) -> int:
        last = self.conn.execute(
            "SELECT turn FROM messages WHERE thread_id = ? ORDER BY id DESC LIMIT 1", (thread_id,)
        ).fetchone()
        turn = (last[0] if last else 0) + (1 if row["role"] == "user" else 0)
        now = time.time()
        cur = self.conn.execute(
            """
            INSERT INTO messages(thread_id, turn, role, content, content_is_json, tool_calls,
                                 tool_call_id, name, extra, status, created_at, sent_at)
            VALUES (:thread_id, :turn, :role, :content, :content_is_json, :tool_calls,
                    :tool_call_id, :name, :extra, :status, :created_at, :sent_at)
            """,
            {**row, "thread_id": thread_id, "turn": turn, "status": status, "created_at": now},
        )
        self.conn.execute("UPDATE threads SET updated_at = ? WHERE id = ?", (now, thread_id))
        return int(cur.lastrowid)

    def update_streaming(
        self, message_id: int, content: str, status: str = "streaming",
        tool_calls: list[dict] | None = None,
    ) -> None:
        """Save a reply that is still being generated (or finish it). Only such rows change."""
        cur = self.conn.execute(
            """
            UPDATE messages SET content = ?, status = ?, tool_calls = ?
            WHERE id = ? AND status = 'streaming'
            """,
            (content, status, json.dumps(tool_calls) if tool_calls else None, message_id),
        )
        if cur.rowcount != 1:
            raise StoreError(f"message {message_id} is not a reply in progress")
        if status != "streaming":
            self.conn.execute("DELETE FROM streams WHERE message_id = ?", (message_id,))

    def mark_interrupted_streams(self) -> int:
        """At start-up: replies left 'streaming' by a process that is gone (a crash, a
        kill -9) become 'interrupted'. Replies a live process is writing are left alone."""
        rows = self.conn.execute(
            """
            SELECT m.id, s.pid FROM messages m LEFT JOIN streams s ON s.message_id = m.id
            WHERE m.status = 'streaming'
            """
        ).fetchall()
        dead = [mid for mid, pid in rows if pid is None or not _alive(pid)]
        with self.transaction():
            for mid in dead:
                self.conn.execute(
                    "UPDATE messages SET status = 'interrupted' WHERE id = ?", (mid,))
                self.conn.execute("DELETE FROM streams WHERE message_id = ?", (mid,))
        return len(dead)

    def messages(
        self, thread_id: int, after_id: int = 0, through_id: int | None = None
    ) -> list[dict[str, Any]]:
        """Stored rows, oldest first (with id, turn, status)."""
        sql = "SELECT * FROM messages WHERE thread_id = ? AND id > ?"
        params: list[Any] = [thread_id, after_id]
        if through_id is not None:
            sql += " AND id <= ?"
            params.append(through_id)
        return list(self.db.query(sql + " ORDER BY id", params))

    def messages_by_id(self, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        result: dict[int, dict[str, Any]] = {}
        for start in range(0, len(ids), 500):
            chunk = list(ids[start : start + 500])
            marks = ",".join("?" * len(chunk))
            for row in self.db.query(f"SELECT * FROM messages WHERE id IN ({marks})", chunk):
                result[row["id"]] = row
        return result

    def iter_meta_desc(
        self, thread_id: int, counter: str, after_id: int = 0
    ) -> Iterator[MessageMeta]:
        """Messages newest first, without their text; the cursor is lazy, so a caller
        that stops early never reads the rest of a long thread."""
        cur = self.conn.execute(
            """
            SELECT m.id, m.turn, m.role, c.tokens, m.tool_calls IS NOT NULL, m.tool_call_id,
                   m.status, m.name
            FROM messages m LEFT JOIN token_counts c ON c.message_id = m.id AND c.counter = ?
            WHERE m.thread_id = ? AND m.id > ?
            ORDER BY m.id DESC
            """,
            (counter, thread_id, after_id),
        )
        for row in cur:
            yield MessageMeta(row[0], row[1], row[2], row[3], bool(row[4]), *row[5:])

    def meta_range(
        self, thread_id: int, counter: str, through_id: int | None = None, after_id: int = 0
    ) -> list[MessageMeta]:
        """Messages with after_id < id ≤ through_id (default: all), oldest first, without
        their text."""
        if through_id is None:
            through_id = 2**62
        cur = self.conn.execute(
            """
            SELECT m.id, m.turn, m.role, c.tokens, m.tool_calls IS NOT NULL, m.tool_call_id,
                   m.status, m.name
            FROM messages m LEFT JOIN token_counts c ON c.message_id = m.id AND c.counter = ?
            WHERE m.thread_id = ? AND m.id > ? AND m.id <= ? ORDER BY m.id
            """,
            (counter, thread_id, after_id, through_id),
        )
        return [MessageMeta(r[0], r[1], r[2], r[3], bool(r[4]), *r[5:]) for r in cur]

    def turn_span(self, thread_id: int, after_id: int = 0) -> tuple[int, int] | None:
        """(first, last) turn number of the messages after ``after_id``; two index lookups.

        Turn numbers grow by one at each user message, so the number of turns in a range
        is ``last - first + 1`` without counting rows.
        """
        first = self.conn.execute(
            "SELECT turn FROM messages WHERE thread_id = ? AND id > ? ORDER BY id LIMIT 1",
            (thread_id, after_id),
        ).fetchone()
        if first is None:
            return None
        last = self.conn.execute(
            "SELECT turn FROM messages WHERE thread_id = ? ORDER BY id DESC LIMIT 1", (thread_id,)
        ).fetchone()
        return int(first[0]), int(last[0])

    def count_turns(self, thread_id: int, after_id: int = 0) -> int:
        """Turns with at least one message after ``after_id``."""
        span = self.turn_span(thread_id, after_id)
        return 0 if span is None else span[1] - span[0] + 1

    def cache_counts(self, counter: str, counts: dict[int, int]) -> None:
        """Remember token counts; a derived cache, safe to write at any time."""
        if not counts:
            return
        with self.transaction():
            self.conn.executemany(
                "INSERT OR REPLACE INTO token_counts(message_id, counter, tokens) VALUES (?,?,?)",
                [(mid, counter, n) for mid, n in counts.items()],
            )

    # -- summaries and events ---------------------------------------------------------------

    def latest_summary(self, thread_id: int) -> SummaryRow | None:
        row = self.conn.execute(
            "SELECT * FROM summaries WHERE thread_id = ? ORDER BY id DESC LIMIT 1", (thread_id,)
        )
        return _summary(row)

    def summaries(self, thread_id: int) -> list[SummaryRow]:
        cur = self.conn.execute(
            "SELECT * FROM summaries WHERE thread_id = ? ORDER BY id", (thread_id,)
        )
        cols = [d[0] for d in cur.description]
        return [_summary_from(dict(zip(cols, r))) for r in cur.fetchall()]

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

    def add_compaction_event(self, thread_id: int, event: dict[str, Any]) -> int:
        row = {"thread_id": thread_id, "created_at": time.time(), **event}
        cols = ", ".join(row)
        marks = ", ".join(f":{c}" for c in row)
        cur = self.conn.execute(f"INSERT INTO compaction_events({cols}) VALUES ({marks})", row)
        return int(cur.lastrowid)

    def compaction_events(self, thread_id: int) -> list[dict[str, Any]]:
        return list(
            self.db.query(
                "SELECT * FROM compaction_events WHERE thread_id = ? ORDER BY id", [thread_id]
            )
        )

    def add_request(self, thread_id: int, request: dict[str, Any]) -> int:
        row = {"thread_id": thread_id, "created_at": time.time(), **request}
        cols = ", ".join(row)
        marks = ", ".join(f":{c}" for c in row)
        cur = self.conn.execute(f"INSERT INTO requests({cols}) VALUES ({marks})", row)
        return int(cur.lastrowid)

    def requests(self, thread_id: int) -> list[dict[str, Any]]:
        return list(
            self.db.query("SELECT * FROM requests WHERE thread_id = ? ORDER BY id", [thread_id])
        )

    def last_request(self, thread_id: int, since_summary: int | None) -> dict[str, Any] | None:
        """The newest completed request made with the current summary in place."""
        rows = list(
            self.db.query(
                """
                SELECT * FROM requests WHERE thread_id = ? AND prompt_tokens IS NOT NULL
                AND coalesce(summary_id, 0) = ? ORDER BY id DESC LIMIT 1
                """,
                [thread_id, since_summary or 0],
            )
        )
        return rows[0] if rows else None


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # this process is only starting: nothing of it is streaming yet
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def _split_sql(script: str) -> list[str]:
    """Split a migration into statements, keeping trigger bodies whole."""
    statements: list[str] = []
    buffer = ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                statements.append(buffer.strip())
            buffer = ""
    if buffer.strip():
        statements.append(buffer.strip())
    return statements


#: the message keys a source may carry its time in (OpenAI-style exports differ)
TIMESTAMP_KEYS = ("created_at", "create_time", "timestamp")


def now_iso() -> str:
    """Now, as ISO 8601 with the local UTC offset."""
    return dt.datetime.now().astimezone().isoformat(timespec="seconds")


def iso_timestamp(value: Any) -> str:
    """A source's timestamp as ISO 8601 with an offset: ISO text (a missing offset reads as
    local time) or seconds (or milliseconds) since the epoch. Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"not a time: {value!r}")
    if isinstance(value, (int, float)):
        seconds = value / 1000 if value > 1e11 else value  # milliseconds, from JavaScript
        when = dt.datetime.fromtimestamp(seconds).astimezone()
    elif isinstance(value, str):
        when = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        if when.tzinfo is None:
            when = when.astimezone()
    else:
        raise ValueError(f"not a time: {value!r}")
    return when.isoformat(timespec="seconds")


def sent_at_of(message: Message) -> str | None:
    """The time a message says it was written, if it says (see TIMESTAMP_KEYS)."""
    for key in TIMESTAMP_KEYS:
        if message.get(key) is not None:
            return iso_timestamp(message[key])
    return None


def _message_row(message: Message, default_sent_at: str | None = None) -> dict[str, Any]:
    role = message.get("role")
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; expected one of {', '.join(ROLES)}")
    content = message.get("content")
    content_is_json = 0
    if content is not None and not isinstance(content, str):
        content = json.dumps(content, ensure_ascii=False)
        content_is_json = 1
    calls = message.get("tool_calls")
    extra = {k: v for k, v in message.items() if k not in _COLUMNS}
    # keep key presence exact so that export returns what was imported
    present = [k for k in ("content", "tool_calls", "tool_call_id", "name") if k in message]
    extra["_keys"] = present
    return {
        "role": role,
        "content": content,
        "content_is_json": content_is_json,
        "tool_calls": None if calls is None else json.dumps(calls, ensure_ascii=False),
        "tool_call_id": message.get("tool_call_id"),
        "name": message.get("name"),
        "extra": json.dumps(extra, ensure_ascii=False),
        "sent_at": sent_at_of(message) or default_sent_at,
    }


def row_to_message(row: dict[str, Any]) -> Message:
    """A stored row back to the OpenAI message it was made from, key for key."""
    extra = json.loads(row["extra"]) if row.get("extra") else {}
    present = extra.pop("_keys", ["content", "tool_calls", "tool_call_id", "name"])
    message: Message = {"role": row["role"]}
    content = row["content"]
    if content is not None and row.get("content_is_json"):
        content = json.loads(content)
    values = {
        "content": content,
        "tool_calls": json.loads(row["tool_calls"]) if row["tool_calls"] is not None else None,
        "tool_call_id": row["tool_call_id"],
        "name": row["name"],
    }
    for key in ("content", "tool_calls", "tool_call_id", "name"):
        # a reply that made calls while streaming gains tool_calls after its insert
        if key in present or (key == "tool_calls" and values[key] is not None):
            message[key] = values[key]
    message.update(extra)
    return message


def _summary(cursor: sqlite3.Cursor) -> SummaryRow | None:
    row = cursor.fetchone()
    if row is None:
        return None
    cols = [d[0] for d in cursor.description]
    return _summary_from(dict(zip(cols, row)))


def _summary_from(row: dict[str, Any]) -> SummaryRow:
    row = dict(row)
    row["fields"] = json.loads(row["fields"])
    return SummaryRow(**row)
