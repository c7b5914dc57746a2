"""A model behind an OpenAI-compatible server, with the interface of ``LocalModel``.

When the laptop is not enough, Iris talks to a server (llama.cpp's ``llama-server``,
vLLM, Ollama, a hosted OpenAI-compatible API) and keeps the same context engine: the
planner, the meter and the compactor see the same :class:`~.protocol.Runtime` as for the
local model: ``n_ctx``, ``counter()``, ``capabilities``, ``tool_tokens`` and ``stream``,
whose :class:`~.protocol.Generation` carries the statistics the server reported.

What a server tells, probed by :func:`test_connection` and :meth:`RemoteRuntime.connect`:

* **The window.** llama.cpp: ``GET /props`` → ``default_generation_settings.n_ctx`` (a
  slot's context; older servers have a top-level ``n_ctx``). vLLM: ``GET /v1/models`` →
  ``max_model_len``. Ollama: ``POST /api/show`` → ``num_ctx`` in ``parameters``, else the
  loaded model's ``context_length`` in ``GET /api/ps``; never the trained length
  (``model_info["<arch>.context_length"]``, shown for information only), because Ollama
  runs a model with its own default window and silently drops what does not fit.
  Otherwise the caller's fallback, and ``window_source`` says ``"config"``.
* **Exact counts.** llama.cpp counts a chat request with the code that evaluates it:
  ``POST /v1/chat/completions/input_tokens`` in one call, or on older servers
  ``POST /apply-template`` (the prompt text) then ``POST /tokenize`` with
  ``add_special`` and ``parse_special`` (what the completion path does). vLLM counts with
  ``POST /tokenize`` on the messages. Such a server gives an :class:`ExactRemoteRuntime`,
  whose ``count_prompt`` is the ``usage.prompt_tokens`` the server then reports. Every
  other server gives a :class:`RemoteRuntime`, which estimates with tiktoken times a
  factor calibrated from the ``prompt_tokens`` the server reports; it has no
  ``count_prompt``, so the planner never calls its requests exact and the meter says
  "estimated".

Streaming is Server-Sent Events over httpx, read on a helper thread so that Stop, the
deadline and :meth:`RemoteRuntime.close` act within :data:`POLL_S` even while the server
is still evaluating the prompt. Connecting is retried; a reply never is: a connection
lost mid-reply raises :class:`ServerError` after the text that did arrive was yielded.

A server that misbehaves mid-reply cannot hold a turn for good nor fill the memory:

* a reply must start (its headers and its first text) within ``start_timeout_s`` of
  the request, which bounds reading the prompt (llama.cpp sends not even the headers
  until its first token; other servers send them at once, then read), and after that
  new text must come within ``idle_timeout_s`` (``model.stream_idle_timeout_s``) of
  the last: keep-alive comments, blank lines and chunks that carry no text do not
  count;
* a reply the server keeps sending past ``max_tokens`` is cut off there;
* a line longer than :data:`MAX_LINE_BYTES` is refused before it is read whole;
* an event of the wrong shape is named (``'choices' is a string, not a list``), and a
  redirect says where it points (Iris follows none);

each raises :class:`ServerError` after the text that came was yielded. While the server
is silent the stream yields ``""`` every :data:`HEARTBEAT_S`, so the agent saves what
came on its one-second cadence even when no token arrives. A compressed stream is
inflated a step at a time (``runtime.http``), so the line limit holds on what it inflates to.

Nor can it with an answer read whole (the probes, the one-token calibration, the
counts): each is read through ``runtime.http.read_answer``, at most
:data:`MAX_ANSWER_BYTES` (:data:`MAX_COUNT_ANSWER_BYTES` for a count) counted after
decoding, so an endless body or a gzip bomb stops there, and within
:data:`REQUEST_TIMEOUT_S` for the whole exchange, so an answer trickled a byte a second
cannot hold ``connect``; all of a connect's answers together end within
:data:`CONNECT_DEADLINE_S` (:mod:`.deadline`: four slow answers, each within its bound,
held it for 107 s), and the one awaited is said to the caller (``on_wait``) once
connecting takes a while. The ServerError names the server and the cause ("the server at
http://127.0.0.1:8080 sent more than 8 MiB for its model list (/v1/models)…"). Parsed,
an answer holds at most a JSON value per 16 bytes of its cap (8 MiB of ``{}`` took 190
MB) and its text is valid Unicode (a lone surrogate escape becomes U+FFFD, in a stream
too); a ``/tokenize`` answer is bounded by its text (a token a byte, and a few), and a
count beyond that is the server's fault; a model name is at most
:data:`~.probe.MAX_MODEL_NAME` characters. Usage numbers a server reports are believed
only as token counts (whole numbers from 0 to :data:`MAX_REPORTED_TOKENS`; the
calibration also only within :data:`MIN_CALIBRATION_RATIO` to
:data:`MAX_CALIBRATION_RATIO` of the estimate): anything else is ignored with a note in
the log, so a broken report neither breaks a turn nor makes the server unusable
afterwards.

Privacy: every request goes to the base URL's host and nowhere else (proxies from the
environment are ignored), the API key lives in the OS keyring (:func:`get_api_key`),
never in the settings or the log, and :attr:`RemoteRuntime.where`, :func:`is_loopback`
and :func:`privacy_warning` let the UI say where the conversation goes.

The package, one idea a module: :mod:`.address` (the base URL, where it leads, the API
key), :mod:`.transport` (requests, bounded answers, errors in words), :mod:`.probe`
(what a server is), :mod:`.deadline` (a connect's one deadline), :mod:`.counting`
(estimated and exact counts), :mod:`.sse` (a streamed reply, read and checked) and
:mod:`.runtime` (the two runtimes). The names below are the ones used outside it.
"""

from __future__ import annotations

from ..errors import ServerError
from .address import (
    delete_api_key,
    get_api_key,
    is_loopback,
    privacy_warning,
    server_address,
    set_api_key,
)
from .counting import SAFETY_MARGIN, UNCALIBRATED_FACTOR
from .deadline import CONNECT_DEADLINE_S, ConnectCancelled, ConnectExpired
from .probe import ServerInfo, test_connection
from .runtime import ExactRemoteRuntime, RemoteRuntime
from .sse import MAX_LINE_BYTES, MAX_REPORTED_TOKENS, LineTooLong
from .transport import MAX_ANSWER_BYTES

__all__ = [
    "ServerError",
    "ServerInfo",
    "ConnectCancelled",
    "ConnectExpired",
    "RemoteRuntime",
    "ExactRemoteRuntime",
    "test_connection",
    "get_api_key",
    "set_api_key",
    "delete_api_key",
    "server_address",
    "is_loopback",
    "privacy_warning",
    # limits and factors the tests check against
    "CONNECT_DEADLINE_S",
    "LineTooLong",
    "MAX_ANSWER_BYTES",
    "MAX_LINE_BYTES",
    "MAX_REPORTED_TOKENS",
    "SAFETY_MARGIN",
    "UNCALIBRATED_FACTOR",
]
