"""The agent turn loop: one user message in, a streamed and durable answer out.

Order of one turn:

1. commit the user message;
2. plan the request through the planner (compacting first when it is due) and report
   it (``RequestSent``);
3. stream the reply, saving the partial text at least every ``save_interval_s`` (a
   runtime yields ``""`` while it waits, so a silent server's partial text is saved too);
4. commit the reply;
5. if it holds tool calls, run them in the sandbox, commit each full result, and loop
   (at most ``tools.max_calls_per_turn`` calls);
6. the final answer ends the turn; background compaction runs if the next request would
   need it, and ``TurnDone`` carries that next request for the views.

:meth:`Agent.send` is a generator of typed events (``core.events``): each ``yield`` is one
thing the UI can show (napari's ``thread_worker`` shape). Cancel is cooperative: set the
``threading.Event`` and the runtime stops between two tokens.
"""

from __future__ import annotations

import functools
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from iris_desktop.core.attachments import Attachment, edited, shown, with_attachments
from iris_desktop.core.compaction import MIN_SUMMARY_TOKENS, Compactor
from iris_desktop.core.conversation import IMPORTED_FROM, imported_from, title_from
from iris_desktop.core.engine import (
    ContextRequest,
    ConversationTooLargeException,
    Frame,
    certainly_too_large,
    oversized,
)
from iris_desktop.core.events import (
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
    UserSaved,
    progress_reporter,
)
from iris_desktop.core.planner import Planner
from iris_desktop.core.store import Store, StoreError, min_tokens, row_to_message, utf8_length
from iris_desktop.core.store.errors import ThreadGone, busy_sentence
from iris_desktop.core.toolcalls import ParsedReply, ToolCall, parse_tool_calls
from iris_desktop.core.tools import Sandbox
from iris_desktop.core.turns import StopOrGiveWay, Turn
from iris_desktop.generation import GenerationRequest, GenerationStats
from iris_desktop.reasons import plain_reason
from iris_desktop.stop import Stop, stopping

log = logging.getLogger("iris.agent")

DEFAULT_TITLE = "New chat"
#: how long a turn's lease on its thread lasts unrenewed (a reply streaming renews it;
#: the lease of a process that is gone is free at once)
TURN_LEASE_S = 1800.0


#: more than a chat template adds around a message beyond its counted tokens: a message
#: this far under the history's room fits without building the request to make sure
FRAMING_MARGIN = 64
#: the most tool calls one reply may make: a server's streamed ones are held to the same
#: (``runtime.remote.sse.MAX_STREAMED_CALLS``)
MAX_REPLY_CALLS = 64
TOO_MANY_CALLS = (f"The model wrote more than {MAX_REPLY_CALLS} tool calls in one reply, so "
                  "none of them ran; ask again, for fewer steps at a time")


#: what to do about a message too large for any request of the window, said with its
#: refusal (before, the usual refusal named the numbers only)
TOO_LARGE_REMEDY = "shorten the message or its attached files, or raise context.window and model.n_ctx"


class Agent:
    """Runs turns for one store on the planner's runtime. Not thread-safe: one turn at a
    time. Every request it sends is the planner's, and it reports it (``RequestSent``).
    ``compactor`` None: no compaction (the host makes the agent with one; a scripted
    runtime writes no summary). Raises RuntimeError when the planner has no runtime."""

    def __init__(
        self,
        store: Store,
        planner: Planner,
        sandbox: Sandbox | None = None,
        compactor: Compactor | None = None,
        clock: Callable[[], float] = time.monotonic,
        progress: Callable[[PromptProgress], None] | None = None,
        give_way: Stop | None = None,
    ):
        if planner.runtime is None:
            raise RuntimeError("no model is loaded")
        self.store = store
        self.planner = planner
        self.runtime = planner.runtime
        self.config = planner.agent_config
        self.sandbox = sandbox
        self.compactor = compactor
        self.clock = clock
        #: told how far the model has read each prompt, while it reads (PromptProgress)
        self.progress = progress
        #: set while the user waits for the model (a send, a draft to prefill); the summary
        #: the model writes after a reply then stops and the extractive one is used, so
        #: the next message never waits behind it
        self.give_way = give_way
        self.model_name = self.runtime.model_name
        self._turn_token: str | None = None  # the turn lease's, while a turn runs
        self._lease_renewed = 0.0

    # -- the turn ---------------------------------------------------------------------------

    def run_turn(self, turn: Turn, thread_id: int, cancel: Stop | None = None
                 ) -> Iterator[TurnEvent]:
        """Run ``turn`` in ``thread_id`` (the turn's own, or the one just made for it),
        holding the thread's turn lease: a chat answers one turn at a time, whichever
        window or command runs it. A chat that is gone (deleted elsewhere) or answering
        elsewhere refuses the turn before anything is stored: TurnFailed ("gone" or
        "busy") and TurnDone."""
        token = uuid.uuid4().hex
        refusal = self._take_turn(thread_id, token)
        if refusal is not None:
            yield TurnFailed(thread_id, refusal[1], refusal[0])
            yield TurnDone(thread_id, "error")
            return
        self._turn_token, self._lease_renewed = token, self.clock()
        try:
            match turn.kind:
                case "send":
                    yield from self.send(thread_id, turn.text, cancel, turn.attachments)
                case "regenerate":
                    yield from self.regenerate(thread_id, cancel)
                case "edit":
                    if turn.message_id is None:
                        raise ValueError("an edit names the message it replaces")
                    yield from self.edit(thread_id, turn.message_id, turn.text, cancel,
                                         turn.attachments)
                case "continue":
                    yield from self.continue_reply(thread_id, cancel)
                case _:
                    raise ValueError(f"unknown turn kind {turn.kind!r}")
        except (StoreError, ThreadGone):  # ThreadGone: deleted while the turn was planned
            if not self._gone(thread_id):
                raise  # the chat is there: a real failure
            log.info("thread %s was deleted during its turn; the reply is discarded", thread_id)
            yield TurnFailed(thread_id, "The chat was deleted, in another Iris window or by a "
                             "command, while Iris answered; the reply went with it", "gone")
            yield TurnDone(thread_id, "error")
        finally:
            self._turn_token = None
            self.store.release_turn_lease(thread_id, token)

    def _take_turn(self, thread_id: int, token: str) -> tuple[str, str] | None:
        """(kind, sentence) when the turn cannot start in ``thread_id``; else None, and
        the lease is ours."""
        holder = None
        if not self._gone(thread_id):
            try:
                holder = self.store.take_turn_lease(thread_id, token, TURN_LEASE_S)
            except sqlite3.IntegrityError:  # deleted since
                pass
            else:
                if holder is None:
                    return None
        if holder is not None:
            return "busy", busy_sentence(holder)
        return "gone", ("Not sent: this chat was deleted, in another Iris window or by a "
                        "command")

    def _gone(self, thread_id: int) -> bool:
        try:
            self.store.thread(thread_id)
        except KeyError:
            return True
        return False

    def _renew_turn(self, thread_id: int) -> None:
        """Keep the turn lease while a long reply streams (at most every tenth of the
        lease). Another process holding the write lock past the busy timeout (a large
        import) skips this renewal while the lease has a third of its time left: the next
        token tries again (this ended the reply, cut, with exit 1)."""
        now = self.clock()
        if self._turn_token is not None and now - self._lease_renewed >= TURN_LEASE_S / 10:
            try:
                self.store.take_turn_lease(thread_id, self._turn_token, TURN_LEASE_S)
            except sqlite3.OperationalError as exc:
                busy = (getattr(exc, "sqlite_errorname", None) or "").startswith(
                    ("SQLITE_BUSY", "SQLITE_LOCKED"))
                if not busy or now - self._lease_renewed > TURN_LEASE_S * 2 / 3:
                    raise
                log.warning("the turn lease was not renewed (%s); it is renewed later", exc)
                return
            self._lease_renewed = now

    def send(
        self, thread_id: int, text: str, cancel: Stop | None = None,
        attachments: Sequence[Attachment] = (),
    ) -> Iterator[TurnEvent]:
        """Commit ``text`` (with its ``attachments``: files the model reads after it) as
        the user's message and run the turn it starts. A message too large for any
        request of this window (a huge paste) is refused before it is stored:
        TurnFailed ("too_large", no ``message_id``) and nothing written."""
        cancel = cancel or threading.Event()
        thread = self.store.thread(thread_id)
        tokens = [self.planner.counter.count_text(a.block()) for a in attachments]
        message = with_attachments(text, attachments, tokens)
        refusal = self._too_large_to_store(thread_id, message)
        if refusal is not None:
            yield TurnFailed(thread_id, f"Not sent: {refusal}; {TOO_LARGE_REMEDY}", "too_large",
                             needed=refusal.needed, allowed=refusal.allowed)
            yield TurnDone(thread_id, "error")
            return
        user_id = self.store.add_message(thread_id, message, sent=text)
        if thread["title"] == DEFAULT_TITLE:
            named = text if text.strip() else ", ".join(a.name for a in attachments)
            self.store.rename_thread(thread_id, title_from([{"role": "user", "content": named}]))
        yield UserSaved(thread_id, user_id, text, tuple(zip((a.name for a in attachments), tokens)))
        yield from self.run(thread_id, cancel)

    def _too_large_to_store(self, thread_id: int, message: dict
                            ) -> ConversationTooLargeException | None:
        """Why ``message`` cannot be sent in this chat: the planner's own refusal of it as
        the newest turn (beside the system prompt, the tools and the summary, with the
        numbers ``context`` gives); None when it fits. A size that is certainly too large
        is known without tokenizing. Before: the message alone was compared with the
        whole budget, so one a little smaller was stored, then refused, and the chat kept
        a question that could never be answered."""
        params = self.planner.params
        text = message.get("content") or ""
        n_bytes = utf8_length(text.strip())
        tools = self.planner.tool_prompt(True)
        room = functools.partial(self.planner.engine(self.store, recall=False).frame,
                                 thread_id, tools.text, tools.native_tokens)
        if certainly_too_large(params, n_bytes) is not None:  # (the room, only to say so)
            frame = room()
            return ConversationTooLargeException(
                oversized(params, min_tokens(n_bytes), n_bytes, frame), min_tokens(n_bytes),
                max(frame.history_budget, 0))
        try:
            needed = self.planner.counter.count_message(message)
            frame = room()
            # compaction (due once it is stored) can write a shorter summary: the room
            # counts the shortest one it would write, not today's
            shorter = (max(frame.summary_tokens - MIN_SUMMARY_TOKENS, 0)
                       if self.compactor is not None else 0)
            if needed + FRAMING_MARGIN <= frame.history_budget + shorter:
                return None  # it fits whatever the template adds: no second build
            if shorter:
                return self._beyond_shortest_summary(needed, frame, shorter)
            # near the limit: the request's own build (without recall: its block only
            # fills room that is left) says whether it fits, and in its words
            self.planner.plan(self.store, thread_id, text, recall=False)
        except ConversationTooLargeException as exc:
            return exc
        except Exception:  # a counter that fails (a server's) fails the turn once stored
            log.warning("could not count the new message before storing it", exc_info=True)
        return None

    def _beyond_shortest_summary(self, needed: int, frame: Frame, shorter: int
                                 ) -> ConversationTooLargeException | None:
        """A message near the room a shorter summary would leave: let compaction try (a
        borderline one fails after it, in the planner's words), or say why not even the
        shortest summary leaves it room."""
        allowed = frame.history_budget + shorter
        if needed <= allowed:
            return None
        p = self.planner.params
        return ConversationTooLargeException(
            f"the newest turn alone is {needed:,} tokens; even beside the shortest summary "
            f"compaction writes the history budget allows {allowed:,} (window {p.window:,} × ratio "
            f"{p.token_budget_ratio} − system {frame.system_tokens:,} − tools "
            f"{frame.tool_tokens:,} − summary {MIN_SUMMARY_TOKENS})", needed, allowed)

    def regenerate(self, thread_id: int, cancel: Stop | None = None
                   ) -> Iterator[TurnEvent]:
        """Answer the active branch's newest user message again. The new reply is an
        alternative beside the old ones, which stay (switch between them with
        ``Store.switch_branch``); its request is the one the old reply answered, so the
        prompt is in the KV cache already. Nothing changes when no reply could start (the
        chat too large, say): the old reply stays the active one."""
        cancel = cancel or threading.Event()
        user = self.store.newest_user_message(thread_id)
        if user is None:
            yield TurnFailed(thread_id, "There is no message of yours to answer again", "internal")
            yield TurnDone(thread_id, "error")
            return
        # another sampling seed for each answer again, or it would be the same reply
        seed = len(self.store.replies_to(user))
        yield from self._on_branch(thread_id, user, self.run(thread_id, cancel, seed=seed))

    def edit(self, thread_id: int, message_id: int, text: str,
             cancel: Stop | None = None, attachments: Sequence[Attachment] = ()
             ) -> Iterator[TurnEvent]:
        """Send ``text`` (with its ``attachments``) in place of the user message
        ``message_id`` of the active branch: a new branch starts where that message was
        (the old one is kept, an alternative of the new message), and the turn it starts
        runs."""
        cancel = cancel or threading.Event()
        row = self.store.messages_by_id([message_id]).get(message_id)
        if row is None or not self.store.editable(thread_id, message_id):
            yield TurnFailed(thread_id, f"Message {message_id} is not a message of yours in "
                             "this chat's active branch", "internal")
            yield TurnDone(thread_id, "error")
            return
        tokens = [self.planner.counter.count_text(a.block()) for a in attachments]
        message = (with_attachments(text, attachments, tokens) if attachments
                   else edited(row_to_message(row), text))  # the files the message had stay
        user_id = self.store.add_message(thread_id, message, parent_id=row["parent_id"])
        yield UserSaved(thread_id, user_id, text, tuple(zip((a.name for a in attachments), tokens))
                        or tuple(shown(message)[1]))
        yield from self.run(thread_id, cancel)

    def continue_reply(self, thread_id: int, cancel: Stop | None = None
                       ) -> Iterator[TurnEvent]:
        """Go on with the active branch's last reply from where it stopped (Stop, its
        token cap, a failure). The runtime continues the request's trailing assistant
        message; the continued reply is a new alternative holding the old text and what
        follows (``ReplyStarted.replaces`` names the old one, which stays)."""
        cancel = cancel or threading.Event()
        head = self.store.stopped_reply(thread_id)
        row = self.store.messages_by_id([head]).get(head) if head is not None else None
        if row is None:  # a reply that ended on its own has nothing to continue
            yield TurnFailed(thread_id, "There is no stopped or cut-off reply to continue", "internal")
            yield TurnDone(thread_id, "error")
            return
        yield from self.run(thread_id, cancel, continuing=row)

    def _on_branch(self, thread_id: int, head: int, turn: Iterator[TurnEvent]
                   ) -> Iterator[TurnEvent]:
        """Run ``turn`` with the active branch cut back to ``head``; when no reply
        started, the branch is put back as it was."""
        before = self.store.head(thread_id)
        self.store.set_head(thread_id, head)
        started = False
        try:
            for event in turn:
                started = started or isinstance(event, ReplyStarted)
                yield event
        finally:
            if not started:
                self.store.set_head(thread_id, before)

    def run(self, thread_id: int, cancel: Stop, continuing: dict | None = None,
            seed: int | None = None) -> Iterator[TurnEvent]:
        """Answer the newest stored turn (after a user message or a tool result), or go on
        with the reply ``continuing`` (a stored row: the head of the active branch).
        ``seed``: the sampling seed (None: the runtime's own)."""
        calls_made = 0
        past_limit = 0  # requests after the limit whose reply still called a tool
        while True:
            tools_allowed = calls_made < self.config.max_calls_per_turn
            request = yield from self._request(thread_id, tools_allowed, cancel,
                                               continuing is not None)
            if isinstance(request, ConversationTooLargeException):
                yield TurnFailed(thread_id, f"Conversation too large: {request}", "too_large",
                                 needed=request.needed, allowed=request.allowed)
                yield TurnDone(thread_id, "error")
                return
            yield RequestSent(thread_id, request)
            reply_id, reply_text, stats, error = yield from self._stream(
                thread_id, request, cancel, continuing, seed)
            kept = len(continuing["content"] or "") if continuing else 0
            continuing = None
            if error is not None:
                yield TurnFailed(thread_id, error, "model", message_id=reply_id)
                yield TurnDone(thread_id, "error")
                return
            cancelled = stats is not None and stats.finish_reason == "cancelled"
            # past the limit a call is still read as one (answered "limit reached"): it
            # was shown as the model's answer, raw markup, with nothing said
            offered = self.planner.tool_prompt(True).definitions
            content, calls, too_many = self._save_reply(reply_id, reply_text, offered,
                                                        cancelled, kept)
            self._record(thread_id, request, stats, reply_id)
            yield ReplySaved(thread_id, reply_id, content,
                             "interrupted" if cancelled else "complete", stats,
                             tuple(c.to_openai() for c in calls))
            if too_many:
                yield TurnFailed(thread_id, TOO_MANY_CALLS, "model", message_id=reply_id)
                yield TurnDone(thread_id, "error")
                return
            if cancelled or not calls:
                reason = "cancelled" if cancelled else (stats.finish_reason if stats else "stop")
                following = None if cancelled else (yield from self._after_reply(thread_id, cancel))
                yield TurnDone(thread_id, reason, stats, following)
                return
            calls_made = yield from self._run_calls(thread_id, calls, cancel, calls_made)
            if cancel.is_set():
                yield TurnDone(thread_id, "cancelled")
                return
            past_limit += not tools_allowed
            if past_limit >= 2:  # told once that no calls remain; it called again
                yield TurnFailed(thread_id, "The model kept calling tools after "
                                 f"tools.max_calls_per_turn ({self.config.max_calls_per_turn}) "
                                 "was reached and wrote no answer; ask again, or raise "
                                 "tools.max_calls_per_turn", "model")
                yield TurnDone(thread_id, "error")
                return

    def _request(self, thread_id: int, tools_allowed: bool, cancel: Stop,
                 continuing: bool = False):
        """The planner's request, compacting first when it says compaction is due (the
        one that goes on with the last reply: ``continuing``). Returns the request, or the
        ConversationTooLargeException that stops the turn."""
        # a question sent before it was ranked waits for the cross-encoder in the first
        # plan: the compaction check's, or (after a compaction: a new summary, so the
        # planner asks again) the request's
        if not continuing and self.planner.must_rank(self.store, thread_id):
            yield RecallSearch(thread_id)
        if self.compactor is not None:
            yield from self.compactor.before_request(thread_id, cancel)
            if not continuing and self.planner.must_rank(self.store, thread_id):
                yield RecallSearch(thread_id)
        with stopping(cancel):  # the Stop does not wait for the reranker
            return self._plan(thread_id, tools_allowed, continuing)

    def _plan(self, thread_id: int, tools_allowed: bool, continuing: bool = False
              ) -> ContextRequest | ConversationTooLargeException:
        try:
            return self.planner.plan(self.store, thread_id, tools_allowed=tools_allowed,
                                     continuing=continuing)
        except ConversationTooLargeException as exc:
            return exc

    def _after_reply(self, thread_id: int, cancel: Stop):
        """Background compaction when the next request would need it; returns the next
        request (what the views show until the user types), or None if it is too large."""
        if self.compactor is not None:
            stop = cancel if self.give_way is None else StopOrGiveWay(cancel, self.give_way)
            yield from self.compactor.after_reply(thread_id, stop)
        planned = self._plan(thread_id, True)
        return planned if isinstance(planned, ContextRequest) else None

    def _save_reply(self, reply_id: int, reply_text: str, offered: tuple[dict, ...],
                    cancelled: bool, kept: int = 0) -> tuple[str, list[ToolCall], bool]:
        """Commit the finished reply with the tool calls it makes (only tools that were
        offered count); returns (the stored content, the calls, whether it made more than
        :data:`MAX_REPLY_CALLS`: then it is kept as text, no call). Only what the model
        wrote now makes calls: a continued reply's first ``kept`` characters (a stopped
        reply, or an imported one, whose call markup ran on Continue without a question
        before) stay text as they were."""
        names = {d["function"]["name"] for d in offered}
        old, new = reply_text[:kept], reply_text[kept:]
        parsed = (parse_tool_calls(new, names) if names and not cancelled
                  else ParsedReply(new, []))
        too_many = len(parsed.calls) > MAX_REPLY_CALLS  # 50,000 calls were 50,000 rows
        if too_many:
            parsed = ParsedReply(new, [])
        calls = self._number_calls(reply_id, parsed.calls)
        lead = new[:len(new) - len(new.lstrip())] if old else ""  # stripped with the markup
        content = old + lead + parsed.content if calls else reply_text
        self.store.update_streaming(
            reply_id, content, status="interrupted" if cancelled else "complete",
            tool_calls=[c.to_openai() for c in calls] or None)
        return content, calls, too_many

    def _run_calls(self, thread_id: int, calls: list[ToolCall], cancel: Stop, calls_made: int):
        """Run the reply's ``calls``, each result stored and reported (ToolFinished); returns
        how many calls have run in the turn now. Every call gets its result, also when the
        turn is broken off at one (a second Ctrl+C at the shell's question: a call left
        without one was sent, unanswered, in every later request)."""
        answered = 0
        try:
            for call in calls:
                text, ok, ran = self._tool_result(call, cancel, calls_made)
                calls_made += ran
                tool_id = self._add_result(thread_id, call, text)
                answered += 1
                yield ToolFinished(thread_id, tool_id, call.name or "unknown",
                                   call.arguments, ok, text, call.id)
        except BaseException:
            for call in calls[answered:]:
                self._add_result(thread_id, call, "error: the turn was broken off at this call; "
                                 "no result was kept")
            raise
        return calls_made

    def _add_result(self, thread_id: int, call: ToolCall, text: str) -> int:
        return self.store.add_message(thread_id, {
            "role": "tool", "tool_call_id": call.id, "name": call.name or "unknown",
            "content": text})

    def _tool_result(self, call: ToolCall, cancel: Stop, calls_made: int
                     ) -> tuple[str, bool, bool]:
        """(result, ok, ran) for one call; every call gets a result, so none is orphaned."""
        if cancel.is_set():
            return "error: cancelled by the user before it ran", False, False
        if calls_made >= self.config.max_calls_per_turn:
            return (f"error: tool call limit reached (tools.max_calls_per_turn = "
                    f"{self.config.max_calls_per_turn}); answer with what you have", False, False)
        text, ok = self._run_tool(call, cancel)
        return text, ok, True

    def _stream(self, thread_id: int, request: ContextRequest, cancel: Stop,
                continuing: dict | None = None, seed: int | None = None):
        """Stream the reply to ``request``, saving it as it grows; returns (reply id, text,
        stats, error). A failing model keeps the partial text, marked ``error``. A reply
        ``continuing`` another starts with its text, beside it (the same parent)."""
        start = continuing["content"] if continuing else ""
        reply_id = self.store.add_message(
            thread_id, {"role": "assistant", "content": start, **_continued_from(continuing)},
            status="streaming", **({"parent_id": continuing["parent_id"]} if continuing else {}),
        )
        yield ReplyStarted(thread_id, reply_id, start, continuing["id"] if continuing else None)
        pieces: list[str] = [start]
        last_save = self.clock()
        saved_len = len(start)
        generation = None
        try:
            generation = self.runtime.stream(GenerationRequest(
                request.messages, max_tokens=self.config.max_tokens,
                temperature=self.config.temperature, top_k=self.config.top_k,
                top_p=self.config.top_p, min_p=self.config.min_p,
                repeat_penalty=self.config.repeat_penalty,
                dry_multiplier=self.config.dry_multiplier, seed=seed, cancel=cancel,
                tools=list(request.tool_definitions) or None,
                progress=None if self.progress is None else progress_reporter(
                    self.progress, thread_id, "reply", self.clock)))
            for piece in generation:
                # an empty piece: nothing new yet (a silent server), but time to save
                if piece:
                    pieces.append(piece)
                    yield ReplyToken(thread_id, reply_id, piece)
                now = self.clock()
                if now - last_save >= self.config.save_interval_s:
                    self._renew_turn(thread_id)
                    text = "".join(pieces)
                    if len(text) != saved_len and self._saved_so_far(reply_id, text):
                        saved_len = len(text)
                    last_save = now
        except (sqlite3.Error, StoreError):  # the history took no more (a full disk): the
            self._save_failed(reply_id, "".join(pieces))  # caller says so
            raise
        except Exception as exc:  # the model failed mid-reply: keep what came, say why
            log.exception("generation failed")
            try:
                self.store.update_streaming(reply_id, "".join(pieces), status="error")
            except (sqlite3.Error, StoreError) as saving:  # recovered at the next start
                log.warning("the failed reply's text was not saved: %s", saving)
            return reply_id, "".join(pieces), None, f"The model failed: {plain_reason(exc)}"
        finally:
            # the model is free again whatever happened (a full disk left the generation
            # open, holding the model's lock: closing the model then waited forever)
            if generation is not None:
                generation.close()
        return reply_id, "".join(pieces), generation.stats, None

    def _save_failed(self, reply_id: int, text: str) -> None:
        """A reply whose save failed (a full disk) is kept as failed, with what came if
        the disk takes it; where it takes nothing, the host marks it when it can
        (``Host.end_replies``). Before, it stayed 'streaming', and the next start said
        Iris had closed unexpectedly."""
        try:
            self.store.update_streaming(reply_id, text, status="error")
        except (sqlite3.Error, StoreError) as saving:
            log.warning("the reply that failed to save is marked later: %s", saving)

    def _saved_so_far(self, reply_id: int, text: str) -> bool:
        """Save the reply so far; False when another process holds the database's write
        lock past the busy timeout (a long import, before it wrote in short transactions):
        the reply goes on, and the next save, or the last, writes it (this failed the
        whole reply, and its error save failed too, leaving it 'streaming')."""
        try:
            self.store.update_streaming(reply_id, text)
        except sqlite3.OperationalError as exc:  # told apart as store.explain tells them
            if not (getattr(exc, "sqlite_errorname", None) or "").startswith(("SQLITE_BUSY",
                                                                               "SQLITE_LOCKED")):
                raise
            log.warning("the reply so far was not saved (%s); it is saved later", exc)
            return False
        return True

    @staticmethod
    def _number_calls(reply_id: int, calls: list[ToolCall]) -> list[ToolCall]:
        """Ids unique within the thread, so that a result always finds its call."""
        for index, call in enumerate(calls):
            call.id = f"call_{reply_id}_{index}"
        return calls

    def _run_tool(self, call: ToolCall, cancel: Stop) -> tuple[str, bool]:
        """Run one call in the sandbox; Stop reaches a running tool through ``cancel``."""
        if call.arguments is None:
            return f"error: malformed tool call: {call.error}", False
        assert self.sandbox is not None
        result = self.sandbox.run(call.name, call.arguments, cancel=cancel)
        return result.content, result.ok

    def _record(self, thread_id: int, request: ContextRequest, stats: GenerationStats | None,
                reply_id: int) -> None:
        row: dict[str, Any] = {
            "head_id": max(request.included_ids, default=None),
            "reply_id": reply_id,
            "model": self.model_name,
            "window": request.breakdown.window,
            "counter": request.counter,
            "summary_id": request.summary.id if request.summary else None,
            "predicted_prompt_tokens": request.predicted_prompt_tokens,
        }
        if stats is not None:
            row.update(
                prompt_tokens=stats.prompt_tokens,
                completion_tokens=stats.completion_tokens,
                reused_tokens=stats.reused_tokens,
                evaluated_tokens=stats.evaluated_tokens,
                time_to_first_token_s=stats.time_to_first_token_s,
                tokens_per_s=stats.tokens_per_s,
                duration_s=stats.duration_s,
                finish_reason=stats.finish_reason,
            )
        self.store.add_request(thread_id, row)


#: what a reply imported from another app and continued here is said to come from, after
#: the app's name: its start was written there, the rest by the model here
CONTINUED_HERE = ", continued in Iris"


def _continued_from(continuing: dict | None) -> dict[str, str]:
    """Who a reply that continues ``continuing`` (a stored row) is said to be from: for
    an imported reply ``imported_from`` "LibreChat, continued in Iris", and the speaker's
    ``name`` it had (an imported group chat's character). Before, the continued reply,
    most of it written in LibreChat, was headed "Iris" and exported as Iris's own."""
    said = row_to_message(continuing) if continuing else {}
    app = imported_from(said)
    if not app:
        return {}
    name = {"name": said["name"]} if isinstance(said.get("name"), str) else {}
    return {**name, IMPORTED_FROM: app if app.endswith(CONTINUED_HERE) else app + CONTINUED_HERE}
