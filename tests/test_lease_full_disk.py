"""A full disk right after a reply is saved, and a compaction on a full disk.

Before (an audit, session 67):

* the disk filling just after a reply was saved (whole) made the release of the chat's
  turn lease fail: the turn said "the disk … is full; nothing more was written; … try
  again" after its TurnDone (a user who tried again stored the question twice), and the
  lease row stayed, naming this very process: with space back, the next message in that
  chat was refused, "this chat is answering in another Iris window or command (process
  <its own pid>)", for TURN_LEASE_S (30 min) or until a restart;
* with a compaction due after the reply, the full disk failed the turn the same way (the
  compaction lease could not be taken, or its event recorded: compact() raised);
* a compaction lease left the same way made this process's next compaction of the chat
  a skip, "another Iris process (pid <its own>) has been compacting this thread";
* a compaction the database stopped said "OperationalError: database or disk is full"
  (or "…: database is locked"), not the store's sentence.

Real parts: a real SQLite file on a small tmpfs that is really full (``support.faults``),
the real Host; a scripted runtime stands in for the model.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from test_compaction import chat_thread, params

from iris_desktop.core.events import CompactionFinished, ReplySaved, TurnDone, TurnFailed
from iris_desktop.core.store import Store
from iris_desktop.host import Host
from iris_desktop.tokens import HeuristicCounter

from support.fakes import ScriptedRuntime
from support.faults import full_disk
from support.helpers import compactor_for


def _raw(db: Path, sql: str) -> list[tuple]:
    """Rows as the file holds them (a read-only connection: nothing written)."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return conn.execute(sql).fetchall()


def _kinds(events) -> list[str]:
    return [type(e).__name__ for e in events]


def test_a_disk_full_once_the_reply_is_saved_fails_nothing_and_the_chat_answers_again(tmp_path):
    with full_disk(tmp_path, "8m") as disk:
        data = disk.path / "data"
        runtime = ScriptedRuntime(["First reply, whole.", "Second reply.", "Third reply."])
        with Host(data, runtime=runtime, compact=False) as host:
            host.load_model()
            thread = host.create_thread("Lease")
            events = []
            for event in host.send(thread, "Hello?"):
                events.append(event)
                if isinstance(event, ReplySaved):
                    assert disk.fill() > 0  # the turn's last write (its lease) finds no room
            assert not any(isinstance(e, TurnFailed) for e in events), [
                (type(e).__name__, getattr(e, "text", "")) for e in events]
            done = [e for e in events if isinstance(e, TurnDone)]
            assert len(done) == 1 and done[0].finish_reason == "stop"
            assert isinstance(events[-1], TurnDone)
            # the lease this process could not delete is nobody's: not this window's
            # next look, nor the delete's (which asks the same)
            assert host.store.turn_holder(thread) is None
            disk.free()
            second = list(host.send(thread, "And again?"))
            assert not any(isinstance(e, TurnFailed) for e in second), [
                (type(e).__name__, getattr(e, "text", "")) for e in second]
            assert [e.text for e in second if isinstance(e, ReplySaved)] == ["Second reply."]
            stored = [(m["role"], m["status"], m["content"]) for m in host.store.messages(thread)]
            assert stored == [("user", "complete", "Hello?"),
                              ("assistant", "complete", "First reply, whole."),
                              ("user", "complete", "And again?"),
                              ("assistant", "complete", "Second reply.")]
        # the turn after took the lease over and released it: no row is left behind
        assert _raw(data / "iris.db", "SELECT count(*) FROM turn_leases") == [(0,)]


def test_a_lease_left_by_a_full_disk_in_another_chat_goes_at_the_next_turn(tmp_path):
    """Space back, a turn in another chat deletes what this process left in the first:
    another process would otherwise find the first chat busy (this process is alive)."""
    with full_disk(tmp_path, "8m") as disk:
        data = disk.path / "data"
        with Host(data, runtime=ScriptedRuntime(["One.", "Two."]), compact=False) as host:
            host.load_model()
            first, other = host.create_thread("First"), host.create_thread("Other")
            for event in host.send(first, "Hello?"):
                if isinstance(event, ReplySaved):
                    disk.fill()
            disk.free()
            assert "TurnFailed" not in _kinds(host.send(other, "Hi?"))
            assert _raw(data / "iris.db", "SELECT count(*) FROM turn_leases") == [(0,)]
            with Store(data / "iris.db") as elsewhere:  # as another process reads it
                assert elsewhere.turn_holder(first) is None


def test_a_disk_full_once_the_reply_is_saved_fails_the_compaction_due_not_the_turn(tmp_path):
    """Compaction is due after the reply (every few turns here); the disk fills as the
    reply is saved. Before: the compaction's lease could not be taken, and the turn
    failed after its reply was saved ("the disk … is full … try again"), then the chat
    was refused as answering elsewhere."""
    settings = {"context.compaction_min_turns": "3", "context.summarizer": "extractive"}
    replies = [f"Reply {n}: " + "words " * 60 for n in range(4)]
    with full_disk(tmp_path, "16m") as disk:
        data = disk.path / "data"
        with Host(data, settings, runtime=ScriptedRuntime(replies)) as host:
            host.load_model()
            thread = host.create_thread("Compacted")
            for n in range(4):
                events = []
                for event in host.send(thread, f"Question {n}? " + "more " * 60):
                    events.append(event)
                    if n == 2 and isinstance(event, ReplySaved):
                        host.store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                        assert disk.fill() > 0
                assert "TurnFailed" not in _kinds(events), [
                    (type(e).__name__, getattr(e, "text", "")) for e in events]
                assert [e.text for e in events if isinstance(e, ReplySaved)] == [replies[n]]
                if n == 2:
                    finished = [e.event for e in events if isinstance(e, CompactionFinished)]
                    assert [e.outcome for e in finished] == ["failed"]
                    assert finished[0].error.startswith("the disk holding"), finished[0].error
                    disk.free()
        assert _raw(data / "iris.db", "SELECT count(*) FROM messages") == [(8,)]
        assert _raw(data / "iris.db", "SELECT count(*) FROM turn_leases") == [(0,)]


@contextlib.contextmanager
def _around_the_verify(store: Store, before=None, after=None):
    """``before()`` as compaction begins to verify its summary (a trial write, rolled
    back), ``after()`` as that ends, whether it failed or not."""
    trial = store.trial

    @contextlib.contextmanager
    def around():
        if before is not None:
            before()
        try:
            with trial():
                yield
        finally:
            if after is not None:
                after()

    store.trial = around
    try:
        yield
    finally:
        store.trial = trial


def test_a_compaction_the_full_disk_cannot_record_says_so_and_the_next_one_runs(tmp_path):
    """The disk fills once the summary is verified: neither it nor its event can be
    stored, nor the compaction lease deleted. Before: compact() raised "database or disk
    is full" (after a reply: the turn failed, its reply saved), and this process's next
    compaction of the chat was skipped, "another Iris process (pid <its own>) has been
    compacting this thread"."""
    with full_disk(tmp_path, "8m") as disk:
        with Store(disk.path / "test.db") as store:
            thread = chat_thread(store)
            compactor = compactor_for(store, HeuristicCounter(), params())

            def fill():
                store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # an empty -wal: no room
                assert disk.fill() > 0

            with _around_the_verify(store, after=fill):
                event = compactor.compact(thread, "budget")
            assert (event.outcome, event.id, event.summary_id) == ("failed", None, None)
            assert event.error == (f"the disk holding {store.path} is full; nothing more was "
                                   "written; free some space, then try again"), event.error
            assert "Error" not in event.plain() and "Nothing is lost" in event.plain()
            disk.free()
            assert store.compaction_events(thread) == [] and store.latest_summary(thread) is None
            event = compactor.compact(thread, "budget")
            assert event.outcome == "ok" and event.id is not None, event.describe()
            assert _raw(store.path, "SELECT count(*) FROM compaction_leases") == [(0,)]


def test_a_compaction_the_database_stops_says_why_in_the_store_s_words(tmp_path, monkeypatch):
    """Another process holds the write lock past the busy timeout while the summary is
    verified: the event says so as the store says it, not "OperationalError: database is
    locked"."""
    monkeypatch.setattr("iris_desktop.core.store.BUSY_TIMEOUT_S", 0.2)
    with Store(tmp_path / "test.db") as store, \
            contextlib.closing(sqlite3.connect(store.path, isolation_level=None)) as other:
        thread = chat_thread(store)
        compactor = compactor_for(store, HeuristicCounter(), params())
        with _around_the_verify(store, before=lambda: other.execute("BEGIN IMMEDIATE"),
                                after=lambda: other.execute("ROLLBACK")):
            event = compactor.compact(thread, "budget")
        assert event.outcome == "failed" and event.id is not None
        assert event.error == (f"another Iris process is writing to {store.path}; close it or "
                               "wait, then try again"), event.error
        assert [e["error"] for e in store.compaction_events(thread)] == [event.error]
