"""The agent turn loop: one user message in, a streamed and durable answer out.

Order of one turn:

1. commit the user message;
2. plan the request through the planner (compacting first when it is due) and report
   it (``RequestSent``);
3. stream the reply, saving the partial text at least every ``save_interval_s``;
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

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from iris_desktop.core.compaction import Compactor
from iris_desktop.core.conversation import title_from
from iris_desktop.core.engine import ContextRequest, ConversationTooLargeException
from iris_desktop.core.events import (
    ReplySaved,
    ReplyStarted,
    ReplyToken,
    RequestSent,
    ToolFinished,
    TurnDone,
    TurnEvent,
    TurnFailed,
    UserSaved,
)
from iris_desktop.core.planner import Planner
from iris_desktop.core.ports import Usage
from iris_desktop.core.store import Store
from iris_desktop.core.toolcalls import ParsedReply, ToolCall, parse_tool_calls
from iris_desktop.core.tools import Sandbox

log = logging.getLogger("iris.agent")

DEFAULT_TITLE = "New chat"


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
        self.model_name = self.runtime.model_name

    # -- the turn ---------------------------------------------------------------------------

    def send(
        self, thread_id: int, text: str, cancel: threading.Event | None = None
    ) -> Iterator[TurnEvent]:
        """Commit ``text`` as the user's message and run the turn it starts."""
        cancel = cancel or threading.Event()
        thread = self.store.thread(thread_id)
        user_id = self.store.add_message(thread_id, {"role": "user", "content": text})
        if thread["title"] == DEFAULT_TITLE:
            self.store.rename_thread(thread_id, title_from([{"role": "user", "content": text}]))
        yield UserSaved(thread_id, user_id, text)
        yield from self.run(thread_id, cancel)

    def run(self, thread_id: int, cancel: threading.Event) -> Iterator[TurnEvent]:
        """Answer the newest stored turn (after a user message or a tool result)."""
        calls_made = 0
        while True:
            tools_allowed = calls_made < self.config.max_calls_per_turn
            request = yield from self._request(thread_id, tools_allowed, cancel)
            if isinstance(request, ConversationTooLargeException):
                yield TurnFailed(thread_id, f"Conversation too large: {request}", "too_large",
                                 needed=request.needed, allowed=request.allowed)
                yield TurnDone(thread_id, "error")
                return
            yield RequestSent(thread_id, request)
            reply_id, reply_text, stats, error = yield from self._stream(thread_id, request, cancel)
            if error is not None:
                yield TurnFailed(thread_id, error, "model", message_id=reply_id)
                yield TurnDone(thread_id, "error")
                return
            cancelled = stats is not None and stats.finish_reason == "cancelled"
            offered = self.planner.tool_prompt(tools_allowed).definitions
            content, calls = self._save_reply(reply_id, reply_text, offered, cancelled)
            self._record(thread_id, request, stats)
            yield ReplySaved(thread_id, reply_id, content,
                             "interrupted" if cancelled else "complete", stats,
                             tuple(c.to_openai() for c in calls))
            if cancelled or not calls:
                reason = "cancelled" if cancelled else (stats.finish_reason if stats else "stop")
                following = None if cancelled else (yield from self._after_reply(thread_id, cancel))
                yield TurnDone(thread_id, reason, stats, following)
                return
            for call in calls:
                text, ok, ran = self._tool_result(call, cancel, calls_made)
                calls_made += ran
                tool_id = self.store.add_message(thread_id, {
                    "role": "tool", "tool_call_id": call.id, "name": call.name or "unknown",
                    "content": text,
                })
                yield ToolFinished(thread_id, tool_id, call.name or "unknown", call.arguments,
                                   ok, text, call.id)
            if cancel.is_set():
                yield TurnDone(thread_id, "cancelled")
                return

    def _request(self, thread_id: int, tools_allowed: bool, cancel: threading.Event):
        """The planner's request, compacting first when it says compaction is due.
        Returns the request, or the ConversationTooLargeException that stops the turn."""
        if self.compactor is not None:
            yield from self.compactor.before_request(thread_id, cancel)
        return self._plan(thread_id, tools_allowed)

    def _plan(self, thread_id: int, tools_allowed: bool
              ) -> ContextRequest | ConversationTooLargeException:
        try:
            return self.planner.plan(self.store, thread_id, tools_allowed=tools_allowed)
        except ConversationTooLargeException as exc:
            return exc

    def _after_reply(self, thread_id: int, cancel: threading.Event):
        """Background compaction when the next request would need it; returns the next
        request (what the views show until the user types), or None if it is too large."""
        if self.compactor is not None:
            yield from self.compactor.after_reply(thread_id, cancel)
        planned = self._plan(thread_id, True)
        return planned if isinstance(planned, ContextRequest) else None

    def _save_reply(self, reply_id: int, reply_text: str, offered: tuple[dict, ...],
                    cancelled: bool) -> tuple[str, list[ToolCall]]:
        """Commit the finished reply with the tool calls it makes (only tools that were
        offered count); returns (the stored content, the calls)."""
        names = {d["function"]["name"] for d in offered}
        parsed = (parse_tool_calls(reply_text, names) if names and not cancelled
                  else ParsedReply(reply_text, []))
        calls = self._number_calls(reply_id, parsed.calls)
        content = parsed.content if calls else reply_text
        self.store.update_streaming(
            reply_id, content, status="interrupted" if cancelled else "complete",
            tool_calls=[c.to_openai() for c in calls] or None)
        return content, calls

    def _tool_result(self, call: ToolCall, cancel: threading.Event, calls_made: int
                     ) -> tuple[str, bool, bool]:
        """(result, ok, ran) for one call; every call gets a result, so none is orphaned."""
        if cancel.is_set():
            return "error: cancelled by the user before it ran", False, False
        if calls_made >= self.config.max_calls_per_turn:
            return (f"error: tool call limit reached (tools.max_calls_per_turn = "
                    f"{self.config.max_calls_per_turn}); answer with what you have", False, False)
        text, ok = self._run_tool(call, cancel)
        return text, ok, True

    def _stream(self, thread_id: int, request: ContextRequest, cancel: threading.Event):
        """Stream the reply to ``request``, saving it as it grows; returns (reply id, text,
        stats, error). A failing model keeps the partial text, marked ``error``."""
        reply_id = self.store.add_message(
            thread_id, {"role": "assistant", "content": ""}, status="streaming"
        )
        yield ReplyStarted(thread_id, reply_id)
        pieces: list[str] = []
        last_save = self.clock()
        saved_len = 0
        generation = None
        try:
            extra = {"tools": request.tool_definitions} if request.tool_definitions else {}
            generation = self.runtime.stream(
                request.messages, max_tokens=self.config.max_tokens,
                temperature=self.config.temperature, cancel=cancel, **extra,
            )
            for piece in generation:
                pieces.append(piece)
                yield ReplyToken(thread_id, reply_id, piece)
                now = self.clock()
                if now - last_save >= self.config.save_interval_s:
                    text = "".join(pieces)
                    if len(text) != saved_len:
                        self.store.update_streaming(reply_id, text)
                        saved_len = len(text)
                    last_save = now
        except Exception as exc:  # the model failed mid-reply: keep what came, say why
            log.exception("generation failed")
            self.store.update_streaming(reply_id, "".join(pieces), status="error")
            return reply_id, "".join(pieces), None, f"The model failed: {exc}"
        return reply_id, "".join(pieces), generation.stats, None

    @staticmethod
    def _number_calls(reply_id: int, calls: list[ToolCall]) -> list[ToolCall]:
        """Ids unique within the thread, so that a result always finds its call."""
        for index, call in enumerate(calls):
            call.id = f"call_{reply_id}_{index}"
        return calls

    def _run_tool(self, call: ToolCall, cancel: threading.Event) -> tuple[str, bool]:
        """Run one call in the sandbox; Stop reaches a running tool through ``cancel``."""
        if call.arguments is None:
            return f"error: malformed tool call: {call.error}", False
        assert self.sandbox is not None
        result = self.sandbox.run(call.name, call.arguments, cancel=cancel)
        return result.content, result.ok

    def _record(self, thread_id: int, request: ContextRequest, stats: Usage | None) -> None:
        row: dict[str, Any] = {
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

