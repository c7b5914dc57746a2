"""Model ▸ Download…: find a GGUF on the model hub (``runtime.hub``), download it with a
progress bar, speed, time left and Stop, and use it.

Opening the dialog contacts nothing: the recommended models come from local data
(``hub.RECOMMENDED``), with the memory each needs at the chosen ``n_ctx`` (the library's
estimate: weights plus KV cache) against this computer's memory. The hub is asked only
when the user searches, opens a repository's files, checks the sizes or downloads; the
privacy line says so. Hub calls run on a worker thread of their own (a download may take
an hour: the DB thread must stay free), one at a time; their results come back on the GUI
thread as signals. A failed or stopped download keeps its ``.partial`` file; the user
keeps it (Resume) or removes it (Remove partial, or the question after a failure).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal, Slot
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
    RECOMMENDED,
    DownloadProgress,
    HubClient,
    HubError,
    HubFile,
    discard_partial,
    download,
    download_record,
    download_target,
    partial_state,
    system_memory_bytes,
    verified_words,
)
from iris_desktop.runtime.remote import server_address
from iris_desktop.ui.hub_worker import HubCalls, fits_text, gb, partial_question, token_dialog
from iris_desktop.ui.hub_worker import sentence as _sentence
from iris_desktop.units import memory_size

COLUMNS = ("Model", "File", "Quantization", "Size", "Trained context", "Memory at n_ctx",
           "This computer", "License")
RECOMMENDED_ITEM = "Recommended"


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

        try:
            host = server_address(hub_url) if hub_url else "no hub (models.hub_url is empty)"
        except ValueError:
            host = hub_url
        self.privacy = QLabel(
            f"Nothing is contacted until you search, check sizes or download. Then Iris asks "
            f"<b>{host}</b> (models.hub_url) — sending only the search text and the model and "
            f"file names — and downloads from the file host it points to. Your chats never leave "
            f"this computer.")
        self.privacy.setObjectName("privacy")
        self.privacy.setWordWrap(True)
        self.search_edit = QLineEdit()
        self.search_edit.setPlaceholderText("Search the hub for GGUF models, e.g. qwen2.5 instruct")
        self.search_edit.setClearButtonEnabled(True)
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
        self.table = QTableWidget(0, len(COLUMNS))
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

        self.status = QLabel("")
        self.status.setObjectName("download-status")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.hide()
        self.progress_label = QLabel("")
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
        self.discard_button.clicked.connect(self.discard)

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
        self.resize(zero * 160, self.fontMetrics().height() * 30)
        self.repos.setCurrentRow(0)

    # -- what the table shows --

    def show_recommended(self) -> None:
        rows = []
        for rec in RECOMMENDED:
            size = self.sizes.get((rec.repo, rec.file))
            estimate = rec.memory_estimate_bytes(self.n_ctx, size)
            mark = " · Recommended for this computer" if (rec.repo, rec.file) == self.recommended else ""
            rows.append({"repo": rec.repo, "file": rec.file, "size": size or rec.size_bytes,
                         "cells": [rec.title, rec.file, rec.quantization or "–",
                                   gb(size or rec.size_bytes, about=size is None),
                                   tokens(rec.context_length), memory_size(estimate),
                                   fits_text(estimate, self.memory) + mark,
                                   rec.license],
                         "tip": f"{rec.repo} · {rec.parameters} parameters",
                         "about": f"{rec.title} ({rec.parameters} parameters, {rec.repo}): {rec.note}."})
        self._fill(rows)
        self.status.setText(f"Recommended chat models, small to larger; memory is the weights plus the KV "
                            f"cache at n_ctx {tokens(self.n_ctx) if self.n_ctx else 'trained'}."
                            + ("" if self.sizes else " Sizes are as published until you check them."))

    def show_files(self, repo: str, files: list[HubFile]) -> None:
        rows = []
        for f in files:
            if not f.is_gguf:
                continue
            rows.append({"repo": repo, "file": f.path, "size": f.size,
                         "cells": [repo.split("/", 1)[1], f.path, f.quantization or "–", gb(f.size), "–",
                                   f"at least {memory_size(f.size)}", fits_text(f.size, self.memory),
                                   "see the repository"],
                         "tip": repo,
                         "about": f"{f.path} of {repo}" + ("" if f.sha256 else
                                                           " (no sha256 listed: checked by size only)")})
        self._fill(rows)
        self.status.setText(f"{len(rows)} GGUF file(s) in {repo}. The KV cache comes on top of the "
                            "weights; the library shows the full estimate once it is downloaded."
                            if rows else f"{repo} holds no GGUF file.")

    def _fill(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows
        self.table.setRowCount(len(rows))
        for r, row in enumerate(rows):
            for c, text in enumerate(row["cells"]):
                item = QTableWidgetItem(text)
                item.setToolTip(row["tip"] if c == 0 else text)
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
        self.status.setText(row["about"])
        target = download_target(self.models_dir, row["repo"], row["file"])
        partial = partial_state(self.models_dir, row["repo"], row["file"])
        if target.is_file():
            self.path = target
            self.use_button.setVisible(True)
            self.download_button.setEnabled(False)
            checked = verified_words(download_record(self.models_dir, row["repo"], row["file"]))
            self.status.setText(f"Already downloaded and {checked}: {target}")
        elif partial is not None:
            self.discard_button.setVisible(True)
            if not partial["mismatch"]:
                self.download_button.setText("Resume")
            self.status.setText(f"{gb(partial['done'])} of {gb(partial['total'])} downloaded before; "
                                + ("Resume goes on from there." if not partial["mismatch"] else
                                   "it did not match the hub's sha256, so Download starts over."))

    def discard(self) -> None:
        row = self.selected()
        if row is not None and self.cancel is None:
            discard_partial(self.models_dir, row["repo"], row["file"])
            self._row_chosen()
            self.status.setText(f"Removed the partial file of {row['file']}.")

    # -- asking the hub (only when the user does) --

    def _busy(self, text: str) -> bool:
        if self.calls.busy:
            self.status.setText("Wait for the hub to answer, or stop the download, first.")
            return True
        self.status.setText(text)
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
        self.box = token_dialog(self, self.hub_url, self.status.setText)

    def search(self) -> None:
        text = self.search_edit.text().strip()
        if text:
            self._ask(f"Searching {self.hub_url} for “{text}”…", lambda client: client.search(text), self._found)

    def _found(self, repos: list | None, error: BaseException | None) -> None:
        if error is not None:
            self.status.setText(_sentence(error))
            return
        while self.repos.count() > 1:
            self.repos.takeItem(1)
        for repo in repos or []:
            item = QListWidgetItem(repo.id + ("  (gated)" if repo.gated else ""))
            item.setData(Qt.ItemDataRole.UserRole, repo.id)
            item.setToolTip(f"{repo.downloads or 0:,} downloads")
            self.repos.addItem(item)
        self.status.setText(f"{len(repos or [])} repositories with GGUF files; choose one to see its files."
                            if repos else "No repository with GGUF files matches that.")

    def _repo_chosen(self, item: QListWidgetItem | None, _previous: Any = None) -> None:
        if item is None:
            return
        repo = item.data(Qt.ItemDataRole.UserRole)
        if not repo:
            self.show_recommended()
            return
        self._fill([])
        self._ask(f"Listing the files of {repo}…", lambda client: client.files(repo),
                  lambda files, error: self._listed(repo, files, error))

    def _listed(self, repo: str, files: list | None, error: BaseException | None) -> None:
        current = self.repos.currentItem()
        if current is None or current.data(Qt.ItemDataRole.UserRole) != repo:
            return
        if error is not None:
            self.status.setText(_sentence(error))
            return
        self.show_files(repo, files or [])

    def check_sizes(self) -> None:
        def ask(client: HubClient) -> dict:
            found = {}
            for rec in RECOMMENDED:
                try:
                    files = client.files(rec.repo)
                except HubError as exc:  # one repository gone or gated: the others still count
                    if exc.kind not in ("not_found", "auth"):
                        raise
                    continue
                found.update({(rec.repo, f.path): f.size for f in files if f.path == rec.file})
            return found

        def done(found: dict | None, error: BaseException | None) -> None:
            if error is not None:
                self.status.setText(_sentence(error))
                return
            self.sizes.update(found or {})
            current = self.repos.currentItem()
            if current is not None and not current.data(Qt.ItemDataRole.UserRole):
                self.show_recommended()

        self._ask("Asking the hub for the recommended files' sizes…", ask, done)

    # -- downloading --

    def start(self) -> None:
        row = self.selected()
        if row is None or self.cancel is not None or self.calls.busy:
            return
        repo, file, models_dir = row["repo"], row["file"], self.models_dir
        cancel = self.cancel = threading.Event()
        progressed = self.calls.progressed
        self._ask("", lambda client: download(client, repo, file, models_dir, cancel=cancel, progress=progressed.emit),
                  lambda path, error: self._fetched(repo, file, path, error))
        self.status.setText(f"Downloading {file} of {repo}; Stop keeps what arrived, and Resume goes on "
                            "from there.")
        self.progress.setValue(0)
        self.progress.show()
        self.progress_label.setText("Connecting…")
        self.stop_button.show()
        self.stop_button.setEnabled(True)
        self.download_button.setEnabled(False)
        self.use_button.hide()

    @Slot(object)
    def show_progress(self, p: DownloadProgress) -> None:
        if self.cancel is None:
            return
        self.progress.setValue(int(p.fraction * 1000))
        self.progress_label.setText(p.describe())

    def stop(self) -> None:
        if self.cancel is not None:
            self.cancel.set()
            self.stop_button.setEnabled(False)
            self.progress_label.setText("Stopping…")

    def _fetched(self, repo: str, file: str, path: Path | None, error: BaseException | None) -> None:
        self.cancel = None
        self.stop_button.hide()
        if error is None and path is not None:
            self.path = path
            self.progress.setValue(1000)
            self.progress_label.setText("Done")
            checked = verified_words(download_record(self.models_dir, repo, file))
            self.status.setText(f"Downloaded and {checked}: {path}")
            self.download_button.setEnabled(False)
            self.use_button.show()
            self.use_button.setFocus()
            self.downloaded.emit(str(path))
            return
        self.progress.hide()
        self.progress_label.setText("")
        self._row_chosen()  # "Resume" when a partial file stays
        self.status.setText(_sentence(error))
        if isinstance(error, HubError) and error.kind != "stopped" and error.partial is not None \
                and error.partial.exists():
            self.box = partial_question(self, error, self.discard)

    def use(self) -> None:
        if self.path is not None:
            self.useModel.emit(str(self.path))
            self.accept()

    def done(self, result: int) -> None:  # closing: a download under way stops, its partial stays
        if self.cancel is not None:
            self.cancel.set()
            thread = self.calls.thread
            if thread is not None:
                thread.join(5.0)
        super().done(result)

