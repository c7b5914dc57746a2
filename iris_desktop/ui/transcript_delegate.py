"""Lays out and paints the transcript's entries with cached documents (``highlight``:
markdown for the assistant, highlighted code blocks); says what a click hits (the header's
links: Copy, Continue, Regenerate (``card_links``); a code block's Copy, the ‹ n/m ›
switcher, a card to expand, text to select) and makes the one selectable editor over a
row's text (``transcript_text``)."""

from __future__ import annotations

from collections import OrderedDict

from PySide6.QtCore import QRect, QRectF, QSize, Qt, Signal
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
)
from PySide6.QtWidgets import QListView, QStyle, QStyledItemDelegate

from iris_desktop.core.views import Entry, arguments_text
from iris_desktop.ui.card_links import leftmost, link_at, link_rects, paint_header
from iris_desktop.ui.highlight import (
    CodeBlock,
    CodeTheme,
    MessageDocument,
    code_boxes,
    message_document,
    paint_code,
)
from iris_desktop.ui.highlight import blend as _blend
from iris_desktop.ui.transcript_model import ENTRY_ROLE, TranscriptModel
from iris_desktop.ui.transcript_parts import (
    chip_rects,
    column,
    paint_chips,
    shown_part,
    stopped_empty,
    switcher_rects,
)
from iris_desktop.ui.transcript_text import MessageText
from iris_desktop.untrusted import show_directional, show_untrusted


class TranscriptDelegate(QStyledItemDelegate):
    """Lays out and paints entries; caches documents and heights per width."""

    copied = Signal(str)

    def __init__(self, view: QListView):
        super().__init__(view)
        self.view = view
        self._docs: OrderedDict[tuple, MessageDocument] = OrderedDict()
        self._heights: dict[tuple, int] = {}
        self._m: dict | None = None
        self._theme: CodeTheme | None = None
        self._mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        #: the key of the row whose text the selectable editor shows (it paints it, not us)
        self.editing: str | None = None

    # -- geometry -------------------------------------------------------------------------

    def _unit(self) -> int:
        return self._metrics()["u"]

    def _width(self) -> int:
        return column(self.view.viewport().width(), self._unit())[1]

    def _left(self) -> int:
        return column(self.view.viewport().width(), self._unit())[0]

    def _metrics(self) -> dict:
        """Spacing in font units, so that 125–200% scaling keeps the proportions."""
        if self._m is None:
            u = QFontMetrics(self.view.font()).height()
            self._m = {"mx": round(u * 0.8), "my": round(u * 0.3), "pad": round(u * 0.55),
                       "header_h": round(u * 1.35), "u": u}
        return self._m

    def font_changed(self) -> None:
        """The font or the palette changed: every document is laid out again."""
        self._m = self._theme = None
        self._docs.clear()
        self._heights.clear()

    def _code_theme(self) -> CodeTheme:
        if self._theme is None:
            mono = QFont(self._mono)
            size = self.view.font().pointSizeF()
            if size > 0:
                mono.setPointSizeF(size * 0.95)
            self._theme = CodeTheme(self.view.palette(), mono)
        return self._theme

    def _small(self) -> QFont:
        small = QFont(self.view.font())
        small.setPointSizeF(max(6.0, small.pointSizeF() * 0.85))
        return small

    def _expanded(self, entry: Entry) -> bool:
        model = self.view.model()
        return isinstance(model, TranscriptModel) and entry.key in model.expanded

    def _doc(self, entry: Entry, width: int) -> MessageDocument:
        expanded = self._expanded(entry)
        key = (entry.key, entry.kind, width, hash(entry.text), entry.status, expanded,
               len(entry.calls), entry.can_regenerate)
        doc = self._docs.get(key)
        if doc is not None:
            self._docs.move_to_end(key)
            return doc
        if entry.kind in ("tool", "divider"):
            doc = MessageDocument(self._mono if entry.kind == "tool" else self.view.font())
            self._fill_card(doc, entry, expanded)
            doc.setTextWidth(width)
        else:
            text = entry.text or ("…" if entry.status == "streaming" else
                                  f"*{note}*" if (note := stopped_empty(entry)) else "")
            if entry.role == "assistant" and entry.calls:
                text += "\n\n" + "\n\n".join(f"`→ {c.replace('`', chr(39))}`" for c in entry.calls)
            shown, markdown = shown_part(text, entry.role == "assistant"), entry.role == "assistant"
            doc = message_document(show_directional(shown), self.view.font(), self._code_theme(),
                                   markdown=markdown, width=width,
                                   streaming=entry.status == "streaming", stored=text)
        self._docs[key] = doc
        if len(self._docs) > 400:
            self._docs.popitem(last=False)
        return doc

    def _fill_card(self, doc: MessageDocument, entry: Entry, expanded: bool) -> None:
        if entry.kind == "tool" and expanded:
            doc.setPlainText(show_directional(f"{arguments_text(entry.arguments)}\n{'─' * 12} "
                                              f"output {'─' * 12}\n{shown_part(entry.text, False)}"))
        elif entry.kind == "tool":
            lines = entry.text.count("\n") + 1 if entry.text else 0
            args = " ".join(entry.arguments.split())
            args = args if len(args) <= 90 else args[:89] + "…"
            size = (f"{lines:,} line{'s' * (lines != 1)}, {len(entry.text):,} chars — click "
                    "to show the full output") if entry.text else "no output"
            doc.setPlainText(show_directional(f"{args}  ·  {size}"))
        elif expanded:
            doc.setHtml("".join(
                f"<p><b>{_esc(label)}</b><br>{_esc(show_directional(value)).replace(chr(10), '<br>')}</p>"
                for label, value in entry.fields))

    def _layout(self, entry: Entry, rect: QRect) -> dict:
        m = self._metrics()
        u = m["u"]
        card = rect.adjusted(m["mx"], m["my"], -m["mx"], -m["my"])
        header = QRect(card.left() + m["pad"], card.top() + m["pad"] // 2,
                       card.width() - 2 * m["pad"], m["header_h"])
        body = QRect(card.left() + m["pad"], header.bottom() + 1,
                     card.width() - 2 * m["pad"], card.bottom() - header.bottom() - m["pad"])
        fm = QFontMetrics(self.view.font())
        links = link_rects(entry, header, fm, u)  # Copy, and Continue, Regenerate (card_links)
        g = {"card": card, "header": header, "body": body, "copy": links["copy"], **m,
             "links": links, "switch": switcher_rects(entry, leftmost(links), fm, u)}
        if entry.kind != "divider":
            text_h = self._doc(entry, self.body_width()).height()
            g["text"] = QRect(body.left(), body.top(), body.width(), text_h)
            g["chips"] = self._chips(entry, body.left(), body.top() + text_h, body.width())
        return g

    def _chips(self, entry: Entry, left: int, top: int, width: int) -> list[tuple[QRect, str]]:
        return chip_rects(entry, left, top, width, self._small(), self._unit())

    def body_width(self, width: int | None = None) -> int:
        m = self._metrics()
        return (width or self._width()) - 2 * m["mx"] - 2 * m["pad"]

    def _divider_title(self, entry: Entry, card: QRect) -> tuple[str, QRect, bool]:
        """(text, rect, fits on one line between two rules) for a divider's heading."""
        u = self._unit()
        font = QFont(self.view.font())
        font.setItalic(True)
        fm = QFontMetrics(font)
        title = f"{'▾' if self._expanded(entry) else '▸'} {show_directional(entry.title)}"
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
        key = (entry.key, width, self._expanded(entry), hash(entry.text), entry.status,
               len(entry.calls), tuple(tuple(a) for a in entry.attachments), entry.can_regenerate)
        height = self._heights.get(key)
        if height is None:
            if len(self._heights) > 20_000:
                self._heights.clear()
            height = self._heights[key] = self._height(entry, width)
        return height

    def _height(self, entry: Entry, width: int) -> int:
        m = self._metrics()
        if entry.kind == "divider":
            card = QRect(0, 0, width - 2 * m["mx"], 100)
            _, title, _ = self._divider_title(entry, card)
            height = title.bottom() + m["u"] // 2 + 2 * m["my"]
            if self._expanded(entry):
                height += self._doc(entry, self.body_width(width)).height() + 2 * m["pad"]
            return height
        body = self._doc(entry, self.body_width(width)).height()
        chips = self._chips(entry, 0, 0, self.body_width(width))
        if chips:
            body = body + chips[-1][0].bottom() + 1
        return 2 * m["my"] + m["pad"] // 2 + m["header_h"] + body + m["pad"]

    def sizeHint(self, option, index) -> QSize:
        entry, width = index.data(ENTRY_ROLE), self._width()
        return QSize(0, 0) if entry is None else QSize(width - 2, self.height_for(entry, width))

    def geometry(self, index) -> dict:
        """The layout of the row ``index`` in viewport coordinates (see ``_layout``)."""
        rect = self.view.visualRect(index)
        return self._layout(index.data(ENTRY_ROLE), QRect(rect.left() + self._left(), rect.top(),
                                                          self._width(), rect.height()))

    def code_copy_rects(self, index) -> list[QRect]:
        """Each code block's Copy button in the row ``index``, viewport coordinates."""
        g = self.geometry(index)
        doc = self._doc(index.data(ENTRY_ROLE), self.body_width())
        return [copy.toAlignedRect().translated(g["text"].topLeft()) for _, _, copy in code_boxes(doc)]

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
        rect = QRect(option.rect.left() + self._left(), option.rect.top(), self._width(),
                     option.rect.height())
        g = self._layout(entry, rect)
        if entry.dimmed:
            painter.setOpacity(0.45)
        if entry.kind == "divider":
            self._paint_divider(painter, entry, g, pal)
            painter.restore()
            return
        if entry.kind == "notice":  # an error red, a note plain
            fill = _blend(base, QColor(220, 60, 40), 0.16) if entry.error else _blend(
                base, accent, 0.05)
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
        paint_chips(painter, g["chips"], pal, fill, self._small(), g["u"])
        if entry.key != self.editing:  # else the editor over it shows this very document
            doc = self._doc(entry, self.body_width())
            painter.translate(g["text"].topLeft())
            painter.setClipRect(QRect(0, 0, g["text"].width(), g["text"].height()))
            paint_code(painter, doc, pal)
            ctx = QAbstractTextDocumentLayout.PaintContext()
            ctx.palette.setColor(QPalette.ColorRole.Text, text)
            doc.documentLayout().draw(painter, ctx)
        painter.restore()

    def header_label(self, entry: Entry, fm: QFontMetrics, width: int) -> str:
        """The card's heading: who speaks (an imported chat's speaker by name, shown as
        stored, escapes and all), or what the card is."""
        if entry.kind == "tool":
            return f"{'▾' if self._expanded(entry) else '▸'} Tool · {entry.tool_name}"
        label = show_untrusted(entry.speaker)
        if entry.name:  # a long name leaves room for the badges and the Copy button
            label = fm.elidedText(label, Qt.TextElideMode.ElideRight, width // 2)
        return label

    def _paint_header(self, painter, entry: Entry, g: dict, pal: QPalette, option) -> None:
        bold = QFont(self.view.font())
        bold.setBold(True)
        label = self.header_label(entry, QFontMetrics(bold), g["header"].width())
        hovered = bool(option.state & (QStyle.StateFlag.State_MouseOver
                                       | QStyle.StateFlag.State_Selected))
        paint_header(painter, entry, g, pal, (self.view.font(), bold, self._small()), label,
                     hovered)

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

    def target(self, index, pos) -> tuple[str, object]:
        """What a click at ``pos`` (viewport coordinates) on row ``index`` hits: (a link:
        "copy", "continue" or "regenerate", entry), ("code", CodeBlock), ("switch", ±1 or 0
        for an end), ("toggle", entry), ("text", entry) or ("", entry)."""
        entry: Entry = index.data(ENTRY_ROLE)
        g = self.geometry(index)
        if entry.kind == "divider":
            return "toggle", entry
        if link := link_at(entry, g["links"], pos):
            return link, entry
        if g["switch"] is not None:
            prev, _, nxt = g["switch"]
            at, count = entry.branch
            if prev.contains(pos):
                return "switch", -1 if at > 1 else 0
            if nxt.contains(pos):
                return "switch", 1 if at < count else 0
        if entry.kind == "tool" and (g["header"].contains(pos) or not self._expanded(entry)):
            return "toggle", entry
        text: QRect = g["text"]
        doc = self._doc(entry, self.body_width())
        for block, _, copy in code_boxes(doc):
            if copy.translated(text.left(), text.top()).contains(pos):
                return "code", block
        if text.contains(pos):
            return "text", entry
        return "", entry

    def copy_text(self, text: str) -> None:
        QGuiApplication.clipboard().setText(text)
        self.copied.emit(text)

    def copy(self, entry: Entry) -> None:
        self.copy_text(entry.copy_text())

    def copy_code(self, block: CodeBlock) -> None:
        """Exactly the block's code: no fences, no label."""
        self.copy_text(block.code)

    def toggle(self, index) -> None:
        model = self.view.model()
        entry: Entry = index.data(ENTRY_ROLE)
        model.toggle(entry.key)
        self.sizeHintChanged.emit(index)
        self.view.viewport().update()

    # -- the selectable editor (one row at a time, opened by the view) --------------------

    def createEditor(self, parent, option, index) -> MessageText:
        entry: Entry = index.data(ENTRY_ROLE)
        editor = MessageText(parent, self._doc(entry, self.body_width()), entry, self.copy_text)
        self.editing = entry.key
        return editor

    def updateEditorGeometry(self, editor, option, index) -> None:
        editor.setGeometry(self.geometry(index)["text"])

    def setEditorData(self, editor, index) -> None:
        pass  # read-only: the view closes the editor when the entry changes

    def setModelData(self, editor, model, index) -> None:
        pass

    def eventFilter(self, obj, event) -> bool:
        return False  # no commit-and-close on focus out, Tab or Escape: the view decides


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
