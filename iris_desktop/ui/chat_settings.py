"""A chat's own settings: its title and its system prompt (empty: the global
``chat.system_prompt``). Stored on the thread; the engine counts the prompt like the
global one, and a change makes the next request plan anew. A new chat (no thread yet)
gets them too: saving makes its thread, so the first message already has its prompt."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QWidget,
)

from iris_desktop.ui.discard import AsksBeforeDiscarding


class ChatSettingsDialog(AsksBeforeDiscarding, QDialog):
    """Edit one chat's title and system prompt; ``saved(thread_id, title, prompt)`` on
    Save (``thread_id`` None: a chat not begun yet; ``prompt`` None: use the global one).
    Cancel asks first when either was changed."""

    changes_name = "your changes to this chat's settings"

    saved = Signal(object, str, object)

    def __init__(self, thread_id: int | None, title: str, prompt: str | None, default_prompt: str,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("chat-settings")
        self.setWindowTitle("Chat settings")
        self.thread_id = thread_id
        self.original = (title, prompt or "")
        self.title = QLineEdit(title, self)
        self.title.setAccessibleName("Chat title")
        self.prompt = QPlainTextEdit(prompt or "", self)
        self.prompt.setTabChangesFocus(True)  # Tab goes on to Save, as in every field
        self.prompt.setAccessibleName("System prompt of this chat")
        self.prompt.setPlaceholderText(default_prompt or "(no system prompt)")
        self.prompt.setMinimumHeight(self.fontMetrics().height() * 8)
        note = QLabel("The instructions every request of this chat starts with. Leave it "
                      "empty to use the one in Preferences (chat.system_prompt), shown "
                      "greyed out.", self)
        note.setWordWrap(True)
        if thread_id is None:
            note.setText(note.text() + " This chat has not begun: saving starts it, so its "
                         "first message already gets this prompt.")
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel, self)
        self.buttons.accepted.connect(self._save)
        self.buttons.rejected.connect(self.reject)
        form = QFormLayout(self)
        form.addRow("Title", self.title)
        form.addRow("System prompt", self.prompt)
        form.addRow(note)
        form.addRow(self.buttons)
        self.resize(self.fontMetrics().averageCharWidth() * 80, self.sizeHint().height())

    def has_changes(self) -> bool:
        return (self.title.text(), self.prompt.toPlainText()) != self.original

    def _save(self) -> None:
        title = " ".join(self.title.text().split()) or "Chat"
        prompt = self.prompt.toPlainText()
        self.saved.emit(self.thread_id, title, prompt if prompt.strip() else None)
        self.accept()
