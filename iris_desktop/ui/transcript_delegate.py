"""Lays out and paints the transcript's entries with cached ``QTextDocument``s (markdown
for the assistant); clicks on a tool card or a divider expand it, "Copy" copies."""

from __future__ import annotations

import re
from collections import OrderedDict

from PySide6.QtCore import QEvent, QRect, QRectF, QSize, Qt, Signal
from PySide6.QtGui import (
    QAbstractTextDocumentLayout,
    QColor,
    QFont,
    QFontDatabase,
    QFontMetrics,
    QGuiApplication,
    QPainter,
    QPalette,
    QPen,
    QTextCursor,
    QTextDocument,
    QTextFormat,
    QTextOption,
)
from PySide6.QtWidgets import QListView, QStyle, QStyledItemDelegate

from iris_desktop.core.views import ROLE_LABELS, Entry, arguments_text
from iris_desktop.ui.transcript_model import ENTRY_ROLE, TranscriptModel

#: text that markdown would render differently from plain text
_MARKDOWN = re.compile(r"[*_`#\[\]|>~<&\\]|^\s*(?:[-+]|\d+[.)])\s|^\s{4}|^\s*[=-]{3,}\s*$",
                       re.MULTILINE)


def _blend(a: QColor, b: QColor, t: float) -> QColor:
    return QColor(
        round(a.red() + (b.red() - a.red()) * t),
        round(a.green() + (b.green() - a.green()) * t),
        round(a.blue() + (b.blue() - a.blue()) * t),
    )


def _badges(entry: Entry) -> list[tuple[str, str]]:
    """(text, tone) pairs for the header; tone in info | warn | error | dim."""
    badges = []
    if entry.state == "pruned":
        badges.append(("cleared for the model", "info"))
    elif entry.state == "clipped":
        badges.append(("shortened for the model", "warn"))
    elif entry.state == "summarized":
        badges.append(("summarized", "dim"))
    elif entry.state == "dropped":
        badges.append(("not sent — waiting for compaction", "warn"))
    if entry.status == "streaming":
        badges.append(("generating…", "info"))
    elif entry.status == "interrupted":
        badges.append(("stopped", "warn"))
    elif entry.status == "error":
        badges.append(("failed", "error"))
    if entry.kind == "tool" and entry.error:
        badges.append(("error", "error"))
    return badges


class TranscriptDelegate(QStyledItemDelegate):
    """Lays out and paints entries; caches documents and heights per width."""

    copied = Signal(str)

    def __init__(self, view: QListView):
        super().__init__(view)
        self.view = view
        self._docs: OrderedDict[tuple, QTextDocument] = OrderedDict()
        self._heights: dict[tuple, int] = {}
        self._m: dict | None = None
        self._mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)

    # -- geometry -------------------------------------------------------------------------

    def _unit(self) -> int:
        return self._metrics()["u"]

    def _width(self) -> int:
        return max(self.view.viewport().width(), 200)

    def _metrics(self) -> dict:
        """Spacing in font units, so that 125–200% scaling keeps the proportions."""
        if self._m is None:
            u = QFontMetrics(self.view.font()).height()
            self._m = {"mx": round(u * 0.8), "my": round(u * 0.3), "pad": round(u * 0.55),
                       "header_h": round(u * 1.35), "u": u}
        return self._m

    def font_changed(self) -> None:
        self._m = None
        self._docs.clear()
        self._heights.clear()

    def _expanded(self, entry: Entry) -> bool:
        model = self.view.model()
        return isinstance(model, TranscriptModel) and entry.key in model.expanded

    def _doc(self, entry: Entry, width: int) -> QTextDocument:
        expanded = self._expanded(entry)
        key = (entry.key, entry.kind, width, len(entry.text), entry.status, expanded,
               len(entry.calls))
        doc = self._docs.get(key)
        if doc is not None:
            self._docs.move_to_end(key)
            return doc
        doc = QTextDocument()
        doc.setDocumentMargin(0)
        doc.setDefaultFont(self.view.font())
        option = QTextOption()
        option.setWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
        doc.setDefaultTextOption(option)
        if entry.kind == "tool":
            doc.setDefaultFont(self._mono)
            if expanded:
                doc.setPlainText(f"{arguments_text(entry.arguments)}\n{'─' * 12} output "
                                 f"{'─' * 12}\n{entry.text}")
            else:
                lines = entry.text.count("\n") + 1 if entry.text else 0
                args = " ".join(entry.arguments.split())
                args = args if len(args) <= 90 else args[:89] + "…"
                size = (f"{lines:,} line{'s' * (lines != 1)}, {len(entry.text):,} chars — click "
                        "to show the full output") if entry.text else "no output"
                doc.setPlainText(f"{args}  ·  {size}")
        elif entry.kind == "divider":
            if expanded:
                html = "".join(
                    f"<p><b>{_esc(label)}</b><br>{_esc(value).replace(chr(10), '<br>')}</p>"
                    for label, value in entry.fields)
                doc.setHtml(html)
            else:
                doc.setPlainText("")
        elif entry.role == "assistant" and (entry.calls or _MARKDOWN.search(entry.text)):
            text = entry.text or ("…" if entry.status == "streaming" else "")
            calls = "\n\n".join(f"`→ {c.replace('`', chr(39))}`" for c in entry.calls)
            doc.setMarkdown(text + ("\n\n" + calls if calls else ""))
            if "```" in text or "~~~" in text or "\n    " in text:
                _shade_code_blocks(doc)
        elif entry.role == "assistant":
            # no markdown syntax: plain text lays out the same, twice as fast
            doc.setPlainText(entry.text or ("…" if entry.status == "streaming" else ""))
        else:
            doc.setPlainText(entry.text)
        doc.setTextWidth(width)
        self._docs[key] = doc
        if len(self._docs) > 400:
            self._docs.popitem(last=False)
        return doc

    def _layout(self, entry: Entry, rect: QRect) -> dict:
        m = self._metrics()
        card = rect.adjusted(m["mx"], m["my"], -m["mx"], -m["my"])
        header = QRect(card.left() + m["pad"], card.top() + m["pad"] // 2,
                       card.width() - 2 * m["pad"], m["header_h"])
        body = QRect(card.left() + m["pad"], header.bottom() + 1,
                     card.width() - 2 * m["pad"], card.bottom() - header.bottom() - m["pad"])
        copy_w = QFontMetrics(self.view.font()).horizontalAdvance("Copy") + m["u"] // 2
        copy = QRect(header.right() - copy_w, header.top(), copy_w, header.height())
        return {"card": card, "header": header, "body": body, "copy": copy, **m}

    def body_width(self, width: int | None = None) -> int:
        m = self._metrics()
        return (width or self._width()) - 2 * m["mx"] - 2 * m["pad"]

    def _divider_title(self, entry: Entry, card: QRect) -> tuple[str, QRect, bool]:
        """(text, rect, fits on one line between two rules) for a divider's heading."""
        u = self._unit()
        font = QFont(self.view.font())
        font.setItalic(True)
        fm = QFontMetrics(font)
        title = f"{'▾' if self._expanded(entry) else '▸'} {entry.title}"
        one_line = fm.horizontalAdvance(title) + 4 * u <= card.width()
        if one_line:
            return title, QRect(card.left(), card.top(), card.width(), 2 * u), True
        bound = fm.boundingRect(QRect(0, 0, card.width() - 2 * u, 10_000),
                                int(Qt.TextFlag.TextWordWrap | Qt.AlignmentFlag.AlignHCenter),
                                title)
        return title, QRect(card.left() + u, card.top() + u // 2, card.width() - 2 * u,
                            bound.height() + u // 2), False

    def height_for(self, entry: Entry, width: int | None = None) -> int:
        width = width or self._width()
        key = (entry.key, width, self._expanded(entry), len(entry.text), entry.status,
               len(entry.calls))
        height = self._heights.get(key)
        if height is None:
            if len(self._heights) > 20_000:
                self._heights.clear()
            height = self._heights[key] = self._height(entry, width)
        return height

    def _height(self, entry: Entry, width: int) -> int:
        m = self._metrics()
        if entry.kind == "divider":
            width = width or self._width()
            card = QRect(0, 0, width - 2 * m["mx"], 100)
            _, title, _ = self._divider_title(entry, card)
            height = title.bottom() + m["u"] // 2 + 2 * m["my"]
            if self._expanded(entry):
                doc = self._doc(entry, self.body_width(width))
                height += int(doc.size().height()) + 1 + 2 * m["pad"]
            return height
        doc = self._doc(entry, self.body_width(width))
        body = int(doc.size().height()) + 1
        return 2 * m["my"] + m["pad"] // 2 + m["header_h"] + body + m["pad"]

    def sizeHint(self, option, index) -> QSize:
        entry = index.data(ENTRY_ROLE)
        if entry is None:
            return QSize(0, 0)
        width = self._width()
        return QSize(width - 2, self.height_for(entry, width))

    # -- painting -------------------------------------------------------------------------

    def paint(self, painter: QPainter, option, index) -> None:
        entry: Entry = index.data(ENTRY_ROLE)
        if entry is None:
            return
        pal = option.palette
        base, text = pal.color(QPalette.ColorRole.Base), pal.color(QPalette.ColorRole.Text)
        accent = pal.color(QPalette.ColorRole.Highlight)
        painter.save()
        # no antialiasing for the cards: an antialiased rounded rect costs ~10× more, and
        # streaming repaints them 30 times a second
        rect = QRect(option.rect.left(), option.rect.top(), self._width(), option.rect.height())
        g = self._layout(entry, rect)
        if entry.dimmed:
            painter.setOpacity(0.45)
        if entry.kind == "divider":
            self._paint_divider(painter, entry, g, pal)
            painter.restore()
            return
        if entry.kind == "notice":
            fill = _blend(base, QColor(220, 60, 40), 0.16)
        elif entry.role == "user":
            fill = _blend(base, accent, 0.13)
        elif entry.kind == "tool":
            fill = _blend(base, text, 0.06)
        else:
            fill = _blend(base, text, 0.025)
        card = g["card"]
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        painter.setPen(QPen(accent, 1.5) if selected else QPen(_blend(base, text, 0.12), 1))
        painter.setBrush(fill)
        radius = g["u"] * 0.45
        painter.drawRoundedRect(QRectF(card).adjusted(0.5, 0.5, -0.5, -0.5), radius, radius)
        if entry.kind == "tool":
            stripe = QColor(200, 60, 50) if entry.error else _blend(base, accent, 0.7)
            painter.fillRect(QRect(card.left() + 1, card.top() + round(radius),
                                   max(3, g["u"] // 5), card.height() - 2 * round(radius)), stripe)
        self._paint_header(painter, entry, g, pal, option)
        doc = self._doc(entry, self.body_width())
        painter.translate(g["body"].topLeft())
        ctx = QAbstractTextDocumentLayout.PaintContext()
        ctx.palette.setColor(QPalette.ColorRole.Text, text)
        ctx.clip = QRectF(0, 0, g["body"].width(), g["body"].height())
        painter.setClipRect(ctx.clip)
        doc.documentLayout().draw(painter, ctx)
        painter.restore()

    def _paint_header(self, painter, entry: Entry, g: dict, pal: QPalette, option) -> None:
        header: QRect = g["header"]
        font = QFont(self.view.font())
        font.setBold(True)
        painter.setFont(font)
        text = pal.color(QPalette.ColorRole.Text)
        painter.setPen(text)
        if entry.kind == "tool":
            arrow = "▾" if self._expanded(entry) else "▸"
            label = f"{arrow} Tool · {entry.tool_name}"
        elif entry.kind == "notice":
            label = "Iris could not answer"
        else:
            label = ROLE_LABELS.get(entry.role, entry.role.capitalize())
        fm = QFontMetrics(font)
        painter.drawText(header, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, label)
        x = header.left() + fm.horizontalAdvance(label) + g["u"] // 2
        small = QFont(self.view.font())
        small.setPointSizeF(max(6.0, small.pointSizeF() * 0.85))
        painter.setFont(small)
        sfm = QFontMetrics(small)
        base = pal.color(QPalette.ColorRole.Base)
        tones = {"info": pal.color(QPalette.ColorRole.Highlight), "warn": QColor(215, 140, 20),
                 "error": QColor(205, 55, 45), "dim": pal.color(QPalette.ColorRole.Mid)}
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)  # small pills: cheap
        for badge, tone in _badges(entry):
            w = sfm.horizontalAdvance(badge) + g["u"] // 2
            h = sfm.height() + 2
            r = QRectF(x, header.center().y() - h / 2, w, h)
            color = tones[tone]
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(_blend(base, color, 0.22))
            painter.drawRoundedRect(r, h / 2, h / 2)
            painter.setPen(_blend(color, text, 0.35))
            painter.drawText(r, Qt.AlignmentFlag.AlignCenter, badge)
            x += w + g["u"] // 3
        painter.setRenderHint(QPainter.RenderHint.Antialiasing, False)
        hovered = bool(option.state & (QStyle.StateFlag.State_MouseOver
                                       | QStyle.StateFlag.State_Selected))
        if hovered and entry.kind != "notice":
            painter.setFont(self.view.font())
            painter.setPen(pal.color(QPalette.ColorRole.Link))
            painter.drawText(g["copy"], Qt.AlignmentFlag.AlignCenter, "Copy")

    def _paint_divider(self, painter, entry: Entry, g: dict, pal: QPalette) -> None:
        card: QRect = g["card"]
        u = g["u"]
        font = QFont(self.view.font())
        font.setItalic(True)
        painter.setFont(font)
        fm = QFontMetrics(font)
        title, rect, one_line = self._divider_title(entry, card)
        rule = QPen(pal.color(QPalette.ColorRole.Mid), 1)
        if one_line:
            tw = fm.horizontalAdvance(title) + u
            mid, y = card.center().x(), rect.center().y()
            painter.setPen(rule)
            painter.drawLine(card.left(), y, mid - tw // 2, y)
            painter.drawLine(mid + tw // 2, y, card.right(), y)
        else:
            painter.setPen(rule)
            painter.drawLine(card.left(), card.top(), card.right(), card.top())
        painter.setPen(pal.color(QPalette.ColorRole.PlaceholderText))
        painter.drawText(rect, int(Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap), title)
        if self._expanded(entry):
            base, text = pal.color(QPalette.ColorRole.Base), pal.color(QPalette.ColorRole.Text)
            box = QRect(card.left(), rect.bottom() + u // 2, card.width(),
                        card.bottom() - rect.bottom() - u // 2)
            painter.setPen(QPen(_blend(base, text, 0.12), 1))
            painter.setBrush(_blend(base, text, 0.03))
            painter.drawRoundedRect(QRectF(box), u * 0.45, u * 0.45)
            doc = self._doc(entry, self.body_width())
            painter.translate(g["body"].left(), box.top() + g["pad"])
            ctx = QAbstractTextDocumentLayout.PaintContext()
            ctx.palette.setColor(QPalette.ColorRole.Text, text)
            doc.documentLayout().draw(painter, ctx)

    # -- clicks ---------------------------------------------------------------------------

    def editorEvent(self, event, model, option, index) -> bool:
        if event.type() != QEvent.Type.MouseButtonRelease or event.button() != Qt.MouseButton.LeftButton:
            return False
        entry: Entry = index.data(ENTRY_ROLE)
        if entry is None:
            return False
        rect = QRect(option.rect.left(), option.rect.top(), self._width(), option.rect.height())
        g = self._layout(entry, rect)
        pos = event.position().toPoint()
        if entry.kind != "divider" and entry.kind != "notice" and g["copy"].contains(pos):
            self.copy(entry)
            return True
        if entry.kind == "divider" or (entry.kind == "tool" and (
                g["header"].contains(pos) or not self._expanded(entry))):
            self.toggle(index)
            return True
        return False

    def copy(self, entry: Entry) -> None:
        QGuiApplication.clipboard().setText(entry.copy_text())
        self.copied.emit(entry.copy_text())

    def toggle(self, index) -> None:
        model = self.view.model()
        entry: Entry = index.data(ENTRY_ROLE)
        model.toggle(entry.key)
        self.sizeHintChanged.emit(index)
        self.view.viewport().update()


def _shade_code_blocks(doc: QTextDocument) -> None:
    """Give fenced code blocks a faint background (readable on light and dark palettes)."""
    block = doc.begin()
    shade = QColor(128, 128, 128, 38)
    while block.isValid():
        fmt = block.blockFormat()
        if fmt.hasProperty(QTextFormat.Property.BlockCodeFence) or fmt.nonBreakableLines():
            fmt.setBackground(shade)
            QTextCursor(block).setBlockFormat(fmt)
        block = block.next()


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
