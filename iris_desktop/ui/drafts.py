"""The unsent draft, kept per chat in the history (``Store.save_draft``): what is typed is
written a moment after each pause, so a crash, a power cut or switching chats loses
nothing; opening a chat brings its draft back, a new chat has one of its own, and a sent
message leaves an empty box (and no saved draft). Being in the database, a draft is
encrypted with the history, private as it is, and goes with its chat whichever window or
command deletes it: a new chat given the same id never shows it. Drafts that older
versions kept in ``ui-state.ini``, in plain text, are moved there at start.

Files attached to a draft stay with its chat too: another chat shows its own (before, a
file attached in one chat stayed in the box and was sent with the next chat's message),
and they are written with the draft (their text, as read when attached), so a restart or
a crash brings them back as well (before, only the typed text came back). They are
written when they change, not at every pause in typing."""

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
        #: drafts not written yet (their save queued, or failed), by chat: (text, files)
        self._unsaved: dict[int | None, tuple[str, tuple[Attachment, ...]]] = {}
        #: the files each chat's stored draft holds, as far as this window has written or
        #: read them (None: a write failed, what is stored is not known)
        self._stored_files: dict[int | None, tuple[Attachment, ...] | None] = {}
        #: the last save failed and said so: said once until one succeeds (it was said
        #: again after every pause in typing)
        self._failing = False
        self._timer = QTimer(self, singleShot=True, interval=SAVE_PAUSE_MS)
        self._timer.timeout.connect(self.save)
        composer.edit.textChanged.connect(self._edited)
        composer.attachmentsChanged.connect(self._edited)
        app_state.threadOpened.connect(self._opened)
        app_state.threadCreated.connect(self._created)
        # Enter in a box that cannot send (no model, one loading) says why (it did nothing)
        composer.refused.connect(lambda reason: app_state.show_message(reason, 6000))
        if ui_state is not None:
            self._move_old(ui_state)
        self._load(self.thread_id)

    def save(self) -> None:
        """Write the composer's text as its chat's draft, with its files when they changed
        (an empty box and no files remove it), on the DB thread, after whatever was asked
        of it before. Until it is written it is kept here: a draft the history cannot take
        (a full disk) comes back when its chat is opened again, and the status bar says it
        is not saved (it was lost unsaid)."""
        self._timer.stop()
        thread_id, text = self.thread_id, self.composer.text()
        files = tuple(self.composer.attachments)
        self._unsaved[thread_id] = (text, files)
        stored = self._stored_files.get(thread_id, ())
        write = None if stored is not None and files == stored else \
            [(a.name, a.text) for a in files]

        def saved(_result: object) -> None:
            # known only once written: a newer save may skip this one while queued
            self._stored_files[thread_id] = files
            if self._unsaved.get(thread_id) == (text, files):
                del self._unsaved[thread_id]
            if self._failing:
                self._failing = False
                self.app_state.show_message("Your draft is saved again", 4000)

        def failed(exc: BaseException) -> None:
            self._stored_files[thread_id] = None  # not known: written at the next save
            if not self._failing:
                self._failing = True
                self.app_state.show_message(f"Your draft is not saved: {failure(exc)}; it is "
                                            "kept while Iris runs", 10_000)

        if write is not None:  # not known until a save is confirmed: a newer save whose
            # job replaces this one before its answer comes writes the files again (it
            # wrote None, "as stored", and a file removed since came back)
            self._stored_files[thread_id] = None
        self.background.run(lambda store: store.save_draft(thread_id, text, write), saved,
                            failed, key=f"draft-{thread_id}")

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
            self.save()  # the chat being left keeps what was typed in it, and its files
        self.thread_id = thread_id
        self._show("", ())  # never the chat left's text or files under another chat
        self._load(thread_id)

    def _created(self, thread_id: int) -> None:
        """The new chat became ``thread_id``: its draft is that chat's now."""
        self._unsaved.pop(thread_id, None)  # a deleted chat's, whose id was given again
        self._stored_files.pop(thread_id, None)
        self._unsaved.pop(None, None)  # the new chat's draft is this chat's now
        if self.thread_id is None:
            self._stored_files.pop(None, None)
            self.background.run(lambda store: store.save_draft(None, "", []))
            self.thread_id = thread_id
            self.save()

    def _load(self, thread_id: int | None) -> None:
        self._typed = False

        def show(draft: tuple[str, list[tuple[str, str]]]) -> None:
            files = tuple(Attachment(name, body) for name, body in draft[1])
            if self._unsaved.get(thread_id) is None:
                self._stored_files[thread_id] = files
            if thread_id != self.thread_id:
                return
            stored = self._unsaved.get(thread_id, (draft[0], files))
            if not self._typed:
                self._show(*stored)
                return
            # typed (or moved here from a deleted chat) before it was read: both are kept
            # (before, the stored draft was dropped, or replaced when the pause came)
            typed = (self.composer.text(), tuple(self.composer.attachments))
            both = merged(typed, stored)
            if both != typed:
                self._show(*both)
                self._timer.start()  # written as merged

        self.background.run(lambda store: store.draft_with_files(thread_id), show,
                            key="draft-load")

    def _show(self, text: str, files: tuple[Attachment, ...]) -> None:
        self._loading = True
        try:
            if tuple(self.composer.attachments) != files:
                self.composer.set_attachments(list(files))
            if text != self.composer.text():
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


def merged(typed: tuple[str, tuple[Attachment, ...]], stored: tuple[str, tuple[Attachment, ...]]
           ) -> tuple[str, tuple[Attachment, ...]]:
    """What was typed before a stored draft was read, and that draft: the typed text, a
    blank line, the stored text (the one alone when the other is blank or the same), and
    the files of both (each once)."""
    text, stored_text = typed[0], stored[0]
    if stored_text.strip() and stored_text != text:
        text = f"{text}\n\n{stored_text}" if text.strip() else stored_text
    return text, typed[1] + tuple(f for f in stored[1] if f not in typed[1])
