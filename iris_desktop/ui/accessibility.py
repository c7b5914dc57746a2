"""Accessibility: every control the keyboard reaches has a name a screen reader says
(its role is the one Qt gives its kind: button, spin box, list, …), and what happens
while nobody clicks (a reply finished, an error, a compaction) is announced.

``name_controls(root)`` names what a screen reader would find nameless (a field with no
label of its own, a button with only an arrow) from what it shows (its placeholder, its
tooltip); a button's own text is its name already, and follows it when it changes.
Widgets whose text says too little are named where they are made.

``announce`` uses ``QAccessibleAnnouncementEvent`` (Qt 6.8 and later); on an older Qt
it renames a live status label and raises NameChanged, which screen readers read out."""

from __future__ import annotations

from PySide6.QtCore import QObject, Qt
from PySide6.QtGui import QAccessible, QAccessibleEvent
from PySide6.QtWidgets import (
    QAbstractButton,
    QCheckBox,
    QComboBox,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSlider,
    QTabBar,
    QTextEdit,
    QWidget,
)

from iris_desktop.core.events import (
    CompactionFinished,
    ReplySaved,
    TurnEvent,
    TurnFailed,
)

try:  # Qt 6.8 and later
    from PySide6.QtGui import QAccessibleAnnouncementEvent
except ImportError:  # pragma: no cover - Qt 6.7
    QAccessibleAnnouncementEvent = None

#: what a tab bar's scroll buttons are for
_SCROLL_BUTTONS = {"ScrollLeftButton": "Scroll the tabs left",
                   "ScrollRightButton": "Scroll the tabs right"}
#: at most this much of a reply is read out when it is finished
SPOKEN_REPLY = 200


def name(widget: QWidget, text: str, description: str | None = None) -> QWidget:
    """Give ``widget`` the accessible name ``text`` (and a description); returns it."""
    widget.setAccessibleName(text)
    if description is not None:
        widget.setAccessibleDescription(description)
    return widget


def keyboard_controls(root: QWidget) -> list[QWidget]:
    """The widgets of ``root`` the Tab key reaches: a widget standing in for another
    (a focus proxy) and the inner parts of a spin box or a combo box are left out (the
    box itself is the control)."""
    found = []
    for widget in [root, *root.findChildren(QWidget)]:
        if not widget.focusPolicy() & Qt.FocusPolicy.TabFocus or widget.focusProxy() is not None:
            continue
        parent, inner = widget.parentWidget(), False
        while parent is not None and parent is not root.parentWidget():
            if isinstance(parent, QComboBox) or parent.inherits("QAbstractSpinBox"):
                inner = True
                break
            parent = parent.parentWidget()
        if not inner:
            found.append(widget)
    return found


def shown_name(widget: QWidget) -> str:
    """A name from what ``widget`` shows: a button's text, a field's placeholder, the
    first line of its tooltip, its window title; '' when it shows none."""
    text = ""
    if isinstance(widget, QAbstractButton):
        text = widget.text() or _SCROLL_BUTTONS.get(widget.objectName(), "")
    elif isinstance(widget, (QLineEdit, QPlainTextEdit, QTextEdit)):
        text = widget.placeholderText()
    text = text or widget.toolTip().split("\n", 1)[0] or widget.windowTitle()
    return " ".join(text.replace("&&", "\0").replace("&", "").replace("\0", "&")
                    .rstrip("…").split())


def spoken_name(widget: QWidget) -> str:
    """The name assistive technology gets for ``widget`` (its own, its text, its label)."""
    iface = QAccessible.queryAccessibleInterface(widget)
    return iface.text(QAccessible.Text.Name).strip() if iface is not None else ""


def name_controls(root: QWidget) -> list[QWidget]:
    """Name every keyboard control of ``root`` that a screen reader would find nameless,
    from what it shows; returns the ones that still have none (a bug: name them where
    they are made)."""
    left = []
    for widget in keyboard_controls(root):
        if spoken_name(widget):
            continue
        widget.setAccessibleName("Pages" if isinstance(widget, QTabBar) else shown_name(widget))
        if not spoken_name(widget):
            left.append(widget)
    return left


def announce(widget: QWidget, text: str, assertive: bool = False) -> None:
    """Have screen readers say ``text`` now (``assertive``: interrupting what they say,
    for an error), on behalf of ``widget``."""
    if QAccessibleAnnouncementEvent is not None:
        event = QAccessibleAnnouncementEvent(widget, text)
        event.setPoliteness(QAccessible.AnnouncementPoliteness.Assertive if assertive
                            else QAccessible.AnnouncementPoliteness.Polite)
        QAccessible.updateAccessibility(event)
        return
    widget.setAccessibleName(text)  # pragma: no cover - Qt 6.7: a live label renamed
    QAccessible.updateAccessibility(QAccessibleEvent(widget, QAccessible.Event.NameChanged))


class Announcer(QObject):
    """Announces, on behalf of ``widget`` (the status line), a finished or stopped reply
    (with its first words), a turn that failed (assertively) and a compaction's outcome.
    ``announced`` keeps what was said: (text, assertive)."""

    def __init__(self, widget: QWidget, parent: QObject | None = None):
        super().__init__(parent)
        self.widget = widget
        self.announced: list[tuple[str, bool]] = []

    def on_event(self, event: TurnEvent) -> None:
        if isinstance(event, ReplySaved) and not event.tool_calls:
            start = " ".join(event.text.split())
            start = start if len(start) <= SPOKEN_REPLY else start[:SPOKEN_REPLY - 1] + "…"
            said = "Iris replied" if event.status == "complete" else "The reply stopped"
            self.say(f"{said}: {start}" if start else said)
        elif isinstance(event, TurnFailed):
            self.say(f"Iris could not answer: {event.text}", assertive=True)
        elif isinstance(event, CompactionFinished):
            self.say(event.event.plain())

    def say(self, text: str, assertive: bool = False) -> None:
        self.announced.append((text, assertive))
        announce(self.widget, text, assertive)


def control_name(control: QWidget, label: str) -> str:
    """A setting's control, named for a screen reader: the setting's label, and for a
    slider, a check box of a list or a button, what it is besides."""
    if isinstance(control, QSlider):
        return f"{label} (slider)"
    if isinstance(control, QCheckBox) and control.text() != "Enabled":
        return f"{label}: {control.text()}"
    if isinstance(control, QPushButton):
        return f"{control.text().rstrip('…')} ({label})"
    return label
