"""The model's lifecycle on screen: loading on the model thread (with progress and
Cancel), ready or failed, the error box with a way out, the model library (Model ▸
Models…) and choosing another GGUF file.

A load never takes the model in use away first: the worker loads the new one beside it
and swaps only when it has loaded, so a failed or cancelled load leaves the chat usable
on the previous model, and says why."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QFileDialog, QMessageBox

from iris_desktop.settings import BUNDLED, write_config_value
from iris_desktop.ui.model_thread import LoadedModel, LoadJob
from iris_desktop.ui.models_dialog import ModelsDialog
from iris_desktop.ui.server_dialog import ServerDialog, confirm_send, forget_send_confirmation

if TYPE_CHECKING:
    from iris_desktop.ui.main_window import MainWindow


class ModelControl(QObject):
    """``state``: none | loading | ready | failed; ``info``: the loaded model's facts
    (kept while another model loads: it is still the one answering)."""

    def __init__(self, window: MainWindow):
        super().__init__(window)
        self.window = window
        self.state = "none"
        self.info: dict[str, Any] | None = None
        self.error: str | None = None
        self.box: QMessageBox | None = None
        self.job: LoadJob | None = None
        #: a model chosen in this run: (the model.* values that choose it, the settings
        #: before), saved to the config file only once it has loaded
        self.pending: tuple[dict[str, Any], Any] | None = None
        self.library: ModelsDialog | None = None
        self.server_dialog: ServerDialog | None = None
        window.model.worker.loadProgress.connect(self.progress)

    def load(self) -> None:
        """(Re)load the configured model on the model thread; the UI stays usable, and
        the model in use (if any) keeps answering until the new one is ready."""
        w = self.window
        if w.turns.generating:
            w.statusBar().showMessage("Stop the reply before reloading the model", 4000)
            return
        if self.job is not None:
            self.job.cancel.set()  # a newer choice replaces a load under way
        self.state = "loading"
        w.composer.set_can_send(False, "Loading the model…")
        w.busy("Loading the model…")
        self.job = w.model.load(w.session.settings)
        if self.library is not None:
            self.library.loading(0.0)

    def cancel_load(self) -> None:
        if self.job is not None:
            self.job.cancel.set()
            self.window.busy("Cancelling the load…")

    def progress(self, fraction: float) -> None:
        if self.state != "loading":
            return
        self.window.busy(f"Loading the model… {int(fraction * 100)}%", fraction)
        if self.library is not None:
            self.library.loading(fraction)

    def _load_ended(self) -> None:
        self.job = None
        self.window.busy(None)
        if self.library is not None:
            self.library.loading(None)

    def loaded(self, loaded: LoadedModel) -> None:
        w = self.window
        info = loaded.info
        self._load_ended()
        self.state, self.info, self.error = "ready", info, None
        base = info.get("base_model")
        w.model_label.setText(f"{info['name']} · n_ctx {info['n_ctx']:,}"
                              + (" · base model" if base else ""))
        w.where_label.setText(info.get("where") or "local")
        w.where_label.setToolTip(
            "Your conversation stays on this computer" if not info.get("base_url") else
            f"Your conversation is sent to {info['base_url']}")
        w.model_label.setToolTip((info.get("path") or info["name"]) + (
            "\nA base model continues text rather than following instructions: replies "
            "may ramble, and compaction uses the extractive summary." if base else ""))
        took = info.get("load_time_s")
        w.state_label.setText("Ready" + (f" (model loaded in {took:.1f} s)" if took else ""))
        w.composer.set_can_send(True)
        w.context.set_runtime(loaded.runtime, loaded.embedder)
        if self.pending is not None:
            self._save_choice(self.pending[0])
        if self.library is not None:
            self.refresh_library()

    def may_send(self) -> bool:
        """Before a conversation first goes to a server on another machine, ask once per
        server (remembered in ui-state.ini); a local model or a loopback server never
        asks. False: the user said no, nothing is sent."""
        base_url = (self.info or {}).get("base_url")
        if not base_url:
            return True
        return confirm_send(base_url, self.window.ui_state, self.window)

    def failed(self, message: str) -> None:
        w = self.window
        self._load_ended()
        self.error = message
        if self.pending is not None:  # the choice did not work: the settings go back
            w.session.settings, self.pending = self.pending[1], None
        if self.info is not None:  # the previous model is still loaded and answering
            self.state = "ready"
            w.composer.set_can_send(True)
            w.state_label.setText(f"Still using {self.info['name']}")
            self.show_error(message, keeping=self.info["name"])
            return
        self.state, self.info = "failed", None
        w.model_label.setText("No model")
        w.model_label.setToolTip(message)
        w.state_label.setText("No model: browsing only")
        w.composer.set_can_send(False, "No model is loaded — Model ▸ Models…")
        self.show_error(message)

    # -- the library --

    def open_library(self) -> ModelsDialog:
        """Model ▸ Models…: list the library (headers only, on the DB thread)."""
        if self.library is None:
            self.library = ModelsDialog(self.window)
            self.library.useModel.connect(self.use_file)
            self.library.finished.connect(self._library_closed)
        self.refresh_library()
        self.library.loading(0.0 if self.state == "loading" else None)
        self.library.show()
        self.library.raise_()
        return self.library

    def _library_closed(self, _result: int) -> None:
        if self.library is not None:
            self.library.deleteLater()
            self.library = None

    def refresh_library(self) -> None:
        from iris_desktop.runtime.library import discover_models, read_recent

        w = self.window
        settings, paths = w.session.settings, w.session.paths
        configured = settings["model.path"]

        def find(_store: Any) -> tuple[list[dict[str, Any]], str]:
            extra = [] if configured == BUNDLED else [configured]
            entries = discover_models(models_dir=paths.models_dir,
                                      recent=read_recent(paths.recent_models_path),
                                      extra_paths=extra, n_ctx=settings["model.n_ctx"])
            in_use = (str(entries[0].path) if configured == BUNDLED and entries
                      else str(Path(configured)))
            return [e.as_json() for e in entries], in_use

        def show(found: tuple[list[dict[str, Any]], str]) -> None:
            if self.library is not None:
                self.library.show_entries(*found)

        def failed(exc: BaseException) -> None:
            if self.library is not None:
                self.library.status.setText(f"Could not list the models: {exc}")

        w.background.run(find, show, failed, key="models")

    def show_error(self, message: str, keeping: str | None = None) -> None:
        text = (f"The new model could not be loaded, so Iris goes on with {keeping}."
                if keeping else
                "Iris could not load its model, so it cannot answer right now. "
                "Your conversations are still here to browse, search and export.")
        box = QMessageBox(QMessageBox.Icon.Warning, "The model could not be loaded", text,
                          parent=self.window)
        box.setObjectName("model-error")
        box.setInformativeText(message)
        choose = box.addButton("Choose model file…", QMessageBox.ButtonRole.AcceptRole)
        box.addButton(f"Keep {keeping}" if keeping else "Continue without a model",
                      QMessageBox.ButtonRole.RejectRole)
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
        """Load ``path`` (a file, or ``bundled``) instead of the model in use; once it has
        loaded it is saved as ``model.path``, and a failed load changes no setting."""
        self._choose({"model.backend": "local", "model.path": path})

    def _choose(self, values: dict[str, Any]) -> None:
        """Load the model ``values`` (``model.*`` settings) describe; they are saved once
        it has loaded, and a failed load changes no setting."""
        w = self.window
        if w.turns.generating:
            w.statusBar().showMessage("Stop the reply before changing the model", 4000)
            return
        before = self.pending[1] if self.pending is not None else w.session.settings
        try:
            w.session.settings = before.with_overrides(values)
        except Exception as exc:  # a value the settings refuse: say so, change nothing
            self.show_error(str(exc), keeping=self.info["name"] if self.info else None)
            return
        self.pending = (values, before)
        self.load()

    def _save_choice(self, values: dict[str, Any]) -> None:
        """Write the chosen ``model.*`` values (for this run too when a variable pins
        one)."""
        w = self.window
        self.pending = None
        try:
            for key, value in values.items():
                write_config_value(w.session.paths.config_path, key, value)
            settings = w.reload_settings()
        except Exception as exc:  # the model runs; only remembering it failed
            w.statusBar().showMessage(f"Could not save the model choice: {exc}", 8000)
            return
        pinned = {key: value for key, value in values.items() if settings[key] != value}
        if pinned:
            w.session.settings = settings.with_overrides(pinned)

    # -- a server --

    def open_server(self) -> ServerDialog:
        """Model ▸ Server…: add a server, test it, choose its model, or remove it."""
        settings = self.window.session.settings
        remote = settings["model.backend"] == "openai"
        dialog = ServerDialog(settings["model.base_url"] if remote else "",
                              settings["model.name"] if remote else "", self.window)
        dialog.serverChosen.connect(self.use_server)
        dialog.serverRemoved.connect(self.remove_server)
        dialog.finished.connect(lambda _result: setattr(self, "server_dialog", None))
        self.server_dialog = dialog
        dialog.open()
        return dialog

    def use_server(self, base_url: str, name: str) -> None:
        """Connect to ``base_url`` (model ``name``; empty: the server's first) instead of
        the model in use; saved once connected."""
        self._choose({"model.backend": "openai", "model.base_url": base_url,
                      "model.name": name})

    def remove_server(self, base_url: str) -> None:
        """Forget ``base_url`` (its key already left the keyring); when it is the server
        in use, go back to the local model."""
        forget_send_confirmation(base_url, self.window.ui_state)
        if self.window.session.settings["model.base_url"] == base_url.rstrip("/"):
            self._choose({"model.backend": "local", "model.base_url": "", "model.name": ""})
