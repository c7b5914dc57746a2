"""Threads: the list with search, opening one into the transcript, new, rename, delete,
import and export. Every DB access runs on the DB thread (``Background``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox

from iris_desktop.core.views import Entry, load_transcript

if TYPE_CHECKING:
    from iris_desktop.ui.main_window import MainWindow


class ThreadControl(QObject):
    """Which thread is open, and everything that changes the list of threads."""

    def __init__(self, window: MainWindow):
        super().__init__(window)
        self.window = window
        self.thread_id: int | None = None
        self.states: dict[int, str] = {}  # message id → state, for rows loaded later

    @property
    def background(self):
        return self.window.background

    def refresh_threads(self) -> None:
        self.background.run(lambda store: store.threads(), self.window.threads.show_threads,
                            key="threads")

    def search(self, query: str) -> None:
        if not query:
            self.refresh_threads()
            return
        self.background.run(lambda store: store.search(query),
                            lambda rows: self.window.threads.show_results(query, rows),
                            key="search")

    def new_chat(self) -> None:
        self.thread_id = None
        self.states = {}
        self.window.threads.select(None)
        self.window.view.transcript.clear()
        self.window.composer.edit.setFocus()
        self.window.context.refresh()

    def open_thread(self, thread_id: int, message_id: int | None = None) -> None:
        if thread_id != self.thread_id:
            self.states = {}
            self.window.view.transcript.clear()
        self.thread_id = thread_id
        self.window.threads.select(thread_id)
        self.reload_transcript(message_id)
        self.window.context.refresh()

    def reload_transcript(self, message_id: int | None = None) -> None:
        tid = self.thread_id
        if tid is None:
            return
        view = self.window.view

        def show(entries: list[Entry]) -> None:
            if tid != self.thread_id:
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

    def apply_states(self, states: dict[int, str]) -> None:
        self.states = states
        self.window.view.transcript.apply_states(states)

    def created(self, thread_id: int) -> None:
        """The model thread made a new thread for the first message of a new chat."""
        self.thread_id = thread_id
        self.window.threads.current_id = thread_id
        self.refresh_threads()

    # -- rename, delete --

    def rename_dialog(self, thread_id: int, title: str) -> None:
        text, ok = QInputDialog.getText(self.window, "Rename chat", "Title:", text=title)
        if ok and text.strip():
            self.rename_thread(thread_id, text.strip())

    def rename_thread(self, thread_id: int, title: str) -> None:
        self.background.run(lambda store: store.rename_thread(thread_id, title),
                            lambda _: self.refresh_threads())

    def delete_dialog(self, thread_id: int, title: str) -> None:
        answer = QMessageBox.question(
            self.window, "Delete chat",
            f"Delete “{title}” and all its messages? This cannot be undone.",
            QMessageBox.StandardButton.Delete | QMessageBox.StandardButton.Cancel,
            QMessageBox.StandardButton.Cancel)
        if answer == QMessageBox.StandardButton.Delete:
            self.delete_thread(thread_id)

    def delete_thread(self, thread_id: int) -> None:
        if thread_id == self.thread_id:
            if self.window.turns.generating:
                self.window.statusBar().showMessage("Stop the reply before deleting this chat",
                                                    4000)
                return
            self.new_chat()
        self.background.run(lambda store: store.delete_thread(thread_id),
                            lambda _: self.refresh_threads())

    # -- import, export --

    def export_dialog(self) -> None:
        if self.thread_id is None:
            self.window.statusBar().showMessage("Open a chat to export it", 4000)
            return
        path, chosen = QFileDialog.getSaveFileName(
            self.window, "Export chat", str(Path.home() / "chat.md"),
            "Markdown (*.md);;JSON (*.json)")
        if path:
            fmt = "json" if "json" in chosen.lower() or path.endswith(".json") else "md"
            self.export_thread(self.thread_id, path, fmt)

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
            job,
            lambda n: self.window.statusBar().showMessage(f"Exported {n:,} messages to {path}",
                                                          6000),
            lambda exc: QMessageBox.warning(self.window, "Export failed", str(exc)))

    def import_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.window, "Import a conversation",
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
            self.open_thread(thread_id)
            self.window.context.index_soon()

        self.background.run(job, done, lambda exc: QMessageBox.warning(
            self.window, "Import refused", f"Nothing was imported.\n\n{exc}"))
