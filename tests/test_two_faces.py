"""Two faces of Iris writing one data folder at once: the window and a CLI command, two
commands. Each test runs what a user runs, in real processes where processes matter
(``tests/support/scripted_cli.py``: the real CLI with a scripted model), on a real SQLite
file.

Before: two turns on one chat at once stored "question A, question B, reply A, reply B"
(each reply under the newest message when it started), for good; a chat deleted by
another process failed the next send with "an internal error in Iris (KeyError: 'no
thread 1')" and the message was lost; a chat deleted while it answered failed with
"message 6 is not a reply in progress"."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from iris_desktop.core.events import ReplyStarted, TurnDone, TurnFailed, UserSaved
from iris_desktop.core.store import Store
from iris_desktop.host import Host
from iris_desktop.paths import app_paths

from support.fakes import ScriptedRuntime

SCRIPTED_CLI = Path(__file__).resolve().parent / "support" / "scripted_cli.py"
OFF = {"context.recall_semantic": "false"}


def seed(data: Path) -> int:
    with Store(app_paths(data).ensure().db_path) as store:
        thread = store.create_thread("plans")
        store.add_messages(thread, [{"role": "user", "content": "first question"},
                                    {"role": "assistant", "content": "first answer"}])
    return thread


def cli(data: Path, *args: str, reply: str = "scripted reply", gate: Path | None = None,
        background: bool = False, loaded: Path | None = None):
    env = {**os.environ, "IRIS_TEST_REPLY": reply}
    if loaded is not None:
        env["IRIS_TEST_LOADED"] = str(loaded)
    if gate is not None:
        env["IRIS_TEST_GATE"] = str(gate)
    command = [sys.executable, str(SCRIPTED_CLI), "--data-dir", str(data),
               "--set", "context.recall_semantic=false", *args]
    if background:
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def tree(data: Path, thread: int) -> list[tuple]:
    """(id, parent, role, text) of every message of ``thread``, oldest first."""
    with Store(app_paths(data).db_path) as store:
        return [tuple(r) for r in store.conn.execute(
            "SELECT id, parent_id, role, content FROM messages WHERE thread_id = ? ORDER BY id",
            (thread,))]


def wait_for(condition, what: str, polls: int = 6_000) -> None:
    for _ in range(polls):  # bounded by count (60 s), never a timing to pass
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def test_two_commands_on_one_chat_answer_one_at_a_time_and_the_chat_stays_in_order(tmp_path):
    data = tmp_path / "data"
    thread = seed(data)
    gate = tmp_path / "gate"
    first = cli(data, "chat", "--thread", str(thread), "question A", reply="reply A", gate=gate,
                background=True)
    try:  # A has stored its question and holds the chat until the gate opens
        wait_for(lambda: any(r[3] == "question A" for r in tree(data, thread)), "question A stored")
        loaded = data.parent / "second-loaded"
        second = cli(data, "chat", "--thread", str(thread), "question B", reply="reply B",
                     loaded=loaded)
        assert second.returncode == 1, second
        assert not loaded.exists()  # said before any model was loaded
        assert second.stderr.startswith("iris-desktop: Not sent: this chat is answering in "
                                        f"another Iris window or command (process {first.pid}, ")
        assert "Traceback" not in second.stderr
        assert all(r[3] != "question B" for r in tree(data, thread))  # nothing stored
    finally:
        gate.touch()
        out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    again = cli(data, "chat", "--thread", str(thread), "question B", reply="reply B")
    assert again.returncode == 0, again.stderr
    rows = tree(data, thread)
    assert [r[2:] for r in rows] == [
        ("user", "first question"), ("assistant", "first answer"), ("user", "question A"),
        ("assistant", "reply A"), ("user", "question B"), ("assistant", "reply B")]
    assert [r[1] for r in rows] == [None, *(r[0] for r in rows[:-1])]  # one line, in order


def test_the_lease_of_a_process_that_is_gone_is_free_at_once(tmp_path):
    """A command killed mid-turn leaves its lease behind; the next turn takes it over."""
    data = tmp_path / "data"
    thread = seed(data)
    gate = tmp_path / "gate"  # never opened: the command is killed holding the chat
    held = cli(data, "chat", "--thread", str(thread), "question A", gate=gate, background=True)
    wait_for(lambda: any(r[3] == "question A" for r in tree(data, thread)), "question A stored")
    held.kill()
    held.communicate(timeout=60)
    with Store(app_paths(data).db_path) as store:  # the lease is still written down
        assert store.conn.execute("SELECT pid FROM turn_leases").fetchone() == (held.pid,)
    with Host(data, OFF, runtime=ScriptedRuntime(["answered"])) as host:
        host.load_model()
        events = list(host.send(thread, "still there?"))
    assert not [e for e in events if isinstance(e, TurnFailed)], events
    assert tree(data, thread)[-1][2:] == ("assistant", "answered")


def test_a_send_to_a_chat_deleted_elsewhere_is_refused_and_stores_nothing(tmp_path):
    data = tmp_path / "data"
    thread = seed(data)
    with Host(data, OFF, runtime=ScriptedRuntime(["never"])) as host:
        host.load_model()
        with Host(data, OFF) as other:  # another process's connection
            other.delete_thread(thread)
        events = list(host.send(thread, "are you there?"))
        failed = [e for e in events if isinstance(e, TurnFailed)]
        assert [(e.kind, e.text) for e in failed] == [
            ("gone", "Not sent: this chat was deleted, in another Iris window or by a command")]
        assert not [e for e in events if isinstance(e, UserSaved)]
        assert isinstance(events[-1], TurnDone) and host.store.threads() == []


def _deleted_during(tmp_path, when: type, runtime, text: str) -> list:
    """A turn in a chat another process deletes at the turn's first ``when`` event: it
    ends in the one "deleted" sentence and leaves no chat; its events."""
    data = tmp_path / "data"
    thread = seed(data)
    with Host(data, OFF, runtime=runtime) as host:
        host.load_model()
        events = []
        for event in host.send(thread, text):
            events.append(event)
            if isinstance(event, when):
                with Host(data, OFF) as other:
                    other.delete_thread(thread)
        failed = [e for e in events if isinstance(e, TurnFailed)]
        assert [(e.kind, e.text) for e in failed] == [
            ("gone", "The chat was deleted, in another Iris window or by a command, while Iris "
                     "answered; the reply went with it")]
        assert isinstance(events[-1], TurnDone) and host.store.threads() == []
    return events


def test_a_chat_deleted_while_it_answers_ends_the_turn_in_one_sentence(tmp_path):
    _deleted_during(tmp_path, ReplyStarted, ScriptedRuntime(["word " * 400], delay_s=0.01),
                    "tell me a long story")


def test_a_chat_deleted_while_its_turn_is_prepared_ends_it_in_one_sentence(tmp_path):
    """Before (an audit): deleted after the question was stored, while the turn was
    planned (compaction and recall take seconds on a long chat), the turn ended "an
    internal error in Iris (ThreadGone: no thread 1)" with a traceback in the log."""
    events = _deleted_during(tmp_path, UserSaved, ScriptedRuntime(["never"]), "are you there?")
    assert not [e for e in events if isinstance(e, ReplyStarted)]


def test_a_turn_in_a_chat_answering_elsewhere_is_refused_where_it_starts(tmp_path):
    """The window's path (no pre-check as the CLI's): the turn itself refuses, before its
    question is stored."""
    data = tmp_path / "data"
    thread = seed(data)
    with Host(data, OFF, runtime=ScriptedRuntime(["never"])) as host:
        host.load_model()
        assert host.store.take_turn_lease(thread, "another turn", 60) is None
        events = list(host.send(thread, "are you there?"))
        failed = [e for e in events if isinstance(e, TurnFailed)]
        assert [e.kind for e in failed] == ["busy"]
        assert failed[0].text.startswith("Not sent: this chat is answering in another Iris "
                                          f"window or command (process {os.getpid()}, for ")
        assert not [e for e in events if isinstance(e, UserSaved)]
        assert len(host.store.messages(thread)) == 2
        host.store.release_turn_lease(thread, "another turn")
        assert not [e for e in host.send(thread, "now?") if isinstance(e, TurnFailed)]


def test_a_stored_question_is_never_also_a_draft(tmp_path):
    """An audit: the window killed within half a second of Enter came back with the stored
    question in the box as the chat's draft (or New chat's), to be sent twice: the draft
    went only at the next pause. Now it goes in the question's own transaction; another
    chat's draft, and a draft that is not what was sent, stay."""
    data = tmp_path / "data"
    thread = seed(data)
    with Host(data, OFF, runtime=ScriptedRuntime(["an answer", "a first answer"])) as host:
        host.load_model()
        store = host.store
        other = store.create_thread("another chat")
        store.save_draft(thread, "are you there?\n")
        store.save_draft(other, "are you there?")
        store.save_draft(None, "something else")
        list(host.send(thread, "are you there?"))
        assert store.draft(thread) == "" and store.draft(other) == "are you there?"
        assert store.draft(None) == "something else"
        store.save_draft(None, "my first words")  # New chat's draft, sent as a new chat
        made = store.create_thread()
        list(host.send(made, "my first words"))
        assert store.draft(None) == "" and store.draft(made) == ""
