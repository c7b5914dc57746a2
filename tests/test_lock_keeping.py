"""Reading a database file's first bytes never drops this process's SQLite locks on it.

POSIX drops every lock a process holds on a file when the process closes any descriptor of
it. Iris read the history's header that way (to explain an error: a search for text with
a NUL in it was enough) and every encrypted connection read the file's salt that way,
while other connections of the process had the history open: the next Iris process to
close its connection then took itself for the last one, checkpointed and deleted the
``-wal`` and ``-shm`` this process still wrote to (the s67 data-safety audit: the history
damaged and a whole import lost). Each test here has another process open and close the
history after the read, as a CLI command beside the window does, and checks that the
``-wal`` is still there, and that the history is whole after both wrote.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from iris_desktop.core.store import open_store
from iris_desktop.core.store.cipher import Key, connect, file_salt, is_encrypted
from iris_desktop.core.store.heads import head, kept_count
from iris_desktop.core.store.recovery import explain, header_problems

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX advisory locks")

_OTHER = """
import sys
key = sys.argv[2]
if key:
    import sqlcipher3 as sqlite3
else:
    import sqlite3
c = sqlite3.connect(sys.argv[1])
if key:
    c.execute(f'PRAGMA key = "{key}"')
c.execute("INSERT INTO threads (title, created_at, updated_at) VALUES ('other', 0, 0)")
c.commit()
c.close()
"""


def _other_process_writes(db: Path, key: Key | None = None) -> None:
    """Another process opens the history, writes a chat and closes: the last connection
    to close checkpoints and deletes the -wal and -shm."""
    subprocess.run([sys.executable, "-c", _OTHER, str(db), key.attach_value() if key else ""],
                   check=True, timeout=60)


def _whole(db: Path, key: Key | None = None) -> list[str]:
    conn = connect(db, key)
    try:
        checked = [row[0] for row in conn.execute("PRAGMA integrity_check")]
        titles = [row[0] for row in conn.execute("SELECT title FROM threads ORDER BY id")]
    finally:
        conn.close()
    assert checked == ["ok"], checked
    return titles


def test_a_header_read_beside_an_open_history_keeps_its_log(tmp_path):
    db = tmp_path / "iris.db"
    store, _ = open_store(db)
    try:
        thread = store.create_thread("mine")
        store.add_message(thread, {"role": "user", "content": "hello"})
        assert header_problems(db) == []  # (read as explain() reads it for an error)
        _other_process_writes(db)
        assert (tmp_path / "iris.db-wal").exists()  # before: deleted under this process
        store.add_message(thread, {"role": "user", "content": "still here"})
    finally:
        store.close()
    assert _whole(db) == ["mine", "other"]


def test_explaining_an_error_keeps_the_log(tmp_path):
    db = tmp_path / "iris.db"
    store, _ = open_store(db)
    try:
        store.create_thread("mine")
        with pytest.raises(sqlite3.Error) as failed:
            store.conn.execute("SELECT no_such_column FROM threads")
        explain(failed.value, db)  # SQLITE_ERROR: the header was read to say more
        _other_process_writes(db)
        assert (tmp_path / "iris.db-wal").exists()
    finally:
        store.close()
    assert _whole(db) == ["mine", "other"]


def test_an_encrypted_connection_opened_beside_another_keeps_the_log(tmp_path):
    pytest.importorskip("sqlcipher3")
    db = tmp_path / "iris.db"
    key = Key.raw(bytes(range(32)))
    store, _ = open_store(db, key)
    try:
        store.create_thread("mine")
        assert is_encrypted(db) is True and file_salt(db) is not None
        second = connect(db, key)  # (reads the file's salt for its key: a window's job)
        second.execute("SELECT count(*) FROM threads").fetchone()
        second.close()
        _other_process_writes(db, key)
        assert (tmp_path / "iris.db-wal").exists()
    finally:
        store.close()
    assert _whole(db, key) == ["mine", "other"]


def test_the_kept_descriptor_of_a_deleted_file_is_closed(tmp_path):
    first, second = tmp_path / "a.db", tmp_path / "b.db"
    first.write_bytes(b"SQLite format 3\x00" + bytes(84))
    second.write_bytes(b"x" * 10)
    assert head(second, 4) == b"xxxx"  # (earlier tests' deleted files: closed here)
    before = kept_count()
    assert head(first, 16) == b"SQLite format 3\x00"
    assert head(first, 16) == b"SQLite format 3\x00" and kept_count() == before + 1  # one
    first.unlink()
    assert head(second, 4) == b"xxxx"
    assert kept_count() == before  # the deleted one's closed, b.db's kept


def test_a_named_pipe_is_read_without_waiting(tmp_path):
    pipe = tmp_path / "iris.db"
    os.mkfifo(pipe)
    assert head(pipe, 16) == b""  # (no writer: nothing, at once)
