"""Threads: the list with search, opening one into the transcript, new, rename, delete,
import and export. Every DB access runs on the DB thread (``Background``); deleting goes
through the host on the model thread, which also forgets the thread's KV states."""

from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox, QWidget

from iris_desktop.core.views import Entry, load_transcript
from iris_desktop.ui.app_state import AppState
from iris_desktop.ui.background import Background
from iris_desktop.ui.composer import Composer
from iris_desktop.ui.model_thread import ModelThread
from iris_desktop.ui.threads import ThreadPanel
from iris_desktop.ui.transcript import TranscriptView


class ThreadControl(QObject):
    """Which thread is open (``app_state.thread_id``), and everything that changes the
    list of threads."""

    def __init__(self, app_state: AppState, panel: ThreadPanel, view: TranscriptView,
                 composer: Composer, background: Background, model: ModelThread,
                 parent: QWidget):
        super().__init__(parent)
        self.app_state = app_state
        self.panel = panel
        self.view = view
        self.composer = composer
        self.background = background
        self.model = model
        self.parent_widget = parent  # dialogs open over it
        self.states: dict[int, str] = {}  # message id → state, for rows loaded later
        self.delete_box: QMessageBox | None = None
        app_state.threadsChanged.connect(self.refresh_threads)
        app_state.messagesSaved.connect(self._messages_saved)
        app_state.statesChanged.connect(self.apply_states)

    def refresh_threads(self) -> None:
        self.background.run(lambda store: store.threads(), self.panel.show_threads,
                            key="threads")

    def search(self, query: str) -> None:
        if not query:
            self.refresh_threads()
            return
        self.background.run(lambda store: store.search(query),
                            lambda rows: self.panel.show_results(query, rows),
                            key="search")

    def new_chat(self) -> None:
        self.app_state.set_thread_id(None)
        self.states = {}
        self.panel.select(None)
        self.view.transcript.clear()
        self.composer.edit.setFocus()
        self.app_state.thread_opened(None)

    def open_thread(self, thread_id: int, message_id: int | None = None) -> None:
        if thread_id != self.app_state.thread_id:
            self.states = {}
            self.view.transcript.clear()
        self.app_state.set_thread_id(thread_id)
        self.panel.select(thread_id)
        self.reload_transcript(message_id)
        self.app_state.thread_opened(thread_id)

    def reload_transcript(self, message_id: int | None = None) -> None:
        tid = self.app_state.thread_id
        if tid is None:
            return
        view = self.view

        def show(entries: list[Entry]) -> None:
            if tid != self.app_state.thread_id:
                return
            for entry in entries:
                if entry.message_id in self.states:
                    entry.state = self.states[entry.message_id]
            view.transcript.set_entries(entries)
            if message_id is not None:
                view.scroll_to_key(f"m:{message_id}")
            else:
                view.follow_bottom()

        self.background.run(lambda store: load_transcript(store, tid), show, key="transcript")

    def _messages_saved(self, thread_id: int) -> None:
        if thread_id == self.app_state.thread_id:
            self.reload_transcript()

    def apply_states(self, states: dict[int, str]) -> None:
        self.states = states
        self.view.transcript.apply_states(states)

    def created(self, thread_id: int) -> None:
        """The model thread made a new thread for the first message of a new chat."""
        self.app_state.set_thread_id(thread_id)
        self.panel.current_id = thread_id
        self.refresh_threads()

    # -- rename, delete --

    def rename_dialog(self, thread_id: int, title: str) -> None:
        text, ok = QInputDialog.getText(self.parent_widget, "Rename chat", "Title:",
                                        text=title)
        if ok and text.strip():
            self.rename_thread(thread_id, text.strip())

    def rename_thread(self, thread_id: int, title: str) -> None:
        self.background.run(lambda store: store.rename_thread(thread_id, title),
                            lambda _: self.refresh_threads())

    def delete_dialog(self, thread_id: int, title: str) -> QMessageBox:
        """Ask before deleting (Cancel is the default); the chat goes only on Delete."""
        box = QMessageBox(QMessageBox.Icon.Warning, "Delete chat",
                          f"Delete “{title}” and all its messages? This cannot be undone.",
                          parent=self.parent_widget)
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
        thread's saved KV states go too; the list follows ``threadDeleted``."""
        if thread_id == self.app_state.thread_id:
            if self.app_state.generating:
                self.app_state.show_message("Stop the reply before deleting this chat")
                return
            self.new_chat()
        self.model.delete(thread_id)

    def deleted(self, thread_id: int) -> None:
        """The model thread deleted a thread (or tried: the list shows what is left)."""
        self.refresh_threads()

    # -- import, export --

    def export_dialog(self) -> None:
        thread_id = self.app_state.thread_id
        if thread_id is None:
            self.app_state.show_message("Open a chat to export it")
            return
        path, chosen = QFileDialog.getSaveFileName(
            self.parent_widget, "Export chat", str(Path.home() / "chat.md"),
            "Markdown (*.md);;JSON (*.json)")
        if path:
            fmt = "json" if "json" in chosen.lower() or path.endswith(".json") else "md"
            self.export_thread(thread_id, path, fmt)

    def export_thread(self, thread_id: int, path: str, fmt: str) -> None:
        def job(store):
            from iris_desktop.core.conversation import to_markdown
            from iris_desktop.core.store import row_to_message

            thread = store.thread(thread_id)
            messages = [row_to_message(r) for r in store.messages(thread_id)]
            text = (json.dumps(messages, ensure_ascii=False, indent=2) + "\n" if fmt == "json"
                    else to_markdown(thread["title"], messages))
            Path(path).write_text(text, encoding="utf-8")
            return len(messages)

        self.background.run(
            job, lambda n: self.app_state.show_message(f"Exported {n:,} messages to {path}", 6000),
            lambda exc: QMessageBox.warning(self.parent_widget, "Export failed", str(exc)))

    def import_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.parent_widget, "Import a conversation",
                                              str(Path.home()),
                                              "Conversations (*.json *.jsonl);;All files (*)")
        if path:
            self.import_file(path)

    def import_file(self, path: str) -> None:
        def job(store):
            from iris_desktop.core.conversation import load_conversation, title_from

            messages, title = load_conversation(path)
            with store.transaction():
                thread_id = store.create_thread(title or title_from(messages))
                store.add_messages(thread_id, messages)
            return thread_id

        def done(thread_id: int) -> None:
            self.refresh_threads()
            self.app_state.messages_saved(thread_id)  # the semantic index takes them
            self.open_thread(thread_id)

        self.background.run(job, done, lambda exc: QMessageBox.warning(
            self.parent_widget, "Import refused", f"Nothing was imported.\n\n{exc}"))
