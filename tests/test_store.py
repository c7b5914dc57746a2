import json
import os
import stat

import pytest

from iris_desktop.core.store import SCHEMA_VERSION, Store, StoreError, row_to_message

from conftest import AGENT_FILES, load_corpus


def test_pragmas_wal_foreign_keys_full_sync(fresh_store):
    conn = fresh_store.conn
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 5000
    assert fresh_store.schema_version == SCHEMA_VERSION


@pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX only")
def test_files_are_private(tmp_path):
    store = Store(tmp_path / "p.db")
    thread = store.create_thread("x")
    store.add_message(thread, {"role": "user", "content": "secret"})
    for suffix in ("", "-wal", "-shm"):
        path = tmp_path / f"p.db{suffix}"
        if path.exists():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, suffix
    store.close()


def test_round_trip_is_exact_for_corpus(fresh_store):
    messages = load_corpus(AGENT_FILES[0])
    thread = fresh_store.create_thread("t")
    fresh_store.add_messages(thread, messages)
    back = [row_to_message(r) for r in fresh_store.messages(thread)]
    assert json.dumps(back, sort_keys=True) == json.dumps(messages, sort_keys=True)


def test_turns_are_numbered_by_user_messages(fresh_store):
    thread = fresh_store.create_thread("t")
    roles = ["system", "user", "assistant", "user", "assistant", "tool", "assistant"]
    msgs = []
    for r in roles:
        m = {"role": r, "content": r}
        if r == "assistant" and len(msgs) == 4:
            m["tool_calls"] = [{"id": "c1", "type": "function",
                                "function": {"name": "f", "arguments": "{}"}}]
        if r == "tool":
            m["tool_call_id"] = "c1"
        msgs.append(m)
    fresh_store.add_messages(thread, msgs)
    assert [r["turn"] for r in fresh_store.messages(thread)] == [0, 1, 1, 2, 2, 2, 2]
    assert fresh_store.count_turns(thread) == 3  # turn 0 holds the system message
    assert fresh_store.count_turns(thread, after_id=1) == 2


def test_add_messages_is_atomic(fresh_store):
    thread = fresh_store.create_thread("t")
    with pytest.raises(ValueError):
        fresh_store.add_messages(thread, [{"role": "user", "content": "a"}, {"role": "robot"}])
    assert fresh_store.messages(thread) == []


def test_streaming_rows_only_change_while_streaming(fresh_store):
    thread = fresh_store.create_thread("t")
    user = fresh_store.add_message(thread, {"role": "user", "content": "hi"})
    reply = fresh_store.add_message(thread, {"role": "assistant", "content": ""}, status="streaming")
    fresh_store.update_streaming(reply, "Hel")
    fresh_store.update_streaming(reply, "Hello", status="complete")
    with pytest.raises(StoreError):
        fresh_store.update_streaming(reply, "changed later")
    with pytest.raises(StoreError):
        fresh_store.update_streaming(user, "rewrite the user")
    assert [r["content"] for r in fresh_store.messages(thread)] == ["hi", "Hello"]


def test_interrupted_streams_are_marked_on_start(fresh_store):
    thread = fresh_store.create_thread("t")
    reply = fresh_store.add_message(thread, {"role": "assistant", "content": "par"}, status="streaming")
    assert fresh_store.mark_interrupted_streams() == 1
    assert fresh_store.messages(thread)[0]["status"] == "interrupted"
    assert fresh_store.messages(thread)[0]["id"] == reply


def test_fts_search_finds_message_text(fresh_store):
    thread = fresh_store.create_thread("Holiday plans")
    fresh_store.add_messages(thread, [
        {"role": "user", "content": "I adopted a greyhound named Pixel"},
        {"role": "assistant", "content": "Lovely"},
    ])
    hits = fresh_store.search("greyhound")
    assert hits and hits[0]["thread_id"] == thread and "[greyhound]" in hits[0]["snippet"]
    assert fresh_store.search("holiday")[0]["message_id"] is None


def test_two_connections_share_one_file(tmp_path):
    a, b = Store(tmp_path / "s.db"), Store(tmp_path / "s.db")
    thread = a.create_thread("t")
    a.add_message(thread, {"role": "user", "content": "from a"})
    assert b.messages(thread)[0]["content"] == "from a"
    a.close()
    b.close()


def test_corrupt_file_gives_a_clear_error(tmp_path):
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="bad.db"):
        Store(bad)


def test_newer_schema_is_refused(tmp_path):
    store = Store(tmp_path / "n.db")
    store.conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    store.close()
    with pytest.raises(StoreError, match="newer"):
        Store(tmp_path / "n.db")


def test_migration_from_version_1(tmp_path):
    import sqlite3

    from iris_desktop.core import store as store_module
    conn = sqlite3.connect(tmp_path / "old.db")
    for statement in store_module._split_sql(store_module.MIGRATIONS[0]):
        conn.execute(statement)
    conn.execute("INSERT INTO threads(title, created_at, updated_at) VALUES ('t', 0, 0)")
    conn.execute("INSERT INTO messages(thread_id, turn, role, content, created_at) "
                 "VALUES (1, 1, 'user', 'an old walrus', 0)")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    store = Store(tmp_path / "old.db")
    assert store.schema_version == SCHEMA_VERSION
    assert store.search("walrus")[0]["thread_id"] == 1
    store.close()
