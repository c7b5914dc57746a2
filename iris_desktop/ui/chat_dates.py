"""Each chat's date in the chat list, at the right of its first line: when it was last
written to (``updated_at``, the time the list is ordered by; an imported chat's is its
newest message's, as the app it came from dated it). Before, a chat showed no date at
all unless another chat had the same title, and 300 chats imported from ChatGPT read as
one undated list."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from PySide6.QtCore import QPointF, QRect, QSize, Qt
from PySide6.QtGui import QPalette, QTextLayout, QTextOption
from PySide6.QtWidgets import QApplication, QStyle, QStyleOptionViewItem

from iris_desktop.ui.search_marks import MarkedDelegate

#: an item's date as the list shows it (an item without one is drawn as before)
DATE_ROLE = Qt.ItemDataRole.UserRole + 5
#: the room between a title and its date, in pixels
_GAP = 10
#: the room the list keeps beside an item's text (its frame and scroll bar), as MarkedDelegate
_EDGE = 14


def list_day(stamp: float | None, now: float | None = None) -> str:
    """A chat's date, short: '14:05' today, 'yesterday', '7 Dec' this year, '7 Dec 2024'
    before (local time); "" for none or one that cannot be shown (year 0)."""
    if not stamp:
        return ""
    try:
        day = datetime.fromtimestamp(stamp)
    except (ValueError, OverflowError, OSError):
        return ""
    today = datetime.fromtimestamp(time.time() if now is None else now).date()
    if day.date() == today:
        return day.strftime("%H:%M")
    if day.date() == today - timedelta(days=1):
        return "yesterday"
    year = "" if day.year == today.year else f" {day.year}"
    return f"{day.day} {day.strftime('%b')}{year}"


def full_day(stamp: float | None) -> str:
    """'7 Dec 2024 14:05' (local time), for a tooltip; "" as :func:`list_day`."""
    try:
        day = datetime.fromtimestamp(stamp) if stamp else None
    except (ValueError, OverflowError, OSError):
        day = None
    return f"{day.day} {day.strftime('%b')} {day.year} {day.strftime('%H:%M')}" if day else ""


class DatedDelegate(MarkedDelegate):
    """A chat's row: its title (wrapped in the room its date leaves) and its date at the
    right of the first line, in the list's dimmer text colour (the highlighted text's
    on the selection). Rows without :data:`DATE_ROLE` (search hits, "No match", a chat
    whose title another has too: its second line says when, ``threads.told_apart``)
    are drawn as :class:`MarkedDelegate` draws them. The item's text stays its title:
    what a screen reader reads and what the tests and the search read."""

    def paint(self, painter, option, index) -> None:
        date = index.data(DATE_ROLE)
        if not date:
            super().paint(painter, option, index)
            return
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        text, opt.text = opt.text, ""
        style = opt.widget.style() if opt.widget is not None else QApplication.style()
        style.drawControl(QStyle.ControlElement.CE_ItemViewItem, opt, painter, opt.widget)
        area = style.subElementRect(QStyle.SubElement.SE_ItemViewItemText, opt, opt.widget)
        margin = style.pixelMetric(QStyle.PixelMetric.PM_FocusFrameHMargin, None, opt.widget) + 1
        area = area.adjusted(margin, 0, -margin, 0)
        room = opt.fontMetrics.horizontalAdvance(date)
        selected = bool(opt.state & QStyle.StateFlag.State_Selected)
        group = (QPalette.ColorGroup.Active if opt.state & QStyle.StateFlag.State_Active
                 else QPalette.ColorGroup.Inactive)
        ink = opt.palette.color(group, QPalette.ColorRole.HighlightedText if selected
                                else QPalette.ColorRole.Text)
        dim = ink if selected else opt.palette.color(group, QPalette.ColorRole.PlaceholderText)
        layout, height = _laid_out(text, opt, area.width() - room - _GAP)
        top = area.top() + max(0, (area.height() - height) // 2)
        painter.save()
        painter.setPen(ink)
        layout.draw(painter, QPointF(area.left(), top))
        painter.setFont(opt.font)
        painter.setPen(dim)
        painter.drawText(QRect(area.right() - room, top, room + 1, opt.fontMetrics.height()),
                         int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignTop), date)
        painter.restore()

    def sizeHint(self, option, index) -> QSize:
        size = super().sizeHint(option, index)
        date = index.data(DATE_ROLE)
        if not date:
            return size
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        width = (opt.widget.viewport().width() if opt.widget is not None else size.width()) - _EDGE
        width -= opt.fontMetrics.horizontalAdvance(date) + _GAP
        return QSize(size.width(), max(size.height(), _laid_out(opt.text, opt, width)[1] + 6))


def _laid_out(text: str, opt: QStyleOptionViewItem, width: int) -> tuple[QTextLayout, int]:
    """``text`` laid out in lines of ``width`` pixels, at word boundaries where it can
    (a word longer than the line anywhere, as the list wraps an item's text), and its
    height: no document is built, so a list of 3,000 chats is measured about as fast as
    before."""
    layout = QTextLayout(text.replace("\n", "\u2028"), opt.font)
    option = QTextOption()
    option.setWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
    layout.setTextOption(option)
    layout.beginLayout()
    height = 0.0
    while (line := layout.createLine()).isValid():
        line.setLineWidth(max(1, width))
        line.setPosition(QPointF(0, height))
        height += line.height()
    layout.endLayout()
    return layout, int(height + 0.999)
