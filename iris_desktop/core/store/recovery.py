"""Damage: the quick check at open, salvaging what a damaged file still holds, and the
databases set aside.

:func:`~iris_desktop.core.store.open_store` looks at the file's header and runs ``PRAGMA
quick_check``, on a read-only connection. Only damage to the database file counts: a
full disk, a lock or a leftover (even a 3-byte) ``-shm`` or ``-wal`` is an error that
says what to do, never a reason to set a healthy file aside. A damaged file is never
written: what can still be read is copied, row by row, into a new database beside it,
counted against what the original held (:class:`Recovery` says what was lost, or that
it cannot be told), and only once that copy is complete and checked is the original set
aside as ``iris.db.corrupt-<time>`` (with its ``-wal`` and ``-shm``) and the copy put in
its place. A salvage that cannot finish (a full disk) or reads no row leaves the
original where it is, under its own name.

Set-aside databases are announced until the user has seen them (:func:`unacknowledged`,
``iris-desktop recover`` lists them) and can be put back (:func:`restore`: the current
database is set aside first, never deleted).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from iris_desktop.core.store import putback
from iris_desktop.core.store.base import _exists
from iris_desktop.core.store.branches import rebuild_paths
from iris_desktop.core.store.cipher import Key, _conversion_lock, connect, conversion_locked, convert, no_conversion
from iris_desktop.core.store.errors import FULL_DISK_BYTES as FULL_DISK_BYTES
from iris_desktop.core.store.errors import StoreError, disk_full, room_of
from iris_desktop.core.store.heads import head as first_bytes
from iris_desktop.core.store.holders import InUse as _InUse
from iris_desktop.core.store.holders import refuse_if_in_use as _refuse_if_in_use
from iris_desktop.core.store.salvage_read import Reader, RowReader, read_only
from iris_desktop.core.store.salvage_read import absent as _absent
from iris_desktop.core.store.salvage_read import at_least as _at_least
from iris_desktop.core.store.salvage_read import held as _held
from iris_desktop.files import Busy, fsync_dir

log = logging.getLogger("iris.store")

#: the longest the quick check may take at open (about 0.35 s per 200 MB, warm cache);
#: a larger database is checked this far and then opened
QUICK_CHECK_S = 3.0
#: the tables a damaged database is salvaged from, parents first (token_counts and
#: message_vectors are caches and streams is rebuilt at start, so none is copied)
SALVAGED_TABLES = ("threads", "messages", "summaries", "compaction_events", "requests", "drafts")


def _sidecar(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def explain(exc: sqlite3.Error, path: Path) -> str:
    """One sentence for a database error: what happened and what to do. It says that a
    restart recovers a damaged file only when the start-up check would find the damage."""
    name = getattr(exc, "sqlite_errorname", None) or ""
    if name.startswith("SQLITE_FULL") or (name.startswith("SQLITE_IOERR") and disk_full(path)):
        return (f"the disk holding {path} is full; nothing more was written; free some space, "
                "then try again")
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return f"another Iris process is writing to {path}; close it or wait, then try again"
    header = header_problems(path) if name.startswith(("SQLITE_READONLY", "SQLITE_NOTADB",
                                                       "SQLITE_ERROR")) else []
    if header:
        return (f"{path} is damaged: {header[0]}; nothing was changed; start Iris again: it "
                "sets the file aside and copies what can be read into a new database")
    if name.startswith("SQLITE_READONLY"):
        return (f"{path} cannot be written ({exc}); make its folder and its iris.db files "
                "writable, or choose another --data-dir (or IRIS_HOME)")
    if name == "SQLITE_NOTADB":
        return (f"{path} is not an Iris database ({exc}); nothing was changed; move it away "
                "or choose another --data-dir (or IRIS_HOME)")
    if name.startswith("SQLITE_CONSTRAINT_FOREIGNKEY") or "FOREIGN KEY constraint" in str(exc):
        return ("the chat this was written to was deleted meanwhile (by another Iris window "
                "or process); nothing of it was kept, and the rest of the history is as it was")
    if name.startswith("SQLITE_TOOBIG") or "too many levels of trigger recursion" in str(exc):
        return (f"the change is too large for one step of the database ({exc}); nothing was "
                f"changed in {path}; please report this")
    if name.startswith("SQLITE_CORRUPT") or "decode" in str(exc):
        if _check_finds_damage(path):
            return (f"{path} is damaged ({exc}); nothing more was written; start Iris again: "
                    "it checks the database and recovers what can be read")
        return (f"{path} is damaged where the start-up check does not look ({exc}); nothing "
                "more was written; run 'iris-desktop recover --salvage' to copy what can be "
                "read into a new database (the damaged file is kept)")
    return (f"cannot use the database {path} ({exc}); check that its folder is writable "
            "and the disk is not full")


def _check_finds_damage(path: Path) -> bool:
    """Whether the quick check at the next start would find damage in ``path``."""
    try:
        return bool(quick_check(path))
    except StoreError:
        return False


#: the first 16 bytes of every (plain) SQLite database
MAGIC = b"SQLite format 3\x00"


def header_problems(path: Path) -> list[str]:
    """What is wrong in the file's 100-byte header, in the fields SQLite checks before it
    reads anything ([] when sound, and for a file that is not an SQLite database at all,
    an encrypted one included). Such damage makes SQLite call a file read-only, or not a
    database, though every row may still be there. Only fields that hold the same values
    in every sound file are checked: the header in the file may be older than the one in
    the -wal."""
    try:  # (never opened and closed: that drops this process's locks on it, :mod:`.heads`)
        head = first_bytes(path, 100)
    except OSError:
        return []
    zeroed = len(set(head[:16])) == 1  # a first page a power cut zeroed: still SQLite's
    if len(head) < 100 or (sum(a != b for a, b in zip(head, MAGIC, strict=False)) > 1
                           and not zeroed):
        return []
    found = []
    if head[:16] != MAGIC:
        found.append("its first 16 bytes no longer read 'SQLite format 3'")
    page = int.from_bytes(head[16:18], "big")
    if not (page == 1 or (512 <= page <= 32768 and page & (page - 1) == 0)):
        found.append(f"bytes 16-17 (the page size) read {page}")
    for offset, what in ((18, "the write version"), (19, "the read version")):
        if head[offset] not in (1, 2):
            found.append(f"byte {offset} ({what}) is {head[offset]}, where SQLite writes 1 or 2")
    if head[21:24] != b"\x40\x20\x20":
        found.append(f"bytes 21-23 (payload fractions) read {', '.join(str(b) for b in head[21:24])}")
    schema_format = int.from_bytes(head[44:48], "big")
    if schema_format > 4:  # 0 in a new file whose schema is still only in its -wal
        found.append(f"bytes 44-47 (the schema format) read {schema_format}")
    if not found:
        return []
    return [f"its header (the first 100 bytes) is damaged: {'; '.join(found)}"]


def _repaired_header(head: bytes, page_size: int) -> bytes:
    """``head`` with the fields :func:`header_problems` checks set to sound values."""
    fixed = bytearray(head)
    fixed[:16] = MAGIC
    fixed[16:18] = (1 if page_size == 65536 else page_size).to_bytes(2, "big")
    for offset in (18, 19):
        if fixed[offset] not in (1, 2):
            fixed[offset] = 2  # Iris keeps its database in WAL mode
    fixed[21:24] = b"\x40\x20\x20"
    if int.from_bytes(fixed[44:48], "big") > 4:
        fixed[44:48] = (4).to_bytes(4, "big")
    return bytes(fixed)


def quick_check(path: Path, budget_s: float | None = None, key: Key | None = None) -> list[str]:
    """PRAGMA quick_check's findings for the file ([] when sound, or when it stops
    after ``budget_s`` on a large file), read through :func:`_read_only`, after a look
    at its header (:func:`header_problems`). Only damage to the database file itself
    counts: an error that is not (a full disk, a leftover or short -shm or -wal that
    cannot be used now, a lock) raises StoreError saying what to do, as does a file
    that is not a database at all."""
    if not path.exists() or path.stat().st_size == 0:
        return []
    if key is None:
        header = header_problems(path)
        if header:
            return header
    seconds = QUICK_CHECK_S if budget_s is None else budget_s
    try:
        conn = read_only(path, key)
    except sqlite3.DatabaseError as exc:
        raise StoreError(explain(exc, path)) from None
    try:
        with _deadline(conn, seconds):
            rows = conn.execute("PRAGMA quick_check(20)").fetchall()
    except sqlite3.DatabaseError as exc:
        if getattr(exc, "sqlite_errorname", "") == "SQLITE_INTERRUPT":
            log.warning("%s: quick check stopped after %.1f s; opened unchecked", path, seconds)
            return []
        name = getattr(exc, "sqlite_errorname", "")
        # a check that writes nothing meets "string or blob too big" only where a damaged
        # record gives a size no row has: damage (it was "please report this")
        if name.startswith("SQLITE_CORRUPT") or name == "SQLITE_TOOBIG":
            return [str(exc)]
        raise StoreError(explain(exc, path)) from None
    except UnicodeDecodeError:
        # SQLite's own message quoted bytes that are not text: a damaged schema record
        # (the statement could not even be prepared), not a question of decoding rows
        return ["the database's schema is damaged (its text is not readable)"]
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
    #: rows that could not be read, per table: exactly ``held - recovered`` where the
    #: original still counts its rows, at least this many where only a lower bound is
    #: known (``held`` None), None where nothing tells how many were lost
    lost: dict[str, int | None]
    #: rows the original held, per table, where some part of it still counts them (the
    #: table's own b-tree, one of its indexes, the full-text index); None: nothing does
    held: dict[str, int | None] = field(default_factory=dict)
    #: threads made up ("Recovered chat <id>") for messages whose thread row was lost
    recreated: int = 0

    @property
    def title(self) -> str:
        """What happened, in the few words of the title of the box the window says
        :meth:`describe` in (before, every Recovery was "recovered a damaged database")."""
        if self.problems == [SALVAGE_ASKED]:
            return "Iris Desktop copied the database row by row"
        return "Iris Desktop recovered a damaged database"

    def describe(self) -> str:
        """What happened, where the original is, what was recovered and what was lost (as
        far as it can be told), for the user."""
        parts = [f"{self.recovered.get(t, 0):,} {rows_in_words(t, self.recovered.get(t, 0))}"
                 for t in SALVAGED_TABLES]
        sides = [p.name.rsplit("-", 1)[-1] for p in self.moved if p != self.set_aside]
        with_sides = f" (with its {' and '.join('-' + s for s in sides)})" if sides else ""
        recreated = (f"; {self.recreated:,} {rows_in_words('threads', self.recreated)} whose title was "
                     f"lost {'is' if self.recreated == 1 else 'are'} named 'Recovered chat <id>'"
                     if self.recreated else "")
        why = f"was damaged ({first_problem(self.problems)})"
        if self.problems == [SALVAGE_ASKED]:  # a healthy database may be salvaged on request
            why = "was copied row by row, as asked ('iris-desktop recover --salvage')"
        return (f"The database {self.path} {why}. Iris did not write to it: it is set aside, "
                f"unchanged, as {self.set_aside}"
                f"{with_sides}; 'iris-desktop recover' lists it and can put it back. "
                f"Recovered into a new database: {', '.join(parts)}{recreated}"
                f"{self.losses()}.")

    def losses(self) -> str:
        """"; no row was lost", or how many rows of which tables could not be read, and
        which tables' losses cannot be told."""
        known, unknown, total = [], [], 0
        for table in SALVAGED_TABLES:
            lost, held = self.lost.get(table, 0), self.held.get(table)
            if lost is None:
                unknown.append(rows_in_words(table))
            elif lost:
                total += lost
                known.append(f"{lost:,} of {held:,} {rows_in_words(table, held)}" if held is not None
                             else f"at least {lost:,} {rows_in_words(table, lost)}")
        if not known and not unknown:
            return "; no row was lost"
        text = (f"; {total:,} {'row' if total == 1 else 'rows'} could not be read ({', '.join(known)})"
                if known else "")
        if unknown:
            text += (f"; how many {' and '.join(unknown)} were lost cannot be told (what "
                     "counted them is damaged too)")
        return text


_ONE = {"threads": "thread", "messages": "message", "summaries": "summary",
        "compaction_events": "compaction event", "requests": "request", "drafts": "draft"}


#: the reason a salvage gives when the user asked for one (the database may be healthy)
SALVAGE_ASKED = "salvage asked for with 'iris-desktop recover --salvage'"


def rows_in_words(table: str, count: int | None = None) -> str:
    """A table's rows in words: "threads", or "1 thread" with a ``count`` of one."""
    return _ONE.get(table, table) if count == 1 else table.replace("_", " ")


def first_problem(problems: Sequence[str]) -> str:
    """The first line of the first finding that says something (quick_check's output
    starts with a line naming the schema)."""
    for problem in problems:
        for line in str(problem).splitlines():
            if line.strip() and not line.startswith("***"):
                return line.strip()
    return "damaged"


#: how set-aside databases are named: ``<db>.corrupt-<time>`` (found damaged at start)
#: and ``<db>.before-restore-<time>`` (the database a restore replaced)
ASIDE_MARKS = (".corrupt-", ".before-restore-")


def _aside_name(path: Path, mark: str) -> Path:
    """A free name to set ``path`` aside as: ``<db><mark><time>``."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    aside = path.with_name(f"{path.name}{mark}{stamp}")
    n = 1
    while any(_sidecar(aside, s).exists() for s in ("", "-wal", "-shm")):
        n += 1
        aside = path.with_name(f"{path.name}{mark}{stamp}-{n}")
    return aside


def _set_aside(path: Path, mark: str = ".corrupt-", aside: Path | None = None) -> list[Path]:
    """Move the file away (to ``aside``, else a new name) with its -wal and -shm (those
    first: a new file must never meet the old WAL). Returns the new names, the
    database's last."""
    aside = aside or _aside_name(path, mark)
    moved = []
    for suffix in ("-wal", "-shm", ""):
        if _sidecar(path, suffix).exists():
            os.replace(_sidecar(path, suffix), _sidecar(aside, suffix))
            moved.append(_sidecar(aside, suffix))
    fsync_dir(path.parent)
    return moved


def _remove_database(path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        _sidecar(path, suffix).unlink(missing_ok=True)


def _remove_stale_work(path: Path) -> list[Path]:
    """Remove what a salvage or a restore killed half-way left beside ``path``
    (``<db>.salvage-<pid>``, ``<db>.restoring-<pid>``, ``<db>.repairing-<pid>`` and their
    -wal, -shm, and a restore's decrypted copy ``.converting``: copies of the history,
    plain when it was plain, of processes that are gone). Returns what was removed."""
    removed: list[Path] = []
    swapping = putback.unfinished_work(path)  # the copy a put-back cut off puts in place
    for mark in (".salvage-", ".restoring-", ".repairing-"):
        for leftover in path.parent.glob(f"{path.name}{mark}*"):
            pid = re.split(r"[-.]", leftover.name[len(path.name) + len(mark):])[0]
            if swapping and leftover.name.startswith(swapping):
                continue
            if pid.isdigit() and (int(pid) == os.getpid() or not _process_exists(int(pid))):
                with contextlib.suppress(FileNotFoundError):
                    leftover.unlink()
                    removed.append(leftover)
    return removed


def _undo_cut_set_aside(path: Path) -> None:
    """Give ``path`` back the -wal and -shm a set-aside killed half-way moved (it moves
    them first, the database last): a set-aside name with a -wal or -shm and no database
    beside it, ``path`` still there and without its own. Before (an audit), the chats
    committed only in that WAL were lost in silence: the next start wrote to the
    database without them, and no listing named the orphan."""
    if not path.exists():
        return
    for mark in ASIDE_MARKS:
        for side in sorted(path.parent.glob(f"{path.name}{mark}*-wal")) + sorted(
                path.parent.glob(f"{path.name}{mark}*-shm")):
            suffix = side.name[-4:]
            database = side.with_name(side.name[:-4])
            if database.exists() or _sidecar(path, suffix).exists():
                continue
            try:  # path unchanged since the set-aside began: the database the WAL is of
                stamp = time.mktime(time.strptime(
                    database.name[len(path.name) + len(mark):][:15], "%Y%m%dT%H%M%S"))
            except ValueError:
                continue
            if path.stat().st_mtime > stamp + 1:
                continue
            os.replace(side, _sidecar(path, suffix))
            log.warning("%s went back to %s: a set-aside was cut off before the database "
                        "moved", side.name, path.name)
    fsync_dir(path.parent)


def remove_stale_work(path: Path) -> list[Path]:
    """At every open and every ``recover``: remove the work files (copies of the history)
    that a killed salvage, repair or restore left beside ``path``, so none outlives the
    process that made it, and turning encryption on leaves no plain copy behind. Returns
    what was removed (``recover`` lists it); a folder that cannot be read removes nothing.
    A put-back cut off is finished first (:func:`~.putback.finish`; StoreError when it
    cannot be). All of it with the conversion lock held (this thread's own, around a
    start's opening), and nothing while another process holds it (a start finishing a
    put-back, or a put-back or conversion running): those files are its work, half moved
    (before, a set-aside's -wal it was moving went back beside the history it was moving
    aside, and met the copy renamed in)."""
    try:
        with conversion_locked(path, "tidying"):
            putback.finish(path)
            return _tidy_work(path)
    except Busy:
        log.info("left the work files beside %s: another process holds its lock", path)
        return []
    except OSError as exc:  # a folder that cannot be written: no lock file, none holds it
        log.warning("cannot look for a put-back cut off beside %s: %s", path, exc)
    return _tidy_work(path)


def _tidy_work(path: Path) -> list[Path]:
    """:func:`remove_stale_work`'s sweep (a set-aside cut off undone, work files removed)."""
    try:
        _undo_cut_set_aside(path)
        removed = _remove_stale_work(path)
    except OSError as exc:
        log.warning("cannot remove the work files beside %s: %s", path, exc)
        return []
    for leftover in removed:
        log.warning("removed %s, left by a recovery that did not finish", leftover.name)
    return removed


def _process_exists(pid: int) -> bool:
    """Whether a process ``pid`` runs (never ``os.kill(pid, 0)``, which ends it on Windows)."""
    return _exists(pid)


def _failure(path: Path, problems: Sequence[str], exc: BaseException) -> StoreError:
    """The one sentence for a salvage that could not finish (the original untouched). A
    salvage the user asked for (``recover --salvage``: the file may be healthy) is retried
    by asking again; one a start made, by starting again."""
    asked = list(problems) == [SALVAGE_ASKED]
    again = "run 'iris-desktop recover --salvage' again" if asked else "start Iris again"
    if disk_full(path) or getattr(exc, "sqlite_errorname", "").startswith("SQLITE_FULL") or (
            isinstance(exc, OSError) and exc.errno == errno.ENOSPC):
        reason = f"the disk is full: the copy needs up to about {room_of(path)}"
        todo = f"free some space, then {again}"
    else:
        reason, todo = str(exc).rstrip("."), f"{again} to retry, or move it away"
    what = (f"copying what can be read out of {path} into a new database ('recover "
            "--salvage') failed" if asked else f"{path} is damaged ({first_problem(problems)}) "
            "and copying what can be read out of it failed")
    return StoreError(f"{what} ({reason}); it was left as it is, under its own name, and "
                      f"nothing was lost; {todo}")


def salvage(path: Path, problems: list[str], key: Key | None = None) -> Recovery:
    """Copy every row of the damaged database that can still be read into a new one,
    table by table, in id order, stepping over damaged pages, and count it against what
    the original held; then set the original aside (``<db>.corrupt-<time>``, with its
    -wal and -shm) and put the copy in its place. Messages whose thread was lost get a
    thread titled "Recovered chat <id>".

    The copy is built beside the original (``<db>.salvage-<pid>``) and checked before
    anything moves: when it cannot be finished (a full disk, an I/O error) or not one
    row could be read, StoreError says so and the original stays where it is, under its
    own name. A file whose header is damaged is read through a copy with the header's
    fixed fields restored.

    All of it with the conversion lock held (this thread's own at a start), saying
    "salvaging": a conversion, a put-back, its finish at a start or a second salvage
    cannot move files under it, nor it under them; when another process holds the lock,
    StoreError says what that one is doing, and nothing was changed (before, ``recover
    --salvage`` took no lock, and could swap files under another's work)."""
    with no_conversion(path, word="salvaging", then="try again when it is done"):
        return _salvage(path, problems, key)


def _salvage(path: Path, problems: list[str], key: Key | None) -> Recovery:
    """:func:`salvage`, with the conversion lock held."""
    from iris_desktop.core.store import Store  # the package imports this module first

    _refuse_if_in_use(path)
    work = _sidecar(path, f".salvage-{os.getpid()}")
    repaired: Path | None = None
    try:
        _remove_stale_work(path)
        if key is None and header_problems(path):
            repaired = _repaired_copy(path)
        source = Reader(repaired or path, key)
        try:
            target = Store(work, key=key)
            try:
                recovered, held, lost, recreated = _copy_all(source, target.conn)
                # one self-contained file: the WAL in it, no -wal to lose in the rename
                target.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                target.conn.execute("PRAGMA journal_mode = DELETE").fetchone()
            finally:
                target.close()
        finally:
            source.close()
        if _sidecar(work, "-wal").exists():
            raise StoreError("the new database could not be completed")
        found = quick_check(work, budget_s=60, key=key)
        if found:
            raise StoreError(f"the new database failed its check: {first_problem(found)}")
        if not sum(recovered.values()) and any(held.get(t) != 0 for t in SALVAGED_TABLES):
            raise _NothingRead
    except _NothingRead:
        _remove_database(work)
        raise StoreError(
            f"{path} is damaged ({first_problem(problems)}) and not one row of it could be "
            "read; it was left as it is, under its own name; move it away to start with an "
            "empty history, or put back an earlier copy with 'iris-desktop recover'") from None
    except (OSError, sqlite3.Error, StoreError) as exc:
        _remove_database(work)
        raise _failure(path, problems, exc) from None
    finally:
        if repaired is not None:
            _remove_database(repaired)
    try:
        moved = _swap_in(path, work, ".corrupt-")
    except OSError as exc:
        raise _failure(path, problems, exc) from None
    return Recovery(path, moved[-1], moved, list(problems), recovered, lost, held, recreated)


def _swap_in(path: Path, work: Path, mark: str, named: Path | None = None) -> list[Path]:
    """Set ``path`` aside (with its -wal and -shm; as ``named`` when given) and rename
    ``work`` in its place; when a rename fails (OSError), the files set aside get their
    names back and ``work`` is removed. Returns the names moved."""
    moved: list[Path] = []
    try:
        moved = _set_aside(path, mark, named) if path.exists() else []
        os.replace(work, path)
    except OSError as exc:
        for aside in moved:  # the database last, as it went
            suffix = aside.name[len(moved[-1].name):]
            with contextlib.suppress(OSError):
                os.replace(aside, _sidecar(path, suffix))
        _remove_database(work)
        raise exc
    fsync_dir(path.parent)
    return moved


class _NothingRead(Exception):
    """Salvage read no row of a database that held some (or may have)."""


def _repaired_copy(path: Path) -> Path:
    """A copy of the database (and its -wal) whose header's fixed fields are restored
    (:func:`_repaired_header`), to read a file SQLite refuses because of them. The page
    size, when it is the damaged field, is the one with which the schema reads."""
    copy = _sidecar(path, f".repairing-{os.getpid()}")
    _remove_database(copy)
    shutil.copyfile(path, copy)
    if _sidecar(path, "-wal").exists():
        shutil.copyfile(_sidecar(path, "-wal"), _sidecar(copy, "-wal"))
    with open(copy, "r+b") as fh:
        head = fh.read(100)
    stated = int.from_bytes(head[16:18], "big")
    sizes = [stated if stated != 1 else 65536] if 512 <= stated or stated == 1 else []
    for size in [*sizes, 4096, *(1 << n for n in range(9, 17))]:
        with open(copy, "r+b") as fh:
            fh.write(_repaired_header(head, size))
        try:
            conn = read_only(copy)
            try:
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
                return copy
            finally:
                conn.close()
        except sqlite3.DatabaseError:
            continue
    return copy


def _copy_all(source: Reader, target: sqlite3.Connection
              ) -> tuple[dict[str, int], dict[str, int | None], dict[str, int | None], int]:
    """Copy the salvaged tables; (recovered, held, lost, threads recreated): see
    :class:`Recovery`."""
    recovered: dict[str, int] = {}
    held: dict[str, int | None] = {}
    lost: dict[str, int | None] = {}
    failed: dict[str, bool] = {}
    # rows whose parent was lost are kept; the new connection is closed right after
    target.execute("PRAGMA foreign_keys = OFF")
    target.execute("BEGIN IMMEDIATE")
    try:
        for table in SALVAGED_TABLES:
            if _absent(source, table):  # older than the table (drafts: schema 14): none lost
                recovered[table], held[table], lost[table] = 0, 0, 0
                continue
            copied, refused, failed[table] = _copy_table(source, target, table)
            recovered[table] = copied
            count = _held(source, table)
            held[table] = None if count is None else max(count, copied + refused)
            if held[table] is not None:
                lost[table] = held[table] - copied
            elif failed[table]:
                lost[table] = max(0, _at_least(source, table) - copied) or None
            else:
                lost[table] = refused
        before = target.execute("SELECT count(*) FROM threads").fetchone()[0]
        _repair_references(target)
        _carry_id_marks(source, target)
        recreated = target.execute("SELECT count(*) FROM threads").fetchone()[0] - before
        target.execute("COMMIT")
    except BaseException:
        if target.in_transaction:
            target.execute("ROLLBACK")
        raise
    if recreated and held["threads"] is None:
        lost["threads"] = max(lost["threads"] or 0, recreated)
    return recovered, held, lost, recreated


def _copy_table(source: Reader, target: sqlite3.Connection, table: str
                ) -> tuple[int, int, bool]:
    """(rows copied, rows read but refused, whether reading met damage) of one table;
    FTS is filled by the insert triggers."""
    wanted = [row[1] for row in target.execute(f"PRAGMA table_info({table})")]
    try:
        present = {row[1] for row in source.execute(f"PRAGMA table_info({table})")}
    except sqlite3.DatabaseError:
        source.renew()
        present = set(wanted)
    columns = [c for c in wanted if c in present] or wanted
    reader = RowReader(source, table, columns)
    insert = (f"INSERT INTO {table}({', '.join(columns)}) "
              f"VALUES ({', '.join('?' * len(columns))})")
    copied = refused = 0
    for row in reader.rows():
        try:
            target.execute(insert, row)
            copied += 1
        except sqlite3.IntegrityError:  # a damaged value that breaks a constraint
            refused += 1
    return copied, refused, reader.failed


def _carry_id_marks(source: Reader, target: sqlite3.Connection) -> None:
    """The highest ids the history ever gave (schema 16), where they can still be read:
    a salvage never gives a deleted chat's id, or its messages', to a new one (a review:
    the new file's marks were empty, so the newest chat deleted before the damage gave
    its id to the next chat made)."""
    if _absent(source, "id_marks"):
        return
    try:
        marks = list(source.execute("SELECT name, high FROM id_marks"))
    except sqlite3.DatabaseError:  # damaged: the ids of the rows recovered stay the floor
        source.renew()
        return
    for name, high in marks:
        if name in ("threads", "messages") and isinstance(high, int):
            target.execute("INSERT INTO id_marks(name, high) VALUES (?, ?) ON CONFLICT(name) "
                           "DO UPDATE SET high = max(high, excluded.high)", (name, high))


def _repair_references(conn: sqlite3.Connection) -> None:
    """Give orphaned rows a thread, and drop links to summaries that were lost."""
    now = time.time()
    for table in SALVAGED_TABLES[1:]:
        conn.execute(
            f"""INSERT INTO threads(id, title, created_at, updated_at)
                SELECT DISTINCT thread_id, 'Recovered chat ' || thread_id, ?, ?
                FROM {table} WHERE thread_id IS NOT NULL
                AND thread_id NOT IN (SELECT id FROM threads)""", (now, now))
    conn.execute("UPDATE summaries SET prev_id = NULL "
                 "WHERE prev_id NOT IN (SELECT id FROM summaries)")
    conn.execute("UPDATE compaction_events SET summary_id = NULL "
                 "WHERE summary_id NOT IN (SELECT id FROM summaries)")
    rebuild_paths(conn)


# -- set-aside databases: listing, telling, restoring ---------------------------------------


def set_aside_files(path: Path) -> list[Path]:
    """The databases set aside beside ``path`` (``<db>.corrupt-<time>``,
    ``<db>.before-restore-<time>``), newest first; their -wal and -shm are not listed."""
    found = []
    for candidate in path.parent.glob(f"{path.name}.*"):
        rest = candidate.name[len(path.name):]
        if (rest.startswith(ASIDE_MARKS) and not rest.endswith(("-wal", "-shm", "-journal"))
                and candidate.is_file()):
            found.append(candidate)
    return sorted(found, key=lambda p: (p.stat().st_mtime, p.name), reverse=True)


def _seen_file(path: Path, app: bool = False) -> Path:
    return _sidecar(path, ".set-aside-shown" if app else ".set-aside-seen")


def _seen_names(path: Path, app: bool) -> set[str]:
    try:
        return set(_seen_file(path, app).read_text(encoding="utf-8").splitlines())
    except (OSError, UnicodeDecodeError):
        return set()


def unacknowledged(path: Path, app: bool = False) -> list[Path]:
    """The set-aside databases still to announce: not yet listed by ``iris-desktop
    recover`` (nor put back, nor set aside at the user's own asking), and for the app
    (``app``) also not yet shown in it once (:func:`acknowledge`). The CLI names them on
    every command until then."""
    seen = _seen_names(path, False) | (_seen_names(path, True) if app else set())
    return [p for p in set_aside_files(path) if p.name not in seen]


def acknowledge(path: Path, files: Sequence[Path], app: bool = False) -> None:
    """Remember that the user has seen these set-aside databases (by name): listed by
    ``recover`` (``<db>.set-aside-seen``: no command or window announces them again) or,
    with ``app``, shown once in the app (``<db>.set-aside-shown``: the app does not show
    them again; the CLI still names them). Best effort: a folder that cannot be written
    only means they are announced again."""
    names = [p.name for p in files]
    if not names:
        return
    seen = _seen_file(path, app)
    try:
        known = seen.read_text(encoding="utf-8").splitlines() if seen.exists() else []
        fd = os.open(seen, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write("".join(f"{n}\n" for n in dict.fromkeys([*known, *names])))
    except (OSError, UnicodeDecodeError):
        log.warning("could not record that %s was shown", ", ".join(names))


def announce(path: Path, files: Sequence[Path]) -> str:
    """One sentence for set-aside databases the user has not been shown."""
    newest = files[0]
    what = "an earlier database was" if len(files) == 1 else f"{len(files)} earlier databases were"
    return (f"{what} set aside in {path.parent} (the newest: {newest.name}) and may hold "
            "history this one lacks; 'iris-desktop recover' lists set-aside databases and "
            "puts one back")


@dataclass(frozen=True)
class SetAside:
    """A set-aside database, as ``iris-desktop recover`` lists it."""

    path: Path
    #: when it was set aside (seconds since the epoch: the file's modification time)
    when: float
    #: bytes, with its -wal
    size: int
    #: rows per table that can be read (None: that table cannot be read)
    rows: dict[str, int | None]
    #: why it cannot be opened at all, else None
    error: str | None = None


def inspect_set_aside(file: Path, key: Key | None = None) -> SetAside:
    """What a set-aside database holds, read without writing to it."""
    stat = file.stat()
    size = stat.st_size + sum(_sidecar(file, s).stat().st_size for s in ("-wal",)
                              if _sidecar(file, s).exists())
    rows: dict[str, int | None] = {t: None for t in SALVAGED_TABLES}
    error = None
    source = file
    repaired = _repaired_copy(file) if key is None and header_problems(file) else None
    try:
        conn = Reader(repaired or source, key)
        try:
            for table in SALVAGED_TABLES:
                rows[table] = _held(conn, table)
        finally:
            conn.close()
    except (sqlite3.Error, StoreError, OSError) as exc:
        error = str(exc)
    finally:
        if repaired is not None:
            _remove_database(repaired)
    return SetAside(file, stat.st_mtime, size, rows, error)


def restore(path: Path, file: Path, key: Key | None = None, decrypt: bool = False) -> list[Path]:
    """Put the set-aside database ``file`` back in place of ``path``. The current
    database is set aside first (``<db>.before-restore-<time>``, with its -wal and
    -shm), never deleted; ``file`` stays as it is (a checked copy of it is put in
    place). ``decrypt``: ``file`` is encrypted (opened with ``key``) and the history is
    to be plain (``storage.encrypt`` off): the checked copy is decrypted by the
    encryption's own conversion (:func:`~iris_desktop.core.store.cipher.convert`:
    verified, rows counted) before it takes the database's place. Returns where the
    current database went ([] when there was none). Raises StoreError, with nothing
    changed, when ``file`` is damaged or not a database, or the copy cannot be made (a
    full disk)."""
    problems = quick_check(file, budget_s=60, key=key)
    if problems:
        raise StoreError(f"{file} is damaged ({first_problem(problems)}); putting it back "
                         "would only have it set aside again at the next start; nothing was "
                         "changed")
    _refuse_if_busy(path, file)
    _remove_stale_work(path)
    work = _sidecar(path, f".restoring-{os.getpid()}")
    try:
        source = read_only(file, key)
        try:
            fd = os.open(work, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            os.close(fd)
            target = connect(work, key, path=work)
            try:
                source.backup(target)
            finally:
                target.close()
            counts = {t: _held(source, t) for t in SALVAGED_TABLES}
        finally:
            source.close()
        found = quick_check(work, budget_s=60, key=key)
        if found:
            raise StoreError(f"the copy failed its check: {first_problem(found)}")
        check = read_only(work, key)
        try:
            copied = {t: _held(check, t) for t in SALVAGED_TABLES}
        finally:
            check.close()
        if copied != counts:
            raise StoreError("the copy does not hold the same rows")
        if decrypt and key is not None:
            try:
                convert(work, key, None, then=f"run 'iris-desktop recover {file.name}' again")
            finally:
                _conversion_lock(work).unlink(missing_ok=True)
    except (OSError, sqlite3.Error, StoreError) as exc:
        _remove_database(work)
        reason = "the disk is full; free some space" if disk_full(path) else str(exc).rstrip(".")
        raise StoreError(f"could not put {file.name} back ({reason}); nothing was changed") from None
    return _put_in(path, file, work)


def _putting_back(path: Path, file: Path) -> contextlib.AbstractContextManager[None]:
    """The conversion lock of ``path`` for a put-back of ``file`` (StoreError, saying
    what the holder does, when another process holds it)."""
    return no_conversion(path, word="putting-back",
                         then=f"run 'iris-desktop recover {file.name}' again when it is done")


def _refuse_if_busy(path: Path, file: Path) -> None:
    """Before the copy (minutes on a large history): refuse a put-back of ``file`` when
    another process holds the conversion lock (said as what it does: before, beside a
    conversion, "has it open") or has the history open, as :func:`_put_in` would."""
    try:
        with _putting_back(path, file):
            _refuse_if_in_use(path)
    except _InUse:
        raise
    except StoreError as exc:
        why = str(exc).removesuffix("; nothing was changed")
        raise StoreError(f"could not put {file.name} back ({why}); nothing was changed") from None


def _put_in(path: Path, file: Path, work: Path) -> list[Path]:
    """:func:`restore`'s swap, journaled (:mod:`.putback`): a kill at any step of it is
    finished by the next start, never an empty history said nowhere. A start waits for
    it (the conversion lock), and it is refused, the copy removed, when another process
    opened the history since :func:`restore` looked (before, the copy, minutes long on a
    large history, gave a window time to open it, and the files moved under it)."""
    aside = _aside_name(path, ".before-restore-")
    try:
        with _putting_back(path, file):
            if putback.unfinished_work(path):  # its process gone since recover looked
                raise StoreError("an earlier put-back was cut off and is not finished yet; "
                                 "run this again to finish it first")
            _refuse_if_in_use(path)  # none opens it now: a start waits for this lock
            putback.begin(path, file, work, aside)
            moved = _swap_in(path, work, ".before-restore-", aside)
            acknowledge(path, moved[-1:])
            putback.end(path)
    except (OSError, StoreError) as exc:
        _remove_database(work)
        if path.exists() and putback.unfinished_work(path) == work.name:
            putback.end(path)  # ours, and as it was (a swap that failed undid its moves)
        if isinstance(exc, _InUse):
            raise
        why = ((exc.strerror or exc) if isinstance(exc, OSError)
               else str(exc).rstrip(".").removesuffix("; nothing was changed"))
        raise StoreError(f"could not put {file.name} back ({why}); nothing was changed") from None
    return moved
