"""One turn on screen: send and Stop, and each event the model thread reports drawn into
the transcript and the status bar. The events are dispatched by ``core.events.dispatch``,
the same dispatcher the CLI uses; this is the GUI's listener."""

from __future__ import annotations

import threading
import time

from PySide6.QtCore import QObject, QSettings, QTimer
from PySide6.QtWidgets import QWidget

from iris_desktop.core.events import (
    CompactionFinished,
    CompactionStarted,
    PromptProgress,
    RecallSearch,
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
from iris_desktop.core.turns import Turn
from iris_desktop.core.views import (
    CONTENT_FILTERED,
    Entry,
    call_label,
    cut_off,
    dropped_status,
    only_thought,
    pretty_arguments,
    wrote_nothing,
)
from iris_desktop.runtime.speed import per_second, slow_words
from iris_desktop.stop import StopEvent
from iris_desktop.ui.app_state import NO_MODEL, AppState
from iris_desktop.ui.composer import Composer
from iris_desktop.ui.model_thread import CompactJob, ModelThread, ShellQuestion, TurnJob
from iris_desktop.ui.request_status import RequestStatus, compacted_elsewhere
from iris_desktop.ui.server_dialog import confirm_send, hold_conversation
from iris_desktop.ui.shell_confirm import ShellConfirm
from iris_desktop.ui.transcript import TranscriptView

STREAM_FLUSH_MS = 33  # streamed tokens are painted at most ~30 times a second


class TurnControl(QObject, TurnListener):
    """Sends the composer's text to the model thread and shows the turn as it happens;
    sets ``app_state.generating`` while one runs."""

    def __init__(self, app_state: AppState, model: ModelThread, view: TranscriptView,
                 composer: Composer, ui_state: QSettings, parent: QWidget):
        QObject.__init__(self, parent)
        self.app_state = app_state
        self.model = model
        self.view = view
        self.composer = composer
        self.ui_state = ui_state  # ui-state.ini: the servers a conversation may go to
        self.parent_widget = parent  # dialogs open over it
        self.cancel: threading.Event | None = None
        self.shell_box: ShellConfirm | None = None
        self.compacting = False
        self._compacted = ""  # what the last compaction of this turn did, for the status bar
        self._compaction_outcome: str | None = None  # ok | failed | skipped, this turn's
        self._elsewhere = False  # skipped: another process compacts the chat (it says so)
        self._replied = False  # this turn saved a reply: a compaction now is background work
        self._answer: str | None = None  # the text of the last reply this turn saved
        self._refused = False  # this turn was refused before anything of it was stored
        self._summary_notice: str | None = None  # the transcript's "Summarizing…" row
        self._unsaved: tuple[str, tuple, bool] | None = None  # the message sent, until stored;
        # and whether it stayed in the box (too large: the model certainly refuses it)
        self._stream_key: str | None = None  # the reply being streamed ("m:<id>")
        self._pending = ""
        self._stream_tokens = 0
        self._stream_t0: float | None = None
        self._rate_shown = 0.0  # when the live rate was last shown
        self._last_rate: float | None = None
        self._flush_timer = QTimer(self, singleShot=True, interval=STREAM_FLUSH_MS)
        self._flush_timer.timeout.connect(self._flush_tokens)
        #: the status bar's sentence about the chat a turn ended in, until it no longer holds
        self.request_status = RequestStatus(app_state, self._idle, self)

    def _idle(self) -> str:
        """The status bar's word with nothing under way: the model's state, not always
        "Ready" (after a failed load it is :data:`NO_MODEL`)."""
        return NO_MODEL if self.app_state.model_state == "failed" else "Ready"

    @property
    def transcript(self):
        return self.view.transcript

    @property
    def generating(self) -> bool:
        return self.app_state.generating

    # -- send, stop --

    def send(self, text: str) -> None:
        state = self.app_state
        files = tuple(self.composer.attachments)
        if state.generating or state.model_state != "ready" or not (text.strip() or files):
            return
        if not self.may_send():
            return  # the user declined to send to that server: the draft stays
        kept = text == self.composer.text() and self.composer.too_large(state.planner.params)
        if not kept:  # (a 5 MB paste was taken out of the box, and put back: seconds)
            self.composer.clear(quiet=True)  # the request the agent reports redraws the meter
        self._unsaved = (text, files, kept)  # back into the box if it is refused unstored
        self._start(Turn.send(state.thread_id, text, files))

    def regenerate(self, message_id: int) -> None:
        """Answer the open thread's last message again: a new alternative reply (the
        old one stays, behind the ‹ › switcher). The reply rows go from view until the
        new one streams in."""
        if self._can_start():
            self._cut_after_last("user")
            self._start(Turn.regenerate(self.app_state.thread_id))

    def edit(self, message_id: int, text: str) -> None:
        """Send ``text`` in place of the user message ``message_id``: a new branch from
        there (the old one stays, behind the switcher)."""
        if self._can_start() and text.strip():
            self._cut_from(f"m:{message_id}")
            self._start(Turn.edit(self.app_state.thread_id, message_id, text))

    def continue_reply(self, message_id: int) -> None:
        """Go on with the stopped or cut-off reply ``message_id`` (the open thread's last)."""
        if self._can_start():
            self._start(Turn.continue_reply(self.app_state.thread_id))

    def _can_start(self) -> bool:
        state = self.app_state
        return (not state.generating and state.model_state == "ready"
                and state.thread_id is not None and self.may_send())

    def _start(self, turn: Turn) -> None:
        state = self.app_state
        self.cancel = StopEvent()
        self._replied, self._answer, self._refused = False, None, False
        state.answering = turn.thread_id
        state.set_generating(True)
        state.show_status("Thinking…")
        self.view.follow_bottom()
        self.model.run_turn(TurnJob(turn, state.planner, self.cancel))

    def _cut_after_last(self, role: str) -> None:
        """Show the transcript up to its last ``role`` message (the rest is replaced)."""
        entries = self.transcript.entries()
        last = max((i for i, e in enumerate(entries) if e.role == role and e.kind == "message"),
                   default=None)
        if last is not None:
            self.transcript.set_entries(entries[: last + 1])

    def _cut_from(self, key: str) -> None:
        entries = self.transcript.entries()
        cut = next((i for i, e in enumerate(entries) if e.key == key), None)
        if cut is not None:
            self.transcript.set_entries(entries[:cut])

    def compact_now(self) -> None:
        """Compact the open thread now, on the model thread (the model may write the
        summary); Stop ends a model-written summary early."""
        state = self.app_state
        if state.thread_id is None:
            state.show_message("Open a chat to compact it")
            return
        if state.generating or state.model_state != "ready":
            state.show_message("Wait for the reply (or the model) before compacting")
            return
        if not self.may_send():  # a summary the server writes carries the chat too
            return
        self.cancel = StopEvent()
        state.answering = state.thread_id
        state.set_generating(True)
        self.model.compact(CompactJob(state.thread_id, state.planner, self.cancel))

    def may_send(self) -> bool:
        """Before a conversation first goes to a server on another machine, ask once per
        server (remembered in ui-state.ini); a local model or a loopback server never
        asks. False: the user said no, nothing is sent."""
        base_url = (self.app_state.model_info or {}).get("base_url")
        if not base_url:
            return True
        if not confirm_send(base_url, self.ui_state, self.parent_widget):
            return False
        hold_conversation(self.model.worker.host.runtime, self.ui_state)  # agreed: it may go
        return True

    def stop(self) -> None:
        if self.app_state.generating and self.cancel is not None:
            self.cancel.set()
            self.app_state.show_status(
                "Stopping: Iris summarizes the earlier turns itself, without the model…"
                if self.compacting else "Stopping…")

    # -- events from the model thread --

    def on_event(self, event: TurnEvent) -> None:
        tid = self.app_state.thread_id
        mine = event.thread_id == tid or (event.thread_id == -1 and tid is None)  # (-1: a new
        if not isinstance(event, (TurnDone, CompactionStarted, CompactionFinished)) and not mine:
            return  # chat that failed before it was made) the user opened another meanwhile
        dispatch(event, self)

    def on_user(self, event: UserSaved) -> None:
        self._unsaved = None
        self.transcript.append(Entry("message", f"m:{event.message_id}", event.message_id,
                                     "user", text=event.text, attachments=list(event.attachments)))
        self._changed()
        self.app_state.threads_changed()  # the agent titled a new thread

    def _stopping(self) -> bool:
        """Stop was pressed: the status bar keeps "Stopping…" until the turn ends (it said
        the model was writing a summary the Stop had just cancelled)."""
        return self.cancel is not None and self.cancel.is_set()

    def on_recall_search(self, event: RecallSearch) -> None:
        """A question sent before its search was done while typing: the send waits for it."""
        if not self._stopping():
            self.app_state.show_status(event.describe())

    def on_request(self, event: RequestSent) -> None:
        self.app_state.report_request(event.request)
        if not self._stopping():
            self.app_state.show_status("Reading the conversation…")

    def on_progress(self, event: PromptProgress) -> None:
        """How far the model has read the prompt: tokens, percentage, time left, with the
        bar (Stop stays in the composer)."""
        if self._stopping():
            return
        if event.done < event.total:
            self.app_state.busy(event.describe(), event.fraction)
        elif event.what == "summary":  # read: the model writes it now
            self.app_state.busy(event.describe())
        else:
            self.app_state.busy(None)
            self.app_state.show_status("Generating…")

    def on_reply_started(self, event: ReplyStarted) -> None:
        continued = None if event.replaces is None else f"m:{event.replaces}"
        if continued is not None and continued in self.transcript.keys():
            # a continued reply grows where the stopped one was
            self._stream_key = continued
            self.transcript.change(continued, status="streaming")
        else:
            self._stream_key = f"m:{event.message_id}"
            self.transcript.append(Entry("message", self._stream_key, event.message_id,
                                         "assistant", text=event.text, status="streaming"))
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
        # a continued reply streamed into the stopped one's row
        calls = ["{}({})".format(*call_label(c)) for c in event.tool_calls]
        self.transcript.change(self._stream_key or f"m:{event.message_id}", text=event.text,
                               status=event.status, calls=calls)
        self._stream_key = None
        self._replied, self._answer = True, event.text
        rate = getattr(event.stats, "tokens_per_s", None)
        if rate:
            self._last_rate = rate
        self.view.content_changed()

    def on_tool(self, event: ToolFinished) -> None:
        self.transcript.append(Entry(
            "tool", f"m:{event.message_id}", event.message_id, "tool", text=event.text,
            tool_name=event.name, arguments=pretty_arguments(event.arguments or {}),
            error=not event.ok))
        self._changed()

    def on_failed(self, event: TurnFailed) -> None:
        self._flush_tokens()
        if event.message_id is not None:
            self.transcript.change(f"m:{event.message_id}", status="error")
        self._refused = self._unsaved is not None  # nothing of the turn was stored
        if self._refused and event.kind == "busy":  # the other turn's rows come after: a
            self.app_state.show_message(event.text, 20_000)  # notice stayed between them
        else:
            self.transcript.add_notice(event.text)
        if self._unsaved is not None and not self._unsaved[2]:  # refused before it was
            text, files, _kept = self._unsaved  # stored: back into the box
            self.composer.set_text(text)
            self.composer.add_attachments(list(files))
        self._unsaved = None
        self._changed()

    def on_compaction_started(self, event: CompactionStarted) -> None:
        """The status bar says so; when the user waits for it (a message sent, not yet
        answered), the transcript says why there is no answer yet, and what Stop does."""
        self.compacting = True
        self.app_state.busy("Summarizing earlier turns…")
        if (event.trigger != "manual" and not self._replied and self.generating
                and event.thread_id == self.app_state.thread_id):
            note = ("Summarizing earlier turns so that the chat fits the model's window; the "
                    "answer starts after it. The model does this once the chat grows long, and "
                    "on a long imported chat it can take minutes. Stop skips the model: Iris "
                    "then summarizes them itself from the chat's own sentences.")
            row = self.transcript.add_notice(note, error=False)
            self.app_state.speak(note)  # a wait of minutes was silent to a screen reader
            self._summary_notice = self.transcript.entry(row).key
            self._changed()

    def on_compaction_finished(self, event: CompactionFinished) -> None:
        self.compacting = False
        self.app_state.busy(None)
        self._compacted = event.event.plain()
        self._compaction_outcome = event.event.outcome
        self._elsewhere = compacted_elsewhere(event.event)
        if self._summary_notice is not None:  # what the wait was for, said where it was
            self.transcript.reword_notice(self._summary_notice, self._compacted)
            self._summary_notice = None
        self.app_state.show_status(self._compacted)

    def on_done(self, event: TurnDone) -> None:
        state = self.app_state
        self._flush_tokens()
        self._stream_key = None
        state.set_generating(False)
        # turns left out: one short, whole sentence (the bar would cut a long one); the
        # inspector says which and why in full
        dropped = dropped_status(event.next_request, self._compaction_outcome)
        if event.thread_id not in (state.thread_id, -1):  # another chat is open now: a
            dropped = None  # sentence about the one answered would be read as about it
        elif self._elsewhere:  # skipped: another process compacts it, and says so (not
            dropped = self._compacted  # "Compaction skipped: 165 older turns are not sent")
        if not self.compacting:  # what the turn ended with; a compaction says what it did
            cut = cut_off(event.stats, state.settings["model.max_tokens"],
                          (state.model_info or {}).get("n_ctx"))
            empty = None if only_thought(event.stats) else wrote_nothing(
                self._answer, event.finish_reason)
            said = {"cancelled": "Stopped", "error": "Not sent" if self._refused else "Failed"}.get(
                event.finish_reason, ("Cut off" if cut else "No answer" if empty else None)
                or dropped or self._compacted or self._rate_text() or self._idle())
            state.show_status(said)  # about the request planned now: it goes once replanned
            self.request_status.said(event.thread_id, said, said == dropped)
            if cut:  # the whole sentence while it is news; the state stays
                state.show_message(f"Cut off: {cut}" + ("" if cut == CONTENT_FILTERED else
                                   "; Continue on the reply goes on"), 15_000)
            elif thought := only_thought(event.stats):
                state.show_message(f"{thought[0].upper()}{thought[1:]}; send again or rephrase",
                                   15_000)
            elif empty:  # an empty reply and "Ready" said nothing had gone wrong
                state.show_message(f"{empty[0].upper()}{empty[1:]}; Regenerate it (the link on "
                                   "the reply, or Shift+F10), or ask again in other words",
                                   15_000)
        self._compacted, self._answer = "", None  # (Compact now ends with a TurnDone too)
        self._compaction_outcome, self._elsewhere = None, False
        state.threads_changed()
        # the new messages join the semantic index, and the open thread's transcript
        state.messages_saved(event.thread_id)
        if event.thread_id == state.thread_id:
            state.report_request(event.next_request)

    def finished(self, thread_id: int) -> None:
        """The model thread is done with the turn (after TurnDone)."""
        if self.shell_box is not None:
            self.shell_box.close()
        if self.compacting:
            self.compacting = False
            self.app_state.busy(None)

    # -- streaming display --

    def _changed(self) -> None:
        self.view.follow_bottom()
        self.view.content_changed()

    def _flush_tokens(self) -> None:
        """Paint the tokens that arrived since the last flush (at most ~30 times a second)."""
        if self._pending and self._stream_key is not None:
            # by key, not row: the user may have opened another thread meanwhile
            row = self.transcript.append_text(self._stream_key, self._pending)
            if row is not None:  # a row now (the user may have gone up a long way)
                self.view.content_changed(row)
        self._pending = ""
        now = time.monotonic()  # the rate once a second: the status line speaks to screen readers
        if self.app_state.generating and self._stream_t0 is not None \
                and now - self._rate_shown >= 1.0:
            self._rate_shown = now
            self.app_state.show_status(self._rate_text(live=True))

    def _rate_text(self, live: bool = False) -> str:
        if live:
            elapsed = time.monotonic() - (self._stream_t0 or time.monotonic())
            n = self._stream_tokens
            rate = (n - 1) / elapsed if elapsed > 0 and n > 1 else 0
        else:
            rate = self._last_rate
        slow = slow_words(rate, self.app_state.model_info)
        slow = f" · {slow}" if slow else ""
        if live:
            return f"Generating… {per_second(rate)}{slow}" if rate else "Generating…"
        return f"Ready · last reply {per_second(rate)}{slow}" if rate else ""

    # -- shell confirmation --

    def ask_shell(self, question: ShellQuestion) -> None:
        """Show the exact command, all of it (``ShellConfirm``); the model thread waits for
        the answer."""
        box = ShellConfirm(question.command, self.parent_widget)
        box.finished.connect(lambda _: question.reply(box.approved))
        self.shell_box = box
        box.open()
