"""Encryption at rest: every connection to the database opens here.

:func:`connect` opens a plain database with the standard library's ``sqlite3``, or an
encrypted one (SQLCipher 4, the ``sqlcipher3`` package) when it is given a :class:`Key`:
the key is applied first, before anything else reads the file, and checked at once, so
that a wrong key is :class:`KeyRejected` with nothing written. A passphrase goes through
SQLCipher's own KDF (``PRAGMA key = 'passphrase'``: PBKDF2-HMAC-SHA512, 256,000
iterations, a random salt in the file), a key from the keyring is a raw 256-bit key
(``PRAGMA key = "x'…'"``).

sqlcipher3's exceptions are its own classes, not sqlite3's: an encrypted connection
raises the standard library's (same class name, message, ``sqlite_errorcode`` and
``sqlite_errorname``), so that the rest of Iris catches ``sqlite3.Error`` as before.

:func:`convert` encrypts a plain database in place, or decrypts it, without ever leaving
less than one complete database at ``iris.db``: the converted copy is written beside it
(``iris.db.converting``, ``sqlcipher_export``), verified (opened with its key,
``integrity_check``, the rows of every table counted against the original), synced, and
only then renamed over the original in one atomic step; the original is held under
SQLite's exclusive lock from the export until just before the swap, so that no other
process writes to it meanwhile (one that has it open is a refusal). :func:`tidy` removes what an
interrupted conversion left.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iris_desktop.core.store.errors import StoreError, room_of
from iris_desktop.core.store.heads import head
from iris_desktop.core.store.holders import _words as _held_words  # this thread's own locks
from iris_desktop.core.store.holders import busy, held, holds, lock_file
from iris_desktop.core.store.putback import finish as finish_put_back
from iris_desktop.files import Busy, free_bytes

__all__ = [
    "HEADER", "Key", "KeyChanged", "KeyRejected", "available", "check_key", "connect", "convert",
    "is_encrypted", "replaced_since", "salt", "tidy",
]

#: the first 16 bytes of every plain SQLite database; an encrypted one starts with its salt
HEADER = b"SQLite format 3\x00"
#: the converted copy, beside the database until it replaces it
CONVERTING = ".converting"
#: the original after the swap, overwritten with zeros, then deleted
REPLACED = ".replaced"
#: how long a conversion waits for the database's exclusive lock (another process's
#: short command ends) before it says another process has the history open
LOCK_WAIT_MS = 3000
#: SQLCipher 4's KDF: PBKDF2-HMAC-SHA512 with this many rounds, a 16-byte salt at the
#: start of the file
KDF_ITERATIONS = 256_000
SALT_BYTES = 16
#: an encrypted connection's page cache: each page read from the file is decrypted, so a
#: larger cache than SQLite's 2 MB keeps recall's pages decrypted (bench/recall_cost.py
#: --encrypt: lexical recall on 100k messages 30 → 22 ms, plain 19-21 ms); filled lazily
ENCRYPTED_CACHE_KIB = 64 * 1024
_STRETCH_LOCK = threading.Lock()

try:  # an optional part until encryption is asked for: plain databases never need it
    from sqlcipher3 import dbapi2 as _sqlcipher
except ImportError:  # pragma: no cover - a dependency; said when encryption is asked for
    _sqlcipher = None


def available() -> bool:
    """Whether SQLCipher (the ``sqlcipher3`` package) can be used."""
    return _sqlcipher is not None


class KeyRejected(StoreError):
    """The key does not open the encrypted database (nothing was written to it)."""


class KeyChanged(KeyRejected):
    """The key a start found no longer opens the history: another process put another
    file in its place meanwhile (``iris-desktop rekey``, a put-back), which has another
    salt. Said as that, not as a wrong key or a damaged first page (a start beside a
    rekey said "the file's first page is damaged", and the user might have recovered a
    history that was sound)."""

    def __init__(self, path: Path):
        super().__init__(
            f"another Iris process encrypted {path} again with a new key ('iris-desktop rekey'), "
            "or put another database in its place, while this one was starting; start Iris "
            "again (with the new passphrase, if it was given one); nothing was changed")


def replaced_since(path: Path, seen: bytes | None) -> bool:
    """Whether the encrypted history at ``path`` is another file than the one whose salt
    was ``seen`` (None: not known, never)."""
    return seen is not None and file_salt(path) != seen


@dataclass(frozen=True)
class Key:
    """What opens an encrypted database: a passphrase, or 32 random bytes (kept in the
    keyring). Never printed: its repr names only its kind."""

    kind: str  # "passphrase" or "raw"
    secret: bytes = field(repr=False)
    #: a passphrase's key per database salt, derived once per process (see :meth:`stretched`)
    _stretched: dict[bytes, bytes] = field(default_factory=dict, repr=False, compare=False,
                                           hash=False)
    #: the salt of the history this key was found to open at a start (None: not known): a
    #: file with another salt that it does not open was put in its place since
    #: (:class:`KeyChanged`), not a wrong key
    seen: bytes | None = field(default=None, repr=False, compare=False, hash=False)

    @classmethod
    def passphrase(cls, text: str) -> Key:
        if not text or "\x00" in text:
            raise ValueError("a passphrase must be non-empty text")
        return cls("passphrase", text.encode("utf-8"))

    @classmethod
    def raw(cls, data: bytes) -> Key:
        if len(data) != 32:
            raise ValueError("a raw key has 32 bytes")
        return cls("raw", bytes(data))

    @property
    def what(self) -> str:
        """How the user calls it, for messages."""
        return "the passphrase" if self.kind == "passphrase" else "the key kept in the keyring"

    def stretched(self, salt: bytes) -> bytes:
        """The 256-bit key SQLCipher's KDF makes of this passphrase for a database whose
        salt is ``salt`` (PBKDF2-HMAC-SHA512, 256,000 rounds: its defaults), computed once:
        every later connection gives it as a raw key with the salt, and opens at once."""
        with _STRETCH_LOCK:
            done = self._stretched.get(salt)
        if done is None:
            done = hashlib.pbkdf2_hmac("sha512", self.secret, salt, KDF_ITERATIONS, 32)
            with _STRETCH_LOCK:
                self._stretched[salt] = done
        return done

    def sql(self, salt: bytes | None = None) -> str:
        """The key as an SQL literal for ``PRAGMA key`` (SQLCipher cannot bind it). A
        passphrase with the salt of an existing database: its stretched key and the salt
        (the same key SQLCipher's own KDF derives, without deriving it again)."""
        return f"\"{self.attach_value(salt)}\""

    def attach_value(self, salt: bytes | None = None) -> str:
        """The key as the bound value of ``ATTACH … KEY ?``: always a raw key, never the
        passphrase's text, which SQLCipher would read as a raw key itself when it looks
        like one (``x'<64 hex digits>'``). A passphrase for a new database (no ``salt``
        yet) is stretched with a new random salt, which SQLCipher then writes as the
        file's salt: the same key its own KDF derives from the passphrase and that salt."""
        if self.kind == "raw":
            return f"x'{self.secret.hex()}'"
        salt = salt if salt is not None else secrets.token_bytes(SALT_BYTES)
        return f"x'{self.stretched(salt).hex()}{salt.hex()}'"


def check_place(path: Path) -> None:
    """Raise StoreError, in one sentence that says what to do, when the history's place
    ``path`` holds what no database can be: a folder, a named pipe, a device, a symbolic
    link that loops, a path that cannot be looked at. A missing file is fine (a new
    history). Nothing is opened: a named pipe would wait for a writer (before, a folder
    there was said as a bug in Iris, and a named pipe held every start for ever)."""
    from iris_desktop.files import file_kind

    try:
        kind = file_kind(os.stat(path).st_mode)
    except FileNotFoundError:
        return
    except OSError as exc:
        import errno

        what = ("a symbolic link that loops" if exc.errno == errno.ELOOP else
                f"a place that cannot be read ({exc.strerror or exc})")
        raise StoreError(f"the history {path} is {what}, not a database; move it away and "
                         "start again") from exc
    if kind:
        raise StoreError(f"the history {path} is {kind}, not a database; move it away and "
                         "start again")


def _head(path: Path, size: int) -> bytes:
    """The first ``size`` bytes of ``path``, opened without waiting (a named pipe), and
    without dropping this process's SQLite locks on it (:mod:`.heads`: every encrypted
    connection reads its file's salt here, while the others are open)."""
    return head(path, size)


def file_salt(path: Path) -> bytes | None:
    """The salt an encrypted database starts with; None for a plain, empty or missing
    file (a new database gets its salt from SQLCipher when it is first written)."""
    try:
        head = _head(path, SALT_BYTES)
    except OSError:
        return None
    return head if len(head) == SALT_BYTES and head != HEADER else None


#: the smallest encrypted database: one page of SQLCipher's smallest page size
MIN_ENCRYPTED_BYTES = 512


def is_sqlite(path: Path) -> bool:
    """Whether ``path`` starts as a plain SQLite database does (its 16-byte header)."""
    try:
        return _head(path, len(HEADER)) == HEADER
    except OSError:
        return False


def is_encrypted(path: Path) -> bool | None:
    """None: no database yet (missing or empty); False: a plain SQLite file (a header one
    byte off is a damaged plain file, for the salvage to repair: a random salt is that
    close once in 2^120), or a file no encrypted database can be: shorter than one page,
    or starting with 16 equal bytes (a first page zeroed by a power cut): a damaged plain
    file too (before, such a plain history was called encrypted: every start asked for a
    passphrase never chosen, and the salvage refused it); True: anything else (an
    encrypted database has no header, only its random salt)."""
    try:
        head = _head(path, MIN_ENCRYPTED_BYTES)
    except FileNotFoundError:
        return None
    if not head:
        return None
    if len(head) < MIN_ENCRYPTED_BYTES or len(set(head[:SALT_BYTES])) == 1:
        return False
    return sum(a != b for a, b in zip(head[:len(HEADER)], HEADER, strict=True)) > 1


def _need_sqlcipher() -> Any:
    if _sqlcipher is None:
        raise StoreError("encryption needs the sqlcipher3 package, which is not installed; "
                         "reinstall Iris Desktop, or set storage.encrypt to false")
    return _sqlcipher


def _translated(exc: Exception) -> Exception:
    """sqlcipher3's exception as the standard library's class of the same name."""
    kind = getattr(sqlite3, type(exc).__name__, None)
    if not (isinstance(kind, type) and issubclass(kind, sqlite3.Error)):
        return exc
    new = kind(*exc.args)
    for name in ("sqlite_errorcode", "sqlite_errorname"):
        if hasattr(exc, name):
            setattr(new, name, getattr(exc, name))
    return new


def _guard(method: Callable) -> Callable:
    def guarded(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except _sqlcipher.Error as exc:
            raise _translated(exc) from None

    guarded.__name__ = method.__name__
    return guarded


if _sqlcipher is not None:
    class _Cursor(_sqlcipher.Cursor):
        """A cursor that raises the standard library's exceptions."""

        execute = _guard(_sqlcipher.Cursor.execute)
        executemany = _guard(_sqlcipher.Cursor.executemany)
        executescript = _guard(_sqlcipher.Cursor.executescript)
        fetchone = _guard(_sqlcipher.Cursor.fetchone)
        fetchmany = _guard(_sqlcipher.Cursor.fetchmany)
        fetchall = _guard(_sqlcipher.Cursor.fetchall)
        __next__ = _guard(_sqlcipher.Cursor.__next__)

        def __iter__(self):
            return self

    class _Connection(_sqlcipher.Connection):
        """An encrypted connection that raises the standard library's exceptions."""

        def cursor(self, factory=None):
            try:
                return super().cursor(factory or _Cursor)
            except _sqlcipher.Error as exc:
                raise _translated(exc) from None

        # execute() and friends go through cursor(); the rest raise on their own
        commit = _guard(_sqlcipher.Connection.commit)
        rollback = _guard(_sqlcipher.Connection.rollback)
        close = _guard(_sqlcipher.Connection.close)
        execute = _guard(_sqlcipher.Connection.execute)
        executemany = _guard(_sqlcipher.Connection.executemany)
        executescript = _guard(_sqlcipher.Connection.executescript)

        def __exit__(self, *exc):
            try:
                return super().__exit__(*exc)
            except _sqlcipher.Error as error:
                raise _translated(error) from None

    # SQLCipher logs a rejected key's failed page checks on stderr: the user gets one sentence
    with _sqlcipher.connect(":memory:") as _quiet:
        _quiet.execute("PRAGMA cipher_log_level = NONE")
    _quiet.close()


def connect(database: str | os.PathLike[str], key: Key | None = None, *, path: Path | None = None,
            **kwargs: Any) -> sqlite3.Connection:
    """A connection to ``database`` (a path, or with ``uri=True`` a ``file:`` URI): plain
    sqlite3 without ``key``; SQLCipher with it, the key applied and checked before
    anything else (raises :class:`KeyRejected`, or StoreError for a plain file given a
    key). ``path``: the file, for messages (default ``database``). Other arguments are
    sqlite3.connect's. The only place Iris opens a database."""
    if key is None:
        return sqlite3.connect(database, **kwargs)
    module = _need_sqlcipher()
    where = Path(path if path is not None else database)
    kwargs.setdefault("factory", _Connection)
    try:
        conn = module.connect(database, **kwargs)
    except module.Error as exc:
        raise _translated(exc) from None
    try:
        conn.execute(f"PRAGMA key = {key.sql(file_salt(where))}")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as exc:
        if getattr(exc, "sqlite_errorname", "") == "SQLITE_CORRUPT" and _reads_page_one(conn):
            # page 1 passed its check, so the key is right: the damage is further on (a
            # truncated file), which the check at start and the salvage find and handle,
            # as for a plain file (before, such a history could not be opened at all)
            return conn
        conn.close()
        if getattr(exc, "sqlite_errorname", "") != "SQLITE_NOTADB":
            raise
        if is_encrypted(where) is False:
            raise StoreError(f"{where} is not encrypted, but a key was given to open it; "
                             "nothing was changed") from None
        if replaced_since(where, key.seen):  # (a rekey between a start's key and its opening)
            raise KeyChanged(where) from None
        raise KeyRejected(f"{key.what} does not open the encrypted history at {where}; nothing "
                          "was changed; give the right one (IRIS_STORAGE_PASSPHRASE, or enter "
                          "it when asked); if it is the right one, the file's first page is "
                          "damaged: 'iris-desktop recover' lists copies to put back") from None
    conn.execute(f"PRAGMA cache_size = -{ENCRYPTED_CACHE_KIB}")
    return conn


def _reads_page_one(conn: sqlite3.Connection) -> bool:
    """Whether the first page reads with the key given: the key is right (a wrong one
    fails there, SQLITE_NOTADB), even where the schema cannot be read (pages missing)."""
    try:
        conn.execute("PRAGMA writable_schema = ON")  # a file shorter than its header says
        conn.execute("PRAGMA page_count").fetchone()
        conn.execute("PRAGMA writable_schema = OFF")
        return True
    except sqlite3.DatabaseError:
        return False


def check_key(path: Path, key: Key) -> None:
    """Raise :class:`KeyRejected` unless ``key`` opens the encrypted database at ``path``;
    read-only (immutable without a -wal), so nothing at all is written."""
    mode = "ro" if _sibling(path, "-wal").exists() else "ro&immutable=1"
    try:
        connect(f"{path.resolve().as_uri()}?mode={mode}", key, uri=True, path=path).close()
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open the encrypted history at {path} ({exc}); nothing was "
                         "changed") from None


def salt(conn: sqlite3.Connection) -> bytes:
    """The random salt of an encrypted connection's database (b"" for a plain one)."""
    try:
        row = conn.execute("PRAGMA cipher_salt").fetchone()
    except sqlite3.Error:
        return b""
    return bytes.fromhex(row[0]) if row and row[0] else b""


def _sibling(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(folder: Path) -> None:
    if os.name != "posix":
        return
    _fsync(folder)


def _shred(path: Path) -> None:
    """Overwrite a file with zeros, sync, delete it (the original of a conversion: on a
    copy-on-write file system or an SSD its old blocks may still survive)."""
    try:
        size = path.stat().st_size
        with open(path, "r+b") as handle:
            chunk = b"\0" * (1 << 20)
            left = size
            while left > 0:
                handle.write(chunk[:min(left, len(chunk))])
                left -= len(chunk)
            handle.flush()
            os.fsync(handle.fileno())
    except FileNotFoundError:
        return
    path.unlink(missing_ok=True)


def _conversion_lock(path: Path) -> Path:
    """The file whose lock a conversion of ``path`` holds (hidden, beside it, empty)."""
    return lock_file(path)


@contextmanager
def conversion_locked(path: Path, word: str) -> Iterator[None]:
    """Hold the conversion lock of ``path`` for the block, without waiting, saying
    ``word`` (what this process does: :data:`~.holders.DOING`): this thread's own when
    it holds it already (:func:`no_conversion`, around a start's opening). Raises Busy
    when another process (or thread) holds it, OSError when the lock file cannot be
    made."""
    with held(Path(path), word):
        yield


#: how long a start waits for the conversion lock: another process's opening holds it a
#: moment; a conversion holds it longer, and is said instead
CONVERSION_WAIT_S = 5.0


@contextmanager
def no_conversion(path: Path, wait_s: float | None = None, word: str = "opening",
                  then: str = "start Iris again when it is done") -> Iterator[None]:
    """Hold the conversion lock of ``path`` for the block, saying ``word`` (what this
    process does: :data:`~.holders.DOING`; this thread's own lock when it holds it
    already): none can start until the block ends, and one another process is running
    (it holds the lock from its start to its swap) is said, with what it is doing, and
    ``then`` (what to do), after waiting ``wait_s`` (default :data:`CONVERSION_WAIT_S`)
    for a lock another process's opening holds. Around the opening of the database, so
    that a conversion finds this process's connection (its -wal) and refuses, instead of
    swapping a new file over the writes it makes (a second process whose setting said
    nothing imported into the old file during an encryption, and its chats were lost
    with it)."""
    deadline = time.monotonic() + (CONVERSION_WAIT_S if wait_s is None else wait_s)
    while True:
        entered = False
        try:
            with held(Path(path), word):
                entered = True
                yield
            return
        except Busy:
            if entered:  # the block's own
                raise
            if time.monotonic() > deadline:
                # said as what the holder does (before, always "converting": also beside a
                # put-back or a salvage)
                raise StoreError(busy(Path(path), f"{then}; nothing was changed")) from None
            time.sleep(0.2)


def tidy(path: Path) -> None:
    """Remove what an interrupted :func:`convert` left beside ``path``: a converted copy
    never renamed (the original is still whole at ``path``), an original not yet
    shredded (the converted copy is already at ``path``); and finish a put-back a kill
    cut off (:func:`~iris_desktop.core.store.putback.finish`: before the key is decided,
    which reads the file). Nothing while another process converts it or puts a database
    back (it holds the conversion lock): those files are its work. Raises StoreError
    when a put-back cannot be finished."""
    try:
        with held(Path(path), "tidying"):
            _tidy(Path(path))
            finish_put_back(Path(path))
    except Busy:
        return


def _tidy(path: Path) -> None:
    """:func:`tidy`, with the conversion lock held."""
    for suffix in ("", "-journal", "-wal", "-shm"):
        _sibling(path, CONVERTING + suffix).unlink(missing_ok=True)
    old = _sibling(path, REPLACED)
    try:
        same = old.exists() and path.exists() and os.path.samefile(old, path)
    except OSError:
        same = False
    if same:  # stopped before the rename: only a second name of the database itself
        old.unlink(missing_ok=True)
    else:
        _shred(old)


def _create_private(path: Path) -> None:
    """An empty file, 0600 on POSIX, for SQLite to fill (it keeps the mode)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    os.close(fd)


def _tables(conn: sqlite3.Connection, schema: str = "main") -> list[str]:
    return [row[0] for row in conn.execute(
        f"SELECT name FROM {schema}.sqlite_master WHERE type = 'table' ORDER BY name")]


def _counts(conn: sqlite3.Connection, schema: str = "main") -> dict[str, int]:
    return {table: conn.execute(f'SELECT count(*) FROM {schema}."{table}"').fetchone()[0]
            for table in _tables(conn, schema)}


def convert(path: Path, source: Key | None, target: Key | None,
            step: Callable[[str], None] | None = None, then: str | None = None) -> dict[str, int]:
    """Rewrite the database at ``path`` from ``source``'s encryption (None: plain) to
    ``target``'s, in place; returns the rows per table. ``step(name)`` is called after
    each stage ("exported", "verified", "synced", "swapped"), so a test can stop there.
    ``then``: what to do after a failure (a full disk, another process), as the
    refusal says it; default :func:`next_step` (a start's, or a rekey's).

    At every moment one complete database is at ``path``: the copy is made beside it,
    checked, synced, then renamed over it atomically (the original is overwritten with
    zeros and deleted afterwards). Raises StoreError (KeyRejected for a wrong key), with
    the original unchanged, when something fails before the rename."""
    path = Path(path)
    then = then or next_step(path)
    if holds(path):  # (a put-back, a rekey: its own word stays said)
        return _convert(path, source, target, step, then)
    try:
        with held(path, "converting"):
            return _convert(path, source, target, step, then)
    except Busy:
        raise StoreError(busy(path, "wait for it to finish, then start Iris again",
                              why="storage.encrypt changed")) from None


#: what to do after a conversion failed, by what this thread holds the conversion lock for
#: (a conversion at a start holds none, or "opening")
NEXT_STEPS = {"rekeying": "run 'iris-desktop rekey' again"}


def next_step(path: Path) -> str:
    """What the user does to retry a conversion of ``path`` that failed: run the command
    that is converting it again (a rekey), or start Iris again (``storage.encrypt``
    changed: the start converts)."""
    words = _held_words().get(os.path.abspath(lock_file(Path(path))), [])
    return next((NEXT_STEPS[w] for w in reversed(words) if w in NEXT_STEPS),
                "start Iris again to convert the database")


def _convert(path: Path, source: Key | None, target: Key | None,
             step: Callable[[str], None] | None, then: str) -> dict[str, int]:
    """:func:`convert`, with the conversion lock held."""
    module = _need_sqlcipher()
    _tidy(path)
    copy = _sibling(path, CONVERTING)
    step = step or (lambda name: None)
    # the source through SQLCipher even when plain: sqlcipher_export is SQLCipher's
    if source is not None:
        conn = connect(path, source, isolation_level=None)
    else:
        conn = module.connect(path, isolation_level=None, factory=_Connection)
    try:
        before, version = _export(conn, path, copy, target, then)
        step("exported")
        rows = _verify(path, copy, target, before, version)
        step("verified")
    except BaseException:
        conn.close()
        _tidy(path)
        raise
    conn.close()  # the last connection: its -wal and -shm go with it
    if any(_sibling(path, side).exists() for side in ("-wal", "-shm")):
        _tidy(path)
        raise StoreError(f"another Iris process has {path} open; close it, then {then}")
    _fsync(copy)
    _fsync_dir(path.parent)
    step("synced")
    _swap(path, copy)
    step("swapped")
    _shred(_sibling(path, REPLACED))
    return rows


def _export(conn: sqlite3.Connection, path: Path, copy: Path, target: Key | None, then: str
            ) -> tuple[dict[str, int], int]:
    """Write the converted copy (``sqlcipher_export``) with the source's rows counted in
    the same transaction; (counts, user_version). The source is taken in SQLite's
    exclusive locking mode first, and that lock is kept until the connection closes,
    just before the swap: no other connection can read or write it meanwhile, and one
    another process holds open (even idle: in WAL mode it keeps a shared lock) is a
    refusal. Before, a commit another process made after the export landed in the
    original only, and the swap lost it when that process closed first."""
    _create_private(copy)
    try:
        conn.execute("PRAGMA busy_timeout = 10000")
        # everything in the WAL into the file, so that no -wal survives the close
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("ATTACH DATABASE ? AS converted KEY ?",
                     (str(copy), target.attach_value() if target else ""))
        # the copy gives a deleted chat's space back to the disk as a new history does
        # (sqlcipher_export made it with auto_vacuum off: deletes then left their pages)
        conn.execute("PRAGMA converted.auto_vacuum = INCREMENTAL")
        _take_alone(conn, path, then)
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            conn.execute("SELECT sqlcipher_export('converted')")
            conn.execute(f"PRAGMA converted.user_version = {int(version)}")
            before = _counts(conn)
        except BaseException:
            if conn.in_transaction:  # a full disk rolls the transaction back itself
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        conn.execute("DETACH DATABASE converted")
    except sqlite3.Error as exc:
        name = getattr(exc, "sqlite_errorname", "") or ""
        if name.startswith("SQLITE_FULL") or free_bytes(path.parent) == 0 or (
                name.startswith("SQLITE_IOERR") and (free_bytes(path.parent) or 0) < 1 << 20):
            raise StoreError(f"the disk holding {path} is full: converting it needs room for a "
                             f"second copy of the history (about {room_of(path)}); it was not "
                             f"changed; free some space, then {then}") from None
        raise StoreError(f"converting {path} failed ({exc}); it was not changed") from None
    return before, version


def _take_alone(conn: sqlite3.Connection, path: Path, then: str) -> None:
    """Begin the export's transaction holding the source's exclusive lock, which the
    connection keeps until it closes (``locking_mode = EXCLUSIVE``); StoreError when
    another connection has the database open after :data:`LOCK_WAIT_MS`."""
    conn.execute("PRAGMA locking_mode = EXCLUSIVE")
    conn.execute(f"PRAGMA busy_timeout = {LOCK_WAIT_MS}")
    try:
        conn.execute("BEGIN EXCLUSIVE")
    except sqlite3.OperationalError as exc:
        if not (getattr(exc, "sqlite_errorname", "") or "").startswith("SQLITE_BUSY"):
            raise
        raise StoreError(f"another Iris process has {path} open; close it, then {then}") from None


def _verify(path: Path, copy: Path, target: Key | None, before: dict[str, int], version: int
            ) -> dict[str, int]:
    """Open the copy with its key: integrity_check, the same rows in every table, the
    same schema version; raises StoreError otherwise."""
    try:
        check = connect(copy, target, path=copy)
        try:
            ok = check.execute("PRAGMA integrity_check").fetchone()[0]
            after = _counts(check)
            copied = check.execute("PRAGMA user_version").fetchone()[0]
        finally:
            check.close()
    except sqlite3.Error as exc:
        raise StoreError(f"the converted copy of {path} cannot be read ({exc}); it was not "
                         "changed") from None
    if ok != "ok" or after != before or copied != version:
        raise StoreError(f"the converted copy of {path} does not match it ({ok}); it was not "
                         "changed")
    return after


def _swap(path: Path, copy: Path) -> None:
    """Rename the copy over the database in one step; the original keeps a second name
    (``iris.db.replaced``) until it is shredded."""
    try:
        os.link(path, _sibling(path, REPLACED))
    except OSError:  # no hard links here: the original is only unlinked
        pass
    os.replace(copy, path)
    _fsync_dir(path.parent)
