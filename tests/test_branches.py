"""Regenerate, edit, branches and continue: the store stays append-only (a new reply or
an edited message is a new message with a parent), a thread has one active branch, and
the engine, compaction, summaries and recall see only that branch."""

from __future__ import annotations

import sqlite3

import pytest

from iris_desktop.core.config import ContextParams
from iris_desktop.core.events import ReplySaved, ReplyStarted, TurnDone, TurnFailed, UserSaved
from iris_desktop.core.planner import Planner
from iris_desktop.core.store import Store
from iris_desktop.host import Host, build_compactor
from iris_desktop.tokens import HeuristicCounter

from support.fakes import ScriptedRuntime


def chat(turns: int, tag: str = "") -> list[dict]:
    out = []
    for i in range(turns):
        out += [{"role": "user", "content": f"question {i} {tag} about the garden " * 3},
                {"role": "assistant", "content": f"answer {i} {tag}: plant tomatoes in May " * 3}]
    return out


def path_ids(store: Store, thread: int) -> list[int]:
    return [r["id"] for r in store.messages(thread)]


def test_a_linear_thread_is_one_branch_and_new_messages_extend_it(fresh_store):
    thread = fresh_store.create_thread("t")
    ids = fresh_store.add_messages(thread, chat(3))
    assert fresh_store.head(thread) == ids[-1] and path_ids(fresh_store, thread) == ids
    assert [fresh_store.parent_of(i) for i in ids] == [None, *ids[:-1]]
    assert fresh_store.branch_points(thread) == {} and not fresh_store.has_branches(thread)
    more = fresh_store.add_message(thread, {"role": "user", "content": "one more"})
    assert fresh_store.parent_of(more) == ids[-1] and path_ids(fresh_store, thread) == [*ids, more]


def test_a_new_reply_beside_the_old_is_a_branch_and_switching_brings_either_back(fresh_store):
    thread = fresh_store.create_thread("t")
    u1, a1, u2, a2 = fresh_store.add_messages(thread, chat(2))
    a2b = fresh_store.add_message(thread, {"role": "assistant", "content": "another answer"},
                                  parent_id=u2)
    assert path_ids(fresh_store, thread) == [u1, a1, u2, a2b]
    assert fresh_store.alternatives(a2b) == [a2, a2b]
    assert fresh_store.branch_points(thread) == {a2b: (2, 2)}
    # nothing was changed or deleted: both replies are there, one off the path
    rows = {r["id"]: r["on_path"] for r in fresh_store.all_messages(thread)}
    assert rows == {u1: 1, a1: 1, u2: 1, a2: 0, a2b: 1}
    # an edit of the first question: a branch from the start; its turn numbers follow it
    u1b = fresh_store.add_message(thread, {"role": "user", "content": "edited"}, parent_id=None)
    assert path_ids(fresh_store, thread) == [u1b]
    assert fresh_store.messages_by_id([u1b])[u1b]["turn"] == 1
    assert fresh_store.switch_branch(thread, u1b, -1) == a2b  # the newest branch below
    assert path_ids(fresh_store, thread) == [u1, a1, u2, a2b]
    assert fresh_store.switch_branch(thread, a2b, -1) == a2
    assert path_ids(fresh_store, thread) == [u1, a1, u2, a2]
    with pytest.raises(ValueError, match=f"message {a2} is the first of its 2 alternatives"):
        fresh_store.switch_branch(thread, a2, -1)
    with pytest.raises(ValueError, match=f"message {a1} has no alternatives"):
        fresh_store.switch_branch(thread, a1, +1)


def test_the_engine_and_recall_see_only_the_active_branch(fresh_store):
    thread = fresh_store.create_thread("t")
    u1, a1 = fresh_store.add_messages(thread, chat(1))
    off = fresh_store.add_message(thread, {"role": "assistant", "content": "zebra stripes"},
                                  parent_id=u1)
    fresh_store.switch_branch(thread, off, -1)  # back to a1
    planner = Planner(ContextParams(window=4096), HeuristicCounter())
    request = planner.plan(fresh_store, thread)
    assert set(request.included_ids) == {u1, a1}
    assert "zebra" not in str(request.messages)
    assert fresh_store.recall_hits(thread, off, '"zebra"') == []
    fresh_store.switch_branch(thread, a1, +1)
    assert [i for i, _ in fresh_store.recall_hits(thread, off, '"zebra"')] == [off]
    assert planner.plan(fresh_store, thread).included_ids == [u1, off]


def test_a_summary_of_one_branch_never_stands_in_for_another(fresh_store):
    thread = fresh_store.create_thread("t")
    ids = fresh_store.add_messages(thread, chat(30, "old"))
    planner = Planner(ContextParams(window=2048, compaction_min_turns=10), HeuristicCounter())
    event = build_compactor(planner, fresh_store).compact(thread, "manual", force=True)
    assert event.outcome == "ok"
    summary = fresh_store.latest_summary(thread)
    assert summary is not None
    # an edit before the summary's boundary: the new branch has no summary of its own yet
    edited = fresh_store.add_message(thread, {"role": "user", "content": "a new start"},
                                     parent_id=ids[1])
    assert fresh_store.latest_summary(thread) is None and fresh_store.summaries(thread) == []
    request = planner.plan(fresh_store, thread)
    assert request.summary is None and request.included_ids == [*ids[:2], edited]
    # back on the old branch, its summary stands in for its messages again
    fresh_store.switch_branch(thread, edited, -1)
    assert fresh_store.latest_summary(thread).id == summary.id
    assert planner.plan(fresh_store, thread).summary.id == summary.id


def test_a_branchs_own_summary_is_not_hidden_by_another_branchs_summary_of_the_shared_part(
        fresh_store):
    """Before (an audit): the newest summary on the path won. An edit far back whose new
    branch was compacted made a summary of the part both branches share; switching back,
    that short summary stood in for the old branch's own, far longer one: 151 turns
    dropped out of the request and compaction was due again, its chain forked."""
    thread = fresh_store.create_thread("t")
    ids = fresh_store.add_messages(thread, chat(60, "old"))
    planner = Planner(ContextParams(window=2048, compaction_min_turns=10), HeuristicCounter())
    compactor = build_compactor(planner, fresh_store)
    assert compactor.compact(thread, "manual", force=True).outcome == "ok"
    own = fresh_store.latest_summary(thread)
    # an edit at turn 30, a short branch of its own, compacted (it summarizes turns both share)
    edited = fresh_store.add_message(thread, {"role": "user", "content": "turn 30 again"},
                                     parent_id=ids[57])
    fresh_store.add_message(thread, {"role": "assistant", "content": "a new answer"})
    assert compactor.compact(thread, "manual", force=True).outcome == "ok"
    shared = fresh_store.latest_summary(thread)
    assert shared.id > own.id and shared.covers_through_id < ids[57] < own.covers_through_id
    fresh_store.switch_branch(thread, edited, -1)  # back to the first branch
    assert fresh_store.latest_summary(thread).id == own.id
    assert [s.id for s in fresh_store.summaries(thread)] == [own.id]
    assert planner.plan(fresh_store, thread).summary.id == own.id
    assert fresh_store.thread_state(thread)[4] == own.id
    fresh_store.switch_branch(thread, ids[58], 1)  # and the new branch has its own
    assert fresh_store.latest_summary(thread).id == shared.id
    assert [s.id for s in fresh_store.summaries(thread)] == [shared.id]


def test_a_branch_shows_its_own_compactions_and_requests(fresh_store):
    """Before (an audit): the inspector, its chart and `context` listed every branch's
    compactions and requests, so a branch with no summary showed two compactions, and a
    compaction that failed on another branch could be given as why this one's turns are
    dropped. Each is recorded with its branch's head and shown on that branch."""
    thread = fresh_store.create_thread("t")
    ids = fresh_store.add_messages(thread, chat(30, "old"))
    planner = Planner(ContextParams(window=2048, compaction_min_turns=10), HeuristicCounter())
    assert build_compactor(planner, fresh_store).compact(thread, "manual", force=True).outcome == "ok"
    fresh_store.add_compaction_event(thread, {"trigger": "budget", "outcome": "failed",
                                              "error": "the model failed"})
    fresh_store.add_request(thread, {"head_id": ids[-2], "prompt_tokens": 900})
    old = fresh_store.compaction_events(thread)
    assert [e["head_id"] for e in old] == [ids[-1], ids[-1]]
    fresh_store.conn.execute("INSERT INTO compaction_events(thread_id, created_at, trigger, "
                             "outcome) VALUES (?, 0, 'budget', 'skipped')", (thread,))
    # an edit far back: the new branch has no compaction and no request of its own yet
    edited = fresh_store.add_message(thread, {"role": "user", "content": "a new start"},
                                     parent_id=ids[1])
    assert [e["outcome"] for e in fresh_store.compaction_events(thread, branch=True)] == ["skipped"]
    assert fresh_store.requests(thread, branch=True) == []
    fresh_store.add_request(thread, {"head_id": edited, "prompt_tokens": 40})
    assert [r["prompt_tokens"] for r in fresh_store.requests(thread, branch=True)] == [40]
    assert len(fresh_store.compaction_events(thread)) == 3 and len(fresh_store.requests(thread)) == 2
    fresh_store.switch_branch(thread, edited, -1)  # back: its own again
    assert [e["outcome"] for e in fresh_store.compaction_events(thread, branch=True)] == [
        "ok", "failed", "skipped"]
    assert [r["prompt_tokens"] for r in fresh_store.requests(thread, branch=True)] == [900]
    # a compaction is recorded with the head it started from, whatever is active when it
    # ends (a switch meanwhile recorded it on the other branch)
    fresh_store.add_compaction_event(thread, {"trigger": "manual", "outcome": "failed",
                                              "head_id": edited})
    assert fresh_store.compaction_events(thread)[-1]["head_id"] == edited
    assert [e["outcome"] for e in fresh_store.compaction_events(thread, branch=True)] == [
        "ok", "failed", "skipped"]


def test_a_database_before_branches_migrates_to_one_branch_per_thread(tmp_path):
    path = tmp_path / "old.db"
    with Store(path) as store:
        thread = store.create_thread("t")
        ids = store.add_messages(thread, chat(3))
    conn = sqlite3.connect(path)  # as version 7 wrote it: no parents, no paths, no head
    conn.executescript("DROP TABLE thread_paths; DROP INDEX messages_parent; DROP INDEX requests_reply;"
                       "DROP INDEX threads_head;"  # (schema 17's, on a column 7 did not have)
                       "ALTER TABLE messages DROP COLUMN parent_id;"
                       "ALTER TABLE threads DROP COLUMN head_id; ALTER TABLE threads DROP COLUMN system_prompt;"
                       "ALTER TABLE requests DROP COLUMN head_id; ALTER TABLE requests DROP COLUMN reply_id;"
                       "ALTER TABLE streams DROP COLUMN pid_start;"  # migration 9's, as 7 had none
                       "ALTER TABLE compaction_leases DROP COLUMN pid_start;"
                       "DROP TABLE drafts;"  # schema 14's
                       "ALTER TABLE compaction_events DROP COLUMN head_id;"  # 15's
                       "PRAGMA user_version = 7;")
    conn.close()
    with Store(path) as store:
        assert store.head(thread) == ids[-1] and path_ids(store, thread) == ids
        assert [store.parent_of(i) for i in ids] == [None, *ids[:-1]]


def test_a_salvaged_database_gets_its_branches_back(tmp_path):
    from iris_desktop.core.store import salvage

    path = tmp_path / "iris.db"
    with Store(path) as store:
        thread = store.create_thread("t")
        u1, a1 = store.add_messages(thread, chat(1))
        a1b = store.add_message(thread, {"role": "assistant", "content": "again"}, parent_id=u1)
    salvage(path, ["test: pretend it was damaged"])
    with Store(path) as store:
        assert store.head(thread) == a1b and path_ids(store, thread) == [u1, a1b]
        assert store.alternatives(a1b) == [a1, a1b]


def scripted_host(tmp_path, replies) -> tuple[Host, ScriptedRuntime]:
    runtime = ScriptedRuntime(replies)
    host = Host(tmp_path / "data", {"context.recall_semantic": "false"}, runtime=runtime,
                compact=False)
    host.load_model()
    return host, runtime


def test_regenerate_answers_the_same_request_again_beside_the_old_reply(tmp_path):
    host, runtime = scripted_host(tmp_path, ["First answer.", "Second answer."])
    with host:
        events = list(host.send(None, "Hello"))
        thread = events[0].thread_id
        first = next(e for e in events if isinstance(e, ReplySaved)).message_id
        again = list(host.regenerate(thread))
        second = next(e for e in again if isinstance(e, ReplySaved))
        assert second.text == "Second answer." and isinstance(again[-1], TurnDone)
        assert runtime.requests[1] == runtime.requests[0]  # the same prompt, to the message
        assert host.store.alternatives(second.message_id) == [first, second.message_id]
        assert [r["content"] for r in host.store.messages(thread)] == ["Hello", "Second answer."]
        assert host.switch_branch(thread, second.message_id, -1) == first
        assert [r["content"] for r in host.store.messages(thread)] == ["Hello", "First answer."]


def test_edit_starts_a_branch_and_the_old_one_is_kept(tmp_path):
    host, _ = scripted_host(tmp_path, ["A1", "A2", "B2"])
    with host:
        thread = list(host.send(None, "Q1"))[0].thread_id
        list(host.send(thread, "Q2"))
        q2 = host.store.newest_user_message(thread)
        events = list(host.edit(thread, q2, "Q2 edited"))
        saved = next(e for e in events if isinstance(e, UserSaved))
        assert saved.text == "Q2 edited" and host.store.alternatives(saved.message_id)[0] == q2
        assert [r["content"] for r in host.store.messages(thread)] == ["Q1", "A1", "Q2 edited", "B2"]
        host.switch_branch(thread, saved.message_id, -1)
        assert [r["content"] for r in host.store.messages(thread)] == ["Q1", "A1", "Q2", "A2"]
        first = next(r["id"] for r in host.store.messages(thread) if r["content"] == "Q1")
        refused = list(host.edit(thread, first + 1, "not a user message"))
        assert isinstance(refused[0], TurnFailed) and isinstance(refused[-1], TurnDone)


def test_continue_goes_on_from_where_a_stopped_reply_ended(tmp_path):
    host, runtime = scripted_host(tmp_path, ["one two three four five six", "seven eight"])
    with host:
        import threading

        cancel = threading.Event()
        events = []
        for event in host.send(None, "Count", cancel):
            events.append(event)
            if isinstance(event, ReplyStarted):
                pass
            elif type(event).__name__ == "ReplyToken" and "three" in event.text:
                cancel.set()
        thread = events[0].thread_id
        stopped = next(e for e in events if isinstance(e, ReplySaved))
        assert stopped.status == "interrupted" and stopped.text == "one two three"
        more = list(host.continue_reply(thread))
        started = next(e for e in more if isinstance(e, ReplyStarted))
        assert started.replaces == stopped.message_id and started.text == "one two three"
        assert runtime.requests[-1][-1] == {"role": "assistant", "content": "one two three", "prefix": True}
        done = next(e for e in more if isinstance(e, ReplySaved))
        assert done.text == "one two threeseven eight" and done.status == "complete"
        assert host.store.alternatives(done.message_id) == [stopped.message_id, done.message_id]
        assert [r["content"] for r in host.store.messages(thread)][-1] == done.text
        # a reply that ended on its own has nothing to continue: no duplicate alternative
        assert host.store.stopped_reply(thread) is None
        refused = list(host.continue_reply(thread))
        assert "no stopped or cut-off reply" in refused[0].text and isinstance(refused[-1], TurnDone)
        assert host.store.alternatives(done.message_id) == [stopped.message_id, done.message_id]
        # nothing to continue after a user message
        list(host.send(thread, "And?"))
        runtime.replies.append("x")
        nothing = list(host.edit(thread, host.store.newest_user_message(thread), "And??"))
        assert isinstance(nothing[-1], TurnDone)


def test_a_chat_of_its_own_system_prompt_is_counted_and_planned_like_the_global_one(fresh_store):
    thread = fresh_store.create_thread("t")
    fresh_store.add_messages(thread, chat(2))
    planner = Planner(ContextParams(window=4096, system_prompt="You are Iris."), HeuristicCounter())
    before = planner.plan(fresh_store, thread)
    assert before.messages[0]["content"].startswith("You are Iris.")
    fresh_store.set_system_prompt(thread, "Answer like a pirate, in two sentences at most. " * 4)
    after = planner.plan(fresh_store, thread)  # a new state: not the cached request
    assert after is not before and after.messages[0]["content"].startswith("Answer like a pirate")
    assert after.breakdown.system > before.breakdown.system
    fresh_store.set_system_prompt(thread, "  ")  # blank: the global one again
    assert fresh_store.system_prompt_of(thread) is None
    assert planner.plan(fresh_store, thread).messages[0]["content"].startswith("You are Iris.")


def test_switching_a_chat_another_process_is_answering_in_is_refused(tmp_path, capsys):
    """Before (an audit): `switch` while another window or command wrote a reply in the
    chat moved the head under it; the question and its reply went on below the old head,
    on a branch no longer shown, and seemed gone. Now it is refused in one sentence, as
    an edit or a regenerate is, and nothing moves."""
    import os

    from iris_desktop.cli import main
    from iris_desktop.core.store import ThreadBusy

    data = tmp_path / "data"
    data.mkdir()
    with Store(data / "iris.db") as store:
        thread = store.create_thread("t")
        q, a = store.add_messages(thread, [{"role": "user", "content": "q"},
                                           {"role": "assistant", "content": "a"}])
        again = store.add_message(thread, {"role": "assistant", "content": "a again"}, parent_id=q)
        assert store.take_turn_lease(thread, "a turn elsewhere", 60) is None  # (this pid: alive)
        with pytest.raises(ThreadBusy, match=f"Not switched: this chat is answering in another "
                                             f"Iris window or command \\(process {os.getpid()}"):
            store.switch_to_alternative(thread, again, -1)
        assert store.head(thread) == again
    code = main(["--data-dir", str(data), "switch", str(thread), str(again), "previous"])
    err = capsys.readouterr().err
    assert code == 1 and "Not switched: this chat is answering" in err and "Traceback" not in err
    assert "write in another chat" not in err  # (advice for a send, not a switch)
    with Store(data / "iris.db") as store:
        assert store.head(thread) == again
        store.release_turn_lease(thread, "a turn elsewhere")
        assert store.switch_to_alternative(thread, again, -1) == a
