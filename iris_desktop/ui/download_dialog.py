"""Model ▸ Download…: find a GGUF on the model hub (``runtime.hub``), download it with a
progress bar, speed, time left and Stop, and use it.

Opening the dialog contacts nothing: the recommended models come from local data
(``hub.RECOMMENDED``), with the memory each needs at the chosen ``n_ctx`` (the library's
estimate: weights plus KV cache) against this computer's memory. The hub is asked only
when the user searches, opens a repository's files, checks the sizes or downloads; the
privacy line says so. Hub calls run on a worker thread of their own (a download may take
an hour: the DB thread must stay free), one at a time; their results come back on the GUI
thread as signals. A failed or stopped download keeps its ``.partial`` file; the user
keeps it (Resume) or removes it (Remove partial, or the question after a failure). What the
hub sends is shown as text (plain-text labels, names through ``show_untrusted``); Stop and
closing end a download at once, and the progress line says when nothing arrives.
"""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSize, Qt, QTimer, Signal, Slot
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QHeaderView,
    QInputDialog,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from iris_desktop.core.views import tokens
from iris_desktop.runtime.hub import (
    DownloadProgress,
    HubClient,
    HubError,
    download_record,
    download_target,
    partial_state,
    system_memory_bytes,
)
from iris_desktop.runtime.remote import server_address
from iris_desktop.ui import hub_worker
from iris_desktop.ui.boxes import plain_tip
from iris_desktop.ui.hub_worker import HubCalls, gb, partial_question, token_dialog
from iris_desktop.ui.hub_worker import sentence as _sentence
from iris_desktop.ui.screen_fit import fit_to_screen
from iris_desktop.untrusted import show_untrusted

COLUMNS = ("Model", "File", "Quantization", "Size", "Trained context", "Memory at n_ctx",
           "This computer", "License")
RECOMMENDED_ITEM = "Recommended"


def _privacy_words(hub_url: str) -> str:
    """What is sent where, and only when asked (the dialog's first line)."""
    try:
        host = server_address(hub_url) if hub_url else "no hub (models.hub_url is empty)"
    except ValueError:
        host = hub_url
    return (f"Nothing is contacted until you search, check sizes or download. Then Iris asks "
            f"<b>{html.escape(host)}</b> (models.hub_url) — sending only the search text and the "
            "model and file names — and downloads from the file host it points to. Your chats "
            "never leave this computer.")


class DownloadDialog(QDialog):
    """``useModel(path)`` asks for a downloaded model to be loaded; ``downloaded(path)``
    says a model joined the library."""

    useModel = Signal(str)
    downloaded = Signal(str)

    def __init__(self, hub_url: str, models_dir: Path, n_ctx: int, parent: QWidget | None = None,
                 recommended: tuple[str, str] | None = None):
        super().__init__(parent)
        self.setWindowTitle("Download a model")
        self.setObjectName("download")
        self.hub_url = hub_url
        self.models_dir = Path(models_dir)
        self.n_ctx = n_ctx
        self.memory = system_memory_bytes()
        self.recommended = recommended  # (repo, file) of runtime.recommend's pick, marked in the list
        self.calls = HubCalls(self)
        self.calls.progressed.connect(self.show_progress)
        self.cancel: threading.Event | None = None
        #: rows of the table: {"repo", "file", "size", "cells", "tip", "about"}
        self.rows: list[dict[str, Any]] = []
        self.sizes: dict[tuple[str, str], int] = {}
        self.path: Path | None = None
        self.box: QMessageBox | QInputDialog | None = None
        self.last: tuple[float, DownloadProgress] | None = None  # the latest progress, and when
        self.stale = QTimer(self, interval=1000, timeout=self._stale)  # a stall: the line says so

        self.privacy = QLabel(_privacy_words(hub_url))
        self.privacy.setObjectName("privacy")
        self.privacy.setWordWrap(True)
        self.search_edit = QLineEdit()
        self.search_edit.setPlaceholderText("Search the hub for GGUF models, e.g. qwen2.5 instruct")
        self.search_edit.setClearButtonEnabled(True)
        self.search_edit.setAccessibleName("Search the model hub")
        self.search_button = QPushButton("Search")
        self.search_edit.returnPressed.connect(self.search)
        self.search_button.clicked.connect(self.search)
        self.sizes_button = QPushButton("Check sizes")
        self.sizes_button.setToolTip("Ask the hub for the exact sizes of the recommended files")
        self.sizes_button.clicked.connect(self.check_sizes)
        self.token_button = QPushButton("Token…")
        self.token_button.setToolTip("A hub token for gated or private models, kept in the keyring")
        self.token_button.clicked.connect(self.ask_token)

        self.repos = QListWidget()
        self.repos.addItem(QListWidgetItem(RECOMMENDED_ITEM))
        self.repos.currentItemChanged.connect(self._repo_chosen)
        self.repos.setAccessibleName("Models found")
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setAccessibleName("Files of the chosen model")
        self.table.setTabKeyNavigation(False)  # Tab leaves the table
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        self.table.itemSelectionChanged.connect(self._row_chosen)
        self.table.itemDoubleClicked.connect(lambda _: self.start())
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.repos)
        split.addWidget(self.table)
        split.setStretchFactor(1, 4)
        zero = self.fontMetrics().horizontalAdvance("0")
        split.setSizes([zero * 28, zero * 132])

        # plain text: it quotes what the hub sent
        self.status = QLabel("", objectName="download-status", textFormat=Qt.TextFormat.PlainText, wordWrap=True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.hide()
        self.progress_label = QLabel("", textFormat=Qt.TextFormat.PlainText)
        self.download_button = QPushButton("Download")
        self.download_button.setEnabled(False)
        self.download_button.clicked.connect(self.start)
        self.stop_button = QPushButton("Stop")
        self.stop_button.hide()
        self.stop_button.clicked.connect(self.stop)
        self.use_button = QPushButton("Use this model")
        self.use_button.hide()
        self.use_button.clicked.connect(self.use)
        self.discard_button = QPushButton("Remove partial")
        self.discard_button.hide()
        self.discard_button.clicked.connect(lambda: self.discard())

        top, row = QHBoxLayout(), QHBoxLayout()
        for widget in (self.search_edit, self.search_button, self.sizes_button, self.token_button):
            top.addWidget(widget, int(widget is self.search_edit))
        for widget, stretch in ((self.progress, 2), (self.progress_label, 2), (None, 1), (self.stop_button, 0),
                                (self.discard_button, 0), (self.download_button, 0), (self.use_button, 0)):
            row.addWidget(widget, stretch) if widget is not None else row.addStretch(stretch)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        for part in (self.privacy, top, split, self.status, row, buttons):
            layout.addLayout(part) if isinstance(part, QHBoxLayout) else layout.addWidget(part, int(part is split))
        fit_to_screen(self, QSize(zero * 160, self.fontMetrics().height() * 30))  # (2,400 px at 18 pt)
        self.repos.setCurrentRow(0)

    # -- what the table shows --

    def _say(self, text: str) -> None:
        """The status line: plain text, what the hub named shown as stored."""
        self.status.setText(show_untrusted(text))

    def show_recommended(self) -> None:
        self._fill(hub_worker.recommended_rows(self.sizes, self.n_ctx, self.memory, self.recommended))
        self._say(f"Recommended chat models, small to larger; memory is the weights plus the KV "
                  f"cache at n_ctx {tokens(self.n_ctx) if self.n_ctx else 'trained'}."
                  + ("" if self.sizes else " Sizes are as published until you check them."))

    def _fill(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows
        self.table.setRowCount(len(rows))
        for r, row in enumerate(rows):
            for c, text in enumerate(row["cells"]):
                item = QTableWidgetItem(show_untrusted(text))
                item.setToolTip(plain_tip(show_untrusted(row["tip"] if c == 0 else text)))
                self.table.setItem(r, c, item)
        self._row_chosen()

    def selected(self) -> dict[str, Any] | None:
        rows = self.table.selectionModel().selectedRows()
        return self.rows[rows[0].row()] if rows and rows[0].row() < len(self.rows) else None

    def _row_chosen(self) -> None:
        row = self.selected()
        busy = self.cancel is not None
        self.download_button.setEnabled(row is not None and not busy)
        self.download_button.setText("Download")
        self.use_button.setVisible(False)
        self.discard_button.setVisible(False)
        if row is None or busy:
            return
        self._say(row["about"])
        try:
            target = download_target(self.models_dir, row["repo"], row["file"])
            partial = partial_state(self.models_dir, row["repo"], row["file"])
            # only a record of this very repository, path and revision vouches for the file
            record = download_record(self.models_dir, row["repo"], row["file"], "main")
        except HubError as exc:  # a name that cannot be a path here
            self.download_button.setEnabled(False)
            self._say(str(exc))
            return
        if record is not None:
            not_chat = hub_worker.not_for_chat(target)  # (an embedding model: the library leaves it out)
            self.path = target if not_chat is None else None
            self.use_button.setVisible(not_chat is None)
            self.download_button.setEnabled(False)
            self._say(hub_worker.downloaded_words(target, record, not_chat, before=True))
        elif partial is not None:
            self.discard_button.setVisible(True)
            if not partial["mismatch"]:
                self.download_button.setText("Resume")
            self._say(f"{gb(partial['done'])} of {gb(partial['total'])} downloaded before; "
                      + ("Resume goes on from there." if not partial["mismatch"] else
                         "it was not the file the hub lists, so Download starts over."))
        elif target.exists():
            self._say(f"{target} is there, but not as a download of this file; Download checks it "
                      "against the hub's sha256 and keeps it only if it matches.")

    def discard(self, repo: str | None = None, file: str | None = None) -> None:  # (None: the chosen row's)
        row = self.selected()
        if file is None and row is not None:
            repo, file = row["repo"], row["file"]
        if repo is not None and file is not None and self.cancel is None:
            said = hub_worker.remove_partial(self.models_dir, repo, file)
            self._row_chosen()
            self._say(said)

    # -- asking the hub (only when the user does) --

    def _busy(self, text: str) -> bool:
        if self.calls.busy:
            self._say("Wait for the hub to answer, or stop the download, first.")
            return True
        self._say(text)
        return False

    def _ask(self, saying: str, call: Callable[[HubClient], Any], on_done: Callable) -> None:
        """``call(client)`` on the worker thread, with a client for models.hub_url (and its
        token), unless a call is under way; ``on_done(result, error)`` on the GUI thread."""
        if self._busy(saying):
            return
        hub_url = self.hub_url

        def work() -> Any:
            with HubClient.for_settings(hub_url) as client:
                return call(client)

        self.calls.run(work, on_done)

    def ask_token(self) -> None:
        self.box = token_dialog(self, self.hub_url, self._say)

    def search(self) -> None:
        text = self.search_edit.text().strip()
        if text:
            self._ask(f"Searching {self.hub_url} for “{text}”…", lambda client: client.search(text), self._found)

    def _found(self, repos: list | None, error: BaseException | None) -> None:
        if error is not None:
            self._say(_sentence(error))
            return
        while self.repos.count() > 1:
            self.repos.takeItem(1)
        for repo in repos or []:
            item = QListWidgetItem(show_untrusted(hub_worker.repo_label(repo)))
            item.setData(Qt.ItemDataRole.UserRole, repo.id)
            item.setToolTip(f"{repo.downloads or 0:,} downloads")
            self.repos.addItem(item)
        self._say(f"{len(repos or [])} repositories with GGUF files; choose one to see its files."
                            if repos else "No repository with GGUF files matches that.")

    def _repo_chosen(self, item: QListWidgetItem | None, _previous: Any = None) -> None:
        if item is None:
            return
        repo = item.data(Qt.ItemDataRole.UserRole)
        if not repo:
            self.show_recommended()
            return
        self._fill([])
        memory, models_dir = self.memory, self.models_dir
        self._ask(f"Listing the files of {repo}…",
                  lambda client: hub_worker.file_rows(repo, client.files(repo), memory, models_dir),
                  lambda found, error: self._listed(repo, found, error))

    def _listed(self, repo: str, found: tuple | None, error: BaseException | None) -> None:
        current = self.repos.currentItem()
        if current is None or current.data(Qt.ItemDataRole.UserRole) != repo:
            return
        if error is not None or found is None:
            self._say(_sentence(error))
            return
        self._fill(found[0])
        self._say(found[1])

    def check_sizes(self) -> None:
        def done(found: dict | None, error: BaseException | None) -> None:
            if error is not None:
                self._say(_sentence(error))
                return
            self.sizes.update(found or {})
            current = self.repos.currentItem()
            if current is not None and not current.data(Qt.ItemDataRole.UserRole):
                self.show_recommended()

        self._ask("Asking the hub for the recommended files' sizes…", hub_worker.recommended_sizes, done)

    # -- downloading --

    def start(self) -> None:
        row = self.selected()
        if row is None or self.cancel is not None or self.calls.busy:
            return
        repo, file, models_dir = row["repo"], row["file"], self.models_dir
        cancel = self.cancel = threading.Event()
        progressed = self.calls.progressed
        self._ask("", lambda client: hub_worker.fetch(client, repo, file, models_dir, cancel, progressed.emit),
                  lambda found, error: self._fetched(repo, file, found, error))
        self._choosing(False)
        self._say(f"Downloading {file} of {repo}; Stop keeps what arrived, and Resume goes on from there.")
        self.progress.setValue(0)
        self.progress.show()
        self.progress_label.setText("Connecting…")
        self.last = None
        self.stale.start()
        self.stop_button.show()
        self.stop_button.setEnabled(True)
        self.download_button.setEnabled(False)
        self.use_button.hide()

    def _choosing(self, on: bool) -> None:  # off while a download runs: its row stays the chosen one
        self.table.setEnabled(on)
        self.repos.setEnabled(on)

    @Slot(object)
    def show_progress(self, p: DownloadProgress) -> None:
        if self.cancel is None:
            return
        self.progress.setValue(int(p.fraction * 1000))
        self.progress_label.setText(show_untrusted(p.describe()))
        self.last = (time.monotonic(), p)

    def _stale(self) -> None:
        if self.cancel is not None and self.last is not None:
            words = hub_worker.stale_words(*self.last)
            if words is not None:
                self.progress_label.setText(show_untrusted(words))

    def stop(self) -> None:
        if self.cancel is not None:
            self.cancel.set()
            self.stop_button.setEnabled(False)
            self.progress_label.setText("Stopping…")

    def _fetched(self, repo: str, file: str, found: tuple[Path, str | None] | None,
                 error: BaseException | None) -> None:
        self.cancel = None
        self.stale.stop()
        self.stop_button.hide()
        self._choosing(True)
        if error is None and found is not None:
            path, not_chat = found
            self.path = path if not_chat is None else None
            self.progress.setValue(1000)
            self.progress_label.setText("Done")
            self._say(hub_worker.downloaded_words(path, download_record(self.models_dir, repo, file, "main"), not_chat))
            self.download_button.setEnabled(False)
            self.use_button.setVisible(not_chat is None)
            self.use_button.setFocus()
            self.downloaded.emit(str(path))
            return
        self.progress.hide()
        self.progress_label.setText("")
        self._row_chosen()  # "Resume" when a partial file stays
        self._say(_sentence(error))
        if isinstance(error, HubError) and error.kind != "stopped":  # (Remove it: not the row chosen now)
            self.box = partial_question(self, error, lambda: self.discard(repo, file)) or self.box

    def use(self) -> None:
        if self.path is not None:
            self.useModel.emit(str(self.path))
            self.accept()

    def done(self, result: int) -> None:  # closing: a download under way stops, its partial stays
        if self.cancel is not None:
            self.cancel.set()  # runtime.hub shuts its socket: it ends within a moment
            self.stale.stop()
            thread = self.calls.thread
            if thread is not None:
                thread.join(1.0)  # at most a second; a worker still writing its end goes on alone
        super().done(result)

