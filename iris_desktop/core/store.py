"""The SQLite store: threads, messages, summaries, compaction events and requests.

Messages are append-only. Pruning and compaction never modify or delete them; a summary
only records which messages it covers. The one exception is a reply that is still being
streamed: its row is updated with the partial text until it is complete.

One file, WAL mode, ``synchronous=FULL`` and a busy timeout, so that the GUI and the CLI
can use one data dir at once. The files are created 0600 on POSIX.

Damage: :func:`open_store` (what the app and the CLI open through) runs ``PRAGMA
quick_check`` first, on a read-only connection. A damaged file is never written: it is
set aside as ``iris.db.corrupt-<time>`` with its ``-wal`` and ``-shm``, and what can
still be read is salvaged, row by row, into a new database (:class:`Recovery` says what).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlite_utils

from iris_desktop.core.tokens import Message
from iris_desktop.paths import DataDirError, make_private_dir

log = logging.getLogger("iris.store")

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
    # 5: who is compacting a thread: one process at a time (a lease that expires, and
    # that is free as soon as its process is gone)
    """
    CREATE TABLE compaction_leases (
        thread_id INTEGER PRIMARY KEY REFERENCES threads(id) ON DELETE CASCADE,
        token TEXT NOT NULL,
        pid INTEGER NOT NULL,
        acquired_at REAL NOT NULL,
        expires_at REAL NOT NULL
    );
    """,
    # 6: messages by when they were written, for recall of a question that names a date
    """
    CREATE INDEX messages_thread_sent ON messages(thread_id, sent_at);
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)

#: how long a write waits for another process's write to finish
BUSY_TIMEOUT_S = 10.0
#: the longest the quick check may take at open (about 0.35 s per 200 MB, warm cache);
#: a larger database is checked this far and then opened
QUICK_CHECK_S = 3.0
#: the tables a damaged database is salvaged from, parents first (token_counts is a
#: cache and streams is rebuilt at start, so neither is copied)
SALVAGED_TABLES = ("threads", "messages", "summaries", "compaction_events", "requests")
#: the most UTF-8 bytes one token can stand for with any counter Iris uses. Longest tokens
#: measured: cl100k_base 128 bytes, Qwen2.5 32, Gemma 3 31; the heuristic ceil(chars/4)
#: is at most 16 (4 characters of at most 4 bytes). 256 leaves room for other vocabularies.
MAX_BYTES_PER_TOKEN = 256


class StoreError(Exception):
    """The database cannot be used (corrupt, newer schema, not a database)."""


class DamagedDatabase(StoreError):
    """PRAGMA quick_check found damage; nothing was written to the file."""

    def __init__(self, path: Path, problems: list[str]):
        super().__init__(f"{path} is damaged: {problems[0]}")
        self.path = path
        self.problems = problems


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


def _sidecar(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def _check_writable(path: Path) -> None:
    """Refuse, saying what to do, a database SQLite could only open read-only (it would
    fail at the first write, or at the first read for a read-only ``-shm``)."""
    folder = path.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        raise StoreError(f"cannot write to the folder {folder}; make it writable (for example "
                         "chmod u+w) or choose another --data-dir (or IRIS_HOME)")
    if path.exists() and not os.access(path, os.W_OK):
        raise StoreError(f"{path} is read-only; make it writable (for example chmod u+w) "
                         "or choose another --data-dir (or IRIS_HOME)")
    for suffix in ("-wal", "-shm"):
        side = _sidecar(path, suffix)
        if side.exists() and not os.access(side, os.W_OK):
            raise StoreError(f"{side} is read-only (left by another user or an earlier run); "
                             "make it writable, for example chmod u+w, then start Iris again")


def explain(exc: sqlite3.Error, path: Path) -> str:
    """One sentence for a database error: what happened and what to do."""
    name = getattr(exc, "sqlite_errorname", None) or ""
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return f"another Iris process is writing to {path}; close it or wait, then try again"
    if name.startswith("SQLITE_READONLY"):
        return (f"{path} cannot be written ({exc}); make its folder and its iris.db files "
                "writable, or choose another --data-dir (or IRIS_HOME)")
    if name == "SQLITE_NOTADB":
        return (f"{path} is not an Iris database ({exc}); nothing was changed; move it away "
                "or choose another --data-dir (or IRIS_HOME)")
    if name.startswith("SQLITE_CORRUPT") or "decode" in str(exc):
        return (f"{path} is damaged ({exc}); nothing more was written; start Iris again: "
                "it checks the database and recovers what can be read")
    if name.startswith("SQLITE_FULL"):
        return f"the disk holding {path} is full; free some space, then try again"
    return (f"cannot use the database {path} ({exc}); check that its folder is writable "
            "and the disk is not full")


def _read_only(path: Path) -> sqlite3.Connection:
    """A connection that cannot write to ``path``: unlike a read-write one, it never
    checkpoints the WAL into the file when it closes. Without a -wal file the database
    is opened immutable, so that not even a -wal or -shm is created beside it."""
    mode = "ro" if _sidecar(path, "-wal").exists() else "ro&immutable=1"
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode={mode}", uri=True)
    conn.execute("PRAGMA query_only = 1")
    return conn


def quick_check(path: Path, budget_s: float | None = None) -> list[str]:
    """PRAGMA quick_check's findings for the file ([] when sound, or when it stops
    after ``budget_s`` on a large file), read through :func:`_read_only`. Raises
    StoreError for a file that is not a database at all."""
    if not path.exists() or path.stat().st_size == 0:
        return []
    seconds = QUICK_CHECK_S if budget_s is None else budget_s
    try:
        conn = _read_only(path)
    except sqlite3.DatabaseError as exc:
        raise StoreError(explain(exc, path)) from None
    try:
        with _deadline(conn, seconds):
            rows = conn.execute("PRAGMA quick_check(20)").fetchall()
    except sqlite3.DatabaseError as exc:
        if getattr(exc, "sqlite_errorname", "") == "SQLITE_INTERRUPT":
            log.warning("%s: quick check stopped after %.1f s; opened unchecked", path, seconds)
            return []
        if getattr(exc, "sqlite_errorname", "") == "SQLITE_NOTADB":
            raise StoreError(explain(exc, path)) from None
        return [str(exc)]
    finally:
        conn.close()
    problems = [str(row[0]) for row in rows]
    return [] if problems == ["ok"] else problems


@contextmanager
def _deadline(conn: sqlite3.Connection, seconds: float) -> Iterator[None]:
    """Interrupt the statement run inside once ``seconds`` have passed. The progress
    handler flags it (deterministic, even for 0 s), and a watcher thread interrupts it
    at once: SQLite 3.40 finishes quick_check's page walk after the flag, not after
    sqlite3_interrupt."""
    end = time.monotonic() + seconds
    done = threading.Event()
    lock = threading.Lock()

    def watch() -> None:
        if not done.wait(seconds):
            with lock:
                if not done.is_set():
                    conn.interrupt()

    conn.set_progress_handler(lambda: time.monotonic() > end, 1000)
    watcher = threading.Thread(target=watch, name="quick-check-deadline", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        with lock:
            done.set()
        watcher.join()
        conn.set_progress_handler(None, 0)


@dataclass(frozen=True)
class Recovery:
    """What salvaging a damaged database did: rows copied and rows lost, per table."""

    path: Path
    set_aside: Path
    #: the files moved: the database, and its -wal and -shm when it had them
    moved: list[Path]
    problems: list[str]
    recovered: dict[str, int]
    lost: dict[str, int]

    def describe(self) -> str:
        """What happened, where the original is and what was recovered, for the user."""
        parts = [f"{self.recovered.get(t, 0):,} {t.replace('_', ' ')}" for t in SALVAGED_TABLES]
        lost = sum(self.lost.values())
        sides = [p.name.rsplit("-", 1)[-1] for p in self.moved if p != self.set_aside]
        with_sides = f" (with its {' and '.join('-' + s for s in sides)})" if sides else ""
        return (f"The database {self.path} was damaged ({self.problems[0]}). Iris did not "
                f"write to it: it is set aside, unchanged, as {self.set_aside}{with_sides}. "
                f"Recovered into a new database: {', '.join(parts)}"
                + (f"; {lost:,} rows could not be read" if lost else "; no row was lost")
                + ". Keep the set-aside file to try other recovery tools.")


def open_store(path: str | os.PathLike[str]) -> tuple[Store, Recovery | None]:
    """Open the database after a quick check. A damaged one is never written: it is set
    aside and salvaged into a new file, and the Recovery says what was saved."""
    try:
        return Store(path, check=True), None
    except DamagedDatabase as exc:
        damage = exc
    try:
        recovery = salvage(damage.path, damage.problems)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(f"{damage}; recovering it failed ({exc}); Iris did not write to it: "
                         f"it is in {damage.path.parent} as {damage.path.name} or "
                         f"{damage.path.name}.corrupt-<time>") from None
    return Store(path), recovery


def _set_aside(path: Path) -> list[Path]:
    """Move the file away with its -wal and -shm (those first: a new file must never
    meet the old WAL). Returns the new names, the database's last."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    moved = []
    for suffix in ("-wal", "-shm", ""):
        if _sidecar(path, suffix).exists():
            os.replace(_sidecar(path, suffix), _sidecar(aside, suffix))
            moved.append(_sidecar(aside, suffix))
    return moved


def salvage(path: Path, problems: list[str]) -> Recovery:
    """Set the damaged database aside and copy every row that can still be read into a
    new database at ``path``: table by table, in id order, stepping over damaged pages.
    Messages whose thread was lost get a thread titled "Recovered chat <id>"."""
    moved = _set_aside(path)
    aside = moved[-1]
    source = _read_only(aside)
    target = Store(path)
    recovered: dict[str, int] = {}
    lost: dict[str, int] = {}
    try:
        # rows whose parent was lost are kept; the new connection is closed right after
        target.conn.execute("PRAGMA foreign_keys = OFF")
        with target.transaction():
            for table in SALVAGED_TABLES:
                recovered[table], lost[table] = _copy_table(source, target.conn, table)
            _repair_references(target.conn)
    finally:
        source.close()
        target.close()
    return Recovery(path, aside, moved, list(problems), recovered, lost)


def _copy_table(source: sqlite3.Connection, target: sqlite3.Connection, table: str
                ) -> tuple[int, int]:
    """(rows copied, rows lost) of one table; FTS is filled by the insert triggers."""
    wanted = [row[1] for row in target.execute(f"PRAGMA table_info({table})")]
    try:
        present = {row[1] for row in source.execute(f"PRAGMA table_info({table})")}
    except sqlite3.DatabaseError:
        present = set(wanted)
    columns = [c for c in wanted if c in present] or wanted
    reader = _RowReader(source, table, columns)
    insert = (f"INSERT INTO {table}({', '.join(columns)}) "
              f"VALUES ({', '.join('?' * len(columns))})")
    copied = refused = 0
    for row in reader.rows():
        try:
            target.execute(insert, row)
            copied += 1
        except sqlite3.DatabaseError:  # a damaged value that breaks a constraint
            refused += 1
    return copied, refused + reader.skipped


def _repair_references(conn: sqlite3.Connection) -> None:
    """Give orphaned rows a thread, and drop links to summaries that were lost."""
    now = time.time()
    for table in SALVAGED_TABLES[1:]:
        conn.execute(
            f"""INSERT INTO threads(id, title, created_at, updated_at)
                SELECT DISTINCT thread_id, 'Recovered chat ' || thread_id, ?, ?
                FROM {table} WHERE thread_id NOT IN (SELECT id FROM threads)""", (now, now))
    conn.execute("UPDATE summaries SET prev_id = NULL "
                 "WHERE prev_id NOT IN (SELECT id FROM summaries)")
    conn.execute("UPDATE compaction_events SET summary_id = NULL "
                 "WHERE summary_id NOT IN (SELECT id FROM summaries)")


class _RowReader:
    """The readable rows of one table of a damaged database, in id order.

    A damaged page fails every read that touches it, so after a failure the next start
    that reads is searched for: doubling steps past it, then bisection back to the
    first id that reads. ``skipped`` counts the ids stepped over (the rows lost, when
    ids are dense as Iris writes them).
    """

    _MAX_ROWID = 2**63 - 1

    def __init__(self, conn: sqlite3.Connection, table: str, columns: Sequence[str]):
        self.conn = conn
        self.sql = (f"SELECT rowid, {', '.join(columns)} FROM {table} "
                    "WHERE rowid > ? ORDER BY rowid")
        self.skipped = 0

    def rows(self) -> Iterator[tuple]:
        last, gap_from = 0, None
        while True:
            try:
                for row in self.conn.execute(self.sql, (last,)):
                    if gap_from is not None:
                        self.skipped += row[0] - gap_from - 1
                        gap_from = None
                    last = row[0]
                    yield row[1:]
                return
            except sqlite3.DatabaseError:
                gap_from = last if gap_from is None else gap_from
                resume = self._resume(last)
                if resume is None:
                    return
                last = resume

    def _readable(self, start: int) -> bool:
        try:
            self.conn.execute(self.sql + " LIMIT 1", (start,)).fetchall()
            return True
        except sqlite3.DatabaseError:
            return False

    def _resume(self, last: int) -> int | None:
        """The smallest start after ``last`` from which a read succeeds."""
        step = 1
        while not self._readable(last + step):
            step *= 2
            if last + step >= self._MAX_ROWID:
                return None
        low, high = last + step // 2, last + step  # low fails (or is last), high reads
        while high - low > 1:
            middle = (low + high) // 2
            if self._readable(middle):
                high = middle
            else:
                low = middle
        return high


class Store:
    """One connection to the database, used by one thread at a time.

    Threads that work concurrently (the GUI and its workers) each open their own Store.
    """

    def __init__(self, path: str | os.PathLike[str], *, check: bool = False):
        """Open (or create) the database. ``check``: run PRAGMA quick_check first and
        raise DamagedDatabase, before anything is written, when it finds damage."""
        self.path = Path(path)
        #: the last thread_speakers answer, with what it depends on
        self._speakers: tuple[tuple, list[str]] | None = None
        try:
            make_private_dir(self.path.parent)
        except DataDirError as exc:
            raise StoreError(str(exc)) from None
        _check_writable(self.path)
        if check:
            problems = quick_check(self.path)
            if problems:
                raise DamagedDatabase(self.path, problems)
        _create_private(self.path)
        try:
            # handed between threads (a CLI turn runs on a worker) but used by one at a time
            conn = sqlite3.connect(
                self.path, isolation_level=None, timeout=BUSY_TIMEOUT_S, check_same_thread=False
            )
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA foreign_keys = ON")
        except sqlite3.DatabaseError as exc:
            raise StoreError(explain(exc, self.path)) from exc
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
        self._speakers = None

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

    def uncounted(self, counter: str, max_chars: int) -> list[MessageMeta]:
        """Newest first, messages of any thread without a cached count under ``counter``
        whose text (content and tool calls) adds up to at most ``max_chars``, stopping at
        the first that does not fit; one larger than ``max_chars`` alone is left for a
        request to count. Bounds what a listing spends on counting."""
        cur = self.conn.execute(
            """
            SELECT m.id, m.turn, m.role, m.tool_calls IS NOT NULL, m.tool_call_id, m.status,
                   m.name, coalesce(length(m.content), 0) + coalesce(length(m.tool_calls), 0)
            FROM messages m LEFT JOIN token_counts c ON c.message_id = m.id AND c.counter = ?
            WHERE c.tokens IS NULL ORDER BY m.id DESC
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

    def newest_turn_text_bytes(self, thread_id: int, after_id: int = 0) -> int:
        """UTF-8 bytes of the text of the user messages in the thread's newest turn after
        ``after_id``, surrounding whitespace left out (a chat template may trim it).
        Every counter spends a token per MAX_BYTES_PER_TOKEN bytes of that text at most,
        so :func:`min_tokens` of it is a floor on the turn's tokens, known without
        tokenizing."""
        rows = self.conn.execute(
            """
            SELECT content FROM messages WHERE thread_id = :t AND id > :a AND role = 'user'
              AND content_is_json = 0 AND content IS NOT NULL
              AND turn = (SELECT turn FROM messages WHERE thread_id = :t AND id > :a
                          ORDER BY id DESC LIMIT 1)
            """,
            {"t": thread_id, "a": after_id},
        )
        return sum(utf8_length(row[0].strip()) for row in rows)

    def recall_hits(
        self, thread_id: int, through_id: int, fts: str, limit: int = 60,
        among: Sequence[int] | None = None,
    ) -> list[tuple[int, float]]:
        """(id, bm25 rank) of the thread's user and assistant messages up to
        ``through_id`` (and among ``among``, when given) that match the FTS5 query
        ``fts``, best first."""
        if through_id <= 0 or not fts or (among is not None and not among):
            return []
        rows = self.conn.execute(
            f"""
            SELECT m.id, rank FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid
            WHERE messages_fts MATCH ? AND m.thread_id = ? AND m.id <= ?
              AND m.role IN ('user', 'assistant')
              {"AND m.id IN (SELECT value FROM json_each(?))" if among is not None else ""}
            ORDER BY rank LIMIT ?
            """,
            (fts, thread_id, through_id, *([json.dumps(list(among))] if among is not None else []), limit),
        ).fetchall()
        return [(int(r[0]), float(r[1])) for r in rows]

    def sent_within(self, thread_id: int, through_id: int,
                    days: Sequence[tuple[dt.date, dt.date]]) -> list[int]:
        """Ids of the thread's user and assistant messages up to ``through_id`` that were
        written on one of the ``days`` ranges (first, last, inclusive; the writer's local
        day, as ``sent_at`` says), oldest first. Read by the ``messages_thread_sent``
        index."""
        found: set[int] = set()
        for first, last in days:
            rows = self.conn.execute(
                """
                SELECT id FROM messages INDEXED BY messages_thread_sent
                WHERE thread_id = ? AND sent_at >= ? AND sent_at < ? AND id <= ?
                  AND role IN ('user', 'assistant')
                """,
                (thread_id, first.isoformat(), (last + dt.timedelta(days=1)).isoformat(), through_id),
            ).fetchall()
            found.update(int(r[0]) for r in rows)
        return sorted(found)

    def sent_years(self, thread_id: int) -> tuple[int, int] | None:
        """The first and last year the thread's messages were written in (by
        ``sent_at``), or None when none says."""
        years = []
        for order in ("ASC", "DESC"):
            row = self.conn.execute(
                "SELECT sent_at FROM messages INDEXED BY messages_thread_sent "
                f"WHERE thread_id = ? AND sent_at IS NOT NULL ORDER BY sent_at {order} LIMIT 1",
                (thread_id,),
            ).fetchone()
            if row is None or not str(row[0])[:4].isdigit():
                return None
            years.append(int(str(row[0])[:4]))
        return years[0], years[1]

    def thread_speakers(self, thread_id: int, limit: int = 32) -> list[str]:
        """The names the thread's messages carry (OpenAI's ``name`` field), most used
        first (ties by name). Counting them reads every message of the thread (3.5 ms
        at 100k, and recall asks twice per question), so the answer is kept until the
        thread's first or newest message id changes: messages are only ever added, or
        deleted with their thread."""
        key = (thread_id, limit, *self.conn.execute(  # two lookups in messages_thread
            "SELECT (SELECT min(id) FROM messages WHERE thread_id = :t), "
            "(SELECT max(id) FROM messages WHERE thread_id = :t)", {"t": thread_id}).fetchone())
        if self._speakers is not None and self._speakers[0] == key:
            return list(self._speakers[1])
        rows = self.conn.execute(
            """
            SELECT name FROM messages INDEXED BY messages_thread_name
            WHERE thread_id = ? AND name IS NOT NULL AND role IN ('user', 'assistant')
            GROUP BY name ORDER BY count(*) DESC, name LIMIT ?
            """,
            (thread_id, limit),
        ).fetchall()
        names = [r[0] for r in rows if r[0]]
        self._speakers = (key, names)
        return list(names)

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
        if not dead:
            return 0  # no write, so a start never waits for another process's write lock
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

    # -- who compacts a thread --

    def take_compaction_lease(self, thread_id: int, token: str, seconds: float) -> dict[str, Any] | None:
        """Take the thread's compaction lease for ``seconds`` (atomically). Returns None
        when it is ours now, else the holder's row (``pid``, ``acquired_at``). A lease
        whose time is up, or whose process is gone, is taken over."""
        now = time.time()
        with self.transaction():
            row = self.conn.execute(
                "SELECT token, pid, acquired_at, expires_at FROM compaction_leases "
                "WHERE thread_id = ?", (thread_id,)).fetchone()
            if row is not None and row[0] != token and row[3] > now and (
                    row[1] == os.getpid() or _alive(row[1])):
                return {"pid": row[1], "acquired_at": row[2], "expires_at": row[3]}
            self.conn.execute(
                "INSERT OR REPLACE INTO compaction_leases(thread_id, token, pid, acquired_at, "
                "expires_at) VALUES (?, ?, ?, ?, ?)", (thread_id, token, os.getpid(), now,
                                                       now + seconds))
        return None

    def release_compaction_lease(self, thread_id: int, token: str) -> None:
        with self.transaction():
            self.conn.execute("DELETE FROM compaction_leases WHERE thread_id = ? AND token = ?",
                              (thread_id, token))

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


def utf8_length(text: str) -> int:
    """Bytes of ``text`` in UTF-8 (a lone surrogate counts its three bytes)."""
    return len(text.encode("utf-8", "surrogatepass"))


def min_tokens(n_bytes: int) -> int:
    """The fewest tokens ``n_bytes`` of text can be, with any counter Iris uses."""
    return -(-n_bytes // MAX_BYTES_PER_TOKEN)


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
