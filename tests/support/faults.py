"""Faults the tests inject for real: a full disk and flipped bytes.

- :func:`full_disk` mounts a small tmpfs (Linux, as root or with CAP_SYS_ADMIN) and
  yields a :class:`Disk` on it; ``disk.fill()`` takes every free byte, ``disk.free()``
  gives it back. The test is skipped, with the reason, where mounting is not allowed.

  .. code-block:: python

      with full_disk(tmp_path) as disk:
          build_history(disk.path)        # write while there is room
          disk.fill()                     # now every write fails with ENOSPC
          ...                             # run commands on disk.path
          disk.free()                     # space is back

  Files on the tmpfs vanish when the block ends (it is unmounted): copy out what the
  test needs afterwards.

- :func:`flip_byte` XORs one byte of a file; :func:`flip_message_byte` finds where a
  message's stored text lies in a database file and flips a byte inside it (after a
  checkpoint, so that the text is in the file and the -wal is empty).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sqlite3
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

FILLER = ".filler"


@dataclass
class Disk:
    """A small file system mounted at ``path``, for one test."""

    path: Path

    @property
    def filler(self) -> Path:
        return self.path / FILLER

    def fill(self, leave: int = 0) -> int:
        """Write a filler file until the file system is full (ENOSPC at one byte), then
        give back ``leave`` bytes (room for a small write, not a large one); returns the
        bytes it holds. Call again after the test freed some space."""
        written = 0
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for chunk in (1 << 20, 1 << 16, 1 << 12, 1 << 8, 1):
                block = b"\0" * chunk
                while True:
                    try:
                        written += os.write(fd, block)
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise
                        break
        finally:
            os.close(fd)
        if leave:
            written = max(0, written - leave)
            os.truncate(self.filler, written)
        return written

    def free(self) -> None:
        """Give the filler's space back."""
        self.filler.unlink(missing_ok=True)

    def available(self) -> int:
        stats = os.statvfs(self.path)
        return stats.f_bavail * stats.f_frsize


@contextlib.contextmanager
def full_disk(parent: Path, size: str = "4m") -> Iterator[Disk]:
    """Mount a tmpfs of ``size`` (mount's syntax: "1m", "512k") in a new folder under
    ``parent`` and yield it as a :class:`Disk` (not yet full: call ``fill()``);
    unmount it at the end. Skips the test when this machine does not allow the mount
    (not Linux, not root, in a container without CAP_SYS_ADMIN)."""
    folder = parent / f"disk-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs",
                               str(folder)], capture_output=True, text=True)
    except OSError as exc:  # no mount program
        pytest.skip(reason=f"cannot mount a small file system to fill: {exc}")
    if done.returncode != 0:
        pytest.skip(reason=f"cannot mount a small file system to fill: {done.stderr.strip()}")
    try:
        yield Disk(folder)
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False, capture_output=True)


def flip_byte(path: Path, offset: int, mask: int = 0x80) -> int:
    """XOR the byte at ``offset`` of ``path`` with ``mask``; returns its new value."""
    with open(path, "r+b") as fh:
        fh.seek(offset)
        old = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([old ^ mask]))
    return old ^ mask


def pages_of_messages(path: Path, damage: Callable[[Path, int], None],
                      open_: Callable[[Path], sqlite3.Connection], page_size: int = 4096) -> list[int]:
    """The pages of ``path`` whose damage breaks a full scan of the messages table (its
    b-tree's pages): each page is damaged (``damage(copy, page)``) on a copy of the file,
    opened with ``open_``, and scanned; a copy that does not open at all does not count."""
    probe = path.with_name(path.name + ".probe")
    found = []
    for page in range(2, path.stat().st_size // page_size + 1):
        shutil.copyfile(path, probe)
        damage(probe, page)
        try:
            conn = open_(probe)
        except sqlite3.DatabaseError:
            continue
        try:
            conn.execute("SELECT max(length(content)) FROM messages NOT INDEXED").fetchone()
        except sqlite3.DatabaseError:
            found.append(page)
        finally:
            conn.close()
    probe.unlink(missing_ok=True)
    return found


def message_text_offset(db: Path, message_id: int, at: int = 0) -> int:
    """Where byte ``at`` of message ``message_id``'s stored text (UTF-8) lies in the
    database file. Checkpoints the WAL into the file first. The bytes around it must
    occur once in the file (pick a message with distinctive text)."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        row = conn.execute("SELECT CAST(content AS BLOB) FROM messages WHERE id = ?",
                           (message_id,)).fetchone()
        assert row is not None and row[0], f"message {message_id} has no text"
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    text: bytes = row[0]
    assert 0 <= at < len(text), f"message {message_id} has {len(text)} bytes, not {at + 1}"
    data = db.read_bytes()
    # a window after the byte, or before it (the text may continue on an overflow page)
    for start in (at, max(0, at - 23)):
        window = text[start:start + 24] if start == at else text[start:at + 1]
        if len(window) < 8 and len(text) >= 8:
            continue
        found = [i for i in _occurrences(data, window)]
        if len(found) == 1:
            return found[0] + (at - start)
    raise AssertionError(f"the text of message {message_id} around byte {at} is not unique "
                         "in the file (or spans a page boundary): pick another message or byte")


def _occurrences(data: bytes, needle: bytes) -> Iterator[int]:
    i = data.find(needle)
    while i != -1:
        yield i
        i = data.find(needle, i + 1)


def flip_message_byte(db: Path, message_id: int, at: int = 0, mask: int = 0x80) -> int:
    """Flip (XOR ``mask``) byte ``at`` of message ``message_id``'s stored text in the
    file ``db`` (closed by every writer first). 0x80 turns an ASCII character into a
    byte that is not UTF-8. Returns the file offset flipped."""
    offset = message_text_offset(db, message_id, at)
    flip_byte(db, offset, mask)
    return offset


def damage_pages(db: Path, table: str, count: int) -> None:
    """Overwrite ``count`` leaf pages of ``table`` from the middle of its b-tree."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        try:
            pages = [r[0] for r in conn.execute(
                "SELECT pageno FROM dbstat WHERE name = ? AND pagetype = 'leaf' ORDER BY path",
                (table,))]
        except sqlite3.OperationalError:
            pytest.skip(reason="this SQLite has no dbstat table to find a table's pages with")
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    middle = len(pages) // 2
    with open(db, "r+b") as fh:
        for page in pages[middle:middle + count]:
            fh.seek((page - 1) * page_size)
            fh.write(b"\xa5" * page_size)
