"""The transcript: one QListView, one model, one painting delegate — never a widget per
message, so a 5,000-message thread opens at once.

The model holds every entry of the thread (plain data from ``core.views``) but shows a
window of the newest ones; scrolling to the top reveals older pages. The delegate lays
out each entry with a cached ``QTextDocument`` (markdown for the assistant) and paints it;
clicks on a tool card or a divider expand it, "Copy" copies the message.
"""

from __future__ import annotations

import itertools
import re
from collections import OrderedDict
from dataclasses import replace

from PySide6.QtCore import (
    QAbstractListModel,
    QEvent,
    QModelIndex,
    QPersistentModelIndex,
    QRect,
    QRectF,
    QSize,
    Qt,
    QTimer,
    Signal,
)
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
from PySide6.QtWidgets import QAbstractItemView, QListView, QMenu, QStyle, QStyledItemDelegate

from iris_desktop.core.views import ROLE_LABELS, Entry, arguments_text

ENTRY_ROLE = Qt.ItemDataRole.UserRole + 1
#: text that markdown would render differently from plain text
_MARKDOWN = re.compile(r"[*_`#\[\]|>~<&\\]|^\s*(?:[-+]|\d+[.)])\s|^\s{4}|^\s*[=-]{3,}\s*$",
                       re.MULTILINE)
PAGE = 40  # entries laid out at first (a few screens), and revealed per scroll to the top


class TranscriptModel(QAbstractListModel):
    """Entries of one thread; rows are the newest ``len(all) - offset`` of them."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self._all: list[Entry] = []
        self._offset = 0
        self.expanded: set[str] = set()
        self._notices: list[tuple[int, Entry]] = []  # (anchor message id, entry)
        self._notice_seq = itertools.count(1)

    # -- Qt ------------------------------------------------------------------------------

    def rowCount(self, parent=QModelIndex()) -> int:  # noqa: B008 - Qt's signature
        return 0 if parent.isValid() else len(self._all) - self._offset

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < self.rowCount():
            return None
        entry = self._all[self._offset + index.row()]
        if role == ENTRY_ROLE:
            return entry
        if role == Qt.ItemDataRole.DisplayRole:
            return entry.copy_text()
        if role == Qt.ItemDataRole.AccessibleTextRole:
            return f"{ROLE_LABELS.get(entry.role, entry.kind)}: {entry.text[:500]}"
        return None

    # -- reading -------------------------------------------------------------------------

    @property
    def total(self) -> int:
        return len(self._all)

    @property
    def has_older(self) -> bool:
        return self._offset > 0

    def entries(self) -> list[Entry]:
        return list(self._all)

    def entry(self, row: int) -> Entry:
        return self._all[self._offset + row]

    def row_of(self, key: str) -> int | None:
        for i in range(len(self._all) - 1, self._offset - 1, -1):
            if self._all[i].key == key:
                return i - self._offset
        return None

    def last_message_id(self) -> int:
        for entry in reversed(self._all):
            if entry.message_id is not None:
                return entry.message_id
        return 0

    # -- changing ------------------------------------------------------------------------

    def clear(self) -> None:
        self.beginResetModel()
        self._all, self._offset = [], 0
        self._notices.clear()
        self.expanded.clear()
        self.endResetModel()

    def set_entries(self, entries: list[Entry]) -> None:
        """Show ``entries`` (plus this session's notices). When the rows are the same
        ones as now (a reload after a turn), only changed rows repaint: no flicker."""
        merged = self._with_notices(entries)
        if [e.key for e in merged] == [e.key for e in self._all]:
            for i, (old, new) in enumerate(zip(self._all, merged)):
                if old != new:
                    self._all[i] = new
                    if i >= self._offset:
                        index = self.index(i - self._offset)
                        self.dataChanged.emit(index, index)
            return
        self.beginResetModel()
        self._all = merged
        self._offset = max(0, len(merged) - PAGE)
        self.endResetModel()

    def _with_notices(self, entries: list[Entry]) -> list[Entry]:
        if not self._notices:
            return list(entries)
        out: list[Entry] = []
        pending = sorted(self._notices, key=lambda n: n[0])
        for entry in entries:
            while pending and entry.message_id is not None and pending[0][0] < entry.message_id:
                out.append(pending.pop(0)[1])
            out.append(entry)
        out.extend(n[1] for n in pending)
        return out

    def apply_states(self, states: dict[int, str]) -> None:
        """Set each message's state (verbatim | pruned | summarized | dropped)."""
        first = last = None
        for i, entry in enumerate(self._all):
            state = states.get(entry.message_id) if entry.message_id is not None else None
            if state is not None and state != entry.state:
                entry.state = state  # in place: a 5,000-entry thread changes thousands at once
                if i >= self._offset:
                    first = i if first is None else first
                    last = i
        if first is not None:
            self.dataChanged.emit(self.index(first - self._offset), self.index(last - self._offset))

    def append(self, entry: Entry) -> int:
        row = self.rowCount()
        self.beginInsertRows(QModelIndex(), row, row)
        self._all.append(entry)
        self.endInsertRows()
        return row

    def add_notice(self, text: str) -> int:
        """A message of the app's own (an error), kept in place across reloads."""
        entry = Entry("notice", f"n:{next(self._notice_seq)}", text=text, role="notice")
        self._notices.append((self.last_message_id(), entry))
        return self.append(entry)

    def update(self, row: int, **changes) -> None:
        i = self._offset + row
        self._all[i] = replace(self._all[i], **changes)
        index = self.index(row)
        self.dataChanged.emit(index, index)

    def append_text(self, row: int, text: str) -> None:
        i = self._offset + row
        self.update(row, text=self._all[i].text + text)

    def toggle(self, key: str) -> None:
        self.expanded.symmetric_difference_update({key})

    def load_older(self, count: int = PAGE) -> int:
        """Reveal up to ``count`` older entries at the top; returns how many."""
        count = min(count, self._offset)
        if count:
            self.beginInsertRows(QModelIndex(), 0, count - 1)
            self._offset -= count
            self.endInsertRows()
        return count

    def reveal(self, key: str) -> int | None:
        """Make sure the entry ``key`` is a row (revealing older pages); its row."""
        for i, entry in enumerate(self._all):
            if entry.key == key:
                if i < self._offset:
                    self.load_older(self._offset - i)
                return i - self._offset
        return None


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


class TranscriptView(QListView):
    """The list of entries; follows the newest one while the user is at the bottom."""

    copied = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.transcript = TranscriptModel(self)
        self.setModel(self.transcript)
        self.delegate = TranscriptDelegate(self)
        self.delegate.copied.connect(self.copied)
        self.setItemDelegate(self.delegate)
        self.setUniformItemSizes(False)
        self.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setResizeMode(QListView.ResizeMode.Adjust)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.setMouseTracking(True)
        self.setWordWrap(True)
        self.setFrameShape(QListView.Shape.NoFrame)
        self.setContextMenuPolicy(Qt.ContextMenuPolicy.DefaultContextMenu)
        self.verticalScrollBar().setSingleStep(QFontMetrics(self.font()).height() * 2)
        self.verticalScrollBar().valueChanged.connect(self._maybe_load_older)
        self.placeholder = "Start a conversation: type below and press Enter."
        self._follow = True
        self._relayout = QTimer(self, singleShot=True, interval=0)
        self._relayout.timeout.connect(self._do_relayout)

    # -- following the newest entry -------------------------------------------------------

    def at_bottom(self) -> bool:
        bar = self.verticalScrollBar()
        return bar.value() >= bar.maximum() - 4

    def content_changed(self, row: int | None = None) -> None:
        """Rows were added or one changed (a streamed token): relayout soon, keep the bottom
        in view. A changed row that kept its height only repaints (dataChanged did that)."""
        if row is not None:
            index = self.transcript.index(row)
            height = self.delegate.height_for(index.data(ENTRY_ROLE))
            if self.visualRect(index).height() == height:
                return
        self._follow = self._follow or self.at_bottom()
        self._relayout.start()

    def _do_relayout(self) -> None:
        self.doItemsLayout()
        if self._follow:
            self.scrollToBottom()
        self._follow = False

    def follow_bottom(self) -> None:
        self._follow = True
        self._relayout.start()

    def _maybe_load_older(self, value: int) -> None:
        if value > QFontMetrics(self.font()).height() * 3 or not self.transcript.has_older:
            return
        bar = self.verticalScrollBar()
        old_max, old_value = bar.maximum(), value
        if self.transcript.load_older():
            self.doItemsLayout()
            bar.setValue(old_value + bar.maximum() - old_max)

    def scroll_to_key(self, key: str) -> None:
        row = self.transcript.reveal(key)
        if row is None:
            return
        self.doItemsLayout()
        index = self.transcript.index(row)
        self.setCurrentIndex(index)
        self.scrollTo(index, QAbstractItemView.ScrollHint.PositionAtCenter)

    def current_entry(self) -> Entry | None:
        index = self.currentIndex()
        return index.data(ENTRY_ROLE) if index.isValid() else None

    # -- Qt -------------------------------------------------------------------------------

    def changeEvent(self, event) -> None:
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange):
            self.delegate.font_changed()
        super().changeEvent(event)

    def resizeEvent(self, event) -> None:
        at_bottom = self.at_bottom()
        super().resizeEvent(event)
        if at_bottom:
            self.follow_bottom()

    def paintEvent(self, event) -> None:
        super().paintEvent(event)
        if self.transcript.rowCount() == 0 and self.placeholder:
            painter = QPainter(self.viewport())
            painter.setPen(self.palette().color(QPalette.ColorRole.PlaceholderText))
            painter.drawText(self.viewport().rect(), Qt.AlignmentFlag.AlignCenter, self.placeholder)

    def contextMenuEvent(self, event) -> None:
        index = self.indexAt(event.pos())
        if not index.isValid():
            return
        entry: Entry = index.data(ENTRY_ROLE)
        menu = QMenu(self)
        menu.addAction("Copy message", lambda: self.delegate.copy(entry))
        if entry.kind in ("tool", "divider"):
            expanded = entry.key in self.transcript.expanded
            persistent = QPersistentModelIndex(index)
            menu.addAction("Collapse" if expanded else "Expand",
                           lambda: self.delegate.toggle(self.transcript.index(persistent.row())))
        menu.exec(event.globalPos())
