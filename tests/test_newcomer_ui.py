"""What a newcomer meets first (issue #47 items 3–5), clicked through real widgets and
dialogs: a window and a Preferences dialog that fit the screen at any text size, status
sentences that are never cut mid-word, settings for a chat not yet begun, imported
speakers' names, and the smaller things (a stale progress bar, search hits on another
branch, Appearance that applies at once, out-of-range values, the cache, the Help
menu's folders, the budget's sum, recall's messages, the chart and the tabs, the draft
that survives a crash, the export's file name)."""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QPoint, QRect, Qt  # noqa: E402
from PySide6.QtWidgets import QLineEdit, QScrollArea  # noqa: E402

from iris_desktop.core.events import CompactionEvent, CompactionFinished  # noqa: E402
from iris_desktop.core.store import Store  # noqa: E402
from iris_desktop.host import Host  # noqa: E402
from iris_desktop.paths import app_paths  # noqa: E402
from iris_desktop.ui.main_window import main_window  # noqa: E402
from iris_desktop.ui.status_line import ELLIPSIS  # noqa: E402
from iris_desktop.ui.transcript_model import ENTRY_ROLE  # noqa: E402

from support.fakes import ScriptedRuntime  # noqa: E402
from support.windows import settle, window_on  # noqa: E402

pytestmark = pytest.mark.usefixtures("system_look_after")

#: what the status bar says when the circuit breaker stops compaction (a long sentence)
BREAKER = CompactionEvent(
    "tokens", "skipped", error="circuit breaker open: the last 3 compactions failed; it tries "
    "again after 5 more turns or 10 minutes, or now with Compact now ('iris-desktop compact')")


def db_path(data_dir):
    return app_paths(data_dir).ensure().db_path


def seed_thread(data_dir, messages, title="seeded") -> int:
    with Store(db_path(data_dir)) as store:
        thread = store.create_thread(title)
        store.add_messages(thread, messages)
    return thread


def global_rect(widget) -> QRect:
    return QRect(widget.mapToGlobal(QPoint(0, 0)), widget.size())


def open_preferences(window, qtbot):
    window.menus.actions["preferences"].trigger()  # Edit ▸ Preferences…
    dialog = window.menus.settings_dialog
    qtbot.waitUntil(dialog.isVisible, timeout=5_000)
    return dialog


# -- A. a window that fits ------------------------------------------------------------------


@pytest.mark.parametrize("points", [8, 24])
def test_preferences_fit_the_screen_at_any_text_size(make_window, qtbot, points):
    window = make_window(overrides={"ui.font_size": str(points)})
    assert window.font().pointSize() == points
    dialog = open_preferences(window, qtbot)
    qtbot.wait(50)
    available = dialog.screen().availableGeometry()
    assert dialog.width() <= available.width() and dialog.height() <= available.height()
    assert available.contains(dialog.frameGeometry()), (dialog.frameGeometry(), available)
    for button in (dialog.ok_button, dialog.apply_button, dialog.buttons.button(
            dialog.buttons.StandardButton.Cancel)):
        assert button.isVisible()
        assert available.contains(global_rect(button)) and global_rect(dialog).contains(
            global_rect(button)), button.text()
    # every page fits the dialog's width (CI, 24 pt: a ratio's meaning on one line made
    # the Context page 834 px wide in a 680 px view) and scrolls down to its last control
    for page in range(dialog.tabs.count()):
        dialog.tabs.setCurrentIndex(page)
        scroll = dialog.tabs.widget(page)
        assert isinstance(scroll, QScrollArea)
        name = dialog.tabs.tabText(page)
        qtbot.waitUntil(lambda s=scroll: s.widget().width() >= s.viewport().width(), timeout=5_000)
        assert scroll.widget().minimumSizeHint().width() <= scroll.viewport().width(), name
        restore = scroll.widget().findChildren(type(dialog.ok_button))[-1]
        scroll.ensureWidgetVisible(restore)
        qtbot.waitUntil(lambda s=scroll, r=restore: global_rect(s.viewport()).contains(global_rect(r)),
                        timeout=5_000)


def test_preferences_follow_a_text_size_applied_while_open(make_window, qtbot, qapp):
    window = make_window()
    dialog = open_preferences(window, qtbot)
    dialog.fields["ui.font_size"].editor.set_value(24)
    qtbot.mouseClick(dialog.apply_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.font().pointSize() == 24, timeout=5_000)
    available = dialog.screen().availableGeometry()
    assert dialog.width() <= available.width() and dialog.height() <= available.height()
    assert dialog.ok_button.isVisible()


def assert_elided_at_a_word(label, full: str) -> None:
    shown = label.shown_text()
    assert label.text() == full
    assert shown.endswith(ELLIPSIS) and len(shown) < len(full)
    start = shown[:-1]
    assert full.startswith(start) and full[len(start)] in " ,;:", (shown, full)
    assert label.fontMetrics().horizontalAdvance(shown) <= label.contentsRect().width()
    assert label.toolTip() == full


def test_the_empty_chat_list_says_how_to_start_or_import(make_window, qtbot):
    """A first start showed a blank panel; the empty list now says what to do (drawn, so
    the list still holds chats only), and stops saying it once there is a chat."""
    window = make_window()
    chats = window.threads.list
    qtbot.wait(50)
    assert chats.count() == 0 and "File ▸ Import conversation…" in chats.placeholder
    with_hint = chats.viewport().grab().toImage()
    said, chats.placeholder = chats.placeholder, ""
    chats.viewport().update()
    qtbot.wait(50)
    assert chats.viewport().grab().toImage() != with_hint  # the hint was painted
    chats.placeholder = said


def test_a_small_window_shows_the_welcome_without_sideways_scrolling(qtbot, data_dir):
    """Before: at 800×500 the chats took 280 px and the welcome panel scrolled sideways,
    its text cut at the right edge (an example prompt's button would not shrink). Now a
    first start gives the chats a quarter of the width, and the examples are cut at a
    word ("…"), whole in their tooltip."""
    host = Host(data_dir, {"context.recall_semantic": "false"}, runtime=ScriptedRuntime([]),
                compact=False)
    window = main_window(host)
    qtbot.addWidget(window)
    window.resize(680, 480)
    window._restore_state()  # as on a small screen's first start
    window.resize(680, 480)
    window.show()
    try:
        qtbot.waitUntil(window.welcome.isVisible, timeout=5_000)
        qtbot.wait(100)
        assert window.splitter.sizes()[0] <= 200
        panel = window.welcome
        assert not panel.horizontalScrollBar().isVisible()
        assert panel.widget().width() <= panel.viewport().width()
        cut = [b for b in panel.examples if b.text() != b.prompt]
        assert cut  # the longest does not fit beside the chats at this width
        for button in cut:
            assert button.text().endswith(ELLIPSIS) and button.toolTip() == button.prompt
        window.resize(1600, 900)
        qtbot.waitUntil(lambda: all(b.text() == b.prompt for b in panel.examples), timeout=5_000)
    finally:
        window.shutdown()
        host.close()


def test_the_inspector_beside_the_conversation_leaves_it_most_of_a_small_window(make_window,
                                                                                qtbot):
    """Before: an inspector restored open at 800×500 took 345 pixels and left the
    conversation 160. Now it takes at most 40% of the window's width, whenever it
    opens or the window is resized."""
    from iris_desktop.ui.main_window import INSPECTOR_SHARE

    window = make_window()
    window.resize(1400, 700)
    window.inspector.toggleViewAction().trigger()
    qtbot.waitUntil(window.inspector.isVisible, timeout=5_000)
    window.resizeDocks([window.inspector], [650], Qt.Orientation.Horizontal)  # a wide one
    qtbot.wait(50)
    assert window.inspector.width() > 600
    window.resize(800, 500)
    qtbot.waitUntil(lambda: window.inspector.width() <= 800 * INSPECTOR_SHARE + 1, timeout=5_000)
    assert window.view.width() >= 200 or window.welcome.width() >= 200
    # docked under the conversation it spans the window, as a bottom dock does
    window.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, window.inspector)
    window.resize(820, 520)
    qtbot.waitUntil(lambda: window.inspector.width() > 700, timeout=5_000)


def test_the_meter_says_when_earlier_turns_are_not_sent(make_window, qtbot):
    """A long imported chat read 5,718 / 8,192, under the compaction mark, while 140 turns
    were left out (the budget, window × 0.7, trips first): the meter marks the budget,
    in red while turns are left out, and its tooltip says how many, first."""
    from iris_desktop.ui.meter import BudgetMeter

    window = make_window()
    meter = window.findChildren(BudgetMeter)[0]
    breakdown = {"window": 8192, "ratio": 0.7, "budget": 5734, "system": 25, "tools": 0,
                 "summary": 0, "recall": 0, "history": 5693, "draft": 0, "available": 5709,
                 "threshold": 6144, "used": 5718, "free": 2474}
    meter.set_breakdown(breakdown, dropped=140)
    from PySide6.QtGui import QTextDocument

    shown = QTextDocument()
    shown.setHtml(meter.toolTip())  # a table of numbers: rich text
    assert shown.toPlainText().splitlines()[0] == (
        "140 earlier turns are not sent: past the budget (the dashed line). They are "
        "summarized when you send.")
    marked = meter.grab().toImage()
    meter.set_breakdown(breakdown)
    assert "not sent" not in meter.toolTip() and meter.grab().toImage() != marked  # grey, not red


def test_a_long_status_sentence_is_elided_at_a_word_and_never_reaches_the_meter(make_window, qtbot):
    window = make_window()
    window.resize(760, window.height())
    qtbot.wait(50)
    thread = window.thread_id if window.thread_id is not None else -1
    window.model.worker.turnEvent.emit(CompactionFinished(thread, BREAKER))
    qtbot.waitUntil(lambda: "circuit breaker" in window.state_label.text(), timeout=5_000)
    qtbot.wait(50)
    full = BREAKER.plain()
    assert_elided_at_a_word(window.state_label, full)
    bar = window.statusBar()
    right = window.state_label.mapTo(bar, QPoint(window.state_label.width(), 0)).x()
    for permanent in (window.meter, window.model_label, window.where_label):
        if permanent.isVisible() and permanent.width():
            assert right <= permanent.mapTo(bar, QPoint(0, 0)).x(), permanent.objectName()
    assert window.meter.mapTo(bar, QPoint(window.meter.width(), 0)).x() <= bar.width()
    # a passing message is elided the same way, and the sentence comes back after it
    window.app_state.show_message(full, 200)
    qtbot.waitUntil(lambda: window.status_area.current_message() == full
                    and window.status_area.message.width() > 100, timeout=2_000)
    assert_elided_at_a_word(window.status_area.message, full)
    qtbot.waitUntil(lambda: window.status_area.current_message() == "", timeout=2_000)
    assert window.state_label.isVisible()


@pytest.mark.parametrize("points", [14, 18])
def test_the_status_sentence_keeps_its_room_at_a_large_text_size(make_window, qtbot, points):
    """Before (an audit): at 14 pt in an 800 px window the sentence got 0 px (prefill
    progress, errors, "Copied" never seen) and the model's name was cut mid-word; a
    sentence ending in "Prefilling…" was elided to "Prefilling……"."""
    from iris_desktop.ui.status_line import MIN_SENTENCE_CHARS

    window = make_window(overrides={"ui.font_size": str(points)})
    window.resize(800, 700)
    window.model_label.setText("Qwen2.5 Coder 0.5B Instruct · 8,192-token window")
    sentence = "Prefilling… 1,536 of 4,096 tokens (37%), about 12 s left"
    window.app_state.show_message(sentence, 5_000)
    qtbot.waitUntil(lambda: window.status_area.current_message() == sentence, timeout=2_000)
    qtbot.wait(100)
    label = window.status_area.message
    digit = label.fontMetrics().horizontalAdvance("0")
    assert label.width() >= digit * (MIN_SENTENCE_CHARS - 6)  # all of it, less the margins
    assert label.shown_text().startswith("Prefilling… 1,536")
    assert "……" not in label.shown_text()
    model = window.model_label  # elided at a word, never cut inside one
    shown = model.shown_text()
    assert shown == model.text() or (shown.endswith(ELLIPSIS)
                                     and model.text().startswith(shown[:-1].rstrip(" ·")))
    assert model.fontMetrics().horizontalAdvance(shown) <= model.contentsRect().width()
    bar = window.statusBar()
    assert window.meter.mapTo(bar, QPoint(window.meter.width(), 0)).x() <= bar.width()


# -- B. a chat's settings before its first message; imported speakers ---------------------


def test_a_new_chat_gets_its_own_system_prompt_before_its_first_message(make_window, qtbot,
                                                                      data_dir):
    runtime = ScriptedRuntime(["Ahoy."])
    window = make_window(runtime)
    assert window.thread_id is None  # a chat not begun
    window.composer.set_text("Hello there")
    window.menus.actions["chat-settings"].trigger()  # File ▸ Chat settings…
    dialog = window.threads_control.chat_settings
    qtbot.waitUntil(lambda: dialog is not None and dialog.isVisible(), timeout=5_000)
    assert dialog.title.text() == "New chat"
    dialog.prompt.setFocus()
    qtbot.keyClicks(dialog.prompt, "Answer like a pirate.")
    save = dialog.buttons.button(dialog.buttons.StandardButton.Save)
    qtbot.mouseClick(save, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.thread_id is not None, timeout=5_000)
    thread = window.thread_id
    with Store(db_path(data_dir)) as store:
        assert store.system_prompt_of(thread) == "Answer like a pirate."
    assert window.composer.text() == "Hello there"  # the draft stays with the chat
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not window.generating and len(runtime.requests) == 1, timeout=10_000)
    settle(qtbot, window)
    system = runtime.requests[0][0]
    assert system["role"] == "system" and "Answer like a pirate." in system["content"]
    assert window.thread_id == thread  # sent into the chat the settings made
    with Store(db_path(data_dir)) as store:
        assert store.thread(thread)["title"] != "New chat"  # titled from its first message
        assert len(store.threads()) == 1


def test_an_imported_chat_shows_its_speakers_names(make_window, qtbot, tmp_path, monkeypatch):
    from iris_desktop.ui import thread_control

    source = tmp_path / "group.json"
    source.write_text(
        '[{"role": "user", "name": "Alice", "content": "Shall we meet at noon?"},'
        ' {"role": "assistant", "name": "Bob", "content": "Noon works for me."},'
        ' {"role": "user", "content": "And me?"}]', encoding="utf-8")
    monkeypatch.setattr(thread_control.QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a, **k: (str(source), "")))
    window = make_window()
    window.menus.actions["import"].trigger()  # File ▸ Import conversation…
    qtbot.waitUntil(lambda: len(window.view.transcript.entries()) == 3, timeout=10_000)
    shown = window.view.transcript.entries()
    assert [e.speaker for e in shown] == ["Alice", "Bob", "You"]
    model = window.view.transcript
    assert model.index(0).data(Qt.ItemDataRole.AccessibleTextRole).startswith("Alice: ")
    # each card's heading is the speaker's name (what the delegate paints)
    delegate = window.view.delegate
    metrics = window.view.fontMetrics()
    assert [delegate.header_label(e, metrics, 800) for e in shown] == ["Alice", "Bob", "You"]


# -- C. the smaller things ----------------------------------------------------------------


def test_stop_while_the_prompt_is_read_leaves_no_progress_bar(make_window, qtbot):
    from iris_desktop.core.events import PromptProgress

    runtime = ScriptedRuntime([" ".join(f"w{i}" for i in range(400))], delay_s=0.02)
    window = make_window(runtime)
    window.composer.set_text("A question with a long prompt")
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: window.thread_id is not None and runtime.started.is_set(),
                    timeout=10_000)
    # the model reports how far it has read a long prompt (as llama.cpp does, mid-evaluation)
    window.model.worker.turnEvent.emit(PromptProgress(window.thread_id, 210, 1000, 0, 2.0))
    qtbot.waitUntil(lambda: window.progress.isVisible() and "21%" in window.state_label.text(),
                    timeout=10_000)
    qtbot.mouseClick(window.composer.button, Qt.MouseButton.LeftButton)  # Stop
    qtbot.waitUntil(lambda: not window.generating, timeout=10_000)
    settle(qtbot, window)
    assert not window.progress.isVisible()
    assert window.state_label.text() == "Stopped"


def test_a_background_jobs_count_never_hides_a_turns_state(make_window, qtbot):
    """Re-embedding's count is shown every batch for 10 s, which hid the turn's state
    ("Finding earlier messages…", "Reading the conversation… 21%") for as long as it ran.
    Now a turn's state stays; the latest count waits for the reply's end; a count shown
    before the send gives way to the turn at once and comes back after it unless a later
    one came meanwhile. A message the user caused still shows,
    and a count waits for it to pass."""
    from iris_desktop.core.events import PromptProgress

    runtime = ScriptedRuntime([" ".join(f"w{i}" for i in range(300))], delay_s=0.02)
    window = make_window(runtime)
    area = window.status_area
    window.app_state.show_background("Re-embedding for recall: 32 of 600 messages (x)", 10_000)
    assert area.current_message().startswith("Re-embedding")
    window.composer.set_text("A question")
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: window.thread_id is not None and runtime.started.is_set(),
                    timeout=10_000)
    assert area.current_message() == "" and window.state_label.isVisible()  # gave way
    window.model.worker.turnEvent.emit(PromptProgress(window.thread_id, 210, 1000, 0, 2.0))
    window.app_state.show_background("Re-embedding for recall: 64 of 600 messages (x)", 10_000)
    window.app_state.show_background("Recall now uses x: 600 messages re-embedded", 10_000)
    qtbot.waitUntil(lambda: "21%" in window.state_label.text(), timeout=10_000)
    assert area.current_message() == "" and window.state_label.isVisible()
    window.app_state.show_message("Stop the reply before deleting this chat")
    assert area.current_message() == "Stop the reply before deleting this chat"
    area.end_message()
    qtbot.waitUntil(lambda: not window.generating, timeout=30_000)
    assert area.current_message() == "Recall now uses x: 600 messages re-embedded"  # the latest
    window.app_state.show_message("Copied", 100)  # the user's message: a count waits for it
    window.app_state.show_background("Re-embedding for recall: 96 of 900 messages (y)", 10_000)
    assert area.current_message() == "Copied"
    qtbot.waitUntil(lambda: area.current_message().startswith("Re-embedding"), timeout=2_000)


def test_a_background_message_cut_short_by_a_turn_comes_back_after_it(make_window, qtbot):
    """Seen in the real window with the bundled model: re-embedding ended ("Recall now uses
    …") 30 ms before the user sent, and the turn's state replaced it for good."""
    runtime = ScriptedRuntime(["Miso."], delay_s=0.02)
    window = make_window(runtime)
    done = "Recall now uses all-MiniLM-L6-v2: 344 messages re-embedded"
    window.app_state.show_background(done, 10_000)
    window.composer.set_text("What did Rosa name her kitten?")
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: window.generating, timeout=10_000)
    assert window.status_area.current_message() == ""
    qtbot.waitUntil(lambda: not window.generating, timeout=30_000)
    assert window.status_area.current_message() == done


def test_a_search_hit_on_another_branch_switches_to_it_and_shows_it(make_window, qtbot):
    window = make_window(ScriptedRuntime(["Zebras have stripes.", "Horses run fast."]))
    window.send("Tell me about an animal")
    qtbot.waitUntil(lambda: not window.generating, timeout=10_000)
    settle(qtbot, window)
    reply = next(e for e in window.view.transcript.entries() if e.text == "Zebras have stripes.")
    window.turns.regenerate(reply.message_id)
    qtbot.waitUntil(lambda: not window.generating, timeout=10_000)
    settle(qtbot, window)
    assert "Horses run fast." in [e.text for e in window.view.transcript.entries()]
    window.threads.search.setFocus()
    qtbot.keyClicks(window.threads.search, "zebras")
    qtbot.waitUntil(lambda: window.threads.list.count() >= 1 and window.threads.list.item(0)
                    .data(Qt.ItemDataRole.UserRole + 2) is not None, timeout=5_000)
    hit = window.threads.list.item(0)
    rect = window.threads.list.visualItemRect(hit)
    qtbot.mouseClick(window.threads.list.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    qtbot.waitUntil(lambda: "Zebras have stripes." in [
        e.text for e in window.view.transcript.entries()], timeout=5_000)
    settle(qtbot, window)
    assert window.view.current_entry().text == "Zebras have stripes."  # shown, selected
    assert "Horses run fast." not in [e.text for e in window.view.transcript.entries()]
    assert "Switched to the branch" in window.status_area.current_message()


def test_appearance_applies_at_once_and_cancel_takes_it_back(make_window, qtbot, qapp):
    window = make_window()
    system = qapp.palette().color(qapp.palette().ColorRole.Window).lightness()
    size = qapp.font().pointSize()
    dialog = open_preferences(window, qtbot)
    theme = dialog.fields["ui.theme"].editor.combo
    theme.setCurrentText("dark")  # chosen, not applied
    dialog.fields["ui.font_size"].editor.set_value(18)
    qtbot.waitUntil(lambda: qapp.palette().color(qapp.palette().ColorRole.Window).lightness() < 80
                    and qapp.font().pointSize() == 18, timeout=5_000)
    assert window.app_state.settings["ui.theme"] == "system"  # nothing written yet
    cancel = dialog.buttons.button(dialog.buttons.StandardButton.Cancel)
    qtbot.mouseClick(cancel, Qt.MouseButton.LeftButton)  # asks first (it discarded at once)
    box = dialog.discard_box
    assert box is not None and box.isVisible() and "Preferences" in box.text()
    qtbot.mouseClick(next(b for b in box.buttons() if b.text() == "Keep editing"),
                     Qt.MouseButton.LeftButton)
    assert dialog.isVisible() and qapp.font().pointSize() == 18
    assert dialog.fields["ui.theme"].editor.combo.currentText() == "dark"
    qtbot.keyClick(dialog, Qt.Key.Key_Escape)  # Escape asks too; Discard takes the look back
    box = dialog.discard_box
    assert box is not None and box.isVisible()
    qtbot.mouseClick(next(b for b in box.buttons() if b.text() == "Discard"),
                     Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: qapp.font().pointSize() == size, timeout=5_000)
    assert not dialog.isVisible() and window.app_state.settings["ui.theme"] == "system"
    assert qapp.palette().color(qapp.palette().ColorRole.Window).lightness() == system
    dialog = open_preferences(window, qtbot)  # nothing changed: Cancel closes at once
    qtbot.mouseClick(dialog.buttons.button(dialog.buttons.StandardButton.Cancel),
                     Qt.MouseButton.LeftButton)
    assert not dialog.isVisible() and dialog.discard_box is None
    # chosen and kept with OK
    dialog = open_preferences(window, qtbot)
    dialog.fields["ui.theme"].editor.combo.setCurrentText("dark")
    qtbot.mouseClick(dialog.ok_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not dialog.isVisible(), timeout=5_000)
    assert window.app_state.settings["ui.theme"] == "dark"
    assert qapp.palette().color(qapp.palette().ColorRole.Window).lightness() < 80


def type_into(qtbot, spin, text: str) -> None:
    spin.setFocus()
    spin.selectAll()
    qtbot.keyClicks(spin, text)
    qtbot.keyClick(spin, Qt.Key.Key_Tab)  # focus leaves: a plain spin box would "fix" it here


def test_out_of_range_values_are_kept_and_marked_not_replaced(make_window, qtbot):
    window = make_window()
    dialog = open_preferences(window, qtbot)
    window_field = dialog.fields["context.window"]
    type_into(qtbot, window_field.editor.spin, "100")
    assert window_field.editor.spin.value() == 100  # not auto
    assert window_field.error.isVisible() and "512" in window_field.error.text()
    assert not dialog.ok_button.isEnabled()
    ratio = dialog.fields["context.token_budget_ratio"]
    type_into(qtbot, ratio.editor.spin, "0.99")
    assert ratio.editor.spin.value() == pytest.approx(0.99)  # not 0.95
    assert ratio.error.isVisible() and "0.95" in ratio.error.text()
    type_into(qtbot, window_field.editor.spin, "4096")
    type_into(qtbot, ratio.editor.spin, "0.8")
    assert not window_field.error.isVisible() and not ratio.error.isVisible()
    assert dialog.ok_button.isEnabled()
    assert ratio.editor.slider.value() == 80
    # the arrows stay inside the range: up from the largest value goes nowhere
    ratio.editor.set_value(0.95)
    qtbot.keyClick(ratio.editor.spin, Qt.Key.Key_Up)
    assert ratio.editor.spin.value() == pytest.approx(0.95)
    window_field.editor.set_value("auto")
    qtbot.keyClick(window_field.editor.spin, Qt.Key.Key_Up)
    assert window_field.editor.raw() == "512"


def test_the_cache_says_how_many_tokens_it_restored_and_reused(make_window, qtbot):
    from iris_desktop.core.events import CacheStatus

    window = make_window()
    worker = window.model.worker
    worker.cacheEvent.emit(CacheStatus(1, "restored", 870))
    qtbot.waitUntil(lambda: "870" in window.state_label.text(), timeout=2_000)
    assert window.state_label.text() != "Restored from cache"
    worker.cacheEvent.emit(CacheStatus(1, "prefilling", 4, 879, 4, 0.0))
    worker.cacheEvent.emit(CacheStatus(1, "prefilling", 879, 879, 4, 0.5))
    worker.cacheEvent.emit(CacheStatus(1, "prefilled"))
    qtbot.waitUntil(lambda: window.state_label.text().startswith("Prefilled"), timeout=2_000)
    assert "4 of 879" in window.state_label.text()


@pytest.mark.parametrize("name", ["open-log", "open-data-folder"])
def test_help_says_where_the_log_and_data_are_without_a_launcher(make_window, qtbot, qapp, name):
    window = make_window()  # offscreen: no desktop application opens anything
    window.menus.actions[name].trigger()
    box = window.menus.path_box
    qtbot.waitUntil(lambda: box is not None and box.isVisible(), timeout=5_000)
    paths = window.host.paths
    where = str(paths.log_path if name == "open-log" else paths.data_dir)
    assert where in box.text()
    assert box.textInteractionFlags() & Qt.TextInteractionFlag.TextSelectableByMouse
    copy = next(b for b in box.buttons() if b.text() == "Copy the path")
    qtbot.mouseClick(copy, Qt.MouseButton.LeftButton)
    assert qapp.clipboard().text() == where


def test_the_budget_breakdown_adds_up_to_the_meter(make_window, qtbot, data_dir):
    import re

    thread = seed_thread(data_dir, [{"role": "user", "content": "hello " * 50},
                                    {"role": "assistant", "content": "hi " * 40}])
    window = make_window()
    window.open_thread(thread)
    settle(qtbot, window)
    window.composer.set_text("a draft of a few words")
    dialog = open_preferences(window, qtbot)
    qtbot.waitUntil(lambda: dialog.last_preview is not None
                    and dialog.last_preview.breakdown.draft > 0, timeout=5_000)
    first = dialog.breakdown.text().splitlines()[0]
    parts, total = first.split(": ", 1)[1].split(" = ")
    numbers = [int(n.replace(",", "")) for n in re.findall(r"[a-z]+ ([\d,]+)", parts)]
    used = int(total.split(" of ")[0].replace(",", ""))
    assert sum(numbers) == used == dialog.meter.breakdown["used"]
    assert "draft" in parts
    # under the pages that spend the window's tokens only (it showed under Appearance too)
    shown = {}
    for index, section in enumerate(dialog.sections):
        dialog.tabs.setCurrentIndex(index)
        shown[section] = dialog.budget_box.isVisible()
    assert {s for s, visible in shown.items() if visible} == {"context", "model", "tools", "chat"}
    assert not shown["ui"] and not shown["storage"] and not shown["models"]


def test_the_inspectors_recall_row_names_its_messages(make_window, qtbot, data_dir):
    turns = []
    for i in range(6):
        turns += [{"role": "user", "content": f"question {i} about topic{i} " + "word " * 20},
                  {"role": "assistant", "content": f"answer {i} on topic{i} " + "word " * 20}]
    thread = seed_thread(data_dir, turns)
    with Store(db_path(data_dir)) as store:
        ids = [r["id"] for r in store.messages(thread)]
        store.add_summary(thread, {
            "prev_id": None, "first_message_id": ids[0], "covers_through_id": ids[3],
            "first_turn": 1, "last_turn": 2, "fields": {"topics": "early"}, "text": "x",
            "tokens": 30, "counter": "heuristic", "path": "extractive"})
    window = make_window()
    window.open_thread(thread)
    window.inspector.toggleViewAction().trigger()  # View ▸ Context inspector
    window.composer.set_text("What was question 1 about topic1?")
    qtbot.waitUntil(lambda: bool((window.inspector.report or {}).get("recalled")),
                    timeout=10_000)
    settle(qtbot, window)
    dock = window.inspector
    recalled = dock.report["recalled"]
    table = dock.request_table
    row = next(r for r in range(table.rowCount()) if table.item(r, 3).text() == "recalled")
    content = table.item(row, 5)
    for message in recalled:
        assert f"#{message['id']}" in content.text() and message["preview"] in content.toolTip()
        assert f"#{message['id']} {message['speaker']}" in dock.request_label.text()
    assert any("topic1" in m["preview"] for m in recalled)


def test_the_chart_axis_and_the_tab_names_are_never_cut(make_window, qtbot, qapp, data_dir):
    thread = seed_thread(data_dir, [{"role": "user", "content": "hello"},
                                    {"role": "assistant", "content": "hi"}])
    with Store(db_path(data_dir)) as store:
        store.add_request(thread, {"prompt_tokens": 700_000, "window": 1_048_576})
        store.add_request(thread, {"prompt_tokens": 320, "window": 1_048_576})
    window = make_window(overrides={"ui.font_size": "20"})
    window.open_thread(thread)
    window.inspector.toggleViewAction().trigger()
    qtbot.waitUntil(lambda: window.inspector.report is not None, timeout=5_000)
    window.resizeDocks([window.inspector], [260], Qt.Orientation.Horizontal)
    qtbot.wait(50)
    dock = window.inspector
    bar = dock.tabs.tabBar()
    for i in range(bar.count()):
        text = bar.tabText(i)
        assert text in ("Next request", "Summaries", "Compactions")
        assert bar.tabRect(i).width() >= bar.fontMetrics().horizontalAdvance(text), text
    chart = dock.chart
    regions = chart.regions()
    for text, rect in regions["labels"]:
        assert rect.right() <= regions["plot"].left()  # left of the axis, never over it
        assert rect.width() >= chart.fontMetrics().horizontalAdvance(text), text
        assert rect.top() >= 0 and rect.bottom() <= chart.height()
    assert regions["labels"][0][0] == "1,048,576"
    assert "compaction" in dock.chart_label.text()  # the legend, under the chart
    # the system message named apart ("3 messages" beside "2 verbatim" read as a miscount)
    assert dock.request_label.text().startswith("Next request: the system prompt and "), dock.request_label.text()
    assert "-token window (" in dock.request_label.text()
    # one style per meaning: solid red as on the meter, where dashed is the budget
    assert "The red line: the meter's red line (compaction is due" in dock.chart_label.text()
    assert "Dashed" not in dock.chart_label.text()
    assert not dock.chart_label.geometry().intersects(chart.geometry())


def test_the_unsent_draft_survives_a_crash_and_a_change_of_chat(qtbot, data_dir):
    first = seed_thread(data_dir, [{"role": "user", "content": "one"}], title="first")
    second = seed_thread(data_dir, [{"role": "user", "content": "two"}], title="second")
    window, host = window_on(qtbot, data_dir)
    window.open_thread(first)
    settle(qtbot, window)
    window.composer.edit.setFocus()
    qtbot.keyClicks(window.composer.edit, "half a thought about Lisbon")
    window.open_thread(second)  # another chat: an empty box of its own
    settle(qtbot, window)
    assert window.composer.text() == ""
    window.open_thread(first)
    settle(qtbot, window)
    assert window.composer.text() == "half a thought about Lisbon"
    qtbot.keyClicks(window.composer.edit, " and Porto")
    qtbot.wait(600)  # a pause in typing: written to disk, before any orderly exit
    settle(qtbot, window)
    with Store(db_path(data_dir)) as other:  # in the history, as another process reads it
        assert other.draft(first) == "half a thought about Lisbon and Porto"
    # the crash: nothing closes in order; a new window on the same folder brings it back
    window.model.close()
    window.background.close()
    window._closed = True
    host.close()
    again, host = window_on(qtbot, data_dir)
    try:
        qtbot.waitUntil(lambda: again.thread_id == first, timeout=10_000)
        qtbot.waitUntil(lambda: again.composer.text() == "half a thought about Lisbon and Porto",
                        timeout=5_000)
    finally:
        again.shutdown()
        host.close()


def test_a_draft_is_private_and_goes_with_its_chat_whoever_deletes_it(qtbot, data_dir):
    """Before (a privacy audit): drafts lived in ui-state.ini, in plain text even with the
    history encrypted, the file 0644; `iris-desktop delete` left the deleted chat's draft
    there, and a new chat given the same id showed it in its box, ready to be sent. Now
    drafts are in the history: a delete anywhere takes the draft, no file keeps its
    text, and drafts an older version left in ui-state.ini move into the history."""
    import os
    import stat

    from PySide6.QtCore import QSettings

    first = seed_thread(data_dir, [{"role": "user", "content": "one"}], title="first")
    state = QSettings(str(data_dir / "ui-state.ini"), QSettings.Format.IniFormat)
    state.setValue(f"drafts/{first}", "an old draft, kept by an older version")
    state.sync()
    os.chmod(data_dir / "ui-state.ini", 0o644)

    window, host = window_on(qtbot, data_dir)
    try:
        window.open_thread(first)
        qtbot.waitUntil(lambda: window.composer.text() == "an old draft, kept by an older "
                        "version", timeout=5_000)  # moved into the history
        window.composer.set_text("my lawyer said ZQXDRAFT about the house")
        qtbot.wait(600)
        settle(qtbot, window)
    finally:
        window.shutdown()
        host.close()
    assert stat.S_IMODE(os.stat(data_dir / "ui-state.ini").st_mode) == 0o600
    assert "drafts" not in QSettings(str(data_dir / "ui-state.ini"),
                                     QSettings.Format.IniFormat).childGroups()
    with Store(db_path(data_dir)) as store:
        assert store.draft(first) == "my lawyer said ZQXDRAFT about the house"
    with Host(data_dir, {}) as other:  # `iris-desktop delete`, then `chat --new`
        other.delete_thread(first)
        # as an older Iris did: the new chat given the deleted one's id (Iris gives a
        # deleted chat's id to no other now, test_thread_identity.py; its drafts still
        # go with it, for histories where an older Iris gave ids again)
        other.store.conn.execute("DELETE FROM id_marks")
        reused = other.store.create_thread("groceries")
        other.store.add_messages(reused, [{"role": "user", "content": "milk"}])
    assert reused == first
    leaks = [p.name for p in data_dir.rglob("*") if p.is_file() and b"ZQXDRAFT" in p.read_bytes()]
    assert leaks == []
    window, host = window_on(qtbot, data_dir)
    try:
        window.open_thread(reused)
        settle(qtbot, window)
        qtbot.wait(100)
        assert window.composer.text() == ""
    finally:
        window.shutdown()
        host.close()


def test_the_export_proposes_the_chats_title_as_its_file_name(make_window, qtbot, data_dir):
    thread = seed_thread(data_dir, [{"role": "user", "content": "hello"},
                                    {"role": "assistant", "content": "hi"}],
                         title='Plans: trip/"Lisbon" 2026?')
    window = make_window()
    window.open_thread(thread)
    settle(qtbot, window)
    window.menus.actions["export"].trigger()  # File ▸ Export chat…
    qtbot.waitUntil(lambda: window.threads_control.export_box is not None
                    and window.threads_control.export_box.isVisible(), timeout=5_000)
    box = window.threads_control.export_box
    proposed = box.selectedFiles()[0]
    assert proposed.rsplit("/", 1)[-1] == "Plans trip Lisbon 2026.md"
    target = data_dir.parent / "exported.md"
    name = box.findChild(QLineEdit, "fileNameEdit")  # typed where the name is asked
    name.selectAll()
    qtbot.keyClicks(name, str(target))
    qtbot.keyClick(name, Qt.Key.Key_Return)
    qtbot.waitUntil(target.exists, timeout=5_000)
    assert "hello" in target.read_text(encoding="utf-8")


# -- C. the first question in a long chat waits for its summary: said, and Stop explained --


@pytest.mark.parametrize("stop", [False, True])
def test_a_send_that_waits_for_a_summary_says_so_in_the_transcript(qtbot, data_dir, stop):
    """Before: the first question in a long imported chat showed only the user's message
    for minutes (the status bar, cut short, said "Summarizing… 71%"), and Stop left the
    chat summarized by extraction without a word. Now a notice under the message says why
    there is no answer yet and what Stop does; when the summary is done it says what
    happened, in words, and after Stop that Iris summarized the turns itself."""
    from support.helpers import llm_json

    turns = [m for n in range(60) for m in (
        {"role": "user", "content": f"On {n + 1} May I met Maria and bought {n + 3} books. "
                                    + "We walked along the river for hours. " * 20},
        {"role": "assistant", "content": f"{n + 3} books, lovely. "
                                         + "Walking by the river sounds wonderful. " * 20})]
    thread = seed_thread(data_dir, turns, title="long")
    def reply(messages):  # a summary for the summarizer's prompt, else the answer
        summarizing = "running summary" in messages[0]["content"]
        return llm_json(words=400 if stop else 60) if summarizing else "Sixty-two."

    runtime = ScriptedRuntime([reply] * 6, delay_s=0.02 if stop else 0.0)
    host = Host(data_dir, {"context.recall_semantic": "false", "context.window": "8192"},
                runtime=runtime, compact=True)
    window = main_window(host)
    qtbot.addWidget(window)
    window.show()
    try:
        qtbot.waitUntil(lambda: window.model_state == "ready", timeout=10_000)
        window.open_thread(thread)
        settle(qtbot, window)
        window.send("How many books did I buy on 60 May?")

        def notices():
            return [e.text for e in window.view.transcript.entries() if e.kind == "notice"]

        qtbot.waitUntil(lambda: any("Summarizing earlier turns" in t for t in notices()),
                        timeout=10_000)
        waiting = notices()[-1]
        assert "the answer starts after it" in waiting and "Stop skips the model" in waiting
        # said to a screen reader too, once (a wait of minutes was silent: an audit)
        assert [t for t, _ in window.announcer.announced if t == waiting] == [waiting]
        rows = window.view.transcript.entries()
        assert rows[-1].kind == "notice" and rows[-2].role == "user"  # under the question
        assert not rows[-1].error  # a note, not painted as "Iris could not answer"
        shown_after_stop: list[str] = []
        if stop:
            qtbot.waitUntil(lambda: window.turns.compacting, timeout=10_000)
            window.app_state.statusText.connect(shown_after_stop.append)
            window.app_state.busyChanged.connect(lambda text, _f: shown_after_stop.append(text))
            window.turns.stop()
        qtbot.waitUntil(lambda: not window.generating, timeout=30_000)
        # after Stop the status bar never says the model reads or writes (it said "part 1
        # of 2: the model writes this part's summary…" for a call the Stop had cancelled)
        assert not any("model" in t and "without the model" not in t
                       for t in shown_after_stop if t), shown_after_stop
        settle(qtbot, window)
        said = [t for t in notices() if "turns 1–" in t.lower()]
        assert len(said) == 1 and not any("Summarizing earlier" in t for t in notices())
        if stop:
            assert said[0].startswith("Iris summarized turns 1–") and "you pressed Stop" in said[0]
            # the reply stopped before its first word says so and how to get the answer
            view, model = window.view, window.view.transcript
            last = model.index(model.rowCount() - 1)
            stopped = last.data(ENTRY_ROLE)
            assert stopped.role == "assistant" and stopped.text == "" and stopped.can_regenerate
            shown = view.delegate._doc(stopped, 600).toPlainText()
            assert shown.startswith("Stopped before Iris began to answer. To have it answer, "
                                    "click Regenerate on this card (or right-click it).")
            assert "Stopped before Iris began" in last.data(Qt.ItemDataRole.AccessibleTextRole)
            menu = view.context_menu(last)
            next(a for a in menu.actions() if a.text() == "Regenerate").trigger()
            qtbot.waitUntil(lambda: any(e.text == "Sixty-two."
                                        for e in model.entries()), timeout=20_000)
            qtbot.waitUntil(lambda: not window.generating, timeout=20_000)
        else:
            assert " are summarized now, in " in said[0] and "recall can bring them back" in said[0]
            assert any(e.text == "Sixty-two." for e in window.view.transcript.entries())
        assert "→" not in said[0] and "(budget" not in said[0]
    finally:
        window.shutdown()
        host.close()
