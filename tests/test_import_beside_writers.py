"""A large import beside other writers (an audit of two Iris processes on one data
folder): each chunk of an import listed every thread (store.threads(), 0.35 s at 30,000
threads) and compared each chat with every stored thread of its size, inside the write
transaction, and began the next transaction the moment it committed: another process's
write never got the lock (``import --again`` of one chat: "another Iris process is
writing"), and a reply answering meanwhile died renewing its turn lease. Counted, never
timed."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from iris_desktop.core import foreign, import_twins
from iris_desktop.core.foreign import import_conversations, load_conversations
from iris_desktop.core.store import Store

from support.helpers import chatgpt_export


class _Ticks:
    """``foreign.time``: a clock that moves 0.1 s each look (two chats a chunk, however
    fast the machine), and real sleeps."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self) -> float:
        self.now += 0.1
        return self.now

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(seconds)


def _history(store: Store, threads: int) -> None:
    """``threads`` chats of two messages, none of them the imported ones."""
    with store.transaction():
        for n in range(threads):
            thread = store.create_thread(f"old {n}")
            store.add_messages(thread, [{"role": "user", "content": f"old question {n}"},
                                        {"role": "assistant", "content": f"old answer {n}"}])


def _comparisons(monkeypatch, tmp_path, history: int) -> tuple[int, int]:
    """(messages compared while importing 100 new chats into ``history`` threads, while
    importing them again)."""
    counted = [0]
    same = import_twins._Said.same

    def counting(self, other):
        counted[0] += 1
        return same(self, other)

    monkeypatch.setattr(import_twins._Said, "same", counting)
    tmp_path.mkdir()
    loaded = load_conversations(chatgpt_export(tmp_path, 100))
    with Store(tmp_path / f"iris{history}.db") as store:
        _history(store, history)
        first = import_conversations(store, loaded)
        new, counted[0] = counted[0], 0
        again = import_conversations(store, loaded)
    assert len(first.ids) == 100 and not first.known
    assert not again.ids and sorted(again.known) == sorted(first.ids)  # recognised as before
    return new, counted[0]


def test_comparisons_per_chat_do_not_grow_with_the_history(monkeypatch, tmp_path):
    """Before: a chat was compared with every stored thread of its message count: 100
    new chats into 100 threads made 10,000 comparisons, into 1,000 threads 100,000 (and
    15,150 against 105,150 importing them again; 0.09 s a chat at 20,000 threads, and
    20,000 chats imported again did not finish in 300 s). Now only the threads with the
    same messages are compared: none for a new chat."""
    small = _comparisons(monkeypatch, tmp_path / "a", 100)
    large = _comparisons(monkeypatch, tmp_path / "b", 1000)
    assert small == large
    assert small[1] <= 2 * 100  # each known chat: its twin's two messages


def test_the_threads_are_listed_once_per_import_not_once_per_chunk(monkeypatch, tmp_path):
    """Before: every chunk listed every thread (store.threads()) inside its transaction."""
    monkeypatch.setattr(foreign, "time", _Ticks())
    monkeypatch.setattr(foreign, "YIELD_S", 0.0, raising=False)
    listed = [0]
    threads = Store.threads

    def counting(self):
        listed[0] += 1
        return threads(self)

    monkeypatch.setattr(Store, "threads", counting)
    chunks: list[int] = []
    loaded = load_conversations(chatgpt_export(tmp_path, 60))
    with Store(tmp_path / "iris.db") as store:
        _history(store, 50)
        imported = import_conversations(store, loaded, progress=lambda done, _: chunks.append(done))
    assert len(imported.ids) == 60
    assert len(chunks) >= 20  # two chats a chunk
    assert listed[0] == 1


def test_another_connection_writes_while_a_large_import_runs(monkeypatch, tmp_path):
    """A second Store on the same file (its own connection, as another process has)
    saves a draft again and again while an import runs: before, it never got the write
    lock until the import ended (the next chunk began within microseconds of a commit)."""
    monkeypatch.setattr(foreign, "time", _Ticks())  # two chats a chunk: many commits
    loaded = load_conversations(chatgpt_export(tmp_path, 300, 200))
    path = tmp_path / "iris.db"
    with Store(path) as store:
        _history(store, 300)
        draft_thread = store.create_thread("drafts")
    importing = threading.Event()
    done = threading.Event()
    during: list[int] = []
    failures: list[BaseException] = []

    def writer():
        with Store(path) as other:
            importing.wait()
            n = 0
            while not done.is_set():
                try:
                    other.save_draft(draft_thread, f"draft {n}")
                except sqlite3.OperationalError as exc:  # (past the busy timeout)
                    failures.append(exc)
                    return
                if not done.is_set():
                    during.append(n)
                n += 1
                time.sleep(0.005)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        with Store(path) as store:
            importing.set()
            imported = import_conversations(store, loaded)
            done.set()
    finally:
        done.set()
        importing.set()
        thread.join()
    assert len(imported.ids) == 300
    assert not failures
    assert during, "no write of another connection got in while the import ran"


def test_a_busy_database_skips_a_turn_lease_renewal_not_the_reply(monkeypatch, tmp_path):
    """Before: a reply answering beside a large import died renewing its turn lease
    (database is locked; exit 1, its reply cut), where a partial save is skipped."""
    from iris_desktop.core import store as store_module
    from iris_desktop.core.agent import TURN_LEASE_S, Agent
    from iris_desktop.core.config import AgentConfig, ContextParams, ToolsConfig
    from iris_desktop.core.planner import Planner

    from support.fakes import ScriptedRuntime

    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_S", 0.05)
    path = tmp_path / "iris.db"
    now = [0.0]
    with Store(path) as store:
        thread_id = store.create_thread("t")
        runtime = ScriptedRuntime(["hello"])
        planner = Planner(ContextParams(window=8192), runtime.counter(), runtime=runtime,
                          agent=AgentConfig(), tools=ToolsConfig(allowed_paths=()))
        agent = Agent(store, planner, clock=lambda: now[0])
        assert store.take_turn_lease(thread_id, "mine", TURN_LEASE_S) is None
        agent._turn_token = "mine"
        blocker = sqlite3.connect(path, timeout=0)
        try:
            blocker.execute("BEGIN IMMEDIATE")
            now[0] = TURN_LEASE_S / 10  # due: the database is busy, the lease has time left
            agent._renew_turn(thread_id)
            assert agent._lease_renewed == 0.0  # tried again later
            blocker.execute("ROLLBACK")
            agent._renew_turn(thread_id)
            assert agent._lease_renewed == TURN_LEASE_S / 10
            blocker.execute("BEGIN IMMEDIATE")
            now[0] = TURN_LEASE_S  # nearly run out: the error is not hidden
            with pytest.raises(sqlite3.OperationalError):
                agent._renew_turn(thread_id)
        finally:
            blocker.close()
