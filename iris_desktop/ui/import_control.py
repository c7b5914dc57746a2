"""File ▸ Import…: another app's export (or Iris's own) read and stored on a thread of its
own, with its own connection, so that the window goes on while it runs.

Before, an import ran as one job on the DB thread: a 276 MB ChatGPT export took 50 s
during which the status bar said "Ready", no chat could be opened (loading a transcript
queued behind it), and when it ended the window switched to the first imported chat even
if the user had opened another meanwhile. Now the status bar says what is being imported
until it is done, other chats open, and the first imported chat opens only if the chat
that was open when the import began still is, and the status bar says how far it is
("Importing conversations.json: reading, 12,000 of 133,082 chats…", then "storing, …"). A
large export is read beside the window (``core.big_json``: a 276 MB ChatGPT export's
worst pause of the window 0.13 s; it was 5.9 s).

Chats that were imported before are not stored twice; the window then asks once whether
to import them again, as new copies (the CLI's ``import --again``), from the file as it
was read the first time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtWidgets import QMessageBox, QWidget

from iris_desktop.core.store import Stores
from iris_desktop.ui.app_state import AppState
from iris_desktop.ui.background import Background
from iris_desktop.ui.boxes import ask, failure, warn, whole_sentence

if TYPE_CHECKING:
    from iris_desktop.core.foreign import Imported, Loaded


class ImportControl(QObject):
    """Runs imports one after another on an ``iris-import`` thread (made at the first)."""

    #: how far the import under way is, in words (from the import thread)
    told = Signal(str)

    def __init__(self, app_state: AppState, stores: Stores, open_thread: Callable[[int], Any],
                 refresh: Callable[[], Any], parent: QWidget):
        super().__init__(parent)
        self.app_state = app_state
        self.stores = stores
        self.open_thread = open_thread
        self.refresh = refresh
        self.parent_widget = parent
        self.jobs: Background | None = None
        #: the last "Import again?" question asked (:meth:`ask_again`)
        self.again_box: QMessageBox | None = None
        #: imports started and not ended (words of how far one is are shown only then)
        self.under_way = 0
        #: the last words of how far an import is (withdrawn when the imports end)
        self.said: str | None = None
        self.told.connect(self._tell)

    def import_file(self, path: str) -> None:
        """Every chat of the file as a thread (``core.foreign``: the CLI's loader), in
        chunks of one transaction; what was imported and left out is said, and chats that
        were imported before are offered to be imported again (:meth:`ask_again`)."""
        name = Path(path).name

        def job(store):
            from iris_desktop.core.foreign import import_conversations, load_conversations

            loaded = load_conversations(path, progress=self._progress(name, "reading"))
            return loaded, import_conversations(  # a chat there already: opened
                store, loaded, progress=self._progress(name, "storing"))

        self.run(name, f"Importing {name}…", job)

    def _progress(self, name: str, doing: str) -> Callable[[int, int], None]:
        """``core.foreign``'s progress, said in the status bar (called on the import thread)."""
        def told(done: int, total: int) -> None:
            self.told.emit(f"Importing {name}: {doing}, {done:,} of {total:,} chats… (other "
                           "chats can be opened meanwhile)")
        return told

    @Slot(str)
    def _tell(self, words: str) -> None:
        if self.under_way:  # (not after the import's own last word)
            self.said = words
            self.app_state.show_background(words, 0)  # a turn's state, a user's message first

    def _ended(self) -> None:
        """An import ended: when it was the last, its words of how far it was are not shown
        later (held back behind a reply, they came back after its last word)."""
        self.under_way -= 1
        if not self.under_way and self.said is not None:
            self.app_state.withdraw_background(self.said)
            self.said = None

    def ask_again(self, name: str, loaded: Loaded, imported: Imported) -> QMessageBox:
        """Whether to import the chats of ``name`` that ``imported`` found imported before
        again, as new copies ("Keep as is": nothing changes). Before, the window only said
        they were not imported, and importing them anyway took the CLI's ``--again``."""
        known = len(imported.known)
        them, were, copies = ("it", "was", "a new copy") if known == 1 else (
            "them", "were", "new copies")
        titles = [f"“{t if len(t) <= 40 else t[:39] + '…'}”" for t in imported.titles[:5]]
        which = ", ".join(titles) + (", …" if known > 5 else "")
        box = ask(self.parent_widget, "Import again?",
                  f"{known:,} chat{'' if known == 1 else 's'} of {name} {were} imported before "
                  f"({which}). Import {them} again as {copies}?", ("Import again", "Keep as is"),
                  functools.partial(self.import_again, name, skipped_chats(loaded, imported)),
                  "import-again",
                  "The chats in the list stay as they are; "
                  + ("the copy is" if known == 1 else "the copies are") + " added beside them.")
        self.again_box = box
        return box

    def import_again(self, name: str, again: Loaded) -> None:
        """Import ``again`` (the chats an import skipped as imported before:
        :func:`skipped_chats`, from the file as it was read, not read again) as new
        threads. The question keeps only those chats, not the whole file (it is deleted
        once answered)."""
        known = len(again.chats)

        def job(store):
            from iris_desktop.core.foreign import import_conversations

            return again, import_conversations(store, again, again=True,
                                               progress=self._progress(name, "storing"))

        self.run(name, f"Importing {known:,} chat{'' if known == 1 else 's'} of {name} again…",
                 job)

    def run(self, name: str, saying: str, job: Callable[[Any], tuple[Loaded, Imported]]) -> None:
        """Run ``job`` (the store → (loaded, imported)) on the import thread, ``saying`` so
        in the status bar meanwhile; then say what it did, open the first chat if the chat
        open when it began still is, and ask about the chats it skipped."""
        opened = self.app_state.thread_id
        self.said = f"{saying} (other chats can be opened meanwhile)"
        self.app_state.start_background(self.said)
        self.app_state.speak(saying)  # said once; its progress is not announced
        self.under_way += 1

        def work(store):
            loaded, imported = job(store)
            # the imported chat listed first is opened (the file's first chat was, listed last)
            shown = imported.ids or imported.known  # (else the chats there already)
            first = store.newest_thread_id(shown) if shown else None
            return loaded, imported, imported.report(loaded, by_title=True), first

        def done(result: tuple[Loaded, Imported, list[str], int | None]) -> None:
            self._ended()
            loaded, imported, report, first = result
            self.refresh()
            for thread_id in imported.ids:
                self.app_state.messages_saved(thread_id)  # the semantic index takes them
            stayed = self.app_state.thread_id == opened
            if stayed and (imported.ids or imported.known):
                self.open_thread(first or (imported.ids or imported.known)[0])
            said = [whole_sentence(line) for line in report]  # (a native file's notes end in ".")
            if not said or (imported.ids and not loaded.foreign):
                said.insert(0, f"Imported {name}.")
            where = [] if stayed else ["They are in the chat list."]
            self.app_state.show_message(" ".join([*said, *where]), 10_000)
            if imported.known:
                self.ask_again(name, loaded, imported)

        def failed(exc: BaseException) -> None:
            from iris_desktop.core.foreign import PartlyImported

            self._ended()
            if not isinstance(exc, PartlyImported):
                self.app_state.show_message(f"Nothing was imported from {name}.", 6000)
                warn(self.parent_widget, "Import failed",
                     "Nothing was imported.\n\n" + whole_sentence(failure(exc)))
                return
            self.refresh()  # the chats stored before it failed are in the list
            for thread_id in exc.imported.ids:
                self.app_state.messages_saved(thread_id)
            stored = len(exc.imported.ids)
            self.app_state.show_message(f"Importing {name} failed after storing {stored:,} "
                                        f"chat{'' if stored == 1 else 's'}; they are in the chat "
                                        "list.", 10_000)
            warn(self.parent_widget, "Import failed", failure(exc) + ".")

        self.thread_jobs().run(work, done, failed)

    def thread_jobs(self) -> Background:
        """The import thread's jobs (the thread is made at the first use)."""
        if self.jobs is None:
            self.jobs = Background(self.stores, self, name="iris-import")
        return self.jobs

    def close(self) -> None:
        """Finish the import under way (it commits in chunks) and stop the thread."""
        if self.jobs is not None:
            self.jobs.close()


def skipped_chats(loaded: Loaded, imported: Imported) -> Loaded:
    """The chats of ``loaded`` that ``imported`` skipped as imported before (a Loaded, its
    notes on those chats alone)."""
    from iris_desktop.core.foreign import Loaded

    chats = list(imported.known_chats)
    return Loaded(loaded.format, chats, Loaded(loaded.format, chats).left_out(chats))
