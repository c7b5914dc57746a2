"""The main window: threads on the left, the transcript and composer in the middle, the
budget meter in the status bar and the context inspector as a dock.

It lays out the widgets and wires them to one controller per job; it owns no logic:

* ``threads_control`` (:mod:`.thread_control`): the thread list, opening, import/export;
* ``turns`` (:mod:`.turn_control`): send, Stop, and each event of a turn on screen;
* ``models`` (:mod:`.model_control`): loading the model, errors, choosing a file;
* ``context`` (:mod:`.context_control`): the planner, and the meter, states and
  inspector drawn from its requests;
* ``menus`` (:mod:`.menus`): the menu bar, preferences, About.

Threads: DB work runs on :class:`~.background.Background`; the model lives on the
model thread (:mod:`.model_thread`). One message follows one path: composer →
``turns.send`` → model thread (agent → planner → store → runtime → store) → typed events
→ ``turns`` → transcript, with the reported request drawn by ``context``.
"""

from __future__ import annotations

import logging
from typing import Any

from PySide6.QtCore import QByteArray, QSettings, Qt
from PySide6.QtWidgets import (
    QLabel,
    QMainWindow,
    QProgressBar,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from iris_desktop.settings import SETTINGS, load_settings
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
    def __init__(self, session: Any, runtime: Any = None, compact: bool = True):
        super().__init__()
        self.session = session
        self.setWindowTitle("Iris Desktop")
        self.setObjectName("iris-main")
        self.ui_state = QSettings(str(session.paths.data_dir / "ui-state.ini"),
                                  QSettings.Format.IniFormat)
        self._cli = {k: SETTINGS[k].to_text(v) for k, v in session.settings.values.items()
                     if session.settings.source(k) == "cli"}
        self.background = Background(session.paths.db_path, self)
        worker = ModelWorker(session.paths, runtime, compact)
        self.model = ModelThread(worker, self)
        self._closed = False

        self._build()
        self.threads_control = ThreadControl(self)
        self.context = ContextControl(self)
        self.models = ModelControl(self)
        self.turns = TurnControl(self)
        self.menus = Menus(self)
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
        w = self.model.worker
        w.loading.connect(self.busy)
        w.loaded.connect(self.models.loaded)
        w.loadFailed.connect(self.models.failed)
        w.threadCreated.connect(self.threads_control.created)
        w.turnEvent.connect(self.turns.on_event)
        w.turnFinished.connect(self.turns.finished)
        w.shellQuestion.connect(self.turns.ask_shell)
        self.composer.sendRequested.connect(self.turns.send)
        self.composer.stopRequested.connect(self.turns.stop)
        self.composer.draftChanged.connect(lambda _: (self.context.refresh_meter(),
                                                      self.context.refresh_inspector()))
        self.composer.edit.textChanged.connect(self.context.draft_edited)
        w.cacheStatus.connect(lambda text: self.turns.generating or self.state_label.setText(text))
        t = self.threads_control
        self.threads.newChat.connect(t.new_chat)
        self.threads.threadChosen.connect(t.open_thread)
        self.threads.searchChanged.connect(t.search)
        self.threads.renameRequested.connect(t.rename_dialog)
        self.threads.deleteRequested.connect(t.delete_dialog)
        self.view.copied.connect(lambda _: self.statusBar().showMessage("Copied", 2000))
        self.inspector.visibilityChanged.connect(
            lambda visible: visible and self.context.refresh_inspector())

    def busy(self, text: str | None, fraction: float | None = None) -> None:
        """Show ``text`` with a bar in the status bar (busy, or ``fraction`` done); None
        hides the bar."""
        self.progress.setVisible(text is not None)
        if text is not None:
            self.state_label.setText(text)
            self.progress.setRange(0, 0 if fraction is None else 100)
            if fraction is not None:
                self.progress.setValue(int(fraction * 100))

    def reload_settings(self):
        self.session.settings = load_settings(self.session.paths.config_path, cli=self._cli)
        return self.session.settings

    # -- what the controllers share (and tests read) -------------------------------------

    @property
    def thread_id(self) -> int | None:
        return self.threads_control.thread_id

    @property
    def generating(self) -> bool:
        return self.turns.generating

    @property
    def model_state(self) -> str:
        return self.models.state

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


def main_window(session: Any, runtime: Any = None, compact: bool = True,
                load: bool = True) -> MainWindow:
    """The main window for ``session``; ``load`` starts loading the model (or ``runtime``,
    a ready runtime such as the tests' ScriptedRuntime) on the model thread; ``compact``
    False: no compaction (a scripted runtime writes no summary)."""
    window = MainWindow(session, runtime, compact)
    if load:
        window.load_model()
    return window
