"""Session 66's review: a search hit whose page was still being read when the user pressed
New chat stayed pending, and the next plain open of that chat (a click in the list) jumped
to the old hit instead of the chat's end. A real window (offscreen), the DB thread held
busy so that New chat comes first."""
from __future__ import annotations

import threading

import pytest

pytest.importorskip("pytestqt")

from test_transcript_pages import _lines  # noqa: E402

from support.fakes import ScriptedRuntime  # noqa: E402
from support.windows import settle  # noqa: E402


def test_a_hit_left_by_new_chat_does_not_open_the_chat_later(make_window, qtbot):
    window = make_window(ScriptedRuntime([]))
    store = window.host.store
    tid = store.create_thread("long")
    ids = store.add_messages(tid, _lines(400, "line"))
    hit = ids[10]
    window.open_thread(store.create_thread("other"))
    settle(qtbot, window)
    control = window.threads_control
    held = threading.Event()
    control.background.run(lambda s: held.wait(10), None)  # the DB thread busy meanwhile
    control._open(tid, hit)  # the hit's reload, queued (what open_thread does once on path)
    control.new_chat()  # Ctrl+N before that page was read
    held.set()
    settle(qtbot, window)
    assert window.app_state.thread_id is None
    control.open_thread(tid)  # later: the chat clicked in the list
    settle(qtbot, window)
    qtbot.wait(200)
    settle(qtbot, window)
    entry = window.view.current_entry()
    assert entry is None or entry.message_id != hit, "opened at the stale search hit, not the chat's end"
    assert window.view.transcript.last_message_id() == ids[-1]
