"""Spin boxes that never replace what was typed: a number outside the setting's range
stays in the box as typed, and the dialog marks it with the setting's own message (OK
stays disabled), where a plain spin box would silently turn 100 into the minimum or 0.99
into the maximum. The arrows, the keyboard's steps and ``setValue`` stay inside the
range, and ``minimum()``/``maximum()`` are the setting's (the special value, auto or the
system's size, being the minimum where there is one): only typing reaches beyond."""

from __future__ import annotations

from PySide6.QtWidgets import QAbstractSpinBox, QDoubleSpinBox, QSpinBox

#: how far past the setting's range a typed number is still held (and marked)
TYPED_REACH = 10
#: QSpinBox holds a C int
INT_LIMIT = 2**31 - 1

Step = QAbstractSpinBox.StepEnabledFlag


def reach(lo: float, hi: float | None, ceiling: float) -> tuple[float, float]:
    """The spin box's own range for a setting's ``lo``..``hi``: from 0 (or ``lo`` when
    negative) to well past ``hi``, so that a typed number out of range is kept."""
    top = ceiling if hi is None else min(ceiling, max(hi * TYPED_REACH, hi + 1))
    return min(lo, 0), top


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
        bottom, top = reach(lo, hi, INT_LIMIT)
        self.setRange(int(bottom if special is None else min(bottom, special)), int(top))

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
        self.lo, self.hi = lo, hi if hi is not None else 1e9
        self.setRange(*reach(lo, hi, 1e9))

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
