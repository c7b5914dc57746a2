"""The widgets over the transcript's painted rows: the read-only editor that lets a
row's text be selected in part, and the dialog that edits a user message."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QColor, QKeySequence, QPainter, QPalette
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFrame,
    QLabel,
    QPlainTextEdit,
    QTextEdit,
    QVBoxLayout,
    QWidget,
)

from iris_desktop.core.views import Entry
from iris_desktop.ui.discard import AsksBeforeDiscarding
from iris_desktop.ui.highlight import MessageDocument, code_block_at, paint_code

#: keys the transcript handles even while its editor has the focus
_VIEW_KEYS = (Qt.Key.Key_Home, Qt.Key.Key_End, Qt.Key.Key_Escape)


class MessageText(QTextEdit):
    """One row's text, selectable by mouse and keyboard: it shows the delegate's own
    document for that row (so it looks exactly like the painted row) over the row."""

    def __init__(self, parent: QWidget, doc: MessageDocument, entry: Entry,
                 copy_text: Callable[[str], None]):
        """``copy_text`` puts text on the clipboard and says so (the view's ``copied``)."""
        super().__init__(parent)
        self.entry = entry
        self.copy_text = copy_text
        self._doc = doc  # the delegate's cache may drop it while it is shown here
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setReadOnly(True)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse
                                     | Qt.TextInteractionFlag.TextSelectableByKeyboard)
        self.setContextMenuPolicy(Qt.ContextMenuPolicy.NoContextMenu)  # the view's menu
        self.setWordWrapMode(doc.defaultTextOption().wrapMode())
        self.setLineWrapMode(QTextEdit.LineWrapMode.FixedPixelWidth)
        self.setLineWrapColumnOrWidth(round(doc.textWidth()))
        self.setFont(doc.defaultFont())  # a QTextEdit gives its document its own font
        self.setAutoFillBackground(False)
        self.viewport().setAutoFillBackground(False)
        palette = self.palette()
        palette.setColor(QPalette.ColorRole.Base, QColor(0, 0, 0, 0))
        self.setPalette(palette)
        self.setDocument(doc)
        self.setAccessibleName(f"Text of the message from {entry.speaker}"
                               if entry.kind == "message" else "Text of the card")

    def copy(self) -> None:
        """The selection, or the whole message when nothing is selected."""
        cursor = self.textCursor()
        self.copy_text(cursor.selection().toPlainText() if cursor.hasSelection()
                       else self.entry.copy_text())

    def has_selection(self) -> bool:
        return self.textCursor().hasSelection()

    def paintEvent(self, event) -> None:
        painter = QPainter(self.viewport())
        paint_code(painter, self.document(), self.parentWidget().palette())  # ours has no Base
        painter.end()
        super().paintEvent(event)

    def mousePressEvent(self, event) -> None:
        pos = event.position()
        block = code_block_at(self.document(), pos.x(), pos.y())
        if block is not None and event.button() == Qt.MouseButton.LeftButton:
            self.copy_text(block.code)
            event.accept()
            return
        super().mousePressEvent(event)

    def keyPressEvent(self, event) -> None:
        if event.matches(QKeySequence.StandardKey.Copy):
            self.copy()
            return
        if event.key() in _VIEW_KEYS and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            event.ignore()  # on to the view
            return
        super().keyPressEvent(event)

    def wheelEvent(self, event) -> None:
        event.ignore()  # the transcript scrolls, not this one row


class EditDialog(AsksBeforeDiscarding, QDialog):
    """Asks for a message's new text: a multi-line field prefilled with it, a line saying
    what sending it does, "Send as a new version" (the box's Save button), Cancel (which
    asks first when the text was changed). ``later``: the messages shown after this one,
    which go behind the switcher (None: more than are loaded). Before, it said only
    "Save", and the later turns vanished without a word (a newcomer's audit)."""

    changes_name = "your edit of this message"

    def __init__(self, text: str, parent: QWidget | None = None, later: int | None = 0):
        super().__init__(parent)
        self.original = text
        self.setWindowTitle("Edit message")
        self.editor = QPlainTextEdit(text)
        self.editor.setAccessibleName("The message's new text")
        self.editor.setAccessibleDescription("Ctrl+Enter sends it; Tab goes on to the buttons")
        self.editor.setTabChangesFocus(True)  # Tab went into the message as a tab character
        after = ("" if later == 0 else " and the messages after it" if later is None
                 else f" and the {later} message{'s' if later != 1 else ''} after it")
        self.note = QLabel(f"Iris answers the edited message as a new version of the chat "
                           f"from here; this version{after} stay{'s' if not after else ''} "
                           "behind the ‹ › switcher on the message.")
        self.note.setWordWrap(True)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save
                                        | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.button(QDialogButtonBox.StandardButton.Save).setText("Send as a new version")
        self.editor.installEventFilter(self)  # Ctrl+Enter saves (the box takes a shortcut's)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.editor)
        layout.addWidget(self.note)
        layout.addWidget(self.buttons)
        self.resize(560, 320)

    def text(self) -> str:
        return self.editor.toPlainText()

    def has_changes(self) -> bool:
        return self.text() != self.original

    def eventFilter(self, watched, event) -> bool:
        if (watched is self.editor and event.type() == QEvent.Type.KeyPress
                and event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
                and event.modifiers() & Qt.KeyboardModifier.ControlModifier):
            self.accept()
            return True
        return super().eventFilter(watched, event)
