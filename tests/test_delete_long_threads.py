"""Threads as long as the chats Iris exists for: deleting one of 20,000 messages, linear
and branched, through the real CLI on a real database file, leaves no readable trace.

SQLite runs a foreign key's ON DELETE CASCADE as a trigger, one level per message along
the ``parent_id`` chain, and stops at 1,000 levels: before the fix, a chat of 1,000
messages or more could not be deleted ("too many levels of trigger recursion").
"""

from __future__ import annotations

import json
import sqlite3

import pytest

from iris_desktop.core.store import Store
from iris_desktop.paths import app_paths
from iris_desktop.tokens import Message

from support.helpers import run_cli as run
from support.helpers import vm_steps

#: made-up words: found in a file only if the chat's text is there
PLANTED = "qorvexillant"



def linear(n: int) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{PLANTED} {i} note"}
            for i in range(n)]


def branched(n: int) -> dict:
    """An ``iris-branches`` export: a line of n messages, with a second reply beside
    every 100th reply (a regenerated one), the first line active."""
    messages, next_id = [], 1
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        node = {"id": next_id, "parent_id": next_id - 1 if next_id > 1 else None, "active": True}
        messages.append({"role": role, "content": f"{PLANTED} {i}", "iris": node})
        next_id += 1
    chain = [m["iris"]["id"] for m in messages]
    for index in range(1, n, 200):  # an alternative reply beside every 100th reply
        parent = chain[index - 1]
        messages.append({"role": "assistant", "content": f"{PLANTED} again {index}",
                         "iris": {"id": next_id, "parent_id": parent, "active": False}})
        next_id += 1
    messages.sort(key=lambda m: m["iris"]["id"])
    return {"format": "iris-branches", "title": "long branched", "messages": messages}


def holders(data) -> list[str]:
    return sorted(str(p.relative_to(data)) for p in data.rglob("*")
                  if p.is_file() and PLANTED.encode() in p.read_bytes())


@pytest.mark.parametrize("shape", ["linear", "branched"])
def test_a_20000_message_chat_is_deleted_with_nothing_readable_left(capsys, tmp_path, shape):
    data = tmp_path / "home"
    source = tmp_path / "chat.json"
    source.write_text(json.dumps(linear(20_000) if shape == "linear" else branched(20_000)))
    code, out, err = run(capsys, "--data-dir", str(data), "import", str(source))
    assert code == 0, err
    thread = int(out.split()[0])
    kept_file = tmp_path / "kept.json"
    kept_file.write_text(json.dumps([{"role": "user", "content": "keep me"}]))
    code, out, _ = run(capsys, "--data-dir", str(data), "import", str(kept_file))
    kept = int(out.split()[0])
    db = app_paths(data).db_path
    with Store(db) as store:
        assert len(store.all_messages(thread)) >= 20_000
        store.cache_counts("chars", {m["id"]: 3 for m in store.all_messages(thread)[:50]})
    assert holders(data)  # it was there to be found

    code, out, err = run(capsys, "--data-dir", str(data), "delete", str(thread), "--yes")
    assert code == 0 and f"deleted thread {thread}" in out, err
    assert holders(data) == []
    conn = sqlite3.connect(db)
    for table in ("messages", "thread_paths", "token_counts", "message_vectors"):
        left = conn.execute(f"SELECT count(*) FROM {table} WHERE "
                            + ("message_id" if table != "messages" else "id")
                            + " NOT IN (SELECT id FROM messages WHERE thread_id = ?)", (kept,))
        assert left.fetchone()[0] == 0, table
    assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 1
    conn.close()
    code, out, _ = run(capsys, "--data-dir", str(data), "threads", "--json", "--no-model")
    assert [t["id"] for t in json.loads(out)] == [kept]


# -- the space a deleted chat took ------------------------------------------------------------


def _pragma(db, name: str) -> int:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(f"PRAGMA {name}").fetchone()[0]
    finally:
        conn.close()


def _filled(tmp_path, messages: int) -> tuple:
    """A data folder with one chat of ``messages`` long messages; (data, db, thread)."""
    data = tmp_path / "home"
    db = app_paths(data).db_path
    with Store(db) as store:
        thread = store.create_thread("long")
        store.add_messages(thread, [
            Message(role="user" if i % 2 == 0 else "assistant",
                    content=f"{PLANTED} {i} " + "words of a long reply " * 40)
            for i in range(messages)])
        store.checkpoint()
    return data, db, thread


def _made_by_an_older_iris(db) -> None:
    """The file as Iris made it before incremental vacuum: ``auto_vacuum`` off."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA auto_vacuum = NONE")
    conn.execute("VACUUM")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    assert _pragma(db, "auto_vacuum") == 0


@pytest.mark.parametrize("made_by", ["this iris", "an older iris"])
def test_deleting_a_long_chat_gives_its_space_back_to_the_disk(capsys, tmp_path, made_by):
    """Before: the file kept its size (20,000 messages: 18 MB stayed on the disk after the
    delete, zeroed but never freed). Now a file made by this Iris frees the pages at once,
    and an older file is rewritten once by the first large delete, incremental after it."""
    data, db, thread = _filled(tmp_path, 5_000)
    if made_by == "an older iris":
        _made_by_an_older_iris(db)
    before = db.stat().st_size
    assert before > 5_000_000
    code, out, err = run(capsys, "--data-dir", str(data), "delete", str(thread), "--yes")
    assert code == 0 and f"deleted thread {thread}" in out, err
    assert db.stat().st_size < before / 20
    assert _pragma(db, "auto_vacuum") == 2  # the next delete frees its pages at once
    assert _pragma(db, "freelist_count") == 0
    assert holders(data) == []


def test_a_small_delete_does_not_rewrite_an_older_large_file(capsys, tmp_path):
    """A rewrite (VACUUM) costs the whole file: a two-message chat deleted beside 5,000
    messages leaves an older file as it is (counted: it stays non-incremental), also one
    where earlier deletes of the older Iris left most of it free (a review: the free pages
    of the file were counted, not the ones this delete freed; a refused `chat --new`,
    deleting its empty chat, rewrote the whole file)."""
    data, db, _ = _filled(tmp_path, 5_000)
    with Store(db) as store:
        small = store.create_thread("small")
        store.add_message(small, Message(role="user", content=f"{PLANTED} small"))
        freed_before = store.create_thread("deleted by the older Iris")
        store.add_messages(freed_before, [Message(role="user", content="x " * 2_000)] * 800)
    _made_by_an_older_iris(db)
    conn = sqlite3.connect(db, isolation_level=None)  # its delete: the pages stay free
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("UPDATE messages SET parent_id = NULL WHERE thread_id = ?", (freed_before,))
    conn.execute("DELETE FROM threads WHERE id = ?", (freed_before,))
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    free, pages = _pragma(db, "freelist_count"), _pragma(db, "page_count")
    assert pages / 4 < free < pages / 2  # a quarter free, not half
    code, _, err = run(capsys, "--data-dir", str(data), "delete", str(small), "--yes")
    assert code == 0, err
    assert _pragma(db, "auto_vacuum") == 0
    with Store(db) as store:  # nothing else happens in a transaction of its caller
        with store.transaction():
            assert store.reclaim(10**6) is False


class _FullDisk:
    """The store's connection, where the rewrite of the file fails as on a full disk."""

    def __init__(self, conn):
        self._conn = conn

    def execute(self, sql, *args):
        if sql.strip().upper() == "VACUUM":
            raise sqlite3.OperationalError("database or disk is full")
        return self._conn.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._conn, name)


def test_a_rewrite_that_fails_leaves_the_delete_done(tmp_path, caplog):
    """The space not given back (a full disk) is logged; the chat is deleted all the same,
    the other chats are there, and the delete is not reported as failed."""
    _, db, thread = _filled(tmp_path, 400)
    _made_by_an_older_iris(db)
    with Store(db) as store:
        kept = store.create_thread("kept")
        store.add_message(kept, Message(role="user", content="keep me"))
        real = store.conn
        store.conn = _FullDisk(real)
        try:
            store.delete_thread(thread)
        finally:
            store.conn = real
        assert [t["id"] for t in store.threads()] == [kept]
    assert "the space of deleted messages stays" in caplog.text


def test_a_rewrite_cut_off_is_done_by_a_later_delete(capsys, tmp_path):
    """An audit: the one-time rewrite of an older file killed (or refused by a full disk)
    was never done again: the file kept 46 MB, more than half of it free, through later
    deletes. A delete now rewrites an older file once half of it is free, whoever freed
    it."""
    data, db, big = _filled(tmp_path, 5_000)
    with Store(db) as store:
        small = store.create_thread("small")
        store.add_message(small, Message(role="user", content=f"{PLANTED} small"))
    _made_by_an_older_iris(db)
    conn = sqlite3.connect(db, isolation_level=None)  # the delete whose rewrite was killed
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("UPDATE messages SET parent_id = NULL WHERE thread_id = ?", (big,))
    conn.execute("DELETE FROM threads WHERE id = ?", (big,))
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    before = db.stat().st_size
    assert _pragma(db, "freelist_count") * 2 > _pragma(db, "page_count")
    code, _, err = run(capsys, "--data-dir", str(data), "delete", str(small), "--yes")
    assert code == 0, err
    assert _pragma(db, "auto_vacuum") == 2 and db.stat().st_size < before / 10


def test_deleting_a_chat_costs_its_own_messages_not_the_whole_history(tmp_path):
    """Each deleted message's ON DELETE CASCADE into thread_paths (and SET NULL into
    threads.head_id) looked its rows up by message_id, which no index led: SQLite read
    every chat's path once per deleted message. A 1,000-message chat beside 150,000
    messages took 12 s, a 50,000-message one 14 minutes (audit, 7 December 2026)."""
    store = Store(tmp_path / "iris.db")
    for n in range(1_000):  # 1,000 other chats, 20,000 messages
        store.add_messages(store.create_thread(f"other {n}"), [
            {"role": "user" if i % 2 == 0 else "assistant", "content": f"filler {n} {i}"}
            for i in range(20)])
    victim = store.create_thread("victim")
    store.add_messages(victim, [{"role": "user" if i % 2 == 0 else "assistant",
                                 "content": f"victim {i}"} for i in range(1_000)])
    steps, _ = vm_steps(store, lambda: store.delete_thread(victim))
    assert store.message_count(victim) == 0
    # without the indexes: about 150 million steps (1,000 reads of 21,000 path rows)
    assert steps < 10_000_000, f"{steps:,} VM steps to delete 1,000 messages"
    store.close()
