"""File ▸ Import…: another app's export (or Iris's own) read and stored on a thread of its
own, with its own connection, so that the window goes on while it runs.

Before, an import ran as one job on the DB thread: a 276 MB ChatGPT export took 50 s
during which the status bar said "Ready", no chat could be opened (loading a transcript
queued behind it), and when it ended the window switched to the first imported chat even
if the user had opened another meanwhile. Now the status bar says what is being imported
until it is done, other chats open, and the first imported chat opens only if the chat
that was open when the import began still is. (Parsing the file's JSON still holds
Python's lock for a moment: a 276 MB file stops the window for a few seconds.)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QWidget

from iris_desktop.core.store import Stores
from iris_desktop.ui.app_state import AppState
from iris_desktop.ui.background import Background
from iris_desktop.ui.boxes import failure, warn


class ImportControl(QObject):
    """Runs imports one after another on an ``iris-import`` thread (made at the first)."""

    def __init__(self, app_state: AppState, stores: Stores, open_thread: Callable[[int], Any],
                 refresh: Callable[[], Any], parent: QWidget):
        super().__init__(parent)
        self.app_state = app_state
        self.stores = stores
        self.open_thread = open_thread
        self.refresh = refresh
        self.parent_widget = parent
        self.jobs: Background | None = None

    def import_file(self, path: str) -> None:
        """Every chat of the file as a thread (``core.foreign``: the CLI's loader), in
        chunks of one transaction; what was imported and left out is said."""
        opened = self.app_state.thread_id
        name = Path(path).name
        self.app_state.show_message(f"Importing {name}… (other chats can be opened meanwhile)", 0)

        def job(store):
            from iris_desktop.core.foreign import import_conversations, load_conversations

            loaded = load_conversations(path)
            imported = import_conversations(store, loaded)  # a chat there already: opened
            return imported, imported.report(loaded, by_title=True)

        def done(result: tuple[Any, list[str]]) -> None:
            imported, report = result
            self.refresh()
            for thread_id in imported.ids:
                self.app_state.messages_saved(thread_id)  # the semantic index takes them
            first = (imported.ids or imported.known)[0]
            stayed = self.app_state.thread_id == opened
            if stayed:
                self.open_thread(first)
            said = report[0][:1].upper() + report[0][1:] + "." if report else f"Imported {name}."
            where = [] if stayed else ["They are in the chat list."]
            self.app_state.show_message(" ".join([said, *report[1:], *where]), 10_000)

        def failed(exc: BaseException) -> None:
            from iris_desktop.core.foreign import PartlyImported

            if not isinstance(exc, PartlyImported):
                self.app_state.show_message(f"Nothing was imported from {name}.", 6000)
                warn(self.parent_widget, "Import failed", "Nothing was imported.\n\n" + failure(exc))
                return
            self.refresh()  # the chats stored before it failed are in the list
            for thread_id in exc.imported.ids:
                self.app_state.messages_saved(thread_id)
            stored = len(exc.imported.ids)
            self.app_state.show_message(f"Importing {name} failed after storing {stored:,} "
                                        f"chat{'' if stored == 1 else 's'}; they are in the chat "
                                        "list.", 10_000)
            warn(self.parent_widget, "Import failed", failure(exc) + ".")

        self.thread_jobs().run(job, done, failed)

    def thread_jobs(self) -> Background:
        """The import thread's jobs (the thread is made at the first use)."""
        if self.jobs is None:
            self.jobs = Background(self.stores, self, name="iris-import")
        return self.jobs

    def close(self) -> None:
        """Finish the import under way (it commits in chunks) and stop the thread."""
        if self.jobs is not None:
            self.jobs.close()
