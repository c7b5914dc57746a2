"""Two small painted widgets: the budget meter and the prompt-tokens chart.

Both draw numbers computed in core (``views.meter_parts``, ``views.chart_points``); the
meter's numbers are the engine's own Breakdown, so it can never disagree with the request.
"""

from __future__ import annotations

import html
from typing import Any

from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFontMetrics, QPainter, QPainterPath, QPalette, QPen
from PySide6.QtWidgets import QProgressBar, QSizePolicy, QWidget

from iris_desktop.core.meter_words import meter_heading, meter_lines, meter_rows, meter_tooltip
from iris_desktop.core.views import meter_parts, threshold_fraction, tokens
from iris_desktop.ui.boxes import plain_tip

#: one colour per segment, readable on light and dark palettes
PART_COLORS = {
    "system": QColor(120, 130, 150),
    "tools": QColor(160, 110, 200),
    "summary": QColor(220, 150, 40),
    "recall": QColor(200, 90, 110),
    "history": QColor(60, 140, 220),
    "draft": QColor(60, 180, 120),
}


#: the compaction mark (and the budget's while turns are left out; the chart's threshold)
MARK_RED = QColor(210, 50, 40)


def meter_table(breakdown: dict[str, Any], estimated: bool, before: str = "") -> str:
    """The meter's tooltip as rich text: ``before`` (sentences, one a line), the heading,
    the numbers in a table (right-aligned in their own column: padded with spaces, they
    zig-zagged in the tooltip's proportional font), then what the lines mean."""
    def para(text: str) -> str:
        return f"<p style='margin:0'>{html.escape(text, quote=False)}</p>"

    rows = "".join(f"<tr><td>{html.escape(label)}</td><td align='right' "
                   f"style='padding-left:16px'>{number}</td></tr>"
                   for label, number in meter_rows(breakdown))
    return ("<qt>" + "".join(para(line) for line in before.splitlines() if line)
            + para(meter_heading(breakdown, estimated))
            + f"<table cellspacing='0' cellpadding='1'>{rows}</table>"
            + "".join(para(line) for line in meter_lines(breakdown)) + "</qt>")


class BudgetMeter(QProgressBar):
    """Stacked bar system | tools | summary | recall | history | draft | free, threshold marked.

    A progress bar to assistive technology (tokens used of the window, the parts in its
    description), painted by itself; Tab reaches it so that it can be read."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.breakdown: dict[str, Any] | None = None
        self.estimated = False
        #: why there is no bar (a chat too large for the window, values to fix), drawn in it
        self.problem = ""
        #: earlier turns the request leaves out (past the budget, until compaction runs)
        self.dropped = 0
        self.setTextVisible(False)
        self.setRange(0, 1)
        self.setValue(0)
        self.setFocusPolicy(Qt.FocusPolicy.TabFocus)
        self.setAccessibleName("Context budget")
        # its bar gives way to the status sentence when the status bar is short of room
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.setToolTip("Context budget: no request built yet")
        self.setAccessibleDescription(self.toolTip())

    def minimumSizeHint(self) -> QSize:
        return QSize(QFontMetrics(self.font()).horizontalAdvance("0") * 28, self.sizeHint().height())

    def sizeHint(self) -> QSize:
        fm = QFontMetrics(self.font())
        return QSize(fm.horizontalAdvance("0") * 44, fm.height() + 4)

    def set_breakdown(self, breakdown: Any, estimated: bool = False, dropped: int = 0,
                      note: str = "") -> None:
        """Draw ``breakdown``; ``estimated`` when the counts are not the model's own;
        ``dropped``: the earlier turns the request leaves out (said first in the tooltip,
        and the budget's mark drawn in red: a chat can be under the compaction mark and
        still not send its oldest turns); ``note``: a line for the tooltip before the
        numbers (the model's n_ctx beside a smaller context.window)."""
        self.problem = ""
        self.breakdown = None if breakdown is None else (
            breakdown.as_dict() if hasattr(breakdown, "as_dict") else dict(breakdown))
        self.estimated = estimated
        self.dropped = dropped if self.breakdown else 0
        left_out = (f"{self.dropped:,} earlier turn{'s are' if self.dropped != 1 else ' is'} not "
                    "sent: past the budget (the dashed line). They are summarized when you send.\n"
                    if self.dropped else "")
        note = f"{note}\n" if note else ""
        plain = (left_out + note + meter_tooltip(self.breakdown, estimated) if self.breakdown
                 else "Context budget: no request built yet")
        self.setToolTip(meter_table(self.breakdown, estimated, left_out + note)
                        if self.breakdown else plain)
        b = self.breakdown or {"used": 0, "window": 1}
        self.setRange(0, max(int(b["window"]), 1))
        self.setValue(min(int(b["used"]), self.maximum()))
        self.setAccessibleDescription(  # the words, not the table's markup
            (f"{tokens(b['used'])} of {tokens(b['window'])} tokens used. " if self.breakdown
             else "") + plain)
        self.update()

    def set_problem(self, sentence: str, painted: str = "") -> None:
        """No bar, and ``sentence`` in its place (as much as fits; all of it in the tooltip
        and the description), or ``painted`` where the whole sentence is shown beside it:
        a chat too large for the window emptied the meter without a word (only the
        inspector said why)."""
        self.set_breakdown(None)
        self.problem = painted or sentence
        self.setToolTip(plain_tip(sentence))  # wrapped, word for word
        self.setAccessibleDescription(sentence)
        self.update()

    def parts(self):
        return meter_parts(self.breakdown) if self.breakdown else []

    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        pal = self.palette()
        fm = QFontMetrics(self.font())
        # a sentence in place of the bar takes the numbers' room too
        label_w = 0 if self.problem else fm.horizontalAdvance("000,000 / 000,000") + 8
        bar = QRectF(1, 3, self.width() - label_w - 2, self.height() - 6)
        focused = self.hasFocus()  # reached with Tab: the bar is outlined in the focus colour
        painter.setPen(QPen(pal.color(QPalette.ColorRole.Highlight if focused
                                      else QPalette.ColorRole.Mid), 2 if focused else 1))
        painter.setBrush(pal.color(QPalette.ColorRole.Base))
        painter.drawRoundedRect(bar, 3, 3)
        if not self.breakdown:
            if self.problem:
                room = bar.adjusted(6, 0, -6, 0)
                painter.setPen(pal.color(QPalette.ColorRole.WindowText))
                painter.drawText(room, Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft,
                                 fm.elidedText(self.problem, Qt.TextElideMode.ElideRight,
                                               int(room.width())))
            return
        x = bar.left()
        clip = QPainterPath()
        clip.addRoundedRect(bar, 3, 3)
        painter.setClipPath(clip)
        painter.setPen(Qt.PenStyle.NoPen)
        for part in self.parts():
            if part.name == "free":
                continue
            w = bar.width() * part.fraction
            painter.setBrush(PART_COLORS[part.name])
            painter.drawRect(QRectF(x, bar.top(), w, bar.height()))
            x += w
        painter.setClipping(False)
        # the budget: history past it is not sent (until compaction): a dashed mark, red
        # when turns are being left out right now
        b = self.breakdown
        bx = bar.left() + bar.width() * min(int(b["budget"]) / max(int(b["window"]), 1), 1.0)
        dashed = QPen(MARK_RED if self.dropped else pal.color(QPalette.ColorRole.Mid), 1)
        dashed.setStyle(Qt.PenStyle.DashLine)
        painter.setPen(dashed)
        painter.drawLine(QPointF(bx, 1), QPointF(bx, self.height() - 1))
        tx = bar.left() + bar.width() * min(threshold_fraction(self.breakdown), 1.0)
        painter.setPen(QPen(MARK_RED, 2))
        painter.drawLine(QPointF(tx, 0), QPointF(tx, self.height()))
        painter.setPen(pal.color(QPalette.ColorRole.WindowText))
        painter.drawText(QRectF(bar.right() + 6, 0, label_w, self.height()),
                         Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft,
                         ("≈" if self.estimated else "") + f"{tokens(b['used'])} / {tokens(b['window'])}")


class PromptChart(QWidget):
    """Prompt tokens per request for one thread, compactions as vertical marks. Its
    legend is a label under it (the inspector's), so no text is painted over the plot:
    only the axis' two numbers, left of it, as wide as they need."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.points: dict[str, Any] = {"values": [], "compactions": [], "window": 0}
        self.threshold: int | None = None
        self.setMinimumHeight(QFontMetrics(self.font()).height() * 8)

    def changeEvent(self, event) -> None:
        if event.type() == event.Type.FontChange:  # 8 lines of the new text size
            self.setMinimumHeight(QFontMetrics(self.font()).height() * 8)
        super().changeEvent(event)

    def top(self) -> int:
        values = self.points.get("values", [])
        return max([*values, self.points.get("window") or 0, self.threshold or 0, 1])

    def regions(self) -> dict[str, Any]:
        """Where things go: ``plot`` (the area), ``labels`` (the axis' numbers, text and
        rect, each left of the plot and inside the widget)."""
        fm = QFontMetrics(self.font())
        texts = [f"{self.top():,}", "0"]
        left = max(fm.horizontalAdvance(t) for t in texts) + 8
        half = fm.height() / 2
        plot = QRectF(left, half + 1, max(self.width() - left - 8, 1),
                      max(self.height() - fm.height() - 2, 1))
        labels = [(texts[0], QRectF(0, plot.top() - half, left - 4, fm.height())),
                  (texts[1], QRectF(0, plot.bottom() - half, left - 4, fm.height()))]
        return {"plot": plot, "labels": labels}

    def set_points(self, points: dict[str, Any], threshold: int | None = None) -> None:
        self.points = points
        self.threshold = threshold
        self.update()

    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        pal = self.palette()
        values: list[int] = self.points.get("values", [])
        regions = self.regions()
        area = regions["plot"]
        painter.setPen(QPen(pal.color(QPalette.ColorRole.Mid), 1))
        painter.drawRect(area)
        if not values:
            painter.setPen(pal.color(QPalette.ColorRole.PlaceholderText))
            painter.drawText(area, Qt.AlignmentFlag.AlignCenter, "No requests in this thread yet")
            return
        top = self.top()
        n = len(values)
        x_of = lambda i: area.left() + (area.width() * (i + 0.5) / n)
        y_of = lambda v: area.bottom() - area.height() * v / top
        painter.setPen(pal.color(QPalette.ColorRole.WindowText))
        for text, rect in regions["labels"]:
            painter.drawText(rect, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter,
                             text)
        if self.threshold:  # solid red, as on the meter (where dashed is the budget)
            painter.setPen(QPen(MARK_RED, 2))
            y = y_of(self.threshold)
            painter.drawLine(QPointF(area.left(), y), QPointF(area.right(), y))
        painter.setPen(QPen(QColor(220, 150, 40), 2))
        for mark in self.points.get("compactions", []):
            x = area.left() + area.width() * mark["index"] / n
            painter.drawLine(QPointF(x, area.top()), QPointF(x, area.bottom()))
        path = QPainterPath()
        for i, v in enumerate(values):
            point = QPointF(x_of(i), y_of(v))
            path.moveTo(point) if i == 0 else path.lineTo(point)
        painter.setPen(QPen(PART_COLORS["history"], 2))
        painter.setBrush(Qt.BrushStyle.NoBrush)
        painter.drawPath(path)
        painter.setBrush(PART_COLORS["history"])
        if n <= 200:
            for i, v in enumerate(values):
                painter.drawEllipse(QPointF(x_of(i), y_of(v)), 2.5, 2.5)
