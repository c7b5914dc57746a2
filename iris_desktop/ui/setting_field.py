"""One Preferences field: the editor for one Setting (``settings_editors``), its label and
key, its help text, and its error (said to a screen reader when new)."""

from __future__ import annotations

import html
from typing import Any

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtGui import QFont, QPalette
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from iris_desktop.core.views import field_hint, field_label
from iris_desktop.settings import Setting
from iris_desktop.ui.accessibility import announce, control_name, keyboard_controls
from iris_desktop.ui.settings_editors import make_editor


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
        hint = QLabel(locked or field_hint(setting))
        hint.setWordWrap(True)
        if locked:
            hint.setStyleSheet("color: #b9770e;")
        self.hint = hint
        self.editor = make_editor(setting, value)
        self.editor.changed.connect(self.changed)
        # each control says which setting it is; the help is its description
        label = setting.label or field_label(setting)
        controls = self.controls = keyboard_controls(self.editor)
        for control in controls:
            control.setAccessibleName(control_name(control, label))
            control.setAccessibleDescription(locked or field_hint(setting))
        if controls:
            self.title.setBuddy(controls[0])
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 4, 0, 8)
        layout.setSpacing(2)
        layout.addWidget(self.title)
        layout.addWidget(self.key_label)
        layout.addWidget(self.editor)
        layout.addWidget(hint)
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
        for label in (self.key_label, self.hint):
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
        """``message`` under the field, as its controls' description, and said when new."""
        if message and message != self.error.text() and self.isVisible():
            announce(self, message, assertive=True)
        self.error.setText(message or "")
        self.error.setVisible(bool(message))
        self.editor.set_invalid(bool(message))
        for control in self.controls:
            control.setAccessibleDescription(message or self.locked or self.hint.text())
