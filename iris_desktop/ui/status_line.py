"""The status bar's text: a sentence that never runs into the meter and is never cut in
the middle of a word. Too long for its room, it ends at the last whole word that fits,
with "…", and the full sentence is the tooltip (and what a screen reader reads).

``StatusArea`` holds the status sentence, a passing message (shown for a while in its
place, as ``QStatusBar.showMessage`` would, but elided the same way) and the progress
bar of a long job. A background job's message (re-embedding's count) never hides a
turn's state: while a turn runs it waits, and the latest one is shown when the turn ends."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, QSize, Qt, QTimer, Slot
from PySide6.QtGui import QFontMetrics, QPainter
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QSizePolicy, QWidget

from iris_desktop.core.events import CacheStatus
from iris_desktop.ui.boxes import plain_tip

ELLIPSIS = "…"


def elide_words(text: str, metrics: QFontMetrics, width: int) -> str:
    """``text`` on one line within ``width`` pixels: whole, or its first words that fit
    followed by "…" (never part of a word; just "…" when not even the first word fits)."""
    line = " ".join(text.split())
    if metrics.horizontalAdvance(line) <= width:
        return line
    words = line.split(" ")

    def shortened(count: int) -> str:
        return " ".join(words[:count]).rstrip(" ,;:·—-…") + ELLIPSIS

    low, high = 0, len(words) - 1  # the most words that fit, found by halving
    while low < high:
        middle = (low + high + 1) // 2
        if metrics.horizontalAdvance(shortened(middle)) <= width:
            low = middle
        else:
            high = middle - 1
    return shortened(low) if low else ELLIPSIS


class ElidedLabel(QLabel):
    """A one-line label that elides at a word boundary (:func:`elide_words`); ``text()``
    stays the full sentence, the tooltip holds it whenever it is shortened (above a
    tooltip of its own, ``set_details``)."""

    def __init__(self, text: str = "", parent: QWidget | None = None):
        super().__init__(parent)
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self._shown = ""
        self._details = ""
        self.setText(text)

    def set_details(self, tip: str) -> None:
        """A tooltip of the label's own (plain text), shown whether it is shortened or not,
        below the full text when it is."""
        self._details = tip
        self._elide()

    #: called after each new text (the status area asks for room to fit it)
    changed: Any = None

    def setText(self, text: str) -> None:  # noqa: N802 - Qt's name
        super().setText(text)
        self._elide()
        if self.changed is not None:
            self.changed()

    def shown_text(self) -> str:
        """What is painted now (the full text, or its elided start)."""
        return self._shown

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        metrics = self.fontMetrics()
        return QSize(metrics.horizontalAdvance(ELLIPSIS) + 2, super().minimumSizeHint().height())

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        return QSize(self.fontMetrics().horizontalAdvance(" ".join(self.text().split())) + 4,
                     super().sizeHint().height())

    def _elide(self) -> None:
        full = self.text()
        self._shown = elide_words(full, self.fontMetrics(), max(self.contentsRect().width(), 0))
        shortened = full if self._shown != " ".join(full.split()) else ""
        if self._details:
            self.setToolTip(plain_tip("\n".join(t for t in (shortened, self._details) if t)))
        else:
            self.setToolTip(shortened)
        self.update()

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        self._elide()

    def changeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().changeEvent(event)
        if event.type() == event.Type.FontChange:
            self._elide()

    def paintEvent(self, event) -> None:  # noqa: N802 - Qt's name
        painter = QPainter(self)
        self.style().drawItemText(painter, self.contentsRect(),
                                  int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter),
                                  self.palette(), self.isEnabled(), self._shown,
                                  self.foregroundRole())


class YieldingLabel(ElidedLabel):
    """The model's label beside the status sentence: as wide as its text where there is
    room, the first to give way where there is not (elided at a word, all of it in its
    tooltip), down to ``FLOOR_CHARS``. At 1024 px its 380 px left a passing message 250
    ("Imported 40 chats from a ChatGPT…"); the status area (``StatusArea.fit``) now sets
    its maximum width to what the sentence beside it leaves."""

    FLOOR_CHARS = (14, 28)  # the least it keeps: the model's name, within these

    def __init__(self, text: str = "", parent: QWidget | None = None):
        super().__init__(text, parent)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)

    def floor(self) -> int:
        """The least it gives way to: the model's name (what comes before " · "), within
        FLOOR_CHARS; its whole text when that is shorter."""
        digit = self.fontMetrics().horizontalAdvance("0")
        name = self.fontMetrics().horizontalAdvance(self.text().split(" · ")[0]) + 4
        least, most = (digit * n for n in self.FLOOR_CHARS)
        return min(self.sizeHint().width(), max(least, min(name, most)))

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        if self.changed is not None:  # laid out after the status area: the room is known now
            self.changed()


#: the status sentence's room at least, in characters ("Prefilling… 37%, 12 s left")
MIN_SENTENCE_CHARS = 26
#: the most it asks for, in characters, before the labels beside it give way (64 cut
#: the sentences that say why or what to do: "…3 characters' replies are marked with
#: their…", "Generating… 0.2 tok/s · slow: other programs keep the processor busy (load
#: 4.0 on 2…", while the model's label kept its whole width; a newcomer audit)
WANTED_SENTENCE_CHARS = 120


class StatusArea(QWidget):
    """The status sentence (``state``), a passing ``message`` and the ``progress`` bar."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("status-area")
        self.state = ElidedLabel("Starting…", self)
        self.state.setObjectName("status")
        self.message = ElidedLabel("", self)
        self.message.setObjectName("status-message")
        self.message.hide()
        self.progress = QProgressBar(self)
        self.progress.setRange(0, 0)  # busy until a fraction is known
        metrics = self.fontMetrics()
        self.progress.setMaximumWidth(metrics.horizontalAdvance("0") * 14)
        self.progress.setMaximumHeight(metrics.height())
        self.progress.setAccessibleName("Progress")
        self.progress.hide()
        self._busy = False
        #: the label that gives way to its sentence (``fit``): the model's
        self.yielding: YieldingLabel | None = None
        self._working = False  # a turn runs: its state is what the status bar says
        #: the background job's message shown now, and its time: it comes back after a turn
        self._background: tuple[str, int] | None = None
        self._pending: tuple[str, int] | None = None  # a background message held back
        # it keeps room for a short sentence whatever the text size; the labels beside it
        # give way first (an audit: at 14 pt an 800 px window left it 0 px, so prefill
        # progress, errors and "Copied" were never seen)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.state, 1)
        row.addWidget(self.message, 1)
        row.addWidget(self.progress)
        self.state.changed = self.message.changed = self.fit
        self._timer = QTimer(self, singleShot=True)
        self._timer.timeout.connect(self.end_message)

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        return QSize(self.fontMetrics().horizontalAdvance("0") * MIN_SENTENCE_CHARS,
                     max(self.state.minimumSizeHint().height(), self.progress.minimumHeight()))

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        return self.minimumSizeHint()  # what is left over is its stretch

    def give_way(self, label: YieldingLabel) -> None:
        """``label`` gives way to the sentence (``fit``), also when its own text changes."""
        self.yielding = label
        label.changed = self.fit
        self.fit()

    def wanted(self) -> int:
        """The room its sentence (or passing message) wants, up to WANTED_SENTENCE_CHARS."""
        shown = self.state if self.message.isHidden() else self.message
        digit = self.fontMetrics().horizontalAdvance("0")
        width = shown.fontMetrics().horizontalAdvance(" ".join(shown.text().split())) + digit
        return max(self.minimumSizeHint().width(), min(width, digit * WANTED_SENTENCE_CHARS))

    def fit(self) -> None:
        """The model's label beside it (``yielding``) gives way to the sentence shown: the
        two share the same room (their widths' sum), the sentence takes what it wants
        first, and the label what is left, down to its floor and up to its whole text."""
        label = self.yielding
        if label is None or not self.isVisible():
            return
        room = self.width() + label.width()
        most = max(label.floor(), min(room - self.wanted(), label.sizeHint().width()))
        if label.maximumWidth() != most:
            label.setMaximumWidth(most)

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        self.fit()

    def set_status(self, text: str) -> None:
        self.state.setText(text)

    def show_busy(self, text: str | None, fraction: float | None = None) -> None:
        """``text`` with the bar (busy, or ``fraction`` done); None hides the bar."""
        self._busy = text is not None
        self.progress.setVisible(self._busy and self.message.isHidden())
        if text is not None:
            self.state.setText(text)
            self.progress.setRange(0, 0 if fraction is None else 100)
            if fraction is not None:
                self.progress.setValue(int(fraction * 100))

    def set_working(self, working: bool) -> None:
        """A turn started (its state replaces a background message, which comes back after
        it) or ended (the latest background message held back meanwhile is shown)."""
        self._working = working
        if working and not self.message.isHidden():
            # the turn's state is what is said now: a background message comes back after
            # it, the last turn's passing word goes ("Cut off…" hid a whole next turn's
            # "Generating…" and read as that turn's end)
            if self._background is not None:
                self._pending = self._background
            self.end_message()
        elif not working:
            self._show_pending()

    def show_message(self, text: str, timeout_ms: int = 0, background: bool = False) -> None:
        """``text`` in the status sentence's place for ``timeout_ms`` (0: until the next).
        A ``background`` job's message waits while a turn runs or while a message the
        user caused is shown; only the latest one waiting is kept."""
        if background and self._held():
            self._pending = (text, timeout_ms)
            return
        self._background = (text, timeout_ms) if background else None
        self.message.setText(text)
        self.message.show()
        self.state.hide()
        self.fit()
        self.progress.hide()
        if timeout_ms > 0:
            self._timer.start(timeout_ms)
        else:
            self._timer.stop()

    def current_message(self) -> str:
        return "" if self.message.isHidden() else self.message.text()

    def end_message(self) -> None:
        self._timer.stop()
        self._background = None
        self.message.hide()
        self.state.show()
        self.fit()
        self.progress.setVisible(self._busy)
        self._show_pending()

    def start_background(self, text: str) -> None:
        """A background job the user just started says so: its words replace a passing
        message (it was held behind "Imported first.json.") but wait behind a turn's state."""
        if not self._working and self._background is None and not self.message.isHidden():
            self.end_message()
        self.show_message(text, 0, background=True)

    def withdraw(self, text: str) -> None:
        """A background message that no longer holds: dropped if waiting, ended if shown."""
        if self._pending is not None and self._pending[0] == text:
            self._pending = None
        if self._background is not None and self._background[0] == text:
            self.end_message()

    def _held(self) -> bool:
        """Must a background message wait (a turn runs, or the user's message is shown)?"""
        return self._working or (not self.message.isHidden() and self._background is None)

    def _show_pending(self) -> None:
        if self._pending is not None and not self._held():
            pending, self._pending = self._pending, None
            self.show_message(*pending, background=True)



class CacheWords(QObject):
    """What the KV cache did, in words that claim no more than happened: a restore says
    how many tokens it brought back, and the evaluation after it how many of the prompt
    were in the cache already (a chat changed since its state was saved reuses few)."""

    def __init__(self, app_state: Any = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.app_state = app_state
        self._reading: tuple[int, int] | None = None  # (tokens in the cache, of the prompt)

    @Slot(object)
    def show(self, event: CacheStatus) -> None:
        """``event`` in the status bar, unless a turn's state is said there (decided here,
        on the GUI thread, when the event comes: a send started before it stays said). A
        warm-up or prefill that gave way (a newer draft, the draft cleared, another chat
        opened, a send) or failed leaves "Ready" where its progress was (before:
        "Prefilling… 1,118 of 1,499 tokens (74%)" stayed over a minute, until the next
        send); while a model loads, the load's own words stay."""
        state = self.app_state
        if state.generating:
            return
        text = self.describe(event)
        if event.state != "stopped" or state.model_state == "ready":
            state.show_status(text)

    def describe(self, event: CacheStatus) -> str:
        if event.state == "stopped":  # its progress words go
            self._reading = None
            return "Ready"
        if event.state == "restored":
            return f"Restored {event.done:,} tokens of this chat from its saved cache"
        if event.state in ("warming", "prefilling"):
            if self._reading is None:  # the first batch: what was there before it began
                self._reading = (event.start, event.total)
            return event.describe()
        reading, self._reading = self._reading, None
        if event.state in ("prefilled", "warmed") and event.total:
            reading = (event.done, event.total)  # the runtime's own count (the first
            # batch's progress was past its first chunk: 128 tokens read were called cached)
        if event.state in ("prefilled", "warmed") and reading is not None:
            kept, total = reading
            done = "Prefilled" if event.state == "prefilled" else "Ready (warmed up)"
            return (f"{done}: {kept:,} of {total:,} prompt tokens came from the cache, "
                    f"{total - kept:,} were read now")
        return event.describe()
