"""A put-back (``iris-desktop recover NAME``) that a kill cut off: finished at the next
start, and said once.

A put-back swaps files: the current database is set aside (its -wal and -shm first, the
database last), then the checked copy of the file put back is renamed in. Before the
first move it writes a journal beside the history (``<db>.put-back``: the names of the
copy, of the set-aside and of the file put back) and it removes the journal after the
last; it holds the conversion lock throughout, so a start waits for it. A start that
finds a journal (with the lock: its writer is gone) finishes the swap: the copy was
complete and checked before the journal was written, and the user asked for it. When
the copy is gone (an older Iris removed it), the history it replaced goes back. The
journal then says what was done (:func:`note`) until the start that tells the user
forgets it (:func:`forget`).

Before (an audit): a put-back killed after it set the history aside and before it
renamed the copy in started the next time with an empty history, and said nothing.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import NamedTuple

from iris_desktop.core.store.errors import StoreError
from iris_desktop.core.store.holders import doing
from iris_desktop.files import atomic_write, fsync_dir, move_file, read_json_object

log = logging.getLogger("iris.store")

#: the journal beside the history, while a put-back swaps files (and after a start
#: finished one, until it is said)
JOURNAL = ".put-back"
#: a journal's states: the swap under way (or cut off), then what a start did to it
STATES = ("begun", "finished", "undone", "kept", "gone", "other")
#: the names a put-back gives its copy and the set-aside (:func:`~.recovery.restore`;
#: ``-<n>`` when the name was taken), after the history's own name
_WORK = r"\.restoring-\d+"
_ASIDE = r"\.before-restore-\d{8}T\d{6}(-\d+)*"
#: the order a database's files are moved in: its -wal and -shm first (a database must
#: never meet another's WAL), the database last
_SIDES = ("-wal", "-shm", "")


def _side(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def journal_path(path: Path) -> Path:
    return _side(path, JOURNAL)


def begin(path: Path, file: Path, work: Path, aside: Path) -> None:
    """Write the journal before the first move: ``work`` (the checked copy of ``file``)
    goes to ``path``, the current database to ``aside``. Raises OSError."""
    atomic_write(journal_path(path), json.dumps(
        {"state": "begun", "file": file.name, "work": work.name, "aside": aside.name,
         "copy": _identity(work)}))


def _identity(file: Path) -> str:
    """The file itself: its device and inode (a rename keeps them), size and modification
    time (a file made since on the inode a removed one freed differs); "" when none."""
    try:
        found = file.stat()
    except OSError:
        return ""
    return f"{found.st_dev}:{found.st_ino}:{found.st_size}:{found.st_mtime_ns}"


def end(path: Path) -> None:
    """Remove the journal: the put-back is done, or nothing of it was moved. Best effort:
    a journal left over a finished swap is only said once more at the next start."""
    try:
        journal_path(path).unlink(missing_ok=True)
    except OSError as exc:
        log.warning("could not remove %s: %s", journal_path(path), exc)
        return
    fsync_dir(path.parent)


def _journal(path: Path) -> dict[str, str]:
    """The journal ({} when there is none, or it is not one): a state of :data:`STATES`,
    the file put back (a plain name), and the copy and the set-aside named as a put-back
    names them beside ``path``: never a path elsewhere, "." or "..", nor the history's
    own name (before, a journal saying "work": ".." set the history aside and failed at
    every start, with advice that did not help)."""
    found = read_json_object(journal_path(path))
    names = {k: v for k, v in found.items() if isinstance(v, str)}
    db = re.escape(path.name)
    file, work, aside = names.get("file", ""), names.get("work", ""), names.get("aside", "")
    if (names.get("state") not in STATES or Path(file).name != file
            or file in ("", ".", "..", path.name) or not re.fullmatch(db + _WORK, work)
            or not re.fullmatch(db + _ASIDE, aside)):
        return {}
    return names


def unfinished_work(path: Path) -> str | None:
    """The name of the checked copy an unfinished put-back is swapping in (it must not be
    taken for a killed process's leftover), else None."""
    journal = _journal(path)
    return journal["work"] if journal.get("state") == "begun" else None


def finish(path: Path) -> None:
    """Finish a put-back a kill cut off (its journal is there): call it with the
    conversion lock held, before anything else opens or decides about the history; the
    lock says "finishing-put-back" meanwhile (:mod:`.holders`). Raises StoreError, saying
    what to do, when a move fails (nothing is lost: the files keep their names, and the
    next start tries again)."""
    journal = _journal(path)
    if journal.get("state") != "begun":
        if journal_path(path).exists() and not journal:
            _discard(path)
        return
    with doing(path, "finishing-put-back"):
        _finish(path, journal)


def _finish(path: Path, journal: dict[str, str]) -> None:
    """:func:`finish` of a put-back whose journal says "begun"."""
    work, aside = path.with_name(journal["work"]), path.with_name(journal["aside"])
    try:
        if work.exists():
            journal["aside"] = _roll_forward(path, work, aside).name
            journal["state"] = "finished"
        elif path.exists():
            journal["state"] = _copy_gone(path, journal.get("copy", ""), aside)
        else:
            journal["state"] = "undone" if _move_back(aside, path) else "gone"
        atomic_write(journal_path(path), json.dumps(journal))
    except OSError as exc:
        raise StoreError(
            f"a put-back of {journal['file']} was cut off, and finishing it failed "
            f"({exc.strerror or exc}); nothing was lost: {work.name} is the copy being put "
            f"back, {aside.name} (or {path.name}) the history it replaces; free some space "
            "or make the folder writable, then start Iris again") from None
    log.warning("a put-back of %s cut off by the end of its process: %s at this start",
                journal["file"], journal["state"])


def _discard(path: Path) -> None:
    """Remove a journal that is not a put-back's (hand-written, damaged), saying what it
    held in one logged line: no put-back writes one, so no swap of Iris's is cut off."""
    try:
        held = journal_path(path).read_text("utf-8", errors="replace")[:300]
    except OSError as exc:
        held = f"unreadable: {exc.strerror or exc}"
    log.warning("%s is not a put-back's journal (%r); removed, the history left as it is",
                journal_path(path), held)
    end(path)


def _copy_gone(path: Path, copy: str, aside: Path) -> str:
    """The state of a put-back whose copy is gone, a history at ``path``: "finished" when
    that history is the copy (cut off after its last move: the same file, or where the
    journal does not say, the history set aside); else the copy was removed before the
    history moved, and its -wal and -shm, when they had moved, go back ("undone"; "kept":
    nothing had moved; "other": neither is at ``path``, the history is set aside)."""
    if (_identity(path) == copy) if copy else aside.exists():
        return "finished"
    if aside.exists():
        return "other"
    moved = [s for s in _SIDES[:2] if _side(aside, s).exists() and not _side(path, s).exists()]
    for suffix in moved:
        move_file(_side(aside, suffix), _side(path, suffix))
    return "undone" if moved else "kept"


def _roll_forward(path: Path, work: Path, aside: Path) -> Path:
    """The rest of the swap: what is left of the current database to ``aside`` (another
    free name when something holds that one: a file is never overwritten), ``work`` to
    ``path``. Returns where the current database went."""
    moving = [s for s in _SIDES if _side(path, s).exists()]
    base, n = aside, 1
    while any(_side(base, s).exists() for s in moving):
        n += 1
        base = aside.with_name(f"{aside.name}-{n}")
    for suffix in moving:
        move_file(_side(path, suffix), _side(base, suffix))
    move_file(work, path)
    return base


def _move_back(aside: Path, path: Path) -> bool:
    """The copy is gone: the history set aside goes back to ``path`` (the database last);
    False when there was none."""
    if not aside.exists():
        return False
    for suffix in _SIDES:
        if _side(aside, suffix).exists():
            move_file(_side(aside, suffix), _side(path, suffix))
    return True


class Note(NamedTuple):
    """What a start did to a put-back cut off: ``title`` in a few words (a message box's),
    ``text`` in one sentence, and ``replaced``, where the history it replaced is."""

    title: str
    text: str
    replaced: Path


def note(path: Path) -> Note | None:
    """What the start did to a put-back cut off (:class:`Note`); None when it did nothing."""
    journal = _journal(path)
    state, file, aside = journal.get("state"), journal.get("file"), journal.get("aside")
    if state not in STATES[1:] or not file or not aside:
        return None
    cut = f"A put-back of {file} ('iris-desktop recover {file}') was cut off before it finished"
    if state == "finished":
        there = path.with_name(aside)
        replaced = (f", and the history it replaced is set aside as {aside} ('iris-desktop "
                    f"recover {aside}' puts it back)" if there.exists()
                    else " (there was no history before it)")
        return Note("Iris Desktop finished putting back a database",
                    f"{cut}; Iris finished it at this start: {file} is the history now{replaced}.", there)
    again = f"'iris-desktop recover {file}' puts {file} back (it is unchanged)"
    title = "Iris Desktop could not finish putting back a database"
    if state == "kept":
        return Note(title, f"{cut}, and the copy it was putting in place is gone; the history it was "
                    f"to replace was never moved, nothing of it lost; {again}.", path)
    if state == "other":
        return Note(title, f"{cut}, and the copy it was putting in place is gone; {path.name} is "
                    f"another file, and the history it was to replace is set aside as {aside} "
                    f"('iris-desktop recover {aside}' puts it back); {again}.", path.with_name(aside))
    if state == "undone":
        return Note(title, f"{cut}, and the copy it was putting in place is gone; the history it was "
                    f"to replace is back where it was, nothing of it lost; {again}.", path)
    return Note(title, f"{cut}, and the copy it was putting in place is gone; there was no history "
                f"before it; {again}.", path)


def forget(path: Path) -> None:
    """The note was said: remove the journal (best effort: said again otherwise)."""
    if _journal(path).get("state") != "begun":
        end(path)
