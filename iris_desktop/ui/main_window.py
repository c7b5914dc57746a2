"""The main window: threads on the left, the transcript and composer in the middle, the
budget meter in the status bar and the context inspector as a dock.

It lays out the widgets, makes the state the controllers share (:mod:`.app_state`) and
one controller per job, and wires their signals; it owns no logic, and no controller
knows the window or another controller (each listens to the shared state):

* ``threads_control`` (:mod:`.thread_control`): the thread list, opening, import/export;
* ``turns`` (:mod:`.turn_control`): send, Stop, and each event of a turn on screen;
* ``models`` (:mod:`.model_control`): loading the model, errors, choosing a file;
* ``context`` (:mod:`.context_control`): the planner, and the meter, states and
  inspector drawn from its requests;
* ``menus`` (:mod:`.menus`): the menu bar, preferences, About.

Threads: DB work runs on :class:`~.background.Background`; the model lives on the
model thread (:mod:`.model_thread`). One message follows one path: composer →
``turns.send`` → model thread (agent → planner → store → runtime → store) → typed events
→ ``turns`` → transcript, with the reported request drawn by ``context`` (it hears of
it through ``app_state.requestReported``).
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QByteArray, QSettings, Qt
from PySide6.QtWidgets import (
    QLabel,
    QMainWindow,
    QProgressBar,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from iris_desktop.host import Host
from iris_desktop.settings import SETTINGS, Settings, load_settings
from iris_desktop.ui.app_state import AppState
from iris_desktop.ui.background import Background
from iris_desktop.ui.composer import Composer
from iris_desktop.ui.context_control import ContextControl
from iris_desktop.ui.inspector import InspectorDock
from iris_desktop.ui.menus import Menus
from iris_desktop.ui.meter import BudgetMeter
from iris_desktop.ui.model_control import ModelControl
from iris_desktop.ui.model_thread import ModelThread, ModelWorker
from iris_desktop.ui.thread_control import ThreadControl
from iris_desktop.ui.threads import ThreadPanel
from iris_desktop.ui.transcript import TranscriptView
from iris_desktop.ui.turn_control import TurnControl

log = logging.getLogger("iris.ui")

DEFAULT_SIZE = (1280, 800)


class MainWindow(QMainWindow):
    def __init__(self, host: Host):
        super().__init__()
        self.host = host
        self.setWindowTitle("Iris Desktop")
        self.setObjectName("iris-main")
        self.ui_state = QSettings(str(host.paths.data_dir / "ui-state.ini"),
                                  QSettings.Format.IniFormat)
        cli = {k: SETTINGS[k].to_text(v) for k, v in host.settings.values.items()
               if host.settings.source(k) == "cli"}
        self.app_state = AppState(
            host.settings, lambda: load_settings(host.paths.config_path, cli=cli), self)
        # first: the host's settings follow before any controller hears of new ones
        self.app_state.settingsChanged.connect(lambda settings: setattr(host, "settings", settings))
        self.background = Background(host.stores, self)
        worker = ModelWorker(host)
        self.model = ModelThread(worker, self)
        self._closed = False

        self._build()
        s, ui_state = self.app_state, self.ui_state
        self.threads_control = ThreadControl(s, self.threads, self.view, self.composer,
                                             self.background, self.model, self)
        self.context = ContextControl(s, self.composer, self.meter, self.inspector,
                                      self.background, self.model, self)
        self.models = ModelControl(s, self.model, self.background, host.paths, self.composer,
                                   self.model_label, self.where_label, ui_state, self)
        self.turns = TurnControl(s, self.model, self.view, self.composer, ui_state, self)
        self.menus = Menus(s, self.menuBar(), host.paths, self.view, self.threads.search,
                           self.inspector, self.context.preview, self.context.limit_problems,
                           self)
        self._connect()
        self.resize(*DEFAULT_SIZE)
        self._restore_state()

        self.background.run(lambda store: store.mark_interrupted_streams())
        self.threads_control.refresh_threads()
        self.context.refresh()

    # -- building ------------------------------------------------------------------------

    def _build(self) -> None:
        self.threads = ThreadPanel()
        self.view = TranscriptView()
        self.composer = Composer()
        center = QWidget()
        layout = QVBoxLayout(center)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.view, 1)
        layout.addWidget(self.composer)
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.setObjectName("main-splitter")
        self.splitter.addWidget(self.threads)
        self.splitter.addWidget(center)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes([280, 1000])
        self.setCentralWidget(self.splitter)

        self.inspector = InspectorDock(self)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.inspector)
        self.inspector.hide()

        bar = self.statusBar()
        self.state_label = QLabel("Starting…")
        self.progress = QProgressBar()
        self.progress.setRange(0, 0)  # busy until a fraction is known (busy(text, 0.4))
        self.progress.setMaximumWidth(self.fontMetrics().horizontalAdvance("0") * 14)
        self.progress.setMaximumHeight(self.fontMetrics().height())
        self.progress.hide()
        self.model_label = QLabel("No model")
        #: where the conversation goes: "local", or "server: host:port"
        self.where_label = QLabel("")
        self.where_label.setObjectName("where")
        self.meter = BudgetMeter()
        bar.addWidget(self.state_label)
        bar.addWidget(self.progress)
        bar.addPermanentWidget(self.where_label)
        bar.addPermanentWidget(self.model_label)
        bar.addPermanentWidget(self.meter)
        self.composer.set_can_send(False, "Loading the model…")

    def _connect(self) -> None:
        s, w = self.app_state, self.model.worker
        s.statusText.connect(self.state_label.setText)
        s.busyChanged.connect(self._show_busy)
        s.statusMessage.connect(self.statusBar().showMessage)
        s.generatingChanged.connect(self.composer.set_generating)
        w.loading.connect(s.busy)
        w.loaded.connect(self.models.loaded)
        w.loadFailed.connect(self.models.failed)
        w.threadCreated.connect(self.threads_control.created)
        w.threadDeleted.connect(self.threads_control.deleted)
        w.turnEvent.connect(self.turns.on_event)
        w.turnFinished.connect(self.turns.finished)
        w.shellQuestion.connect(self.turns.ask_shell)
        w.cacheStatus.connect(lambda text: s.generating or s.show_status(text))
        self.composer.sendRequested.connect(self.turns.send)
        self.composer.stopRequested.connect(self.turns.stop)
        self.composer.draftChanged.connect(lambda _: (self.context.refresh_meter(),
                                                      self.context.refresh_inspector()))
        self.composer.edit.textChanged.connect(self.context.draft_edited)
        t, m = self.threads_control, self.models
        self.threads.newChat.connect(t.new_chat)
        self.threads.threadChosen.connect(t.open_thread)
        self.threads.searchChanged.connect(t.search)
        self.threads.renameRequested.connect(t.rename_dialog)
        self.threads.deleteRequested.connect(t.delete_dialog)
        self.view.copied.connect(lambda _: s.show_message("Copied", 2000))
        self.inspector.visibilityChanged.connect(
            lambda visible: visible and self.context.refresh_inspector())
        for name, slot in (("new-chat", t.new_chat), ("import", t.import_dialog),
                           ("export", t.export_dialog), ("compact-now", self.turns.compact_now),
                           ("quit", self.close), ("models", m.open_library),
                           ("load-model", m.choose_file), ("server", m.open_server),
                           ("reload-model", m.load)):
            self.menus.actions[name].triggered.connect(slot)

    def busy(self, text: str | None, fraction: float | None = None) -> None:
        """Show ``text`` with a bar in the status bar (busy, or ``fraction`` done); None
        hides the bar."""
        self.app_state.busy(text, fraction)

    def _show_busy(self, text: str | None, fraction: float | None) -> None:
        self.progress.setVisible(text is not None)
        if text is not None:
            self.state_label.setText(text)
            self.progress.setRange(0, 0 if fraction is None else 100)
            if fraction is not None:
                self.progress.setValue(int(fraction * 100))

    def reload_settings(self) -> Settings:
        return self.app_state.reload_settings()

    # -- what the controllers share (and tests read) -------------------------------------

    @property
    def thread_id(self) -> int | None:
        return self.app_state.thread_id

    @property
    def generating(self) -> bool:
        return self.app_state.generating

    @property
    def model_state(self) -> str:
        return self.app_state.model_state

    def send(self, text: str) -> None:
        self.turns.send(text)

    def open_thread(self, thread_id: int, message_id: int | None = None) -> None:
        self.threads_control.open_thread(thread_id, message_id)

    def load_model(self) -> None:
        self.models.load()

    def preferences(self):
        return self.menus.preferences()

    # -- persistence of the window -------------------------------------------------------

    def _restore_state(self) -> None:
        for key, restore in (("window/geometry", self.restoreGeometry),
                             ("window/state", self.restoreState),
                             ("window/splitter", self.splitter.restoreState)):
            value = self.ui_state.value(key)
            if isinstance(value, QByteArray) and not value.isEmpty():
                restore(value)

    def save_state(self) -> None:
        self.ui_state.setValue("window/geometry", self.saveGeometry())
        self.ui_state.setValue("window/state", self.saveState())
        self.ui_state.setValue("window/splitter", self.splitter.saveState())
        self.ui_state.sync()

    # -- closing -------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop generating, close the model (on its thread) and the workers. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.save_state()
        cancel = self.turns.cancel
        if cancel is not None:
            cancel.set()
        if self.turns.shell_box is not None:
            self.turns.shell_box.close()
        self.model.close(cancel)
        self.background.close()

    def closeEvent(self, event) -> None:
        self.shutdown()
        super().closeEvent(event)


def main_window(host: Host, load: bool = True) -> MainWindow:
    """The main window on ``host``; ``load`` starts loading the model on the model thread
    (or the host's ready runtime, such as the tests' ScriptedRuntime)."""
    window = MainWindow(host)
    if load:
        window.load_model()
    return window
