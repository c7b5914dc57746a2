"""Regenerate, switch branch, edit, continue and attach, clicked through the real window
(pytest-qt, offscreen) on the scripted runtime: the context menu's actions, the ‹ › switcher,
the Edit dialog's Save, and files dropped on the composer."""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QMimeData, QPoint, Qt, QUrl  # noqa: E402
from PySide6.QtGui import QDropEvent  # noqa: E402
from PySide6.QtWidgets import QDialogButtonBox, QToolButton  # noqa: E402

from iris_desktop.core.store import Store  # noqa: E402
from iris_desktop.ui.transcript_model import ENTRY_ROLE  # noqa: E402

from support.fakes import ScriptedRuntime  # noqa: E402


@pytest.fixture
def window(make_window):
    runtime = ScriptedRuntime(["First answer.", "Second answer.", "Edited answer.",
                               "one two three four five six seven eight", "nine ten"], delay_s=0.02)
    w = make_window(runtime)
    w.runtime = runtime
    return w


def settle(qtbot, w) -> None:
    qtbot.waitUntil(lambda: not w.generating and w.background.idle, timeout=20_000)
    qtbot.wait(50)
    qtbot.waitUntil(lambda: w.background.idle, timeout=20_000)


def rows(w) -> list:
    model = w.view.transcript
    return [model.index(r).data(ENTRY_ROLE) for r in range(model.rowCount())]


def texts(w) -> list[str]:
    return [e.text for e in rows(w) if e.kind == "message"]


def row_of(w, text: str):
    model = w.view.transcript
    return next(model.index(r) for r in range(model.rowCount())
                if model.index(r).data(ENTRY_ROLE).text == text)


def trigger(w, index, name: str) -> None:
    menu = w.view.context_menu(index)
    action = next(a for a in menu.actions() if a.text() == name)
    action.trigger()


def chats(w, *titles: str) -> list[int]:
    """A chat of one message for each title, made in the window's history."""
    with Store(w.host.paths.db_path) as store:
        made = [store.create_thread(title) for title in titles]
        for thread in made:
            store.add_message(thread, {"role": "user", "content": "hello"})
    return made


def stored_texts(w) -> list[str]:
    with Store(w.host.paths.db_path) as store:
        return [r["content"] for r in store.messages(w.thread_id)]


def test_regenerate_then_switch_back_with_the_switcher(window, qtbot):
    w = window
    w.send("Hello")
    settle(qtbot, w)
    assert texts(w) == ["Hello", "First answer."]
    trigger(w, row_of(w, "First answer."), "Regenerate")
    settle(qtbot, w)
    assert texts(w) == ["Hello", "Second answer."]
    reply = row_of(w, "Second answer.")
    assert reply.data(ENTRY_ROLE).branch == (2, 2)
    prev, _, _ = w.view.delegate.geometry(reply)["switch"]
    qtbot.mouseClick(w.view.viewport(), Qt.MouseButton.LeftButton, pos=prev.center())
    settle(qtbot, w)
    assert texts(w) == ["Hello", "First answer."]
    assert row_of(w, "First answer.").data(ENTRY_ROLE).branch == (1, 2)
    assert stored_texts(w) == ["Hello", "First answer."]


def test_the_meter_follows_the_branch_switched_to(make_window, qtbot):
    """Before (an audit): after ‹ ›, the transcript showed the other branch but the
    meter, the states and the inspector kept describing the branch left, until a draft
    was typed."""
    w = make_window(ScriptedRuntime(["Short.", "A much longer second answer, with many more "
                                     "words in it than the first one had at all."]))
    w.send("Hello")
    settle(qtbot, w)
    trigger(w, row_of(w, "Short."), "Regenerate")
    settle(qtbot, w)
    reply = next(r for r in range(w.view.transcript.rowCount())
                 if w.view.transcript.index(r).data(ENTRY_ROLE).text.startswith("A much longer"))
    long_used = w.meter.breakdown["used"]
    prev, _, _ = w.view.delegate.geometry(w.view.transcript.index(reply))["switch"]
    qtbot.mouseClick(w.view.viewport(), Qt.MouseButton.LeftButton, pos=prev.center())
    settle(qtbot, w)
    assert texts(w) == ["Hello", "Short."]
    with Store(w.host.paths.db_path) as store:
        planned = w.context.planner.plan_or_error(store, w.thread_id).breakdown.as_dict()
    assert planned["used"] < long_used
    qtbot.waitUntil(lambda: w.meter.breakdown == planned, timeout=5_000)


def test_a_keyboard_alone_regenerates_switches_and_reads_alternatives(window, qtbot):
    """Before (an accessibility audit): ‹ 1/2 › was mouse-only, the actions of a message
    were in its right-click menu only, a screen reader heard no word of alternatives and
    at most 500 characters of a reply. Now Shift+F10 (or the Menu key) opens the menu of
    the message under the cursor, Alt+Left/Right switch, and the row reads all of it."""
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication, QMenu

    w = window
    w.runtime.replies[0] = "First answer. " + "word " * 300  # 1,514 characters
    w.send("Hello")
    settle(qtbot, w)
    view = w.view
    view.setFocus(Qt.FocusReason.TabFocusReason)
    qtbot.waitUntil(lambda: view.currentIndex().isValid(), timeout=5_000)
    reply = view.currentIndex()  # Tab landed on the newest message
    assert reply.data(ENTRY_ROLE).text.startswith("First answer.")
    spoken = reply.data(Qt.ItemDataRole.AccessibleTextRole)
    assert spoken == f"Iris: {reply.data(ENTRY_ROLE).text}" and len(spoken) > 1_500  # whole
    chosen = []

    def choose(name):
        menu = next(m for m in QApplication.topLevelWidgets()
                    if isinstance(m, QMenu) and m.isVisible())
        chosen.append([a.text() for a in menu.actions()])
        next(a for a in menu.actions() if a.text() == name).trigger()
        menu.close()

    QTimer.singleShot(200, lambda: choose("Regenerate"))
    qtbot.keyClick(view, Qt.Key.Key_F10, Qt.KeyboardModifier.ShiftModifier)
    settle(qtbot, w)
    assert "Regenerate" in chosen[0]
    assert texts(w) == ["Hello", "Second answer."]
    view.setCurrentIndex(row_of(w, "Second answer."))
    assert row_of(w, "Second answer.").data(Qt.ItemDataRole.AccessibleTextRole) == (
        "Iris: Second answer. (alternative 2 of 2; Alt+Left, Alt+Right)")
    qtbot.keyClick(view, Qt.Key.Key_Left, Qt.KeyboardModifier.AltModifier)
    settle(qtbot, w)
    assert texts(w)[-1].startswith("First answer.")
    assert stored_texts(w)[-1].startswith("First answer.")


def test_edit_a_message_through_its_dialog_starts_a_branch(window, qtbot):
    w = window
    w.runtime.replies[:2] = []  # the edit's reply comes third in the script
    w.runtime.replies.insert(0, "First answer.")
    w.send("Hello")
    settle(qtbot, w)
    trigger(w, row_of(w, "Hello"), "Edit…")
    dialog = w.view.edit_dialog
    qtbot.waitUntil(dialog.isVisible, timeout=5_000)
    dialog.editor.setPlainText("Hello, edited")
    assert dialog.editor.accessibleName() == "The message's new text"
    dialog.activateWindow()
    dialog.editor.setFocus()
    qtbot.keyClick(dialog.editor, Qt.Key.Key_Tab)  # on to the buttons, not a tab character
    assert dialog.editor.toPlainText() == "Hello, edited" and not dialog.editor.hasFocus()
    dialog.editor.setFocus()
    qtbot.keyClick(dialog.editor, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)  # Save
    settle(qtbot, w)
    assert texts(w) == ["Hello, edited", "Edited answer."]
    assert row_of(w, "Hello, edited").data(ENTRY_ROLE).branch == (2, 2)


def test_stop_then_continue_from_the_context_menu(window, qtbot):
    w = window
    w.runtime.replies[:3] = []
    w.send("Count")
    qtbot.waitUntil(lambda: any("three" in e.text for e in rows(w)), timeout=10_000)
    w.turns.stop()
    settle(qtbot, w)
    stopped = next(e for e in rows(w) if e.role == "assistant")
    assert stopped.status == "interrupted" and stopped.can_continue
    trigger(w, row_of(w, stopped.text), "Continue")
    settle(qtbot, w)
    reply = next(e for e in rows(w) if e.role == "assistant")
    assert reply.text.startswith(stopped.text) and reply.text.endswith("nine ten")
    assert reply.status == "complete" and not reply.can_continue


def test_files_dropped_on_the_composer_become_chips_and_go_with_the_message(window, qtbot, tmp_path):
    w = window
    (tmp_path / "list.md").write_text("- 3 lemons\n")
    (tmp_path / "photo.bin").write_bytes(b"\0\1\2")
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(tmp_path / "list.md")),
                  QUrl.fromLocalFile(str(tmp_path / "photo.bin"))])
    drop = QDropEvent(QPoint(5, 5), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                      Qt.KeyboardModifier.NoModifier)
    w.composer.edit.dropEvent(drop)
    assert [a.name for a in w.composer.attachments] == ["list.md"]
    refused = w.context.attach_box
    qtbot.waitUntil(refused.isVisible, timeout=5_000)
    assert "photo.bin is not a text file" in refused.text()
    refused.done(0)
    def chip() -> str:  # chips are drawn anew when their tokens arrive
        found = [c for c in w.composer.findChildren(QToolButton, "attachment-chip") if c.isVisible()]
        return found[0].text() if len(found) == 1 else ""

    qtbot.waitUntil(lambda: "tokens" in chip(), timeout=5_000)  # counted by the engine
    assert chip().startswith("list.md · ")
    w.composer.set_text("How many lemons?")
    w.turns.send(w.composer.text())
    settle(qtbot, w)
    user = next(e for e in rows(w) if e.role == "user")
    assert user.text == "How many lemons?" and user.attachments[0][0] == "list.md"
    assert "- 3 lemons" in w.runtime.requests[-1][-1]["content"]
    assert w.composer.attachments == []


def test_attach_button_opens_the_file_dialog_and_a_chip_is_removed_with_its_cross(
        window, qtbot, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QFileDialog

    w = window
    (tmp_path / "notes.txt").write_text("Priya owns the release notes.\n")
    asked = []

    def answer(*args, **kwargs):
        asked.append(args[1])  # the dialog's title
        return [str(tmp_path / "notes.txt")], "Text files"

    monkeypatch.setattr(QFileDialog, "getOpenFileNames", staticmethod(answer))
    qtbot.mouseClick(w.composer.attach_button, Qt.MouseButton.LeftButton)
    assert asked == ["Attach files"]
    assert [a.name for a in w.composer.attachments] == ["notes.txt"]

    def chips() -> list:
        return [c for c in w.composer.findChildren(QToolButton, "attachment-chip") if c.isVisible()]

    qtbot.waitUntil(lambda: len(chips()) == 1 and "tokens" in chips()[0].text(), timeout=5_000)
    qtbot.mouseClick(chips()[0], Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not chips(), timeout=5_000)
    assert w.composer.attachments == []


def test_a_chats_own_system_prompt_through_its_settings_dialog(window, qtbot):
    from PySide6.QtGui import QAction

    w = window
    w.send("Hello")
    settle(qtbot, w)
    w.findChild(QAction, "chat-settings").trigger()  # File ▸ Chat settings…
    qtbot.waitUntil(lambda: w.threads_control.chat_settings is not None
                    and w.threads_control.chat_settings.isVisible(), timeout=5_000)
    dialog = w.threads_control.chat_settings
    assert dialog.prompt.toPlainText() == "" and "Iris" in dialog.prompt.placeholderText()
    dialog.title.setText("Pirate chat")
    dialog.prompt.setPlainText("Answer like a pirate.")
    qtbot.mouseClick(dialog.buttons.button(QDialogButtonBox.StandardButton.Save),
                     Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.threads.list.count() == 1
                    and w.threads.list.item(0).text() == "Pirate chat", timeout=5_000)
    with Store(w.host.paths.db_path) as store:
        assert store.system_prompt_of(w.thread_id) == "Answer like a pirate."
    w.runtime.replies.insert(0, "Arr.")
    w.send("Hi again")
    settle(qtbot, w)
    assert w.runtime.requests[-1][0]["content"].startswith("Answer like a pirate.")
    # a title given elsewhere while the dialog is open stays when only the prompt changes
    w.findChild(QAction, "chat-settings").trigger()
    qtbot.waitUntil(lambda: w.threads_control.chat_settings is not dialog
                    and w.threads_control.chat_settings.isVisible(), timeout=5_000)
    again = w.threads_control.chat_settings
    with Store(w.host.paths.db_path) as store:  # another window, or a command
        store.rename_thread(w.thread_id, "Named elsewhere")
    again.prompt.setPlainText("Answer like a parrot.")
    qtbot.mouseClick(again.buttons.button(QDialogButtonBox.StandardButton.Save),
                     Qt.MouseButton.LeftButton)
    settle(qtbot, w)
    with Store(w.host.paths.db_path) as store:
        assert store.system_prompt_of(w.thread_id) == "Answer like a parrot."
        assert store.thread(w.thread_id)["title"] == "Named elsewhere"


def test_cancel_on_changed_chat_settings_asks_and_keep_editing_keeps_them(window, qtbot):
    from PySide6.QtGui import QAction

    w = window
    w.send("Hello")
    settle(qtbot, w)
    w.findChild(QAction, "chat-settings").trigger()
    qtbot.waitUntil(lambda: w.threads_control.chat_settings is not None
                    and w.threads_control.chat_settings.isVisible(), timeout=5_000)
    dialog = w.threads_control.chat_settings
    dialog.prompt.setPlainText("A long prompt I spent a while on.")
    qtbot.mouseClick(dialog.buttons.button(QDialogButtonBox.StandardButton.Cancel),
                     Qt.MouseButton.LeftButton)
    box = dialog.discard_box
    assert box is not None and box.isVisible() and dialog.isVisible()
    qtbot.mouseClick(next(b for b in box.buttons() if b.text() == "Keep editing"),
                     Qt.MouseButton.LeftButton)
    assert dialog.isVisible() and dialog.prompt.toPlainText() == "A long prompt I spent a while on."
    qtbot.mouseClick(dialog.buttons.button(QDialogButtonBox.StandardButton.Save),
                     Qt.MouseButton.LeftButton)
    settle(qtbot, w)
    with Store(w.host.paths.db_path) as store:
        assert store.system_prompt_of(w.thread_id) == "A long prompt I spent a while on."


def test_a_file_attached_in_one_chat_stays_with_that_chat(window, qtbot, tmp_path):
    """Before (an audit): the composer's box emptied when another chat was opened, but the
    file attached in the first chat stayed as a chip and went, with its contents, into
    the other chat's message (File ▸ New chat kept it too)."""
    from iris_desktop.core.attachments import read_attachment

    w = window
    lawyer, groceries = chats(w, "lawyer", "groceries")
    (tmp_path / "notes.txt").write_text("SECRET settlement notes\n")
    w.open_thread(lawyer)
    settle(qtbot, w)
    w.composer.add_attachments([read_attachment(tmp_path / "notes.txt")])
    w.composer.set_text("read this")
    w.open_thread(groceries)
    settle(qtbot, w)
    assert w.composer.attachments == [] and w.composer.text() == ""
    w.threads_control.new_chat()
    assert w.composer.attachments == []
    w.open_thread(groceries)
    settle(qtbot, w)
    w.composer.set_text("milk?")
    w.turns.send(w.composer.text())
    settle(qtbot, w)
    assert "SECRET" not in w.runtime.requests[-1][-1]["content"]
    assert all("SECRET" not in text for text in stored_texts(w))
    w.open_thread(lawyer)  # the first chat's file is still its own, ready to send
    settle(qtbot, w)
    assert [a.name for a in w.composer.attachments] == ["notes.txt"]
    assert w.composer.text() == "read this"


def test_text_typed_just_before_quitting_is_kept(window, qtbot):
    """Before (an audit): a draft was written only after a 400 ms pause in typing, and
    quitting within it lost what was typed; closing the window now writes it first."""
    w = window
    chat, = chats(w, "notes")
    w.open_thread(chat)
    settle(qtbot, w)
    w.composer.edit.setFocus()
    qtbot.keyClicks(w.composer.edit, "important unsent thought")
    w.close()  # at once: no pause in typing before it
    with Store(w.host.paths.db_path) as store:
        assert store.draft(chat) == "important unsent thought"


def test_a_draft_the_history_cannot_take_is_kept_and_said(window, qtbot, monkeypatch):
    """Before (an audit): with the disk full, a draft's save failed into the log only, and
    switching chats (or quitting) threw the typed text away. Now it is kept while Iris
    runs, comes back with its chat, and the status bar says it is not saved."""
    import sqlite3

    w = window
    first, second = chats(w, "one", "two")
    w.open_thread(first)
    settle(qtbot, w)

    def full(self, *args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(Store, "save_draft", full)
    w.composer.edit.setFocus()
    qtbot.keyClicks(w.composer.edit, "a thought I must not lose")
    qtbot.waitUntil(lambda: "draft is not saved" in w.status_area.current_message(), timeout=5_000)
    assert "full" in w.status_area.current_message()
    w.open_thread(second)
    settle(qtbot, w)
    w.open_thread(first)
    settle(qtbot, w)
    assert w.composer.text() == "a thought I must not lose"


def test_files_attached_to_a_draft_come_back_after_a_restart_and_leave_with_the_send(
        make_window, qtbot, tmp_path):
    """Before: a draft's files were kept only while the window was open; a restart (or a
    crash) brought the typed text back without them. Now they are written with the draft,
    when they change, and a send takes them out of it."""
    from iris_desktop.core.attachments import read_attachment

    (tmp_path / "notes.txt").write_text("SETTLEMENT notes: 40% by March\n")
    (tmp_path / "list.md").write_text("- lemons\n")
    first = make_window(ScriptedRuntime([]))
    lawyer, groceries = chats(first, "lawyer", "groceries")
    first.open_thread(lawyer)
    settle(qtbot, first)
    first.composer.add_attachments([read_attachment(tmp_path / "notes.txt")])
    first.composer.set_text("read this")
    first.open_thread(groceries)  # a file alone, no text, is a draft too
    settle(qtbot, first)
    first.composer.add_attachments([read_attachment(tmp_path / "list.md")])
    first.close()  # at once: the draft's pause has not passed
    with Store(first.host.paths.db_path) as store:
        assert store.draft_with_files(lawyer) == (
            "read this", [("notes.txt", "SETTLEMENT notes: 40% by March\n")])
        assert store.draft_with_files(groceries) == ("", [("list.md", "- lemons\n")])

    runtime = ScriptedRuntime(["Noted."])
    w = make_window(runtime)
    w.open_thread(lawyer)
    qtbot.waitUntil(lambda: [a.name for a in w.composer.attachments] == ["notes.txt"],
                    timeout=5_000)
    assert w.composer.text() == "read this"
    w.turns.send(w.composer.text())
    settle(qtbot, w)
    assert "SETTLEMENT" in runtime.requests[-1][-1]["content"]
    w.open_thread(groceries)
    qtbot.waitUntil(lambda: [a.name for a in w.composer.attachments] == ["list.md"],
                    timeout=5_000)
    qtbot.mouseClick(w.composer.findChildren(QToolButton, "attachment-chip")[0],
                     Qt.MouseButton.LeftButton)  # its cross removes it
    assert w.composer.attachments == []
    w.close()
    with Store(w.host.paths.db_path) as store:
        assert store.draft_with_files(lawyer) == ("", [])  # sent: gone from the draft
        assert store.draft_with_files(groceries) == ("", [])


def test_stepping_through_alternatives_keeps_the_message_current_and_in_view(make_window, qtbot):
    """Before (an audit): after a switch the transcript reloaded at its end, the row left
    was gone: a second Alt+Left did nothing (the cursor jumped to the first loaded row),
    and ‹ on a reply 200 messages up showed the new branch's end, so each step meant
    scrolling back. The alternative switched to stays current and in view."""
    w = make_window(ScriptedRuntime([]))
    with Store(w.host.paths.db_path) as store:
        thread = store.create_thread("three answers")
        ids = store.add_messages(thread, [{"role": "user", "content": "which city?"},
                                          {"role": "assistant", "content": "answer v1"}])
        for v in (2, 3):  # each alternative goes on for 200 messages
            store.add_message(thread, {"role": "assistant", "content": f"answer v{v}"},
                              parent_id=ids[0])
            store.add_messages(thread, [m for i in range(100) for m in (
                {"role": "user", "content": f"v{v} q{i}"},
                {"role": "assistant", "content": f"v{v} a{i}"})])
    w.open_thread(thread)
    settle(qtbot, w)
    view = w.view
    view.scroll_to_key(next(e.key for e in view.transcript.entries() if e.text == "answer v3"))
    view.setFocus()
    for shown in ("answer v2", "answer v1"):
        qtbot.keyClick(view, Qt.Key.Key_Left, Qt.KeyboardModifier.AltModifier)
        qtbot.waitUntil(lambda shown=shown: view.current_entry() is not None
                        and view.current_entry().text == shown, timeout=5_000)
        settle(qtbot, w)
        assert view.current_entry().text == shown
        assert view.viewport().rect().intersects(view.visualRect(view.currentIndex()))
    with Store(w.host.paths.db_path) as store:
        assert [m["content"] for m in store.messages(thread)] == ["which city?", "answer v1"]


def test_a_file_removed_while_the_save_that_wrote_it_runs_does_not_come_back(
        make_window, qtbot, monkeypatch):
    """A review found: a save that writes a draft's files, slow (another process holds
    the write lock), then the file removed: the newer save took the files as stored
    (its answer had been dropped for the newer job) and kept them: the chip was gone,
    the stored draft held the file, back after a restart."""
    import time

    from iris_desktop.core.attachments import Attachment

    w = make_window(ScriptedRuntime([]))
    with Store(w.host.paths.db_path) as store:
        chat = store.create_thread("trip")
    w.open_thread(chat)
    settle(qtbot, w)
    real = Store.save_draft

    def slow(self, thread_id, text, files=None):
        if files:
            time.sleep(1.5)
        return real(self, thread_id, text, files)

    monkeypatch.setattr(Store, "save_draft", slow)
    w.composer.add_attachments([Attachment("plan.md", "Day 1: Porto")])
    qtbot.wait(700)  # the save writing the file runs on the DB thread
    w.composer.remove_attachment(0)
    qtbot.wait(600)  # the next save is asked for meanwhile
    settle(qtbot, w)
    assert w.composer.attachments == []
    with Store(w.host.paths.db_path) as store:
        assert store.draft_with_files(chat) == ("", [])
