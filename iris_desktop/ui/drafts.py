"""The unsent draft, kept per chat in the history (``Store.save_draft``): what is typed is
written a moment after each pause, so a crash, a power cut or switching chats loses
nothing; opening a chat brings its draft back, a new chat has one of its own, and a sent
message leaves an empty box (and no saved draft). Being in the database, a draft is
encrypted with the history, private as it is, and goes with its chat whichever window or
command deletes it: a new chat given the same id never shows it. Drafts that older
versions kept in ``ui-state.ini``, in plain text, are moved there at start.

Files attached to a draft stay with its chat too, while the window is open: another chat
shows its own (before, a file attached in one chat stayed in the box and was sent with
the next chat's message). They are not written to the history: after a restart a draft
comes back without its files, which are still where they were on disk."""

from __future__ import annotations

from PySide6.QtCore import QObject, QSettings, QTimer

from iris_desktop.core.attachments import Attachment
from iris_desktop.core.store import Store
from iris_desktop.ui.app_state import AppState
from iris_desktop.ui.background import Background
from iris_desktop.ui.boxes import failure
from iris_desktop.ui.composer import Composer

#: the pause in typing after which the draft is written
SAVE_PAUSE_MS = 400
#: where older versions kept each chat's draft (``drafts/<id>``, ``drafts/new``)
OLD_DRAFTS = "drafts"


class DraftControl(QObject):
    """Saves the composer's text for the chat it belongs to, and restores it."""

    def __init__(self, app_state: AppState, composer: Composer, background: Background,
                 ui_state: QSettings | None = None, parent: QObject | None = None):
        super().__init__(parent)
        self.app_state = app_state
        self.composer = composer
        self.background = background
        #: the chat the composer's text belongs to
        self.thread_id: int | None = app_state.thread_id
        self._loading = False
        self._typed = False  # typed since the chat was opened: its stored draft is older
        #: the files attached to the drafts of chats not open now
        self._files: dict[int | None, list[Attachment]] = {}
        #: drafts not written yet (their save queued, or failed), by chat
        self._unsaved: dict[int | None, str] = {}
        self._timer = QTimer(self, singleShot=True, interval=SAVE_PAUSE_MS)
        self._timer.timeout.connect(self.save)
        composer.edit.textChanged.connect(self._edited)
        app_state.threadOpened.connect(self._opened)
        app_state.threadCreated.connect(self._created)
        if ui_state is not None:
            self._move_old(ui_state)
        self._load(self.thread_id)

    def save(self) -> None:
        """Write the composer's text as its chat's draft (an empty box removes it), on the
        DB thread, after whatever was asked of it before. Until it is written it is kept
        here: a draft the history cannot take (a full disk) comes back when its chat is
        opened again, and the status bar says it is not saved (it was lost unsaid)."""
        self._timer.stop()
        thread_id, text = self.thread_id, self.composer.text()
        self._unsaved[thread_id] = text

        def saved(_result: object) -> None:
            if self._unsaved.get(thread_id) == text:
                del self._unsaved[thread_id]

        def failed(exc: BaseException) -> None:
            self.app_state.show_message(f"Your draft is not saved: {failure(exc)}; it is kept "
                                        "while Iris runs", 10_000)

        self.background.run(lambda store: store.save_draft(thread_id, text), saved, failed,
                            key=f"draft-{thread_id}")

    def flush(self) -> None:
        """Write a draft still waiting for its pause now (the window is closing)."""
        if self._timer.isActive():
            self.save()

    def _edited(self) -> None:
        if not self._loading:
            self._typed = True
            self._timer.start()

    def _opened(self, thread_id: int | None) -> None:
        if self._timer.isActive():
            self.save()  # the chat being left keeps what was typed in it
        if self.composer.attachments:  # the chat being left keeps its files
            self._files[self.thread_id] = list(self.composer.attachments)
        self.thread_id = thread_id
        self._show("")  # never the chat left's text under another chat
        self.composer.set_attachments(self._files.pop(thread_id, []))  # nor its files
        self._load(thread_id)

    def _created(self, thread_id: int) -> None:
        """The new chat became ``thread_id``: its draft is that chat's now."""
        self._files.pop(thread_id, None)  # a deleted chat's, whose id was given again
        self._unsaved.pop(thread_id, None)
        self._unsaved.pop(None, None)  # the new chat's text is this chat's now
        if self.thread_id is None:
            self.background.run(lambda store: store.save_draft(None, ""))
            self.thread_id = thread_id
            self.save()

    def _load(self, thread_id: int | None) -> None:
        self._typed = False

        def show(text: str) -> None:
            if thread_id == self.thread_id and not self._typed:
                self._show(self._unsaved.get(thread_id, text))

        self.background.run(lambda store: store.draft(thread_id), show, key="draft-load")

    def _show(self, text: str) -> None:
        if text == self.composer.text():
            return
        self._loading = True
        try:
            self.composer.set_text(text)
            edit = self.composer.edit
            edit.moveCursor(edit.textCursor().MoveOperation.End)
        finally:
            self._loading = False

    def _move_old(self, ui_state: QSettings) -> None:
        """Drafts an older version kept in ``ui-state.ini``: into the history (those of
        chats that still exist), and out of the file."""
        ui_state.beginGroup(OLD_DRAFTS)
        old = {key: ui_state.value(key, "") for key in ui_state.childKeys()}
        ui_state.endGroup()
        if not old:
            return

        def move(store: Store) -> None:
            for key, text in old.items():
                if isinstance(text, str) and (key == "new" or key.isdigit()):
                    store.save_draft(None if key == "new" else int(key), text)

        def moved(_result: object) -> None:
            ui_state.remove(OLD_DRAFTS)
            ui_state.sync()

        self.background.run(move, moved)
