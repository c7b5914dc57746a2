"""The unsent draft, kept per chat: what is typed is written to ``ui-state.ini`` a moment
after each pause (and synced to disk), so a crash, a power cut or switching chats loses
nothing; opening a chat brings its draft back, a new chat has one of its own, and a sent
message leaves an empty box (and no saved draft)."""

from __future__ import annotations

from PySide6.QtCore import QObject, QSettings, QTimer

from iris_desktop.ui.app_state import AppState
from iris_desktop.ui.composer import Composer

#: the pause in typing after which the draft is written
SAVE_PAUSE_MS = 400
NEW_CHAT = "new"


def draft_key(thread_id: int | None) -> str:
    return f"drafts/{NEW_CHAT if thread_id is None else int(thread_id)}"


class DraftControl(QObject):
    """Saves the composer's text for the chat it belongs to, and restores it."""

    def __init__(self, app_state: AppState, composer: Composer, ui_state: QSettings,
                 parent: QObject | None = None):
        super().__init__(parent)
        self.app_state = app_state
        self.composer = composer
        self.ui_state = ui_state
        #: the chat the composer's text belongs to
        self.thread_id: int | None = app_state.thread_id
        self._loading = False
        self._timer = QTimer(self, singleShot=True, interval=SAVE_PAUSE_MS)
        self._timer.timeout.connect(self.save)
        composer.edit.textChanged.connect(self._edited)
        app_state.threadOpened.connect(self._opened)
        app_state.threadCreated.connect(self._created)
        self._load(self.thread_id)

    def draft(self, thread_id: int | None) -> str:
        value = self.ui_state.value(draft_key(thread_id), "")
        return value if isinstance(value, str) else ""

    def save(self) -> None:
        """Write the composer's text as its chat's draft now (an empty box removes it)."""
        self._timer.stop()
        text = self.composer.text()
        key = draft_key(self.thread_id)
        if text.strip():
            self.ui_state.setValue(key, text)
        else:
            self.ui_state.remove(key)
        self.ui_state.sync()  # on disk now: a crash must not take it

    def forget(self, thread_id: int) -> None:
        """A deleted chat's draft goes with it."""
        self.ui_state.remove(draft_key(thread_id))
        self.ui_state.sync()

    def _edited(self) -> None:
        if not self._loading:
            self._timer.start()

    def _opened(self, thread_id: int | None) -> None:
        if self._timer.isActive():
            self.save()  # the chat being left keeps what was typed in it
        self.thread_id = thread_id
        self._load(thread_id)

    def _created(self, thread_id: int) -> None:
        """The new chat became ``thread_id``: its draft is that chat's now."""
        if self.thread_id is None:
            self.ui_state.remove(draft_key(None))
            self.thread_id = thread_id
            self.save()

    def _load(self, thread_id: int | None) -> None:
        text = self.draft(thread_id)
        if text == self.composer.text():
            return
        self._loading = True
        try:
            self.composer.set_text(text)
            edit = self.composer.edit
            edit.moveCursor(edit.textCursor().MoveOperation.End)
        finally:
            self._loading = False
