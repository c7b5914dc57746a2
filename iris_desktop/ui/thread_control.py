"""Threads: the list with search, opening one into the transcript, new, rename, delete,
import and export. Every DB access runs on the DB thread (``Background``); deleting goes
through the host on the model thread, which also forgets the thread's KV states.

The list stays live (:mod:`.live_list`). The last chat opened is remembered in
``ui-state.ini`` and reopened at start."""

from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtCore import QObject, QSettings, QTimer
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox, QWidget

from iris_desktop.core.agent import DEFAULT_TITLE
from iris_desktop.core.store import ThreadBusy, ThreadGone
from iris_desktop.core.store.messages import one_line_title
from iris_desktop.ui.app_state import AppState
from iris_desktop.ui.background import Background
from iris_desktop.ui.boxes import export_failure, failure, plain_box, warn
from iris_desktop.ui.composer import Composer
from iris_desktop.ui.export_name import file_name
from iris_desktop.ui.import_control import ImportControl
from iris_desktop.ui.live_list import POLL_MS, LiveList
from iris_desktop.ui.model_thread import ModelThread
from iris_desktop.ui.threads import ThreadPanel
from iris_desktop.ui.transcript import TranscriptView
from iris_desktop.ui.transcript_pages import TranscriptPages
from iris_desktop.ui.transcript_parts import CurrentKeeper
from iris_desktop.ui.unmade_chat import UnmadeChat

LAST_THREAD_KEY = "chat/last_thread"
#: why a blank title is refused
BLANK_TITLE = "A chat's title cannot be empty"


class ThreadControl(LiveList, UnmadeChat, QObject):
    """Which thread is open (``app_state.thread_id``), and everything that changes the
    list of threads."""

    def __init__(self, app_state: AppState, panel: ThreadPanel, view: TranscriptView,
                 composer: Composer, background: Background, model: ModelThread,
                 parent: QWidget, ui_state: QSettings | None = None):
        super().__init__(parent)
        self.app_state = app_state
        self.panel = panel
        self.view = view
        self.keeper = CurrentKeeper(view)  # its current message survives a reload
        self.composer = composer
        self.background = background
        self.model = model
        self.parent_widget = parent  # dialogs open over it
        self.states: dict[int, str] = {}  # message id → state, for rows loaded later
        self.delete_box: QMessageBox | None = None
        self.chat_settings: QWidget | None = None  # the open Chat settings dialog
        self.export_box: QFileDialog | None = None  # the open Export chat dialog
        self.ui_state = ui_state  # ui-state.ini: the last chat opened
        self._on_branch: dict[int, int] = {}  # each chat's messages on the branch shown
        self.pages = TranscriptPages(self)  # what the transcript shows, read a page at a time
        self._start_live_list()
        self._start_unmade()
        app_state.threadsChanged.connect(self.refresh_threads)
        app_state.messagesSaved.connect(self._messages_saved)
        app_state.statesChanged.connect(self.apply_states)
        app_state.threadChanged.connect(self._remember)
        self.importer = ImportControl(app_state, background.stores, self.open_thread,
                                      self.refresh_threads, parent)
        model.worker.deleteFailed.connect(self.delete_failed)
        self.poll_timer = QTimer(self, interval=POLL_MS)
        self.poll_timer.timeout.connect(self.poll)
        self.poll_timer.start()

    def refresh_threads(self) -> None:
        self.background.run(lambda store: store.threads(), self._listed, key="threads")

    def _listed(self, threads: list[dict]) -> None:
        self._on_branch = {t["id"]: t.get("branch_messages", t.get("messages")) for t in threads}
        super()._listed(threads)

    def search(self, query: str) -> None:
        if not query:
            self.refresh_threads()
            return
        self.background.run(lambda store: store.search(query),
                            lambda rows: self.panel.show_results(query, rows),
                            lambda exc: self.app_state.show_message(f"Search failed: {exc}", 8000),
                            key="search")

    def new_chat(self) -> None:
        self.app_state.set_thread_id(None)
        self.states = {}
        self.panel.select(None)
        self.view.transcript.clear()
        self.keeper.forget()
        self.composer.edit.setFocus()
        self.app_state.thread_opened(None)

    def open_thread(self, thread_id: int, message_id: int | None = None) -> None:
        """Open ``thread_id`` and show ``message_id`` (a search hit) in it; a message on
        another branch than the active one makes its branch the active one first (the
        newest below it), and says so."""
        if message_id is None:
            self._open(thread_id)
            self.background.run(lambda store: store.thread(thread_id), None,
                                lambda exc: self._deleted(exc, thread_id))
            return
        writing = self.app_state.generating and self.app_state.answering == thread_id

        def onto_path(store) -> bool | None:
            store.thread(thread_id)  # ThreadGone: deleted since the hit was listed
            if store.on_path(thread_id, [message_id]):
                return False
            if writing:  # the branch of a reply being written stays
                return None
            store.set_head(thread_id, store.newest_leaf(message_id))
            return True

        def opened(switched: bool | None) -> None:
            if switched is None:  # (looked for, it read every page back to the first)
                self._open(thread_id)
                self.app_state.show_message("That message is on another branch of this chat: "
                                            "it can be shown once the reply is written", 8000)
                return
            self._open(thread_id, message_id)
            if switched:
                self.app_state.show_message("Switched to the branch with this message", 6000)

        self.background.run(onto_path, opened, lambda exc: self._open(thread_id, message_id)
                            if not isinstance(exc, ThreadGone) else self._deleted(exc, thread_id))

    def _deleted(self, exc: BaseException, thread_id: int) -> None:
        """A chat chosen in the list was deleted since it was listed: said, list anew."""
        if not isinstance(exc, ThreadGone):
            return
        if self.app_state.thread_id == thread_id:
            self.new_chat()
        self.app_state.show_message("That chat was deleted (in another window or by a command)", 6000)
        self.refresh_threads()

    def _open(self, thread_id: int, message_id: int | None = None) -> None:
        if thread_id != self.app_state.thread_id:
            self.states = {}
            self.view.transcript.clear()
            self.keeper.forget()
        self.app_state.set_thread_id(thread_id)
        self.panel.select(thread_id)
        self.reload_transcript(message_id)
        self.app_state.thread_opened(thread_id)

    def reload_transcript(self, message_id: int | None = None) -> None:
        """The open chat's entries again: its last turn's on, when its branch is as loaded,
        else its newest page (:mod:`.transcript_pages`); ``message_id`` then shown."""
        self.pages.reload(message_id)

    # -- the last chat --

    def _remember(self, thread_id: int | None) -> None:
        if thread_id is not None and self.ui_state is not None:
            self.ui_state.setValue(LAST_THREAD_KEY, thread_id)

    def reopen_last(self) -> None:
        """Open the chat that was open last (remembered in ui-state.ini), unless it was
        deleted since or another chat is open by now."""
        raw = self.ui_state.value(LAST_THREAD_KEY) if self.ui_state is not None else None
        try:
            thread_id = int(raw)
        except (TypeError, ValueError):
            return

        def exists(store) -> bool:
            try:
                store.thread(thread_id)
            except KeyError:
                return False
            return True

        def reopen(found: bool) -> None:
            if found and self.app_state.thread_id is None:
                self.open_thread(thread_id)

        self.background.run(exists, reopen)

    def _messages_saved(self, thread_id: int) -> None:
        self._saved_here.add(thread_id)  # the poll need not reload it again
        if thread_id == self.app_state.thread_id:
            self.reload_transcript()

    def apply_states(self, states: dict[int, str]) -> None:
        """Each message's state; after a chat change (``self.states`` reset, the entries
        read without states) every entry's, not only those a turn's states changed."""
        fresh = getattr(self.states, "rule", None) is None  # (reset to {}: not a turn's yet)
        self.states = states
        whole = getattr(states, "whole", None)
        self.view.transcript.apply_states(whole() if fresh and whole is not None else states)

    def created(self, thread_id: int) -> None:
        """The new chat is ``thread_id`` now (the model thread made it for its first
        message, or its settings were saved)."""
        if self.app_state.generating and self.app_state.answering is None:
            self.app_state.answering = thread_id  # the turn's chat, made for it
            self._made_for_turn(thread_id)  # and gone again if the turn stores nothing
        self.app_state.set_thread_id(thread_id)
        self.app_state.thread_created(thread_id)
        self.panel.current_id = thread_id
        self.refresh_threads()

    # -- rename, delete --

    def with_open_chat(self, what: str, then) -> None:
        """``then(thread_id, title)`` for the open chat (its title read on the DB thread),
        or "Open a chat to <what>": File ▸ Rename chat…, Delete chat…, Export chat…."""
        thread_id = self.app_state.thread_id
        if thread_id is None:
            self.app_state.show_message(f"Open a chat to {what}")
            return
        self.background.run(lambda store: store.thread(thread_id)["title"],
                            lambda title: then(thread_id, title))

    def rename_dialog(self, thread_id: int, title: str) -> None:
        """Ask for the chat's new title (one line, clipped, by the store). A blank one is
        refused in the dialog itself, which asks again saying why; Cancel keeps the title."""
        label = "Title:"
        while True:
            text, ok = QInputDialog.getText(self.parent_widget, "Rename chat", label, text=title)
            if not ok:
                return
            if one_line_title(text):
                break
            label = f"{BLANK_TITLE}: type one, or Cancel to keep the one it has.\nTitle:"
        self.rename_thread(thread_id, text)

    def rename_thread(self, thread_id: int, title: str) -> None:
        if not one_line_title(title):  # said here, never a failed job on the DB thread
            self.app_state.show_message(f"Not renamed: {BLANK_TITLE.lower()}", 6000)
            return
        self.background.run(lambda store: store.rename_thread(thread_id, title),
                            lambda _: self.refresh_threads(),
                            lambda exc: self.app_state.show_message(f"Not renamed: {exc}", 6000))

    def settings_dialog(self, thread_id: int | None = None) -> None:
        """The chat's own settings (title, system prompt), read on the DB thread and
        opened non-blocking (``self.chat_settings``)."""
        from iris_desktop.ui.chat_settings import ChatSettingsDialog

        thread_id = thread_id if thread_id is not None else self.app_state.thread_id
        default = self.app_state.settings["chat.system_prompt"]

        def show(found: tuple[str, str | None]) -> None:
            dialog = ChatSettingsDialog(thread_id, found[0], found[1], default, self.parent_widget)
            dialog.saved.connect(lambda tid, title, prompt: self.save_settings(
                tid, title, prompt, before=found))
            self.chat_settings = dialog
            dialog.open()

        if thread_id is None:  # a chat not begun: saving makes its thread
            show((DEFAULT_TITLE, None))
            return
        self.background.run(lambda store: (store.thread(thread_id)["title"],
                                           store.system_prompt_of(thread_id)), show)

    def save_settings(self, thread_id: int | None, title: str, prompt: str | None,
                      before: tuple[str, str | None] | None = None) -> None:
        """Store a chat's title and system prompt, what changed from ``before`` (what the
        dialog showed: a title given elsewhere meanwhile stays); the views plan anew. A
        chat not begun (``thread_id`` None) is made now, holding both, and opened (a
        title left as "New chat" is still taken from its first message)."""
        def job(store) -> int:
            with store.transaction():
                tid = thread_id if thread_id is not None else store.create_thread(title)
                if before is None or title != before[0]:
                    store.rename_thread(tid, title)
                if before is None or prompt != before[1]:
                    store.set_system_prompt(tid, prompt)
            return tid

        def done(tid: int) -> None:
            if thread_id is None and self.app_state.thread_id is None:
                self.created(tid)  # the new chat, its draft included, is this thread now
            else:
                self.refresh_threads()
            if tid == self.app_state.thread_id:
                self.app_state.report_request(None)  # None: plan it again

        self.background.run(job, done, lambda exc: warn(
            self.parent_widget, "Chat settings not saved", failure(exc)))

    def delete_dialog(self, thread_id: int, title: str) -> QMessageBox:
        """Ask before deleting (Cancel is the default); the chat goes only on Delete."""
        count = self._rows.get(thread_id, (None, None, None))[2]  # every branch, as listed
        apart = count - self._on_branch.get(thread_id, count) if isinstance(count, int) else 0
        what = f"all its {count:,} messages" if isinstance(count, int) and count > 1 else (
            "its message" if count == 1 else "all its messages")
        what += f" ({apart:,} of them on other branches)" if apart > 1 else (
            " (1 of them on another branch)" if apart == 1 else "")
        box = plain_box(QMessageBox(QMessageBox.Icon.Warning, "Delete chat", f"Delete “{title}” "
                                    f"and {what}? This cannot be undone.", parent=self.parent_widget))
        box.setObjectName("delete-confirm")
        delete = box.addButton("Delete", QMessageBox.ButtonRole.DestructiveRole)
        cancel = box.addButton(QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(cancel)
        box.setEscapeButton(cancel)
        box.finished.connect(
            lambda _: box.clickedButton() is delete and self.delete_thread(thread_id))
        self.delete_box = box
        box.open()
        return box

    def delete_thread(self, thread_id: int) -> None:
        """Delete on the model thread: it may hold the thread in its KV cache, and the
        thread's saved KV states go too; the list follows ``threadDeleted`` (or
        ``deleteFailed``: :meth:`delete_failed`)."""
        if thread_id == self.app_state.thread_id:
            if self.app_state.generating:
                self.app_state.show_message("Stop the reply before deleting this chat")
                return
            self.new_chat()
        self.model.delete(thread_id)

    def deleted(self, thread_id: int) -> None:
        """The model thread deleted a thread (or found it deleted already): said (the status
        bar kept its last words, "Exported 2 messages…"), the list read again."""
        title = self._rows.get(thread_id, ("",))[0] or "Untitled"
        self.app_state.show_message(f"Deleted “{title}”", 6000)
        self.refresh_threads()

    def delete_failed(self, thread_id: int, reason: str) -> None:
        """The model thread could not delete a thread (another process writing, a full
        disk): said in a box, with what to do, and the list shows it still there. Before,
        only the log said so, and the chat stayed listed as if deleted by mistake. Whether
        it is still there is read again (a failure after the history's part, in its saved
        KV states, leaves it deleted)."""
        title = self._rows.get(thread_id, ("",))[0] or "Untitled"
        reason = reason[:1].upper() + reason[1:]

        def said(there: bool) -> None:
            self.refresh_threads()
            warn(self.parent_widget, "Chat not deleted" if there else "Chat deleted",
                 f"“{title}” was not deleted. {reason}." if there else
                 f"“{title}” was deleted, but not everything kept for it. {reason}.")

        self.background.run(lambda store: store.thread(thread_id) is not None, said,
                            lambda exc: said(not isinstance(exc, ThreadGone)))

    def switch_branch(self, message_id: int, step: int) -> None:
        """Show the alternative ``step`` places from ``message_id`` (the ‹ › switcher): its
        newest branch becomes the open thread's active one."""
        state, thread_id = self.app_state, self.app_state.thread_id
        if thread_id is None or state.generating:
            state.show_message("Wait for the reply before switching branches", 4000)
            return
        self.background.run(lambda store: store.switch_to_alternative(thread_id, message_id, step),
                            # the meter, states, inspector too (they kept the other branch's);
                            # the alternative stays current, in view (it jumped to the end)
                            lambda shown: (state.messages_saved(thread_id), state.report_request(None),
                                           self.reload_transcript(shown)),
                            lambda exc: state.show_message(str(exc) if isinstance(exc, ThreadBusy)
                                                           else f"Could not switch: {exc}", 6000))

    # -- import, export --

    def export_dialog(self) -> None:
        """File ▸ Export chat…: a save dialog (``self.export_box``), the title as name."""
        def ask(thread_id: int, title: str) -> None:
            box = QFileDialog(self.parent_widget, "Export chat",
                              str(Path.home() / f"{file_name(title)}.md"),
                              "Markdown (*.md);;JSON (*.json)")
            box.setObjectName("export-dialog")
            box.setAcceptMode(QFileDialog.AcceptMode.AcceptSave)

            def chosen(path: str) -> None:
                fmt = ("json" if "json" in box.selectedNameFilter().lower()
                       or path.endswith(".json") else "md")
                self.export_thread(thread_id, path, fmt)

            box.fileSelected.connect(chosen)
            self.export_box = box
            box.open()

        self.with_open_chat("export it", ask)

    def export_thread(self, thread_id: int, path: str, fmt: str) -> None:
        """JSON: every branch (``export_messages``); Markdown: the active one, to read.
        A new file is private (0600), as the CLI writes it."""
        def job(store):
            from iris_desktop.core.conversation import export_messages, markdown_export, write_private

            payload = export_messages(store, thread_id) if fmt == "json" else None
            text = (json.dumps(payload, ensure_ascii=False, indent=2) + "\n" if payload is not None
                    else markdown_export(store, thread_id))
            write_private(Path(path), text)  # (the count: every branch's in JSON; was the shown one's)
            return len(payload["messages"]) if payload is not None else len(store.messages(thread_id))

        self.background.run(
            job, lambda n: self.app_state.show_message(f"Exported {n:,} messages to {path}", 6000),
            lambda exc: warn(self.parent_widget, "Export failed", export_failure(exc, path)))

    def import_dialog(self) -> None:
        """File ▸ Import conversation…: the filter short enough to show its extensions."""
        path, _ = QFileDialog.getOpenFileName(
            self.parent_widget, "Import chats from ChatGPT, Claude, Open WebUI, Jan, LibreChat, "
            "Iris and more", str(Path.home()), "Chat exports (*.json *.jsonl *.zip);;All files (*)")
        if path:
            self.import_file(path)

    def import_folder_dialog(self) -> None:
        """File ▸ Import folder…: an unzipped ChatGPT or Claude export, Jan's threads (the
        CLI's ``import FOLDER``, by the same loader as a file)."""
        path = QFileDialog.getExistingDirectory(
            self.parent_widget, "Import a folder: an unzipped ChatGPT or Claude export, or "
            "Jan's threads", str(Path.home()))
        if path:
            self.import_file(path)

    def import_file(self, path: str) -> None:
        self.importer.import_file(path)

