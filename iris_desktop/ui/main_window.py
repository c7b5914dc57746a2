"""The main window: threads on the left, the transcript and composer in the middle, the
budget meter in the status bar and the context inspector as a dock.

It owns no logic of its own: DB work goes to :class:`Background`, the model and the
agent live on :class:`ModelThread`, and everything shown comes from ``core.views``.
One message follows one path: composer → ModelWorker (agent → store → engine → runtime
→ store) → AgentEvent signals → transcript.
"""

from __future__ import annotations

import html
import json
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import QByteArray, QSettings, Qt, QTimer, QUrl
from PySide6.QtGui import QAction, QDesktopServices, QGuiApplication, QKeySequence
from PySide6.QtWidgets import (
    QFileDialog,
    QInputDialog,
    QLabel,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from iris_desktop import __version__
from iris_desktop.core.engine import ConversationTooLargeException
from iris_desktop.core.views import (
    Entry,
    budget_preview,
    call_label,
    engine_for,
    inspector_report,
    load_transcript,
    message_states,
    pretty_arguments,
    tools_text_for,
)
from iris_desktop.settings import SETTINGS, load_settings, write_config_value
from iris_desktop.ui.composer import Composer
from iris_desktop.ui.inspector import InspectorDock
from iris_desktop.ui.meter import BudgetMeter
from iris_desktop.ui.settings_dialog import SettingsDialog
from iris_desktop.ui.threads import ThreadPanel
from iris_desktop.ui.transcript import TranscriptView
from iris_desktop.ui.workers import Background, ModelThread, SendJob, ShellQuestion

log = logging.getLogger("iris.ui")

DEFAULT_SIZE = (1280, 800)
STREAM_FLUSH_MS = 33  # streamed tokens are painted at most ~30 times a second


class MainWindow(QMainWindow):
    def __init__(self, session: Any, runtime: Any = None, compactor_factory: Any = None):
        super().__init__()
        self.session = session
        self.setWindowTitle("Iris Desktop")
        self.setObjectName("iris-main")
        self.ui_state = QSettings(str(session.paths.data_dir / "ui-state.ini"),
                                  QSettings.Format.IniFormat)
        self._cli = {k: SETTINGS[k].to_text(v) for k, v in session.settings.values.items()
                     if session.settings.source(k) == "cli"}
        self.background = Background(session, self)
        self.model = ModelThread(session, runtime, compactor_factory, self)
        self.thread_id: int | None = None
        self.cancel: threading.Event | None = None
        self.generating = False
        self.model_state = "none"  # loading | ready | failed
        self.model_info: dict[str, Any] | None = None
        self.states: dict[int, str] = {}
        self.shell_box: QMessageBox | None = None
        self.model_box: QMessageBox | None = None
        self._stream_key: str | None = None  # the reply being streamed ("m:<id>")
        self._pending = ""
        self._stream_tokens = 0
        self._stream_t0: float | None = None
        self._compacting = False
        self._last_rate: float | None = None
        self._closed = False

        self._build()
        self._menus()
        self._connect()
        self.resize(*DEFAULT_SIZE)
        self._restore_state()

        self.background.run(lambda ctx: ctx.store.mark_interrupted_streams())
        self.refresh_threads()
        self.refresh_meter()

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
        self.progress.setRange(0, 0)  # busy: llama.cpp reports no load progress
        self.progress.setMaximumWidth(self.fontMetrics().horizontalAdvance("0") * 14)
        self.progress.setMaximumHeight(self.fontMetrics().height())
        self.progress.hide()
        self.model_label = QLabel("No model")
        self.meter = BudgetMeter()
        bar.addWidget(self.state_label)
        bar.addWidget(self.progress)
        bar.addPermanentWidget(self.model_label)
        bar.addPermanentWidget(self.meter)
        self.composer.set_can_send(False, "Loading the model…")

    def _action(self, menu, text: str, slot, shortcut=None, name: str | None = None) -> QAction:
        action = QAction(text, self)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
        action.triggered.connect(slot)
        if name:
            action.setObjectName(name)
        menu.addAction(action)
        return action

    def _menus(self) -> None:
        bar = self.menuBar()
        m = bar.addMenu("&File")
        self._action(m, "&New chat", self.new_chat, "Ctrl+N", "new-chat")
        self._action(m, "&Import conversation…", self.import_dialog, None, "import")
        self._action(m, "&Export chat…", self.export_dialog, None, "export")
        m.addSeparator()
        self._action(m, "&Quit", self.close, "Ctrl+Q", "quit")
        m = bar.addMenu("&Edit")
        self._action(m, "&Copy", self.copy, QKeySequence.StandardKey.Copy, "copy")
        self._action(m, "&Find…", self.focus_search, "Ctrl+F", "find")
        m.addSeparator()
        pref = self._action(m, "&Preferences…", self.preferences, "Ctrl+,", "preferences")
        pref.setMenuRole(QAction.MenuRole.PreferencesRole)
        m = bar.addMenu("&View")
        toggle = self.inspector.toggleViewAction()
        toggle.setText("Context &inspector")
        toggle.setShortcut(QKeySequence("Ctrl+I"))
        m.addAction(toggle)
        m = bar.addMenu("&Model")
        self._action(m, "&Load model…", self.choose_model_file, None, "load-model")
        self._action(m, "&Reload", self.load_model, None, "reload-model")
        m = bar.addMenu("&Help")
        self._action(m, "&About Iris Desktop", self.about, None, "about")
        self._action(m, "Open &data folder", lambda: self._open(self.session.paths.data_dir))
        self._action(m, "Open &log", lambda: self._open(self.session.paths.log_path))

    def _connect(self) -> None:
        w = self.model.worker
        w.loading.connect(self._on_loading)
        w.loaded.connect(self._on_loaded)
        w.loadFailed.connect(self._on_load_failed)
        w.threadCreated.connect(self._on_thread_created)
        w.agentEvent.connect(self._on_event)
        w.turnFinished.connect(self._on_turn_finished)
        w.shellQuestion.connect(self.ask_shell)
        self.composer.sendRequested.connect(self.send)
        self.composer.stopRequested.connect(self.stop)
        self.composer.draftChanged.connect(lambda _: (self.refresh_meter(), self.refresh_inspector()))
        self.threads.newChat.connect(self.new_chat)
        self.threads.threadChosen.connect(self.open_thread)
        self.threads.searchChanged.connect(self.search)
        self.threads.renameRequested.connect(self.rename_dialog)
        self.threads.deleteRequested.connect(self.delete_dialog)
        self.view.copied.connect(lambda _: self.statusBar().showMessage("Copied", 2000))
        self.inspector.visibilityChanged.connect(
            lambda visible: visible and self.refresh_inspector())
        self._flush_timer = QTimer(self, singleShot=True, interval=STREAM_FLUSH_MS)
        self._flush_timer.timeout.connect(self._flush_tokens)

    # -- persistence of the window -------------------------------------------------------

    def _restore_state(self) -> None:
        geometry = self.ui_state.value("window/geometry")
        if isinstance(geometry, QByteArray) and not geometry.isEmpty():
            self.restoreGeometry(geometry)
        state = self.ui_state.value("window/state")
        if isinstance(state, QByteArray) and not state.isEmpty():
            self.restoreState(state)
        splitter = self.ui_state.value("window/splitter")
        if isinstance(splitter, QByteArray) and not splitter.isEmpty():
            self.splitter.restoreState(splitter)

    def save_state(self) -> None:
        self.ui_state.setValue("window/geometry", self.saveGeometry())
        self.ui_state.setValue("window/state", self.saveState())
        self.ui_state.setValue("window/splitter", self.splitter.saveState())
        self.ui_state.sync()

    # -- the model -----------------------------------------------------------------------

    def load_model(self) -> None:
        """(Re)load the configured model on the model thread; the UI stays usable."""
        if self.generating:
            self.statusBar().showMessage("Stop the reply before reloading the model", 4000)
            return
        self.model_state = "loading"
        self.composer.set_can_send(False, "Loading the model…")
        self._busy("Loading the model…")
        self.model.load(self.session.settings)

    def _busy(self, text: str | None) -> None:
        self.progress.setVisible(text is not None)
        if text is not None:
            self.state_label.setText(text)

    def _on_loading(self, text: str) -> None:
        self._busy(text)

    def _on_loaded(self, info: dict[str, Any]) -> None:
        self.model_state = "ready"
        self.model_info = info
        self.model_label.setText(f"{info['name']} · n_ctx {info['n_ctx']:,}")
        self.model_label.setToolTip(info.get("path") or info["name"])
        self._busy(None)
        took = info.get("load_time_s")
        self.state_label.setText("Ready" + (f" (model loaded in {took:.1f} s)" if took else ""))
        self.composer.set_can_send(True)
        self.refresh_meter()
        self.refresh_states()

    def _on_load_failed(self, message: str) -> None:
        self.model_state = "failed"
        self.model_info = None
        self.model_label.setText("No model")
        self.model_label.setToolTip(message)
        self._busy(None)
        self.state_label.setText("No model: browsing only")
        self.composer.set_can_send(False, "No model is loaded — Model ▸ Load model…")
        self.show_model_error(message)

    def show_model_error(self, message: str) -> None:
        box = QMessageBox(QMessageBox.Icon.Warning, "The model could not be loaded",
                          "Iris could not load its model, so it cannot answer right now. "
                          "Your conversations are still here to browse, search and export.",
                          parent=self)
        box.setObjectName("model-error")
        box.setInformativeText(message)
        choose = box.addButton("Choose model file…", QMessageBox.ButtonRole.AcceptRole)
        box.addButton("Continue without a model", QMessageBox.ButtonRole.RejectRole)
        box.finished.connect(lambda _: box.clickedButton() is choose and self.choose_model_file())
        self.model_box = box
        box.open()

    def choose_model_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose a GGUF model", str(Path.home()),
                                              "GGUF models (*.gguf);;All files (*)")
        if path:
            self.use_model_file(path)

    def use_model_file(self, path: str) -> None:
        """Save ``model.path`` and load it (for this run too when a variable pins it)."""
        config = self.session.paths.config_path
        write_config_value(config, "model.path", path)
        settings = self.reload_settings()
        if settings["model.path"] != path:
            self.session.settings = settings.with_overrides({"model.path": path})
        self.load_model()

    def reload_settings(self):
        self.session.settings = load_settings(self.session.paths.config_path, cli=self._cli)
        return self.session.settings

    # -- threads -------------------------------------------------------------------------

    def refresh_threads(self) -> None:
        self.background.run(lambda ctx: ctx.store.threads(), self.threads.show_threads,
                            key="threads")

    def search(self, query: str) -> None:
        if not query:
            self.refresh_threads()
            return
        self.background.run(lambda ctx: ctx.store.search(query),
                            lambda rows: self.threads.show_results(query, rows), key="search")

    def focus_search(self) -> None:
        self.threads.search.setFocus()
        self.threads.search.selectAll()

    def new_chat(self) -> None:
        self.thread_id = None
        self.states = {}
        self.threads.select(None)
        self.view.transcript.clear()
        self.composer.edit.setFocus()
        self.refresh_meter()
        self.refresh_inspector()

    def open_thread(self, thread_id: int, message_id: int | None = None) -> None:
        if thread_id != self.thread_id:
            self.states = {}
            self.view.transcript.clear()
        self.thread_id = thread_id
        self.threads.select(thread_id)
        self.reload_transcript(message_id)
        self.refresh_states()
        self.refresh_meter()
        self.refresh_inspector()

    def reload_transcript(self, message_id: int | None = None) -> None:
        tid = self.thread_id
        if tid is None:
            return

        def show(entries: list[Entry]) -> None:
            if tid != self.thread_id:
                return
            for entry in entries:
                if entry.message_id in self.states:
                    entry.state = self.states[entry.message_id]
            self.view.transcript.set_entries(entries)
            if message_id is not None:
                self.view.scroll_to_key(f"m:{message_id}")
            else:
                self.view.follow_bottom()

        self.background.run(lambda ctx: load_transcript(ctx.store, tid), show, key="transcript")

    def rename_dialog(self, thread_id: int, title: str) -> None:
        text, ok = QInputDialog.getText(self, "Rename chat", "Title:", text=title)
        if ok and text.strip():
            self.rename_thread(thread_id, text.strip())

    def rename_thread(self, thread_id: int, title: str) -> None:
        self.background.run(lambda ctx: ctx.store.rename_thread(thread_id, title),
                            lambda _: self.refresh_threads())

    def delete_dialog(self, thread_id: int, title: str) -> None:
        answer = QMessageBox.question(
            self, "Delete chat", f"Delete “{title}” and all its messages? This cannot be undone.",
            QMessageBox.StandardButton.Delete | QMessageBox.StandardButton.Cancel,
            QMessageBox.StandardButton.Cancel)
        if answer == QMessageBox.StandardButton.Delete:
            self.delete_thread(thread_id)

    def delete_thread(self, thread_id: int) -> None:
        if thread_id == self.thread_id:
            if self.generating:
                self.statusBar().showMessage("Stop the reply before deleting this chat", 4000)
                return
            self.new_chat()
        self.background.run(lambda ctx: ctx.store.delete_thread(thread_id),
                            lambda _: self.refresh_threads())

    # -- context: states, meter, inspector -----------------------------------------------

    def _n_ctx(self, settings=None) -> int | None:
        """The loaded model's n_ctx, unless ``settings`` would load it with another."""
        if self.model_info is None:
            return None
        if settings is not None and settings["model.n_ctx"] != self.session.settings["model.n_ctx"]:
            return None
        return self.model_info["n_ctx"]

    def refresh_states(self) -> None:
        tid, settings, n_ctx = self.thread_id, self.session.settings, self._n_ctx()
        if tid is None:
            return

        def job(ctx):
            engine = engine_for(ctx.store, ctx.counter(settings), settings, n_ctx)
            try:
                request = engine.build(tid, tools_text=tools_text_for(settings))
            except ConversationTooLargeException:
                return {}
            return message_states(engine, request)

        def show(states: dict[int, str]) -> None:
            if tid == self.thread_id:
                self.states = states
                self.view.transcript.apply_states(states)

        self.background.run(job, show, key="states")

    def refresh_meter(self) -> None:
        tid, settings, n_ctx = self.thread_id, self.session.settings, self._n_ctx()
        draft = self.composer.text() or None

        def job(ctx):
            engine = engine_for(ctx.store, ctx.counter(settings), settings, n_ctx)
            try:
                return engine.build(-1 if tid is None else tid,
                                    tools_text=tools_text_for(settings), draft=draft).breakdown
            except ConversationTooLargeException as exc:
                return exc

        def show(result) -> None:
            if isinstance(result, ConversationTooLargeException):
                self.meter.set_breakdown(None)
                self.meter.setToolTip(f"Conversation too large: {result}")
                self.composer.set_draft_tokens(None)
                return
            self.meter.set_breakdown(result)
            self.composer.set_draft_tokens(result.draft)

        self.background.run(job, show, key="meter")

    def refresh_inspector(self) -> None:
        if not self.inspector.isVisible():
            return
        tid, settings, n_ctx = self.thread_id, self.session.settings, self._n_ctx()
        if tid is None:
            self.inspector.show_report(None)
            return
        draft = self.composer.text() or None  # the next request includes what is typed

        def job(ctx):
            engine = engine_for(ctx.store, ctx.counter(settings), settings, n_ctx)
            return inspector_report(ctx.store, engine, tid, tools_text_for(settings), draft)

        self.background.run(job, lambda r: tid == self.thread_id and self.inspector.show_report(r),
                            key="inspector")

    def preview_settings(self, candidate, callback) -> None:
        """For the settings dialog: the live breakdown of ``candidate`` (off the GUI thread)."""
        tid, n_ctx = self.thread_id, self._n_ctx(candidate)
        draft = self.composer.text() or None
        self.background.run(
            lambda ctx: budget_preview(ctx.store, ctx.counter(candidate), candidate, tid, n_ctx,
                                       draft),
            callback, key="preview")

    # -- sending -------------------------------------------------------------------------

    def send(self, text: str) -> None:
        if self.generating or self.model_state != "ready" or not text.strip():
            return
        self.composer.clear()
        self.cancel = threading.Event()
        self.set_generating(True)
        self.state_label.setText("Thinking…")
        self.view.follow_bottom()
        self.model.send(SendJob(self.thread_id, text, self.session.settings, self.cancel))

    def stop(self) -> None:
        if self.generating and self.cancel is not None:
            self.cancel.set()
            self.state_label.setText("Stopping…")

    def set_generating(self, generating: bool) -> None:
        self.generating = generating
        self.composer.set_generating(generating)

    def _on_thread_created(self, thread_id: int) -> None:
        self.thread_id = thread_id
        self.threads.current_id = thread_id
        self.refresh_threads()

    def _on_event(self, event) -> None:
        kind = event.kind
        if kind == "done":
            self._flush_tokens()
            self._stream_key = None
            self.set_generating(False)
            reason = event.data.get("finish_reason")
            if not self._compacting:
                self.state_label.setText({"cancelled": "Stopped", "error": "Failed"}.get(
                    reason, self._rate_text() or "Ready"))
            self._after_turn()
            return
        if kind == "compaction":
            self._on_compaction(event)
            return
        if event.thread_id != self.thread_id:
            return  # the user opened another thread meanwhile; it is in the store
        transcript = self.view.transcript
        if kind == "user":
            transcript.append(Entry("message", f"m:{event.message_id}", event.message_id, "user",
                                    text=event.text))
            self.view.follow_bottom()
            self.refresh_threads()  # the agent titled a new thread after this message
        elif kind == "request":
            self.meter.set_breakdown(event.data.get("breakdown"))
            self.state_label.setText("Reading the conversation…")
        elif kind == "assistant_start":
            self._stream_key = f"m:{event.message_id}"
            transcript.append(Entry("message", self._stream_key, event.message_id, "assistant",
                                    status="streaming"))
            self._stream_tokens, self._stream_t0 = 0, None
            self.view.follow_bottom()
        elif kind == "token":
            if self._stream_t0 is None:
                self._stream_t0 = time.monotonic()
            self._stream_tokens += 1
            self._pending += event.text
            if not self._flush_timer.isActive():
                self._flush_timer.start()
        elif kind == "assistant":
            self._flush_tokens()
            row = transcript.row_of(f"m:{event.message_id}")
            if row is not None:
                calls = ["{}({})".format(*call_label(c)) for c in event.data.get("tool_calls") or []]
                transcript.update(row, text=event.text, status=event.data.get("status", "complete"),
                                  calls=calls)
            self._stream_key = None
            stats = event.data.get("stats") or {}
            if stats.get("tokens_per_s"):
                self._last_rate = stats["tokens_per_s"]
        elif kind == "tool":
            transcript.append(Entry(
                "tool", f"m:{event.message_id}", event.message_id, "tool", text=event.text,
                tool_name=event.data.get("name") or "tool",
                arguments=pretty_arguments(event.data.get("arguments") or {}),
                error=not event.data.get("ok", True)))
            self.view.follow_bottom()
        elif kind == "error":
            self._flush_tokens()
            if event.message_id is not None:
                row = transcript.row_of(f"m:{event.message_id}")
                if row is not None:
                    transcript.update(row, status="error")
            transcript.add_notice(event.text)
            self.view.follow_bottom()
        if kind in ("user", "assistant_start", "assistant", "tool", "error"):
            self.view.content_changed()

    def _flush_tokens(self) -> None:
        """Paint the tokens that arrived since the last flush (at most ~30 times a second)."""
        if self._pending and self._stream_key is not None:
            # by key, not row: the user may have opened another thread meanwhile
            row = self.view.transcript.row_of(self._stream_key)
            if row is not None:
                self.view.transcript.append_text(row, self._pending)
                self.view.content_changed(row)
        self._pending = ""
        if self.generating and self._stream_t0 is not None:
            self.state_label.setText(self._rate_text(live=True))

    def _rate_text(self, live: bool = False) -> str:
        if live:
            elapsed = time.monotonic() - (self._stream_t0 or time.monotonic())
            rate = (self._stream_tokens - 1) / elapsed if elapsed > 0 and self._stream_tokens > 1 else 0
            return f"Generating… {rate:.1f} tok/s" if rate else "Generating…"
        rate = self._last_rate
        return f"Ready · last reply {rate:.1f} tok/s" if rate else ""

    def _on_compaction(self, event) -> None:
        state = event.data.get("state")
        if state == "started":
            self._compacting = True
            self._busy(f"Compacting the conversation ({event.data.get('trigger')})…")
        else:
            self._compacting = False
            self._busy(None)
            self.state_label.setText(event.text or "Compaction finished")
            if event.thread_id == self.thread_id:
                self._after_turn()

    def _on_turn_finished(self, thread_id: int) -> None:
        if self.shell_box is not None:
            self.shell_box.close()
        if self._compacting:
            self._compacting = False
            self._busy(None)

    def _after_turn(self) -> None:
        self.refresh_threads()
        self.reload_transcript()
        self.refresh_states()
        self.refresh_meter()
        self.refresh_inspector()

    # -- shell confirmation --------------------------------------------------------------

    def ask_shell(self, question: ShellQuestion) -> None:
        """Show the exact command; the model thread waits for the answer."""
        box = QMessageBox(QMessageBox.Icon.Question, "Run a shell command?",
                          "Iris wants to run this command on your computer:", parent=self)
        box.setObjectName("shell-confirm")
        box.setInformativeText(f"<pre>{html.escape(question.command)}</pre>"
                               "It runs only if you choose Run.")
        run = box.addButton("Run", QMessageBox.ButtonRole.AcceptRole)
        deny = box.addButton("Don't run", QMessageBox.ButtonRole.RejectRole)
        box.setDefaultButton(deny)
        box.setEscapeButton(deny)
        box.finished.connect(lambda _: question.reply(box.clickedButton() is run))
        self.shell_box = box
        box.open()

    # -- menus ---------------------------------------------------------------------------

    def copy(self) -> None:
        focus = QGuiApplication.focusObject()
        if focus is not None and focus is not self.view and hasattr(focus, "copy"):
            focus.copy()
            return
        entry = self.view.current_entry()
        if entry is not None:
            self.view.delegate.copy(entry)

    def preferences(self) -> SettingsDialog:
        dialog = SettingsDialog(self.session.settings, self.preview_settings, self)
        dialog.applied.connect(self._settings_applied)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.settings_dialog = dialog
        dialog.open()
        return dialog

    def _settings_applied(self, keys: list[str]) -> None:
        self.reload_settings()
        reload = [k for k in keys if SETTINGS[k].needs_reload]
        self.refresh_meter()
        self.refresh_states()
        self.refresh_inspector()
        if reload and self.model_state != "none":
            box = QMessageBox(QMessageBox.Icon.Question, "Reload the model?",
                              "These changes need the model to be reloaded: "
                              + ", ".join(reload) + ".\nReload it now, in the background?",
                              QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
                              self)
            box.setObjectName("reload-confirm")
            box.finished.connect(
                lambda result: result == QMessageBox.StandardButton.Yes and self.load_model())
            self.reload_box = box
            box.open()

    def export_dialog(self) -> None:
        if self.thread_id is None:
            self.statusBar().showMessage("Open a chat to export it", 4000)
            return
        path, chosen = QFileDialog.getSaveFileName(
            self, "Export chat", str(Path.home() / "chat.md"),
            "Markdown (*.md);;JSON (*.json)")
        if path:
            self.export_thread(self.thread_id, path, "json" if "json" in chosen.lower()
                               or path.endswith(".json") else "md")

    def export_thread(self, thread_id: int, path: str, fmt: str) -> None:
        def job(ctx):
            from iris_desktop.core.conversation import to_markdown
            from iris_desktop.core.store import row_to_message

            thread = ctx.store.thread(thread_id)
            messages = [row_to_message(r) for r in ctx.store.messages(thread_id)]
            text = (json.dumps(messages, ensure_ascii=False, indent=2) + "\n" if fmt == "json"
                    else to_markdown(thread["title"], messages))
            Path(path).write_text(text, encoding="utf-8")
            return len(messages)

        self.background.run(
            job, lambda n: self.statusBar().showMessage(f"Exported {n:,} messages to {path}", 6000),
            lambda exc: QMessageBox.warning(self, "Export failed", str(exc)))

    def import_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import a conversation", str(Path.home()),
                                              "Conversations (*.json *.jsonl);;All files (*)")
        if path:
            self.import_file(path)

    def import_file(self, path: str) -> None:
        def job(ctx):
            from iris_desktop.core.conversation import load_conversation, title_from

            messages, title = load_conversation(path)
            with ctx.store.transaction():
                thread_id = ctx.store.create_thread(title or title_from(messages))
                ctx.store.add_messages(thread_id, messages)
            return thread_id

        def done(thread_id: int) -> None:
            self.refresh_threads()
            self.open_thread(thread_id)

        self.background.run(job, done, lambda exc: QMessageBox.warning(
            self, "Import refused", f"Nothing was imported.\n\n{exc}"))

    def about_text(self) -> str:
        try:
            import llama_cpp

            llama = llama_cpp.__version__
        except Exception as exc:  # the GUI still starts without llama.cpp
            llama = f"not available ({exc})"
        import PySide6
        from PySide6.QtCore import qVersion

        info = self.model_info
        model = (f"{info['name']} ({info['file']}, {info.get('file_type') or '?'}, n_ctx "
                 f"{info['n_ctx']:,}, chat format {info.get('chat_format') or '?'})"
                 if info else f"none ({self.session.model_error or 'not loaded'})")
        return (f"<h3>Iris Desktop {__version__}</h3>"
                "<p>Offline, private chat with a local model and an honest context engine.</p>"
                f"<p>Iris {__version__}<br>llama.cpp (llama-cpp-python) {llama}<br>"
                f"Qt {qVersion()} (PySide6 {PySide6.__version__})<br>"
                f"Python {sys.version.split()[0]}<br>Model: {html.escape(model)}</p>"
                f"<p>Data: {html.escape(str(self.session.paths.data_dir))}</p>")

    def about(self) -> None:
        box = QMessageBox(QMessageBox.Icon.Information, "About Iris Desktop", self.about_text(),
                          parent=self)
        box.setObjectName("about")
        box.open()

    def _open(self, path: Path) -> None:
        QDesktopServices.openUrl(QUrl.fromLocalFile(str(path)))

    # -- closing -------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop generating, close the model (model.close()) and the workers. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.save_state()
        if self.cancel is not None:
            self.cancel.set()
        if self.shell_box is not None:
            self.shell_box.close()
        self.model.close(self.cancel)
        self.background.close()

    def closeEvent(self, event) -> None:
        self.shutdown()
        super().closeEvent(event)


def main_window(session: Any, runtime: Any = None, compactor_factory: Any = None,
                load: bool = True) -> MainWindow:
    """The main window for ``session``; ``load`` starts loading the model (or ``runtime``,
    a ready runtime such as the tests' ScriptedRuntime) on the model thread."""
    window = MainWindow(session, runtime, compactor_factory)
    if load:
        window.load_model()
    return window
