"""What the store's work on a long chat costs, counted (SQL statements, SQLite VM steps),
never timed: switching branches at an old reply (it walked the chain one message at a
time: 200,000 statements, 5 s, on a 50,000-message chat) and searching for a one-letter
or very common word (it ranked every match: "a" ranked 134,120 messages, 5.6 s)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from iris_desktop.core.store import Store

from support.helpers import vm_steps


def chat(count: int, tag: str = "") -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant",
             "content": f"{'question' if i % 2 == 0 else 'answer'} {i} {tag} about the garden"}
            for i in range(count)]


@contextmanager
def statements(store: Store) -> Iterator[list[str]]:
    """The SQL statements the store runs inside the block (trigger bodies included)."""
    seen: list[str] = []
    store.conn.set_trace_callback(seen.append)
    try:
        yield seen
    finally:
        store.conn.set_trace_callback(None)


def paths(conn: sqlite3.Connection) -> tuple[list[tuple], list[tuple]]:
    return (conn.execute("SELECT thread_id, message_id FROM thread_paths ORDER BY 1, 2").fetchall(),
            conn.execute("SELECT id, head_id FROM threads ORDER BY id").fetchall())


# -- the branch switch as it was (one statement or more a message), the reference --

def old_newest_leaf(conn: sqlite3.Connection, message_id: int) -> int:
    current = message_id
    while True:
        row = conn.execute("SELECT max(id) FROM messages WHERE parent_id = ?", (current,)).fetchone()
        if row[0] is None:
            return current
        current = row[0]


def old_set_head(conn: sqlite3.Connection, thread_id: int, message_id: int | None) -> None:
    def placed(mid: int) -> bool:
        return conn.execute("SELECT 1 FROM thread_paths WHERE thread_id = ? AND message_id = ?",
                            (thread_id, mid)).fetchone() is not None
    chain, current = [], message_id
    while current is not None and not placed(current):
        chain.append(current)
        current = conn.execute("SELECT parent_id FROM messages WHERE id = ?", (current,)).fetchone()[0]
    fork = current if current is not None else 0
    conn.execute("DELETE FROM thread_paths WHERE thread_id = ? AND message_id > ?", (thread_id, fork))
    conn.executemany("INSERT INTO thread_paths(thread_id, message_id) VALUES (?, ?)",
                     [(thread_id, mid) for mid in reversed(chain)])
    conn.execute("UPDATE threads SET head_id = ? WHERE id = ?", (message_id, thread_id))
    conn.commit()


def copy_of(store: Store) -> sqlite3.Connection:
    copy = sqlite3.connect(":memory:")
    store.conn.backup(copy)
    return copy


def shaped(store: Store, shape: str) -> int:
    """A 60-message chat with branches of ``shape``; returns the thread."""
    thread = store.create_thread(shape)
    ids = store.add_messages(thread, chat(60))
    other = store.create_thread("another chat beside it")
    store.add_messages(other, chat(6, "other"))
    reply = {"role": "assistant", "content": "a regenerated answer"}
    if shape in ("regenerate at start", "nested"):
        store.add_message(thread, reply, parent_id=ids[0])
        store.add_messages(thread, chat(7, "after the new reply"))
    if shape in ("regenerate in the middle", "nested"):
        store.add_message(thread, reply, parent_id=ids[30])
    if shape == "regenerate at the end":
        store.add_message(thread, reply, parent_id=ids[-2])
        store.add_message(thread, {"role": "assistant", "content": "a third"}, parent_id=ids[-2])
    if shape in ("edit", "nested"):
        edited = store.add_message(thread, {"role": "user", "content": "edited"}, parent_id=ids[5])
        store.add_messages(thread, chat(9, "below the edit"))
        if shape == "nested":  # a branch inside that branch, and one from the very start
            store.add_message(thread, reply, parent_id=edited)
            store.add_messages(thread, chat(4, "below both"))
            store.add_message(thread, {"role": "user", "content": "a new first"}, parent_id=None)
    return thread


SHAPES = ["regenerate at start", "regenerate in the middle", "regenerate at the end", "edit", "nested"]


@pytest.mark.parametrize("shape", SHAPES)
def test_switching_branches_leaves_the_path_and_head_the_old_walk_left(fresh_store, shape):
    thread = shaped(fresh_store, shape)
    everything = [r[0] for r in fresh_store.conn.execute(
        "SELECT id FROM messages WHERE thread_id = ? ORDER BY id", (thread,))]
    forks = [mid for mid in everything if len(fresh_store.alternatives(mid)) > 1]
    assert forks
    tried = 0
    for mid in forks * 2:  # each alternative both ways, twice: from every path they leave
        for step in (-1, 1):
            siblings = fresh_store.alternatives(mid)
            if not 0 <= siblings.index(mid) + step < len(siblings):
                continue
            before = copy_of(fresh_store)
            expected_head = old_newest_leaf(before, siblings[siblings.index(mid) + step])
            old_set_head(before, thread, expected_head)
            assert fresh_store.switch_branch(thread, mid, step) == expected_head
            assert paths(fresh_store.conn) == paths(before)
            tried += 1
    assert tried >= 2
    for target in [everything[0], everything[len(everything) // 2], everything[-1], None,
                   fresh_store.head(thread)]:  # the first, one in the middle, none, itself
        before = copy_of(fresh_store)
        old_set_head(before, thread, target)
        fresh_store.set_head(thread, target)
        assert paths(fresh_store.conn) == paths(before)
        assert [old_newest_leaf(before, m) for m in everything[::7]] == \
            [fresh_store.newest_leaf(m) for m in everything[::7]]


def test_switching_back_at_an_old_reply_of_a_long_chat_costs_a_few_statements(fresh_store):
    thread = fresh_store.create_thread("long")
    ids = fresh_store.add_messages(thread, chat(5_000))
    newer = fresh_store.add_message(thread, {"role": "assistant", "content": "again"}, parent_id=ids[2])
    assert fresh_store.alternatives(newer) == [ids[3], newer]
    with statements(fresh_store) as older:
        assert fresh_store.switch_branch(thread, newer, -1) == ids[-1]  # 4,996 below the fork
    with statements(fresh_store) as back:
        assert fresh_store.switch_branch(thread, ids[3], 1) == newer
    with statements(fresh_store) as again:
        assert fresh_store.switch_branch(thread, newer, -1) == ids[-1]
    assert [r["id"] for r in fresh_store.messages(thread)] == ids
    # before: 4 statements a message below the fork (about 20,000 here)
    assert len(older) <= 15 and len(back) <= 15 and len(again) <= 15, (len(older), older[:12])


def test_a_chain_of_60000_messages_is_switched_in_one_recursive_query(fresh_store):
    """SQLite limits how deep triggers nest, not how long a recursive query runs: a
    60,000-message branch is found and put on the path whole."""
    thread = fresh_store.create_thread("very long")
    ids = fresh_store.add_messages(thread, chat(60_000))
    newer = fresh_store.add_message(thread, {"role": "assistant", "content": "again"}, parent_id=ids[0])
    with statements(fresh_store) as seen:
        assert fresh_store.switch_branch(thread, newer, -1) == ids[-1]
    assert len(seen) <= 15
    assert fresh_store.head(thread) == ids[-1]
    assert fresh_store.conn.execute("SELECT count(*), min(message_id), max(message_id) FROM thread_paths "
                                    "WHERE thread_id = ?", (thread,)).fetchone() == (60_000, ids[0], ids[-1])


# -- the chat list's search on a long history --

SAYINGS = [
    "I love the way the tomatoes came up after all that rain last week",
    "a quick note about the garden: water the beans in the evening",
    "Thanks, that is a great idea, I will try it at the weekend",
    "we should go to the market on Saturday and ask about apple trees",
    "the recipe says a cup of flour and an egg, then bake it for an hour",
    "Sure thing! They said the concert starts at eight, so let us meet at seven",
    "Looking forward to more cool memories with all of you this summer",
    "my brother asked whether the apartment has a balcony and a view",
]


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> Iterator[Store]:
    """About 50,000 messages in four chats, the longest first (oldest); one rare word in
    the oldest chat's sixth message, another in 1,000 of its messages (the first, oldest,
    holds that word alone: it ranks first)."""
    store = Store(tmp_path_factory.mktemp("history") / "iris.db")
    for title, count in (("long", 40_000), ("middle", 8_000), ("short", 2_000), ("newest", 10)):
        thread = store.create_thread(title)
        store.add_messages(thread, [
            {"role": "user" if i % 2 == 0 else "assistant",
             "content": "rare7q" if (title, i) == ("long", 0) else
                        f"[{i}] {SAYINGS[(i * 3 + len(title)) % len(SAYINGS)]}"
                        + (" needle3zq" if (title, i) == ("long", 5) else "")
                        + (" rare7q" if title == "long" and i % 40 == 0 else "")}
            for i in range(count)])
    yield store
    store.close()


def search_steps(store: Store, query: str) -> tuple[int, list[dict]]:
    """SQLite VM steps (in hundreds) :meth:`Store.search` takes for ``query``, and its
    message hits."""
    steps, hits = vm_steps(store, lambda: store.search(query), every=100)
    return steps // 100, [h for h in hits if h["message_id"] is not None]


@pytest.mark.parametrize("query", ["a", "I", "the", "I love", "a cup of", "an"])
def test_a_one_letter_or_very_common_search_ranks_a_bounded_number_of_matches(history, query):
    """Before: every match was ranked ("a", every word in a, is 45,000 of these 50,000
    messages: 2.9 M VM steps; "the" 1.7 M). Now a one- or two-letter word is a whole word
    and at most MAX_RANKED matches, the newest, are ranked: a few hundred thousand steps
    whatever the history's length (the FTS index's own reads are not VM steps)."""
    from iris_desktop.core.store.search import HITS_PER_CHAT, MAX_RANKED, _fts_part

    steps, hits = search_steps(history, query)
    assert len(hits) == 50
    assert steps * 100 <= 150 * MAX_RANKED, steps  # about 85 steps a ranked match here
    fts = " ".join(_fts_part(word)[0] for word in query.split())
    newest = {r[0] for r in history.conn.execute(
        "SELECT rowid FROM messages_fts WHERE messages_fts MATCH ? ORDER BY rowid DESC LIMIT ?",
        (fts, MAX_RANKED))}
    assert {h["message_id"] for h in hits} <= newest  # the best of the newest matches
    chats = [h["thread_id"] for h in hits]
    assert len(set(chats[:HITS_PER_CHAT * 2])) >= 2  # still several chats' hits first


def test_a_short_word_is_a_whole_word_and_a_longer_one_a_prefix_as_before(fresh_store):
    thread = fresh_store.create_thread("words")
    ids = fresh_store.add_messages(thread, [
        {"role": "user", "content": "apples and pears"}, {"role": "assistant", "content": "a pear"},
        {"role": "user", "content": "let us go"}, {"role": "assistant", "content": "google it"},
        {"role": "user", "content": "the garden"}, {"role": "assistant", "content": "AI and js"}])

    def found(query: str) -> list[int]:
        return sorted(h["message_id"] for h in fresh_store.search(query) if h["message_id"])
    assert found("a") == [ids[1]]  # not "apples", "and"
    assert found("go") == [ids[2]] and found("goo") == [ids[3]]
    assert found("gar") == [ids[4]] and found("pear") == [ids[0], ids[1]]
    assert found("ai") == [ids[5]] and found("JS") == [ids[5]] and found("a pear") == [ids[1]]


def test_a_rare_word_is_still_found_in_the_oldest_part_of_a_long_history(history):
    """Fewer matches than MAX_RANKED: all of them ranked, as before (the one in the
    oldest chat's sixth message, 50,000 messages back)."""
    steps, hits = search_steps(history, "needle3zq")
    assert [h["snippet"].count("[needle3zq]") for h in hits] == [1] and steps < 100
    steps, hits = search_steps(history, "rare7q")  # 1,000 matches, the best the oldest
    first = history.conn.execute("SELECT min(id) FROM messages").fetchone()[0]
    assert len(hits) == 50 and hits[0]["message_id"] == first and hits[0]["snippet"] == "[rare7q]"


def test_a_newer_search_stops_the_one_still_running(qtbot, tmp_path):
    """In the window, searches run one after another on the DB thread: "a" typed, then
    "ab", ran the whole of "a" first. Now a newer search stops the older one mid-query
    (its progress handler sees it is stale); it never answers, the newer one does."""
    import threading

    from iris_desktop.core.store import Stores
    from iris_desktop.ui.background import Background

    Store(tmp_path / "iris.db").close()
    background = Background(Stores(tmp_path / "iris.db"))
    started, answers, failures = threading.Event(), [], []
    endless = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 1e12) "
               "SELECT count(*) FROM c")

    ran_on: list[sqlite3.Connection] = []

    def slow(store: Store) -> int:
        ran_on.append(store.conn)
        started.set()
        return store.conn.execute(endless).fetchone()[0]  # hours, unless stopped
    background.run(slow, answers.append, failures.append, key="search")
    assert started.wait(60)
    background.run(lambda store: "newer", answers.append, failures.append, key="search")
    try:
        qtbot.waitUntil(lambda: background.idle, timeout=60_000)
    finally:
        ran_on[0].interrupt()  # (a failure leaves no query running)
    assert answers == ["newer"] and failures == []
    # a job of another key is not stopped by it
    background.run(lambda store: store.conn.execute(
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 200000) "
        "SELECT count(*) FROM c").fetchone()[0], answers.append, failures.append, key="meter")
    background.run(lambda store: "search", answers.append, failures.append, key="search")
    qtbot.waitUntil(lambda: background.idle, timeout=120_000)
    assert answers == ["newer", 200000, "search"] and failures == []
    background.close()
