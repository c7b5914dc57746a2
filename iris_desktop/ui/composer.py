"""The composer: Enter sends, Shift+Enter is a newline, Esc stops; Send becomes Stop."""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget


class ComposerEdit(QPlainTextEdit):
    submitted = Signal()
    stopRequested = Signal()

    def keyPressEvent(self, event) -> None:
        key = event.key()
        if key in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            if event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
                self.insertPlainText("\n")
            else:
                self.submitted.emit()
            return
        if key == Qt.Key.Key_Escape:
            self.stopRequested.emit()
            return
        super().keyPressEvent(event)


class Composer(QWidget):
    """The draft box, the Send/Stop button and the draft's live token count."""

    sendRequested = Signal(str)
    stopRequested = Signal()
    draftChanged = Signal(str)  # debounced

    def __init__(self, parent=None):
        super().__init__(parent)
        self.edit = ComposerEdit(self)
        self.edit.setPlaceholderText("Message Iris  (Enter to send, Shift+Enter for a new line)")
        self.edit.setTabChangesFocus(True)
        self._line = QFontMetrics(self.edit.font()).lineSpacing()
        self._fit_height()
        self.button = QPushButton("Send", self)
        self.button.setDefault(True)
        self.tokens = QLabel("Draft: 0 tokens", self)
        self.tokens.setToolTip("Tokens of the draft, counted by the context engine")
        self.generating = False
        self._can_send = True

        side = QVBoxLayout()
        side.addWidget(self.button)
        side.addStretch(1)
        side.addWidget(self.tokens)
        row = QHBoxLayout(self)
        row.setContentsMargins(8, 4, 8, 6)
        row.addWidget(self.edit, 1)
        row.addLayout(side)

        self._debounce = QTimer(self, singleShot=True, interval=150)
        self._debounce.timeout.connect(lambda: self.draftChanged.emit(self.text()))
        self.edit.textChanged.connect(self._debounce.start)
        self.edit.textChanged.connect(self._fit_height)
        self.edit.submitted.connect(self._submit)
        self.edit.stopRequested.connect(self.stopRequested)
        self.button.clicked.connect(self._clicked)

    def _fit_height(self) -> None:
        """Grow with the draft from 2 to 8 lines, then scroll."""
        lines = max(2, min(8, self.edit.document().lineCount()))
        self.edit.setFixedHeight(lines * self._line + 2 * int(self.edit.frameWidth()) + 10)

    def text(self) -> str:
        return self.edit.toPlainText()

    def set_text(self, text: str) -> None:
        self.edit.setPlainText(text)

    def clear(self, quiet: bool = False) -> None:
        """Empty the draft; ``quiet``: without announcing a draft change (a send, whose
        reported request redraws everything that shows the draft)."""
        self.edit.clear()
        if quiet:
            self._debounce.stop()

    def set_generating(self, generating: bool) -> None:
        self.generating = generating
        self.button.setText("Stop" if generating else "Send")
        self.button.setToolTip("Stop generating (Esc)" if generating else "Send (Enter)")
        self._update_enabled()

    def set_can_send(self, can: bool, reason: str = "") -> None:
        """Sending needs a loaded model; the reason shows as a tooltip."""
        self._can_send = can
        self.edit.setPlaceholderText(
            "Message Iris  (Enter to send, Shift+Enter for a new line)" if can else
            (reason or "No model is loaded"))
        self.edit.viewport().update()  # the placeholder is not repainted on its own
        self._update_enabled()

    def _update_enabled(self) -> None:
        self.button.setEnabled(self.generating or self._can_send)

    def set_draft_tokens(self, count: int | None) -> None:
        self.tokens.setText("Draft: – tokens" if count is None else f"Draft: {count:,} tokens")

    def _clicked(self) -> None:
        if self.generating:
            self.stopRequested.emit()
        else:
            self._submit()

    def _submit(self) -> None:
        text = self.text()
        if self.generating or not self._can_send or not text.strip():
            return
        self.sendRequested.emit(text)
