"""The welcome panel's recommendation: the bundled model is small, and one model of Model ▸
Download…'s list suits this computer better (``runtime.recommend``); one click downloads it
and switches to it.

Nothing is contacted until the button is clicked: the computer's memory, cores and GPU
are read on the hub worker's thread (``hub_worker.HubCalls``; no socket). The download is
the dialog's (``runtime.hub.download`` on that thread: resumable, verified by sha256 and
GGUF header), and the model control loads the file as "Use this model" does: the bundled
model keeps answering until the new one has loaded, and stays in use when the download
or the load fails. A failure is one sentence; the partial file stays, and the button then
resumes it. The card shows while the window uses the bundled model, or a download it
started is under way or just done."""

from __future__ import annotations

import html
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Qt, Slot
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QProgressBar, QPushButton, QVBoxLayout, QWidget

from iris_desktop.host import GPU_CHECKS_FILE
from iris_desktop.paths import AppPaths
from iris_desktop.runtime.bundled import BUNDLED_MODEL
from iris_desktop.runtime.hub import (
    DownloadProgress,
    HubClient,
    HubError,
    download,
    download_target,
    partial_state,
)
from iris_desktop.runtime.recommend import Machine, Recommendation, file_gb, recommend
from iris_desktop.runtime.remote import server_address
from iris_desktop.settings import BUNDLED, Settings
from iris_desktop.ui.app_state import AppState
from iris_desktop.ui.hub_worker import HubCalls, sentence

SMALL = (f"The model that came with Iris ({BUNDLED_MODEL.display_name}) is small: it is good "
         "with code, but it often refuses or misreads personal requests.")
RECOMMENDED_MARK = "Recommended for this computer"


def uses_bundled(settings: Settings) -> bool:
    """The settings choose the bundled model (by name, or its file where it lies)."""
    path = str(settings["model.path"])
    return settings["model.backend"] == "local" and (path == BUNDLED or Path(path).name == BUNDLED_MODEL.file_name)


class Line(QLabel):
    """A label shown only while it says something (an empty label is a nameless control
    to a screen reader)."""

    def __init__(self) -> None:
        super().__init__("")
        self.setWordWrap(True)
        self.hide()

    def setText(self, text: str) -> None:  # noqa: N802 (Qt's name)
        super().setText(text)
        self.setVisible(bool(text))


class RecommendCard(QFrame):
    """The card: what the bundled model is, the recommendation, one button, the download's
    progress with Stop, and one line for the outcome."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("recommend-card")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.text = QLabel(SMALL)
        self.text.setObjectName("recommend-text")
        self.text.setWordWrap(True)
        self.text.setTextFormat(Qt.TextFormat.RichText)
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.button = QPushButton("")
        self.button.setObjectName("recommend-download")
        self.button.hide()
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setAccessibleName("Download progress")
        self.progress.hide()
        self.progress_label = Line()
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Stop the download; what arrived is kept, and the button resumes it")
        self.stop_button.setAccessibleName("Stop the download")
        self.stop_button.hide()
        self.status = Line()
        self.status.setObjectName("recommend-status")
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.privacy = Line()
        self.privacy.setEnabled(False)  # drawn as a quieter note
        row = QHBoxLayout()
        row.addWidget(self.button)
        row.addWidget(self.progress, 1)
        row.addWidget(self.stop_button)
        row.addStretch(0)
        column = QVBoxLayout(self)
        for part in (self.text, row, self.progress_label, self.status, self.privacy):
            column.addLayout(part) if isinstance(part, QHBoxLayout) else column.addWidget(part)
        self.hide()


class RecommendControl(QObject):
    """Reads this computer once (off the GUI thread), keeps the recommendation for the
    settings in force, and drives ``card`` (None: no card, the recommendation only, for
    Model ▸ Download…'s mark). ``use_file(path)`` switches the model (the model control's)."""

    def __init__(self, card: RecommendCard | None, app_state: AppState, paths: AppPaths,
                 use_file: Callable[[str], Any], parent: QObject | None = None):
        super().__init__(parent)
        self.card = card
        self.app_state = app_state
        self.paths = paths
        self.use_file = use_file
        self.machine: Machine | None = None
        self.recommendation: Recommendation | None = None
        self.calls = HubCalls(self)
        self.calls.progressed.connect(self.show_progress)
        self.cancel: threading.Event | None = None
        #: the downloaded file being switched to, until its load ends; ``deferred``: the
        #: switch waits for a reply to end
        self.switching: Path | None = None
        self.deferred = False
        #: this card started a download in this run: it stays until the user leaves it
        self.active = False
        self._cancels: list[threading.Event] = []
        if card is not None:
            card.button.clicked.connect(self.clicked)
            card.stop_button.clicked.connect(self.stop)
            cancels = self._cancels  # not self: the card may outlive this object's Python side
            card.destroyed.connect(lambda *_: [c.set() for c in cancels])
        app_state.settingsChanged.connect(self._settings_changed)
        app_state.modelStateChanged.connect(self._model_state)
        app_state.generatingChanged.connect(self._reply_ended)
        self._measure()

    def _measure(self) -> None:
        """Read this computer once the first load has ended (llama.cpp's devices are then
        listed; a GPU's free memory counts the model in use's back: the pick replaces it)."""
        if self.machine is not None or self.calls.busy or self.app_state.model_state in ("none", "loading"):
            return
        settings = self.app_state.settings
        gpu, checks = settings["model.gpu"], self.paths.data_dir / GPU_CHECKS_FILE
        self.calls.run(lambda: Machine.this_computer(gpu, checks), self._measured)

    def recommended_file(self) -> tuple[str, str] | None:
        """(repository, file) of the recommended model, once this computer has been read."""
        return self.recommendation.file if self.recommendation is not None else None

    @property
    def target(self) -> Path | None:
        rec = self.recommendation
        return download_target(self.paths.models_dir, *rec.file) if rec is not None and rec.model else None

    def _measured(self, machine: Machine | None, error: BaseException | None) -> None:
        if machine is None:  # reading this computer failed: no recommendation, no card
            return
        self.machine = machine
        self._settings_changed(self.app_state.settings)

    def _settings_changed(self, settings: Settings) -> None:
        if self.machine is None or self.cancel is not None or self.switching is not None:
            return
        self.recommendation = recommend(self.machine, settings["model.n_ctx"])
        self.show()

    # -- the card --

    def show(self) -> None:
        """Draw the recommendation: shown while the bundled model is in use (or this card's
        download is under way or just done)."""
        card, rec = self.card, self.recommendation
        if card is None or rec is None:
            return
        card.setVisible(self.active or uses_bundled(self.app_state.settings))
        if self.cancel is not None or self.switching is not None:
            return
        if rec.model is None:
            card.text.setText(f"{SMALL} {html.escape(rec.why)}")
            card.button.hide()
            card.privacy.setText("")
            return
        m = rec.model
        card.text.setText(f"{SMALL} For this computer Iris suggests <b>{html.escape(m.title)}</b> ({m.parameters} "
                          f"parameters, license: {html.escape(m.license)}). {html.escape(rec.why)}")
        in_use = str(self.app_state.settings["model.path"]) == str(self.target)
        card.button.setText(self._button_text(rec))
        card.button.setToolTip(f"{m.repo} · {m.file}")
        card.button.setEnabled(True)
        card.button.setVisible(not in_use)
        try:
            host = server_address(self.app_state.settings["models.hub_url"])
        except ValueError:
            host = self.app_state.settings["models.hub_url"] or "no hub (models.hub_url is empty)"
        card.privacy.setText("" if in_use else (
            f"Nothing is contacted until you click; then Iris asks {host} (models.hub_url) for this one "
            "file. The bundled model stays in use until the new one is ready."))

    def _button_text(self, rec: Recommendation) -> str:
        target = self.target
        if target is not None and target.is_file():
            return f"Use {rec.model.title}"
        partial = partial_state(self.paths.models_dir, *rec.file)
        if partial is not None and not partial["mismatch"] and partial["done"]:
            return f"Resume {rec.model.title} ({file_gb(partial['done'])} of {file_gb(rec.size_bytes)})"
        return rec.button_text

    def clicked(self) -> None:
        """Download the recommended model (or resume it), then switch to it; a file already
        downloaded is switched to at once."""
        rec, target = self.recommendation, self.target
        if rec is None or rec.model is None or target is None or self.cancel is not None or self.calls.busy:
            return
        self.active = True
        if target.is_file():
            self._switch(target)
            return
        hub_url, models_dir = self.app_state.settings["models.hub_url"], self.paths.models_dir
        repo, file = rec.file
        cancel = self.cancel = threading.Event()
        self._cancels.append(cancel)
        progressed = self.calls.progressed

        def work() -> Path:
            with HubClient.for_settings(hub_url) as client:
                return download(client, repo, file, models_dir, cancel=cancel, progress=progressed.emit)

        self.calls.run(work, self._fetched)
        card = self.card
        if card is not None:
            card.button.setEnabled(False)
            card.progress.setValue(0)
            card.progress.show()
            card.progress_label.setText("Connecting…")
            card.stop_button.setEnabled(True)
            card.stop_button.show()
            card.status.setText(f"Downloading {rec.model.title} ({file_gb(rec.size_bytes)}); you can "
                                "chat with the bundled model meanwhile.")

    @Slot(object)
    def show_progress(self, p: DownloadProgress) -> None:
        if self.cancel is None or self.card is None:
            return
        self.card.progress.setValue(int(p.fraction * 1000))
        self.card.progress_label.setText(p.describe())

    def stop(self) -> None:
        if self.cancel is not None:
            self.cancel.set()
            if self.card is not None:
                self.card.stop_button.setEnabled(False)
                self.card.progress_label.setText("Stopping…")

    def _fetched(self, path: Path | None, error: BaseException | None) -> None:
        cancel, self.cancel = self.cancel, None
        if cancel in self._cancels:
            self._cancels.remove(cancel)
        card = self.card
        if card is not None:
            card.stop_button.hide()
            card.progress.setVisible(error is None)
            card.progress_label.setText("" if error is not None else "Downloaded and verified")
        if error is None and path is not None:
            self._switch(Path(path))
            return
        if card is not None:
            card.button.setText(self._button_text(self.recommendation))
            card.button.setEnabled(True)
            kept = isinstance(error, HubError) and error.resumable and error.partial is not None
            said = sentence(error)  # one sentence, the partial file's fate in it
            card.status.setText(f"{said.rstrip('.')}; what arrived is kept, and the button resumes it."
                                if kept else said)

    # -- switching --

    def _title(self, path: Path) -> str:
        rec = self.recommendation
        return rec.model.title if rec is not None and rec.model is not None else path.name

    def _switch(self, path: Path) -> None:
        """Use ``path``, once no reply is being written (the model control refuses then)."""
        self.switching = path
        self.deferred = self.app_state.generating
        if self.card is not None:
            self.card.button.setEnabled(False)
            self.card.status.setText(
                f"{self._title(path)} is downloaded; Iris switches to it when this reply ends." if self.deferred
                else f"Loading {self._title(path)}; the bundled model answers until it is ready.")
        if not self.deferred:
            self.use_file(str(path))

    def _reply_ended(self, generating: bool) -> None:
        if not generating and self.deferred and self.switching is not None:
            self.deferred = False
            self.use_file(str(self.switching))

    def _model_state(self, state: str) -> None:
        """The first load ended: read this computer; the load this card asked for ended:
        say so (the model control's box says why a load failed)."""
        self._measure()
        path = self.switching
        if path is None or self.deferred or state == "loading":
            return
        error, chosen = self.app_state.model_error, str(self.app_state.settings["model.path"])
        if state == "ready" and error is None and chosen == str(path):
            text = f"Iris now uses {self._title(path)}."
        elif error is not None and chosen != str(path):
            text = f"{self._title(path)} could not be loaded ({error}); Iris goes on with the bundled model."
        else:
            return
        self.switching = None
        if self.card is not None:
            self.card.progress.hide()
            self.card.progress_label.setText("")
            self.show()
            self.card.status.setText(text)
