"""The agent turn loop: one user message in, a streamed and durable answer out.

Order of one turn:

1. commit the user message;
2. build the request through the engine (compacting first when it is due);
3. stream the reply, saving the partial text at least every ``save_interval_s``;
4. commit the reply;
5. if it holds tool calls, run them in the sandbox, commit each full result, and loop
   (at most ``tools.max_calls_per_turn`` calls);
6. the final answer ends the turn.

:meth:`Agent.send` is a generator of :class:`AgentEvent`: each ``yield`` is one thing the
UI can show (napari's ``thread_worker`` shape). Cancel is cooperative: set the
``threading.Event`` and the runtime stops between two tokens.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from iris_desktop.core.conversation import title_from
from iris_desktop.core.engine import (
    ContextEngine,
    ContextParams,
    ContextRequest,
    ConversationTooLargeException,
)
from iris_desktop.core.store import Store
from iris_desktop.core.tokens import Message, TokenCounter
from iris_desktop.core.toolcalls import ParsedReply, ToolCall, parse_tool_calls, tools_system_prompt
from iris_desktop.core.tools import Sandbox

log = logging.getLogger("iris.agent")

DEFAULT_TITLE = "New chat"


class Runtime(Protocol):
    """What the agent needs from a model (``runtime.model.LocalModel`` or a scripted fake)."""

    n_ctx: int
    last_stats: Any

    def counter(self) -> TokenCounter: ...

    def stream(
        self,
        messages: list[Message],
        *,
        max_tokens: int,
        temperature: float = 0.7,
        cancel: threading.Event | None = None,
    ) -> Iterator[str]: ...


@dataclass
class AgentEvent:
    """One step of a turn, for the UI.

    kinds: ``user``, ``request``, ``compaction``, ``assistant_start``, ``token``,
    ``assistant``, ``tool``, ``error``, ``done``.
    """

    kind: str
    thread_id: int
    message_id: int | None = None
    text: str = ""
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class AgentConfig:
    max_tokens: int = 1024
    temperature: float = 0.7
    max_calls_per_turn: int = 8
    save_interval_s: float = 1.0

    @classmethod
    def from_settings(cls, settings: Any) -> AgentConfig:
        return cls(
            max_tokens=settings["model.max_tokens"],
            temperature=settings["model.temperature"],
            max_calls_per_turn=settings["tools.max_calls_per_turn"],
        )


class Agent:
    """Runs turns for one store and one runtime. Not thread-safe: one turn at a time."""

    def __init__(
        self,
        store: Store,
        runtime: Runtime,
        params: ContextParams,
        config: AgentConfig | None = None,
        sandbox: Sandbox | None = None,
        compactor: Any = None,
        counter: TokenCounter | None = None,
        clock: Callable[[], float] = time.monotonic,
        model_name: str = "",
    ):
        self.store = store
        self.runtime = runtime
        self.params = params
        self.config = config or AgentConfig()
        self.sandbox = sandbox
        self.compactor = compactor
        self.counter = counter or runtime.counter()
        self.clock = clock
        self.model_name = model_name

    # -- pieces -----------------------------------------------------------------------------

    def engine(self) -> ContextEngine:
        return ContextEngine(self.store, self.counter, self.params)

    def tool_definitions(self) -> list[dict]:
        if self.sandbox is None or self.config.max_calls_per_turn == 0:
            return []
        return self.sandbox.definitions()

    @property
    def native_tools(self) -> bool:
        """The model's chat template renders tool definitions itself."""
        return bool(getattr(self.runtime, "native_tools", False))

    def tools_text(self, definitions: list[dict] | None = None) -> str:
        """Tool descriptions for the system prompt, unless the template takes them."""
        definitions = self.tool_definitions() if definitions is None else definitions
        if not definitions or self.native_tools:
            return ""
        return tools_system_prompt(definitions)

    def build(self, thread_id: int, tools_text: str, tools: list[dict] | None = None
              ) -> ContextRequest:
        native = self.runtime.tool_tokens(tools) if tools and self.native_tools else 0
        return self.engine().build(thread_id, tools_text=tools_text, native_tool_tokens=native)

    # -- the turn ---------------------------------------------------------------------------

    def send(
        self, thread_id: int, text: str, cancel: threading.Event | None = None
    ) -> Iterator[AgentEvent]:
        """Commit ``text`` as the user's message and run the turn it starts."""
        cancel = cancel or threading.Event()
        thread = self.store.thread(thread_id)
        user_id = self.store.add_message(thread_id, {"role": "user", "content": text})
        if thread["title"] == DEFAULT_TITLE:
            self.store.rename_thread(thread_id, title_from([{"role": "user", "content": text}]))
        yield AgentEvent("user", thread_id, user_id, text)
        yield from self.run(thread_id, cancel)

    def run(self, thread_id: int, cancel: threading.Event) -> Iterator[AgentEvent]:
        """Answer the newest stored turn (after a user message or a tool result)."""
        calls_made = 0
        definitions = self.tool_definitions()
        while True:
            tools_allowed = bool(definitions) and calls_made < self.config.max_calls_per_turn
            tools_text = self.tools_text(definitions) if tools_allowed else ""
            native = definitions if tools_allowed and self.native_tools else None
            try:
                request: ContextRequest | None = self.build(thread_id, tools_text, native)
                trigger = request.trigger
            except ConversationTooLargeException as exc:
                request, trigger, too_large = None, "budget", exc
            if self.compactor is not None and trigger != "none":
                # compact first, then build once more with the new summary in place
                yield from self.compactor.run_events(thread_id, trigger, tools_text)
                try:
                    request = self.build(thread_id, tools_text, native)
                except ConversationTooLargeException as exc:
                    request, too_large = None, exc
            if request is None:
                yield AgentEvent("error", thread_id, text=f"Conversation too large: {too_large}",
                                 data={"kind": "too_large", "needed": too_large.needed,
                                       "allowed": too_large.allowed})
                yield AgentEvent("done", thread_id, data={"finish_reason": "error"})
                return
            yield AgentEvent("request", thread_id, data=_request_data(request))
            reply_id, reply_text, stats, error = yield from self._stream(
                thread_id, request, cancel, native)
            if error is not None:
                yield AgentEvent("error", thread_id, reply_id, error, data={"kind": "model"})
                yield AgentEvent("done", thread_id, data={"finish_reason": "error"})
                return
            cancelled = stats is not None and stats.finish_reason == "cancelled"
            parsed = (
                parse_tool_calls(reply_text, {d["function"]["name"] for d in definitions})
                if tools_allowed and not cancelled
                else ParsedReply(reply_text, [])
            )
            calls = self._number_calls(reply_id, parsed.calls)
            status = "interrupted" if cancelled else "complete"
            content = parsed.content if calls else reply_text
            self.store.update_streaming(
                reply_id, content, status=status, tool_calls=[c.to_openai() for c in calls] or None
            )
            self._record(thread_id, request, stats)
            yield AgentEvent("assistant", thread_id, reply_id, content,
                             data={"status": status, "stats": _stats_dict(stats),
                                   "tool_calls": [c.to_openai() for c in calls]})
            if cancelled or not calls:
                reason = "cancelled" if cancelled else (stats.finish_reason if stats else "stop")
                yield AgentEvent("done", thread_id, data={"finish_reason": reason,
                                                          "stats": _stats_dict(stats)})
                if self.compactor is not None and not cancelled:
                    yield from self.compactor.after_reply(thread_id, tools_text)
                return
            for call in calls:
                if cancel.is_set():
                    # a result for every call, so that no call is left without one
                    result, ok = "error: cancelled by the user before it ran", False
                elif calls_made >= self.config.max_calls_per_turn:
                    result, ok = (
                        f"error: tool call limit reached (tools.max_calls_per_turn = "
                        f"{self.config.max_calls_per_turn}); answer with what you have", False)
                else:
                    calls_made += 1
                    result, ok = self._run_tool(call)
                tool_id = self.store.add_message(thread_id, {
                    "role": "tool", "tool_call_id": call.id, "name": call.name or "unknown",
                    "content": result,
                })
                yield AgentEvent("tool", thread_id, tool_id, result,
                                 data={"name": call.name, "ok": ok, "arguments": call.arguments,
                                       "tool_call_id": call.id})
            if cancel.is_set():
                yield AgentEvent("done", thread_id, data={"finish_reason": "cancelled"})
                return

    def _stream(self, thread_id: int, request: ContextRequest, cancel: threading.Event,
                tools: list[dict] | None = None):
        reply_id = self.store.add_message(
            thread_id, {"role": "assistant", "content": ""}, status="streaming"
        )
        yield AgentEvent("assistant_start", thread_id, reply_id)
        pieces: list[str] = []
        last_save = self.clock()
        saved_len = 0
        try:
            extra = {"tools": tools} if tools else {}
            for piece in self.runtime.stream(
                request.messages, max_tokens=self.config.max_tokens,
                temperature=self.config.temperature, cancel=cancel, **extra,
            ):
                pieces.append(piece)
                yield AgentEvent("token", thread_id, reply_id, piece)
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
        return reply_id, "".join(pieces), getattr(self.runtime, "last_stats", None), None

    @staticmethod
    def _number_calls(reply_id: int, calls: list[ToolCall]) -> list[ToolCall]:
        """Ids unique within the thread, so that a result always finds its call."""
        for index, call in enumerate(calls):
            call.id = f"call_{reply_id}_{index}"
        return calls

    def _run_tool(self, call: ToolCall) -> tuple[str, bool]:
        if call.arguments is None:
            return f"error: malformed tool call: {call.error}", False
        assert self.sandbox is not None
        result = self.sandbox.run(call.name, call.arguments)
        return result.content, result.ok

    def _record(self, thread_id: int, request: ContextRequest, stats: Any) -> None:
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


def _request_data(request: ContextRequest) -> dict[str, Any]:
    return {
        "breakdown": request.breakdown.as_dict(),
        "trigger": request.trigger,
        "compaction_due": request.compaction_due,
        "predicted_prompt_tokens": request.predicted_prompt_tokens,
        "protect_turns": request.protect_turns,
        "fallback": request.fallback,
        "dropped_turns": request.dropped_turns,
    }


def _stats_dict(stats: Any) -> dict[str, Any]:
    if stats is None:
        return {}
    return {
        key: getattr(stats, key)
        for key in (
            "prompt_tokens", "reused_tokens", "evaluated_tokens", "completion_tokens",
            "time_to_first_token_s", "tokens_per_s", "duration_s", "finish_reason",
        )
    }
