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
        "The model ended its reply without writing anything; Regenerate it (right-click the "
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
