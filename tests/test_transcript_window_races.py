"""The window's transcript after a chat change that raced its own reads (review of the
tail reads, session 64). A real window offscreen, a real SQLite file, the scripted runtime.

- States: a turn's states say only what changed since the last ones (``states_since``);
  after New chat and reopening a chat, or a quick A → B → A, the transcript was read
  afresh without states and then given only the changes (none): 314 of 400 messages
  showed "sent word for word" where the request had dropped them.
- Tail: a send, then another chat and back before the reload: the reload merged the turn's
  tail into a transcript the chat change had emptied, and a long chat showed its last
  turn alone (4 rows) until it was opened again.
"""

from __future__ import annotations

import threading

import pytest

from iris_desktop.core.views import message_states

from support.fakes import ScriptedRuntime
from support.windows import settle


def lines(n: int, word: str) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{word} {i}"} for i in range(n)]


def quiet(qtbot, window) -> None:
    settle(qtbot, window)
    qtbot.wait(300)
    settle(qtbot, window)


def wrong_states(window) -> dict:
    """Messages whose state in the window is not the request's."""
    store, tid, planner = window.host.store, window.app_state.thread_id, window.app_state.planner
    states = message_states(planner.engine(store), planner.plan_or_error(store, tid))
    shown = {e.message_id: e.state for e in window.view.transcript.entries() if e.message_id}
    return {k: (shown.get(k), v) for k, v in states.items() if shown.get(k) != v}


def two_chats(window, n: int, word: str) -> tuple[int, int]:
    store = window.host.store
    tid = store.create_thread("long")
    store.add_messages(tid, lines(n, word))
    other = store.create_thread("other")
    store.add_messages(other, lines(4, "short"))
    return tid, other


def opened(qtbot, window, tid: int, n: int) -> None:
    window.open_thread(tid)
    qtbot.waitUntil(lambda: window.view.transcript.total >= n, timeout=60_000)
    quiet(qtbot, window)


LONGER = "a longer line of words to fill the window"


def test_reopening_a_chat_after_new_chat_shows_every_state(make_window, qtbot):
    window = make_window(ScriptedRuntime([]), overrides={"context.window": "2048"})
    tid, _ = two_chats(window, 400, LONGER)
    opened(qtbot, window, tid, 400)
    assert not wrong_states(window)
    assert any(e.state == "dropped" for e in window.view.transcript.entries())  # (a test of something)
    window.threads_control.new_chat()
    quiet(qtbot, window)
    opened(qtbot, window, tid, 400)
    assert not wrong_states(window)


def test_a_quick_switch_away_and_back_shows_every_state(make_window, qtbot):
    window = make_window(ScriptedRuntime(["Reply."]), overrides={"context.window": "2048"})
    tid, other = two_chats(window, 400, LONGER)
    opened(qtbot, window, tid, 400)
    assert not wrong_states(window)
    window.open_thread(other)  # no wait: its states are superseded by the next chat's
    opened(qtbot, window, tid, 400)
    assert not wrong_states(window)
    window.send("One more?")
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    quiet(qtbot, window)
    assert not wrong_states(window)


@pytest.mark.parametrize("n", [300, 2_000])
def test_a_send_then_away_and_back_keeps_the_whole_chat(make_window, qtbot, n):
    """The database thread is kept busy (as by a long chat's counts) while the turn
    streams and the chats change, so the reads the chat changes ask for wait behind it and
    the turn's reload, asked for last, supersedes them."""
    window = make_window(ScriptedRuntime(["Reply one two three."], delay_s=0.0))
    tid, other = two_chats(window, n, "line")
    opened(qtbot, window, tid, n)
    gate = threading.Event()
    window.threads_control.background.run(lambda store: gate.wait(60))
    try:
        window.send("q?")
        window.open_thread(other)
        window.open_thread(tid)
        qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
        qtbot.wait(200)
    finally:
        gate.set()
    quiet(qtbot, window)
    model = window.view.transcript
    assert model.total == n + 2
    assert [e.text for e in model.entries() if e.message_id][-2:] == ["q?", "Reply one two three."]
