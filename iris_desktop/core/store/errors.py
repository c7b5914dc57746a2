"""What the store raises: a database that cannot be used, one found damaged, and a chat
that is not there (deleted, perhaps by another process, since it was read); and a cache
(token counts, recall vectors) that could not be written, which is no error (:func:`keep_cache`)."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from iris_desktop.files import free_bytes

if TYPE_CHECKING:
    from iris_desktop.core.store.base import Connected

log = logging.getLogger("iris.store")


class StoreError(Exception):
    """The database cannot be used (corrupt, newer schema, not a database)."""


class DamagedDatabase(StoreError):
    """PRAGMA quick_check found damage; nothing was written to the file."""

    def __init__(self, path: Path, problems: list[str]):
        super().__init__(f"{path} is damaged: {problems[0]}")
        self.path = path
        self.problems = problems


class ThreadGone(KeyError):
    """No chat with this id: never made, or deleted since (by another window or command,
    or by this one). A ``KeyError``, as a lookup that misses is."""

    def __init__(self, thread_id: int):
        super().__init__(f"no thread {thread_id}")
        self.thread_id = thread_id

    def __str__(self) -> str:  # the sentence, not a KeyError's quoted key
        return str(self.args[0])


def busy_sentence(holder: dict[str, Any], not_done: str = "Not sent",
                  instead: str = ", or write in another chat") -> str:
    """Why something does not happen in a chat another process is answering in
    (``holder``: the turn lease's row)."""
    since = max(0, round(time.time() - holder["acquired_at"]))
    return (f"{not_done}: this chat is answering in another Iris window or command (process "
            f"{holder['pid']}, for {since} s); wait until it finishes{instead}")


class ThreadBusy(RuntimeError):
    """Another window or command is answering in the chat: its branch stays as it is (a
    switch under a reply being written hid the question and its reply on another branch)."""

    def __init__(self, holder: dict[str, Any]):
        super().__init__(busy_sentence(holder, "Not switched", ""))
        self.holder = holder


#: free space under which an I/O error is taken for a full disk
FULL_DISK_BYTES = 1 << 20


def disk_full(path: Path) -> bool:
    """Whether the file system holding ``path`` has (almost) no free space left."""
    free = free_bytes(path.parent)
    return free is not None and free < FULL_DISK_BYTES


def full_disk_error(exc: sqlite3.Error, path: Path) -> bool:
    """Whether ``exc``, met writing the database ``path``, is a full disk's."""
    name = getattr(exc, "sqlite_errorname", None) or ""
    return name.startswith("SQLITE_FULL") or (name.startswith("SQLITE_IOERR") and disk_full(path))


def room_of(path: Path) -> str:
    """The size of the database ``path`` with its -wal, in words ("2.6 MB"): the room a
    second copy of it takes (a conversion, a salvage, a delete's rewrite of its pages)."""
    size = sum(p.stat().st_size for p in (path, path.with_name(path.name + "-wal")) if p.exists())
    return f"{size / 1e6:,.1f} MB" if size >= 100_000 else f"{size / 1e3:,.0f} kB"


def cache_not_written(exc: sqlite3.Error, path: Path) -> str | None:
    """Why writing a cache to the database ``path`` failed, in words, when it is a reason
    to go on without the cache: the disk is full, or the database cannot be written.
    None for any other error (the caller raises it)."""
    if full_disk_error(exc, path):
        return f"the disk holding {path} is full"
    if (getattr(exc, "sqlite_errorname", None) or "").startswith("SQLITE_READONLY"):
        return f"{path} cannot be written"
    return None


def keep_cache(store: Connected, what: str, write: Callable[[], object]) -> bool:
    """Write a cache (``what``: "token counts", "recall vectors": derived data, made again
    when missing) with ``write()``; True once written. On a full disk or a database that
    cannot be written (:func:`cache_not_written`) it is left unwritten: logged, named in
    :func:`unsaved_caches` for the CLI to say, and False is returned, so that the caller
    goes on with what it computed in memory (listing chats and seeing a chat's context
    work on a full disk, to decide what to delete). A history another connection keeps
    busy leaves it unwritten for now, not noted (made again at the next read). Any other
    error is raised, and so is
    one met inside the caller's transaction (SQLite may have rolled all of it back)."""
    outer = store.conn.in_transaction
    try:
        write()
        return True
    except sqlite3.Error as exc:
        if not outer and (getattr(exc, "sqlite_errorname", None) or "").startswith("SQLITE_BUSY"):
            # another connection wrote since this one's open read began (a lazy cursor of
            # the caller's: SQLite refuses at once, SQLITE_BUSY_SNAPSHOT), or held the lock
            # past the busy timeout: the values serve this read and are made again next
            # time (before, a send in a chat whose counts the meter was writing failed)
            log.info("%s not saved now (another connection was writing): %s", what, exc)
            return False
        why = None if outer else cache_not_written(exc, store.path)
        if why is None:
            raise
    log.warning("%s not saved (made again next time): %s", what, why)
    unsaved_caches(store)[what] = why
    return False


def unsaved_caches(store: Connected) -> dict[str, str]:
    """The caches ``store`` could not write (:func:`keep_cache`): what → why."""
    return store.__dict__.setdefault("_unsaved_caches", {})


def unsaved_note(store: Connected) -> str | None:
    """One sentence for the caches ``store`` could not write since the last call (then
    forgotten: said once), or None."""
    unsaved = unsaved_caches(store)
    if not unsaved:
        return None
    whys = list(dict.fromkeys(unsaved.values()))
    what = " and ".join(unsaved)
    unsaved.clear()
    todo = "free some space" if any(w.endswith(" is full") for w in whys) else \
        "make it writable"
    return (f"{'; '.join(whys)}: the {what} made now were not saved (they are made again next "
            f"time; nothing else changed); {todo} to keep them")
