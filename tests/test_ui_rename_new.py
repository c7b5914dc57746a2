"""Two window leftovers, with the real window (pytest-qt, offscreen):

- Renaming a chat to a blank name: the rename editor refuses it itself and says why
  (Cancel keeps the title); before, the blank title went to the DB thread, whose
  refusal logged a "background job failed" ValueError traceback.
- A new chat whose first message is refused before it is stored (too large for the
  model's window): no empty "New chat" is listed, the notice says why, and what was
  typed stays in the box; the empty thread goes once the window leaves it, what was
  typed becoming the new chat's draft. Before, it stayed listed, empty, for good.
"""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from PySide6.QtCore import QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication, QInputDialog  # noqa: E402

from iris_desktop.core.store import Store  # noqa: E402
from iris_desktop.paths import app_paths  # noqa: E402

from support.fakes import ScriptedRuntime  # noqa: E402
from support.windows import settle  # noqa: E402


def listed(window) -> list[str]:
    return [window.threads.list.item(i).text() for i in range(window.threads.list.count())]


def problems(caplog, capfd) -> list[str]:
    """Errors logged (with or without a traceback) and any traceback on stderr."""
    found = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    err = capfd.readouterr().err
    return found + (["a traceback on stderr"] if "Traceback" in err else [])


def answer_dialogs(answers: list[str | None], labels: list[str]) -> None:
    """Answer the rename dialogs as they open, in turn: a text to enter and accept, or
    None for Cancel; each dialog's label goes to ``labels``."""
    answered: set[int] = set()

    def look() -> None:
        dialog = QApplication.activeModalWidget()
        if isinstance(dialog, QInputDialog) and dialog.isVisible() and id(dialog) not in answered:
            answered.add(id(dialog))
            labels.append(dialog.labelText())
            answer = answers.pop(0)
            if answer is None:
                dialog.reject()
            else:
                dialog.setTextValue(answer)
                dialog.accept()
        if answers:
            QTimer.singleShot(20, look)

    QTimer.singleShot(0, look)


def test_a_blank_name_is_refused_in_the_rename_editor_without_a_traceback(
        make_window, qtbot, data_dir, caplog, capfd):
    with Store(app_paths(data_dir).ensure().db_path) as store:
        thread = store.create_thread("old title")
        store.add_message(thread, {"role": "user", "content": "hello"})
    window = make_window(ScriptedRuntime([]))
    qtbot.waitUntil(lambda: listed(window) == ["old title"], timeout=5_000)
    caplog.set_level(logging.INFO)
    capfd.readouterr()

    labels: list[str] = []
    answer_dialogs(["  \n ", "new title"], labels)  # blank, then a title
    window.threads_control.rename_dialog(thread, "old title")
    assert labels[0] == "Title:"
    assert labels[1].startswith("A chat's title cannot be empty: type one, or Cancel")
    qtbot.waitUntil(lambda: listed(window) == ["new title"], timeout=5_000)

    labels.clear()
    answer_dialogs(["   ", None], labels)  # blank, then Cancel: the title stays
    window.threads_control.rename_dialog(thread, "new title")
    assert len(labels) == 2 and "cannot be empty" in labels[1]
    window.threads_control.rename_thread(thread, " \t ")  # the same refusal, not a job
    assert window.status_area.current_message() == "Not renamed: a chat's title cannot be empty"
    settle(qtbot, window)
    assert listed(window) == ["new title"]
    with Store(app_paths(data_dir).db_path) as store:
        assert store.thread(thread)["title"] == "new title"
    assert problems(caplog, capfd) == []


def refused_in_a_new_chat(make_window, qtbot):
    """A window whose new chat's first message was refused, too large for the window."""
    window = make_window(ScriptedRuntime(["An answer."], n_ctx=512))
    huge = "word " * 5_000
    window.turns.send(huge)
    qtbot.waitUntil(lambda: not window.generating, timeout=20_000)
    settle(qtbot, window)
    qtbot.wait(2_500)  # a poll of the list (POLL_MS)
    settle(qtbot, window)
    assert listed(window) == []  # before: ["New chat"], empty, for good
    notices = [e.text for e in window.view.transcript.entries() if e.kind == "notice"]
    assert len(notices) == 1 and notices[0].startswith("Not sent: ")  # why, in one sentence
    assert window.composer.text() == huge  # what was typed is kept
    return window, huge


def test_a_new_chat_whose_first_message_is_refused_is_not_listed_and_goes_once_left(
        make_window, qtbot, data_dir, caplog, capfd):
    caplog.set_level(logging.INFO)
    capfd.readouterr()
    window, huge = refused_in_a_new_chat(make_window, qtbot)
    made = window.app_state.thread_id  # the window stays on it, as on a chat not begun
    window.threads_control.new_chat()  # left, still empty: deleted, the text the new chat's
    qtbot.waitUntil(lambda: window.composer.text() == huge, timeout=10_000)
    settle(qtbot, window)
    qtbot.wait(2_500)
    settle(qtbot, window)
    assert listed(window) == [] and window.app_state.thread_id is None
    with Store(app_paths(data_dir).db_path) as store:
        assert store.threads() == [] and store.draft_with_files(None)[0] == huge
        with pytest.raises(KeyError):
            store.thread(made)

    window.composer.set_text("")
    window.turns.send("A short question?")  # the new chat works as before
    qtbot.waitUntil(lambda: not window.generating, timeout=20_000)
    settle(qtbot, window)
    qtbot.waitUntil(lambda: listed(window) == ["A short question?"], timeout=5_000)
    with Store(app_paths(data_dir).db_path) as store:
        [chat] = store.threads()
        assert store.message_count(chat["id"]) == 2
    assert problems(caplog, capfd) == []


def test_a_message_sent_again_in_the_refused_new_chat_makes_it_a_chat(make_window, qtbot,
                                                                      data_dir):
    window, _ = refused_in_a_new_chat(make_window, qtbot)
    made = window.app_state.thread_id
    window.composer.set_text("")
    window.turns.send("A short question?")
    qtbot.waitUntil(lambda: not window.generating, timeout=20_000)
    settle(qtbot, window)
    qtbot.waitUntil(lambda: listed(window) == ["A short question?"], timeout=5_000)
    window.threads_control.new_chat()  # left, with its messages: it stays
    settle(qtbot, window)
    qtbot.wait(2_500)
    settle(qtbot, window)
    assert listed(window) == ["A short question?"]
    with Store(app_paths(data_dir).db_path) as store:
        assert [t["id"] for t in store.threads()] == [made]


def test_a_window_closed_on_the_refused_new_chat_leaves_no_empty_chat_for_the_next_start(
        make_window, qtbot, data_dir, caplog, capfd):
    caplog.set_level(logging.INFO)
    capfd.readouterr()
    window, huge = refused_in_a_new_chat(make_window, qtbot)
    made = window.app_state.thread_id
    window.close()  # on the chat made for nothing: before, it was listed at the next start
    assert window.model.thread.isFinished()
    with Store(app_paths(data_dir).db_path) as store:
        assert store.threads() == [] and store.draft_with_files(None)[0] == huge
        with pytest.raises(KeyError):
            store.thread(made)

    again = make_window(ScriptedRuntime(["An answer."]))  # the next start
    settle(qtbot, again)
    qtbot.wait(2_500)
    settle(qtbot, again)
    assert listed(again) == [] and again.composer.text() == huge  # the new chat's draft
    assert problems(caplog, capfd) == []
