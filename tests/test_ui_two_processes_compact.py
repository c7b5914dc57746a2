"""The window beside a command that compacts the same chat (a real ``iris-desktop compact``
process, ``tests/support/slow_cli.py``: its model takes as long as the test holds it).

Before (an audit): Compact now, clicked while the command summarized the chat, rightly
skipped, but the status bar said "Compaction skipped: 165 older turns are not sent; the
inspector (Ctrl+I) says why.", never the reason stored with the skip (another process was
at it, and its summary would be used); and once the command had saved its summary (the
divider in the chat, the meter fitting everything) the bar still said turns were not sent,
for good. A sentence about the request planned at a turn's end stayed after the chat was
planned anew."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from iris_desktop.core.store import Store  # noqa: E402
from iris_desktop.paths import app_paths  # noqa: E402

from support.fakes import ScriptedRuntime  # noqa: E402
from support.windows import settle  # noqa: E402

SLOW_CLI = Path(__file__).resolve().parent / "support" / "slow_cli.py"
SUMMARIZED = "Another Iris process summarized the earlier turns of “long plans”"


def seed(data: Path, turns: int = 200) -> int:
    """A chat far longer than the scripted model's 8,192-token window."""
    with Store(app_paths(data).ensure().db_path) as store:
        thread = store.create_thread("long plans")
        messages = []
        for i in range(turns):
            messages += [
                {"role": "user", "content": f"question {i}: tell me about topic {i} " + "words " * 40},
                {"role": "assistant", "content": f"answer {i}: topic {i} is fine " + "more " * 60}]
        store.add_messages(thread, messages)
    return thread


def compact_command(data: Path, thread: int, started: Path, gate: Path) -> subprocess.Popen:
    """``iris-desktop compact THREAD`` in its own process; its summary waits for ``gate``."""
    env = {**os.environ, "IRIS_TEST_STARTED": str(started), "IRIS_TEST_GATE": str(gate),
           "IRIS_TEST_REPLY": "a summary that is not JSON"}
    return subprocess.Popen(
        [sys.executable, str(SLOW_CLI), "--data-dir", str(data), "--set",
         "context.recall_semantic=false", "compact", str(thread)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def summaries(data: Path, thread: int) -> int:
    with Store(app_paths(data).db_path) as store:
        return store.conn.execute("SELECT count(*) FROM summaries WHERE thread_id = ?",
                                  (thread,)).fetchone()[0]


def finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "Traceback" not in err, (out, err)
    return out


def dividers(window) -> list[str]:
    return [e.title for e in window.view.transcript.entries() if e.kind == "divider"]


def test_compact_now_beside_a_command_compacting_says_why_then_what_it_did(
        make_window, qtbot, data_dir, tmp_path):
    thread = seed(data_dir)
    window = make_window()
    window.open_thread(thread)
    settle(qtbot, window)
    started, gate = tmp_path / "started", tmp_path / "gate"
    proc = compact_command(data_dir, thread, started, gate)
    try:
        # the command holds its lease on the chat, its model writing the summary
        qtbot.waitUntil(started.exists, timeout=60_000)
        window.turns.compact_now()
        qtbot.waitUntil(lambda: not window.generating, timeout=30_000)
        settle(qtbot, window)
        said = window.state_label.text()
        # the reason stored with the skip, not the turns the plan leaves out meanwhile
        assert f"another Iris process (pid {proc.pid}) has been compacting this thread" in said, said
        assert "uses its summary once it is saved" in said
        assert "not sent" not in said
        assert summaries(data_dir, thread) == 0 and not dividers(window)
    finally:
        gate.touch()
    assert "compacted (manual" in finish(proc)
    # the window sees the command's summary (its poll), and says so; the sentence about
    # the request planned before it goes
    qtbot.waitUntil(lambda: SUMMARIZED in window.status_area.message.text(), timeout=30_000)
    settle(qtbot, window)
    assert len(dividers(window)) == 1
    assert window.state_label.text() == "Ready"
    assert "not sent" not in window.meter.toolTip()


def test_turns_not_sent_goes_when_a_command_summarizes_them(make_window, qtbot, data_dir, tmp_path):
    thread = seed(data_dir)
    window = make_window(ScriptedRuntime(["Yes."]))
    window.open_thread(thread)
    settle(qtbot, window)
    window.send("And then?")
    qtbot.waitUntil(lambda: not window.generating, timeout=30_000)
    settle(qtbot, window)
    assert window.state_label.text().endswith("older turns are not sent; the inspector (Ctrl+I) "
                                              "says why.")
    gate = tmp_path / "gate"
    gate.touch()  # the command's model answers at once
    finish(compact_command(data_dir, thread, tmp_path / "started", gate))
    qtbot.waitUntil(lambda: bool(dividers(window)), timeout=30_000)  # the window saw the summary
    settle(qtbot, window)
    assert window.state_label.text() == "Ready"
    assert SUMMARIZED in window.status_area.message.text()
