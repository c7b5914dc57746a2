"""Spin boxes that never replace what was typed: a number outside the setting's range
stays in the box as typed, and the dialog marks it with the setting's own message (OK
stays disabled), where a plain spin box would silently turn 100 into the minimum or 0.99
into the maximum. The arrows, the keyboard's steps and ``setValue`` stay inside the
range, and ``minimum()``/``maximum()`` are the setting's (the special value, auto or the
system's size, being the minimum where there is one): only typing reaches beyond, to any
number a C int holds (999999 was cut to 9999 as it was typed, the box's reach being ten
times the maximum, and the error quoted 9999), while the box stays as wide as the
setting's own numbers need. A box with a special value also takes its word typed ('auto',
any case; its first letters while typing) or an empty box for it: typing auto over 4096
kept 4096 without a word."""

from __future__ import annotations

from PySide6.QtCore import QSize
from PySide6.QtGui import QValidator
from PySide6.QtWidgets import QAbstractSpinBox, QDoubleSpinBox, QSpinBox

#: QSpinBox holds a C int: a typed number is held (and marked) up to it
INT_LIMIT = 2**31 - 1
#: how far a decimal box holds a typed number
FLOAT_LIMIT = 1e9

Step = QAbstractSpinBox.StepEnabledFlag


def reach(lo: float, special: float | None, ceiling: float) -> tuple[float, float]:
    """The spin box's own range: any number up to ``ceiling`` either way, so that a typed
    number out of the setting's range is kept; a box with a special value starts at it
    (Qt shows the special value's text at the box's own minimum)."""
    return (-ceiling if special is None else min(lo, special)), ceiling


def special_word(box: QAbstractSpinBox, text: str) -> QValidator.State | None:
    """How ``text`` reads as the box's special value: Acceptable for its word ('auto', the
    special text's first word, any case), the whole special text, or an empty box;
    Intermediate for the word's first letters; None for anything else (a number). The
    word is the text before a bracket: 'auto' of "auto (the model's context size)"."""
    special = box.specialValueText().strip().lower()
    if not special:
        return None
    core = text.strip().lower()
    suffix = box.suffix().strip().lower()
    if suffix and core.endswith(suffix):
        core = core.removesuffix(suffix).strip()
    word = special.split(" (", 1)[0].strip()
    if core in ("", word, special):
        return QValidator.State.Acceptable
    if word.startswith(core) or special.startswith(core):
        return QValidator.State.Intermediate
    return None


def hint_for(box: QAbstractSpinBox, hint: QSize, shown: list[str], held: list[str]) -> QSize:
    """``hint`` (Qt's, sized for the widest number the box holds, ``held``) as wide as the
    setting's own texts and what is typed (``shown``) need instead: the box holds
    2,147,483,647 only to keep a mistyped number, and need not be as wide as it."""
    fm = box.fontMetrics()
    width = max((fm.horizontalAdvance(t) for t in shown if t), default=0)
    wider = max((fm.horizontalAdvance(t) for t in held if t), default=0) - width
    return QSize(hint.width() - max(wider, 0), hint.height())


def stepped(value: float, steps: int, step: float, lo: float, hi: float,
            special: float | None) -> float:
    """Where an arrow press takes ``value``: one step, kept within ``lo``..``hi``; below
    ``lo`` lies only the special value (auto, the system's size) when there is one."""
    if special is not None and value == special:
        return lo if steps > 0 else value
    target = value + steps * step
    if target < lo:
        return lo if steps > 0 or special is None else special
    return min(target, hi)


def step_flags(value: float, lo: float, hi: float, special: float | None) -> Step:
    flags = Step.StepNone
    if value < hi:
        flags |= Step.StepUpEnabled
    if value > (special if special is not None else lo):
        flags |= Step.StepDownEnabled
    return flags


class BoundedSpinBox(QSpinBox):
    """An integer spin box holding typed numbers beyond ``lo``..``hi`` (see the module)."""

    def __init__(self, lo: int, hi: int | None, special: int | None = None):
        super().__init__()
        self.lo, self.special = lo, special
        self.hi = int(min(hi if hi is not None else INT_LIMIT, INT_LIMIT))
        bottom, top = reach(lo, special, INT_LIMIT)
        self.setRange(int(bottom), int(top))
        self.lineEdit().textChanged.connect(self.updateGeometry)  # a long typed number shows

    def validate(self, text: str, pos: int) -> object:
        state = special_word(self, text)
        return (state, text, pos) if state is not None else super().validate(text, pos)

    def valueFromText(self, text: str) -> int:  # noqa: N802 - Qt's name
        if special_word(self, text) == QValidator.State.Acceptable:
            return int(self.special if self.special is not None else self.lo)
        return super().valueFromText(text)

    def _texts(self, *values: int) -> list[str]:
        return [self.prefix() + self.textFromValue(v) + self.suffix() for v in values]

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        return hint_for(self, super().sizeHint(), [self.text(), self.specialValueText(), *self._texts(
            self.lo, self.hi)], self._texts(QSpinBox.minimum(self), QSpinBox.maximum(self)))

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        return hint_for(self, super().minimumSizeHint(), [self.specialValueText(), *self._texts(
            self.lo, self.hi)], self._texts(QSpinBox.minimum(self), QSpinBox.maximum(self)))

    def minimum(self) -> int:
        return self.lo if self.special is None else self.special

    def maximum(self) -> int:
        return self.hi

    def setValue(self, value: int) -> None:  # noqa: N802 - Qt's name
        super().setValue(min(max(int(value), self.minimum()), self.hi))

    def stepBy(self, steps: int) -> None:  # noqa: N802 - Qt's name
        self.setValue(int(stepped(self.value(), steps, self.singleStep(), self.lo, self.hi,
                                  self.special)))

    def stepEnabled(self) -> Step:  # noqa: N802 - Qt's name
        return step_flags(self.value(), self.lo, self.hi, self.special)


class BoundedDoubleSpinBox(QDoubleSpinBox):
    """A decimal spin box holding typed numbers beyond ``lo``..``hi`` (see the module)."""

    def __init__(self, lo: float, hi: float | None):
        super().__init__()
        self.lo, self.hi = lo, hi if hi is not None else FLOAT_LIMIT
        self.setRange(*reach(lo, None, FLOAT_LIMIT))
        self.lineEdit().textChanged.connect(self.updateGeometry)

    def _texts(self, *values: float) -> list[str]:
        return [self.prefix() + self.textFromValue(v) + self.suffix() for v in values]

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        return hint_for(self, super().sizeHint(), [self.text(), *self._texts(self.lo, self.hi)],
                        self._texts(QDoubleSpinBox.minimum(self), QDoubleSpinBox.maximum(self)))

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        return hint_for(self, super().minimumSizeHint(), self._texts(self.lo, self.hi),
                        self._texts(QDoubleSpinBox.minimum(self), QDoubleSpinBox.maximum(self)))

    def minimum(self) -> float:
        return self.lo

    def maximum(self) -> float:
        return self.hi

    def setValue(self, value: float) -> None:  # noqa: N802 - Qt's name
        super().setValue(min(max(float(value), self.lo), self.hi))

    def stepBy(self, steps: int) -> None:  # noqa: N802 - Qt's name
        self.setValue(stepped(self.value(), steps, self.singleStep(), self.lo, self.hi, None))

    def stepEnabled(self) -> Step:  # noqa: N802 - Qt's name
        return step_flags(self.value(), self.lo, self.hi, None)
