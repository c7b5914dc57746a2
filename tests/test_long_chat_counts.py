"""A long chat costs what its request walks, not its whole length: the window's message
states and the CLI's ``context`` on chats of 5,000+ messages (counted, never timed)."""

from __future__ import annotations

import sqlite3

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from iris_desktop.core.store import Store  # noqa: E402
from iris_desktop.paths import app_paths  # noqa: E402

from support.fakes import ScriptedRuntime  # noqa: E402
from support.windows import settle  # noqa: E402

TURNS = 2_500  # 5,000 messages
#: counted by tiktoken in a fixed window: no model is loaded (what is said does not need one)
NO_MODEL = ("--set", "context.token_counter=tiktoken", "--set", "context.window=8192")


def seed(data_dir) -> int:
    messages = []
    for i in range(TURNS):
        messages.append({"role": "user", "content": f"question {i} " + "word " * 12})
        messages.append({"role": "assistant", "content": f"answer {i} " + "word " * 12})
    with Store(app_paths(data_dir).ensure().db_path) as store:
        thread = store.create_thread("long")
        store.add_messages(thread, messages)
    return thread


def counted(data_dir) -> int:
    with sqlite3.connect(app_paths(data_dir).db_path) as conn:
        return conn.execute("SELECT count(*) FROM token_counts").fetchone()[0]


def test_the_windows_message_states_of_a_5000_message_chat_count_only_what_the_request_walks(
        make_window, qtbot, data_dir):
    """Before: the states behind the transcript's "not sent" marks tokenized every message
    of the chat on the DB thread (all 5,000 here; a 100,000-message chat kept that thread
    busy for a minute, a send waiting behind it), though a state needs no count."""
    thread = seed(data_dir)
    window = make_window(ScriptedRuntime([]))
    shown = []
    window.app_state.statesChanged.connect(shown.append)
    window.open_thread(thread)
    qtbot.waitUntil(lambda: bool(shown), timeout=60_000)
    settle(qtbot, window)
    with Store(app_paths(data_dir).db_path) as store:  # every message's state, as the window asks
        states = {m["id"]: shown[-1].get(m["id"]) for m in store.messages(thread)}
    assert len(states) == 2 * TURNS
    assert states[max(states)] == "verbatim" and states[min(states)] == "dropped"
    sent = sum(1 for s in states.values() if s == "verbatim")
    assert 0 < sent < 1_000
    # what the meter's plan walked (the newest turns, a little past the budget), not 5,000
    assert counted(data_dir) < 2 * sent + 50


def test_context_says_it_is_counting_a_long_chat_before_it_does_once(capsys, tmp_path):
    """Before: ``context`` on a chat never counted was silent while it tokenized every
    message for its list (100,000 messages: two silent minutes on this machine); now one
    line on stderr says what it counts, and the next run (the counts kept) says nothing."""
    from support.helpers import run_cli

    data = tmp_path / "data"
    thread = seed(data)
    code, out, err = run_cli(capsys, "--data-dir", data, *NO_MODEL, "context", thread)
    assert code == 0, err
    assert f"counting the tokens of thread {thread}'s 5,000 messages" in err
    assert counted(data) == 2 * TURNS
    code, out, err = run_cli(capsys, "--data-dir", data, *NO_MODEL, "context", thread)
    assert code == 0 and "counting" not in err, err
