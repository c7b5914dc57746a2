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

from PySide6.QtCore import QByteArray, QRect, QSettings, QSize, Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QLabel,
    QMainWindow,
    QMessageBox,
    QSplitter,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from iris_desktop.files import private_file
from iris_desktop.host import Host
from iris_desktop.settings import SETTINGS, Settings, load_settings
from iris_desktop.stop import CLOSING
from iris_desktop.ui.accessibility import Announcer, name_controls
from iris_desktop.ui.app_state import AppState
from iris_desktop.ui.background import Background
from iris_desktop.ui.composer import Composer
from iris_desktop.ui.context_control import ContextControl
from iris_desktop.ui.drafts import DraftControl
from iris_desktop.ui.inspector import (  # noqa: F401 (the tests read INSPECTOR_SHARE here)
    INSPECTOR_SHARE,
    InspectorDock,
    InspectorWidth,
)
from iris_desktop.ui.menus import Menus
from iris_desktop.ui.meter import BudgetMeter
from iris_desktop.ui.model_control import ModelControl
from iris_desktop.ui.model_thread import ModelThread, ModelWorker
from iris_desktop.ui.rekey_dialog import KeyChange
from iris_desktop.ui.stall_watch import StallWatch
from iris_desktop.ui.status_line import CacheWords, StatusArea, YieldingLabel
from iris_desktop.ui.theme import Appearance
from iris_desktop.ui.thread_control import ThreadControl
from iris_desktop.ui.threads import ThreadPanel
from iris_desktop.ui.transcript import TranscriptView
from iris_desktop.ui.turn_control import TurnControl
from iris_desktop.ui.welcome import WelcomeControl, WelcomePanel
from iris_desktop.untrusted import copied_note

log = logging.getLogger("iris.ui")

DEFAULT_SIZE = (1280, 800)
#: the largest share of the screen's free area a window opens at
SCREEN_SHARE = 0.9


def default_geometry(available: QRect, preferred: tuple[int, int] = DEFAULT_SIZE) -> QRect:
    """The window's first geometry: ``preferred`` but at most :data:`SCREEN_SHARE` of
    the screen's free area, centred in it. Both are in device-independent pixels, as
    ``QScreen.availableGeometry()`` is: a 1600×1000 screen at 150% has 1066×666 of them."""
    size = QSize(min(preferred[0], int(available.width() * SCREEN_SHARE)),
                 min(preferred[1], int(available.height() * SCREEN_SHARE)))
    rect = QRect(0, 0, size.width(), size.height())
    rect.moveCenter(available.center())
    return rect


def fit_geometry(rect: QRect, available: QRect) -> QRect:
    """``rect`` made to fit inside ``available``: smaller where it is larger, then moved
    in (a window restored on a smaller screen, or at a larger scale, than it was saved)."""
    width, height = min(rect.width(), available.width()), min(rect.height(), available.height())
    left = min(max(rect.left(), available.left()), available.right() + 1 - width)
    top = min(max(rect.top(), available.top()), available.bottom() + 1 - height)
    return QRect(left, top, width, height)


class MainWindow(QMainWindow):
    def __init__(self, host: Host):
        super().__init__()
        self.host = host
        self.setWindowTitle("Iris Desktop")
        self.setObjectName("iris-main")
        private_file(host.paths.data_dir / "ui-state.ini")  # 0600, as everything Iris writes
        self.ui_state = QSettings(str(host.paths.data_dir / "ui-state.ini"),
                                  QSettings.Format.IniFormat)
        cli = {k: SETTINGS[k].to_text(v) for k, v in host.settings.values.items()
               if host.settings.source(k) == "cli"}
        self.app_state = AppState(
            host.settings, lambda: host.follow_history(load_settings(host.paths.config_path, cli=cli)),
            self)
        # first: the host's settings follow before any controller hears of new ones
        self.app_state.settingsChanged.connect(lambda settings: setattr(host, "settings", settings))
        self.appearance = Appearance(self.app_state, self)  # before any widget measures text
        self.background = Background(host.stores, self)
        worker = ModelWorker(host)
        self.model = ModelThread(worker, self)
        self._closed = False

        self._build()
        s, ui_state = self.app_state, self.ui_state
        self.threads_control = ThreadControl(s, self.threads, self.view, self.composer,
                                             self.background, self.model, self, ui_state)
        self.welcome_control = WelcomeControl(s, self.center_stack, self.welcome, self.view,
                                              self.composer, self)
        self.context = ContextControl(s, self.composer, self.meter, self.inspector,
                                      self.background, self.model, self)
        self.models = ModelControl(s, self.model, self.background, host.paths, self.composer,
                                   self.model_label, self.where_label, ui_state, self)
        self.turns = TurnControl(s, self.model, self.view, self.composer, ui_state, self)
        self.drafts = DraftControl(s, self.composer, self.background, ui_state, self)
        self.cache_words = CacheWords(s, self)
        self.menus = Menus(s, self.menuBar(), host.paths, self.view, self.threads.search,
                           self.inspector, self.context.preview, self.context.limit_problems,
                           self)
        self.key_change = KeyChange(self)  # File ▸ Change history passphrase… (run_gui does it)
        self.announcer = Announcer(self.state_label, self)
        self._connect()
        self._accessible()
        self.quit_box: QMessageBox | None = None
        self._quit_confirmed = False
        self._restore_state()

        self.background.run(lambda store: store.mark_interrupted_streams())
        if host.crash_note:  # once: the start that marked the reply says so
            self.app_state.show_message(host.crash_message("window"), 30_000)
        self.threads_control.refresh_threads()
        self.threads_control.reopen_last()
        self.context.refresh()
        self.composer.edit.setFocus()  # a start is for typing (focus was on New chat)

    # -- building ------------------------------------------------------------------------

    def _build(self) -> None:
        self.threads = ThreadPanel()
        self.view = TranscriptView()
        self.composer = Composer()
        self.welcome = WelcomePanel()
        # the welcome panel stands in for the transcript while the window is empty
        self.center_stack = QStackedWidget()
        self.center_stack.addWidget(self.view)
        self.center_stack.addWidget(self.welcome)
        center = QWidget()
        layout = QVBoxLayout(center)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.center_stack, 1)
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
        self.inspector_width = InspectorWidth(self, self.inspector, self.ui_state)

        bar = self.statusBar()
        # the status sentence never runs into the meter: elided at a word, full in its tooltip
        self.status_area = StatusArea()
        self.state_label, self.progress = self.status_area.state, self.status_area.progress
        # plain text: a server names its own model (Qt would draw tags in it)
        # it elides at a word when the status bar is short of room (a model's name was cut
        # mid-word), full in its tooltip
        self.model_label = YieldingLabel("No model")  # and gives way to the sentence first
        #: where the conversation goes: "local", or "server: host:port"
        self.where_label = QLabel("", textFormat=Qt.TextFormat.PlainText)
        self.where_label.setObjectName("where")
        self.meter = BudgetMeter()
        bar.addWidget(self.status_area, 1)
        bar.addPermanentWidget(self.where_label)
        bar.addPermanentWidget(self.model_label)
        self.status_area.give_way(self.model_label)
        bar.addPermanentWidget(self.meter)
        self.composer.set_can_send(False, "Loading the model…")

    def _connect(self) -> None:
        s, w = self.app_state, self.model.worker
        s.statusText.connect(self.state_label.setText)
        s.busyChanged.connect(self._show_busy)
        self.stall_watch = StallWatch(s, self)  # a prompt read that stands still says why
        s.statusMessage.connect(self.status_area.show_message)
        self.composer.ready.connect(lambda text: s.show_message(text, 6000))  # said, once
        # what the user caused ("Exported 40 messages…", "Open a chat to rename it"): said
        s.statusMessage.connect(lambda text, _ms: self.announcer.say(text))
        s.spoken.connect(self.announcer.say)
        s.backgroundMessage.connect(
            lambda text, ms: self.status_area.show_message(text, ms, background=True))
        s.backgroundStarted.connect(self.status_area.start_background)
        s.backgroundWithdrawn.connect(self.status_area.withdraw)
        s.generatingChanged.connect(self.composer.set_generating)
        s.generatingChanged.connect(self.status_area.set_working)
        w.loading.connect(s.busy)
        w.loaded.connect(self.models.loaded)  # and said: the box was disabled while it loaded
        s.modelStateChanged.connect(  # the load the window waited for (not one it replaced)
            lambda state: state == "ready" and not s.model_error  # (kept after a failure: no news)
            and self.announcer.say(f"Model ready: {s.model_info['name']}"))
        w.loadFailed.connect(self.models.failed)
        w.threadCreated.connect(self.threads_control.created)
        w.threadDeleted.connect(self.threads_control.deleted)
        w.turnEvent.connect(self.turns.on_event)
        w.turnFinished.connect(self.turns.finished)
        w.shellQuestion.connect(self.turns.ask_shell)
        w.cacheEvent.connect(self.cache_words.show)  # on this thread, when it comes
        s.generatingChanged.connect(self._turn_ended)
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
        self.threads.settingsRequested.connect(t.settings_dialog)
        self.view.copied.connect(lambda text: s.show_message(copied_note(text), 4000))
        v = self.view  # a message's own actions: another answer, an edit, going on, a branch
        v.regenerateRequested.connect(self.turns.regenerate)
        v.editRequested.connect(self.turns.edit)
        v.continueRequested.connect(self.turns.continue_reply)
        v.switchRequested.connect(t.switch_branch)
        v.stopRequested.connect(self.turns.stop)
        self.inspector.visibilityChanged.connect(
            lambda visible: visible and self.context.refresh_inspector())
        for name, slot in (("new-chat", t.new_chat), ("import", t.import_dialog),
                           ("import-folder", t.import_folder_dialog),
                           ("export", t.export_dialog), ("compact-now", self.turns.compact_now),
                           ("chat-settings", lambda: t.settings_dialog()),
                           ("rename-chat", lambda: t.with_open_chat("rename it", t.rename_dialog)),
                           ("delete-chat", lambda: t.with_open_chat("delete it", t.delete_dialog)),
                           ("quit", self.close), ("models", m.open_library),
                           ("download-model", m.open_download),
                           ("load-model", m.choose_file), ("server", m.open_server),
                           ("reload-model", m.load)):
            self.menus.actions[name].triggered.connect(slot)

    def _accessible(self) -> None:
        """Names for screen readers, and Tab through every control in reading order:
        the chats, the conversation, the message and its buttons, the meter, the
        inspector."""
        self.model.worker.turnEvent.connect(self.announcer.on_event)
        self.welcome.setAccessibleName("Welcome")
        self.inspector.setAccessibleName("Context inspector")
        t, c, i = self.threads, self.composer, self.inspector
        card = self.welcome.recommend  # the welcome stands in for the conversation
        order = [t.new_button, t.search, t.list, self.view, *self.welcome.examples,
                 card.button, card.stop_button, c.edit, c.button, c.attach_button,
                 self.meter, i.tabs, i.request_table, i.summaries, i.events,
                 i.chart_scroll]
        for before, after in zip(order, order[1:]):
            QWidget.setTabOrder(before, after)
        name_controls(self)

    def busy(self, text: str | None, fraction: float | None = None) -> None:
        """Show ``text`` with a bar in the status bar (busy, or ``fraction`` done); None
        hides the bar."""
        self.app_state.busy(text, fraction)

    def _show_busy(self, text: str | None, fraction: float | None) -> None:
        self.status_area.show_busy(text, fraction)

    def _turn_ended(self, generating: bool) -> None:
        """A turn's bar (the prompt being read: "21%") ends with the turn, also when Stop
        ended it before the prompt was read."""
        if not generating and self.app_state.model_state != "loading":
            self.status_area.show_busy(None)

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

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        self.inspector_width.fit()  # (only on a resize: not a filter of every event)

    def preferences(self):
        return self.menus.preferences()

    # -- persistence of the window -------------------------------------------------------

    def _restore_state(self) -> None:
        """The saved geometry, docks and splitter; the geometry made to fit the screen
        it opens on (or, the first time, a size that fits it, centred)."""
        available = self.screen().availableGeometry()
        self.setGeometry(default_geometry(available))
        for key, restore in (("window/geometry", self.restoreGeometry),
                             ("window/state", self.restoreState),
                             ("window/splitter", self.splitter.restoreState)):
            value = self.ui_state.value(key)
            if isinstance(value, QByteArray) and not value.isEmpty():
                restore(value)
            elif key == "window/splitter":  # the first start: the chats get a quarter
                chats = max(180, min(280, self.width() // 4))
                self.splitter.setSizes([chats, max(self.width() - chats, 1)])
        if not self.isMaximized() and not self.isFullScreen():
            screen = QGuiApplication.screenAt(self.geometry().center()) or self.screen()
            available = screen.availableGeometry()  # the screen it was saved on, if present
            fitted = fit_geometry(self.geometry(), available)
            if fitted != self.geometry():
                self.setGeometry(fitted)

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
        self.menus.config_watch.stop()  # no change to the settings file is followed after this
        self.save_state()
        self.drafts.flush()  # text typed in the last pause is kept (it was lost)
        cancel = self.turns.cancel
        if cancel is not None:
            cancel.reason = CLOSING  # a summary under way is left for the next start
            cancel.set()
        if self.turns.shell_box is not None:
            self.turns.shell_box.close()
        self.threads_control.importer.close()
        self.threads_control.forget_at_close()  # a chat made for a refused first message
        # the DB thread's queued jobs first (a batch of recall's embedding, a meter's
        # count): they use the embedder and the tokenizer, which closing the model
        # releases ("the embedding model is closed" in the log at every such close)
        self.background.close()
        self.threads_control.delete_forgotten()
        self.model.close(cancel)

    def closeEvent(self, event) -> None:
        """Closing (Ctrl+Q, the window's close button) while a reply is being generated
        asks first (``quit_box``); otherwise it quits at once."""
        if not self._closed and self.app_state.generating and not self._quit_confirmed:
            event.ignore()
            self.ask_quit()
            return
        self.shutdown()
        super().closeEvent(event)

    def ask_quit(self) -> QMessageBox:
        """"Stop the reply and quit?" (Quit, or Cancel to go on); non-blocking. What the
        reply has written is kept (saved as stopped), and the box says so."""
        if self.quit_box is not None and self.quit_box.isVisible():
            return self.quit_box
        box = QMessageBox(QMessageBox.Icon.Question, "Quit Iris Desktop",
                          "Stop the reply and quit? What it has written so far is kept.",
                          QMessageBox.StandardButton.Cancel, self)
        box.setObjectName("quit-confirm")
        quit_button = box.addButton("Quit", QMessageBox.ButtonRole.AcceptRole)
        box.setDefaultButton(QMessageBox.StandardButton.Cancel)
        box.setEscapeButton(QMessageBox.StandardButton.Cancel)
        box.finished.connect(lambda _: box.clickedButton() is quit_button and self.quit_now())
        self.quit_box = box
        box.open()
        return box

    def quit_now(self) -> None:
        """Quit without asking (a reply being written is saved as stopped)."""
        self._quit_confirmed = True
        self.close()


def main_window(host: Host, load: bool = True) -> MainWindow:
    """The main window on ``host``; ``load`` starts loading the model on the model thread
    (or the host's ready runtime, such as the tests' ScriptedRuntime)."""
    window = MainWindow(host)
    if load:
        window.load_model()
    return window
