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
from PySide6.QtWidgets import QScrollArea  # noqa: E402

from iris_desktop.core.events import CompactionEvent, CompactionFinished  # noqa: E402
from iris_desktop.core.store import Store  # noqa: E402
from iris_desktop.host import Host  # noqa: E402
from iris_desktop.paths import app_paths  # noqa: E402
from iris_desktop.ui.main_window import main_window  # noqa: E402
from iris_desktop.ui.status_line import ELLIPSIS  # noqa: E402
from iris_desktop.ui.theme import apply_appearance  # noqa: E402

from fakes import ScriptedRuntime  # noqa: E402

#: what the status bar says when the circuit breaker stops compaction (a long sentence)
BREAKER = CompactionEvent(
    "tokens", "skipped", error="circuit breaker open: the last 3 compactions failed; it tries "
    "again after 5 more turns or 10 minutes, or now with Compact now ('iris-desktop compact')")


@pytest.fixture(autouse=True)
def system_look_after(qapp):
    """The application's look and text size are process-wide: every test leaves the
    system's."""
    yield
    apply_appearance(qapp, "system", 0)


@pytest.fixture
def data_dir(tmp_path):
    return tmp_path / "data"


@pytest.fixture
def make_window(qtbot, data_dir):
    """The main window on a fresh data folder with a scripted runtime (no model file)."""
    made = []

    def make(runtime=None, overrides=None):
        overrides = {"context.recall_semantic": "false", **(overrides or {})}
        host = Host(data_dir, overrides, runtime=runtime or ScriptedRuntime([]), compact=False)
        window = main_window(host)
        qtbot.addWidget(window)
        window.show()
        made.append((window, host))
        qtbot.waitUntil(lambda: window.model_state == "ready", timeout=10_000)
        settle(qtbot, window)
        return window

    yield make
    for window, host in made:
        window.shutdown()
        host.close()


def settle(qtbot, window) -> None:
    qtbot.waitUntil(lambda: window.background.idle, timeout=10_000)
    qtbot.wait(20)
    qtbot.waitUntil(lambda: window.background.idle, timeout=10_000)


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
    # every page scrolls: its last control can be brought into view
    for page in range(dialog.tabs.count()):
        dialog.tabs.setCurrentIndex(page)
        scroll = dialog.tabs.widget(page)
        assert isinstance(scroll, QScrollArea)
        restore = scroll.widget().findChildren(type(dialog.ok_button))[-1]
        scroll.ensureWidgetVisible(restore)
        qtbot.wait(10)
        assert global_rect(scroll.viewport()).contains(global_rect(restore)), dialog.tabs.tabText(page)


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


def test_a_long_status_sentence_is_elided_at_a_word_and_never_reaches_the_meter(make_window, qtbot):
    window = make_window()
    window.resize(760, window.height())
    qtbot.wait(50)
    thread = window.thread_id if window.thread_id is not None else -1
    window.model.worker.turnEvent.emit(CompactionFinished(thread, BREAKER))
    qtbot.waitUntil(lambda: "circuit breaker" in window.state_label.text(), timeout=5_000)
    qtbot.wait(50)
    full = BREAKER.describe()
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
