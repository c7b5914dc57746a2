"""Model ▸ Models…: the model library (``runtime.library``) in a table, Open GGUF…, and
"Use this model", which loads it on the model thread with a progress bar and Cancel.

Listing reads GGUF headers only (about 0.1 s a file), on the DB thread; the table shows
what each header says, the memory the model needs at the chosen ``n_ctx`` (weights
plus KV cache), and whether it fits on the GPU there (``model.gpu``'s plan,
:func:`iris_desktop.runtime.gpu.fit_text`). A base model is marked: it continues text
rather than following
instructions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from iris_desktop.core.views import tokens
from iris_desktop.ui.screen_fit import fit_to_screen
from iris_desktop.units import file_size, memory_size

COLUMNS = ("Name", "Source", "Architecture", "Parameters", "Quantization", "Size",
           "Trained context", "Chat template", "Memory at n_ctx", "Notes",
           "GPU at n_ctx")


def size_text(n: int | None, memory: bool = False) -> str:
    """A file's size (MB/GB of 10**6/10**9, as the download shows it), or with ``memory``
    the memory it needs (as memory is sold); "–" when unknown."""
    if not n:
        return "–"
    return memory_size(n) if memory else file_size(n)


def parameters_text(n: int | None) -> str:
    if not n:
        return "–"
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:,.0f} M"


def row_cells(entry: dict[str, Any], selected: bool) -> list[str]:
    """What one table row says about a model (``ModelEntry.as_json()``)."""
    notes = [note for note, on in (("in use", selected), ("base model", entry["base_model"]),
                                   ("verified", entry["verified"])) if on]
    if entry["error"]:
        notes = [f"unusable: {entry['error']}"]
    return [
        entry["name"], entry["source"], entry["architecture"] or "–",
        parameters_text(entry["parameters"]), entry["quantization"] or "–",
        size_text(entry["size_bytes"]),
        tokens(entry["context_length"]) if entry["context_length"] else "–",
        "yes" if entry["chat_template"] else "no",
        size_text(entry["memory_estimate_bytes"], memory=True), ", ".join(notes),
        entry.get("gpu_fit") or "–",
    ]


class ModelsDialog(QDialog):
    """The library; ``useModel(path)`` asks for a model to be loaded, ``cancelRequested``
    for the load under way to stop."""

    useModel = Signal(str)
    cancelRequested = Signal()
    downloadRequested = Signal()  # Model ▸ Download…, from here

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Models")
        self.setObjectName("models")
        self.entries: list[dict[str, Any]] = []
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.itemSelectionChanged.connect(self._selection_changed)
        self.table.itemDoubleClicked.connect(lambda _: self.use_selected())
        self.table.setTabKeyNavigation(False)  # Tab leaves the table (it went cell to cell)
        self.table.setAccessibleName("Models on this computer")
        self.status = QLabel("Looking for models…")
        self.status.setWordWrap(True)
        self.progress = QProgressBar()
        self.progress.hide()
        self.open_button = QPushButton("Open GGUF…")
        self.download_button = QPushButton("Download…")
        self.download_button.setToolTip("Find a model on Hugging Face and download it "
                                        "(nothing is contacted until you search)")
        self.download_button.clicked.connect(self.downloadRequested)
        self.use_button = QPushButton("Use this model")
        self.use_button.setEnabled(False)
        self.cancel_button = QPushButton("Cancel loading")
        self.cancel_button.hide()
        self.open_button.clicked.connect(self.open_file)
        self.use_button.clicked.connect(self.use_selected)
        self.cancel_button.clicked.connect(self.cancelRequested)
        # Enter in the list uses the selected model (it opened the file dialog)
        for button in (self.open_button, self.download_button, self.cancel_button):
            button.setAutoDefault(False)
        self.use_button.setDefault(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        row = QHBoxLayout()
        row.addWidget(self.open_button)
        row.addWidget(self.download_button)
        row.addStretch(1)
        row.addWidget(self.progress, 2)
        row.addWidget(self.cancel_button)
        row.addWidget(self.use_button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.status)
        layout.addLayout(row)
        layout.addWidget(buttons)
        fm = self.fontMetrics()  # at most the screen (it was 2,250 px wide at 18 pt)
        fit_to_screen(self, QSize(fm.horizontalAdvance("0") * 150, fm.height() * 28))

    # -- the list --

    def show_entries(self, entries: list[dict[str, Any]], selected: str, n_ctx: int) -> None:
        """The models found; ``selected``: the path in use; ``n_ctx``: the memory column's."""
        self.entries = entries
        self.table.setRowCount(len(entries))
        for r, entry in enumerate(entries):
            for c, text in enumerate(row_cells(entry, entry["path"] == selected)):
                item = QTableWidgetItem(text)
                item.setToolTip(entry["path"] if c == 0 else text)
                if entry["error"]:
                    item.setForeground(Qt.GlobalColor.gray)
                self.table.setItem(r, c, item)
        usable = sum(1 for e in entries if not e["error"])
        self.status.setText(
            f"{usable} {'model' if usable == 1 else 'models'} found. Memory is the weights "
            f"plus the KV cache for a {tokens(n_ctx)}-token window (model.n_ctx); GPU is what "
            "model.gpu would put on the graphics card there.")

    def selected_entry(self) -> dict[str, Any] | None:
        rows = self.table.selectionModel().selectedRows()
        return self.entries[rows[0].row()] if rows else None

    def _selection_changed(self) -> None:
        entry = self.selected_entry()
        self.use_button.setEnabled(entry is not None and not entry["error"])

    # -- choosing --

    def open_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a GGUF model", str(Path.home()),
                                              "GGUF models (*.gguf);;All files (*)")
        if path:
            self.useModel.emit(path)

    def use_selected(self) -> None:
        entry = self.selected_entry()
        if entry is not None and not entry["error"]:
            self.useModel.emit("bundled" if entry["source"] == "bundled" else entry["path"])

    # -- loading --

    def loading(self, fraction: float | None) -> None:
        """Show a load under way (None: it ended)."""
        busy = fraction is not None
        self.progress.setVisible(busy)
        self.cancel_button.setVisible(busy)
        self.use_button.setEnabled(not busy and self.selected_entry() is not None)
        self.open_button.setEnabled(not busy)
        if busy:
            self.progress.setRange(0, 100)
            self.progress.setValue(int(fraction * 100))
