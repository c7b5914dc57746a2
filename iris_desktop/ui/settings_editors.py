"""One editor per setting kind, generated from the typed settings model: spin boxes with
the allowed range and unit for integers, a slider with a spin box for ratios (and what
the ratio means in tokens for the current window), combo boxes for choices, check boxes,
a file picker for paths, a folder list for the tools' folders.

Every editor has the same small interface (``changed``, ``raw()``, ``set_value()``,
``set_invalid()``, ``set_window()``), so the dialog treats them alike; ``raw()`` returns
what ``Setting.parse`` takes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import QRect, Qt, Signal
from PySide6.QtGui import QColor, QPainter, QPen
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QCheckBox,
    QComboBox,
    QFileDialog,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSlider,
    QVBoxLayout,
    QWidget,
)

from iris_desktop.core.views import ratio_meaning
from iris_desktop.settings import AUTO, BUNDLED, OFF, Setting
from iris_desktop.ui.bounded_spin import BoundedDoubleSpinBox, BoundedSpinBox

#: ratios move in steps of one hundredth on the slider
RATIO_STEPS = 100
#: a ratio's line while a marked value leaves the window unknown
UNKNOWN_MEANING = "In tokens: unknown until the marked values are fixed"
INVALID_COLOUR, FRAME_MARGIN = "#c0392b", 2  # an invalid value's frame: colour, width


class Editor(QWidget):
    changed = Signal()
    #: ``note()`` changed: what the field's controls add to their description
    noteChanged = Signal()

    def __init__(self, setting: Setting, parent: QWidget | None = None):
        super().__init__(parent)
        self.setting = setting
        self.lines = QVBoxLayout(self)  # the row, and a line under it where one is needed
        m = FRAME_MARGIN
        self.lines.setContentsMargins(m, m, m, m)
        self.row = QHBoxLayout()
        self.lines.addLayout(self.row)
        self.invalid = False

    def raw(self) -> Any:
        raise NotImplementedError

    def set_value(self, value: Any) -> None:
        raise NotImplementedError

    def set_invalid(self, invalid: bool) -> None:
        """A red frame painted around the row's controls: a style sheet's border on the
        editor made Qt's style stop drawing a spin box's arrows (and a combo box's look)."""
        self.invalid = invalid
        self.update()

    def framed(self) -> QRect:
        """The row's controls, as one rectangle (the frame goes just outside it)."""
        rect = QRect()
        for item in (self.row.itemAt(i) for i in range(self.row.count())):
            widget, layout = item.widget(), item.layout()
            if (widget is not None and widget.isVisible()) or layout is not None:
                rect = rect.united(widget.geometry() if widget else layout.contentsRect())
        return rect

    def paintEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().paintEvent(event)
        if self.invalid and not (rect := self.framed()).isNull():
            painter = QPainter(self)
            painter.setPen(QPen(QColor(INVALID_COLOUR), FRAME_MARGIN))
            painter.drawRect(rect.adjusted(-1, -1, 0, 0))
            painter.end()

    def set_window(self, window: int | None, values: dict[str, Any]) -> None:
        """The current window and candidate values (ratios show what they mean); None
        while a marked value leaves the budget unknown."""

    def note(self) -> str:
        """What the controls' description says after the help ('' for nothing): a figure
        shown beside them, which a screen reader never reached (a label is not focused)."""
        return ""


class IntEditor(Editor):
    """A spin box stepping over the allowed range, with the unit as suffix; a number
    typed outside it is kept and marked (``bounded_spin``), never replaced. ``special``:
    the value shown as a word (auto, the system's size)."""

    special: int | None = None

    def __init__(self, setting: Setting, parent: QWidget | None = None):
        super().__init__(setting, parent)
        self.spin = BoundedSpinBox(int(setting.minimum or 0), setting.maximum, self.special)
        self.spin.setGroupSeparatorShown(True)
        if setting.unit:
            self.spin.setSuffix(f" {setting.unit}")
        self.spin.setAccelerated(True)
        self.spin.valueChanged.connect(self.changed)
        self.row.addWidget(self.spin)
        self.row.addStretch(1)

    def raw(self) -> Any:
        return str(self.spin.value())

    def set_value(self, value: Any) -> None:
        self.spin.setValue(int(value))


class WindowEditor(IntEditor):
    """'auto' (the loaded model's context size), the special value -1 (a typed 100 stays
    100, marked, never auto), or tokens; typed 'auto', an empty box, the Auto button."""

    special = -1

    def __init__(self, setting: Setting, parent: QWidget | None = None):
        super().__init__(setting, parent)
        self.spin.setSpecialValueText("auto (the model's context size)")
        self.auto = QPushButton("Auto")
        self.auto.setToolTip("Use the context size the model was loaded with")
        self.auto.clicked.connect(lambda: self.spin.setValue(self.spin.minimum()))
        self.row.insertWidget(1, self.auto)

    def raw(self) -> Any:
        value = self.spin.value()
        return AUTO if value == self.spin.minimum() else str(value)

    def set_value(self, value: Any) -> None:
        self.spin.setValue(self.spin.minimum() if value == AUTO else int(value))


class GpuEditor(IntEditor):
    """model.gpu: 'auto', 'off', or a number of layers (the spin box, used only then)."""

    LAYERS = "layers:"

    def __init__(self, setting: Setting, parent: QWidget | None = None):
        super().__init__(setting, parent)
        self.mode = QComboBox()
        self.mode.addItems([AUTO, OFF, self.LAYERS])
        self.mode.currentIndexChanged.connect(self._mode_changed)
        self.row.insertWidget(0, self.mode)

    def _mode_changed(self) -> None:
        self.spin.setEnabled(self.mode.currentText() == self.LAYERS)
        self.changed.emit()

    def raw(self) -> Any:
        mode = self.mode.currentText()
        return str(self.spin.value()) if mode == self.LAYERS else mode

    def set_value(self, value: Any) -> None:
        words = value in (AUTO, OFF)
        if not words:
            self.spin.setValue(int(value))
        self.mode.setCurrentText(str(value) if words else self.LAYERS)
        self.spin.setEnabled(not words)


class ZeroEditor(IntEditor):
    """A range, or 0 with a meaning of its own (``Setting.zero_means``, "the system's
    size"): 0 is the spin box's special value (a typed number between 0 and the
    minimum stays, marked)."""

    special = 0

    def __init__(self, setting: Setting, parent: QWidget | None = None):
        super().__init__(setting, parent)
        self.spin.setSpecialValueText(setting.zero_means)

    def raw(self) -> Any:
        value = self.spin.value()
        return "0" if value == self.spin.minimum() else str(value)

    def set_value(self, value: Any) -> None:
        self.spin.setValue(self.spin.minimum() if int(value) == 0 else int(value))


class FloatEditor(Editor):
    def __init__(self, setting: Setting, parent: QWidget | None = None):
        super().__init__(setting, parent)
        self.spin = BoundedDoubleSpinBox(setting.minimum or 0.0, setting.maximum)
        self.spin.setDecimals(2)
        self.spin.setSingleStep(0.05)
        if setting.unit:
            self.spin.setSuffix(f" {setting.unit}")
        self.spin.valueChanged.connect(self.changed)
        self.row.addWidget(self.spin)
        self.row.addStretch(1)

    def raw(self) -> Any:
        return f"{self.spin.value():.10g}"  # (1234567 as typed, not 1.23457e+06)

    def set_value(self, value: Any) -> None:
        self.spin.setValue(float(value))


class RatioEditor(FloatEditor):
    """A slider and a spin box kept together, and what the ratio means in tokens."""

    def __init__(self, setting: Setting, parent: QWidget | None = None):
        super().__init__(setting, parent)
        self.spin.setSuffix("")
        self.spin.setButtonSymbols(QAbstractSpinBox.ButtonSymbols.UpDownArrows)
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setRange(round((setting.minimum or 0) * RATIO_STEPS),
                             round((setting.maximum or 1) * RATIO_STEPS))
        self.meaning = QLabel("")
        self.meaning.setObjectName("ratio-meaning")
        self.meaning.setWordWrap(True)  # never widens the page past the dialog at 24 pt
        self.row.insertWidget(0, self.slider, 3)
        self.lines.addWidget(self.meaning)  # under the slider: a whole line to say it in
        self._syncing = False  # the slider follows the box without writing back
        self.slider.valueChanged.connect(self._slid)
        self.spin.valueChanged.connect(self._typed)
        self._window: tuple[int, dict[str, Any]] | None = None

    def _slid(self, value: int) -> None:
        if not self._syncing:
            self.spin.setValue(value / RATIO_STEPS)

    def _typed(self, value: float) -> None:
        """A typed ratio out of the slider's range moves it to its end, and stays as
        typed in the box (marked by the dialog)."""
        self._syncing = True
        try:
            self.slider.setValue(round(value * RATIO_STEPS))
        finally:
            self._syncing = False

    def set_value(self, value: Any) -> None:
        super().set_value(value)
        self._typed(float(value))

    def set_window(self, window: int | None, values: dict[str, Any]) -> None:
        if window is None:  # (it showed the figures of the last valid window; its
            # "= – tokens until…" read aloud as "equals dash tokens")
            self.meaning.setText(UNKNOWN_MEANING)
        else:
            values = {**values, self.setting.key: self.spin.value()}
            self.meaning.setText(ratio_meaning(self.setting.key, values, window))
        self.noteChanged.emit()

    def note(self) -> str:
        """The line under the slider, as said: "In tokens: 5,734 of 8,192 tokens."."""
        text = self.meaning.text()
        if not text or text == UNKNOWN_MEANING:
            return f"{text}." if text else ""
        return f"In tokens: {text.removeprefix('= ').replace('≈ ', 'about ', 1)}."


class ChoiceEditor(Editor):
    def __init__(self, setting: Setting, parent: QWidget | None = None):
        super().__init__(setting, parent)
        self.combo = QComboBox()
        self.combo.addItems(list(setting.choices))
        self.combo.currentIndexChanged.connect(self.changed)
        self.row.addWidget(self.combo)
        self.row.addStretch(1)

    def raw(self) -> Any:
        return self.combo.currentText()

    def set_value(self, value: Any) -> None:
        self.combo.setCurrentText(str(value))


class BoolEditor(Editor):
    def __init__(self, setting: Setting, parent: QWidget | None = None):
        super().__init__(setting, parent)
        self.box = QCheckBox("Enabled")
        self.box.toggled.connect(self.changed)
        self.row.addWidget(self.box)
        self.row.addStretch(1)

    def raw(self) -> Any:
        return self.box.isChecked()

    def set_value(self, value: Any) -> None:
        self.box.setChecked(bool(value))


class ChecklistEditor(Editor):
    """A list drawn from fixed choices: one check box each."""

    def __init__(self, setting: Setting, parent: QWidget | None = None):
        super().__init__(setting, parent)
        self.boxes: dict[str, QCheckBox] = {}
        grid = QGridLayout()  # two columns: a page stays narrow at a large text size
        grid.setContentsMargins(0, 0, 0, 0)
        for i, choice in enumerate(setting.item_choices):
            box = QCheckBox(choice)
            box.toggled.connect(self.changed)
            grid.addWidget(box, i // 2, i % 2)
            self.boxes[choice] = box
        self.row.addLayout(grid)
        self.row.addStretch(1)

    def raw(self) -> Any:
        return [c for c, box in self.boxes.items() if box.isChecked()]

    def set_value(self, value: Any) -> None:
        for choice, box in self.boxes.items():
            box.setChecked(choice in (value or []))


class TextEditor(Editor):
    """Free text (the system prompt), or a list of strings one per line (folders)."""

    def __init__(self, setting: Setting, parent: QWidget | None = None):
        super().__init__(setting, parent)
        self.text = QPlainTextEdit()
        self.text.setTabChangesFocus(True)  # Tab went into the text (a trap on the page)
        lines = 3 if setting.kind == "list" else 4
        self.text.setFixedHeight(self.text.fontMetrics().lineSpacing() * lines + 14)
        self.text.textChanged.connect(self.changed)
        self.row.addWidget(self.text, 1)
        if setting.kind == "list":
            self.text.setPlaceholderText("One per line")
            add = QPushButton("Add folder…")
            add.clicked.connect(self._add_folder)
            self.row.addWidget(add, 0, Qt.AlignmentFlag.AlignTop)

    def raw(self) -> Any:
        if self.setting.kind == "list":
            return [line.strip() for line in self.text.toPlainText().splitlines() if line.strip()]
        return self.text.toPlainText()

    def set_value(self, value: Any) -> None:
        self.text.setPlainText("\n".join(value or []) if self.setting.kind == "list" else str(value))

    def _add_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Allow a folder for the tools")
        if folder:
            current = self.text.toPlainText().rstrip("\n")
            self.text.setPlainText((current + "\n" if current else "") + folder)


class LineEditor(Editor):
    """One line of text: a server address, a model name."""

    def __init__(self, setting: Setting, parent: QWidget | None = None):
        super().__init__(setting, parent)
        self.line = QLineEdit()
        if setting.kind == "url":
            self.line.setPlaceholderText("http://127.0.0.1:8080/v1")
        self.line.textChanged.connect(self.changed)
        self.row.addWidget(self.line, 1)

    def raw(self) -> Any:
        return self.line.text()

    def set_value(self, value: Any) -> None:
        self.line.setText(str(value))


class PathEditor(LineEditor):
    """A GGUF file: typed, chosen in a file dialog, or the bundled model."""

    def __init__(self, setting: Setting, parent: QWidget | None = None):
        super().__init__(setting, parent)
        choose = QPushButton("Choose…")
        choose.clicked.connect(self._choose_file)
        bundled = QPushButton("Bundled")
        bundled.setToolTip("Use the bundled model (Qwen2.5-Coder-0.5B-Instruct)")
        bundled.clicked.connect(lambda: self.line.setText(BUNDLED))
        self.row.addWidget(choose)
        self.row.addWidget(bundled)

    def _choose_file(self) -> None:
        start = self.line.text() if self.line.text() not in ("", BUNDLED) else str(Path.home())
        path, _ = QFileDialog.getOpenFileName(self, "Choose a GGUF model", start,
                                              "GGUF models (*.gguf);;All files (*)")
        if path:
            self.line.setText(path)


def make_editor(setting: Setting, value: Any) -> Editor:
    """The editor for ``setting``'s kind, showing ``value``."""
    if setting.kind == "window":
        editor: Editor = WindowEditor(setting)
    elif setting.kind == "gpu":
        editor = GpuEditor(setting)
    elif setting.kind == "int" and setting.zero_means:
        editor = ZeroEditor(setting)
    elif setting.kind == "int":
        editor = IntEditor(setting)
    elif setting.kind == "float" and setting.unit.startswith("×"):
        editor = RatioEditor(setting)
    elif setting.kind == "float":
        editor = FloatEditor(setting)
    elif setting.kind == "choice":
        editor = ChoiceEditor(setting)
    elif setting.kind == "bool":
        editor = BoolEditor(setting)
    elif setting.kind == "list" and setting.item_choices:
        editor = ChecklistEditor(setting)
    elif setting.kind == "list" or (setting.kind == "str" and setting.multiline):
        editor = TextEditor(setting)
    elif setting.kind in ("str", "url"):
        editor = LineEditor(setting)
    else:
        editor = PathEditor(setting)
    editor.set_value(value)
    return editor
