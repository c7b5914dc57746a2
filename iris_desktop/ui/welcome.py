"""The welcome panel: what an empty window shows instead of a bare placeholder — what
Iris is, where the model runs, how to read the budget meter, example prompts that go
into the composer (never sent by themselves) and, under them, while the model is the small
bundled one, what that model is and a larger one for this computer (``recommend_card``).

``WelcomeControl`` shows it while no thread is open and the transcript is empty (the
first run, or New chat), and the transcript as soon as a thread is open or a message is
sent."""

from __future__ import annotations

import html

from PySide6.QtCore import QObject, QSize, Qt, Signal
from PySide6.QtGui import QFont
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from iris_desktop.ui.app_state import AppState
from iris_desktop.ui.composer import Composer
from iris_desktop.ui.meter import PART_COLORS
from iris_desktop.ui.recommend_card import RecommendCard
from iris_desktop.ui.status_line import elide_words
from iris_desktop.ui.transcript import TranscriptView

#: prompts the bundled model (a small coding model) answers well
EXAMPLES = (
    "Write a Python function that tells whether a year is a leap year, with a few tests.",
    "Explain what this command does: find . -name '*.log' -mtime +7 -delete",
    "What is the difference between a list and a tuple in Python?",
)

#: the meter's parts, in its order, and what each one is
METER_PARTS = (
    ("system", "the instructions every request starts with (the system prompt)"),
    ("tools", "the descriptions of the tools the model may call"),
    ("summary", "the summary of earlier turns, once a long chat has been compacted"),
    ("recall", "earlier messages brought back because your question asks about them"),
    ("history", "the conversation, word for word"),
    ("draft", "what you are typing now"),
    ("free", "the empty rest of the bar: room left for the reply"),
)


def _meter_legend() -> str:
    rows = []
    for name, meaning in METER_PARTS:
        swatch = (f"<span style='background-color:{PART_COLORS[name].name()}'>"
                  "&nbsp;&nbsp;&nbsp;&nbsp;</span>" if name in PART_COLORS else "")
        rows.append(f"<tr><td>{swatch}</td><td>&nbsp;<b>{name}</b></td>"
                    f"<td>&nbsp;{html.escape(meaning)}</td></tr>")
    return "<table cellspacing='3'>" + "".join(rows) + "</table>"


WELCOME_TEXT = (
    "<p>Iris is a chat app that works <b>offline</b> and keeps your conversations "
    "<b>private</b>. They are saved on this computer, in one file you can search, export "
    "and delete.</p>"
    # the model is named once, by the card under the examples while it is the bundled one
    # (the card and this paragraph both introduced it)
    "<p>The model runs <b>on this computer</b>. Nothing you type leaves it, unless "
    "you point Iris at a server of your own (Model ▸ Server…); the status bar always says "
    "where your conversation goes.</p>"
    "<p><b>The budget meter</b> at the bottom right shows how the next request fills the "
    "model's context window, from left to right:</p>"
    + _meter_legend()
    # (a newcomer's audit: the mechanics, every trigger and what is not sent, were a wall
    # of words before a first message; the meter's tooltip says them)
    + "<p>When a chat grows long, Iris <b>summarizes its oldest turns</b> so it can go on: "
    "when they no longer fit the budget (the <b>dashed line</b>) or a request reaches the "
    "<span style='color:#d23228'><b>red line</b></span>, whichever comes first. Your "
    "messages are never changed or lost. Hover over the meter for the numbers (≈: "
    "estimated), or open View ▸ Context inspector to see exactly what the model is sent.</p>"
)


class WelcomePanel(QScrollArea):
    """The panel; ``promptChosen(text)`` when an example is clicked."""

    promptChosen = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("welcome")
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        body = QWidget()
        column = QVBoxLayout(body)
        column.setContentsMargins(24, 24, 24, 24)
        self.title = QLabel("Welcome to Iris")
        big = QFont(self.title.font())
        big.setPointSizeF(big.pointSizeF() * 1.6)
        big.setBold(True)
        self.title.setFont(big)
        self.text = QLabel(WELCOME_TEXT)
        self.text.setWordWrap(True)
        self.text.setTextFormat(Qt.TextFormat.RichText)
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        column.addWidget(self.title)
        column.addWidget(self.text)
        try_one = QLabel("<b>Try one</b> (it goes into the message box; press Enter to send it):")
        try_one.setWordWrap(True)
        column.addWidget(try_one)
        self.examples: list[QPushButton] = []
        for prompt in EXAMPLES:
            button = _ExampleButton(prompt)
            button.setObjectName("welcome-example")
            button.setStyleSheet("text-align: left; padding: 6px 10px;")
            button.clicked.connect(lambda _=False, prompt=prompt: self.promptChosen.emit(prompt))
            column.addWidget(button)
            self.examples.append(button)
        #: a larger model for this computer, one click away (the model control drives it);
        #: under the examples (and after them for Tab): above them, it appeared once the
        #: model was ready and pushed them ~140 px down as a newcomer went to click one
        self.recommend = RecommendCard()
        column.addWidget(self.recommend)
        column.addStretch(1)
        body.setMaximumWidth(body.fontMetrics().horizontalAdvance("0") * 96)
        outer = QWidget()
        row = QHBoxLayout(outer)  # centred by stretches: an aligned widget gets no height for its width
        row.setContentsMargins(0, 0, 0, 0)
        row.addStretch(1)
        row.addWidget(body, 100)
        row.addStretch(1)
        self.setWidget(outer)


class _ExampleButton(QPushButton):
    """An example prompt that never widens the panel: on a narrow window its text is cut
    at a word with "…" (the full prompt is its tooltip and accessible name)."""

    def __init__(self, prompt: str):
        super().__init__(prompt)
        self.prompt = prompt
        self.setAccessibleName(prompt)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        return QSize(self.fontMetrics().horizontalAdvance("0") * 12, super().minimumSizeHint().height())

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        room = self.width() - self.fontMetrics().horizontalAdvance("0") * 3  # the padding
        shown = elide_words(self.prompt, self.fontMetrics(), room)
        if shown != self.text():
            self.setText(shown)
        self.setToolTip(self.prompt if shown != self.prompt else "Put this prompt in the message box")


class WelcomeControl(QObject):
    """Shows ``panel`` in ``stack`` instead of ``view`` while the window is empty; an
    example fills ``composer``."""

    def __init__(self, app_state: AppState, stack: QStackedWidget, panel: WelcomePanel,
                 view: TranscriptView, composer: Composer, parent: QObject | None = None):
        super().__init__(parent)
        self.app_state = app_state
        self.stack = stack
        self.panel = panel
        self.view = view
        self.composer = composer
        model = view.transcript
        for signal in (model.rowsInserted, model.rowsRemoved, model.modelReset):
            signal.connect(self.update)
        app_state.threadChanged.connect(self.update)
        app_state.threadOpened.connect(self.update)
        panel.promptChosen.connect(self.use_prompt)
        self.update()

    @property
    def showing(self) -> bool:
        return self.stack.currentWidget() is self.panel

    def update(self, *_args) -> None:
        empty = self.app_state.thread_id is None and self.view.transcript.rowCount() == 0
        self.stack.setCurrentWidget(self.panel if empty else self.view)

    def use_prompt(self, text: str) -> None:
        """Put ``text`` in the composer (not sent), ready to edit or send."""
        self.composer.set_text(text)
        edit = self.composer.edit
        edit.setFocus()
        edit.moveCursor(edit.textCursor().MoveOperation.End)
