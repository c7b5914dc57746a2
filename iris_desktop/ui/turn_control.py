"""One turn on screen: send and Stop, and each event the model thread reports drawn into
the transcript and the status bar. The events are dispatched by ``core.events.dispatch``,
the same dispatcher the CLI uses; this is the GUI's listener."""

from __future__ import annotations

import html
import threading
import time
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QMessageBox

from iris_desktop.core.events import (
    CompactionFinished,
    CompactionStarted,
    ReplySaved,
    ReplyStarted,
    ReplyToken,
    RequestSent,
    ToolFinished,
    TurnDone,
    TurnEvent,
    TurnFailed,
    TurnListener,
    UserSaved,
    dispatch,
)
from iris_desktop.core.views import Entry, call_label, pretty_arguments
from iris_desktop.ui.model_thread import SendJob, ShellQuestion

if TYPE_CHECKING:
    from iris_desktop.ui.main_window import MainWindow

STREAM_FLUSH_MS = 33  # streamed tokens are painted at most ~30 times a second


class TurnControl(QObject, TurnListener):
    """Sends the composer's text to the model thread and shows the turn as it happens."""

    def __init__(self, window: MainWindow):
        QObject.__init__(self, window)
        self.window = window
        self.generating = False
        self.cancel: threading.Event | None = None
        self.shell_box: QMessageBox | None = None
        self.compacting = False
        self._compacted = ""  # what the last compaction of this turn did, for the status bar
        self._stream_key: str | None = None  # the reply being streamed ("m:<id>")
        self._pending = ""
        self._stream_tokens = 0
        self._stream_t0: float | None = None
        self._last_rate: float | None = None
        self._flush_timer = QTimer(self, singleShot=True, interval=STREAM_FLUSH_MS)
        self._flush_timer.timeout.connect(self._flush_tokens)

    @property
    def transcript(self):
        return self.window.view.transcript

    # -- send, stop --

    def send(self, text: str) -> None:
        w = self.window
        if self.generating or w.models.state != "ready" or not text.strip():
            return
        if not w.models.may_send():
            return  # the user declined to send to that server: the draft stays
        w.composer.clear(quiet=True)  # the request the agent reports redraws the meter
        self.cancel = threading.Event()
        self.set_generating(True)
        w.state_label.setText("Thinking…")
        w.view.follow_bottom()
        w.model.send(SendJob(w.thread_id, text, w.context.planner, self.cancel))

    def compact_now(self) -> None:
        """Compact the open thread now, on the model thread (the model may write the
        summary); Stop ends a model-written summary early."""
        w = self.window
        if w.thread_id is None:
            w.statusBar().showMessage("Open a chat to compact it", 4000)
            return
        if self.generating or w.models.state != "ready":
            w.statusBar().showMessage("Wait for the reply (or the model) before compacting", 4000)
            return
        if not w.models.may_send():  # a summary the server writes carries the chat too
            return
        self.cancel = threading.Event()
        self.set_generating(True)
        w.model.compact(SendJob(w.thread_id, "", w.context.planner, self.cancel))

    def stop(self) -> None:
        if self.generating and self.cancel is not None:
            self.cancel.set()
            self.window.state_label.setText("Stopping…")

    def set_generating(self, generating: bool) -> None:
        self.generating = generating
        self.window.composer.set_generating(generating)

    # -- events from the model thread --

    def on_event(self, event: TurnEvent) -> None:
        if not isinstance(event, (TurnDone, CompactionStarted, CompactionFinished)) and (
                event.thread_id != self.window.thread_id):
            return  # the user opened another thread meanwhile; it is in the store
        dispatch(event, self)

    def on_user(self, event: UserSaved) -> None:
        self.transcript.append(Entry("message", f"m:{event.message_id}", event.message_id,
                                     "user", text=event.text))
        self._changed()
        self.window.threads_control.refresh_threads()  # the agent titled a new thread

    def on_request(self, event: RequestSent) -> None:
        self.window.context.show_request(event.request)
        self.window.state_label.setText("Reading the conversation…")

    def on_reply_started(self, event: ReplyStarted) -> None:
        self._stream_key = f"m:{event.message_id}"
        self.transcript.append(Entry("message", self._stream_key, event.message_id, "assistant",
                                     status="streaming"))
        self._stream_tokens, self._stream_t0 = 0, None
        self._changed()

    def on_token(self, event: ReplyToken) -> None:
        if self._stream_t0 is None:
            self._stream_t0 = time.monotonic()
        self._stream_tokens += 1
        self._pending += event.text
        if not self._flush_timer.isActive():
            self._flush_timer.start()

    def on_reply(self, event: ReplySaved) -> None:
        self._flush_tokens()
        row = self.transcript.row_of(f"m:{event.message_id}")
        if row is not None:
            calls = ["{}({})".format(*call_label(c)) for c in event.tool_calls]
            self.transcript.update(row, text=event.text, status=event.status, calls=calls)
        self._stream_key = None
        rate = getattr(event.stats, "tokens_per_s", None)
        if rate:
            self._last_rate = rate
        self.window.view.content_changed()

    def on_tool(self, event: ToolFinished) -> None:
        self.transcript.append(Entry(
            "tool", f"m:{event.message_id}", event.message_id, "tool", text=event.text,
            tool_name=event.name, arguments=pretty_arguments(event.arguments or {}),
            error=not event.ok))
        self._changed()

    def on_failed(self, event: TurnFailed) -> None:
        self._flush_tokens()
        if event.message_id is not None:
            row = self.transcript.row_of(f"m:{event.message_id}")
            if row is not None:
                self.transcript.update(row, status="error")
        self.transcript.add_notice(event.text)
        self._changed()

    def on_compaction_started(self, event: CompactionStarted) -> None:
        self.compacting = True
        self.window.busy(f"Compacting the conversation ({event.trigger})…")

    def on_compaction_finished(self, event: CompactionFinished) -> None:
        self.compacting = False
        self.window.busy(None)
        self._compacted = event.text or "Compaction finished"
        self.window.state_label.setText(self._compacted)

    def on_done(self, event: TurnDone) -> None:
        self._flush_tokens()
        self._stream_key = None
        self.set_generating(False)
        if not self.compacting:  # what the turn ended with; a compaction says what it did
            self.window.state_label.setText({"cancelled": "Stopped", "error": "Failed"}.get(
                event.finish_reason, self._compacted or self._rate_text() or "Ready"))
        self._compacted = ""
        w = self.window
        w.threads_control.refresh_threads()
        w.context.index_soon()  # the new messages join the semantic index
        if event.thread_id == w.thread_id:
            w.threads_control.reload_transcript()
            w.context.show_request(event.next_request)

    def finished(self, thread_id: int) -> None:
        """The model thread is done with the turn (after TurnDone)."""
        if self.shell_box is not None:
            self.shell_box.close()
        if self.compacting:
            self.compacting = False
            self.window.busy(None)

    # -- streaming display --

    def _changed(self) -> None:
        self.window.view.follow_bottom()
        self.window.view.content_changed()

    def _flush_tokens(self) -> None:
        """Paint the tokens that arrived since the last flush (at most ~30 times a second)."""
        if self._pending and self._stream_key is not None:
            # by key, not row: the user may have opened another thread meanwhile
            row = self.transcript.row_of(self._stream_key)
            if row is not None:
                self.transcript.append_text(row, self._pending)
                self.window.view.content_changed(row)
        self._pending = ""
        if self.generating and self._stream_t0 is not None:
            self.window.state_label.setText(self._rate_text(live=True))

    def _rate_text(self, live: bool = False) -> str:
        if live:
            elapsed = time.monotonic() - (self._stream_t0 or time.monotonic())
            n = self._stream_tokens
            rate = (n - 1) / elapsed if elapsed > 0 and n > 1 else 0
            return f"Generating… {rate:.1f} tok/s" if rate else "Generating…"
        rate = self._last_rate
        return f"Ready · last reply {rate:.1f} tok/s" if rate else ""

    # -- shell confirmation --

    def ask_shell(self, question: ShellQuestion) -> None:
        """Show the exact command; the model thread waits for the answer."""
        box = QMessageBox(QMessageBox.Icon.Question, "Run a shell command?",
                          "Iris wants to run this command on your computer:", parent=self.window)
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
