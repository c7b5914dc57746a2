"""Reading a damaged database for salvage: a read-only connection that reads past a
truncated file, the rows of a table that can still be read (stepping over damaged
pages), and how many rows a table held as far as any part of the file can still tell.

SQLCipher leaves a connection failing every read once one page fails its check, sound
pages too: a salvage of an encrypted history with one flipped bit kept 787 of 2,000
messages where fresh connections read 1,969. :class:`Reader` opens an encrypted file
again after each failed read (:meth:`Reader.renew`); a plain one reads on.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from iris_desktop.core.store.cipher import Key, connect
from iris_desktop.core.store.rows import decode_text


def read_only(path: Path, key: Key | None = None) -> sqlite3.Connection:
    """A connection that cannot write to ``path``: unlike a read-write one, it never
    checkpoints the WAL into the file when it closes. Without a -wal file the database
    is opened immutable, so that not even a -wal or -shm is created beside it."""
    mode = "ro" if path.with_name(path.name + "-wal").exists() else "ro&immutable=1"
    conn = connect(f"{path.resolve().as_uri()}?mode={mode}", key, uri=True, path=path)
    conn.execute("PRAGMA query_only = 1")
    conn.text_factory = decode_text  # a damaged text is copied with U+FFFD, not skipped
    return conn


def damaged_reader(path: Path, key: Key | None = None) -> sqlite3.Connection:
    """:func:`read_only`, reading on where a file is shorter than its header says (a
    truncated file: SQLite refuses it whole otherwise; ``writable_schema`` lets it read
    the pages that are there, and ``query_only`` still forbids any write)."""
    conn = read_only(path, key)
    conn.execute("PRAGMA writable_schema = ON")
    return conn


class Reader:
    """The damaged database a salvage reads (:func:`damaged_reader`), opened again after
    a failed read when it is encrypted (see the module's note)."""

    def __init__(self, path: Path, key: Key | None = None):
        self.path, self.key = path, key
        self.conn = damaged_reader(path, key)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        return self.conn.execute(sql, params)

    def renew(self) -> None:
        """After a failed read: a fresh connection to an encrypted file."""
        if self.key is not None:
            with contextlib.suppress(sqlite3.Error):
                self.conn.close()
            self.conn = damaged_reader(self.path, self.key)

    def close(self) -> None:
        self.conn.close()


def _renew(conn: Reader | sqlite3.Connection) -> None:
    if isinstance(conn, Reader):  # a sound file's plain connection reads on
        conn.renew()


#: more parts of the database that count a table's rows, besides the table and its
#: indexes: the full-text index keeps one row per message
_COUNTED_BY = {"messages": ("SELECT count(*) FROM messages_fts_docsize",)}
#: lower bounds on a table's rows, when nothing counts them: threads that messages name
_AT_LEAST = {"threads": ("SELECT count(DISTINCT thread_id) FROM messages INDEXED BY messages_thread",
                         "SELECT count(DISTINCT thread_id) FROM messages NOT INDEXED")}


def counts(conn: Reader | sqlite3.Connection, queries: Sequence[str]) -> list[int]:
    found = []
    for sql in queries:
        try:
            found.append(int(conn.execute(sql).fetchone()[0]))
        except sqlite3.DatabaseError:
            _renew(conn)
    return found


def held(conn: Reader | sqlite3.Connection, table: str) -> int | None:
    """How many rows ``table`` holds, as far as its b-tree, one of its (whole) indexes or
    another part that counts them can still tell (the largest count read); None when
    none can."""
    queries = [f"SELECT count(*) FROM {table} NOT INDEXED"]
    try:
        indexes = conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index' "
                               "AND tbl_name = ?", (table,)).fetchall()
    except sqlite3.DatabaseError:
        _renew(conn)
        indexes = []
    for name, sql in indexes:
        if sql is None or " WHERE " not in sql.upper():  # a partial index counts a part
            queries.append(f'SELECT count(*) FROM {table} INDEXED BY "{name}"')
    found = counts(conn, [*queries, *_COUNTED_BY.get(table, ())])
    return max(found) if found else None


def at_least(conn: Reader | sqlite3.Connection, table: str) -> int:
    return max(counts(conn, _AT_LEAST.get(table, ())), default=0)


def absent(source: Reader, table: str) -> bool:
    """The database never had ``table`` (its schema says so, and can be read)."""
    try:
        return source.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                              (table,)).fetchone() is None
    except sqlite3.DatabaseError:
        source.renew()
        return False


class RowReader:
    """The readable rows of one table of a damaged database, in id order.

    A damaged page fails every read that touches it, so after a failure the next start
    that reads is searched for: doubling steps past it, then bisection back to the
    first id that reads. ``skipped`` counts the ids stepped over (the rows lost, when
    ids are dense as Iris writes them); ``failed``: some read failed (rows may be lost
    past the last one read, too).
    """

    _MAX_ROWID = 2**63 - 1

    def __init__(self, conn: Reader, table: str, columns: Sequence[str]):
        self.conn = conn
        self.sql = (f"SELECT rowid, {', '.join(columns)} FROM {table} "
                    "WHERE rowid > ? ORDER BY rowid")
        self.skipped = 0
        self.failed = False

    def rows(self) -> Iterator[tuple]:
        last, gap_from = -1, None  # from rowid 0: the draft of a chat not begun is key 0
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
                self.failed = True
                self.conn.renew()
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
            self.conn.renew()
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
