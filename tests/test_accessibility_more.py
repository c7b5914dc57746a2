"""Accessibility, a second audit of the window (its scripts read it as a keyboard and a
screen-reader user would): the current message after Regenerate and Edit…, errors said
once rather than per keystroke or per pause, Enter with no model, the settings file fixed,
and what only the mouse or the eye reached. Real windows offscreen, real SQLite files."""

from __future__ import annotations

import sqlite3

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QPlainTextEdit  # noqa: E402

from iris_desktop.core.store import Store  # noqa: E402
from iris_desktop.core.views import Entry  # noqa: E402
from iris_desktop.paths import app_paths  # noqa: E402
from iris_desktop.settings import write_config_value  # noqa: E402
from iris_desktop.ui.transcript_model import ENTRY_ROLE  # noqa: E402

from support.fakes import ScriptedRuntime  # noqa: E402
from support.windows import settle  # noqa: E402

pytestmark = pytest.mark.usefixtures("system_look_after")


def wait_turn(qtbot, w) -> None:
    qtbot.waitUntil(lambda: not w.generating and w.background.idle, timeout=20_000)
    settle(qtbot, w)


def said(window) -> list[str]:
    """What the window says in its status bar (and to a screen reader) from now on."""
    messages: list[str] = []
    window.app_state.statusMessage.connect(lambda text, _ms: messages.append(text))
    return messages


def test_regenerate_and_edit_by_keyboard_leave_the_new_reply_current(make_window, qtbot):
    """Before: after Shift+F10 ▸ Regenerate (or Edit… then Ctrl+Enter) the focused
    conversation had no current row (-1): Alt+Left, which the new reply's row says to
    press, did nothing and Up went to the first message. Now the new reply is current."""
    w = make_window(ScriptedRuntime(["First answer.", "Second answer.", "Edited answer."]))
    w.send("Question?")
    wait_turn(qtbot, w)
    view, model = w.view, w.view.transcript
    w.activateWindow()
    view.setFocus(Qt.FocusReason.TabFocusReason)
    qtbot.waitUntil(lambda: view.currentIndex().isValid(), timeout=5_000)
    assert view.current_entry().text == "First answer."
    menu = view.context_menu(view.currentIndex())
    next(a for a in menu.actions() if a.text() == "Regenerate").trigger()  # as Shift+F10 does
    wait_turn(qtbot, w)
    current = view.currentIndex()
    assert current.isValid() and current.data(ENTRY_ROLE).text == "Second answer."
    assert "Alt+Left" in current.data(Qt.ItemDataRole.AccessibleTextRole)
    qtbot.keyClick(view, Qt.Key.Key_Left, Qt.KeyboardModifier.AltModifier)  # what it says works
    wait_turn(qtbot, w)
    assert [model.entry(r).text for r in range(model.rowCount())] == ["Question?", "First answer."]
    # Edit… on the question, then Ctrl+Enter in its dialog
    view.setCurrentIndex(model.index(0))
    dialog = view.edit_message(model.entry(0))
    box = dialog.findChildren(QPlainTextEdit)[0]
    box.setPlainText("Changed question?")
    qtbot.keyClick(box, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    wait_turn(qtbot, w)
    current = view.currentIndex()
    assert current.isValid() and current.data(ENTRY_ROLE).text == "Edited answer."
    assert current.row() == model.rowCount() - 1


def test_the_current_message_is_not_carried_into_another_chat(make_window, qtbot):
    """The current message kept across a reload is this chat's: opening another chat
    makes none of its rows current (as before)."""
    w = make_window(ScriptedRuntime(["One.", "Two."]))
    w.send("First chat")
    wait_turn(qtbot, w)
    first = w.thread_id
    w.view.setCurrentIndex(w.view.transcript.index(0))
    w.threads_control.new_chat()
    w.send("Second chat")
    wait_turn(qtbot, w)
    w.threads_control.open_thread(first)
    wait_turn(qtbot, w)
    assert [e.text for e in w.view.transcript.entries()] == ["First chat", "One."]
    assert not w.view.currentIndex().isValid()


def test_typing_a_number_in_preferences_says_its_error_once_with_the_label(
        make_window, qtbot, monkeypatch):
    """Before: each keystroke of "100" in the context window said a new error, assertively
    (three interruptions, then two more while typing 8192), naming only the key. Now it is
    said when the field becomes invalid, and once more, politely, when typing pauses on
    another error; with the field's label."""
    import iris_desktop.ui.setting_field as setting_field

    heard: list[tuple[str, bool]] = []
    monkeypatch.setattr(setting_field, "announce",
                        lambda _w, text, assertive=False: heard.append((text, assertive)))
    monkeypatch.setattr(setting_field, "SAY_AGAIN_MS", 300, raising=False)
    w = make_window()
    dialog = w.preferences()
    qtbot.waitUntil(dialog.isVisible, timeout=5_000)
    dialog.tabs.setCurrentIndex(dialog.sections.index("context"))
    field = dialog.fields["context.window"]
    spin = field.editor.spin
    dialog.activateWindow()
    spin.setFocus()
    spin.selectAll()
    for key in "100":
        qtbot.keyClick(spin, key)
        qtbot.wait(60)
    qtbot.waitUntil(lambda: "'100'" in field.error.text(), timeout=5_000)
    assert len(heard) == 1 and heard[0][1], heard  # the field became invalid: said at once
    assert heard[0][0].startswith("Context window: Invalid value '1'"), heard
    qtbot.waitUntil(lambda: len(heard) == 2, timeout=5_000)  # typing paused: the error now
    assert heard[1] == (heard[0][0].replace("'1'", "'100'"), False)
    qtbot.wait(400)
    spin.selectAll()
    for key in "8192":
        qtbot.keyClick(spin, key)
        qtbot.wait(20)
    qtbot.waitUntil(lambda: not field.error.text(), timeout=5_000)
    qtbot.wait(400)
    assert len(heard) == 2, heard  # "8", "81", "819" were not said one by one
    dialog.reject()


def test_a_ratios_figure_in_tokens_is_in_its_controls_description(make_window, qtbot, data_dir):
    """Before: "= 5,734 of 8,192 tokens" beside the slider was in no control's description
    (a screen reader never reached it), and the invalid case read "equals dash tokens".
    Now the spin box and the slider describe it, in words."""
    write_config_value(app_paths(data_dir).ensure().config_path, "context.window", 8192)
    w = make_window()
    dialog = w.preferences()
    qtbot.waitUntil(dialog.isVisible, timeout=5_000)
    editor = dialog.fields["context.token_budget_ratio"].editor
    qtbot.waitUntil(lambda: editor.meaning.text() == "= 5,734 of 8,192 tokens", timeout=5_000)
    for control in (editor.spin, editor.slider):
        assert control.accessibleDescription().endswith("In tokens: 5,734 of 8,192 tokens.")
    dialog.fields["context.window"].editor.spin.setValue(100)
    qtbot.waitUntil(lambda: "unknown" in editor.meaning.text(), timeout=5_000)
    assert editor.meaning.text() == "In tokens: unknown until the marked values are fixed"
    assert editor.spin.accessibleDescription().endswith(
        "In tokens: unknown until the marked values are fixed.")
    dialog.reject()


def test_a_reply_stopped_before_its_first_word_says_the_keyboard_way():
    """Before: "right-click here and choose Regenerate", a mouse's way only."""
    from iris_desktop.ui.transcript_parts import stopped_empty

    entry = Entry("message", "m:2", 2, role="assistant", text="", status="interrupted",
                  can_regenerate=True)
    assert "Shift+F10" in stopped_empty(entry)


def test_a_failing_draft_save_is_said_once_until_one_succeeds(make_window, qtbot, monkeypatch):
    """Before: with the disk full, the same sentence was shown and said after every pause
    in typing (five times for seven words). Now once, and once more when a save succeeds."""
    from iris_desktop.ui.drafts import SAVE_PAUSE_MS

    w = make_window()
    messages = said(w)
    real = Store.save_draft

    def full(self, *args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(Store, "save_draft", full)
    w.activateWindow()
    w.composer.edit.setFocus()
    for word in ("I ", "am ", "typing ", "slowly"):
        qtbot.keyClicks(w.composer.edit, word)
        qtbot.wait(SAVE_PAUSE_MS + 150)
        settle(qtbot, w)
    failed = [m for m in messages if m.startswith("Your draft is not saved")]
    assert len(failed) == 1, messages
    monkeypatch.setattr(Store, "save_draft", real)
    qtbot.keyClicks(w.composer.edit, " again")
    qtbot.waitUntil(lambda: "Your draft is saved again" in messages, timeout=5_000)
    assert len([m for m in messages if m.startswith("Your draft is not saved")]) == 1


def test_enter_with_no_model_says_why(make_window, qtbot, data_dir, tmp_path):
    """Before: Enter in the message box did nothing, unsaid, with no model loaded (or while
    it loaded). Now the reason shows in the status bar and is said."""
    config = app_paths(data_dir).ensure().config_path
    write_config_value(config, "model.path", str(tmp_path / "gone.gguf"))
    w = make_window(None)
    assert w.model_state == "failed"
    w.models.box.done(0)
    messages = said(w)
    w.activateWindow()
    w.composer.edit.setFocus()
    qtbot.keyClicks(w.composer.edit, "Hello there")
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
    assert messages == ["No model is loaded — Model ▸ Models…"]
    assert ("No model is loaded — Model ▸ Models…", False) in w.announcer.announced
    assert w.composer.text() == "Hello there"  # kept for when a model is loaded
    w.composer.set_can_send(False, "Loading the model…")
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
    assert messages[-1] == "Loading the model…"


def test_the_settings_file_fixed_is_said_and_one_save_is_one_message(make_window, qtbot,
                                                                     data_dir):
    """Before: a save with a key in force and an unknown key said two messages (the
    second cut off the first); once the file was fixed its old error stayed on screen and
    nothing said so. Now one message says both, and a fixed file is said fine again."""
    config = app_paths(data_dir).ensure().config_path
    w = make_window()
    state = w.app_state
    messages = said(w)
    config.write_text('[ui]\ntheme = "dark"\n[context]\nbudget_ratio = 0.5\n')
    qtbot.waitUntil(lambda: state.settings["ui.theme"] == "dark", timeout=10_000)
    qtbot.waitUntil(lambda: bool(messages), timeout=5_000)
    qtbot.wait(200)
    assert len(messages) == 1, messages
    assert "in force: ui.theme" in messages[0] and "context.budget_ratio is not known" in messages[0]
    config.write_text('[ui]\ntheme = "dark"\n')  # the unknown key removed
    qtbot.waitUntil(lambda: len(messages) >= 2, timeout=10_000)
    assert messages[1] == "The settings file is fine again"
    config.write_text('[ui\ntheme = "dark"\n')  # broken mid-write
    qtbot.waitUntil(lambda: len(messages) >= 3, timeout=10_000)
    assert "not valid TOML" in messages[2]
    config.write_text('[ui]\ntheme = "dark"\n')
    qtbot.waitUntil(lambda: len(messages) >= 4, timeout=10_000)
    assert messages[3] == "The settings file is fine again"
    config.write_text('[ui\ntheme = "dark"\n')
    qtbot.waitUntil(lambda: len(messages) >= 5, timeout=10_000)
    config.write_text('[ui]\ntheme = "light"\n')  # fixed, and a key in force: one message
    qtbot.waitUntil(lambda: state.settings["ui.theme"] == "light", timeout=10_000)
    qtbot.waitUntil(lambda: len(messages) >= 6, timeout=5_000)
    qtbot.wait(200)
    assert messages[5:] == ["The settings file changed; in force: ui.theme. It is fine again"]
