"""The window after a turn whose answer has no words: with pytest-qt
(QT_QPA_PLATFORM=offscreen), on a real SQLite file, a scripted model."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402

from support.fakes import ScriptedRuntime  # noqa: E402
from support.windows import settle  # noqa: E402

LIST = '<tool_call>{"name": "list_directory", "arguments": {"path": "."}}</tool_call>'


def send(qtbot, window, text: str) -> None:
    window.composer.edit.setFocus()
    window.composer.set_text(text)
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)


def test_an_empty_answer_says_so_in_the_status_bar(make_window, qtbot, tmp_path):
    """Before (an audit): a tool call, then an answer with no words: the window showed an
    empty "Iris" reply and "Ready", as after any answer. Now the status says "No answer"
    and the passing message why and what to do, until the next turn (Compact now, or a
    message answered)."""
    folder = tmp_path / "allowed"
    folder.mkdir()
    (folder / "a.txt").write_text("x")
    window = make_window(ScriptedRuntime([LIST, "", "One file: a.txt."]),
                         overrides={"tools.allowed_paths": json.dumps([str(folder)])})
    send(qtbot, window, "What files are there?")
    qtbot.waitUntil(lambda: window.status_area.current_message().startswith("The model ended"),
                    timeout=20_000)
    assert window.status_area.current_message() == (
        "The model ended its reply without writing anything; Regenerate it (the link on the "
        "reply, or Shift+F10), or ask again in other words")
    assert window.state_label.text() == "No answer"
    settle(qtbot, window)
    window.turns.compact_now()  # its own end says what it did, not the turn's "No answer"
    qtbot.waitUntil(lambda: not window.generating, timeout=20_000)
    assert window.state_label.text() != "No answer"
    settle(qtbot, window)
    send(qtbot, window, "And now?")
    qtbot.waitUntil(lambda: not window.generating and window.state_label.text() != "No answer",
                    timeout=20_000)
    assert not window.status_area.current_message().startswith("The model ended")


def test_a_send_refused_as_the_chat_answers_elsewhere_says_not_sent(make_window, qtbot,
                                                                    data_dir):
    """Before (an audit): a message sent while a command answered in the same chat came
    back to the box with the status "Failed", and the red "Not sent: this chat is
    answering in another…" notice stayed in the transcript, between the command's
    question and its answer once they arrived. Now the status says "Not sent", the
    sentence is the status bar's message, and no notice is left among the messages."""
    from iris_desktop.core.store import Store
    from iris_desktop.paths import app_paths

    window = make_window(ScriptedRuntime(["never"]))
    with Store(app_paths(data_dir).db_path) as store:
        thread = store.create_thread("busy")
    window.threads_control.refresh_threads()
    qtbot.waitUntil(lambda: window.threads.list.count() == 1, timeout=10_000)
    window.threads_control.open_thread(thread)
    settle(qtbot, window)
    with Store(app_paths(data_dir).db_path) as other:  # a command's turn holds the chat
        assert other.take_turn_lease(thread, "the command's turn", 60) is None
        send(qtbot, window, "are you there?")
        qtbot.waitUntil(lambda: not window.generating and window.state_label.text() == "Not sent",
                        timeout=20_000)
        assert window.status_area.current_message().startswith(
            "Not sent: this chat is answering in another Iris window or command")
        assert window.composer.text() == "are you there?"
        assert window.view.transcript.entries() == []
        other.release_turn_lease(thread, "the command's turn")
