"""A search hit in the chat list: its snippet with the found words in bold (as a search
engine shows them), where the list showed them in [brackets] that a message's own
brackets ("a[i]") could not be told from."""

from __future__ import annotations

import html
import re

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QAbstractTextDocumentLayout, QPalette, QTextDocument, QTextOption
from PySide6.QtWidgets import QApplication, QStyle, QStyledItemDelegate, QStyleOptionViewItem

from iris_desktop.untrusted import show_directional

#: an item's rich text (HTML), where it has one: the delegate paints it in place of its text
MARKED_ROLE = Qt.ItemDataRole.UserRole + 4


def marked_line(text: str, marks: list[tuple[int, int]] | list[list[int]]) -> tuple[str, str]:
    """``text`` as one line (its runs of spaces and line breaks one space), plain and as
    HTML with each of ``marks`` (start, end) in bold; both with direction characters shown
    as escapes (:func:`show_directional`)."""
    parts, at = [], 0
    for start, end in sorted((int(a), int(b)) for a, b in marks):
        if start < at or end > len(text):
            continue  # (overlapping or outside: never from the store; skipped, not drawn wrong)
        parts += [(text[at:start], False), (text[start:end], True)]
        at = end
    parts.append((text[at:], False))
    parts = [(show_directional(re.sub(r"\s+", " ", part)), bold) for part, bold in parts]
    plain = "".join(part for part, _ in parts).strip()
    rich = "".join(f"<b>{html.escape(part)}</b>" if bold else html.escape(part) for part, bold in parts)
    return plain, rich.strip()


class MarkedDelegate(QStyledItemDelegate):
    """Paints an item that has :data:`MARKED_ROLE` as rich text (the selection, focus and
    background as the style draws any item); others as before. Its plain text stays the
    item's text: what a screen reader reads, what is copied and searched."""

    def _document(self, option: QStyleOptionViewItem, rich: str, width: int) -> QTextDocument:
        doc = QTextDocument()
        doc.setDocumentMargin(0)
        doc.setDefaultFont(option.font)
        doc.setDefaultTextOption(QTextOption(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter))
        doc.setHtml(rich)
        doc.setTextWidth(max(width, 1))
        return doc

    def paint(self, painter, option, index) -> None:
        rich = index.data(MARKED_ROLE)
        if not rich:
            super().paint(painter, option, index)
            return
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        opt.text = ""
        style = opt.widget.style() if opt.widget is not None else QApplication.style()
        style.drawControl(QStyle.ControlElement.CE_ItemViewItem, opt, painter, opt.widget)
        area = style.subElementRect(QStyle.SubElement.SE_ItemViewItemText, opt, opt.widget)
        margin = style.pixelMetric(QStyle.PixelMetric.PM_FocusFrameHMargin, None, opt.widget) + 1
        area = area.adjusted(margin, 0, -margin, 0)  # (where the style draws an item's text)
        doc = self._document(opt, rich, area.width())
        context = QAbstractTextDocumentLayout.PaintContext()
        selected = bool(opt.state & QStyle.StateFlag.State_Selected)
        group = (QPalette.ColorGroup.Active if opt.state & QStyle.StateFlag.State_Active
                 else QPalette.ColorGroup.Inactive)
        role = QPalette.ColorRole.HighlightedText if selected else QPalette.ColorRole.Text
        context.palette.setColor(QPalette.ColorRole.Text, opt.palette.color(group, role))
        painter.save()
        painter.translate(area.left(), area.top() + max(0, (area.height() - doc.size().height()) / 2))
        painter.setClipRect(QRectF(0, 0, area.width(), area.height()))
        doc.documentLayout().draw(painter, context)
        painter.restore()

    def sizeHint(self, option, index) -> QSize:
        size = super().sizeHint(option, index)
        rich = index.data(MARKED_ROLE)
        if not rich:
            return size
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        width = (opt.widget.viewport().width() if opt.widget is not None else size.width()) - 14
        doc = self._document(opt, rich, width)
        return QSize(size.width(), max(size.height(), int(doc.size().height()) + 6))
