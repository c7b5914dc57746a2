import json
import os
import sqlite3
import stat
import threading

import pytest

from iris_desktop.core.store import SCHEMA_VERSION, Store, StoreError, Stores, open_stores, row_to_message

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
    assert len(fresh_store.mark_interrupted_streams()) == 1
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


def database_at(path, version: int) -> sqlite3.Connection:
    """A database as Iris's schema ``version`` made it (its first ``version`` migrations),
    open, for a migration test to fill before Iris opens it."""
    from iris_desktop.core import store as store_module

    conn = sqlite3.connect(path)
    for script in store_module.MIGRATIONS[:version]:
        for statement in store_module._split_sql(script):
            conn.execute(statement)
    return conn


def test_migration_7_keeps_the_vectors_an_older_semantic_index_made(tmp_path):
    """Before schema 7 the semantic index created message_vectors itself, so a database
    at schema 6 may already have it: it migrates, and its vectors stay."""
    conn = database_at(tmp_path / "six.db", 6)
    conn.execute("""
        CREATE TABLE IF NOT EXISTS message_vectors (
            message_id INTEGER PRIMARY KEY REFERENCES messages(id) ON DELETE CASCADE,
            model TEXT NOT NULL,
            vector BLOB NOT NULL
        )""")  # what SemanticIndex ran before schema 7
    conn.execute("INSERT INTO threads(title, created_at, updated_at) VALUES ('t', 0, 0)")
    conn.execute("INSERT INTO messages(thread_id, turn, role, content, created_at) "
                 "VALUES (1, 1, 'user', 'I adopted a kitten', 0)")
    conn.execute("INSERT INTO message_vectors(message_id, model, vector) VALUES (1, 'minilm', x'0000803f')")
    conn.execute("PRAGMA user_version = 6")
    conn.commit()
    conn.close()
    with Store(tmp_path / "six.db") as store:
        assert store.schema_version == SCHEMA_VERSION >= 7
        assert list(store.iter_vectors(1, 0, 1, "minilm", block=10)) == [[(1, b"\x00\x00\x80\x3f")]]
        assert store.first_without_vector(1, 0, 1, "minilm") is None


def test_migration_11_keeps_one_vector_per_model_and_deletes_them_with_the_message(tmp_path):
    """Schema 10 held one vector per message; from 11 a message holds one per model (a
    change of embedder keeps the old vectors until the new ones are complete), and the
    vectors made before migrate as they were; 12 indexes which messages hold a model's
    vector apart from the vectors."""
    from iris_desktop.core.store import vectors as vectors_module
    conn = database_at(tmp_path / "ten.db", 10)
    conn.execute("INSERT INTO threads(title, created_at, updated_at) VALUES ('t', 0, 0)")
    conn.execute("INSERT INTO messages(thread_id, turn, role, content, created_at) "
                 "VALUES (1, 1, 'user', 'I adopted a kitten', 0)")
    conn.execute("INSERT INTO message_vectors(message_id, model, vector) VALUES (1, 'minilm', x'0000803f')")
    conn.execute("PRAGMA user_version = 10")
    conn.commit()
    conn.close()
    with Store(tmp_path / "ten.db") as store:
        assert store.schema_version == SCHEMA_VERSION >= 11
        assert list(store.iter_vectors(1, 0, 1, "minilm", block=10)) == [[(1, b"\x00\x00\x80\x3f")]]
        store.save_vectors("bge", [(1, b"\x00\x00\x00\x00")])
        assert store.vector_counts("bge") == (1, 0) and store.vector_counts("minilm") == (1, 0)
        assert store.other_vector_models("bge") == ["minilm"]
        assert list(store.iter_vectors(1, 0, 1, "minilm", block=10)) == [[(1, b"\x00\x00\x80\x3f")]]
        store.save_vectors("minilm", [(1, b"\x00\x00\x00\x40")])  # its own model's vector is replaced
        assert list(store.iter_vectors(1, 0, 1, "minilm", block=10)) == [[(1, b"\x00\x00\x00\x40")]]
        store.add_message(1, {"role": "user", "content": "only the old model embedded this"})
        store.save_vectors("minilm", [(2, b"\x00\x00\x80\x3f")])
        assert store.vector_counts("bge") == (1, 1)
        # 12: "has it a vector?" and the counts read the (model, message_id) index, not the vectors
        plan = " ".join(str(row) for row in store.conn.execute(
            "EXPLAIN QUERY PLAN SELECT m.id FROM messages m WHERE m.id > 0 AND "
            f"{vectors_module._NO_VECTOR}", {"model": "bge"}))
        assert "COVERING INDEX message_vectors_model" in plan
        assert store.first_without_vector(1, 0, 2, "bge") == 2
        store.delete_thread(1)
        assert store.conn.execute("SELECT count(*) FROM message_vectors").fetchone() == (0,)


def test_a_new_database_has_message_vectors(fresh_store):
    tables = {r[0] for r in fresh_store.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert fresh_store.schema_version == SCHEMA_VERSION >= 7 and "message_vectors" in tables
    thread = fresh_store.create_thread("t")
    ids = fresh_store.add_messages(thread, [{"role": "user", "content": "hello"},
                                            {"role": "assistant", "content": "  "}])
    assert fresh_store.first_without_vector(thread, 0, ids[-1], "m") == ids[0]  # blank text: none due
    fresh_store.save_vectors("m", [(ids[0], b"1234"), (ids[-1] + 7, b"gone")])  # a deleted one is skipped
    assert list(fresh_store.iter_vectors(thread, 0, ids[-1], "m", block=1)) == [[(ids[0], b"1234")]]
    assert fresh_store.messages_without_vector(None, 0, "another model", 10)[0]["id"] == ids[0]


def test_a_threads_vectors_are_read_alone_whether_its_messages_fill_the_range_or_are_scattered(fresh_store):
    """A long chat read from its start is read in the vectors' key order, checked against
    the thread; one whose messages are scattered among another's by one lookup each. Both
    give exactly the thread's vectors of the range, in id order, that model's only."""
    dense, sparse = fresh_store.create_thread("dense"), fresh_store.create_thread("sparse")
    ids = {dense: fresh_store.add_messages(dense, [{"role": "user", "content": f"a{n}"} for n in range(300)]),
           sparse: []}
    for n in range(100):  # the two chats in turns (one message of the sparse one in four), then it alone
        ids[sparse] += fresh_store.add_messages(sparse, [{"role": "user", "content": f"b{n}"}])
        ids[dense] += fresh_store.add_messages(dense, [{"role": "user", "content": f"b{n}"}] * 3)
    ids[sparse] += fresh_store.add_messages(sparse, [{"role": "user", "content": f"c{n}"} for n in range(10)])
    every = sorted(ids[dense] + ids[sparse])
    fresh_store.save_vectors("m", [(i, i.to_bytes(4, "little")) for i in every])
    fresh_store.save_vectors("other", [(i, b"none") for i in every])
    plans = []
    fresh_store.conn.set_trace_callback(
        lambda sql: "message_vectors v" in sql and plans.append("CROSS JOIN" in sql))
    for thread in (dense, sparse):
        for after, through in ((0, every[-1]), (ids[thread][10], ids[thread][90])):
            want = [(i, i.to_bytes(4, "little")) for i in ids[thread] if after < i <= through]
            got = [row for block in fresh_store.iter_vectors(thread, after, through, "m", block=64)
                   for row in block]
            assert got == want
    fresh_store.conn.set_trace_callback(None)
    assert plans == [True, True, False, False]


def closed(store: Store) -> bool:
    try:
        store.conn.execute("SELECT 1")
    except sqlite3.ProgrammingError:
        return True
    return False


def in_a_thread(fn):
    """Run ``fn`` on a new thread and return what it returned."""
    box = []
    worker = threading.Thread(target=lambda: box.append(fn()))
    worker.start()
    worker.join()
    return box[0]


def test_stores_give_each_thread_its_own_store_on_one_file(tmp_path):
    stores = Stores(tmp_path / "s.db")
    mine = stores.current()
    assert stores.current() is mine
    thread = mine.create_thread("t")
    mine.add_message(thread, {"role": "user", "content": "from this thread"})

    def worker() -> tuple[Store, bool, list[str]]:
        store = stores.current()
        store.add_message(thread, {"role": "assistant", "content": "from the worker"})
        return store, stores.current() is store, [r["content"] for r in store.messages(thread)]

    theirs, same, seen = in_a_thread(worker)
    assert theirs is not mine and same
    assert seen == ["from this thread", "from the worker"]
    assert [r["content"] for r in mine.messages(thread)] == seen
    stores.close()


def test_release_closes_only_the_callers_store(tmp_path):
    stores = Stores(tmp_path / "s.db")
    mine = stores.current()
    theirs = in_a_thread(stores.current)
    stores.release()
    assert closed(mine) and not closed(theirs)
    again = stores.current()
    assert again is not mine and not closed(again)
    stores.release()
    assert closed(again)
    stores.release()  # nothing left to release
    stores.close()
    assert closed(theirs)


def test_close_closes_every_store_and_is_idempotent(tmp_path):
    stores = Stores(tmp_path / "s.db")
    opened = [stores.current(), in_a_thread(stores.current)]
    stores.close()
    assert all(closed(store) for store in opened)
    stores.close()


def test_open_stores_checks_once_and_hands_over_the_store_it_opened(tmp_path):
    stores, recovery = open_stores(tmp_path / "s.db")
    assert recovery is None
    mine = stores.current()
    assert stores.current() is mine and mine.schema_version == SCHEMA_VERSION
    assert in_a_thread(stores.current) is not mine
    stores.close()
    assert closed(mine)


def test_an_existing_history_reopens_with_its_threads_branches_and_counts(existing_store):
    """What a start finds: the threads newest first with their message counts, the
    active branch of the regenerated reply, nothing cached that is stale."""
    threads = existing_store.threads()
    assert [(t["title"], t["messages"]) for t in threads] == [("Trip", 3), ("The garden", 6)]
    trip = threads[0]["id"]
    assert [r["content"] for r in existing_store.messages(trip)][-1] == "Sunscreen, shoes, a hat."
    assert existing_store.has_branches(trip)
    assert existing_store.conn.execute("SELECT count(*) FROM token_counts").fetchone()[0] == 0


_OPEN_AT = """
import sys, time
from iris_desktop.core.store import Store
start = float(sys.argv[2])
while time.time() < start:
    pass
Store(sys.argv[1]).close()
"""


def test_processes_creating_the_same_new_database_at_once_all_open_it(tmp_path):
    """Two commands started together on a new data folder: one failed with "index
    message_vectors_model already exists" (both had read schema version 0 and each applied
    the first migration), or "another Iris process is writing" (SQLite does not wait for the
    switch to WAL). Real processes, released at the same instant, three rounds."""
    import subprocess
    import sys
    import time

    for round_ in range(3):
        db = tmp_path / f"new-{round_}" / "iris.db"
        start = time.time() + 1.5
        procs = [subprocess.Popen([sys.executable, "-c", _OPEN_AT, str(db), str(start)],
                                  stderr=subprocess.PIPE, text=True) for _ in range(4)]
        errors = [p.communicate(timeout=120)[1] for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0, 0], errors
        with Store(db) as store:
            assert store.schema_version == SCHEMA_VERSION and store.integrity_check() == "ok"


def test_the_search_box_finds_titles_in_any_case_and_order_and_words_inside_cjk_and_emoji(fresh_store):
    """An audit: title search was case-sensitive outside ASCII, kept the words' order and
    took % and _ as wildcards; 日本 inside 東京は日本の首都です and an emoji alone were
    never found ("No match"); a pasted page of prefixes took 40 s."""
    from iris_desktop.core.store.search import MAX_SEARCH_TERMS

    ids = {title: fresh_store.create_thread(title) for title in (
        "Привет план", "Ölwechsel Termin", "Trip plans Paris", "done_ok", "doneXok", "500 off")}
    fresh_store.add_messages(ids["done_ok"], [{"role": "user", "content": "東京は日本の首都です"},
                                              {"role": "assistant", "content": "Pizza 🍕 tonight"}])

    def titles(query: str) -> list[str]:
        return [h["title"] for h in fresh_store.search(query) if h["message_id"] is None]

    assert titles("ПРИВЕТ") == ["Привет план"] and titles("ölwechsel") == ["Ölwechsel Termin"]
    assert titles("paris trip") == ["Trip plans Paris"]
    assert titles("done_ok") == ["done_ok"] and titles("50%") == [] and titles("%") == []
    hits = [h for h in fresh_store.search("日本") if h["message_id"] is not None]
    assert len(hits) == 1 and "[日本]" in hits[0]["snippet"]
    assert len([h for h in fresh_store.search("🍕") if h["message_id"] is not None]) == 1
    assert fresh_store.search(" ".join(f"w{n}" for n in range(5_000))) == []  # bounded
    assert MAX_SEARCH_TERMS == 16


def test_a_draft_keeps_its_files_until_they_are_changed_and_a_damaged_record_gives_none(
        fresh_store):
    """Files attached to a draft are kept with it (schema 15): saving the text alone
    leaves them, an empty list removes them, a draft of no text and no files is none,
    and a files record Iris could not have written reads as no files, not an error."""
    thread = fresh_store.create_thread("trip")
    fresh_store.save_draft(thread, "see the plan", [("plan.md", "Day 1: Porto")])
    fresh_store.save_draft(thread, "see the plan, please")
    assert fresh_store.draft_with_files(thread) == ("see the plan, please",
                                                    [("plan.md", "Day 1: Porto")])
    fresh_store.save_draft(thread, "")
    assert fresh_store.draft_with_files(thread) == ("", [("plan.md", "Day 1: Porto")])
    fresh_store.save_draft(thread, "", [])
    assert fresh_store.conn.execute("SELECT count(*) FROM drafts").fetchone()[0] == 0
    for damaged in ("{not json", '{"name": "a"}', '[{"name": 3, "text": "x"}, "b"]'):
        fresh_store.save_draft(thread, "text")
        fresh_store.conn.execute("UPDATE drafts SET files = ?", (damaged,))
        assert fresh_store.draft_with_files(thread) == ("text", [])


def test_migration_15_keeps_the_drafts_and_gives_them_no_files(tmp_path):
    """Schema 14 kept a draft's text; 15 keeps the files attached to it too: a draft
    written before comes back as it was, with no files."""
    conn = database_at(tmp_path / "fourteen.db", 14)
    conn.execute("INSERT INTO threads(title, created_at, updated_at) VALUES ('t', 0, 0)")
    conn.execute("INSERT INTO drafts(key, thread_id, text, saved_at) VALUES (1, 1, 'half a thought', 0)")
    conn.execute("PRAGMA user_version = 14")
    conn.commit()
    conn.close()
    with Store(tmp_path / "fourteen.db") as store:
        assert store.schema_version == SCHEMA_VERSION >= 15
        assert store.draft_with_files(1) == ("half a thought", [])


def test_one_long_chat_does_not_fill_the_search_results(fresh_store):
    """Before (an audit): the 50 result rows were the best 50 hits of any chat, so a long
    chat that says "Lisbon" a thousand times hid the one other chat that does (its one
    message, longer, ranks below all of them). Now each chat's best HITS_PER_CHAT come
    first, chosen over every hit, each chat's together, then the rest fill the rows."""
    from iris_desktop.core.store.search import HITS_PER_CHAT

    long = fresh_store.create_thread("trip diary")
    fresh_store.add_messages(long, [{"role": "user", "content": f"Lisbon {i}"} for i in range(1000)])
    other = fresh_store.create_thread("work")
    fresh_store.add_messages(other, [{"role": "user", "content": "we talked about moving the "
                                      "whole office to Lisbon next spring, with everyone"}])
    hits = [h for h in fresh_store.search("lisbon") if h["message_id"] is not None]
    threads = [h["thread_id"] for h in hits]
    assert len(hits) == 50 and threads.index(other) == HITS_PER_CHAT  # right after the first five
    assert threads[:HITS_PER_CHAT] == [long] * HITS_PER_CHAT and threads.count(long) == 49
    few = [h for h in fresh_store.search("lisbon", limit=6) if h["message_id"] is not None]
    assert [h["thread_id"] for h in few] == [long] * HITS_PER_CHAT + [other]


def test_the_as_written_search_keeps_the_best_hits_when_the_first_round_passes_the_limit():
    """A review found the path for CJK and emoji grouped before it cut: with a small
    limit, one chat kept five hits while a better-ranked hit of another was dropped."""
    from iris_desktop.core.store.search import _spread

    hits = [{"thread_id": t, "rank": i} for i, t in enumerate([1, 1, 2, 1, 3, 2, 1, 1, 1, 1, 4])]
    assert [(h["thread_id"], h["rank"]) for h in _spread(hits, 4)] == [(1, 0), (1, 1), (1, 3), (2, 2)]
    assert [h["thread_id"] for h in _spread(hits, 20)] == [1, 1, 1, 1, 1, 2, 2, 3, 4, 1, 1]
