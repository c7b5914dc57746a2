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

Nor can it with an answer read whole (the probes, the one-token calibration, the counts):
each is read through ``runtime.http.read_answer``, at most :data:`MAX_ANSWER_BYTES`
(:data:`MAX_COUNT_ANSWER_BYTES` for a count) counted after decoding, so an endless body
or a gzip bomb stops there, and within :data:`REQUEST_TIMEOUT_S` for the whole exchange,
so an answer trickled a byte a second cannot hold ``connect``; the ServerError names the
server and the cause ("the server at http://127.0.0.1:8080 sent more than 8 MiB for its
model list (/v1/models)…"). Usage numbers a server reports are believed only as token
counts (whole numbers from 0 to :data:`MAX_REPORTED_TOKENS`; the calibration also only
within :data:`MIN_CALIBRATION_RATIO` to :data:`MAX_CALIBRATION_RATIO` of the estimate):
anything else is ignored with a note in the log, so a broken report neither breaks a
turn nor makes the server unusable afterwards.

Privacy: every request goes to the base URL's host and nowhere else (proxies from the
environment are ignored), the API key lives in the OS keyring (:func:`get_api_key`),
never in the settings or the log, and :attr:`RemoteRuntime.where`, :func:`is_loopback`
and :func:`privacy_warning` let the UI say where the conversation goes.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import math
import queue
import re
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import httpx

from iris_desktop.stop import Stop
from iris_desktop.tokens import Message, continues_reply, message_text, shared_tiktoken

from .http import (
    AnswerError,
    AnswerTooLarge,
    AnswerTooSlow,
    AnswerUndecodable,
    decoded_chunks,
    read_answer,
    size_words,
)
from .model import PromptTooLongError
from .protocol import (
    Capabilities,
    Generation,
    GenerationStats,
    KVState,
    ModelFacts,
    Prefill,
    Unsupported,
)

log = logging.getLogger("iris.runtime.remote")

__all__ = [
    "ServerError",
    "ServerModel",
    "ServerInfo",
    "RemoteRuntime",
    "ExactRemoteRuntime",
    "ServerTokenCounter",
    "EstimatedTokenCounter",
    "RemoteModelInfo",
    "test_connection",
    "get_api_key",
    "set_api_key",
    "delete_api_key",
    "server_address",
    "is_loopback",
    "privacy_warning",
]

#: the keyring service; the user name is the server's ``host:port``
KEYRING_SERVICE = "iris-desktop"
CONNECT_TIMEOUT_S = 5.0
#: a refused or timed-out connect is tried again this many times (a reply never is)
CONNECT_RETRIES = 2
#: a probe or a count may take this long, the whole exchange (connecting, headers, body)
REQUEST_TIMEOUT_S = 30.0
#: the most an answer read whole (a probe, a model list, the calibration) may hold, counted
#: after decoding (a gzip body is inflated a step at a time, so a gzip bomb stops here)
MAX_ANSWER_BYTES = 8 << 20
#: the same for a count's answer, which grows with the prompt (``/tokenize`` lists every
#: token, ``/apply-template`` returns the whole prompt)
MAX_COUNT_ANSWER_BYTES = 64 << 20
#: a token count a server reports is believed up to this; more, a negative number or a
#: fraction is a broken server's, ignored (with a note in the log)
MAX_REPORTED_TOKENS = 10**9
#: a reported/estimated ratio outside these is a broken report, not a tokenizer (no chat
#: model's tokenizer splits text into four times as many tokens as cl100k, or a quarter)
MIN_CALIBRATION_RATIO = 0.25
MAX_CALIBRATION_RATIO = 4.0
#: a reply must start, its headers and its first text, within this long of the request
#: (or the idle limit, if that is longer): the server is reading the prompt, and
#: llama.cpp sends nothing, not even the headers, until its first token
START_TIMEOUT_S = 600.0
#: a reply ends when no new text came for this long after its first (the default of
#: ``model.stream_idle_timeout_s``); keep-alives and empty chunks do not count
STREAM_IDLE_TIMEOUT_S = 60.0
#: the longest line a stream may send (one event is a few hundred bytes; a reply's whole
#: text in one event, 32,768 tokens of it, fits too)
MAX_LINE_BYTES = 1 << 20
#: lines read ahead of the caller at most
QUEUE_LINES = 1024
#: text chunks a reply may stream per token of its ``max_tokens`` (llama.cpp can send a
#: token's content and a tool call's start as separate chunks), plus a few
CHUNKS_PER_TOKEN = 2
CHUNK_SLACK = 16
#: characters a reply may stream per token of its ``max_tokens`` (no tokenizer has longer
#: tokens than this)
CHARS_PER_TOKEN = 64
#: how often a waiting stream checks Stop, the deadline and close
POLL_S = 0.1
#: a silent stream yields "" this often, so that the caller can save what came
HEARTBEAT_S = POLL_S
#: server counts kept per runtime (each one cost an HTTP request)
COUNT_CACHE_SIZE = 4096
#: how exact counts are made; part of the counter's name, so counts the store cached
#: under an older scheme are never mixed in
COUNT_SCHEME = 1
#: before a server has reported any prompt_tokens: tiktoken under-counts gemma's
#: tokenizer by 17.3% on the SWE-agent transcripts (docs/context-engine.md)
UNCALIBRATED_FACTOR = 1.25
#: on top of the largest reported/estimated ratio seen
SAFETY_MARGIN = 0.05
#: a prompt estimated below this does not calibrate (its per-message framing dominates)
MIN_CALIBRATION_TOKENS = 64
#: what a template wraps around tool definitions (Qwen2.5's: about 90 cl100k tokens)
TOOL_FRAMING_TOKENS = 128
#: a message's role marker and separators, when a template refuses every probe shape
_FALLBACK_FRAMING_TOKENS = 4

#: probe messages for measuring what one message or the tools add to a prompt
_PROBE_SYSTEM: Message = {"role": "system", "content": "."}
_PROBE_USER: Message = {"role": "user", "content": "."}
#: sent once when connecting to a server that cannot count, to calibrate the estimate
#: before the first reply (prose, code, numbers and non-English text, as chats have)
_CALIBRATION_TEXT = (
    "Could you look at this function before Friday's release? It parses the 2024-03-14 "
    "invoices (1,284 rows, €12,950.40 in total) and fails on rows like 'ACME GmbH; 19%'.\n"
    "```python\ndef parse(row: str) -> dict[str, float]:\n    name, rate = row.split(';')\n"
    "    return {name.strip(): float(rate.strip().rstrip('%')) / 100}\n```\n"
    "Der Kunde möchte außerdem eine Übersicht pro Quartal; 顧客は四半期ごとの概要も希望しています。"
)


class ServerError(RuntimeError):
    """The server cannot be used, or a request to it failed. The message names the
    server (``host:port``) and says why; it never contains the API key."""


# ---------------------------------------------------------------------------
# where the conversation goes, and the key it goes with


def _split(base_url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of ``base_url``; raises ValueError for anything but an
    http(s) URL with a host."""
    parts = urlsplit(base_url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not a server address: {base_url!r} (expected http://host:port "
                         f"or https://host)")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ValueError(f"not a server address: {base_url!r} (bad port)") from None
    return parts.scheme, parts.hostname.lower(), port


def server_address(base_url: str) -> str:
    """``host:port`` of ``base_url`` (``[::1]:8080`` for IPv6), the default port filled in:
    the key the API key is kept under, and the name the UI shows."""
    _, host, port = _split(base_url)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_loopback(base_url: str) -> bool:
    """The server is on this machine: ``localhost``, 127.0.0.0/8 or ::1."""
    host = _split(base_url)[1]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost
        return False


def privacy_warning(base_url: str) -> str | None:
    """What the UI must say before sending to ``base_url``, or None: plain ``http://`` to
    another machine carries the conversation and the key unencrypted."""
    scheme = _split(base_url)[0]
    if scheme == "https" or is_loopback(base_url):
        return None
    return (f"{server_address(base_url)} is reached over plain http: your conversation and "
            f"API key cross the network unencrypted. Use https:// unless this network is "
            f"yours alone.")


def get_api_key(base_url: str) -> str | None:
    """The API key saved for ``base_url``'s server; None when there is none, or when this
    system has no usable keyring (said in the log)."""
    import keyring
    from keyring.errors import KeyringError, NoKeyringError

    try:
        return keyring.get_password(KEYRING_SERVICE, server_address(base_url))
    except NoKeyringError as exc:  # a headless system: no key could have been saved either
        log.info("keyring: none on this system, so no API key for %s: %s",
                 server_address(base_url), exc)
        return None
    except KeyringError as exc:
        log.warning("keyring: cannot read the API key for %s: %s",
                    server_address(base_url), exc)
        return None


def set_api_key(base_url: str, key: str) -> None:
    """Save ``key`` for ``base_url``'s server in the OS keyring (an empty key deletes it).
    Raises keyring.errors.KeyringError when the keyring refuses."""
    import keyring

    if not key:
        delete_api_key(base_url)
        return
    keyring.set_password(KEYRING_SERVICE, server_address(base_url), key)


def delete_api_key(base_url: str) -> None:
    """Forget the API key of ``base_url``'s server (nothing saved: nothing to do)."""
    import keyring
    from keyring.errors import PasswordDeleteError

    try:
        keyring.delete_password(KEYRING_SERVICE, server_address(base_url))
    except PasswordDeleteError:
        pass


# ---------------------------------------------------------------------------
# HTTP


class _Http:
    """Every request to one server: to the base URL's host only (``trust_env=False``: no
    proxy or .netrc from the environment), with the API key as a bearer token, and
    connects retried (httpx retries connect errors only, never a request in flight).

    ``root`` is the base URL without a trailing ``/v1``, so ``http://host:8080`` and
    ``http://host:8080/v1`` both work; paths are absolute from it (``/v1/models``,
    ``/props``). Streams get a client without keep-alive: each opens its own connection,
    whose socket :class:`_EventReader` can shut down.

    An answer read whole (:meth:`get`, :meth:`post`) is bounded by ``answer_limit``
    decoded bytes (None: :data:`MAX_ANSWER_BYTES`, :data:`MAX_COUNT_ANSWER_BYTES` for a
    count) and ``answer_timeout_s`` for the whole exchange (``runtime.http``).
    """

    def __init__(self, base_url: str, api_key: str | None, *, answer_limit: int | None = None,
                 answer_timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.address = server_address(base_url)
        root = base_url.strip().rstrip("/")
        self.root = root[:-3] if root.endswith("/v1") else root
        self.answer_limit = answer_limit
        self.answer_timeout_s = float(answer_timeout_s)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(
            headers=headers, trust_env=False,
            timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
            transport=httpx.HTTPTransport(retries=CONNECT_RETRIES))
        self.streams = httpx.Client(
            headers=headers, trust_env=False,
            # no read timeout: the caller bounds a stream by the clock (_EventReader)
            timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S),
            transport=httpx.HTTPTransport(
                retries=CONNECT_RETRIES, limits=httpx.Limits(max_keepalive_connections=0)))

    def url(self, path: str) -> str:
        return self.root + path

    def get(self, path: str, *, missing_ok: bool = False) -> Any:
        return self._send("GET", path, None, missing_ok)

    def post(self, path: str, body: dict, *, missing_ok: bool = False) -> Any:
        return self._send("POST", path, body, missing_ok)

    def _send(self, method: str, path: str, body: dict | None, missing_ok: bool) -> Any:
        """The JSON answer; None for an endpoint this server does not have (404, 405,
        501) when ``missing_ok``. Raises ServerError (PromptTooLongError for a prompt the
        server says does not fit)."""
        limit = self.answer_limit or (MAX_COUNT_ANSWER_BYTES if path in _COUNT_PATHS
                                      else MAX_ANSWER_BYTES)
        try:
            request = self.client.build_request(method, self.url(path), json=body)
            response = read_answer(self.client, request, limit=limit,
                                   timeout_s=self.answer_timeout_s)
        except AnswerError as exc:
            raise ServerError(self._bound_error(exc, path)) from None
        except httpx.HTTPError as exc:
            raise ServerError(f"{self.address}: {_describe(exc)}") from None
        if missing_ok and response.status_code in (404, 405, 501):
            return None
        if response.status_code >= 300:
            raise _http_error(self.address, response, path)
        try:
            return response.json()
        except ValueError:
            raise ServerError(f"{self.address}: {path} did not answer JSON") from None

    def _bound_error(self, exc: AnswerError, path: str) -> str:
        """One sentence naming the server and the bound its answer to ``path`` broke."""
        what = f"{_ANSWERS.get(path, 'its answer')} ({path})"
        server = f"the server at {self.root}"
        if isinstance(exc, AnswerTooLarge):
            return (f"{server} sent more than {size_words(exc.limit)} for {what}, so Iris stopped "
                    f"reading it; check that model.base_url is a model server")
        if isinstance(exc, AnswerTooSlow):
            return (f"{server} did not finish answering {path} within {exc.timeout_s:g} s, so "
                    f"Iris gave up on it; check that the server is running and not overloaded")
        return f"{server} {exc.cause} for {what}"

    def close(self) -> None:
        self.client.close()
        self.streams.close()


#: what each answer read whole is, for the errors that name it
_ANSWERS = {
    "/v1/models": "its model list",
    "/props": "its properties",
    "/api/version": "its version",
    "/api/ps": "its running models",
    "/api/show": "a model's description",
    "/v1/chat/completions": "a one-token reply",
    "/v1/chat/completions/input_tokens": "a token count",
    "/tokenize": "a token count",
    "/apply-template": "a templated prompt",
}
#: the answers that grow with the prompt counted
_COUNT_PATHS = frozenset({"/v1/chat/completions/input_tokens", "/tokenize", "/apply-template"})


def _describe(exc: httpx.HTTPError) -> str:
    """What went wrong on the way to the server, in words (the OS's text in brackets)."""
    text = str(exc)
    if isinstance(exc, httpx.ConnectError):
        if "refused" in text.lower():
            return ("nothing answers at that address (connection refused); check that the "
                    "server is running and the address and port are right")
        if "name or service not known" in text.lower() or "nodename nor servname" in text.lower() \
                or "getaddrinfo" in text.lower():
            return f"the host name cannot be found; check the address ({text})"
        return f"cannot connect ({text})"
    if isinstance(exc, httpx.TimeoutException):
        return "the server did not answer in time; check that it is running and not overloaded"
    if isinstance(exc, httpx.RemoteProtocolError):
        return f"the server broke off the connection or answered something that is not HTTP ({text})"
    return f"{type(exc).__name__}: {text}"


def _http_error(address: str, response: httpx.Response, path: str = "") -> Exception:
    """The exception for an error answer: PromptTooLongError when llama.cpp says the
    prompt exceeds the context (it gives both numbers), a ServerError saying where a
    redirect points (Iris follows none), else ServerError with the server's own
    message. ``path``: what was asked, from the base URL (``/props``)."""
    if 300 <= response.status_code < 400:
        return _redirect_error(address, response, path or response.request.url.path)
    try:
        answer = response.json()
    except ValueError:
        answer = {}
    # llama.cpp and OpenAI nest {"error": {...}}; vLLM puts "message" at the top
    error = (answer.get("error") or answer) if isinstance(answer, dict) else {}
    if not isinstance(error, dict):
        error = {"message": str(error)}
    if error.get("type") == "exceed_context_size_error" and "n_ctx" in error:
        return PromptTooLongError(int(error.get("n_prompt_tokens", 0)), int(error["n_ctx"]))
    if response.status_code in (401, 403):
        return ServerError(f"{address} refused the API key (HTTP {response.status_code})")
    message = error.get("message") or response.text[:300] or response.reason_phrase
    return ServerError(f"{address}: HTTP {response.status_code}: {message}")


def _redirect_error(address: str, response: httpx.Response, path: str) -> ServerError:
    """A redirect of ``path`` (from the base URL), said with its target and the address
    to set instead: following one could carry the conversation and the API key to
    another host."""
    location = response.headers.get("location", "").strip()
    if not location:
        return ServerError(f"{address} redirected {path} (HTTP {response.status_code}) without "
                           f"saying where; Iris does not follow redirects, so set "
                           f"model.base_url to the server's final address")
    target = str(response.request.url.join(location))
    final = target.split("?", 1)[0].split("#", 1)[0]
    suggestion = f"{final[:-len(path)]}/v1" if path and final.endswith(path) else None
    return ServerError(f"{address} redirected {path} to {target}; Iris does not follow "
                       f"redirects, so set model.base_url to the final address"
                       + (f" ({suggestion})" if suggestion else ""))


# ---------------------------------------------------------------------------
# what the server is


@dataclass(frozen=True)
class ServerModel:
    """A model a server offers. ``context_length``: the window the server runs it with,
    when the server says (None: it does not); ``trained_length``: what the model was
    trained for (information only)."""

    name: str
    context_length: int | None = None
    trained_length: int | None = None


@dataclass(frozen=True)
class ServerInfo:
    """What :func:`test_connection` learned. ``kind``: ``llama.cpp`` | ``vllm`` |
    ``ollama`` | ``openai`` (any other OpenAI-compatible server); ``counting``:
    ``input_tokens`` | ``apply-template`` | ``vllm-tokenize`` (exact) or ``estimated``."""

    base_url: str
    kind: str
    models: tuple[ServerModel, ...]
    counting: str
    #: what identifies the tokenizer and template besides the model's name (llama.cpp:
    #: a hash of its chat template and model meta), so that another GGUF served under
    #: the same name gets another counter name; "" when the server says nothing of it
    fingerprint: str = ""

    @property
    def exact_counts(self) -> bool:
        return self.counting != "estimated"

    def model(self, name: str) -> ServerModel | None:
        """The model ``name`` is served as; llama.cpp serves its one model whatever the
        request names."""
        for entry in self.models:
            if entry.name == name:
                return entry
        return self.models[0] if self.kind == "llama.cpp" and self.models else None

    def describe(self) -> list[str]:
        """Lines for the "Test connection" result."""
        counts = ("exact (the server's tokenizer and template)" if self.exact_counts
                  else "estimated (tiktoken, calibrated from what the server reports)")
        lines = [f"{self.kind} server at {server_address(self.base_url)}; counts: {counts}"]
        for m in self.models:
            window = (f"{m.context_length:,} tokens" if m.context_length
                      else "window not reported (context.window is used)")
            trained = f", trained for {m.trained_length:,}" if m.trained_length else ""
            lines.append(f"  {m.name}: {window}{trained}")
        return lines


def test_connection(base_url: str, api_key: str | None = None, *,
                    answer_limit_bytes: int | None = None,
                    answer_timeout_s: float = REQUEST_TIMEOUT_S) -> ServerInfo:
    """Probe ``base_url``: what kind of server it is, the models it offers with their
    windows, and whether it can count prompts exactly. Sends nothing of a conversation.
    Each answer is bounded as :class:`_Http` says (``answer_limit_bytes``,
    ``answer_timeout_s``). Raises ServerError (unreachable, key refused, an answer too
    large or too slow) or ValueError (not a URL)."""
    http = _Http(base_url, api_key, answer_limit=answer_limit_bytes,
                 answer_timeout_s=answer_timeout_s)
    try:
        return _probe(http, base_url)
    finally:
        http.close()


def _probe(http: _Http, base_url: str, only: str | None = None) -> ServerInfo:
    """ServerInfo for the server behind ``http``; ``only``: look up just this model's
    window (Ollama asks once per model)."""
    props = http.get("/props", missing_ok=True)
    listed = http.get("/v1/models", missing_ok=True)
    listed = listed if isinstance(listed, dict) else {}
    entries = listed.get("data")
    data = [d for d in (entries if isinstance(entries, list) else [])
            if isinstance(d, dict) and isinstance(d.get("id"), str) and d["id"]]
    if isinstance(props, dict) and "default_generation_settings" in props:
        identity = [props.get("chat_template"), data[0].get("meta") if data else None]
        fingerprint = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
        return ServerInfo(base_url, "llama.cpp", _llama_cpp_models(props, data),
                          _llama_cpp_counting(http), fingerprint[:12])
    if props is None and http.get("/api/version", missing_ok=True) is not None:
        names = [only] if only else [d["id"] for d in data]
        return ServerInfo(base_url, "ollama", _ollama_models(http, names), "estimated")
    if not listed:
        raise ServerError(f"{http.address}: no OpenAI-compatible API here (GET /v1/models "
                          f"found nothing)")
    models = tuple(ServerModel(d["id"], _context_field(d)) for d in data)
    if any(d.get("owned_by") == "vllm" for d in data):
        counting = "vllm-tokenize" if _vllm_counts(http, data[0]["id"]) else "estimated"
        return ServerInfo(base_url, "vllm", models, counting)
    return ServerInfo(base_url, "openai", models, "estimated")


def _llama_cpp_models(props: dict, data: list[dict]) -> tuple[ServerModel, ...]:
    """llama.cpp's one model: its window from ``/props`` (newer servers nest it in
    ``default_generation_settings``), its trained length from ``/v1/models`` meta."""
    settings = _obj(props.get("default_generation_settings"))
    window = _whole(settings.get("n_ctx")) or _whole(props.get("n_ctx"))
    meta = _obj(data[0].get("meta")) if data else {}
    name = (data[0]["id"] if data else None) or props.get("model_alias") or "default"
    return (ServerModel(str(name), window, _whole(meta.get("n_ctx_train"))),)


def _obj(value: Any) -> dict:
    """``value`` when it is a JSON object, else {} (a description field of another shape
    is as good as absent)."""
    return value if isinstance(value, dict) else {}


def _whole(value: Any) -> int | None:
    """``value`` when it is a positive whole number, else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _answer_field(answer: Any, key: str, wanted: type, address: str, path: str) -> Any:
    """``answer[key]`` when it is a ``wanted``; else ServerError saying what is wrong."""
    if not isinstance(answer, dict):
        what = f"the answer is {_kind(answer)}, not an object"
    else:
        value = answer.get(key)
        if isinstance(value, wanted) and not isinstance(value, bool):
            return value
        what = f"'{key}' is missing" if value is None else (
            f"'{key}' is {_kind(value)}, not {_WANTED[wanted]}")
    raise ServerError(f"{address} answered {path} in a way Iris cannot read: {what}")


def _llama_cpp_counting(http: _Http) -> str:
    """How this llama.cpp server counts a chat request, from the newest way it has."""
    probe = {"messages": [_PROBE_SYSTEM, _PROBE_USER]}
    if http.post("/v1/chat/completions/input_tokens", probe, missing_ok=True) is not None:
        return "input_tokens"
    if http.post("/apply-template", probe, missing_ok=True) is not None:
        return "apply-template"
    return "estimated"


def _vllm_counts(http: _Http, model: str) -> bool:
    probe = {"model": model, "messages": [_PROBE_SYSTEM, _PROBE_USER]}
    answer = http.post("/tokenize", probe, missing_ok=True)
    return isinstance(answer, dict) and "count" in answer


def _context_field(entry: dict) -> int | None:
    """The window a ``/v1/models`` entry states: vLLM's ``max_model_len``, llama.cpp's
    ``meta.n_ctx``, or the ``context_length`` / ``context_window`` other servers use."""
    meta = entry.get("meta") if isinstance(entry.get("meta"), dict) else {}
    for value in (entry.get("max_model_len"), meta.get("n_ctx"),
                  entry.get("context_length"), entry.get("context_window")):
        if isinstance(value, int) and value > 0:
            return value
    return None


def _ollama_models(http: _Http, names: list[str]) -> tuple[ServerModel, ...]:
    """Ollama's window per model: ``num_ctx`` from the model's parameters, else what the
    loaded model runs with (``/api/ps``); the trained length is information only."""
    loaded = _obj(http.get("/api/ps", missing_ok=True)).get("models")
    running = {}
    for entry in loaded if isinstance(loaded, list) else []:
        entry = _obj(entry)
        key = entry.get("name") or entry.get("model")
        if isinstance(key, str):
            running[key] = _whole(entry.get("context_length"))
    models = []
    for name in names:
        shown = _obj(http.post("/api/show", {"model": name}, missing_ok=True))
        info = _obj(shown.get("model_info"))
        trained = _whole(info.get(f"{info.get('general.architecture')}.context_length"))
        parameters = shown.get("parameters")
        window = _num_ctx(parameters if isinstance(parameters, str) else "") or running.get(name)
        models.append(ServerModel(name, window, trained))
    return tuple(models)


def _num_ctx(parameters: str) -> int | None:
    """``num_ctx`` from Ollama's parameters text (one ``name value`` per line)."""
    for line in parameters.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "num_ctx" and parts[1].isdigit():
            return int(parts[1])
    return None


# ---------------------------------------------------------------------------
# counting


class _LRU:
    """A small thread-safe cache of counts (the DB thread plans while the model thread
    streams). It keeps a digest of each key, not the key: a key can be a whole request."""

    def __init__(self, size: int = COUNT_CACHE_SIZE) -> None:
        self._data: OrderedDict[bytes, int] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, text: str, compute: Callable[[], int]) -> int:
        key = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return self._data[key]
        value = compute()  # outside the lock: an HTTP request
        with self._lock:
            self._data[key] = value
            while len(self._data) > self._size:
                self._data.popitem(last=False)
        return value


class _Calibration:
    """The largest ratio of reported to estimated prompt tokens seen per server and model,
    kept for the life of the process (a reconnect starts from what was learned)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ratios: dict[str, float] = {}

    def factor(self, key: str) -> float:
        """The estimate's multiplier: the largest ratio plus the margin, rounded up to a
        multiple of 0.05 (so that the counter's name, and the store's cached counts with
        it, change only in steps); UNCALIBRATED_FACTOR before any report."""
        with self._lock:
            ratio = self._ratios.get(key)
        if ratio is None:
            return UNCALIBRATED_FACTOR
        return math.ceil(ratio * (1 + SAFETY_MARGIN) * 20 - 1e-9) / 20

    def known(self, key: str) -> bool:
        with self._lock:
            return key in self._ratios

    def observe(self, key: str, reported: int, estimated: int) -> None:
        if estimated < MIN_CALIBRATION_TOKENS or reported <= 0:
            return
        if not MIN_CALIBRATION_RATIO <= reported / estimated <= MAX_CALIBRATION_RATIO:
            # a broken report would make every prompt look too large (or too small) for good
            log.warning("%s: ignored a report of %d prompt tokens for about %d estimated "
                        "(not a tokenizer's count: beyond %g to %g times as many)", key, reported,
                        estimated, MIN_CALIBRATION_RATIO, MAX_CALIBRATION_RATIO)
            return
        with self._lock:
            self._ratios[key] = max(self._ratios.get(key, 0.0), reported / estimated)


_calibration = _Calibration()


class EstimatedTokenCounter:
    """tiktoken's cl100k count times a server's calibrated factor
    (``iris_desktop.tokens.TokenCounter``), for servers that cannot count. ``exact`` is False and
    the name says ``estimated`` and the factor, so counts cached with another factor are
    never reused."""

    exact = False

    def __init__(self, base: Any, factor: float, name: str) -> None:
        self._base = base
        self.factor = factor
        self.name = name

    def count_text(self, text: str) -> int:
        return math.ceil(self._base.count_text(text) * self.factor)

    def count_message(self, message: Message) -> int:
        return math.ceil(self._base.count_message(message) * self.factor)

    def prompt_overhead(self) -> int:
        return math.ceil(self._base.prompt_overhead() * self.factor)

    def __repr__(self) -> str:
        return f"<EstimatedTokenCounter {self.name}>"


class ServerTokenCounter:
    """Counts with the server's own tokenizer and chat template
    (``iris_desktop.tokens.TokenCounter``). A message's count is what it adds to a probe
    conversation, so ``exact`` is False as for a local Jinja template; the planner
    counts every whole request with :meth:`ExactRemoteRuntime.count_prompt`, which is
    exact. Nothing is cached here (the runtime caches server answers, the store caches
    per message and counter name)."""

    exact = False

    def __init__(self, runtime: ExactRemoteRuntime) -> None:
        self._runtime = runtime
        self.name = runtime.counter_name

    def count_text(self, text: str) -> int:
        return self._runtime.count_text(text)

    def count_message(self, message: Message) -> int:
        return self._runtime.message_tokens(message)

    def prompt_overhead(self) -> int:
        return self._runtime.prompt_overhead()

    def __repr__(self) -> str:
        return f"<ServerTokenCounter {self.name}>"


# ---------------------------------------------------------------------------
# streaming


class LineTooLong(ValueError):
    """A stream's line grew past its limit before it ended."""


_LINE_END = re.compile(rb"\r\n|\r|\n")


def _sse_lines(chunks: Iterable[bytes], limit: int = MAX_LINE_BYTES) -> Iterator[str]:
    """The lines of an event stream (ended by CRLF, CR or LF, as SSE allows), decoded as
    UTF-8. Raises LineTooLong as soon as a line exceeds ``limit`` bytes: no more than
    ``limit`` and one chunk is ever held."""
    buffer = bytearray()
    for chunk in chunks:
        buffer += chunk
        start = 0
        while True:
            found = _LINE_END.search(buffer, start)
            # a CR at the end may be the first half of a CRLF: wait for the next chunk
            if found is None or (found.group() == b"\r" and found.end() == len(buffer)):
                break
            if found.start() - start > limit:
                raise LineTooLong(found.start() - start)
            yield buffer[start:found.start()].decode("utf-8", "replace")
            start = found.end()
        del buffer[:start]
        if len(buffer) - buffer.endswith(b"\r") > limit:
            raise LineTooLong(len(buffer))
    for line in _LINE_END.split(bytes(buffer)) if buffer else ():
        if line:  # the last line, which the stream ended without a line end
            yield line.decode("utf-8", "replace")


class _EventReader:
    """One streamed response, read line by line on a helper thread into a queue.

    A thread because httpx cannot give up a blocked read and resume it, and a server
    evaluating a long prompt sends nothing for a long time (llama.cpp not even the
    headers). The caller waits on the queue :data:`POLL_S` at a time and checks Stop and
    its time limits in between. :meth:`abort` shuts the request's socket down (captured
    through httpcore's ``trace`` extension when it connects): that wakes the blocked
    read, which closing does not, and the server sees its client leave and stops
    generating. The queue is bounded and so is a line (:data:`MAX_LINE_BYTES`), so a
    server cannot make it hold more than that.
    """

    _END = object()

    def __init__(self, client: httpx.Client, url: str, body: dict, address: str) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(QUEUE_LINES)
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._aborted = threading.Event()
        self._address = address
        #: the caller stopped the stream (Stop, the deadline, close)
        self.stopped = False
        #: ``time.monotonic()`` when the response headers came (None: not yet)
        self.answered_at: float | None = None
        self._thread = threading.Thread(target=self._read, args=(client, url, body),
                                        name="iris-remote-stream", daemon=True)
        self._thread.start()

    def _trace(self, event: str, info: dict) -> None:
        # over TLS the TLS socket replaces the TCP one (which it detaches)
        if event in ("connection.connect_tcp.complete", "connection.start_tls.complete") \
                and info.get("return_value"):
            with self._lock:
                self._socket = info["return_value"].get_extra_info("socket")
            if self._aborted.is_set():
                self._shutdown()

    def _put(self, item: Any) -> bool:
        """Queue ``item`` for the caller, waiting while the queue is full; False once
        the caller has gone."""
        while not self._aborted.is_set():
            try:
                self._queue.put(item, timeout=POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _read(self, client: httpx.Client, url: str, body: dict) -> None:
        try:
            # identity: a compressed stream could inflate past the line limit unseen
            with client.stream("POST", url, json=body, headers={"Accept-Encoding": "identity"},
                               extensions={"trace": self._trace}) as response:
                self.answered_at = time.monotonic()
                if response.status_code != 200:
                    self._put(_http_error(self._address, _read_some(response),
                                          "/v1/chat/completions"))
                    return
                try:
                    # decoded here a step at a time: a compressed line cannot balloon unseen
                    for line in _sse_lines(decoded_chunks(response)):
                        if not self._put((time.monotonic(), line)):
                            return
                except LineTooLong:
                    self._put(ServerError(
                        f"{self._address} sent a line longer than {MAX_LINE_BYTES >> 20} MiB "
                        f"in its reply, which Iris does not read, so the reply was cut off there"))
                    return
                except AnswerUndecodable as exc:
                    self._put(ServerError(f"{self._address} {exc.cause} in its reply, so the "
                                          f"reply was cut off there"))
                    return
            self._put(self._END)
        except Exception as exc:  # handed to the caller, who raises it (or has stopped)
            self._put(exc)

    def events(self, should_stop: Callable[[], bool]) -> Iterator[tuple[dict | None, float]]:
        """``(event, when)``: the JSON events of the stream until ``data: [DONE]`` or its
        end, with the ``time.monotonic()`` their line arrived (so that a caller that was
        busy judges the server by when it sent, not by when it was read); and ``(None,
        when)`` for every wait of :data:`POLL_S` that brought nothing (then: now) and
        every line that is not an event (a keep-alive comment, a blank line, an
        ``event:`` or ``id:`` field), so that the caller can check its time limits.
        Stops quietly (``stopped``) as soon as ``should_stop()``. Raises ServerError for
        an error event, a malformed one or a failed connection, PromptTooLongError for a
        prompt the server refuses as too long."""
        while True:
            try:
                item = self._queue.get(timeout=POLL_S)
            except queue.Empty:
                item = None
            if should_stop():
                self.stopped = True
                return
            if item is self._END:
                return
            if isinstance(item, PromptTooLongError | ServerError):
                raise item
            if isinstance(item, Exception):
                why = _describe(item) if isinstance(item, httpx.HTTPError) else repr(item)
                raise ServerError(f"{self._address}: the connection was lost mid-reply "
                                  f"({why})") from item
            if item is None:
                yield None, time.monotonic()
                continue
            when, line = item
            if not line.startswith("data:"):
                yield None, when
                continue
            event = _parse_data(line[5:].strip(), self._address)
            if event is None:
                return
            yield event, when

    def abort(self) -> None:
        self._aborted.set()
        self._shutdown()

    def _shutdown(self) -> None:
        with self._lock:
            sock = self._socket
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed
                pass


def _read_some(response: httpx.Response, limit: int = 1 << 16) -> httpx.Response:
    """``response`` with at most ``limit`` bytes of its body read (an error answer is
    read for its message; a server cannot make that hold more)."""
    data = bytearray()
    try:
        for chunk in decoded_chunks(response):
            data += chunk
            if len(data) >= limit:
                break
    except AnswerUndecodable:
        pass  # the status alone says enough
    headers = {k: v for k, v in response.headers.items()
               if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")}
    return httpx.Response(response.status_code, headers=headers, content=bytes(data[:limit]),
                          request=response.request)


def _unreadable(address: str, what: str) -> ServerError:
    return ServerError(f"{address} sent a reply Iris cannot read: {what}")


def _parse_data(payload: str, address: str) -> dict | None:
    """The JSON object of one ``data:`` field; None for ``[DONE]``. Raises ServerError for
    an error event (llama.cpp sends ``data: {"error": ...}`` once the stream has begun)
    and for anything but a JSON object."""
    if payload == "[DONE]":
        return None
    try:
        event = json.loads(payload)
    except ValueError:
        raise _unreadable(address, f"an event is not JSON ({payload[:80]!r})") from None
    if isinstance(event, dict) and event.get("error"):
        error = event["error"]
        message = error.get("message") if isinstance(error, dict) else str(error)
        raise ServerError(f"{address}: the server failed mid-reply: {message}")
    if not isinstance(event, dict):
        raise _unreadable(address, f"an event is {_kind(event)}, not an object")
    return event


_KINDS = {dict: "an object", list: "a list", str: "a string", bool: "true or false",
          int: "a number", float: "a number", type(None): "null"}
_WANTED = {dict: "an object", list: "a list", str: "a string", int: "a whole number"}


def _kind(value: Any) -> str:
    """What a JSON value is, in words ("a string")."""
    return _KINDS.get(type(value), type(value).__name__)


def _field(value: Any, wanted: type, what: str, address: str) -> Any:
    """``value`` when it is None (absent) or a ``wanted``; else ServerError naming the
    field ``what`` and what it is instead."""
    if value is None or (isinstance(value, wanted) and not isinstance(value, bool)):
        return value
    raise _unreadable(address, f"{what} is {_kind(value)}, not {_WANTED[wanted]}")


def _number(value: Any, default: Any = 0, kind: type = int) -> Any:
    """``value`` as ``kind`` when it is a JSON number, else ``default``."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return kind(value)
    return default


def _tokens(value: Any, what: str, address: str) -> int | None:
    """A token count the server reported, when it is one: a whole number from 0 to
    :data:`MAX_REPORTED_TOKENS` (``12.0`` counts as 12). Anything else (a negative or
    absurdly large number, a fraction, a string) is ignored with a note in the log: a
    broken report must not break the turn, the store or the next request."""
    if value is None:
        return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_REPORTED_TOKENS:
        return value
    log.warning("%s reported %s = %.80r, which is not a token count; ignored", address, what, value)
    return None


def _rate(value: Any, address: str) -> float:
    """A tokens-per-second figure the server reported (0.0: none usable)."""
    if value is None:
        return 0.0
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) \
            and 0 <= value <= MAX_REPORTED_TOKENS:
        return float(value)
    log.warning("%s reported predicted_per_second = %.80r; ignored", address, value)
    return 0.0


class _Reply:
    """What a streamed reply has told so far: text, tool calls, usage, timings. A field
    of the wrong shape raises ServerError naming it (``address`` says whose)."""

    def __init__(self, started: float, address: str = "the server") -> None:
        self.started = started
        self.address = address
        self.first: float | None = None
        self.last: float | None = None
        self.pieces = 0
        #: chunks that carried something new (text, reasoning, a tool call's part)
        self.chunks = 0
        self.chars = 0
        self.usage: dict = {}
        self.timings: dict = {}
        self.finish_reason: str | None = None
        self.calls: dict[int, dict[str, str]] = {}

    def feed(self, event: dict) -> str:
        """Take one chunk in; returns its new text. ``chunks`` grows when it carried
        anything new (text, reasoning, a tool call's part): keep-alives do not."""
        address = self.address
        self.usage = _field(event.get("usage"), dict, "'usage'", address) or self.usage
        self.timings = _field(event.get("timings"), dict, "'timings'", address) or self.timings
        text = ""
        for choice in _field(event.get("choices"), list, "'choices'", address) or []:
            if not isinstance(choice, dict):
                raise _unreadable(address, f"a choice is {_kind(choice)}, not an object")
            delta = _field(choice.get("delta"), dict, "'delta'", address) or {}
            piece = _field(delta.get("content"), str, "'content'", address) or ""
            calls = _field(delta.get("tool_calls"), list, "'tool_calls'", address) or []
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            finish = _field(choice.get("finish_reason"), str, "'finish_reason'", address)
            text += piece
            for call in calls:
                self._add_call(call)
            self.finish_reason = finish or self.finish_reason
            if piece or calls:
                now = time.perf_counter()
                self.first = self.first or now
                self.last = now
                self.pieces += 1
            if piece or calls or (isinstance(thought, str) and thought):
                self.chunks += 1
        self.chars += len(text)
        return text

    def _add_call(self, delta: Any) -> None:
        """OpenAI streams a call as deltas: the name once, the arguments in pieces."""
        address = self.address
        if not isinstance(delta, dict):
            raise _unreadable(address, f"a tool call is {_kind(delta)}, not an object")
        index = _field(delta.get("index"), int, "a tool call's 'index'", address)
        entry = self.calls.setdefault(len(self.calls) if index is None else index,
                                      {"name": "", "arguments": ""})
        function = _field(delta.get("function"), dict, "'function'", address) or {}
        entry["name"] = entry["name"] or _field(function.get("name"), str, "'name'", address) or ""
        entry["arguments"] += _field(function.get("arguments"), str, "'arguments'", address) or ""

    def tool_call_text(self) -> str:
        """The streamed tool calls as ``<tool_call>{"name", "arguments"}</tool_call>``
        blocks, which ``core.toolcalls.parse_tool_calls`` turns into stored calls (arguments
        that are not JSON stay a string, and become a malformed call the model hears of)."""
        blocks = []
        for index in sorted(self.calls):
            call = self.calls[index]
            try:
                arguments: Any = json.loads(call["arguments"] or "{}")
            except ValueError:
                arguments = call["arguments"]
            blocks.append("<tool_call>" + json.dumps(
                {"name": call["name"], "arguments": arguments}, ensure_ascii=False)
                + "</tool_call>")
        return "".join(blocks)

    def stats(self, prompt_size: int, outcome: str | None) -> GenerationStats:
        """GenerationStats from what the server reported (``usage``; llama.cpp's
        ``timings``: ``cache_n`` reused, ``prompt_n`` evaluated), else from the count
        made before sending and what was seen. A count the server sent as anything but
        a whole number from 0 to :data:`MAX_REPORTED_TOKENS` counts as not sent
        (:func:`_tokens`), and none exceeds the prompt it is part of."""
        usage, timings, address = self.usage, self.timings, self.address

        def count(source: dict, key: str) -> int | None:
            return _tokens(source.get(key), key, address)

        prompt = count(usage, "prompt_tokens") or prompt_size
        details = usage.get("prompt_tokens_details")
        cached = (count(details, "cached_tokens") or 0) if isinstance(details, dict) else 0
        reused = count(timings, "cache_n")
        reused = min(prompt, cached if reused is None else reused)
        # a stream stopped before the server said anything: nothing is known evaluated
        evaluated = count(timings, "prompt_n")
        if evaluated is None:
            evaluated = prompt - reused if self.first or usage else 0
        evaluated = min(prompt, evaluated)
        completion = (count(usage, "completion_tokens") or count(timings, "predicted_n")
                      or self.pieces)
        rate = _rate(timings.get("predicted_per_second"), address)
        if not rate and completion > 1 and self.first and self.last and self.last > self.first:
            rate = (completion - 1) / (self.last - self.first)
        finish = outcome or ("length" if self.finish_reason == "length" else "stop")
        return GenerationStats(
            prompt_tokens=prompt, reused_tokens=reused, evaluated_tokens=evaluated,
            completion_tokens=completion,
            time_to_first_token_s=(self.first - self.started) if self.first else 0.0,
            tokens_per_s=rate, duration_s=time.perf_counter() - self.started,
            finish_reason=finish)


# ---------------------------------------------------------------------------
# the runtimes


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

    # -- connecting --------------------------------------------------------------

    @classmethod
    def connect(cls, base_url: str, name: str = "", api_key: str | None = None,
                fallback_window: int = 8192, *, idle_timeout_s: float = STREAM_IDLE_TIMEOUT_S,
                start_timeout_s: float | None = None, answer_limit_bytes: int | None = None,
                answer_timeout_s: float = REQUEST_TIMEOUT_S) -> RemoteRuntime:
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
        ``connect`` or fill the memory.
        Raises ServerError (unreachable, key refused, unknown model, an answer too large
        or too slow) or ValueError (not a URL)."""
        started = time.perf_counter()
        http = _Http(base_url, api_key, answer_limit=answer_limit_bytes,
                     answer_timeout_s=answer_timeout_s)
        try:
            server = _probe(http, base_url, only=name or None)
            model = _choose_model(server, name, http.address)
            served = server.model(model)
            window, source = ((served.context_length, "server")
                              if served and served.context_length else (fallback_window, "config"))
            kind = ExactRemoteRuntime if server.exact_counts else RemoteRuntime
            runtime = kind(http, server, model, window, source, idle_timeout_s=idle_timeout_s,
                           start_timeout_s=start_timeout_s)
            runtime._calibrate()
        except BaseException:
            http.close()
            raise
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

    def stream(
        self,
        messages: list[Message],
        *,
        max_tokens: int,
        temperature: float = 0.7,
        cancel: threading.Event | None = None,
        json_schema: dict | None = None,
        response_format: dict | None = None,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        repeat_penalty: float = 1.0,
        seed: int | None = None,
        stop: list[str] | None = None,
        tools: list[dict] | None = None,
        deadline: float | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> Generation:
        """Generate a reply to ``messages`` on the server, yielding text as it streams.

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
        if max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if json_schema is not None:
            response_format = {"type": "json_schema",
                               "json_schema": {"name": "iris_output", "schema": json_schema}}
        body = {**self._chat_body(messages, tools), "stream": True,
                "stream_options": {"include_usage": True},
                "temperature": temperature, "top_p": top_p,
                **_sampling_extras(self.kind, top_k, min_p, repeat_penalty)}
        if seed is not None:
            body["seed"] = seed
        if stop:
            body["stop"] = list(stop)
        if response_format:
            body["response_format"] = response_format
        return Generation(lambda result: self._stream(
            result, body, list(messages), tools or None, max_tokens, cancel, deadline))

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
            result.stats = reply.stats(prompt_size, outcome)
            return
        reader = _EventReader(self._http.streams, self._http.url("/v1/chat/completions"),
                              body, address)
        sent = heard = beat = time.monotonic()
        try:
            for event, when in reader.events(should_stop):
                if event is not None:
                    before = (reply.chunks, reply.finish_reason)
                    text = reply.feed(event)
                    if (reply.chunks, reply.finish_reason) != before:
                        heard = when
                    if text:
                        yield text
                        beat = time.monotonic()
                    if (reply.chunks > CHUNKS_PER_TOKEN * limit + CHUNK_SLACK
                            or reply.chars > CHARS_PER_TOKEN * limit):
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
            elif reply.finish_reason is None:
                raise ServerError(f"{address}: the stream ended before the reply "
                                  f"did (the connection was lost mid-reply)")
            elif reply.calls:
                yield reply.tool_call_text()
        except GeneratorExit:
            outcome = "cancelled"
            raise
        except BaseException:
            outcome = "error"
            raise
        finally:
            reader.abort()
            result.stats = reply.stats(prompt_size, outcome)
            reported = _tokens(reply.usage.get("prompt_tokens"), "prompt_tokens", address)
            if reported and not self.closed:
                self._observe(reported, basis)
            log.debug("%s: %s", self.where, result.stats)

    def _quiet_too_long(self, reader: _EventReader, reply: _Reply, sent: float, heard: float,
                        now: float) -> bool:
        """Raises ServerError when the reply did not start (headers and first text) within
        ``start_timeout_s`` of ``sent``, or went on without new text for
        ``idle_timeout_s`` after ``heard`` (its last); True instead when it had finished
        (the server kept the connection open after its finish reason)."""
        address = self._http.address
        if reply.chunks or reply.finish_reason is not None:
            if now - heard <= self.idle_timeout_s:
                return False
            if reply.finish_reason is not None:
                return True
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

    capabilities = Capabilities(exact_counts=True, native_tools=True)

    def _calibrate(self) -> None:
        """Exact counts need no calibration."""

    def counter(self) -> ServerTokenCounter:
        return ServerTokenCounter(self)

    # -- the server's counts -----------------------------------------------------------

    def _count(self, messages: list[Message], tools: list[dict] | None = None,
               generation: bool = True) -> int:
        """The server's count of the prompt for ``messages`` (with the generation prompt
        unless ``generation`` is False), as it would evaluate it. Cached."""
        self._check_open()
        body = self._chat_body(messages, tools)
        if not generation:
            body["add_generation_prompt"] = False
        key = json.dumps(body, sort_keys=True, ensure_ascii=False)
        return self._counts.get(key, lambda: self._ask_count(body))

    def _ask_count(self, body: dict) -> int:
        way = self.server.counting
        if way == "input_tokens":
            return self._post_field("/v1/chat/completions/input_tokens", body, "input_tokens", int)
        if way == "vllm-tokenize":
            return self._post_field("/tokenize", body, "count", int)
        prompt = self._post_field("/apply-template", body, "prompt", str)
        return len(self._tokenize(prompt, special=True))

    def _post_field(self, path: str, body: dict, key: str, wanted: type) -> Any:
        """The ``key`` of the server's answer to ``body`` at ``path``, a ``wanted``;
        ServerError naming what is wrong when it is not."""
        return _answer_field(self._http.post(path, body), key, wanted, self._http.address, path)

    def _tokenize(self, text: str, special: bool) -> list:
        """llama.cpp's tokens of ``text``: ``add_special`` (BOS) for a whole prompt, and
        control-token text always parsed, as the server parses the prompts it evaluates."""
        body = {"content": text, "add_special": special, "parse_special": True}
        return self._post_field("/tokenize", body, "tokens", list)

    def count_text(self, text: str) -> int:
        """Tokens of ``text`` alone: no template, no BOS, control-token text parsed as
        the server parses the prompts it evaluates."""
        if not text:
            return 0
        self._check_open()
        if self.server.counting == "vllm-tokenize":
            body = {"model": self.model, "prompt": text, "add_special_tokens": False}
            return self._texts.get(text, lambda: self._post_field("/tokenize", body, "count", int))
        return self._texts.get(text, lambda: len(self._tokenize(text, special=False)))

    def count_prompt(self, messages: list[Message], tools: list[dict] | None = None) -> int:
        """The exact number of prompt tokens the server evaluates for this request."""
        return self._count(list(messages), tools or None)

    def prompt_overhead(self) -> int:
        """What a request adds once: the generation prompt (the BOS is counted with the
        system message, which a request always starts with)."""
        return self._count([_PROBE_SYSTEM]) - self._count([_PROBE_SYSTEM], generation=False)

    def message_tokens(self, message: Message) -> int:
        """What ``message`` adds to a prompt: the server's count of a probe conversation
        with it, less the probe's. A system message is counted alone (BOS included). A
        trailing assistant message would be continued rather than closed (llama.cpp's
        prefill), so one is measured before a probe user message. A template that refuses
        every probe shape gets a text estimate; whole requests stay exact regardless."""
        if message.get("role") == "system":
            return self._count([message], generation=False)
        after = [_PROBE_USER] if message.get("role") == "assistant" else []
        for before in ([_PROBE_SYSTEM], [_PROBE_SYSTEM, _PROBE_USER]):
            try:
                return (self._count([*before, message, *after], generation=False)
                        - self._count([*before, *after], generation=False))
            except ServerError:  # the template refuses this shape (alternation checks)
                continue
        return self.count_text(message_text(message)) + _FALLBACK_FRAMING_TOKENS

    def tool_tokens(self, tools: list[dict]) -> int:
        """What passing ``tools`` adds to a prompt, as the server's template renders them."""
        if not tools:
            return 0
        probe = [_PROBE_SYSTEM, _PROBE_USER]
        return self._count(probe, tools) - self._count(probe)

    def _measure(self, messages: list[Message], tools: list[dict] | None) -> tuple[int, int]:
        counted = self.count_prompt(messages, tools)
        return counted, counted

    def _room(self, prompt_size: int, max_tokens: int) -> int:
        """As the local model: a prompt that leaves no room is refused before sending."""
        if prompt_size >= self.n_ctx:
            raise PromptTooLongError(prompt_size, self.n_ctx)
        return min(max_tokens, self.n_ctx - prompt_size)

    def _observe(self, reported: int, counted: int) -> None:
        """A server that reports another size than it counted is a bug worth a line."""
        if reported != counted:
            log.warning("%s: counted %d prompt tokens, the server reported %d",
                        self.where, counted, reported)


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
        raise ServerError(f"{address} does not serve {name!r}; it serves: " + ", ".join(names))
    return name


def _sampling_extras(kind: str, top_k: int, min_p: float, repeat_penalty: float) -> dict:
    """Sampling fields beyond OpenAI's, for the servers that take them; llama.cpp also
    keeps the prompt's KV cache for the next request (its default, said explicitly)."""
    if kind == "llama.cpp":
        return {"top_k": top_k, "min_p": min_p, "repeat_penalty": repeat_penalty,
                "cache_prompt": True}
    if kind == "vllm":
        return {"top_k": top_k, "min_p": min_p, "repetition_penalty": repeat_penalty}
    return {}
