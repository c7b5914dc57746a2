"""The model's lifecycle on screen: loading on the model thread, ready or failed, the
error box with a way out, and choosing another GGUF file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QFileDialog, QMessageBox

from iris_desktop.settings import write_config_value
from iris_desktop.ui.model_thread import LoadedModel

if TYPE_CHECKING:
    from iris_desktop.ui.main_window import MainWindow


class ModelControl(QObject):
    """``state``: none | loading | ready | failed; ``info``: the loaded model's facts."""

    def __init__(self, window: MainWindow):
        super().__init__(window)
        self.window = window
        self.state = "none"
        self.info: dict[str, Any] | None = None
        self.error: str | None = None
        self.box: QMessageBox | None = None

    def load(self) -> None:
        """(Re)load the configured model on the model thread; the UI stays usable."""
        w = self.window
        if w.turns.generating:
            w.statusBar().showMessage("Stop the reply before reloading the model", 4000)
            return
        self.state = "loading"
        w.context.set_runtime(None)  # nothing counts with a model that is being replaced
        w.composer.set_can_send(False, "Loading the model…")
        w.busy("Loading the model…")
        w.model.load(w.session.settings)

    def loaded(self, loaded: LoadedModel) -> None:
        w = self.window
        info = loaded.info
        self.state, self.info, self.error = "ready", info, None
        w.model_label.setText(f"{info['name']} · n_ctx {info['n_ctx']:,}")
        w.model_label.setToolTip(info.get("path") or info["name"])
        w.busy(None)
        took = info.get("load_time_s")
        w.state_label.setText("Ready" + (f" (model loaded in {took:.1f} s)" if took else ""))
        w.composer.set_can_send(True)
        w.context.set_runtime(loaded.runtime, loaded.embedder)

    def failed(self, message: str) -> None:
        w = self.window
        self.state, self.info, self.error = "failed", None, message
        w.model_label.setText("No model")
        w.model_label.setToolTip(message)
        w.busy(None)
        w.state_label.setText("No model: browsing only")
        w.composer.set_can_send(False, "No model is loaded — Model ▸ Load model…")
        self.show_error(message)

    def show_error(self, message: str) -> None:
        box = QMessageBox(QMessageBox.Icon.Warning, "The model could not be loaded",
                          "Iris could not load its model, so it cannot answer right now. "
                          "Your conversations are still here to browse, search and export.",
                          parent=self.window)
        box.setObjectName("model-error")
        box.setInformativeText(message)
        choose = box.addButton("Choose model file…", QMessageBox.ButtonRole.AcceptRole)
        box.addButton("Continue without a model", QMessageBox.ButtonRole.RejectRole)
        box.finished.connect(lambda _: box.clickedButton() is choose and self.choose_file())
        self.box = box
        box.open()

    def choose_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.window, "Choose a GGUF model",
                                              str(Path.home()),
                                              "GGUF models (*.gguf);;All files (*)")
        if path:
            self.use_file(path)

    def use_file(self, path: str) -> None:
        """Save ``model.path`` and load it (for this run too when a variable pins it)."""
        w = self.window
        write_config_value(w.session.paths.config_path, "model.path", path)
        settings = w.reload_settings()
        if settings["model.path"] != path:
            w.session.settings = settings.with_overrides({"model.path": path})
        self.load()
