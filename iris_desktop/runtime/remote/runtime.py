"""The runtimes: :class:`RemoteRuntime` for a server that cannot count (estimated
counts), :class:`ExactRemoteRuntime` for one that can (llama.cpp, vLLM), both made by
:meth:`RemoteRuntime.connect`; which served model a request names, and the sampling
fields each server takes beyond OpenAI's."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from iris_desktop.generation import GenerationRequest
from iris_desktop.stop import Stop
from iris_desktop.tokens import Message, continues_reply, message_text, shared_tiktoken

from ..errors import PromptTooLongError, ServerError
from ..protocol import (
    Capabilities,
    Generation,
    KVState,
    ModelFacts,
    Prefill,
    Unsupported,
)
from .address import is_loopback, privacy_warning
from .counting import (
    _CALIBRATION_TEXT,
    _FALLBACK_FRAMING_TOKENS,
    _LRU,
    COUNT_SCHEME,
    TOOL_FRAMING_TOKENS,
    EstimatedTokenCounter,
    ServerTokenCounter,
    _calibration,
)
from .deadline import ConnectCancelled, ConnectExpired, OnWait, connect_clock
from .probe import _PROBE_SYSTEM, _PROBE_USER, ServerInfo, _probe
from .sse import MAX_REPORTED_TOKENS, POLL_S, _EventReader, _Reply, _tokens
from .transport import (
    REQUEST_TIMEOUT_S,
    TEMPLATE_MARGIN_TOKENS,
    TEXT_MARGIN_TOKENS,
    ServerRefused,
    _answer_field,
    _Http,
    _obj,
    server_said,
    tokens_answer_limit,
)

log = logging.getLogger("iris.runtime.remote")

#: a reply must start, its headers and its first text, within this long of the request
#: (or the idle limit, if that is longer): the server is reading the prompt, and
#: llama.cpp sends nothing, not even the headers, until its first token
START_TIMEOUT_S = 600.0
#: a reply ends when no new text came for this long after its first (the default of
#: ``model.stream_idle_timeout_s``); keep-alives and empty chunks do not count
STREAM_IDLE_TIMEOUT_S = 60.0
#: after a reply's finish reason, how long Iris waits for its usage chunk and ``[DONE]``
#: on a connection the server keeps open
FINISHED_GRACE_S = 2.0
#: text chunks a reply may stream per token of its ``max_tokens`` (llama.cpp can send a
#: token's content and a tool call's start as separate chunks), plus a few
CHUNKS_PER_TOKEN = 2
CHUNK_SLACK = 16
#: characters a reply may stream per token of its ``max_tokens`` (no tokenizer has longer
#: tokens than this)
CHARS_PER_TOKEN = 64
#: a silent stream yields "" this often, so that the caller can save what came
HEARTBEAT_S = POLL_S
_EXACT = Capabilities(exact_counts=True, native_tools=True)


#: windows servers said mid-reply they now run (``"host:port/model"``: (the window its
#: probe reported then, or None, and the n_ctx its refusal gave)), kept for the life of
#: the process, so that a reconnect keeps the one it said in a refusal: when the server
#: does not say its window, and when its probe still says the old one (a proxy's
#: metadata: the window adopted was dropped at each reconnect, and the window
#: reconnected after every turn)
_adopted_windows: dict[str, tuple[int | None, int]] = {}


class NotACount(ServerError):
    """The server's counts of two probe conversations say that a message (the tools, the
    generation prompt) takes tokens away: they cannot be counts of them."""


class WindowChanged(PromptTooLongError):
    """The server refused a prompt as longer than its window, which is not the window
    Iris connected with (it was restarted with another): the runtime now uses the new one."""

    def __init__(self, prompt_tokens: int, n_ctx: int, before: int, address: str) -> None:
        super().__init__(prompt_tokens, n_ctx)
        self.before = before
        self.args = (f"{address} now runs a {n_ctx:,}-token window (it ran {before:,} when "
                     f"Iris connected), and this prompt is {prompt_tokens:,} tokens; Iris uses "
                     f"the new window from now on, so the next message is made to fit "
                     f"(older turns are summarized or left out)",)

    def __str__(self) -> str:
        return self.args[0]


@dataclass(frozen=True)
class RemoteModelInfo:
    """What a served model is, as far as the server says (``describe`` reads it)."""

    name: str
    context_length: int | None = None
    architecture: str = ""
    file_type: str = ""
    size_bytes: int = 0


@dataclass(frozen=True)
class ServerChatFormat:
    """The server applies its own chat template; this only names it for the UI."""

    name: str


class RemoteRuntime:
    """A model on an OpenAI-compatible server that cannot count prompts: counts are
    tiktoken's times a calibrated factor (:class:`EstimatedTokenCounter`). Make one with
    :meth:`connect` (which returns an :class:`ExactRemoteRuntime` when the server can
    count); :meth:`close` when done.

    Threads: :meth:`stream` runs on the model thread, the counting methods on any thread
    (httpx's client is thread-safe). After :meth:`close` both raise ``RuntimeError``.
    """

    #: tools are passed to the server in the OpenAI format; its template renders them.
    #: The server keeps its own prompt cache (llama.cpp's ``cache_prompt``): there is no
    #: prefill and no KV state to save here.
    capabilities = Capabilities(exact_counts=False, native_tools=True)
    native_tools = True
    #: a chat API serves instruction-following models
    base_model = False
    load_time_s: float = 0.0

    def __init__(self, http: _Http, server: ServerInfo, model: str, window: int,
                 window_source: str, *, idle_timeout_s: float = STREAM_IDLE_TIMEOUT_S,
                 start_timeout_s: float | None = None) -> None:
        self._http = http
        self.server = server
        #: a reply ends when no new text came for this long after its first
        self.idle_timeout_s = float(idle_timeout_s)
        #: a reply must start (headers, first text) within this long: reading the prompt
        self.start_timeout_s = (max(START_TIMEOUT_S, self.idle_timeout_s)
                                if start_timeout_s is None else float(start_timeout_s))
        self.base_url = server.base_url
        self.kind = server.kind
        self.model = model
        self.window_source = window_source
        self._n_ctx = int(window)
        served = server.model(model)
        #: for display: the last part of a path or repository name ("org/Model-7B")
        self.path = PurePosixPath(model)
        self.info = RemoteModelInfo(self.path.name or model,
                                    served.trained_length if served else None)
        self.chat_format = ServerChatFormat(f"server:{server.kind}")
        self.identity = f"{http.address}/{model}"
        self.model_name = self.path.name or model
        self._closing = threading.Event()
        #: whether the conversation may go to this server (counts, replies). True for the
        #: CLI, whose ``chat`` says where it goes; the window sets False for a server on
        #: another machine the user has not agreed to yet, and True once they agree: until
        #: then every count is this runtime's local estimate and no reply is asked for
        self.conversation_allowed = True

    # -- connecting --------------------------------------------------------------

    @classmethod
    def connect(cls, base_url: str, name: str = "", api_key: str | None = None,
                fallback_window: int = 8192, *, idle_timeout_s: float = STREAM_IDLE_TIMEOUT_S,
                start_timeout_s: float | None = None, answer_limit_bytes: int | None = None,
                answer_timeout_s: float = REQUEST_TIMEOUT_S, deadline_s: float | None = None,
                on_wait: OnWait | None = None,
                cancel: threading.Event | None = None) -> RemoteRuntime:
        """Probe ``base_url`` and return the runtime for model ``name`` (empty: the
        server's first). The window is the server's when it says, else
        ``fallback_window`` (``window_source`` "server" or "config"). A server that cannot
        count gets one tiny calibration request first (fixed text, no conversation).
        A reply must start (headers, first text) within ``start_timeout_s`` (None:
        :data:`START_TIMEOUT_S`, at least the idle limit) and ends when no new text came
        for ``idle_timeout_s`` (``model.stream_idle_timeout_s``). Every answer read whole
        (the probes, the calibration, the counts) holds at most ``answer_limit_bytes``
        decoded bytes (None: :data:`MAX_ANSWER_BYTES`, :data:`MAX_COUNT_ANSWER_BYTES` for
        a count) and ends within ``answer_timeout_s``, so a broken server cannot hold
        ``connect`` or fill the memory; and all of them together end within
        ``deadline_s`` (None: :data:`~.deadline.CONNECT_DEADLINE_S`; a calibration it
        leaves no time for is skipped). While an answer is awaited, ``on_wait(path,
        seconds)`` hears which and for how long (on this thread, once the connect has taken
        :data:`~.deadline.SAY_WAIT_AFTER_S`), and setting ``cancel`` ends the wait.
        Raises ServerError (unreachable, key refused, unknown model, an answer too large
        or too slow, the deadline passed, cancelled) or ValueError (not a URL)."""
        started = time.perf_counter()
        http = _Http(base_url, api_key, answer_limit=answer_limit_bytes,
                     answer_timeout_s=answer_timeout_s)
        http.clock = connect_clock(http.root, deadline_s, on_wait, cancel)
        try:
            server = _probe(http, base_url, only=name or None)
            model = _choose_model(server, name, http.address)
            served = server.model(model)
            window, source = ((served.context_length, "server")
                              if served and served.context_length else (fallback_window, "config"))
            identity = f"{http.address}/{model}"
            reported, adopted = _adopted_windows.get(identity, (None, None))
            if adopted is not None and (source == "config" or window == reported):
                window, source = adopted, "server"  # it said so mid-reply
            elif adopted is not None:  # the server reports another window now: that one
                del _adopted_windows[identity]
            kind = ExactRemoteRuntime if server.exact_counts else RemoteRuntime
            runtime = kind(http, server, model, window, source, idle_timeout_s=idle_timeout_s,
                           start_timeout_s=start_timeout_s)
            runtime._calibrate()
        except BaseException:
            http.close()
            raise
        finally:
            http.clock = None  # counts and replies have bounds of their own
        runtime.load_time_s = time.perf_counter() - started
        log.info("connected to %s (%s, model %s): window %d (%s), counts %s, in %.2f s",
                 http.address, server.kind, model, window, source, server.counting,
                 runtime.load_time_s)
        return runtime

    def _calibrate(self) -> None:
        """Learn the estimate's factor from one request the server reports on (skipped
        once this process has learned it for this server and model)."""
        if _calibration.known(self.identity):
            return
        messages = [{"role": "system", "content": "Answer in one word."},
                    {"role": "user", "content": _CALIBRATION_TEXT}]
        body = {**self._chat_body(messages, None), "max_tokens": 1, "temperature": 0.0}
        try:
            answer = self._http.post("/v1/chat/completions", body)
        except ConnectCancelled:
            raise
        except ConnectExpired:  # the probes took the connect's time: the replies calibrate it
            log.warning("%s: no time was left to calibrate the token estimate while connecting "
                        "(within %g s)", self.where, self._http.clock.deadline_s)
            return
        except (ServerError, PromptTooLongError) as exc:
            # an optimisation: the first replies calibrate it too, if the server reports
            log.warning("%s: could not calibrate the token estimate: %s", self.where, exc)
            return
        usage = _obj(_obj(answer).get("usage"))
        reported = _tokens(usage.get("prompt_tokens"), "prompt_tokens", self._http.address)
        if not reported:
            log.warning("%s: could not calibrate the token estimate: the server reported no "
                        "usable prompt_tokens", self.where)
            return
        _calibration.observe(self.identity, reported, self._raw_estimate(messages, None))
        log.info("%s: calibrated the token estimate: factor %.2f", self.where,
                 _calibration.factor(self.identity))

    # -- facts -------------------------------------------------------------------

    @property
    def n_ctx(self) -> int:
        """The window: the server's, or the fallback ``connect`` was given."""
        return self._n_ctx

    @property
    def where(self) -> str:
        """Where the conversation goes, for the status bar: ``server: host:port``."""
        return f"server: {self._http.address}"

    @property
    def is_loopback(self) -> bool:
        return is_loopback(self.base_url)

    @property
    def warning(self) -> str | None:
        """:func:`privacy_warning` for this server."""
        return privacy_warning(self.base_url)

    @property
    def closed(self) -> bool:
        return self._closing.is_set()

    def _check_open(self) -> None:
        if self._closing.is_set():
            raise RuntimeError(f"{self.where}: the connection is closed")

    def _check_allowed(self) -> None:
        """The last guard before conversation text leaves: refused (ServerError) while
        the user has not agreed to send this conversation to the server."""
        if not self.conversation_allowed:
            raise ServerError(f"{self._http.address} is on another machine and you have not "
                              "agreed to send it your conversation yet, so nothing was sent")

    # -- counting (estimated) ------------------------------------------------------

    def counter(self) -> EstimatedTokenCounter:
        """The estimating counter with the factor learned so far: a new factor is a new
        name, so the owner of the planner should make a new planner when it changes."""
        factor = _calibration.factor(self.identity)
        return EstimatedTokenCounter(
            shared_tiktoken(), factor, f"server:{self.identity}:estimated:x{factor:.2f}")

    def tool_tokens(self, tools: list[dict]) -> int:
        """An estimate of what ``tools`` add to a prompt (their JSON and the template's
        instructions around it)."""
        return math.ceil(self._raw_tools(tools) * _calibration.factor(self.identity))

    def _raw_tools(self, tools: list[dict] | None) -> int:
        if not tools:
            return 0
        return shared_tiktoken().count_text(json.dumps(tools)) + TOOL_FRAMING_TOKENS

    def _raw_estimate(self, messages: list[Message], tools: list[dict] | None) -> int:
        """tiktoken's count of a whole request, before the factor."""
        base = shared_tiktoken()
        return (base.prompt_overhead() + sum(base.count_message(m) for m in messages)
                + self._raw_tools(tools))

    def _measure(self, messages: list[Message], tools: list[dict] | None) -> tuple[int, int]:
        """(the prompt's size as this runtime knows it before sending, what the server's
        report is compared with afterwards: here tiktoken's count before the factor)."""
        raw = self._raw_estimate(messages, tools)
        return math.ceil(raw * _calibration.factor(self.identity)), raw

    def _observe(self, reported: int, raw: int) -> None:
        """The server reported ``reported`` prompt tokens: calibrate the estimate."""
        _calibration.observe(self.identity, reported, raw)

    # -- generation --------------------------------------------------------------

    def _chat_body(self, messages: list[Message], tools: list[dict] | None) -> dict:
        """What a request says about the conversation: the same for a count and for the
        generation, so that a count is the prompt the generation evaluates."""
        body: dict[str, Any] = {"model": self.model, "messages": list(messages)}
        if continues_reply(messages):
            # llama.cpp continues a trailing assistant message by itself (its "prefill");
            # vLLM is told so; the marker is Iris's, not a field of the API
            body["messages"] = [*messages[:-1], {k: v for k, v in messages[-1].items() if k != "prefix"}]
            if self.kind == "vllm":
                body.update(continue_final_message=True, add_generation_prompt=False)
        if tools:
            body["tools"] = list(tools)
        return body

    def stream(self, request: GenerationRequest) -> Generation:
        """Generate the reply ``request`` asks for on the server, yielding text as it streams.

        As ``LocalModel.stream``: ``cancel``, ``deadline`` (``time.monotonic()``) and
        :meth:`close` stop it with ``finish_reason == "cancelled"`` within
        :data:`POLL_S`, also while the server is still evaluating the prompt (the
        connection is closed, and the server stops). ``tools`` go to the server in the
        OpenAI format; the calls it streams back come out as ``<tool_call>{...}
        </tool_call>`` text after the reply's own text, which the agent parses into
        stored calls. ``json_schema`` (or ``response_format``) becomes an OpenAI
        ``response_format``. ``top_k``, ``min_p`` and ``repeat_penalty`` reach llama.cpp
        and vLLM only (hosted APIs refuse unknown fields). After the iterator ends,
        the Generation's ``stats`` hold the statistics the server reported.

        While the server sends no new text the iterator yields ``""`` every
        :data:`HEARTBEAT_S`, so that the caller can save what came.

        Raises (at the first ``next``) PromptTooLongError when the prompt leaves no room
        in the window, ServerError when the request fails; a connection lost mid-reply,
        a reply that does not start within ``start_timeout_s`` or goes silent for
        ``idle_timeout_s``, a server that keeps sending past ``max_tokens``, a line past
        :data:`MAX_LINE_BYTES` and an event Iris cannot read raise ServerError after the
        text that arrived was yielded.
        """
        self._check_open()
        self._check_allowed()
        r = request
        response_format = r.response_format
        if r.json_schema is not None:
            response_format = {"type": "json_schema",
                               "json_schema": {"name": "iris_output", "schema": r.json_schema}}
        body = {**self._chat_body(r.messages, r.tools), "stream": True,
                "stream_options": {"include_usage": True},
                "temperature": r.temperature, "top_p": r.top_p,
                **_sampling_extras(self.kind, r.top_k, r.min_p, r.repeat_penalty)}
        if r.seed is not None:
            body["seed"] = r.seed
        if r.stop:
            body["stop"] = list(r.stop)
        if response_format:
            body["response_format"] = response_format
        return Generation(lambda result: self._stream(
            result, body, list(r.messages), r.tools or None, r.max_tokens, r.cancel, r.deadline))

    def _stream(self, result: Generation, body: dict, messages: list[Message],
                tools: list[dict] | None, max_tokens: int, cancel: threading.Event | None,
                deadline: float | None) -> Iterator[str]:
        address = self._http.address
        reply = _Reply(time.perf_counter(), address)
        prompt_size, basis = self._measure(messages, tools)
        body["max_tokens"] = limit = self._room(prompt_size, max_tokens)

        def should_stop() -> bool:
            return (self._closing.is_set() or (cancel is not None and cancel.is_set())
                    or (deadline is not None and time.monotonic() > deadline))

        outcome: str | None = None
        if should_stop():
            outcome = "cancelled"
            result.stats = reply.stats(prompt_size, outcome, self.n_ctx, limit)
            return
        reader = _EventReader(self._http.streams, self._http.url("/v1/chat/completions"),
                              body, address)
        sent = heard = beat = time.monotonic()
        try:
            for event, when in reader.events(should_stop):
                if event is not None:
                    finished, chunks = reply.finish_reason is not None, reply.chunks
                    text = reply.feed(event)
                    # new text, or the first finish reason: after that nothing moves the
                    # grace on (a finish reason that kept changing held the reply for good)
                    if not finished and (reply.chunks != chunks or reply.finish_reason):
                        heard = when
                    over = reply.chars - CHARS_PER_TOKEN * limit
                    if over > 0:  # never more than the bound: the rest is not shown or kept
                        text = text[:max(0, len(text) - over)]
                    if text:
                        yield text
                        beat = time.monotonic()
                    if (reply.chunks > CHUNKS_PER_TOKEN * limit + CHUNK_SLACK or over > 0):
                        raise ServerError(f"{address} kept sending past the {limit}-token limit "
                                          f"it was asked to keep (model.max_tokens), so the "
                                          f"reply was cut off there")
                if self._quiet_too_long(reader, reply, sent, heard, when):
                    break  # the reply had finished; the server only kept the connection open
                if time.monotonic() - beat >= HEARTBEAT_S:
                    yield ""  # nothing new: the caller may save what came
                    beat = time.monotonic()
            if reader.stopped:
                outcome = "cancelled"
            elif reply.finish_reason is None and not reader.done:
                raise self._ended_early(reply, prompt_size)
            elif reply.calls:
                yield reply.tool_call_text()
        except GeneratorExit:
            outcome = "cancelled"
            raise
        except PromptTooLongError as exc:
            outcome = "error"
            raise self._adopt_window(exc) from None
        except BaseException:
            outcome = "error"
            raise
        finally:
            reader.abort()
            result.stats = reply.stats(prompt_size, outcome, self.n_ctx, limit)
            reported = reply.prompt_tokens(prompt_size, self.n_ctx)
            if reported and not self.closed:
                self._observe(reported, basis)
            log.debug("%s: %s", self.where, result.stats)

    def _ended_early(self, reply: _Reply, prompt_size: int) -> ServerError:
        """Why a stream ended without a finish reason or ``[DONE]``, in words. A server
        that does not say its window (``window_source`` config) and closed the stream
        before any text most likely refused a prompt longer than the window it runs
        (llama-cpp-python's server does that): said with both numbers and the setting
        that fixes it, since every later message would fail the same way."""
        address = self._http.address
        if reply.chunks or self.window_source != "config":
            return ServerError(f"{address}: the stream ended before the reply did (the "
                               "connection was lost mid-reply)")
        return ServerError(
            f"{address} closed the reply before any text. It does not say its context window, "
            f"so Iris assumed model.n_ctx = {self.n_ctx:,} tokens, and this prompt is about "
            f"{prompt_size:,}: a server running a smaller window refuses it this way. Set "
            f"model.n_ctx to the server's window (its -c or --n_ctx), so that Iris compacts "
            f"the chat to fit; or the server failed (its log says)")

    def _adopt_window(self, exc: PromptTooLongError) -> PromptTooLongError:
        """The server refused the prompt as longer than its window. A window other than
        the one Iris connected with means the server was restarted with another one:
        it is adopted (``n_ctx``, and for the rest of this process on reconnects), so
        that the next request is planned to fit (compacted or pruned), and said once
        ("the server now runs a 512-token window"); before, every later send failed."""
        if exc.n_ctx == self._n_ctx:
            return exc
        previous = _adopted_windows.get(self.identity)  # adopted before: what the probe said
        reported = previous[0] if previous else (
            self._n_ctx if self.window_source == "server" else None)
        before, self._n_ctx, self.window_source = self._n_ctx, exc.n_ctx, "server"
        _adopted_windows[self.identity] = (reported, exc.n_ctx)
        log.warning("%s: the server now runs a %d-token window (it ran %d); adopted",
                    self.where, exc.n_ctx, before)
        return WindowChanged(exc.prompt_tokens, exc.n_ctx, before, self._http.address)

    def _quiet_too_long(self, reader: _EventReader, reply: _Reply, sent: float, heard: float,
                        now: float) -> bool:
        """Raises ServerError when the reply did not start (headers and first text) within
        ``start_timeout_s`` of ``sent``, or went on without new text for
        ``idle_timeout_s`` after ``heard`` (its last); True when it had finished and
        ``FINISHED_GRACE_S`` passed since its first finish reason (``heard`` then: the
        server kept the connection open after it, or kept sending; the reply is not held
        for the whole idle timeout, nor for good)."""
        address = self._http.address
        if reply.finish_reason is not None:  # done; a usage chunk may still come
            return now - heard > min(FINISHED_GRACE_S, self.idle_timeout_s)
        if reply.chunks:
            if now - heard <= self.idle_timeout_s:
                return False
            raise ServerError(f"{address} sent no new text for {self.idle_timeout_s:g} s "
                              f"(model.stream_idle_timeout_s), so the reply was cut off there")
        if now - sent <= self.start_timeout_s:
            return False
        if reader.answered_at is None:
            raise ServerError(f"{address} did not start answering within "
                              f"{self.start_timeout_s:g} s (not even the response headers "
                              f"came), so Iris gave up on the reply")
        raise ServerError(f"{address} answered but sent no text within "
                          f"{self.start_timeout_s:g} s of the request, so Iris gave up on the "
                          f"reply")

    def count_prompt(self, messages: list[Message], tools: list[dict] | None = None) -> int:
        """The estimated prompt size of a request (``capabilities.exact_counts`` is
        False: the planner never calls it exact)."""
        return self._measure(list(messages), tools or None)[0]

    def render_prompt(self, messages: list[Message]) -> str:
        """The request as the server gets it (the server applies its own template)."""
        return json.dumps(self._chat_body(list(messages), None), ensure_ascii=False, indent=2)

    def prefill(self, messages: list[Message], tools: list[dict] | None = None, *,
                cancel: Stop | None = None) -> Prefill:
        raise Unsupported(f"{self.where} keeps its own prompt cache; there is nothing to "
                          "prefill from here")

    def kv_state(self) -> KVState | None:
        """None: the server's KV cache stays on the server."""
        return None

    def restore_kv_state(self, state: KVState) -> bool:
        return False

    def describe(self) -> ModelFacts:
        return ModelFacts(
            name=self.info.name, file=self.model_name, path=self.model, n_ctx=self.n_ctx,
            context_length=self.info.context_length, chat_format=self.chat_format.name,
            load_time_s=self.load_time_s, where=self.where, base_url=self.base_url,
            license="as the server's operator states")

    def _room(self, prompt_size: int, max_tokens: int) -> int:
        """``max_tokens`` within what the window leaves (vLLM and hosted APIs refuse a
        request whose prompt plus max_tokens exceeds it). An estimate never refuses: the
        server has the last word."""
        room = self.n_ctx - prompt_size
        return max(1, min(max_tokens, room))

    def close(self) -> None:
        """Close the connections. Idempotent; a stream in progress stops at once."""
        if not self._closing.is_set():
            self._closing.set()
            self._http.close()

    def __enter__(self) -> RemoteRuntime:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.where} {self.model} n_ctx={self.n_ctx}>"


class ExactRemoteRuntime(RemoteRuntime):
    """A model on a server that counts prompts with its own tokenizer and template
    (llama.cpp, vLLM): :meth:`count_prompt` is the ``prompt_tokens`` the server reports
    for the same request, to the token, and the planner uses it for every request."""

    def __init__(self, http: _Http, server: ServerInfo, model: str, window: int,
                 window_source: str, **limits: Any) -> None:
        super().__init__(http, server, model, window, window_source, **limits)
        self.counter_name = (f"server:{http.address}:{model}:{server.fingerprint or '-'}:"
                             f"{COUNT_SCHEME}")
        self._counts = _LRU()
        self._texts = _LRU()

    @property
    def capabilities(self) -> Capabilities:  # type: ignore[override]
        """Exact counts once the conversation may go to the server; estimated before
        (:attr:`conversation_allowed`), as for a server that cannot count."""
        return _EXACT if self.conversation_allowed else RemoteRuntime.capabilities

    def _calibrate(self) -> None:
        """Exact counts need no calibration."""

    def counter(self) -> ServerTokenCounter | EstimatedTokenCounter:  # type: ignore[override]
        """The server's counter; the estimating one while the conversation may not go to
        the server (a planner made then never asks it, and its counts are cached under
        the estimate's name, never the server's)."""
        return ServerTokenCounter(self) if self.conversation_allowed else super().counter()

    # -- the server's counts -----------------------------------------------------------

    def _count(self, messages: list[Message], tools: list[dict] | None = None,
               generation: bool = True) -> int:
        """The server's count of the prompt for ``messages`` (with the generation prompt
        unless ``generation`` is False), as it would evaluate it. Cached. Raises
        ServerError, having sent nothing, while the conversation may not go to the server."""
        self._check_open()
        self._check_allowed()
        body = self._chat_body(messages, tools)
        if not generation:
            body["add_generation_prompt"] = False
        key = json.dumps(body, sort_keys=True, ensure_ascii=False)
        return self._counts.get(key, lambda: self._ask_count(body))

    def _ask_count(self, body: dict) -> int:
        way = self.server.counting
        if way == "apply-template":
            prompt = self._post_field("/apply-template", body, "prompt", str)
            return self._tokenize(prompt, special=True)
        path, key = (("/v1/chat/completions/input_tokens", "input_tokens") if way == "input_tokens"
                     else ("/tokenize", "count"))
        size = len(json.dumps(body, ensure_ascii=False).encode("utf-8", "replace"))
        limit = tokens_answer_limit(size, TEMPLATE_MARGIN_TOKENS) if path == "/tokenize" else None
        return self._checked(self._post_field(path, body, key, int, limit), path, size,
                             TEMPLATE_MARGIN_TOKENS)

    def _checked(self, count: int, path: str, size: int | None = None,
                 margin: int = TEXT_MARGIN_TOKENS) -> int:
        """``count``, the server's answer at ``path``, when it can be a count: from 0 to
        :data:`MAX_REPORTED_TOKENS`, and at most one token per byte of the ``size`` bytes
        counted and ``margin`` more (no tokenizer makes more: 22 million tokens for
        "hello" were believed, and blamed on the system prompt); else ServerError naming
        the server (a broken server's count: never a budget)."""
        if not 0 <= count <= MAX_REPORTED_TOKENS:
            raise ServerError(f"{self._http.address} answered {path} with {count:,} tokens, "
                              "which cannot be a count of this conversation")
        if size is not None and count > size + margin:
            raise ServerError(f"{self._http.address} answered {path} with {count:,} tokens for "
                              f"{size:,} bytes of text, more than any tokenizer makes of them, "
                              "so the server is broken, not your text; check or restart it")
        return count

    def _added(self, more: int, less: int) -> int:
        """``more - less``: what a message (the tools, the generation prompt) adds to a
        probe conversation, by the server's counts; NotACount when that is negative (a
        lying ``/tokenize`` made ``context`` show "history -246" as exact)."""
        if more < less:
            path = {"input_tokens": "/v1/chat/completions/input_tokens",
                    "apply-template": "/apply-template"}.get(self.server.counting, "/tokenize")
            raise NotACount(f"{self._http.address} answered {path} with fewer tokens for a "
                            f"longer conversation ({more:,} against {less:,}), which cannot "
                            "be counts of it")
        return more - less

    def _post_field(self, path: str, body: dict, key: str, wanted: type,
                    limit: int | None = None) -> Any:
        """The ``key`` of the server's answer to ``body`` at ``path`` (at most ``limit``
        bytes, when given), a ``wanted``; ServerError naming what is wrong when it is not."""
        return _answer_field(self._http.post(path, body, limit=limit), key, wanted,
                             self._http.address, path)

    def _tokenize(self, text: str, special: bool) -> int:
        """How many tokens llama.cpp makes of ``text``: ``add_special`` (BOS) for a whole
        prompt, and control-token text always parsed, as the server parses the prompts it
        evaluates. Its answer is bounded by the text (:func:`tokens_answer_limit`: before,
        64 MiB of ``[]`` took 1.7 GB), and checked (:meth:`_checked`)."""
        body = {"content": text, "add_special": special, "parse_special": True}
        size = len(text.encode("utf-8", "replace"))
        tokens = self._post_field("/tokenize", body, "tokens", list, tokens_answer_limit(size))
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise ServerError(f"{self._http.address} answered /tokenize in a way Iris cannot "
                              "read: 'tokens' holds something other than token ids")
        return self._checked(len(tokens), "/tokenize", size)

    def count_text(self, text: str) -> int:
        """Tokens of ``text`` alone: no template, no BOS, control-token text parsed as
        the server parses the prompts it evaluates."""
        if not text:
            return 0
        self._check_open()
        self._check_allowed()
        if self.server.counting == "vllm-tokenize":
            body = {"model": self.model, "prompt": text, "add_special_tokens": False}
            size = len(text.encode("utf-8", "replace"))
            return self._texts.get(text, lambda: self._checked(self._post_field(
                "/tokenize", body, "count", int, tokens_answer_limit(size)), "/tokenize", size))
        return self._texts.get(text, lambda: self._tokenize(text, special=False))

    def count_prompt(self, messages: list[Message], tools: list[dict] | None = None) -> int:
        """The exact number of prompt tokens the server evaluates for this request; the
        local estimate while the conversation may not go to the server."""
        if not self.conversation_allowed:
            return RemoteRuntime._measure(self, list(messages), tools or None)[0]
        return self._count(list(messages), tools or None)

    def prompt_overhead(self) -> int:
        """What a request adds once: the generation prompt (the BOS is counted with the
        system message, which a request always starts with)."""
        return self._added(self._count([_PROBE_SYSTEM]),
                           self._count([_PROBE_SYSTEM], generation=False))

    def message_tokens(self, message: Message) -> int:
        """What ``message`` adds to a prompt: the server's count of a probe conversation
        with it, less the probe's. A system message is counted alone (BOS included). A
        trailing assistant message would be continued rather than closed (llama.cpp's
        prefill), so one is measured before a probe user message. A template that refuses
        every probe shape, or counts that say the message takes tokens away (said in the
        log), get a text estimate; whole requests stay exact regardless."""
        if message.get("role") == "system":
            return self._count([message], generation=False)
        after = [_PROBE_USER] if message.get("role") == "assistant" else []
        for before in ([_PROBE_SYSTEM], [_PROBE_SYSTEM, _PROBE_USER]):
            try:
                return self._added(self._count([*before, message, *after], generation=False),
                                   self._count([*before, *after], generation=False))
            except NotACount as exc:  # counted as fewer tokens with the message than without
                log.warning("%s; the message's tokens are counted from its text", exc)
                continue
            except ServerRefused as exc:  # the template refuses this shape (alternation
                if not 400 <= exc.status < 500:  # checks); a server down or failing is no
                    raise  # refusal: the count fails, and no estimate takes its name
                continue
        return self.count_text(message_text(message)) + _FALLBACK_FRAMING_TOKENS

    def tool_tokens(self, tools: list[dict]) -> int:
        """What passing ``tools`` adds to a prompt, as the server's template renders them."""
        if not tools:
            return 0
        if not self.conversation_allowed:
            return super().tool_tokens(tools)
        probe = [_PROBE_SYSTEM, _PROBE_USER]
        return self._added(self._count(probe, tools), self._count(probe))

    def _measure(self, messages: list[Message], tools: list[dict] | None) -> tuple[int, int]:
        counted = self.count_prompt(messages, tools)
        return counted, counted

    def _observe(self, reported: int, counted: int) -> None:
        """A server that reports another size than it counted is a bug worth a line."""
        if reported != counted and self.conversation_allowed:
            log.warning("%s: counted %d prompt tokens, the server reported %d",
                        self.where, counted, reported)

    def _room(self, prompt_size: int, max_tokens: int) -> int:
        """As the local model: a prompt that leaves no room is refused before sending."""
        if prompt_size >= self.n_ctx:
            raise PromptTooLongError(prompt_size, self.n_ctx)
        return min(max_tokens, self.n_ctx - prompt_size)



def _choose_model(server: ServerInfo, name: str, address: str) -> str:
    """``name``, or the server's first model when empty. A name the server does not list
    is refused; llama.cpp serves its one model whatever the request names, so that one
    is used (and names the counter)."""
    names = [m.name for m in server.models]
    if server.kind == "llama.cpp" and names:
        return names[0]  # its one model, whatever the settings call it
    if not name:
        if not names:
            raise ServerError(f"{address} lists no model; set model.name")
        return names[0]
    if names and name not in names:
        raise ServerError(f"{address} does not serve {name!r}; it serves: " + _listed(names))
    return name


#: the most model names an error lists (a server listing 100,000 made a 3.5 MB line)
LISTED_NAMES = 10


def _listed(names: list[str]) -> str:
    """The first :data:`LISTED_NAMES` of ``names``, each as a server's words, and how
    many more there are."""
    shown = ", ".join(server_said(n) for n in names[:LISTED_NAMES])
    more = len(names) - LISTED_NAMES
    return shown + (f" and {more:,} more" if more > 0 else "")


def _sampling_extras(kind: str, top_k: int, min_p: float, repeat_penalty: float) -> dict:
    """Sampling fields beyond OpenAI's, for the servers that take them; llama.cpp also
    keeps the prompt's KV cache for the next request (its default, said explicitly).
    DRY stays local: llama.cpp's server runs it over the prompt too, so a path the model
    copies from the question into a tool call came out garbled ("/tmp/pytest-of-root/
    pytest-47/…" with a space), where the local model's DRY sees only the reply."""
    if kind == "llama.cpp":
        return {"top_k": top_k, "min_p": min_p, "repeat_penalty": repeat_penalty,
                "cache_prompt": True}
    if kind == "vllm":  # vLLM says "all" as -1 (before mid-2025 it refused 0)
        return {"top_k": top_k or -1, "min_p": min_p, "repetition_penalty": repeat_penalty}
    return {}
