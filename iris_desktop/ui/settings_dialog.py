"""Preferences, generated from ``settings.SETTINGS``: one page per section, one field per
key. A key added to SETTINGS gets a field here with no change to this file.

Every edit is parsed with ``Setting.parse``; a bad value is marked at its field with
SettingsError's message and OK is disabled. Under the pages, a live breakdown shows what
the candidate values do to the current thread's next request, before anything is applied.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QFont, QPalette
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from iris_desktop.core.views import (
    BudgetPreview,
    changed_keys,
    field_hint,
    field_label,
    locked_reason,
    parse_fields,
    settings_sections,
)
from iris_desktop.settings import BUNDLED, SETTINGS, Setting, Settings, write_config_value
from iris_desktop.ui.meter import BudgetMeter


class SettingField(QWidget):
    """The editor for one Setting, its help text, and its error (if any)."""

    changed = Signal()

    def __init__(self, setting: Setting, value: Any, locked: str | None, parent=None):
        super().__init__(parent)
        self.setting = setting
        self.locked = locked
        self.setObjectName(setting.key)
        title = QLabel(f"<b>{field_label(setting)}</b> <span style='color:gray'>{setting.key}</span>")
        self.error = QLabel()
        self.error.setWordWrap(True)
        self.error.setStyleSheet("color: #c0392b;")
        self.error.hide()
        hint = QLabel(locked or field_hint(setting))
        hint.setWordWrap(True)
        small = QFont(hint.font())
        small.setPointSizeF(small.pointSizeF() * 0.9)
        hint.setFont(small)
        if locked:
            hint.setStyleSheet("color: #b9770e;")
        else:
            # secondary text, from the palette so that it follows light and dark themes
            pal = hint.palette()
            text = pal.color(QPalette.ColorRole.WindowText)
            text.setAlphaF(0.72)
            pal.setColor(QPalette.ColorRole.WindowText, text)
            hint.setPalette(pal)
        self.hint = hint
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 4, 0, 8)
        layout.setSpacing(2)
        layout.addWidget(title)
        layout.addWidget(self._make_editor(value))
        layout.addWidget(hint)
        layout.addWidget(self.error)
        if locked:
            self.editor.setEnabled(False)
            self.editor.setToolTip(locked)

    # -- editors by kind --

    def _make_editor(self, value: Any) -> QWidget:
        s = self.setting
        if s.kind == "bool":
            self.editor = QCheckBox("Enabled")
            self.editor.toggled.connect(self.changed)
            self.set_value(value)
            return self.editor
        if s.kind == "choice":
            self.editor = QComboBox()
            self.editor.addItems(list(s.choices))
            self.set_value(value)
            self.editor.currentIndexChanged.connect(self.changed)
            return self.editor
        if s.kind == "list" and s.item_choices:
            self.editor = QWidget()
            row = QHBoxLayout(self.editor)
            row.setContentsMargins(0, 0, 0, 0)
            self._boxes = {}
            for choice in s.item_choices:
                box = QCheckBox(choice)
                box.toggled.connect(self.changed)
                row.addWidget(box)
                self._boxes[choice] = box
            row.addStretch(1)
            self.set_value(value)
            return self.editor
        if s.kind == "list" or s.kind == "str":
            self._text = QPlainTextEdit()
            lines = 3 if s.kind == "list" else 4
            self._text.setFixedHeight(self._text.fontMetrics().lineSpacing() * lines + 14)
            if s.kind == "list":
                self._text.setPlaceholderText("One per line")
            self.set_value(value)
            self._text.textChanged.connect(self.changed)
            if s.kind == "str":
                self.editor = self._text
                return self.editor
            self.editor = QWidget()
            row = QHBoxLayout(self.editor)
            row.setContentsMargins(0, 0, 0, 0)
            row.addWidget(self._text, 1)
            add = QPushButton("Add folder…")
            add.clicked.connect(self._add_folder)
            row.addWidget(add, 0, Qt.AlignmentFlag.AlignTop)
            return self.editor
        self._line = QLineEdit()
        self.set_value(value)
        self._line.textChanged.connect(self.changed)
        if s.kind != "path":
            self.editor = self._line
            return self.editor
        self.editor = QWidget()
        row = QHBoxLayout(self.editor)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self._line, 1)
        choose = QPushButton("Choose…")
        choose.clicked.connect(self._choose_file)
        bundled = QPushButton("Bundled")
        bundled.setToolTip("Use the bundled gemma-3-270m model")
        bundled.clicked.connect(lambda: self._line.setText(BUNDLED))
        row.addWidget(choose)
        row.addWidget(bundled)
        return self.editor

    def _add_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Allow a folder for the tools")
        if folder:
            current = self._text.toPlainText().rstrip("\n")
            self._text.setPlainText((current + "\n" if current else "") + folder)

    def _choose_file(self) -> None:
        start = self._line.text() if self._line.text() not in ("", BUNDLED) else str(Path.home())
        path, _ = QFileDialog.getOpenFileName(self, "Choose a GGUF model", start,
                                              "GGUF models (*.gguf);;All files (*)")
        if path:
            self._line.setText(path)

    # -- values --

    def raw(self) -> Any:
        """The field's value as Setting.parse takes it."""
        s = self.setting
        if s.kind == "bool":
            return self.editor.isChecked()
        if s.kind == "choice":
            return self.editor.currentText()
        if s.kind == "list" and s.item_choices:
            return [c for c, box in self._boxes.items() if box.isChecked()]
        if s.kind == "list":
            return [line.strip() for line in self._text.toPlainText().splitlines() if line.strip()]
        if s.kind == "str":
            return self._text.toPlainText()
        return self._line.text()

    def set_value(self, value: Any) -> None:
        s = self.setting
        if s.kind == "bool":
            self.editor.setChecked(bool(value))
        elif s.kind == "choice":
            self.editor.setCurrentText(str(value))
        elif s.kind == "list" and s.item_choices:
            for choice, box in self._boxes.items():
                box.setChecked(choice in (value or []))
        elif s.kind == "list":
            self._text.setPlainText("\n".join(value or []))
        elif s.kind == "str":
            self._text.setPlainText(str(value))
        else:
            self._line.setText(s.to_text(value))

    def set_error(self, message: str | None) -> None:
        self.error.setText(message or "")
        self.error.setVisible(bool(message))
        target = getattr(self, "_line", None) or getattr(self, "_text", None)
        if target is not None:
            target.setStyleSheet("border: 1px solid #c0392b;" if message else "")


class SettingsDialog(QDialog):
    """``preview(candidate, callback)`` computes a BudgetPreview off the GUI thread."""

    applied = Signal(object)  # the keys that changed

    def __init__(
        self,
        settings: Settings,
        preview: Callable[[Settings, Callable[[BudgetPreview], None]], None] | None = None,
        parent=None,
    ):
        super().__init__(parent)
        self.setWindowTitle("Preferences")
        self.setObjectName("preferences")
        self.settings = settings
        self._preview = preview
        self.fields: dict[str, SettingField] = {}
        self.errors: dict[str, str] = {}
        self.tabs = QTabWidget()
        for section, title, items in settings_sections():
            self.tabs.addTab(self._page(section, items), title)

        self.breakdown = QLabel("")
        self.breakdown.setWordWrap(True)
        self.breakdown.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.breakdown.setObjectName("live-breakdown")
        self.meter = BudgetMeter()
        self.meter.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        box = QGroupBox("Token budget for the current thread (live, before Apply)")
        inner = QVBoxLayout(box)
        inner.addWidget(self.meter)
        inner.addWidget(self.breakdown)

        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Apply
            | QDialogButtonBox.StandardButton.Cancel)
        self.ok_button = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        self.apply_button = self.buttons.button(QDialogButtonBox.StandardButton.Apply)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        self.apply_button.clicked.connect(self.apply)

        layout = QVBoxLayout(self)
        layout.addWidget(self.tabs, 1)
        layout.addWidget(box)
        layout.addWidget(self.buttons)
        self._debounce = QTimer(self, singleShot=True, interval=120)
        self._debounce.timeout.connect(self._request_preview)
        self.last_preview: BudgetPreview | None = None
        self._finished = False
        self.validate()
        self._request_preview()
        fm = self.fontMetrics()
        self.resize(fm.horizontalAdvance("0") * 110, fm.height() * 52)

    def _page(self, section: str, items: list[Setting]) -> QWidget:
        body = QWidget()
        layout = QVBoxLayout(body)
        for setting in items:
            field = SettingField(setting, self.settings.values.get(setting.key, setting.default),
                                 locked_reason(self.settings, setting.key)
                                 if setting.key in self.settings.sources else None)
            field.changed.connect(self._changed)
            self.fields[setting.key] = field
            layout.addWidget(field)
            line = QFrame()
            line.setFrameShape(QFrame.Shape.HLine)
            line.setFrameShadow(QFrame.Shadow.Sunken)
            layout.addWidget(line)
        restore = QPushButton("Restore defaults")
        restore.setObjectName(f"restore-{section}")
        restore.clicked.connect(lambda: self.restore_defaults(section))
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(restore)
        layout.addLayout(row)
        layout.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(body)
        return scroll

    # -- state --

    def raw_values(self) -> dict[str, Any]:
        return {k: f.raw() for k, f in self.fields.items() if not f.locked}

    def candidate(self) -> Settings:
        return parse_fields(self.settings, self.raw_values())[0]

    def changed(self) -> list[str]:
        return changed_keys(self.settings, self.candidate())

    def validate(self) -> bool:
        _, self.errors = parse_fields(self.settings, self.raw_values())
        for key, field in self.fields.items():
            field.set_error(self.errors.get(key))
        ok = not self.errors
        self.ok_button.setEnabled(ok)
        self.apply_button.setEnabled(ok and bool(self.changed()))
        return ok

    def _changed(self) -> None:
        self.validate()
        self._debounce.start()

    def restore_defaults(self, section: str) -> None:
        for key, field in self.fields.items():
            if SETTINGS[key].section == section and not field.locked:
                field.set_value(SETTINGS[key].default)
        self._changed()

    # -- live breakdown --

    def _request_preview(self) -> None:
        if self._preview is None:
            return
        if self.errors:
            self.breakdown.setText("Fix the marked values to see the budget.")
            return
        self._preview(self.candidate(), self.show_preview)

    def show_preview(self, preview: BudgetPreview) -> None:
        if self._finished:
            return  # the answer came back after the dialog closed
        self.last_preview = preview
        self.meter.set_breakdown(preview.breakdown)
        self.breakdown.setText("\n".join(preview.lines()))

    # -- saving --

    def apply(self) -> bool:
        """Write the changed keys to the TOML file; emits ``applied(keys)``."""
        if not self.validate():
            return False
        candidate = self.candidate()
        keys = changed_keys(self.settings, candidate)
        path = self.settings.config_path
        for key in keys:
            value = candidate.values[key]
            if path is not None:
                # the default is removed from the file rather than pinned there
                write_config_value(path, key, None if value == SETTINGS[key].default else value)
        self.settings = candidate
        self.validate()
        if keys:
            self.applied.emit(keys)
        return True

    def accept(self) -> None:
        if self.apply():
            super().accept()

    def done(self, result: int) -> None:
        self._finished = True
        super().done(result)
