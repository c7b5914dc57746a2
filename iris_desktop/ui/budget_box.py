"""Preferences' live token budget, under the pages whose settings spend the window: a
heading, one line with the model's context and the window Iris budgets of it
(``window_words.window_line``), the meter, why the meter has no bar when it has none, and
the breakdown in sentences: all of them at the dialog's size (it showed 5 of 9 lines in a
small scroll area, one cut through), scrolling only where the screen is too small for
them (24 pt on a small screen), so that the dialog still fits."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QSize, Qt
from PySide6.QtWidgets import QFrame, QGroupBox, QLabel, QScrollArea, QSizePolicy, QVBoxLayout

from iris_desktop.core.views import BudgetPreview, sum_sentence
from iris_desktop.ui.meter import BudgetMeter
from iris_desktop.ui.window_words import PreferencesPreview, too_large_sentence, window_line

#: what the bar says when the chat does not fit (the sentence is under it, in full)
PAINTED_PROBLEM = "This chat does not fit these values: why, and what to do, below"
#: the most of the screen's height the sentences take before they scroll
SENTENCES_SHARE = 0.4


class Sentences(QScrollArea):
    """The breakdown's lines, as tall as they need at the box's width (at most
    ``SENTENCES_SHARE`` of the screen, and at least three lines: then it scrolls)."""

    def __init__(self, label: QLabel, line_spacing: int):
        super().__init__()
        self.label, self.least = label, line_spacing * 3
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setWidget(label)
        self.setMinimumHeight(self.least)

    def fit(self) -> None:
        width = self.viewport().width() or self.width()
        needed = self.label.heightForWidth(width) if self.label.text() else 0
        screen = self.screen().availableGeometry().height() if self.screen() else 0
        most = max(self.least, int(screen * SENTENCES_SHARE)) if screen else needed
        height = max(min(needed, most), self.least if self.label.text() else 0)
        if height != self.minimumHeight():
            self.setMinimumHeight(height)

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        return QSize(super().sizeHint().width(), self.minimumHeight())

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():
            self.fit()


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
        self.sentences = sentences = Sentences(self.breakdown, line_spacing)
        sentences.setObjectName("live-breakdown-scroll")
        sentences.setAccessibleName("Token budget, in sentences")
        inner = QVBoxLayout(self)
        for widget in (heading, self.window_line, self.meter, self.problem):
            inner.addWidget(widget)
        inner.addWidget(sentences, 1)

    def show_fix(self, sentence: str) -> None:
        """``sentence`` once, in the bar's place (it was said in the bar and again under
        it); no figures under it."""
        self._sentences("")
        self.meter.set_problem(sentence)
        _say(self.window_line, "")
        _say(self.problem, "")

    def _sentences(self, text: str) -> None:
        self.breakdown.setText(text)
        self.sentences.setVisible(bool(text))
        self.sentences.fit()

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
            self._sentences("\n".join(x for x in lines if x != preview.error))
            return
        _say(self.problem, "")
        self.meter.set_breakdown(preview.breakdown, estimated=not preview.counter_exact,
                                 dropped=preview.dropped_turns, note=line)
        self._sentences("\n".join([sum_sentence(preview.breakdown), *lines]))
