"""Preferences' live token budget, under the pages whose settings spend the window: a
heading, one line with the model's context and the window Iris budgets of it
(``window_words.window_line``), the meter, why the meter has no bar when it has none, and
the breakdown in sentences (scrolling, so the dialog fits the screen at 24 pt)."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QGroupBox, QLabel, QScrollArea, QSizePolicy, QVBoxLayout

from iris_desktop.core.views import BudgetPreview, sum_sentence
from iris_desktop.ui.meter import BudgetMeter
from iris_desktop.ui.window_words import PreferencesPreview, too_large_sentence, window_line

#: what the bar says when the chat does not fit (the sentence is under it, in full)
PAINTED_PROBLEM = "This chat does not fit these values: why, and what to do, below"


def _line(name: str, accessible: str) -> QLabel:
    """A wrapped, selectable line of plain text, hidden while it has nothing to say."""
    label = QLabel("")
    label.setObjectName(name)
    label.setWordWrap(True)
    label.setTextFormat(Qt.TextFormat.PlainText)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    label.setAccessibleName(accessible)
    label.hide()
    return label


def _say(label: QLabel, text: str) -> None:
    label.setText(text)
    label.setVisible(bool(text))


class BudgetBox(QGroupBox):
    """``show_preview`` draws a BudgetPreview of the candidate values; ``show_fix`` says
    that marked values must be fixed first (no bar, no figures of a window not asked for)."""

    def __init__(self, line_spacing: int, parent=None):
        super().__init__(parent)
        self.breakdown = QLabel("")
        self.breakdown.setWordWrap(True)
        self.breakdown.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.breakdown.setObjectName("live-breakdown")
        self.breakdown.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.meter = BudgetMeter()
        self.meter.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        #: above the bar: the model's n_ctx and the part of it the budget uses, in one line
        self.window_line = _line("window-line", "The model's context and the window")
        #: under the bar, in full: why there is no bar (the chat does not fit these values)
        self.problem = _line("meter-problem", "Why the budget has no bar")
        self.problem.setStyleSheet("color: #c0392b;")
        heading = QLabel("<b>Token budget for the current thread</b> (live, before Apply)")
        heading.setWordWrap(True)
        sentences = QScrollArea()
        sentences.setObjectName("live-breakdown-scroll")
        sentences.setWidgetResizable(True)
        sentences.setFrameShape(QFrame.Shape.NoFrame)
        sentences.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        sentences.setWidget(self.breakdown)
        sentences.setMinimumHeight(line_spacing * 3)
        sentences.setAccessibleName("Token budget, in sentences")
        inner = QVBoxLayout(self)
        for widget in (heading, self.window_line, self.meter, self.problem):
            inner.addWidget(widget)
        inner.addWidget(sentences, 1)

    def show_fix(self, sentence: str) -> None:
        self.breakdown.setText(sentence)
        self.meter.set_problem(sentence)
        _say(self.window_line, "")
        _say(self.problem, "")

    def show_preview(self, preview: BudgetPreview, values: dict[str, Any]) -> None:
        """The candidate ``values``' budget; a chat they cannot hold is said in the bar and
        in full under it, with what to do (the bar was empty, without a word)."""
        line = window_line(preview.window, values["context.window"], preview.n_ctx,
                           preview.n_ctx_source) if isinstance(preview, PreferencesPreview) else ""
        _say(self.window_line, line)
        lines = preview.lines()
        if preview.breakdown is None:
            problem = too_large_sentence(preview.error or "No request could be built")
            self.meter.set_problem(problem, painted=PAINTED_PROBLEM)
            _say(self.problem, problem)
            self.breakdown.setText("\n".join(x for x in lines if x != preview.error))
            return
        _say(self.problem, "")
        self.meter.set_breakdown(preview.breakdown, estimated=not preview.counter_exact,
                                 dropped=preview.dropped_turns, note=line)
        self.breakdown.setText("\n".join([sum_sentence(preview.breakdown), *lines]))
