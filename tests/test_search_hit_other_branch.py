"""A search hit on a message of another branch than the one shown, clicked while a reply
is being written: in another chat, the hit's branch becomes the active one and the hit is
shown (before: not switched because something was generating somewhere, every page of the
chat was read back to its first message, in one job, and nothing was shown or said); in
this chat, the reply's branch stays and the user is told why the hit is not shown,
without the chat being read back to its start. Real SQLite, real widgets offscreen."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("pytestqt")

from test_transcript_pages import _lines, _Reads  # noqa: E402

from support.fakes import ScriptedRuntime  # noqa: E402
from support.windows import settle  # noqa: E402


def branched_chat(store) -> tuple[int, int]:
    """A chat of 3,002 messages whose last reply has two alternatives, the second shown:
    (its id, the first alternative's)."""
    tid = store.create_thread("long")
    store.add_messages(tid, _lines(3_000, "line"))
    question = store.add_messages(tid, [{"role": "user", "content": "the question"}])[0]
    first = store.add_message(tid, {"role": "assistant", "content": "answer v1"})
    store.set_head(tid, question)
    store.add_message(tid, {"role": "assistant", "content": "answer v2"})
    return tid, first


def shown(window) -> int | None:
    """The message the transcript's cursor is on."""
    entry = window.view.current_entry()
    return entry.message_id if entry is not None else None


def test_a_hit_is_shown_when_the_chat_is_read_again_before_it(make_window, qtbot):
    """The chat list's poll sees the branch the hit switched to and reads the chat again
    (as any change another process makes): that reload no longer replaces the hit's, which
    opened the chat at its end now and then (2 of 5 runs of the test below)."""
    window = make_window(ScriptedRuntime([]))
    tid, first = branched_chat(window.host.store)
    window.open_thread(window.host.store.create_thread("other"))
    settle(qtbot, window)
    window.host.store.set_head(tid, first)  # (the switch onto_path makes)
    held = threading.Event()
    control = window.threads_control
    control.background.run(lambda store: held.wait(10), None)  # the DB thread busy meanwhile
    control._open(tid, first)  # the hit's reload, queued
    control.reload_transcript()  # the poll's, queued after it, before it was read
    held.set()
    qtbot.waitUntil(lambda: shown(window) == first, timeout=30_000)
    settle(qtbot, window)
    assert shown(window) == first


def answering(make_window, qtbot, in_the_chat: bool):
    """A window answering slowly in the branched chat (``in_the_chat``) or in another:
    (window, the chat, its hidden alternative, what the status bar said)."""
    window = make_window(ScriptedRuntime(["A slow reply " * 200], delay_s=0.05))
    tid, first = branched_chat(window.host.store)
    window.open_thread(tid if in_the_chat else window.host.store.create_thread("other"))
    settle(qtbot, window)
    said: list[str] = []
    window.app_state.statusMessage.connect(lambda text, _ms: said.append(text))
    window.send("Hello?")
    qtbot.waitUntil(lambda: window.generating, timeout=30_000)
    return window, tid, first, said


def test_a_hit_on_another_branch_while_another_chat_answers_switches_and_shows_it(make_window, qtbot):
    window, tid, first, said = answering(make_window, qtbot, in_the_chat=False)
    with _Reads() as reads:
        window.threads_control.open_thread(tid, first)
        qtbot.waitUntil(lambda: shown(window) == first, timeout=30_000)
    assert "Switched to the branch with this message" in said
    assert reads.rows < 2_000  # the newest page of the hit's branch, not the whole chat


def test_a_hit_on_another_branch_of_the_chat_answering_is_not_shown_and_says_why(make_window, qtbot):
    window, tid, first, said = answering(make_window, qtbot, in_the_chat=True)
    with _Reads() as reads:
        window.threads_control.open_thread(tid, first)
        qtbot.waitUntil(lambda: any("on another branch" in s for s in said), timeout=30_000)
        for _ in range(10):
            settle(qtbot, window)
    assert window.generating and window.app_state.thread_id == tid
    assert reads.rows < 2_000  # before: every page, back to the first message
    assert not window.host.store.on_path(tid, [first])  # the reply's branch stayed
