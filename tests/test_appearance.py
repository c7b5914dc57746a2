"""The chat basics every peer has: theme and text size (live), the window's icon and
geometry, the last chat reopened, the welcome panel, labelled Preferences, the keyboard
shortcuts, asking before quitting mid-reply, a thread list that follows other processes,
the model's display name, and a quiet log when a prefill is cancelled on purpose."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QItemSelectionModel, QRect, Qt  # noqa: E402
from PySide6.QtGui import QPalette  # noqa: E402
from PySide6.QtWidgets import QMessageBox, QPushButton  # noqa: E402

from iris_desktop.core.store import Store  # noqa: E402
from iris_desktop.generation import GenerationRequest
from iris_desktop.settings import SETTINGS  # noqa: E402
from iris_desktop.ui.main_window import default_geometry, fit_geometry  # noqa: E402
from iris_desktop.ui.theme import apply_appearance, painted_scheme  # noqa: E402
from iris_desktop.ui.threads import THREAD_ROLE  # noqa: E402
from iris_desktop.ui.welcome import EXAMPLES  # noqa: E402

from support.fakes import ScriptedRuntime  # noqa: E402

pytestmark = pytest.mark.usefixtures("system_look_after")


def seed_thread(path, title: str) -> int:
    """A thread of two messages, written by a connection of its own (as the CLI would)."""
    with Store(path) as store:
        thread = store.create_thread(title)
        store.add_messages(thread, [{"role": "user", "content": "hello"},
                                    {"role": "assistant", "content": "hi"}])
    return thread


def db_path(data_dir):
    from iris_desktop.paths import app_paths

    return app_paths(data_dir).ensure().db_path


def apply_in_preferences(window, qtbot, **values) -> None:
    """Set fields in Preferences (by key, "ui.theme" as ui__theme) and click Apply."""
    dialog = window.preferences()
    qtbot.waitUntil(dialog.isVisible, timeout=5_000)
    for name, value in values.items():
        editor = dialog.fields[name.replace("__", ".")].editor
        editor.set_value(value)
    assert dialog.apply_button.isEnabled()
    qtbot.mouseClick(dialog.apply_button, Qt.MouseButton.LeftButton)
    dialog.reject()


def window_color(widget) -> int:
    return widget.palette().color(QPalette.ColorRole.Window).lightness()


# -- appearance ------------------------------------------------------------------------------


def test_the_theme_applies_live_from_preferences(make_window, qtbot, qapp):
    window = make_window()
    system = window_color(qapp)
    apply_in_preferences(window, qtbot, ui__theme="dark")
    assert window.app_state.settings["ui.theme"] == "dark"
    assert window_color(qapp) < 80 and window.appearance.scheme == "dark"
    qtbot.waitUntil(lambda: window_color(window.composer.edit) < 80, timeout=5_000)
    pal = qapp.palette()
    text, base = pal.color(QPalette.ColorRole.Text), pal.color(QPalette.ColorRole.Base)
    assert text.lightness() - base.lightness() > 150  # readable
    disabled = pal.color(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Text)
    assert disabled != text and pal.color(QPalette.ColorRole.Link).lightness() > 120
    apply_in_preferences(window, qtbot, ui__theme="light")
    assert window_color(qapp) > 200 and window.appearance.scheme == "light"
    apply_in_preferences(window, qtbot, ui__theme="system")
    # offscreen reports no colour scheme: the platform's own palette is back
    assert qapp.styleHints().colorScheme() != Qt.ColorScheme.Dark
    assert window_color(qapp) == system and window.appearance.scheme == "system"


def test_system_follows_the_colour_scheme(qapp):
    assert painted_scheme("system", Qt.ColorScheme.Dark, platform_dark=False) == "dark"
    assert painted_scheme("system", Qt.ColorScheme.Dark, platform_dark=True) is None
    assert painted_scheme("system", Qt.ColorScheme.Light, platform_dark=False) is None
    assert painted_scheme("light", Qt.ColorScheme.Dark, platform_dark=True) == "light"
    assert apply_appearance(qapp, "system", 0, Qt.ColorScheme.Dark) == "dark"
    assert window_color(qapp) < 80
    assert apply_appearance(qapp, "system", 0, Qt.ColorScheme.Light) == "system"
    assert window_color(qapp) > 200


def test_the_text_size_applies_live_and_0_is_the_systems(make_window, qtbot, qapp):
    window = make_window()
    system = qapp.font().pointSize()
    apply_in_preferences(window, qtbot, ui__font_size=16)
    assert qapp.font().pointSize() == 16
    qtbot.waitUntil(lambda: window.font().pointSize() == 16, timeout=5_000)
    assert window.composer.edit.font().pointSize() == 16
    apply_in_preferences(window, qtbot, ui__font_size=0)
    qtbot.waitUntil(lambda: window.font().pointSize() == system, timeout=5_000)


def test_a_theme_from_the_environment_is_applied_at_start(make_window, monkeypatch, qapp):
    monkeypatch.setenv("IRIS_UI_THEME", "dark")
    window = make_window()
    assert window.app_state.settings.source("ui.theme") == "env"
    assert window.appearance.scheme == "dark" and window_color(qapp) < 80


def test_the_app_has_its_icon(qapp):
    from importlib import resources

    from iris_desktop.ui.app import application

    assert resources.files("iris_desktop").joinpath("resources/icon.png").is_file()
    app = application()
    assert app is qapp and not app.windowIcon().isNull()


# -- geometry --------------------------------------------------------------------------------


def test_the_default_geometry_fits_a_scaled_screen():
    # a 1600×1000 screen at 150% with a 40 px task bar: 1066×640 device-independent pixels
    available = QRect(0, 0, round(1600 / 1.5), round((1000 - 40) / 1.5))
    rect = default_geometry(available)
    assert available.contains(rect)
    assert rect.width() <= available.width() * 0.9 and rect.height() <= available.height() * 0.9
    assert abs(rect.center().x() - available.center().x()) <= 1
    assert abs(rect.center().y() - available.center().y()) <= 1
    big = QRect(0, 0, 2560, 1400)
    assert default_geometry(big).size().toTuple() == (1280, 800)  # the preferred size fits
    # a geometry saved on a larger screen is made to fit, and moved inside
    assert fit_geometry(QRect(900, 500, 1280, 800), available) == QRect(0, 0, 1067, 640)
    assert fit_geometry(QRect(100, 50, 600, 400), available) == QRect(100, 50, 600, 400)
    assert fit_geometry(QRect(-300, 600, 600, 400), available) == QRect(0, 240, 600, 400)


def test_the_window_opens_inside_the_available_screen(make_window):
    window = make_window()
    available = window.screen().availableGeometry()
    assert available.contains(window.geometry())
    assert window.width() <= available.width() * 0.9 + 1


def test_a_restored_geometry_too_large_for_the_screen_is_clamped(make_window, qtbot, data_dir):
    from PySide6.QtCore import QSettings

    window = make_window()
    available = window.screen().availableGeometry()
    window.shutdown()
    state = QSettings(str(data_dir / "ui-state.ini"), QSettings.Format.IniFormat)
    window.setGeometry(QRect(available.left() + 200, available.top() + 100,
                             available.width() + 600, available.height() + 400))
    state.setValue("window/geometry", window.saveGeometry())
    state.sync()
    again = make_window()
    geometry = again.geometry()  # the platform's frame may shift it by a pixel or two
    assert geometry.width() <= available.width() and geometry.height() <= available.height()
    assert available.contains(geometry.topLeft())
    assert available.intersected(geometry).width() >= geometry.width() - 4


# -- the last chat ---------------------------------------------------------------------------


def test_the_last_chat_is_reopened_and_a_deleted_one_is_not(make_window, qtbot, data_dir):
    first = seed_thread(db_path(data_dir), "first chat")
    second = seed_thread(db_path(data_dir), "second chat")
    window = make_window()
    assert window.thread_id is None  # nothing remembered yet
    window.open_thread(first)
    qtbot.waitUntil(lambda: len(window.view.transcript.entries()) == 2, timeout=5_000)
    window.shutdown()
    again = make_window()
    qtbot.waitUntil(lambda: again.thread_id == first, timeout=5_000)
    qtbot.waitUntil(lambda: len(again.view.transcript.entries()) == 2, timeout=5_000)
    assert not again.welcome_control.showing
    again.open_thread(second)
    again.shutdown()
    with Store(db_path(data_dir)) as store:
        store.delete_thread(second)
    third = make_window()
    qtbot.wait(200)
    qtbot.waitUntil(lambda: third.background.idle, timeout=5_000)
    assert third.thread_id is None and third.threads.list.count() == 1


# -- the welcome panel -----------------------------------------------------------------------

METER_PARTS = ("system", "tools", "summary", "recall", "history", "draft", "free")


def test_the_welcome_panel_explains_fills_the_composer_and_goes(make_window, qtbot, data_dir):
    window = make_window()
    panel = window.welcome
    assert window.welcome_control.showing and panel.isVisible()
    text = panel.text.text()
    for words in ("offline", "private", "on this computer", "server of your own",
                  "whichever comes first", *METER_PARTS):
        assert words in text, words
    button = panel.examples[0]
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    assert window.composer.text() == EXAMPLES[0]
    assert not window.generating and window.thread_id is None  # put there, not sent
    assert window.welcome_control.showing
    thread = seed_thread(db_path(data_dir), "a chat")
    window.open_thread(thread)
    assert not window.welcome_control.showing and window.view.isVisible()
    window.threads_control.new_chat()
    assert window.welcome_control.showing


def test_sending_from_the_welcome_panel_shows_the_transcript(make_window, qtbot):
    window = make_window(ScriptedRuntime(["Hello there."]))
    assert window.welcome_control.showing
    window.composer.set_text("Hi")
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not window.welcome_control.showing, timeout=5_000)
    qtbot.waitUntil(lambda: not window.generating, timeout=10_000)
    assert window.thread_id is not None and not window.welcome_control.showing


# -- preferences, shortcuts ------------------------------------------------------------------


def test_preferences_show_a_label_and_the_key_under_it(make_window, qtbot):
    window = make_window()
    dialog = window.preferences()
    qtbot.waitUntil(dialog.isVisible, timeout=5_000)
    field = dialog.fields["context.token_budget_ratio"]
    assert "How much of the window a request may fill" in field.title.text()
    assert field.key_label.text() == "context.token_budget_ratio"
    assert field.key_label.font().pointSizeF() < field.title.font().pointSizeF()
    for key, setting in SETTINGS.items():
        assert setting.label in dialog.fields[key].title.text().replace("&amp;", "&")
        assert dialog.fields[key].key_label.text() == key
    titles = [dialog.tabs.tabText(i) for i in range(dialog.tabs.count())]
    assert titles[-1] == "Appearance"
    size = dialog.fields["ui.font_size"].editor
    assert size.spin.text() == "the system's size" and size.raw() == "0"
    size.set_value(12)
    assert size.raw() == "12" and dialog.ok_button.isEnabled()
    dialog.reject()


def test_the_keyboard_shortcuts_dialog_lists_every_shortcut(make_window, qtbot):
    window = make_window()
    dialog = window.menus.shortcuts()
    qtbot.waitUntil(dialog.isVisible, timeout=5_000)
    keys = dialog.keys()
    for key in ("Ctrl+N", "Ctrl+Q", "Ctrl+,", "Ctrl+F", "Ctrl+I", "Ctrl+/", "Enter",
                "Shift+Enter", "Esc", "Del", "F2", "Home", "End"):
        assert key in keys, key
    shown = [dialog.table.item(r, 2).text() for r in range(dialog.table.rowCount())]
    assert "New chat" in shown and "Preferences" in shown and "Quit" in shown
    assert window.menus.actions["shortcuts"].shortcut().toString() == "Ctrl+/"
    dialog.reject()


# -- quitting mid-reply ----------------------------------------------------------------------


def test_ctrl_q_while_generating_asks_and_cancel_keeps_the_window(make_window, qtbot):
    window = make_window(ScriptedRuntime([" ".join(["word"] * 400)] * 2, delay_s=0.05))
    window.composer.set_text("Tell me a long story")
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: window.generating, timeout=5_000)
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=5_000)
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Q, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: window.quit_box is not None and window.quit_box.isVisible(),
                    timeout=5_000)
    box = window.quit_box
    assert box.text() == "Stop the reply and quit? What it has written so far is kept."
    cancel = box.button(QMessageBox.StandardButton.Cancel)
    qtbot.mouseClick(cancel, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not box.isVisible(), timeout=5_000)
    assert window.isVisible() and window.generating and not window._closed
    # closing the window asks too; Quit stops the reply and closes it
    window.close()
    box = window.quit_box
    qtbot.waitUntil(lambda: box.isVisible(), timeout=5_000)
    quit_button = next(b for b in box.buttons() if b.text().replace("&", "") == "Quit")
    qtbot.mouseClick(quit_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=5_000)
    assert window._closed


def test_quit_when_idle_closes_at_once(make_window, qtbot):
    window = make_window()
    window.menus.actions["quit"].trigger()
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=5_000)
    assert window.quit_box is None and window._closed


# -- a live thread list ----------------------------------------------------------------------


def test_the_thread_list_follows_another_connection(make_window, qtbot, data_dir):
    window = make_window()
    assert window.threads.list.count() == 0
    seen = []
    window.background.run(lambda store: store.data_version(), seen.append)
    qtbot.waitUntil(lambda: bool(seen), timeout=5_000)
    thread = seed_thread(db_path(data_dir), "from the CLI")  # another connection commits
    qtbot.waitUntil(lambda: window.threads.list.count() == 1, timeout=6_000)
    assert window.threads.list.item(0).text() == "from the CLI"
    window.open_thread(thread)
    qtbot.waitUntil(lambda: len(window.view.transcript.entries()) == 2, timeout=5_000)
    with Store(db_path(data_dir)) as store:
        store.add_message(thread, {"role": "user", "content": "added elsewhere"})
    qtbot.waitUntil(lambda: len(window.view.transcript.entries()) == 3, timeout=6_000)


def test_data_version_changes_only_for_other_connections(tmp_path):
    with Store(tmp_path / "a.db") as mine, Store(tmp_path / "a.db") as other:
        start = mine.data_version()
        mine.create_thread("mine")
        assert mine.data_version() == start
        other.create_thread("other")
        assert mine.data_version() != start


# -- the model's name, and a quiet log -------------------------------------------------------


def test_the_bundled_model_is_named_from_its_file(real_model):
    facts = real_model.describe()
    assert facts.name == "Qwen2.5-Coder-0.5B-Instruct"
    assert facts.file_type == "Q4_K_M"
    assert facts.file == "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def test_display_names_from_file_names():
    from iris_desktop.runtime.model import display_name

    assert display_name("gemma-3-270m-q4_k_m.gguf") == "Gemma-3-270M"
    assert display_name("Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf") == "Meta-Llama-3.1-8B-Instruct"
    assert display_name("llama-2-7b-chat.Q5_K_S.gguf") == "Llama-2-7B-Chat"
    assert display_name("mixtral-8x7b-instruct-v0.1.IQ4_XS.gguf") == "Mixtral-8x7B-Instruct-v0.1"
    assert display_name("model-f16-00001-of-00002.gguf") == "Model"


class StopAfter:
    """A cancel flag that turns set after ``calls`` looks: llama.cpp's abort callback
    looks between graph nodes, so this aborts the first decode part-way, every time."""

    def __init__(self, calls: int):
        self.calls = calls

    def is_set(self) -> bool:
        self.calls -= 1
        return self.calls < 0


def test_a_cancelled_prefill_logs_no_error(real_model, caplog):
    messages = [{"role": "user", "content": "word " * 1500}]
    with caplog.at_level(logging.DEBUG, logger="iris.runtime.llama"):
        stats = real_model.prefill(messages, cancel=StopAfter(20)).run()
    assert stats.stopped and stats.evaluated_tokens == 0
    llama = [r for r in caplog.records if r.name == "iris.runtime.llama"]
    assert any("failed to decode" in r.getMessage() for r in llama)  # logged, at DEBUG
    loud = [r.getMessage() for r in llama if r.levelno >= logging.WARNING]
    assert loud == []
    # the model still answers after the aborted decode
    assert real_model.stream(GenerationRequest([{"role": "user", "content": "Hi"}], max_tokens=2,
                             temperature=0)).text()


def test_text_typed_for_a_chat_deleted_elsewhere_is_never_lost(make_window, qtbot, data_dir,
                                                                caplog):
    """Before: the CLI deleted the open chat; the window went on showing it, and the
    message the user then sent failed with "an internal error in Iris (KeyError: 'no
    thread 1')", stored nowhere, its draft gone. Now the send is refused in one sentence
    with the text back in the box, and the window moves to a new chat that keeps it."""
    window = make_window(ScriptedRuntime(["never sent"]))
    thread = seed_thread(db_path(data_dir), "Holiday plans")
    qtbot.waitUntil(lambda: window.threads.list.count() == 1, timeout=6_000)
    window.open_thread(thread)
    qtbot.waitUntil(lambda: len(window.view.transcript.entries()) == 2, timeout=5_000)
    window.threads_control.poll_timer.stop()  # the send comes before the window's next look
    with Store(db_path(data_dir)) as store:  # the CLI's `delete`
        store.delete_thread(thread)
    notices = []
    add_notice = window.view.transcript.add_notice
    window.view.transcript.add_notice = lambda text, **kw: notices.append(text) or add_notice(text, **kw)
    typed = "Here is the itinerary I worked out over the last hour: " + "day by day " * 30
    window.send(typed)
    qtbot.waitUntil(lambda: not window.generating, timeout=10_000)
    assert notices == ["Not sent: this chat was deleted, in another Iris window or by a command"]
    qtbot.waitUntil(lambda: window.thread_id is None, timeout=6_000)  # a new chat instead
    assert window.composer.text() == typed
    assert window.status_area.current_message().startswith(
        "“Holiday plans” was deleted in another Iris window or by a command")
    assert window.threads.list.count() == 0
    with Store(db_path(data_dir)) as store:
        assert store.threads() == []
    # the views asked for before the window saw the deletion are dropped, not logged as
    # failures with a traceback (they were: "background job failed … KeyError")
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_the_chat_on_screen_follows_other_processes_while_another_chat_is_answered(
        make_window, qtbot, data_dir):
    """Before (an audit): while the window answered in one chat, it ignored every change
    another process made to the chat on screen, and for good: a chat a command deleted
    stayed on screen (its draft silently never saved), a reply the CLI added never
    showed. Only the chat being answered waits, and it catches up when the turn ends."""
    runtime = ScriptedRuntime(["word " * 400], delay_s=0.01)
    window = make_window(runtime)
    answered = seed_thread(db_path(data_dir), "Long answer")
    other = seed_thread(db_path(data_dir), "Holiday plans")
    qtbot.waitUntil(lambda: window.threads.list.count() == 2, timeout=6_000)
    window.threads_control.poll_timer.stop()  # the test says when the window looks
    window.open_thread(answered)
    qtbot.waitUntil(lambda: len(window.view.transcript.entries()) == 2, timeout=5_000)
    window.send("tell me everything")
    qtbot.waitUntil(lambda: window.generating, timeout=5_000)
    window.open_thread(other)  # reading another chat while the reply is written
    qtbot.waitUntil(lambda: [e.text for e in window.view.transcript.entries()] == ["hello", "hi"],
                    timeout=5_000)
    with Store(db_path(data_dir)) as store:  # the CLI's `chat --thread` in the chat on screen
        store.add_messages(other, [{"role": "user", "content": "and the hotel?"},
                                   {"role": "assistant", "content": "Booked."}])
    window.threads_control.poll()
    qtbot.waitUntil(lambda: "Booked." in [e.text for e in window.view.transcript.entries()],
                    timeout=5_000)
    assert window.generating  # shown while the other chat is still being answered
    window.composer.set_text("a thought for the holiday")
    with Store(db_path(data_dir)) as store:  # the CLI's `delete`
        store.delete_thread(other)
    window.threads_control.poll()
    qtbot.waitUntil(lambda: window.thread_id is None, timeout=5_000)
    assert window.generating and window.composer.text() == "a thought for the holiday"
    assert window.status_area.current_message().startswith("“Holiday plans” was deleted")
    qtbot.waitUntil(lambda: not window.generating, timeout=30_000)
    with Store(db_path(data_dir)) as store:
        assert store.messages(answered)[-1]["content"].startswith("word word")


def test_a_change_to_the_chat_being_answered_waits_for_the_turns_end(make_window, qtbot,
                                                                     data_dir):
    """The chat being answered is not reloaded under its streaming reply; a change another
    process made to it is looked at once the turn ends (it was never looked at again).
    The reply would take a minute, so the turn is surely under way while the change is
    seen, and Stop ends it (the test failed at random on a busy machine: the reply could
    end first, or the change be listed before the window's own save of the question)."""
    runtime = ScriptedRuntime(["word " * 600], delay_s=0.1)
    window = make_window(runtime)
    answered = seed_thread(db_path(data_dir), "Long answer")
    qtbot.waitUntil(lambda: window.threads.list.count() == 1, timeout=6_000)
    window.threads_control.poll_timer.stop()
    window.open_thread(answered)
    qtbot.waitUntil(lambda: len(window.view.transcript.entries()) == 2, timeout=5_000)
    window.send("tell me everything")
    qtbot.waitUntil(lambda: window.generating, timeout=5_000)
    def kinds():
        return [e.kind for e in window.view.transcript.entries()]

    qtbot.waitUntil(lambda: any(e.text.startswith("word") for e in window.view.transcript.entries()),
                    timeout=10_000)  # the question saved, the reply under way
    with Store(db_path(data_dir)) as store:  # another process: a rename and a compaction
        store.rename_thread(answered, "Renamed by a command")
        first = store.messages(answered)[0]["id"]
        store.add_summary(answered, {
            "prev_id": None, "first_message_id": first, "covers_through_id": first,
            "first_turn": 1, "last_turn": 1, "fields": {"summary": "A greeting."}, "text": "x",
            "tokens": 5, "counter": "heuristic", "path": "extractive"})
    window.threads_control.poll()
    qtbot.waitUntil(lambda: window.threads.list.item(0).text() == "Renamed by a command",
                    timeout=5_000)
    qtbot.waitUntil(lambda: window.threads_control._held_back, timeout=5_000)
    assert window.generating and "divider" not in kinds()  # not reloaded under the reply
    window.turns.stop()
    qtbot.waitUntil(lambda: not window.generating, timeout=30_000)
    qtbot.waitUntil(lambda: not window.threads_control._held_back, timeout=5_000)
    qtbot.waitUntil(lambda: "divider" in kinds(), timeout=5_000)  # the compaction, looked at
    texts = [e.text for e in window.view.transcript.entries()]
    assert "tell me everything" in texts and texts[-1].startswith("word")


def test_the_open_chat_follows_a_branch_switched_and_a_reply_finished_elsewhere(
        make_window, qtbot, data_dir):
    """Before: `switch` in the CLI left the window on the old alternative (and the user's
    next message went under the one they could not see); a reply the CLI finished stayed
    an empty "generating…" card. Neither changes a chat's title, time or message count,
    which was all the window compared."""
    window = make_window()
    with Store(db_path(data_dir)) as store:
        thread = store.create_thread("colours")
        question, red = store.add_messages(thread, [{"role": "user", "content": "name a colour"},
                                                    {"role": "assistant", "content": "Red."}])
        store.add_message(thread, {"role": "assistant", "content": "Blue."}, parent_id=question)
    window.open_thread(thread)
    qtbot.waitUntil(lambda: [e.text for e in window.view.transcript.entries()]
                    == ["name a colour", "Blue."], timeout=5_000)
    with Store(db_path(data_dir)) as store:  # `switch THREAD MESSAGE previous`
        store.switch_branch(thread, store.head(thread), -1)
    qtbot.waitUntil(lambda: [e.text for e in window.view.transcript.entries()]
                    == ["name a colour", "Red."], timeout=6_000)
    with Store(db_path(data_dir)) as store:  # a `chat` starts its reply
        store.add_message(thread, {"role": "user", "content": "why?"})
        reply = store.add_message(thread, {"role": "assistant", "content": ""}, status="streaming")
    qtbot.waitUntil(lambda: window.view.transcript.entries()[-1].status == "streaming",
                    timeout=6_000)
    with Store(db_path(data_dir)) as store:  # and finishes it
        store.update_streaming(reply, "Because it is warm.", status="complete")
    qtbot.waitUntil(lambda: (window.view.transcript.entries()[-1].text,
                             window.view.transcript.entries()[-1].status)
                    == ("Because it is warm.", "complete"), timeout=6_000)


def test_preferences_open_on_the_file_as_a_command_left_it(make_window, qtbot, data_dir):
    """Before: `config set model.temperature 0.3` while the window ran; Preferences still
    showed 0.7, and Restore defaults then OK changed nothing: the file kept 0.3 (it was
    compared with the window's copy), so the next start ran at 0.3 against what the user
    had just chosen."""
    from iris_desktop.cli import main as cli_main

    window = make_window()
    assert window.app_state.settings["model.temperature"] == 0.7
    assert cli_main(["--data-dir", str(data_dir), "config", "set", "model.temperature", "0.3"]) == 0
    dialog = window.preferences()
    qtbot.waitUntil(dialog.isVisible, timeout=5_000)
    field = dialog.fields["model.temperature"]
    assert float(field.raw()) == 0.3  # the file as it is now
    restore = dialog.findChild(QPushButton, f"restore-{SETTINGS['model.temperature'].section}")
    restore.click()
    assert float(field.raw()) == 0.7
    dialog.accept()
    config = window.app_state.settings.config_path.read_text()
    assert "temperature" not in config  # the default, removed from the file
    assert window.app_state.settings["model.temperature"] == 0.7


def test_an_invalid_value_says_where_it_is_and_to_a_screen_reader(make_window, qtbot, data_dir):
    """Before (two audits): with the window at 8,192, n_ctx 4,096 on the Model page greyed
    OK out while the error stood on the Context page, unmarked; a screen reader heard
    nothing at all. Now the page's tab is marked, the budget box names it, and the field
    describes (and says) its error."""
    from iris_desktop.ui.accessibility import keyboard_controls

    with open(db_path(data_dir).parent / "config.toml", "w", encoding="utf-8") as config:
        config.write("[context]\nwindow = 8192\n")
    window = make_window()
    dialog = window.preferences()
    qtbot.waitUntil(dialog.isVisible, timeout=5_000)
    dialog.tabs.setCurrentIndex(dialog.sections.index("model"))
    dialog.fields["model.n_ctx"].editor.set_value(4096)
    qtbot.waitUntil(lambda: not dialog.ok_button.isEnabled(), timeout=5_000)
    wrong = [dialog.tabs.tabText(i) for i in range(dialog.tabs.count())
             if dialog.tabs.tabText(i).endswith(" ⚠")]
    keys = sorted(dialog.errors)
    assert wrong == sorted({f"{dialog.tabs.tabText(dialog.sections.index(SETTINGS[k].section))}"
                            for k in keys}) and wrong
    qtbot.waitUntil(lambda: dialog.meter.problem.startswith(
        "Fix the marked values to see the budget ("), timeout=5_000)
    assert all(page in dialog.meter.problem for page in wrong)  # said once, in the bar's place
    assert dialog.meter.accessibleDescription() == dialog.meter.problem
    assert "Fix the marked" not in dialog.breakdown.text()
    for key in keys:
        described = {c.accessibleDescription() for c in keyboard_controls(dialog.fields[key].editor)}
        assert described == {dialog.fields[key].error.text()}  # (its key left to its label)
        assert dialog.errors[key].endswith(dialog.fields[key].error.text()[1:])
    # no figure of the last valid window stands beside the marked values (the ratio's line
    # still said "= 5,734 of 8,192 tokens", the dialog's meter the old budget)
    ratio = dialog.fields["context.token_budget_ratio"].editor
    meaning = ratio.meaning  # (it read "= – tokens until…": aloud, "equals dash tokens")
    assert meaning.text() == "In tokens: unknown until the marked values are fixed"
    assert ratio.slider.accessibleDescription().endswith(f"{meaning.text()}.")
    assert dialog.meter.breakdown is None
    dialog.fields["model.n_ctx"].editor.set_value(8192)  # fixed: the marks go
    qtbot.waitUntil(dialog.ok_button.isEnabled, timeout=5_000)
    assert not any(dialog.tabs.tabText(i).endswith(" ⚠") for i in range(dialog.tabs.count()))
    qtbot.waitUntil(lambda: meaning.text() == "= 5,734 of 8,192 tokens", timeout=5_000)
    assert dialog.meter.breakdown is not None
    dialog.reject()


def test_preferences_save_every_change_or_none_and_say_why(make_window, qtbot, data_dir):
    """Before (an audit): with `ui = 3` in config.toml, OK wrote the context key, then
    failed on the ui key with a traceback on stderr only: the dialog stayed open without a
    word and the file held half the change. Now nothing is written and a box says why."""
    config = db_path(data_dir).parent / "config.toml"
    window = make_window()
    config.write_text("ui = 3\n", encoding="utf-8")
    before = config.read_bytes()
    dialog = window.preferences()
    qtbot.waitUntil(dialog.isVisible, timeout=5_000)
    dialog.fields["context.token_budget_ratio"].editor.set_value(0.6)
    dialog.fields["ui.font_size"].editor.set_value(14)
    qtbot.waitUntil(dialog.ok_button.isEnabled, timeout=5_000)
    qtbot.mouseClick(dialog.ok_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.refusal.isVisible(), timeout=5_000)
    assert dialog.refusal.text().startswith("Nothing was saved: ")
    assert "ui is a value, not a [ui] table" in dialog.refusal.text()
    assert config.read_bytes() == before and dialog.isVisible()
    assert window.app_state.settings["context.token_budget_ratio"] == 0.7
    dialog.refusal.close()
    dialog.reject()


def test_preferences_refuse_a_model_setting_no_load_could_honour(make_window, qtbot, tmp_path):
    """Before (an audit): a model.path that is not there, or the server backend without
    its address, were saved by OK; the reload failed, and so did every later start, the
    file holding them. Now the field says why and OK waits."""
    window = make_window()
    dialog = window.preferences()
    qtbot.waitUntil(dialog.isVisible, timeout=5_000)
    path = dialog.fields["model.path"].editor
    for value, said in ((str(tmp_path / "gone.gguf"), f"model.path: there is no file {tmp_path / 'gone.gguf'}"),
                        ("models/mine.gguf", "model.path: models/mine.gguf is not a full path")):
        path.set_value(value)
        qtbot.waitUntil(lambda: not dialog.ok_button.isEnabled(), timeout=5_000)
        assert dialog.errors["model.path"].startswith(said)
    real = tmp_path / "real.gguf"
    real.write_bytes(b"GGUF")
    path.set_value(str(real))  # there: whether it loads is the reload's to say
    qtbot.waitUntil(dialog.ok_button.isEnabled, timeout=5_000)
    path.set_value("bundled")
    dialog.fields["model.backend"].editor.set_value("openai")
    qtbot.waitUntil(lambda: "model.base_url" in dialog.errors, timeout=5_000)
    assert not dialog.ok_button.isEnabled()
    dialog.reject()


def test_the_chat_lists_cursor_stays_where_the_keyboard_left_it(make_window, qtbot, data_dir):
    """Before (an accessibility audit): F2 on a chat that was not open renamed it, and the
    list, shown again, put the keyboard's cursor back on the open chat."""
    window = make_window()
    first = seed_thread(db_path(data_dir), "first")
    second = seed_thread(db_path(data_dir), "second")
    qtbot.waitUntil(lambda: window.threads.list.count() == 2, timeout=6_000)
    window.open_thread(first)
    qtbot.waitUntil(lambda: len(window.view.transcript.entries()) == 2, timeout=5_000)
    chats = window.threads.list
    window.activateWindow()
    chats.setFocus()
    qtbot.waitUntil(chats.hasFocus, timeout=5_000)
    row = next(r for r in range(chats.count()) if chats.item(r).data(THREAD_ROLE) == second)
    chats.setCurrentRow(row, QItemSelectionModel.SelectionFlag.NoUpdate)
    window.threads_control.rename_thread(second, "second, renamed")  # what F2 then does
    qtbot.waitUntil(lambda: any(chats.item(r).text() == "second, renamed"
                                for r in range(chats.count())), timeout=5_000)
    assert chats.currentItem().data(THREAD_ROLE) == second
    assert window.thread_id == first


def test_the_meter_and_states_follow_a_change_another_process_made_to_the_open_chat(
        make_window, qtbot, data_dir):
    """Before (an audit): after `switch`, `chat` or `compact` in the CLI on the open chat,
    the transcript reloaded (not even that after a compaction, which adds no message) but
    the meter, the inspector and each message's state kept the old request until the chat
    was opened again."""
    from iris_desktop.cli import main as cli_main

    overrides = {"context.window": "2048"}
    window = make_window(overrides=overrides)
    words = " ".join(f"word{i}" for i in range(60))
    with Store(db_path(data_dir)) as store:
        thread = store.create_thread("long")
        for i in range(30):
            store.add_messages(thread, [{"role": "user", "content": f"question {i}: {words}"},
                                        {"role": "assistant", "content": f"answer {i}: {words}"}])

    def planned():
        with Store(db_path(data_dir)) as store:
            return window.context.planner.plan_or_error(store, thread)

    window.open_thread(thread)
    qtbot.waitUntil(lambda: window.meter.breakdown == planned().breakdown.as_dict(), timeout=10_000)
    before = dict(window.meter.breakdown)
    assert before["summary"] == 0
    code = cli_main(["--data-dir", str(data_dir), "--set", "context.window=2048", "compact",
                     str(thread), "--no-model"])
    assert code == 0
    qtbot.waitUntil(lambda: window.meter.breakdown == planned().breakdown.as_dict(), timeout=8_000)
    assert window.meter.breakdown["summary"] > 0  # the summary the other process made
    # each message's state comes from the same plan, drawn just after the meter (a busy
    # machine read it between the two)
    qtbot.waitUntil(lambda: any(e.state == "summarized" for e in window.view.transcript.entries()),
                    timeout=8_000)
    qtbot.waitUntil(lambda: any(e.kind != "message" for e in window.view.transcript.entries()),
                    timeout=8_000)  # the summary's divider, though no message was added


def test_the_first_message_of_a_new_chat_comes_back_when_it_cannot_be_stored(
        make_window, qtbot, data_dir, monkeypatch):
    """Before (an audit): on a new chat, a send that failed before the chat was made (a
    full disk, another process holding the write lock) emptied the box with no word: its
    failure came for "thread -1" and the window, on no thread, dropped it. In an open
    chat the same failure gave the text back with the sentence."""
    import sqlite3

    window = make_window(ScriptedRuntime(["never sent"]))
    assert window.thread_id is None

    def full(self, *args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(Store, "create_thread", full)
    typed = "My first question, typed with care"
    window.send(typed)
    qtbot.waitUntil(lambda: not window.generating, timeout=10_000)
    qtbot.waitUntil(lambda: window.composer.text() == typed, timeout=5_000)
    notices = [e.text for e in window.view.transcript.entries() if e.kind != "message"]
    assert any("is full" in n for n in notices), notices


def compacted_chat(data_dir, capsys, turns: int) -> int:
    """A chat of ``turns`` turns, compacted by the CLI at a 1,024-token window (its
    summarized messages not embedded yet)."""
    from iris_desktop.cli import main

    with Store(db_path(data_dir)) as store:
        thread = store.create_thread("Long chat")
        store.add_messages(thread, [m for i in range(turns) for m in (
            {"role": "user", "content": f"Day {i}: I repotted the fern number {i} today."},
            {"role": "assistant", "content": f"Nice, fern {i} will like the new pot."})])
    assert main(["--data-dir", str(data_dir), "--set", "context.window=1024",
                 "compact", str(thread), "--no-model"]) == 0
    capsys.readouterr()
    return thread


def test_a_summarized_chat_opened_in_the_window_is_embedded_for_recall(make_window, qtbot,
                                                                      data_dir, capsys):
    """Before (an audit): the window embedded a chat's summarized messages only after a
    turn (or a new planner): a long chat imported, compacted and opened was searched by
    words only, 20 s later still 0 vectors, and its recall disagreed with `context`."""
    thread = compacted_chat(data_dir, capsys, turns=40)
    window = make_window(overrides={"context.recall_semantic": "true", "context.window": "1024"})
    embedder = window.app_state.planner.embedder
    assert embedder is not None
    with Store(db_path(data_dir)) as store:
        covered = store.latest_summary(thread).covers_through_id
        assert store.first_without_vector(thread, 0, covered, embedder.identity) is not None
    window.open_thread(thread)

    def embedded() -> bool:
        with Store(db_path(data_dir)) as store:
            return store.first_without_vector(thread, 0, covered, embedder.identity) is None

    qtbot.waitUntil(embedded, timeout=60_000)  # no message sent


def test_closing_the_window_while_a_chat_is_embedded_logs_no_failure(make_window, qtbot,
                                                                     data_dir, capsys, caplog):
    """Before (an audit): closing the window while recall's embedding ran logged "background
    job failed … RuntimeError: the embedding model is closed" with a traceback, every
    time: the model (and its embedder) closed before the DB thread's queued batch ran."""
    import logging

    thread = compacted_chat(data_dir, capsys, turns=300)
    window = make_window(overrides={"context.recall_semantic": "true", "context.window": "1024"})
    caplog.set_level(logging.WARNING)
    window.open_thread(thread)
    qtbot.waitUntil(lambda: not window.background.idle, timeout=5_000)  # embedding under way
    window.close()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
