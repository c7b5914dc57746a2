"""The SQLite store: threads, messages, summaries, compaction events, requests and
message vectors. SQL belongs here only: the rest of Iris calls the Store's methods.

Messages are append-only. Pruning and compaction never modify or delete them; a summary
only records which messages it covers. The one exception is a reply that is still being
streamed: its row is updated with the partial text until it is complete.

One file, WAL mode, ``synchronous=FULL`` and a busy timeout, so that the GUI and the CLI
can use one data dir at once. The files are created 0600 on POSIX. A sqlite3 connection
belongs to the thread that uses it: :class:`Stores` holds one Store per thread.

Damage: :func:`open_store` (what the app and the CLI open through) looks at the header
and runs ``PRAGMA quick_check`` first, on a read-only connection; only damage to the file
itself counts (a full disk or a short -shm is an error that says so). A damaged file is
never written: what can still be read is salvaged, row by row, into a new database
beside it, and once that is complete the original is set aside as
``iris.db.corrupt-<time>`` with its ``-wal`` and ``-shm`` (:class:`Recovery` says what
was recovered and lost); a salvage that cannot finish leaves the original in place.

The parts: :mod:`.schema` (the migrations), :mod:`.rows` (row types and conversion),
:mod:`.recovery` (the quick check and salvage), and the Store's own parts,
:mod:`.messages` (threads and messages), :mod:`.pages` (a page of a branch),
:mod:`.search` (recall's queries), :mod:`.summaries` (summaries, compaction, requests)
and :mod:`.vectors`.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import sqlite_utils

from iris_desktop.core.store import putback
from iris_desktop.core.store.base import _alive as _alive
from iris_desktop.core.store.cipher import Key as Key
from iris_desktop.core.store.cipher import KeyRejected as KeyRejected
from iris_desktop.core.store.cipher import connect
from iris_desktop.core.store.errors import DamagedDatabase, StoreError, ThreadBusy, ThreadGone
from iris_desktop.core.store.pages import Pages
from iris_desktop.core.store.recovery import (
    QUICK_CHECK_S,
    SALVAGED_TABLES,
    Recovery,
    _sidecar,
    acknowledge,
    explain,
    quick_check,
    remove_stale_work,
    salvage,
)
from iris_desktop.core.store.rows import (
    MAX_BYTES_PER_TOKEN,
    ROLES,
    TIMESTAMP_KEYS,
    MessageMeta,
    SummaryRow,
    decode_text,
    in_flight,
    iso_timestamp,
    min_tokens,
    now_iso,
    row_to_message,
    sent_at_of,
    utf8_length,
)
from iris_desktop.core.store.rows import _message_row as _message_row
from iris_desktop.core.store.schema import MIGRATIONS, SCHEMA_VERSION, _split_sql
from iris_desktop.core.store.search import Search
from iris_desktop.core.store.summaries import Summaries
from iris_desktop.core.store.vectors import Vectors
from iris_desktop.paths import DataDirError, make_private_dir

__all__ = [
    "BUSY_TIMEOUT_S", "MAX_BYTES_PER_TOKEN", "MIGRATIONS", "QUICK_CHECK_S", "ROLES", "SALVAGED_TABLES",
    "SCHEMA_VERSION", "TIMESTAMP_KEYS", "DamagedDatabase", "MessageMeta", "Recovery", "Store", "StoreError",
    "Stores", "SummaryRow", "ThreadBusy", "ThreadGone", "explain", "in_flight", "iso_timestamp",
    "min_tokens", "now_iso", "open_store", "open_stores", "quick_check", "row_to_message", "salvage",
    "sent_at_of", "utf8_length",
]

#: how long a write waits for another process's write to finish
BUSY_TIMEOUT_S = 10.0


def _create_private(path: Path) -> None:
    """Create the DB file 0600 before SQLite does; SQLite gives -wal/-shm the same mode."""
    if os.name == "posix" and not path.exists():
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.close(fd)


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


class Store(Pages, Search, Summaries, Vectors):
    """One connection to the database, used by one thread at a time.

    Threads that work concurrently (the GUI and its workers) each have their own Store,
    from the process's :class:`Stores`.
    """

    def __init__(self, path: str | os.PathLike[str], *, check: bool = False, key: Key | None = None):
        """Open (or create) the database. ``check``: run PRAGMA quick_check first and
        raise DamagedDatabase, before anything is written, when it finds damage.
        ``key``: the database is encrypted (SQLCipher) with it (KeyRejected if wrong)."""
        self.path = Path(path)
        self.key = key
        #: the last thread_speakers answer, with what it depends on
        self._speakers: tuple[tuple, list[str]] | None = None
        try:
            make_private_dir(self.path.parent)
        except DataDirError as exc:
            raise StoreError(str(exc)) from None
        _check_writable(self.path)
        if check:
            problems = quick_check(self.path, key=key)
            if problems:
                raise DamagedDatabase(self.path, problems)
        _create_private(self.path)
        try:
            # handed between threads (a CLI turn runs on a worker) but used by one at a time
            conn = connect(
                self.path, key, isolation_level=None, timeout=BUSY_TIMEOUT_S, check_same_thread=False
            )
            conn.text_factory = decode_text  # a flipped byte in one message fails no query
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            _check_is_iris(conn, self.path)  # before anything is written to it
            if conn.execute("PRAGMA page_count").fetchone()[0] == 0:
                # a new file: a deleted chat's pages go back to the disk (``reclaim``);
                # it can only be chosen before the first page is written
                conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
            mode = _wal(conn)
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA foreign_keys = ON")
            # what is deleted or replaced is overwritten with zeros, not left in free space
            # (a deleted chat, a streaming reply's earlier partial texts)
            conn.execute("PRAGMA secure_delete = ON")
        except sqlite3.DatabaseError as exc:
            raise StoreError(explain(exc, self.path)) from exc
        if mode.lower() != "wal":
            raise StoreError(f"{self.path}: could not switch to WAL mode (got {mode})")
        self.conn = conn
        self.db = sqlite_utils.Database(conn)
        self._migrate()
        self.wipe_left()  # a deleted chat's pages a reader kept in the file then

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
                # read again under the write lock: another process opening the same new
                # file at the same moment may have applied this step while this one waited
                if self.conn.execute("PRAGMA user_version").fetchone()[0] > number:
                    continue
                for statement in _split_sql(MIGRATIONS[number]):
                    self.conn.execute(statement)
                self.conn.execute(f"PRAGMA user_version = {number + 1}")

    def integrity_check(self) -> str:
        return self.conn.execute("PRAGMA integrity_check").fetchone()[0]

    @property
    def schema_version(self) -> int:
        return self.conn.execute("PRAGMA user_version").fetchone()[0]


def _check_is_iris(conn: sqlite3.Connection, path: Path) -> None:
    """StoreError when the database holds tables and not Iris's: another app's SQLite
    file where the history should be. It is left exactly as it is (an audit: Iris added
    its tables beside a browser's and switched the file to WAL, even where it refused it
    afterwards as "newer than this Iris")."""
    names = {row[0] for row in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")}
    if names and not {"threads", "messages"} <= names:
        shown = ", ".join(sorted(names)[:3]) + (", …" if len(names) > 3 else "")
        raise StoreError(f"{path} is not an Iris history: it holds other tables ({shown}), "
                         "another app's database perhaps; Iris left it as it is. Move it "
                         "elsewhere, or choose another data folder")


def _wal(conn: sqlite3.Connection) -> str:
    """Switch to WAL mode; the journal mode it is in. The switch on a new file takes a lock
    SQLite does not wait for (no busy handler): another process creating the same file at
    that moment makes it "database is locked" at once, so it is tried again, for as long
    as a busy write is waited for."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            return conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


@dataclass(frozen=True)
class PutBackFinished(Recovery):
    """A put-back (``iris-desktop recover NAME``) cut off by a kill, finished (or undone)
    at this start (:mod:`.putback`): :meth:`describe` says which, in one sentence;
    ``set_aside`` is where the history it replaced is now."""

    note: str = ""
    #: the window's box's title: finished, or not (before: "recovered a damaged database")
    heading: str = ""

    @property
    def title(self) -> str:
        return self.heading

    def describe(self) -> str:
        return self.note


def told_put_back(path: Path) -> PutBackFinished | None:
    """What this start did to a put-back cut off, said once: the journal goes, and the
    history it replaced counts as shown (as after a put-back that was not cut off)."""
    found = putback.note(path)
    if found is None:
        return None
    putback.forget(path)
    acknowledge(path, [found.replaced])
    return PutBackFinished(path, found.replaced, [found.replaced], [], {}, {}, note=found.text,
                           heading=found.title)


def open_store(path: str | os.PathLike[str], key: Key | None = None) -> tuple[Store, Recovery | None]:
    """Open the database after a quick check. A damaged one is never written: it is set
    aside and salvaged into a new file, and the Recovery says what was saved. ``key``:
    it is encrypted with it. Work files a killed recovery left beside it go first, and a
    put-back a kill cut off is finished (a :class:`PutBackFinished` says so, once)."""
    remove_stale_work(Path(path))
    try:
        store = Store(path, check=True, key=key)
    except DamagedDatabase as exc:
        damage = exc
    else:
        return store, told_put_back(Path(path))
    try:
        recovery = salvage(damage.path, damage.problems, key=key)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(f"{damage}; recovering it failed ({exc}); Iris did not write to it; "
                         "'iris-desktop recover' lists what was set aside") from None
    return Store(path, key=key), recovery


class Stores:
    """The process's connections to one database file: one Store per thread, opened on
    the thread's first use (a sqlite3 connection belongs to the thread that uses it).
    Thread-safe. A thread that ends should :meth:`release` its Store: thread ids are
    reused, and the next thread given its id would get the Store it left open."""

    def __init__(self, path: str | os.PathLike[str], key: Key | None = None):
        self.path = Path(path)
        self.key = key  # every Store opened here is opened with it
        self._lock = threading.Lock()
        self._stores: dict[int, Store] = {}  # by threading.get_ident()

    def current(self) -> Store:
        """The calling thread's Store, opened (without a quick check) on its first use,
        the same object on every later call. Raises StoreError as Store() does."""
        key = threading.get_ident()
        with self._lock:
            store = self._stores.get(key)
            if store is None:
                store = self._stores[key] = Store(self.path, key=self.key)
        return store

    def release(self) -> None:
        """Close and forget the calling thread's Store (a worker thread calls this as it
        ends); nothing when it has none. Other threads' Stores are left open."""
        with self._lock:
            store = self._stores.pop(threading.get_ident(), None)
        if store is not None:
            store.close()

    def close(self) -> None:
        """Close every Store opened here, of every thread: at the end of the process,
        once the other threads are done with theirs. Idempotent; a later
        :meth:`current` opens a new Store."""
        with self._lock:
            stores, self._stores = list(self._stores.values()), {}
        for store in stores:
            store.close()


def open_stores(path: str | os.PathLike[str], key: Key | None = None) -> tuple[Stores, Recovery | None]:
    """:func:`open_store` for the process: the quick check (and salvage of a damaged
    file) runs once, here, and the calling thread's Store of the returned Stores is the
    one it opened."""
    store, recovery = open_store(path, key)
    stores = Stores(path, key)
    stores._stores[threading.get_ident()] = store
    return stores, recovery
