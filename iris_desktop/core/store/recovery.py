"""Damage: the quick check at open, and salvaging what a damaged file still holds.

:func:`~iris_desktop.core.store.open_store` runs ``PRAGMA quick_check`` first, on a
read-only connection. A damaged file is never written: it is set aside as
``iris.db.corrupt-<time>`` with its ``-wal`` and ``-shm``, and what can still be read is
salvaged, row by row, into a new database (:class:`Recovery` says what).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from iris_desktop.core.store.branches import rebuild_paths
from iris_desktop.core.store.cipher import Key, connect
from iris_desktop.core.store.errors import StoreError

log = logging.getLogger("iris.store")

#: the longest the quick check may take at open (about 0.35 s per 200 MB, warm cache);
#: a larger database is checked this far and then opened
QUICK_CHECK_S = 3.0
#: the tables a damaged database is salvaged from, parents first (token_counts and
#: message_vectors are caches and streams is rebuilt at start, so none is copied)
SALVAGED_TABLES = ("threads", "messages", "summaries", "compaction_events", "requests")


def _sidecar(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


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


def _read_only(path: Path, key: Key | None = None) -> sqlite3.Connection:
    """A connection that cannot write to ``path``: unlike a read-write one, it never
    checkpoints the WAL into the file when it closes. Without a -wal file the database
    is opened immutable, so that not even a -wal or -shm is created beside it."""
    mode = "ro" if _sidecar(path, "-wal").exists() else "ro&immutable=1"
    conn = connect(f"{path.resolve().as_uri()}?mode={mode}", key, uri=True, path=path)
    conn.execute("PRAGMA query_only = 1")
    return conn


def quick_check(path: Path, budget_s: float | None = None, key: Key | None = None) -> list[str]:
    """PRAGMA quick_check's findings for the file ([] when sound, or when it stops
    after ``budget_s`` on a large file), read through :func:`_read_only`. Raises
    StoreError for a file that is not a database at all."""
    if not path.exists() or path.stat().st_size == 0:
        return []
    seconds = QUICK_CHECK_S if budget_s is None else budget_s
    try:
        conn = _read_only(path, key)
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


def salvage(path: Path, problems: list[str], key: Key | None = None) -> Recovery:
    """Set the damaged database aside and copy every row that can still be read into a
    new database at ``path``: table by table, in id order, stepping over damaged pages.
    Messages whose thread was lost get a thread titled "Recovered chat <id>"."""
    from iris_desktop.core.store import Store  # the package imports this module first

    moved = _set_aside(path)
    aside = moved[-1]
    source = _read_only(aside, key)
    target = Store(path, key=key)
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
    rebuild_paths(conn)


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
