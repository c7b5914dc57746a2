"""The transcript: one QListView, one model, one painting delegate — never a widget per
message, so a 5,000-message thread opens at once.

The model (``transcript_model``) holds every entry of the thread but shows a window of
the newest ones; the delegate (``transcript_delegate``) lays out and paints them. The one
widget over a row is the read-only editor opened when its text is pressed, so that part
of it can be selected (``transcript_text``); it closes when another row is pressed, when
it scrolls out of view or when its entry changes.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QModelIndex, QPersistentModelIndex, Qt, QTimer, Signal
from PySide6.QtGui import QFontMetrics, QKeySequence, QMouseEvent, QPainter, QPalette
from PySide6.QtWidgets import QAbstractItemView, QApplication, QListView, QMenu

from iris_desktop.core.views import Entry
from iris_desktop.ui.card_links import LinkedTranscript, message_menu
from iris_desktop.ui.transcript_delegate import TranscriptDelegate
from iris_desktop.ui.transcript_model import ENTRY_ROLE, MAX_ROWS, PAGE, TranscriptModel
from iris_desktop.ui.transcript_text import EditDialog, MessageText

__all__ = ["PAGE", "TranscriptModel", "TranscriptDelegate", "TranscriptView"]

_CURSORS = {"text": Qt.CursorShape.IBeamCursor, "copy": Qt.CursorShape.PointingHandCursor,
            "code": Qt.CursorShape.PointingHandCursor, "switch": Qt.CursorShape.PointingHandCursor,
            "toggle": Qt.CursorShape.PointingHandCursor,
            "continue": Qt.CursorShape.PointingHandCursor,
            "regenerate": Qt.CursorShape.PointingHandCursor}


class TranscriptView(QListView):
    """The list of entries; follows the newest one while the user is at the bottom."""

    copied = Signal(str)
    regenerateRequested = Signal(int)  # message id
    editRequested = Signal(int, str)  # message id, its new text
    continueRequested = Signal(int)  # message id
    switchRequested = Signal(int, int)  # message id, +1 or -1
    stopRequested = Signal()  # Esc while reading: the reply being written stops

    def __init__(self, parent=None):
        super().__init__(parent)
        self._text_row: QPersistentModelIndex | None = None  # the row the editor is over
        self._pressed: QPersistentModelIndex | None = None
        self._selecting = False  # a press went on to the editor: so do its drag and release
        self.transcript = LinkedTranscript(self)
        self.setModel(self.transcript)
        self.delegate = TranscriptDelegate(self)
        self.delegate.copied.connect(self.copied)
        self.setItemDelegate(self.delegate)
        self.setUniformItemSizes(False)
        self.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setResizeMode(QListView.ResizeMode.Adjust)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setMouseTracking(True)
        self.setWordWrap(True)
        self.setFrameShape(QListView.Shape.NoFrame)
        self.setContextMenuPolicy(Qt.ContextMenuPolicy.DefaultContextMenu)
        self.verticalScrollBar().setSingleStep(QFontMetrics(self.font()).height() * 2)
        self.verticalScrollBar().valueChanged.connect(self._scrolled)
        self.transcript.dataChanged.connect(self._entries_changed)
        self.transcript.modelAboutToBeReset.connect(self._forget_text)
        self.placeholder = "Start a conversation: type below and press Enter."
        self.setAccessibleName("Conversation")
        self.setAccessibleDescription("The messages of this chat; Home and End go to the "
                                      "first and the newest, the context menu has each "
                                      "message's actions; a stopped, failed or cut-off "
                                      "reply also shows Continue and Regenerate")
        self.edit_dialog: EditDialog | None = None
        self._follow = True
        self._loading = False  # a page is being revealed
        self._relayout = QTimer(self, singleShot=True, interval=0)
        self._relayout.timeout.connect(self._do_relayout)

    # -- following the newest entry -------------------------------------------------------

    def at_bottom(self) -> bool:  # at the newest entry, not only at the last row shown
        bar = self.verticalScrollBar()
        return bar.value() >= bar.maximum() - 4 and not self.transcript.has_newer

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
        if self._follow:
            self.transcript.show_newest()
        self.doItemsLayout()
        if self._follow:
            self.scrollToBottom()
        self._follow = False

    def follow_bottom(self) -> None:
        self._follow = True
        self._relayout.start()

    def _scrolled(self, value: int) -> None:
        editor_row = self._text_index()
        if editor_row is not None and not self.visualRect(editor_row).intersects(self.viewport().rect()):
            self.close_text()
        self._maybe_load_more(value)

    def _maybe_load_more(self, value: int) -> None:
        """Near the top, reveal the page before; near the bottom of the rows shown while
        newer entries are not rows, the page after; the text in view stays where it is."""
        if not self._loading:  # rows leaving move the bar before the layout: not the user
            self._loading = True
            try:
                self._load_more(value)
            finally:
                self._loading = False

    def _load_more(self, value: int) -> None:
        bar, near = self.verticalScrollBar(), QFontMetrics(self.font()).height() * 3
        if value <= near and self.transcript.has_older:
            count = self.transcript.load_older()
            self.doItemsLayout()
            bar.setValue(value + sum(self.delegate.height_for(self.transcript.entry(row))
                                     for row in range(count)))
        elif value >= bar.maximum() - near and self.transcript.has_newer:
            _, gone = self.transcript.load_newer()
            self.doItemsLayout()
            bar.setValue(value - sum(self.delegate.height_for(entry) for entry in gone))

    def _fill(self) -> None:
        """Reveal pages while the rows shown leave no scroll bar to reveal more with."""
        model = self.transcript
        while (not self.verticalScrollBar().maximum() and model.rowCount() < MAX_ROWS
               and (model.has_newer or model.has_older)):
            model.load_newer() if model.has_newer else model.load_older()
            self.doItemsLayout()

    def go_top(self) -> None:
        """To the first entry of the thread (its first page, shown in place of these)."""
        self.close_text()
        self._follow = False
        self.transcript.show_span(0, PAGE)
        self.doItemsLayout()
        self._fill()
        if self.transcript.rowCount():
            self.setCurrentIndex(self.transcript.index(0))
        self.scrollToTop()

    def go_bottom(self) -> None:
        self.close_text()
        if self.transcript.has_newer:
            self.transcript.show_newest()
            self.doItemsLayout()
        if self.transcript.rowCount():
            self.setCurrentIndex(self.transcript.index(self.transcript.rowCount() - 1))
        self.scrollToBottom()
        self.follow_bottom()

    def scroll_to_key(self, key: str) -> None:
        row = self.transcript.reveal(key)
        if row is None:
            return
        self.doItemsLayout()
        self._fill()
        row = self.transcript.row_of(key)
        index = self.transcript.index(row)
        self.setCurrentIndex(index)
        self.scrollTo(index, QAbstractItemView.ScrollHint.PositionAtCenter)

    def current_entry(self) -> Entry | None:
        index = self.currentIndex()
        return index.data(ENTRY_ROLE) if index.isValid() else None

    # -- the selectable text --------------------------------------------------------------

    def _text_index(self) -> QModelIndex | None:
        row = self._text_row
        if row is None or not row.isValid():
            return None
        return self.transcript.index(row.row())

    @property
    def text_editor(self) -> MessageText | None:
        """The editor over a row's text (at most one), or None."""
        index = self._text_index()
        return self.indexWidget(index) if index is not None else None

    def open_text(self, index: QModelIndex) -> MessageText | None:
        """Open the selectable editor over ``index``'s text (closing any other)."""
        current = self._text_index()
        if current is not None and current.row() == index.row():
            return self.text_editor
        self.close_text()
        self._text_row = QPersistentModelIndex(index)
        self.openPersistentEditor(index)
        return self.text_editor

    def close_text(self) -> None:
        index = self._text_index()
        if index is not None:
            self.closePersistentEditor(index)
        self._forget_text()
        self.viewport().update()

    def _forget_text(self) -> None:
        self._text_row = None
        self._selecting = False
        self.delegate.editing = None

    def _entries_changed(self, top: QModelIndex, bottom: QModelIndex, roles=()) -> None:
        editor = self.text_editor
        if editor is None or not top.row() <= self._text_row.row() <= bottom.row():
            return
        new: Entry = self._text_index().data(ENTRY_ROLE)
        old = editor.entry
        if (new.key, new.text, new.status, new.calls) != (old.key, old.text, old.status, old.calls):
            self.close_text()  # a streamed token: the painted row takes over again
        else:
            editor.entry = new

    def copy_selection(self) -> bool:
        """Copy the text selected in the editor; False (nothing copied) when none is."""
        editor = self.text_editor
        if editor is None or not editor.has_selection():
            return False
        editor.copy()
        return True

    def copy(self) -> None:
        """The selected text when there is some, else the current message."""
        if not self.copy_selection() and (entry := self.current_entry()) is not None:
            self.delegate.copy(entry)

    def toggle(self, index: QModelIndex) -> None:
        """Expand or collapse a tool card or a divider."""
        current = self._text_index()
        if current is not None and current.row() == index.row():
            self.close_text()
        self.delegate.toggle(index)

    # -- the actions of a message ---------------------------------------------------------

    def context_menu(self, index: QModelIndex) -> QMenu:
        """The menu for the row ``index`` (not shown: ``contextMenuEvent`` shows it)."""
        return message_menu(self, index)

    def edit_message(self, entry: Entry) -> EditDialog:
        """Ask for the message's new text (non-blocking); ``editRequested`` when it changed
        and is not blank."""
        if self.edit_dialog is not None:
            self.edit_dialog.deleteLater()
        loaded = self.transcript.entries()  # (every message after one shown is loaded)
        at = next((i for i, e in enumerate(loaded) if e.key == entry.key), len(loaded))
        later = sum(e.kind in ("message", "tool") for e in loaded[at + 1:])
        dialog = self.edit_dialog = EditDialog(entry.text, self, later)
        mid, old = entry.message_id, entry.text

        def saved() -> None:
            text = dialog.text()
            if text.strip() and text != old:
                self.editRequested.emit(mid, text)

        dialog.accepted.connect(saved)
        dialog.open()
        return dialog

    # -- Qt -------------------------------------------------------------------------------

    def changeEvent(self, event) -> None:
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange,
                            QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange):
            self.close_text()
            self.delegate.font_changed()
            self.viewport().update()
        super().changeEvent(event)

    def resizeEvent(self, event) -> None:
        at_bottom = self.at_bottom()
        if event.size().width() != event.oldSize().width():
            self.close_text()  # its document is laid out for the old width
        super().resizeEvent(event)
        if at_bottom:
            self.follow_bottom()

    def paintEvent(self, event) -> None:
        super().paintEvent(event)
        if self.transcript.rowCount() == 0 and self.placeholder:
            painter = QPainter(self.viewport())
            painter.setPen(self.palette().color(QPalette.ColorRole.PlaceholderText))
            painter.drawText(self.viewport().rect(), Qt.AlignmentFlag.AlignCenter, self.placeholder)

    def keyPressEvent(self, event) -> None:
        plain = event.modifiers() & ~Qt.KeyboardModifier.KeypadModifier in (
            Qt.KeyboardModifier.NoModifier, Qt.KeyboardModifier.ControlModifier)
        key, current = event.key(), self.currentIndex()
        alt = event.modifiers() & ~Qt.KeyboardModifier.KeypadModifier == Qt.KeyboardModifier.AltModifier
        if event.matches(QKeySequence.StandardKey.Copy):
            self.copy()
        elif key == Qt.Key.Key_Home and plain:
            self.go_top()
        elif key == Qt.Key.Key_End and plain:
            self.go_bottom()
        elif key == Qt.Key.Key_Escape and self.text_editor is not None:
            self.close_text()
            self.setFocus()
        elif key == Qt.Key.Key_Escape:
            self.stopRequested.emit()  # as in the message box
        elif current.isValid() and (key == Qt.Key.Key_Menu or (
                key == Qt.Key.Key_F10 and event.modifiers() == Qt.KeyboardModifier.ShiftModifier)):
            self.show_menu(current)  # Regenerate, Edit…, Continue, alternatives: by keyboard
        elif current.isValid() and alt and key in (Qt.Key.Key_Left, Qt.Key.Key_Right):
            entry: Entry = current.data(ENTRY_ROLE)
            if entry.branch is not None and entry.branch[1] > 1 and entry.message_id is not None:
                self.switchRequested.emit(entry.message_id, -1 if key == Qt.Key.Key_Left else 1)
        elif current.isValid() and key in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and plain:
            if editor := self.open_text(current):  # its text, to select by keyboard
                editor.setFocus(Qt.FocusReason.OtherFocusReason)
        else:
            super().keyPressEvent(event)

    def focusInEvent(self, event) -> None:
        """Tabbing in lands on the newest message in view (it landed on the oldest loaded
        one, off screen, or nowhere after a reload)."""
        rows, current = self.transcript.rowCount(), self.currentIndex()
        lost = not current.isValid() or not self.viewport().rect().intersects(self.visualRect(current))
        super().focusInEvent(event)  # (it makes the first row current when none is)
        if rows and lost and event.reason() in (Qt.FocusReason.TabFocusReason,
                                                Qt.FocusReason.BacktabFocusReason):
            self.setCurrentIndex(self.transcript.index(rows - 1))

    def show_menu(self, index: QModelIndex) -> None:
        """The row's menu, under its top left corner (the Menu key, Shift+F10)."""
        menu = self.context_menu(index)
        menu.exec(self.viewport().mapToGlobal(self.visualRect(index).topLeft()))
        menu.deleteLater()

    def _forward(self, event, editor: MessageText) -> None:
        viewport = editor.viewport()
        pos = viewport.mapFrom(self.viewport(), event.position().toPoint())
        QApplication.sendEvent(viewport, QMouseEvent(
            event.type(), pos, event.globalPosition(), event.button(), event.buttons(),
            event.modifiers()))

    def mousePressEvent(self, event) -> None:
        pos = event.position().toPoint()
        index = self.indexAt(pos)
        current = self._text_index()
        if current is not None and (not index.isValid() or index.row() != current.row()):
            self.close_text()
        self._pressed = QPersistentModelIndex(index) if index.isValid() else None
        super().mousePressEvent(event)
        if not index.isValid() or event.button() != Qt.MouseButton.LeftButton:
            return
        if self.delegate.target(index, pos)[0] == "text" and (editor := self.open_text(index)):
            editor.setFocus(Qt.FocusReason.MouseFocusReason)
            self._forward(event, editor)  # the selection starts at this very press
            self._selecting = True

    def mouseMoveEvent(self, event) -> None:
        editor = self.text_editor
        if self._selecting and editor is not None and event.buttons() & Qt.MouseButton.LeftButton:
            self._forward(event, editor)
            return
        super().mouseMoveEvent(event)
        index = self.indexAt(event.position().toPoint())
        kind = self.delegate.target(index, event.position().toPoint())[0] if index.isValid() else ""
        self.viewport().setCursor(_CURSORS.get(kind, Qt.CursorShape.ArrowCursor))

    def mouseReleaseEvent(self, event) -> None:
        editor = self.text_editor
        if self._selecting and editor is not None:
            self._forward(event, editor)
        self._selecting = False
        pos = event.position().toPoint()
        index = self.indexAt(pos)
        pressed, self._pressed = self._pressed, None
        super().mouseReleaseEvent(event)
        if (event.button() != Qt.MouseButton.LeftButton or not index.isValid() or pressed is None
                or pressed.row() != index.row()):
            return
        kind, what = self.delegate.target(index, pos)
        if kind == "copy":
            self.delegate.copy(what)
        elif kind == "continue":
            self.continueRequested.emit(what.message_id)
        elif kind == "regenerate":
            self.regenerateRequested.emit(what.message_id)
        elif kind == "code":
            self.delegate.copy_code(what)
        elif kind == "switch" and what:
            self.switchRequested.emit(index.data(ENTRY_ROLE).message_id, what)
        elif kind == "toggle":
            self.toggle(index)

    def contextMenuEvent(self, event) -> None:
        index = self.indexAt(event.pos())
        if index.isValid():
            menu = self.context_menu(index)
            menu.exec(event.globalPos())
            menu.deleteLater()
