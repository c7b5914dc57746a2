"""A reply cut off (by a crash, or by a full disk) and a disk that is full: the history
stays usable, the cut-off reply reads as cut off, and the note about it says what is known.

Before (an audit, session 62):

* after a crash mid-reply, a full disk failed every start (the start marks the reply
  cut off, a write): not even an export to another disk, or ``threads``, could run;
* a reply whose save a full disk refused stayed 'streaming', and the next start said Iris
  had "closed unexpectedly";
* ``chat "…"`` on a full disk left an empty "New chat" behind;
* a reply cut off before its first token was announced with "--continue", which then
  refused it (an empty reply cannot go on).

Real parts: a real SQLite file on a small tmpfs that is really full (``support.faults``),
the real CLI in this process; a scripted runtime stands in for the model.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path

import pytest

import iris_desktop.host as host_module
from iris_desktop.core.store import Store
from iris_desktop.core.views import load_transcript
from iris_desktop.host import Host

from support.crash import streaming_writer
from support.fakes import ScriptedRuntime
from support.faults import full_disk
from support.helpers import one_sentence, run_cli


def _raw(db: Path, sql: str, params=()) -> list[tuple]:
    """Rows as the file holds them (a read-only connection: nothing written)."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return conn.execute(sql, params).fetchall()


def _cut_by_a_crash(data: Path, text: str = "Day 1: the Ribeira") -> tuple[int, int]:
    """A chat whose reply was being written by a process that is gone (a kill -9):
    (thread, reply). Its ``streams`` row names this test's process, which a start takes
    for an earlier process of the same pid (this one is only starting)."""
    data.mkdir(parents=True, exist_ok=True)
    with Store(data / "iris.db") as store:
        thread = store.create_thread("Trip to Porto")
        store.add_message(thread, {"role": "user", "content": "plan three days"})
        reply = store.add_message(thread, {"role": "assistant", "content": text},
                                  status="streaming")
        store.checkpoint()  # (the WAL empty: nothing of it left to write into)
    return thread, reply


def _log_with_room(data: Path) -> None:
    """The data folder's log already begun (room left in its last page): what this file
    tests is the history; a log file that cannot be written at all fails the CLI's exit
    (``PrivateLogFile.close`` raises ENOSPC), another finding."""
    (data / "logs").mkdir(parents=True, exist_ok=True, mode=0o700)
    log = data / "logs" / "iris.log"
    log.write_text("begun\n", encoding="utf-8")
    log.chmod(0o600)


def _status(db: Path, message_id: int) -> str:
    return _raw(db, "SELECT status FROM messages WHERE id = ?", (message_id,))[0][0]


def test_a_full_disk_after_a_crash_mid_reply_still_lets_the_user_read_and_export(
        capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(host_module, "load_runtime",
                        lambda *_a, **_kw: ScriptedRuntime(["lo, and goodbye."]))
    with full_disk(tmp_path) as disk:
        data = disk.path / "data"
        db = data / "iris.db"
        data.mkdir()
        writer, thread, reply = streaming_writer(db)  # a reply being written ("Hel") …
        writer.kill()  # … when its process is killed (its -wal and -shm stay)
        writer.wait()
        _log_with_room(data)
        disk.fill()  # then the disk fills (another program)

        code, out, err = run_cli(capsys, "--data-dir", data, "threads", "--no-model", "--json")
        assert code == 0, err
        assert "Traceback" not in err
        assert (f"The reply in “t” (chat {thread}) was cut off before it was finished (Iris "
                "was closed or killed, or the disk was full); what it had written is kept; "
                f"'iris-desktop chat --thread {thread} --continue' goes on with it") in err
        listed = {t["id"]: t for t in json.loads(out)}
        assert listed[thread]["streaming"] == 0  # not "being written" for good

        elsewhere = tmp_path / "elsewhere.json"  # another disk
        code, _, err = run_cli(capsys, "--data-dir", data, "export", thread, "-o", elsewhere)
        assert code == 0, err
        exported = json.loads(elsewhere.read_text(encoding="utf-8"))["messages"]
        assert exported[-1]["content"] == "Hel"
        assert exported[-1]["status"] == "interrupted"
        code, out, err = run_cli(capsys, "--data-dir", data, "export", thread, "--format", "md")
        assert code == 0 and "Hel" in out, err

        # the window's views read it as cut off, not as a reply still being written
        with Host(data) as host:
            assert host.crash_note is not None
            assert host.store.threads()[0]["streaming"] == 0
            last = load_transcript(host.store, thread)[-1]
            assert (last.message_id, last.status) == (reply, "interrupted")
            assert last.can_regenerate
        assert _status(db, reply) == "streaming"  # nothing was written: the disk is full

        disk.free()  # space is back: the next start marks it, and says so once more
        code, _, err = run_cli(capsys, "--data-dir", data, "threads", "--no-model")
        assert code == 0 and "was cut off before it was finished" in err, err
        assert _status(db, reply) == "interrupted"
        assert _raw(db, "SELECT count(*) FROM streams") == [(0,)]
        code, _, err = run_cli(capsys, "--data-dir", data, "threads", "--no-model")
        assert code == 0 and "cut off" not in err  # said by the start that marked it
        code, out, err = run_cli(capsys, "--data-dir", data, "chat", "--thread", thread,
                                 "--continue")  # and it goes on as the note said
        assert code == 0, err
        assert _raw(db, "SELECT content, status FROM messages WHERE thread_id = ? ORDER BY id "
                        "DESC LIMIT 1", (thread,)) == [("Hello, and goodbye.", "complete")]


def test_a_reply_cut_off_before_its_first_token_is_answered_again_not_continued(
        capsys, tmp_path):
    data = tmp_path / "data"
    thread, _ = _cut_by_a_crash(data, text="")
    code, _, err = run_cli(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0, err
    assert ("The reply in “Trip to Porto” (chat 1) was cut off before it was finished (Iris "
            "was closed or killed, or the disk was full); nothing of it was written yet; "
            f"'iris-desktop chat --thread {thread} --regenerate' answers again") in err
    assert "--continue" not in err


def test_the_window_words_an_empty_cut_off_reply_with_regenerate(tmp_path):
    _cut_by_a_crash(tmp_path / "empty", text="")
    with Host(tmp_path / "empty") as host:
        assert host.crash_message("window").endswith(
            "nothing of it was written yet; open it and click Regenerate on the reply to "
            "answer again")
    _cut_by_a_crash(tmp_path / "begun")
    with Host(tmp_path / "begun") as host:
        assert host.crash_message("window").endswith(
            "what it had written is kept; open it and click Continue on the reply to go on")


def _history(data: Path) -> None:
    """A history as a closed Iris leaves it: a few chats, all in the database file."""
    data.mkdir(parents=True)
    with Store(data / "iris.db") as store:
        for chat in range(3):
            thread = store.create_thread(f"Chat {chat}")
            for turn in range(30):
                store.add_message(thread, {"role": ("user", "assistant")[turn % 2],
                                           "content": f"message {turn} of chat {chat} " * 40})
        store.checkpoint()


def _send_while_the_disk_fills(host: Host, disk, thread: int) -> int:
    """A turn during which the disk fills (to the last byte); the reply's id."""
    def fill_then_answer(_messages):
        disk.fill()
        return "a reply " * 400

    host.runtime.replies.append(fill_then_answer)
    events = list(host.send(thread, "Write a long story about a lighthouse keeper."))
    failed = [e for e in events if type(e).__name__ == "TurnFailed"]
    assert failed and "is full" in failed[0].text, [type(e).__name__ for e in events]
    return next(e.message_id for e in events if type(e).__name__ == "ReplyStarted")


def test_a_reply_a_full_disk_refused_is_failed_not_taken_for_a_crash(tmp_path):
    with full_disk(tmp_path, "8m") as disk:
        data = disk.path / "data"
        _history(data)
        with Host(data, runtime=ScriptedRuntime([]), compact=False) as host:
            host.load_model()
            reply = _send_while_the_disk_fills(host, disk, 1)
        # marked as it failed, with no byte free (the WAL's own space, after a checkpoint)
        assert _status(data / "iris.db", reply) == "error"
        disk.free()
        with Host(data) as host:
            assert host.crash_note is None  # no crash to speak of: it was said as it failed


def test_a_reply_the_disk_could_not_mark_reads_failed_and_is_marked_at_close(tmp_path):
    with full_disk(tmp_path) as disk:
        data = disk.path / "data"  # a new history: all of it in the WAL, no room at all
        with Host(data, runtime=ScriptedRuntime([]), compact=False) as host:
            host.load_model()
            thread = host.create_thread("Lighthouse")
            reply = _send_while_the_disk_fills(host, disk, thread)
            assert _status(data / "iris.db", reply) == "streaming"  # not written …
            last = load_transcript(host.store, thread)[-1]
            assert (last.message_id, last.status) == (reply, "error")  # … read as failed
            assert host.store.threads()[0]["streaming"] == 0
            disk.free()  # space is back before Iris closes: marked as it closes
        assert _status(data / "iris.db", reply) == "error"
        with Host(data) as host:
            assert host.crash_note is None


@pytest.mark.parametrize("leave", [60_000, 80_000])
def test_a_message_a_full_disk_refused_leaves_no_empty_chat(capsys, tmp_path, monkeypatch, leave):
    """``leave``: room for the new chat, not for the message (before, both left "New chat")."""
    monkeypatch.setattr(host_module, "load_runtime",
                        lambda *_a, **_kw: ScriptedRuntime(["Hello there, in five words."]))
    made = []
    create = Store.create_thread
    monkeypatch.setattr(Store, "create_thread",
                        lambda self, *a, **kw: made.append(create(self, *a, **kw)) or made[-1])
    with full_disk(tmp_path) as disk:
        data = disk.path / "data"
        db = data / "iris.db"
        code, _, err = run_cli(capsys, "--data-dir", data, "threads", "--no-model")
        assert code == 0, err
        _log_with_room(data)
        disk.fill(leave=leave)
        code, out, err = run_cli(capsys, "--data-dir", data, "chat", "Say hello in five words.")
        disk.free()
        assert made, "the chat was not even made: no room for it"
        assert code == 1 and one_sentence(err) and "is full" in err, err
        assert out == ""
        assert _raw(db, "SELECT count(*) FROM threads") == [(0,)]  # no empty "New chat"


def test_two_threads_ending_streams_on_a_full_disk_keep_each_other_s_ids(tmp_path, monkeypatch):
    """The review of this change: the overlay of replies read as ended (not yet marked on a
    full disk) was read, written and replaced without a lock, so when the model thread and
    the window's poll ended streams at once, the last to store dropped the other's ids (a
    reply then showed as still being written). The second store's call is made inside the
    first's write, as a second thread would; both writes fail as a full disk fails them."""
    from iris_desktop.core.store import messages

    data = tmp_path / "data"
    _, first = _cut_by_a_crash(data)
    with Store(data / "iris.db") as one, Store(data / "iris.db") as two:
        thread = two.create_thread("Another")
        second = two.add_message(thread, {"role": "assistant", "content": "Hal"},
                                 status="streaming")

        def full(self, write):
            exc = sqlite3.OperationalError("database or disk is full")
            exc.sqlite_errorname = "SQLITE_FULL"
            if self is one:  # the other thread ends its own reply meanwhile
                assert two.end_streams({second: "error"}) is False
            raise exc

        monkeypatch.setattr(messages.Messages, "_small_write", full)
        assert one.end_streams({first: "interrupted"}) is False
        assert messages.unwritten_ends(data / "iris.db") == {first: "interrupted", second: "error"}
        monkeypatch.undo()
        assert one.end_streams({}) is True  # room again: both marked, nothing left in memory
        assert messages.unwritten_ends(data / "iris.db") == {}
        assert [m["status"] for m in two.messages(thread)][-1] == "error"
