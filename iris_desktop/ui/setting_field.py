"""One Preferences field: the editor for one Setting (``settings_editors``), its label and
key, its help text, and its error (said to a screen reader when the field becomes
invalid, and again, politely, when typing pauses on another error: before, each keystroke
of "100" said a new error, assertively, cutting off the echo of the typing)."""

from __future__ import annotations

import html
from typing import Any

from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtGui import QFont, QPalette
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from iris_desktop.core.views import field_hint, field_label
from iris_desktop.settings import Setting
from iris_desktop.ui.accessibility import announce, control_name, keyboard_controls
from iris_desktop.ui.settings_editors import make_editor

#: how long typing must pause before a changed error is said again
SAY_AGAIN_MS = 1500


class SettingField(QWidget):
    """The editor for one Setting (``settings_editors``), its help text, and its error."""

    changed = Signal()

    def __init__(self, setting: Setting, value: Any, locked: str | None, parent=None):
        super().__init__(parent)
        self.setting = setting
        self.locked = locked
        self.setObjectName(setting.key)
        #: the plain-language label, and the key (what the file, the CLI and the
        #: environment call it) on a smaller line under it
        self.title = QLabel(f"<b>{html.escape(setting.label or field_label(setting))}</b>")
        self.title.setWordWrap(True)  # at 24 pt a long label wraps rather than widen the page
        self.key_label = QLabel(setting.key)
        self.key_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.key_label.setToolTip(f"In the settings file, the command line "
                                  f"(config set {setting.key}) and {setting.env_var}")
        self.error = QLabel()
        self.error.setWordWrap(True)
        self.error.setStyleSheet("color: #c0392b;")
        self.error.hide()
        self._said = ""  # the error last said to a screen reader
        self._say_later = QTimer(self, singleShot=True, interval=SAY_AGAIN_MS)
        self._say_later.timeout.connect(lambda: self._say(assertive=False))
        hint = QLabel(locked or field_hint(setting))
        hint.setWordWrap(True)
        if locked:
            hint.setStyleSheet("color: #b9770e;")
        self.hint = hint
        #: a note on how this value sits with others (not an error: it stays valid)
        self.note = QLabel()
        self.note.setObjectName("setting-note")
        self.note.setWordWrap(True)
        self.note.hide()
        self.controls: list[QWidget] = []
        self.editor = make_editor(setting, value)
        self.editor.changed.connect(self.changed)
        self.editor.noteChanged.connect(self._describe)
        # each control says which setting it is; the help is its description
        label = setting.label or field_label(setting)
        controls = self.controls = keyboard_controls(self.editor)
        for control in controls:
            control.setAccessibleName(control_name(control, label))
        self._describe()
        if controls:
            self.title.setBuddy(controls[0])
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 4, 0, 8)
        layout.setSpacing(2)
        layout.addWidget(self.title)
        layout.addWidget(self.key_label)
        layout.addWidget(self.editor)
        layout.addWidget(hint)
        layout.addWidget(self.note)
        layout.addWidget(self.error)
        if locked:
            self.editor.setEnabled(False)
            self.editor.setToolTip(locked)
        self._style_secondary()

    def _style_secondary(self) -> None:
        """Secondary text (the key, the help): smaller, and dimmed from the palette, so
        that it follows the theme and the text size, also when they change while the
        dialog is open."""
        small = QFont(self.font())
        small.setPointSizeF(small.pointSizeF() * 0.9)
        for label in (self.key_label, self.hint, self.note):
            label.setFont(small)
            if label is self.hint and self.locked:
                continue  # its own colour
            pal = QPalette(self.palette())
            text = pal.color(QPalette.ColorRole.WindowText)
            text.setAlphaF(0.72)
            pal.setColor(QPalette.ColorRole.WindowText, text)
            label.setPalette(pal)

    def changeEvent(self, event) -> None:
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.FontChange):
            self._style_secondary()
        super().changeEvent(event)

    def raw(self) -> Any:
        """The field's value as Setting.parse takes it."""
        return self.editor.raw()

    def set_value(self, value: Any) -> None:
        self.editor.set_value(value)

    def set_error(self, message: str | None) -> None:
        """``message`` under the field, as its controls' description; said, with the
        field's label, when the field becomes invalid, and once typing pauses when the
        error changed (the typed value is part of it)."""
        was_valid = not self.error.text()
        self.error.setText(message or "")
        if not message:
            self._said = ""
            self._say_later.stop()
        elif was_valid:
            self._say(assertive=True)
        elif message != self._said:
            self._say_later.start()
        self.error.setVisible(bool(message))
        self.editor.set_invalid(bool(message))
        self._describe()

    def set_note(self, text: str) -> None:
        """``text`` under the help ('' for none): how the value sits with other values."""
        if text != self.note.text():
            self.note.setText(text)
            self.note.setVisible(bool(text))
            self._describe()

    def _describe(self) -> None:
        """Each control's description: its error, else the help (or why it is locked)
        and what the editor notes (a ratio's figure in tokens)."""
        text = self.error.text() or " ".join(
            part for part in (self.locked or self.hint.text(), self.editor.note(),
                              self.note.text()) if part)
        for control in self.controls:
            control.setAccessibleDescription(text)

    def _say(self, assertive: bool) -> None:
        """The error, said with the field's label (the message names only its key)."""
        message = self.error.text()
        if not message or message == self._said or not self.isVisible():
            return
        self._said = message
        label = self.setting.label or field_label(self.setting)
        key = f"{self.setting.key}: "
        announce(self, f"{label}: {message.removeprefix(key)}", assertive=assertive)
