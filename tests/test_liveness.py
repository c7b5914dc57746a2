"""Which writer is alive survives pid reuse: a process is told apart by its start time, so a
killed chat's reply is recovered and a dead compaction lease is taken over even when its pid
has been reused. Real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from iris_desktop.core.store import Store
from iris_desktop.core.store.base import process_start

from support.crash import streaming_writer

ROOT = Path(__file__).resolve().parent.parent
LINUX = sys.platform.startswith("linux")


def _python(code: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True, **kwargs)


# --- liveness survives pid reuse ------------------------------------------------------


def test_process_start_tells_two_processes_apart():
    here = process_start(os.getpid())
    assert here is not None and here == process_start(os.getpid())
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert process_start(other.pid) not in (None, here)
    finally:
        other.kill()
        other.wait()
    assert process_start(other.pid) is None  # gone
    assert process_start(0) is None and process_start(-1) is None


def _reused_pid() -> subprocess.Popen:
    """A live process that has nothing to do with Iris: it stands for the process that the
    OS gave a dead writer's pid to."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


def test_a_killed_chat_s_reply_is_recovered_even_when_its_pid_is_reused(tmp_path):
    db = tmp_path / "iris.db"
    Store(db).close()
    writer, thread, reply = streaming_writer(db)
    other = None
    try:
        with Store(db) as store:
            assert store.mark_interrupted_streams() == []  # its writer is alive: left alone
        writer.kill()
        writer.wait()
        # the OS hands the dead writer's pid to an unrelated process
        other = _reused_pid()
        with Store(db) as store:
            store.conn.execute("UPDATE streams SET pid = ? WHERE message_id = ?", (other.pid, reply))
            store.conn.commit()
            assert len(store.mark_interrupted_streams()) == 1
            row = store.messages(thread)[-1]
            assert (row["id"], row["status"], row["content"]) == (reply, "interrupted", "Hel")
    finally:
        for process in (writer, other):
            if process is not None:
                process.kill()
                process.wait()


@pytest.mark.skipif(not LINUX, reason="reads the process state from /proc")
def test_a_killed_writer_not_yet_reaped_is_dead(tmp_path):
    """A zombie (killed, its parent has not waited for it yet) still answers signal 0, but
    writes nothing any more: its reply is recovered."""
    db = tmp_path / "iris.db"
    Store(db).close()
    writer = _python(f"""
        import time
        from iris_desktop.core.store import Store
        store = Store({str(db)!r})
        thread = store.create_thread("t")
        store.add_message(thread, {{"role": "assistant", "content": "Hel"}}, status="streaming")
        print("streaming", flush=True)
        time.sleep(600)
    """)
    try:
        assert writer.stdout.readline().strip() == "streaming"
        os.kill(writer.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{writer.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with Store(db) as store:
            assert len(store.mark_interrupted_streams()) == 1
    finally:
        writer.kill()
        writer.wait()


def test_a_compaction_lease_of_a_dead_process_is_taken_over_despite_pid_reuse(tmp_path):
    db = tmp_path / "iris.db"
    with Store(db) as store:
        thread = store.create_thread("t")
    holder = _python(f"""
        import time
        from iris_desktop.core.store import Store
        store = Store({str(db)!r})
        assert store.take_compaction_lease({thread}, "theirs", 600) is None
        print("held", flush=True)
        time.sleep(600)
    """)
    other = None
    try:
        assert holder.stdout.readline().strip() == "held"
        with Store(db) as store:
            assert store.take_compaction_lease(thread, "ours", 600)["pid"] == holder.pid
        holder.kill()
        holder.wait()
        other = _reused_pid()
        with Store(db) as store:
            store.conn.execute("UPDATE compaction_leases SET pid = ?", (other.pid,))
            store.conn.commit()
            assert store.take_compaction_lease(thread, "ours", 600) is None  # ours now
    finally:
        for process in (holder, other):
            if process is not None:
                process.kill()
                process.wait()


def test_rows_written_before_the_start_was_recorded_fall_back_to_the_pid(tmp_path):
    with Store(tmp_path / "iris.db") as store:
        thread = store.create_thread("t")
        reply = store.add_message(thread, {"role": "assistant", "content": "x"}, status="streaming")
        other = _reused_pid()
        try:
            store.conn.execute("UPDATE streams SET pid = ?, pid_start = NULL WHERE message_id = ?",
                               (other.pid, reply))
            store.conn.commit()
            assert store.mark_interrupted_streams() == []  # all it knows is a live pid
        finally:
            other.kill()
            other.wait()
        assert len(store.mark_interrupted_streams()) == 1


def _cut_by_a_crash(data) -> int:
    """A chat whose reply was being written by a process that is gone."""
    from iris_desktop.core.store import Store

    data.mkdir(parents=True, exist_ok=True)
    with Store(data / "iris.db") as store:
        thread = store.create_thread("Trip to Porto")
        store.add_message(thread, {"role": "user", "content": "plan three days"})
        store.add_message(thread, {"role": "assistant", "content": "Day 1: the Ribeira"},
                          status="streaming")  # no live writer: a crash
    return thread


def test_a_reply_cut_off_by_a_crash_is_said_once_by_the_cli(tmp_path, capsys):
    """Before (an audit): a reply cut off by a kill or a power cut came back marked as
    stopped, as if the user had pressed Stop; only the log said a crash happened. The
    start that finds it says so, once, with how to go on."""
    from iris_desktop.cli import main

    data = tmp_path / "data"
    thread = _cut_by_a_crash(data)
    assert main(["--data-dir", str(data), "threads", "--no-model"]) == 0
    err = capsys.readouterr().err
    assert ("The reply in “Trip to Porto” (chat 1) was cut off before it was finished (Iris "
            "was closed or killed, or the disk was full); what it had written is kept; "
            "'iris-desktop chat --thread 1 --continue' goes on with it") in err and thread == 1
    assert main(["--data-dir", str(data), "threads", "--no-model"]) == 0
    assert "cut off" not in capsys.readouterr().err  # said once


def test_a_reply_cut_off_by_a_crash_is_said_by_the_window(make_window, qtbot, data_dir):
    _cut_by_a_crash(data_dir)
    window = make_window()
    message = window.status_area.current_message()
    assert message.startswith("The reply in “Trip to Porto” (chat 1) was cut off before it "
                              "was finished"), message
    assert "Continue" in message
