"""The transcript: one QListView, one model, one painting delegate — never a widget per
message, so a 5,000-message thread opens at once.

The model (``transcript_model``) holds every entry of the thread but shows a window of
the newest ones; the delegate (``transcript_delegate``) lays out and paints them.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QPersistentModelIndex, Qt, QTimer, Signal
from PySide6.QtGui import QFontMetrics, QPainter, QPalette
from PySide6.QtWidgets import QAbstractItemView, QListView, QMenu

from iris_desktop.core.views import Entry
from iris_desktop.ui.transcript_delegate import TranscriptDelegate
from iris_desktop.ui.transcript_model import ENTRY_ROLE, PAGE, TranscriptModel

__all__ = ["PAGE", "TranscriptModel", "TranscriptDelegate", "TranscriptView"]


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
