"""Who else is at the history now: the process that holds its conversion lock, and what
it is doing there, and a process that has the database open.

The conversion lock (``.<db>.lock``, beside the history) is held by a conversion
(``storage.encrypt``), a put-back and the start that finishes one a kill cut off, a
salvage, and every start while it opens the database. Its holder writes one word of what
it is doing, and its process id, into ``.<db>.lock-holder`` once it has the lock (and
removes it before it lets go); a process that finds the lock taken reads it to say what
the other one is doing. Before, every such refusal said "converting", also beside a
put-back or a salvage. A word missing, unknown, or of a process that is gone (a holder
killed before it removed it) is said as "changing".
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from iris_desktop.core.store.base import _exists
from iris_desktop.core.store.errors import StoreError
from iris_desktop.files import exclusive_lock

#: what a holder of the conversion lock may be doing, and how another process says it;
#: ``{path}`` is the history, ``{why}`` (converting only) why it is converted
DOING = {
    "opening": "opening {path} now (starting)",
    "converting": "converting {path} now ({why})",
    "putting-back": "putting a set-aside database back in place of {path} now "
                    "('iris-desktop recover NAME')",
    "finishing-put-back": "putting a set-aside database back in place of {path} now "
                          "(finishing a put-back that was cut off)",
    "salvaging": "salvaging {path} now (copying what can be read of it into a new database)",
    "tidying": "removing the work files a stopped process left beside {path} now",
    "rekeying": "encrypting {path} again with a new key now ('iris-desktop rekey')",
}
#: said when the holder's word cannot be read (gone, unknown, or an older Iris's)
CHANGING = "changing {path} now (converting it, putting a database back in its place or salvaging it)"


def lock_file(path: Path) -> Path:
    """The file whose lock a conversion of ``path`` holds (hidden, beside it, empty)."""
    return path.with_name(f".{path.name}.lock")


def word_file(path: Path) -> Path:
    """Where the holder of :func:`lock_file` says what it is doing (hidden, beside it)."""
    return path.with_name(f".{path.name}.lock-holder")


#: the words of the conversion locks this thread holds, by lock file, innermost last: a
#: second lock of its own file would be refused to it (flock: one holder per open file)
_held = threading.local()


def _words() -> dict[str, list[str]]:
    if not hasattr(_held, "words"):
        _held.words = {}
    return _held.words


def holds(path: Path) -> bool:
    """Whether this thread holds the conversion lock of ``path``."""
    return os.path.abspath(lock_file(Path(path))) in _words()


@contextmanager
def held(path: Path, word: str) -> Iterator[None]:
    """Hold the conversion lock of ``path`` for the block, without waiting, saying
    ``word`` (a key of :data:`DOING`): this thread's own when it holds it already, its
    word then ``word`` for the block. Raises Busy when another process (or thread) holds
    it, OSError when the lock file cannot be made."""
    path = Path(path)
    if holds(path):
        with doing(path, word):
            yield
        return
    name = os.path.abspath(lock_file(path))
    with exclusive_lock(lock_file(path)):
        _words()[name] = [word]
        _say(path, word)
        try:
            yield
        finally:
            del _words()[name]
            _say(path, None)


@contextmanager
def doing(path: Path, word: str) -> Iterator[None]:
    """Say ``word`` for the block while this thread holds the conversion lock of ``path``,
    the word it said before after it; nothing when it does not hold it."""
    words = _words().get(os.path.abspath(lock_file(Path(path))))
    if words is None:
        yield
        return
    words.append(word)
    _say(path, word)
    try:
        yield
    finally:
        words.pop()
        _say(path, words[-1])


def _say(path: Path, word: str | None) -> None:
    """Write ``word`` and this process's id to :func:`word_file` (None: remove it). Best
    effort: a word not written is said as "changing"."""
    target = word_file(path)
    if word is None:
        try:
            target.unlink(missing_ok=True)
            return
        except OSError:  # Windows, while a reader has it open: emptied instead
            pass
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_BINARY", 0),
                     0o600)
        try:
            if word is not None:
                os.write(fd, f"{word} {os.getpid()}\n".encode("ascii"))
        finally:
            os.close(fd)
    except OSError:
        pass


def holder(path: Path) -> str | None:
    """What the process holding the conversion lock of ``path`` says it is doing (a key
    of :data:`DOING`); None when that cannot be told."""
    try:
        with open(word_file(Path(path)), "rb") as handle:
            text = handle.read(200).decode("ascii")
    except (OSError, UnicodeDecodeError):
        return None
    parts = text.split()
    if len(parts) != 2 or parts[0] not in DOING or not parts[1].isdigit():
        return None
    return parts[0] if _exists(int(parts[1])) else None


def busy(path: Path, then: str, why: str = "encrypting or decrypting it") -> str:
    """One sentence for a process that finds the conversion lock of ``path`` taken:
    "another Iris process is <what its holder does>; ``then``". ``why``: why a
    conversion runs, when the holder converts."""
    found = holder(path)
    what = DOING[found] if found else CHANGING
    return f"another Iris process is {what.format(path=path, why=why)}; {then}"


# -- a process that has the database open ---------------------------------------------

#: the byte of a -shm every SQLite connection to the database keeps a shared lock on while
#: it is open (the "DMS" slot: UNIX_SHM_BASE 120 + SQLITE_SHM_NLOCK 8)
_SHM_DMS = 128


def in_use_elsewhere(path: Path) -> bool:
    """Whether another process has the database open now (POSIX: it holds its lock on the
    -shm; False where this cannot be told). Call it with no connection of this process
    open to ``path``: closing the probe drops this process's own locks on the -shm."""
    shm = path.with_name(path.name + "-shm")
    if os.name != "posix" or not shm.exists():
        return False
    import fcntl

    try:
        fd = os.open(shm, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _SHM_DMS, os.SEEK_SET)
    except OSError:
        return True
    else:
        fcntl.lockf(fd, fcntl.LOCK_UN, 1, _SHM_DMS, os.SEEK_SET)
        return False
    finally:
        os.close(fd)


class InUse(StoreError):
    """Another process has the database open: nothing may move under it."""


def refuse_if_in_use(path: Path) -> None:
    """Raise :class:`InUse` when another process has the database at ``path`` open."""
    if in_use_elsewhere(path):
        raise InUse(f"another Iris process (the app, or a chat) has {path} open; close "
                    "it, then try again; nothing was changed")
