"""Drafts in the window (an audit of attachments and drafts): what was typed before a
chat's stored draft was read is kept with it, never in its place."""

from __future__ import annotations

import pytest

from iris_desktop.core.attachments import Attachment
from iris_desktop.core.store import Store
from iris_desktop.paths import app_paths

from support.fakes import ScriptedRuntime
from support.windows import settle

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")


def test_a_chat_deleted_by_a_command_keeps_the_new_chats_own_draft(make_window, qtbot,
                                                                   data_dir):
    """Before: "draft for new chat" was saved in New chat; chat A, open with its draft
    and a file, was deleted by the CLI; the window moved to New chat saying what was
    typed is kept, and A's draft and file replaced New chat's stored draft (read after
    the move, it was dropped as older than what was typed): its text and file were gone.
    Now both are in the box, A's text, a blank line, New chat's text, and both files,
    and that is what is stored."""
    db = app_paths(data_dir).ensure().db_path
    with Store(db) as store:
        chat_a = store.create_thread("chat A")
        store.add_messages(chat_a, [{"role": "user", "content": "hello"},
                                    {"role": "assistant", "content": "hi"}])
        store.save_draft(None, "draft for new chat", [("plan.md", "Day 1: Porto")])
    window = make_window(ScriptedRuntime([]))
    window.threads_control.poll_timer.stop()
    window.open_thread(chat_a)
    qtbot.waitUntil(lambda: chat_a in window.threads_control._rows, timeout=10_000)
    settle(qtbot, window)
    window.composer.set_text("draft for A")
    window.composer.add_attachments([Attachment("README.md", "Project A")])
    with Store(db) as command:
        command.delete_thread(chat_a)
    window.threads_control.poll()
    qtbot.waitUntil(lambda: window.thread_id is None, timeout=6_000)
    settle(qtbot, window)
    assert window.composer.text() == "draft for A\n\ndraft for new chat"
    assert [a.name for a in window.composer.attachments] == ["README.md", "plan.md"]
    assert "what you typed for it is kept here" in window.status_area.current_message()
    window.drafts.flush()
    settle(qtbot, window)
    with Store(db) as store:
        assert store.draft_with_files(None) == (
            "draft for A\n\ndraft for new chat",
            [("README.md", "Project A"), ("plan.md", "Day 1: Porto")])


def test_typing_before_a_chats_draft_is_read_keeps_both(make_window, qtbot, data_dir):
    """Before: a chat opened, a few words typed before its stored draft was read (a busy
    DB thread): the stored draft was dropped, then overwritten when the pause came. Now
    the box holds the typed words, a blank line, then the stored draft; the files of both."""
    db = app_paths(data_dir).ensure().db_path
    with Store(db) as store:
        chat = store.create_thread("trip")
        store.save_draft(chat, "half a question about the trip", [("list.md", "- lemons\n")])
    window = make_window(ScriptedRuntime([]))
    window.open_thread(chat)  # the draft is read on the DB thread, after this
    window.composer.set_text("quick note")
    window.composer.add_attachments([Attachment("notes.txt", "40% by March")])
    settle(qtbot, window)
    assert window.composer.text() == "quick note\n\nhalf a question about the trip"
    assert [a.name for a in window.composer.attachments] == ["notes.txt", "list.md"]
    qtbot.wait(600)  # the pause: the merged draft is written
    settle(qtbot, window)
    with Store(db) as store:
        assert store.draft_with_files(chat) == (
            "quick note\n\nhalf a question about the trip",
            [("notes.txt", "40% by March"), ("list.md", "- lemons\n")])


def counted(calls: list, name: str, method):
    """``method``, noting ``name`` in ``calls`` each time it runs."""
    def run(*args, **kwargs):
        calls.append(name)
        return method(*args, **kwargs)
    return run


def test_a_key_in_a_long_draft_reads_the_box_once_and_leaves_its_height(make_window, qtbot):
    """Before (a 5 MB draft froze the window 1–6 s a key): each change copied the whole
    text out of the box four or five times (the meter, the draft as the model reads it,
    the draft's save), and set the box's height again though it stayed 8 lines (0.3 s
    each in that draft). Now the text is read once per change and the height is set only
    when it changes."""
    window = make_window(ScriptedRuntime([]))
    edit = window.composer.edit
    edit.setPlainText("a line of the long draft\n" * 2_000)
    qtbot.wait(700)  # the meter's and the draft's pauses
    settle(qtbot, window)
    calls: list[str] = []
    edit.toPlainText = counted(calls, "read", edit.toPlainText)
    edit.setFixedHeight = counted(calls, "height", edit.setFixedHeight)
    edit.moveCursor(edit.textCursor().MoveOperation.End)
    qtbot.keyClicks(edit, "x")
    qtbot.wait(700)  # the meter is counted anew and the draft written
    settle(qtbot, window)
    assert window.composer.text().endswith("\nx")
    with Store(window.host.paths.db_path) as store:
        assert store.draft_with_files(None)[0].endswith("\nx")
    assert calls == ["read"]


def test_a_paste_the_model_refuses_as_too_large_stays_in_the_box_untouched(make_window,
                                                                            qtbot):
    """Before: Enter on a paste certainly too large for the window emptied the box, then,
    the turn refused, put the same text back (2.6 s for 5 MB), the draft written empty
    and again in full. Now the box keeps it as it is, by the same check the model's
    refusal makes; the refusal is said as before and nothing is stored."""
    from PySide6.QtCore import Qt

    runtime = ScriptedRuntime(["never sent"])
    window = make_window(runtime, overrides={"context.window": "512",
                                             "context.token_budget_ratio": "0.2"})
    paste = "0123456789abcdef " * 20_000  # more bytes than 256 a token in the budget
    edit = window.composer.edit
    edit.setPlainText(paste)
    calls: list[str] = []
    for name in ("clear", "setPlainText", "toPlainText"):
        setattr(edit, name, counted(calls, name, getattr(edit, name)))
    edit.setFocus()
    # sent before it is counted (150 ms later): once the window knows it is too large,
    # Send is off and nothing is tried (tests/test_newcomer_window.py)
    qtbot.keyClick(edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not window.generating, timeout=30_000)
    qtbot.wait(700)
    settle(qtbot, window)
    assert window.view.transcript.entries()[-1].text.startswith("Not sent: ")
    assert runtime.requests == [] and window.composer.text() == paste
    assert "clear" not in calls and "setPlainText" not in calls
    with Store(window.host.paths.db_path) as store:
        assert all(store.messages(t["id"]) == [] for t in store.threads())
        assert store.draft_with_files(window.thread_id)[0] == paste
