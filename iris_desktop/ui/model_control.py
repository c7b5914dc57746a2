"""The model's lifecycle on screen: loading on the model thread (with progress and
Cancel), ready or failed, the error box with a way out, the model library (Model ▸
Models…), downloading one (Model ▸ Download…) and choosing another GGUF file.

A load never takes the model in use away first: the worker loads the new one beside it
and swaps only when it has loaded, so a failed or cancelled load leaves the chat usable
on the previous model, and says why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QSettings, Qt, QTimer
from PySide6.QtWidgets import QFileDialog, QLabel, QMessageBox, QWidget

from iris_desktop.host import LOAD_STAGES, load_time_words
from iris_desktop.paths import AppPaths
from iris_desktop.settings import BUNDLED, write_config_value
from iris_desktop.ui.app_state import NO_MODEL, AppState, rolled_back
from iris_desktop.ui.background import Background
from iris_desktop.ui.boxes import plain_box
from iris_desktop.ui.composer import Composer
from iris_desktop.ui.download_dialog import DownloadDialog
from iris_desktop.ui.model_follow import reload_reason
from iris_desktop.ui.model_thread import LoadedModel, LoadJob, ModelThread
from iris_desktop.ui.models_dialog import ModelsDialog
from iris_desktop.ui.recommend_card import RecommendCard, RecommendControl
from iris_desktop.ui.server_dialog import ServerDialog, forget_send_confirmation, hold_conversation
from iris_desktop.ui.window_words import window_label


class ModelControl(QObject):
    """Sets ``app_state``'s model: ``state`` (none | loading | ready | failed), ``info``
    (the loaded model's facts, kept while another model loads: it is still the one
    answering) and ``error``; draws it in the composer and the status bar's labels."""

    def __init__(self, app_state: AppState, model: ModelThread, background: Background,
                 paths: AppPaths, composer: Composer, model_label: QLabel, where_label: QLabel,
                 ui_state: QSettings, parent: QWidget):
        super().__init__(parent)
        self.app_state = app_state
        self.model = model
        self.background = background
        self.paths = paths
        self.composer = composer
        self.model_label = model_label
        self.where_label = where_label
        self.ui_state = ui_state  # ui-state.ini: the servers a conversation may go to
        self.parent_widget = parent  # dialogs open over it
        self.box: QMessageBox | None = None
        self.job: LoadJob | None = None
        #: each load under way's model.* values; and those of a replaced load that loaded
        #: anyway (saved if the newer choice fails: it is the model that goes on answering)
        self.chosen: dict[LoadJob, dict[str, Any]] = {}
        self.adopted: dict[str, Any] | None = None
        self.library: ModelsDialog | None = None
        self.downloads: DownloadDialog | None = None
        self.server_dialog: ServerDialog | None = None
        #: what the load is doing, in words (the model thread says it before any progress):
        #: the status bar shows it with the percentage
        self.load_text = LOAD_STAGES["loading"]
        model.worker.loadProgress.connect(self.progress)
        model.worker.loading.connect(self._load_stage)
        #: why the server is being connected to again (said once it is)
        self._reconnecting: str | None = None
        app_state.generatingChanged.connect(self._after_turn)
        app_state.plannerChanged.connect(lambda _planner: self.info and self._show_model(self.info))
        model.worker.gpuFailed.connect(self._follow_server)  # a warm-up's too: never mid-turn
        #: the welcome panel's recommendation (its card, when the window has one), and
        #: Model ▸ Download…'s "Recommended for this computer"
        self.recommend = RecommendControl(parent.findChild(RecommendCard), app_state, paths, self.use_file, self)

    #: a model chosen in this run: (its model.* values, the settings before), saved to the
    #: config file only once it has loaded; kept by AppState (Preferences shows it)
    pending = property(lambda self: self.app_state.model_try,
                       lambda self, value: setattr(self.app_state, "model_try", value))

    @property
    def state(self) -> str:
        return self.app_state.model_state

    @property
    def info(self) -> dict[str, Any] | None:
        return self.app_state.model_info

    @property
    def error(self) -> str | None:
        return self.app_state.model_error

    def load(self) -> None:
        """(Re)load the configured model on the model thread; the UI stays usable, and
        the model in use (if any) keeps answering until the new one is ready."""
        state = self.app_state
        if state.generating:
            state.show_message("Stop the reply before reloading the model")
            return
        if self.job is not None:
            self.job.cancel.set()  # a newer choice replaces a load under way
        state.set_model("loading", state.loaded, state.model_error)
        self.composer.set_can_send(False, "Loading the model…")
        state.busy("Loading the model…")
        self.job = self.model.load(state.settings)
        if self.library is not None:
            self.library.loading(0.0)

    def cancel_load(self) -> None:
        if self.job is not None:
            self.job.cancel.set()
            self.app_state.busy("Cancelling the load…")

    def _load_stage(self, text: str) -> None:
        self.load_text = text

    def progress(self, fraction: float) -> None:
        if self.state != "loading":
            return
        self.app_state.busy(f"{self.load_text} {int(fraction * 100)}%", fraction)
        if self.library is not None:
            self.library.loading(fraction)

    def _load_ended(self) -> None:
        self.job, self.chosen = None, {}
        self.app_state.busy(None)
        if self.library is not None:
            self.library.loading(None)

    def _superseded(self, job: LoadJob | None) -> bool:
        """Whether ``job`` is a load a newer choice replaced (its result is not the one
        the window waits for: taking a replaced load's "loading was cancelled" for the
        newer one's failure rolled the new choice back while it went on loading)."""
        return job is not None and job is not self.job

    def loaded(self, loaded: LoadedModel) -> None:
        # before the planner is made for it: a server not yet agreed to gets nothing
        hold_conversation(self.model.worker.host.runtime, self.ui_state)
        if loaded.restored:  # after its load's failure: the planner follows it, a newer load (if
            self._show_model(loaded.info)  # any) goes on, and no choice is saved for it
            self.app_state.set_model(self.state, loaded, self.error)
            return
        if self._superseded(loaded.job):
            # it loaded before its cancel was seen: it answers until the newer load
            # replaces it, so it is the model a failure of that load goes on with
            self._show_model(loaded.info)
            self.app_state.set_model("loading", loaded, None)
            if self.pending is not None and loaded.job is not None:
                self.pending = (self.pending[0], loaded.job.settings)
                self.adopted = self.chosen.get(loaded.job)
            return
        self._load_ended()
        self._show_model(loaded.info)
        self._ready(loaded)

    def _show_model(self, info: dict[str, Any]) -> None:
        """The status bar's labels for the model that answers now."""
        base = info.get("base_model")
        quant = info.get("file_type")  # the GGUF's quantization (Q4_K_M); none from a server
        device = info.get("device")  # "GPU: <name> · 28/29 layers" or "CPU" (none for a server)
        # in words, short: the status sentence beside it gets the room (details: tooltip)
        self.model_label.setText(f"{info['name']} · {window_label(info['n_ctx'], self.app_state.planner)}"
                                 + (" · base model" if base else "")
                                 + (f" · {device}" if device else ""))
        self.where_label.setText(info.get("where") or "local")
        self.where_label.setToolTip(
            "Your conversation stays on this computer" if not info.get("base_url") else
            f"Your conversation is sent to {info['base_url']}")
        self.model_label.set_details((info.get("path") or info["name"]) + (
            f"\nQuantization {quant}" if quant else "") + (
            f"\nContext window (model.n_ctx): {info['n_ctx']:,} tokens") + (
            "\nA base model continues text rather than following instructions: replies "
            "may ramble, and compaction uses the extractive summary." if base else "")
            + (f"\n{device}: {info['device_reason']}" if device and info.get("device_reason") else ""))

    def _ready(self, loaded: LoadedModel) -> None:
        info, device = loaded.info, loaded.info.get("device")
        # the bundled model's first set-up, before its load (the host's runtime is this one)
        took = load_time_words(info.get("load_time_s"), getattr(
            self.model.worker.host.runtime, "setup_time_s", 0.0), bool(info.get("base_url")))
        notice = info.get("device_notice")  # why a GPU is not used (fully), in one sentence
        self.app_state.show_status("Ready" + (f" ({took})" if took else "")
                                   + (f" · {device}: {notice}" if notice else ""))
        self.composer.set_can_send(True)
        self.app_state.set_model("ready", loaded, None)  # the planner follows
        if self._reconnecting:
            self.app_state.show_message(self._reconnecting, 15_000)
            self._reconnecting = None
        if self.pending is not None:
            self._save_choice(self.pending[0])
        if self.library is not None:
            self.refresh_library()

    def failed(self, message: str, job: LoadJob | None = None) -> None:
        if self._superseded(job):  # a replaced load's end: the newer one is still under way
            return
        self._reconnecting = None
        state = self.app_state
        job = job or self.job
        cancelled = job is not None and job.cancel.is_set()  # the user's Cancel
        self._load_ended()
        server = state.settings["model.backend"] == "openai"  # what failed: a server?
        again = self.pending is None  # not a new choice: the model in use, loaded again
        if self.pending is not None:  # the choice did not work: the keys it set go back
            (values, before), self.pending = self.pending, None
            state.set_settings(rolled_back(state.settings, before, values))
        if self.adopted is not None:  # to a replaced choice that loaded: it answers now
            self._save_choice(self.adopted)
        info = state.model_info if self.model.worker.host.runtime is not None else None
        if info is not None:  # the previous model is still loaded and answering
            state.set_model("ready", state.loaded, message)
            self.composer.set_can_send(True)
            state.show_status(f"Still using {info['name']}")
            if cancelled:  # what was asked for: said in passing, not as a failure
                state.show_message(f"Loading cancelled; Iris goes on with {info['name']}", 8000)
            else:
                self.show_error(message, keeping=info["name"], server=server, again=again)
            return
        state.set_model("failed", None, message)
        self.model_label.setText("No model")
        self.model_label.set_details(message)
        state.show_status(NO_MODEL)
        self.composer.set_can_send(False, "No model is loaded — Model ▸ Models…")
        if cancelled:  # asked for: no warning that Iris "could not load its model"
            state.show_message("Loading cancelled; no model is loaded (Model ▸ Models… loads one)", 8000)
        else:
            self.show_error(message, server=server)

    # -- the library --

    def open_library(self) -> ModelsDialog:
        """Model ▸ Models…: list the library (headers only, on the DB thread)."""
        if self.library is None:
            self.library = ModelsDialog(self.parent_widget)
            self.library.useModel.connect(self.use_file)
            self.library.cancelRequested.connect(self.cancel_load)
            self.library.downloadRequested.connect(self.open_download)
            self.library.finished.connect(self._library_closed)
        self.refresh_library()
        self.library.loading(0.0 if self.state == "loading" else None)
        self.library.show()
        self.library.raise_()
        return self.library

    def open_download(self) -> DownloadDialog:
        """Model ▸ Download…: find and download a model from the hub (models.hub_url);
        nothing is contacted until the user searches or downloads."""
        if self.downloads is None:
            settings = self.app_state.settings
            dialog = DownloadDialog(settings["models.hub_url"], self.paths.models_dir,
                                    settings["model.n_ctx"], self.parent_widget,
                                    recommended=self.recommend.recommended_file())
            dialog.useModel.connect(self.use_file)
            dialog.downloaded.connect(lambda _path: self.library is not None and self.refresh_library())
            dialog.finished.connect(lambda _result: setattr(self, "downloads", None))
            dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
            self.downloads = dialog
        self.downloads.show()
        self.downloads.raise_()
        return self.downloads

    def _library_closed(self, _result: int) -> None:
        if self.library is not None:
            self.library.deleteLater()
            self.library = None

    def refresh_library(self) -> None:
        from iris_desktop.host import GPU_CHECKS_FILE
        from iris_desktop.runtime.gpu import GpuChecks
        from iris_desktop.runtime.library import discover_models, read_recent
        from iris_desktop.ui.gpu_info import cached_devices, fit_for

        settings, paths = self.app_state.settings, self.paths
        configured = settings["model.path"]

        def find(_store: Any) -> tuple[list[dict[str, Any]], str]:
            extra = [] if configured == BUNDLED else [configured]
            entries = discover_models(models_dir=paths.models_dir, extra_paths=extra,
                                      recent=read_recent(paths.recent_models_path),
                                      n_ctx=settings["model.n_ctx"], q8_weights=settings["model.q8_weights"])
            in_use = (str(entries[0].path) if configured == BUNDLED and entries
                      else str(Path(configured)))
            rows = [e.as_json() for e in entries]
            # whether each fits on the GPU: the same plan as Preferences ▸ Model and
            # 'iris-desktop devices', from each header at model.n_ctx (devices listed once)
            found = cached_devices()
            disabled = GpuChecks(paths.data_dir / GPU_CHECKS_FILE).disabled(found)
            for row in rows:
                row["gpu_fit"] = ("–" if row["error"] else
                                  fit_for(row["path"], settings["model.n_ctx"], found, settings, disabled,
                                          paths.data_dir / GPU_CHECKS_FILE))
            return rows, in_use

        def show(found: tuple[list[dict[str, Any]], str]) -> None:
            if self.library is not None:
                self.library.show_entries(*found, n_ctx=settings["model.n_ctx"])

        def failed(exc: BaseException) -> None:
            if self.library is not None:
                self.library.status.setText(f"Could not list the models: {exc}")

        self.background.run(find, show, failed, key="models")

    def show_error(self, message: str, keeping: str | None = None, server: bool = False,
                   again: bool = False) -> None:
        """Say why, as plain text (a server's error page is not drawn), and offer what
        fixes it: another model file, or for a server the Server… dialog. ``again``: the
        load was of the model in use (Reload, new settings), not a new one."""
        text = (f"The model could not be loaded again, so Iris goes on with {keeping} as it "
                "was loaded before." if keeping and again else
                f"The new model could not be loaded, so Iris goes on with {keeping}."
                if keeping else
                "Iris could not load its model, so it cannot answer right now. "
                "Your conversations are still here to browse, search and export.")
        box = plain_box(QMessageBox(QMessageBox.Icon.Warning, "The model could not be loaded",
                                    text, parent=self.parent_widget))
        box.setObjectName("model-error")
        box.setInformativeText(message)
        choose = box.addButton("Server…" if server else "Choose model file…",
                               QMessageBox.ButtonRole.AcceptRole)
        box.addButton(f"Keep {keeping}" if keeping else "Continue without a model",
                      QMessageBox.ButtonRole.RejectRole)
        fix = self.open_server if server else self.choose_file
        box.finished.connect(lambda _: box.clickedButton() is choose and fix())
        self.box = box
        box.open()

    def choose_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.parent_widget, "Choose a GGUF model",
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
        state = self.app_state
        if state.generating:
            state.show_message("Stop the reply before changing the model")
            return
        before = self.pending[1] if self.pending is not None else state.settings
        try:  # over the settings in force: what changed during a replaced try stays
            trying = (rolled_back(state.settings, before, self.pending[0]) if self.pending
                      else before).with_overrides(values)
        except Exception as exc:  # a value the settings refuse: say so, change nothing
            self.show_error(str(exc), keeping=self.info["name"] if self.info else None,
                            server=values.get("model.backend") == "openai")
            return
        state.set_settings(trying)
        self.pending = (values, before)
        self.load()
        if self.job is not None:
            self.chosen[self.job] = values

    def _save_choice(self, values: dict[str, Any]) -> None:
        """Write the chosen ``model.*`` values (for this run too when a variable pins
        one)."""
        self.pending = self.adopted = None
        try:
            for key, value in values.items():
                write_config_value(self.paths.config_path, key, value)
            settings = self.app_state.reload_settings()
        except Exception as exc:  # the model runs; only remembering it failed
            self.app_state.show_message(f"Could not save the model choice: {exc}", 8000)
            return
        pinned = {key: value for key, value in values.items() if settings[key] != value}
        if pinned:
            self.app_state.set_settings(settings.with_overrides(pinned))

    # -- a server --

    def _after_turn(self, generating: bool) -> None:
        if not generating:  # after the turn's own updates (its status, its request)
            QTimer.singleShot(0, self._follow_server)

    def _follow_server(self) -> None:
        """Load the model in use again when what the planner was made with no longer holds
        (:func:`~iris_desktop.ui.model_follow.reload_reason`: its GPU failed during a reply
        or a warm-up, the server now runs another window, or the user has just agreed to send
        it the conversation); the reason is said once it has loaded. Not during a turn."""
        runtime = self.model.worker.host.runtime
        if self.state != "ready" or self.app_state.generating or self.job is not None or runtime is None:
            return
        why = reload_reason(runtime, self.info or {}, self.app_state.planner)
        if why is not None:
            self._reconnecting = why or None
            self.load()

    def open_server(self) -> ServerDialog:
        """Model ▸ Server…: add a server, test it, choose its model, or remove it."""
        settings = self.app_state.settings
        remote = settings["model.backend"] == "openai"
        dialog = ServerDialog(settings["model.base_url"] if remote else "",
                              settings["model.name"] if remote else "", self.parent_widget)
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
        forget_send_confirmation(base_url, self.ui_state)
        hold_conversation(self.model.worker.host.runtime, self.ui_state)
        if self.app_state.settings["model.base_url"] == base_url.rstrip("/"):
            self._choose({"model.backend": "local", "model.base_url": "", "model.name": ""})
