"""A misbehaving OpenAI-compatible server on 127.0.0.1, for the stream-fault tests and the
fault-injection suite.

It is a real HTTP server (``http.server``, one thread per connection) that answers what
:meth:`iris_desktop.runtime.remote.RemoteRuntime.connect` probes, then misbehaves on a
streamed ``POST /v1/chat/completions`` the way its ``mode`` says::

    with MisbehavingServer("silent", tokens=["Hello", ",", " world"]) as server:
        runtime = RemoteRuntime.connect(server.base_url, idle_timeout_s=1.0)
        ...

What it serves in every mode but ``redirect`` and ``bad_counts``:

* ``GET /v1/models``: one model (``model``, default ``misbehaving-1``) with a
  ``context_length`` (``context_length``, default 8192);
* ``GET /health``: ``{"status": "ok"}``; ``GET /props`` and ``GET /api/version``: 404, so
  Iris takes it for a plain OpenAI-compatible server (estimated counts);
* ``POST /v1/chat/completions`` without ``"stream": true`` (the calibration request
  ``connect`` sends): a normal JSON answer with ``usage``;
* anything else: 404.

A streamed reply first sends its headers, a role-only chunk and then ``tokens`` one
content delta each, ``interval_s`` apart (``preamble_sent`` is set once they are out),
and then, by ``mode`` (:data:`MODES`):

======================  =================================================================
``normal``              a finish chunk (``stop``), a usage chunk and ``data: [DONE]``; closes
``finish_then_hold``    the finish and usage chunks, then holds the connection open (no
                        ``[DONE]``, no close)
``silent``              nothing more: the connection is held open, silent
``forever``             one more content delta (``" w<i>"``) every ``interval_s``, forever
``keepalive``           only SSE comments (``: keep-alive``) and blank lines, forever
``empty``               only chunks that carry no text (``{}``, ``"content": ""``, a role,
                        ``"content": null``, ``"tool_calls": []``, ``"choices": []``), forever
``dribble``             one content delta at a time, one byte every ``dribble_delay_s``, forever
``huge_line``           ``data: `` and then ``huge_bytes`` of ``x`` with no newline; then holds
``malformed``           one malformed event (``malformed``: a key of :data:`MALFORMED`); then
                        holds
``slow_headers``        never sends anything, not even the headers (the preamble is skipped)
``redirect``            every request, probes included, is answered ``302 Found`` with
                        ``Location: redirect_to`` (default: the same path under ``/moved``)
``web_page``            a streamed reply is answered ``200`` with an HTML page
                        (``text/html``), as a web server or a login portal would
``json_typed``          as ``normal``, the stream sent as ``Content-Type: application/json``
                        (as some local servers send their streams)
``garbled_too_long``    a streamed reply is answered ``400`` with llama.cpp's
                        ``exceed_context_size_error`` whose counts are not numbers
``tool_flood``          one tool call whose arguments come in pieces of 900 KiB (each line
                        under the line limit), forever
``many_calls``          1,000 new tool calls (each its own ``index``) in every chunk, forever
``bad_counts``          it passes for llama.cpp with fields of the wrong shape: ``/props``
                        has ``"default_generation_settings": "oops"`` and ``"n_ctx":
                        "many"``, ``/v1/chat/completions/input_tokens`` answers
                        ``{"input_tokens": "many"}``, ``/tokenize`` ``{"tokens": 5}``,
                        ``/apply-template`` ``[]``; replies stream as ``normal``
``llama``               it passes for an older llama.cpp that counts with ``/apply-template``
                        (the messages' texts joined) and ``/tokenize`` (``tokens_per_char``
                        token ids per character of the text, at least one); replies stream
                        as ``normal``
``flipflop``            after the tokens, a chunk with no text every ``interval_s``, forever,
                        each with another finish reason (``r0``, ``r1``, …; counted in
                        ``finishes_sent``), never ``[DONE]``
``tool_call``           after the tokens, one chunk of tool-call deltas (``calls``), a finish
                        (``tool_calls``), a usage chunk and ``data: [DONE]``
``bad_chunk``           chunked; the tokens' chunks, then a chunk header that is not one
                        (``Z`` and 2,000 ANSI colour codes), then holds
``not_http``            a streamed request is answered ``SSH-2.0-OpenSSH_9.6`` and closed
======================  =================================================================

Text goes out as ``json.dumps`` writes it, so a lone surrogate in ``tokens``, ``calls``
or ``model`` (``"\\ud800"``) is sent as the escape ``\\ud800``, as a broken server sends it.
``tls`` (``(certificate file, key file)``) serves every connection over TLS.

Besides the mode, an answer read whole (not streamed) can misbehave too: ``answer_fault``
makes the answer to ``answer_path`` (default ``/v1/models``; ``/v1/chat/completions``
is the calibration request ``connect`` sends) one of :data:`ANSWER_FAULTS`:

======================  =================================================================
``endless``             status and headers, then a body with no length that never ends
``gzip_bomb``           ``Content-Encoding: gzip``, a few KiB that inflate to ``bomb_bytes``
``trickle``             the right answer, its body one byte every ``trickle_delay_s``
``trickle_headers``     the status line and headers one byte every ``trickle_delay_s``
``empties``             a body of about ``bomb_bytes`` of empty JSON values, with its length:
                        ``{"data": [{}, {}, …]}`` (``/tokenize``: ``{"tokens": [[], [], …]}``)
======================  =================================================================

``usage`` replaces the ``usage`` the server reports (the calibration answer and a
streamed reply's usage chunk), for the absurd numbers a broken server sends; and mode
``gzip_bomb`` streams a reply as ``Content-Encoding: gzip`` whose one ``data:`` line
inflates to ``bomb_bytes`` with no line end.

"Forever" and "holds" are bounded: every mode stops by itself after ``hold_s`` seconds
(default 30), once ``max_bytes`` are sent (default 256 MiB), when the client leaves,
when ``release`` is set, or when the server stops (the context manager's exit), so no
test can hang on it. A hold notices a client that left within 50 ms.

What the tests read back: ``requests`` (``(method, path, body)`` of each request),
``stream_started`` (a streamed request arrived), ``preamble_sent``, ``client_gone``
(the client closed a streamed connection before the server was done with it),
``bytes_sent`` (body bytes of the streamed replies) and ``streams_done`` (how many
streamed replies ended, for any reason).
"""

from __future__ import annotations

import functools
import json
import select
import socket
import ssl
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODES = ("normal", "finish_then_hold", "silent", "forever", "keepalive", "empty", "dribble",
         "huge_line", "malformed", "slow_headers", "redirect", "bad_counts", "gzip_bomb",
         "web_page", "garbled_too_long", "json_typed", "tool_flood", "many_calls", "llama",
         "flipflop", "tool_call", "bad_chunk", "not_http")
ANSWER_FAULTS = ("endless", "gzip_bomb", "trickle", "trickle_headers", "empties")
#: the modes whose reply ends as ``normal`` does
FINISHING = ("normal", "finish_then_hold", "bad_counts", "json_typed", "llama")

#: the malformed events mode ``malformed`` can send (a bytes value goes out as the raw
#: ``data:`` payload, anything else as its JSON)
MALFORMED: dict[str, Any] = {
    "event-list": [1, 2, 3],
    "event-string": "just a string",
    "choices-string": {"choices": "oops"},
    "choice-string": {"choices": ["oops"]},
    "delta-string": {"choices": [{"index": 0, "delta": "oops"}]},
    "content-number": {"choices": [{"index": 0, "delta": {"content": 42}}]},
    "content-object": {"choices": [{"index": 0, "delta": {"content": {"text": "hi"}}}]},
    "tool-calls-string": {"choices": [{"index": 0, "delta": {"tool_calls": "oops"}}]},
    "tool-call-string": {"choices": [{"index": 0, "delta": {"tool_calls": ["oops"]}}]},
    "tool-call-index-string": {"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": "first", "function": {"name": "read_file", "arguments": "{}"}}]}}]},
    "function-string": {"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "function": "read_file"}]}}]},
    "arguments-number": {"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "function": {"name": "read_file", "arguments": 5}}]}}]},
    "finish-number": {"choices": [{"index": 0, "delta": {}, "finish_reason": 7}]},
    "usage-string": {"choices": [], "usage": "oops"},
    "timings-list": {"choices": [], "timings": [1, 2]},
    "not-json": b"{oops",
}

#: mode ``bad_counts``: what the counting endpoints answer
BAD_COUNTS: dict[str, Any] = {
    "/v1/chat/completions/input_tokens": {"input_tokens": "many"},
    "/tokenize": {"tokens": 5},
    "/apply-template": [],
}

#: mode ``bad_counts``: what ``/props`` answers
BAD_PROPS: dict[str, Any] = {"default_generation_settings": "oops", "n_ctx": "many",
                             "chat_template": "{{ messages }}"}

DEFAULT_TOKENS = ("Hello", ",", " world")
#: a hold's step: how soon it notices the stop, a release or a client that left
STEP_S = 0.05


class MisbehavingServer:
    """The server; a context manager (``start()`` and ``stop()`` otherwise). Settings are
    plain attributes and may be changed between requests."""

    def __init__(
        self,
        mode: str = "normal",
        *,
        tokens: tuple[str, ...] | list[str] = DEFAULT_TOKENS,
        model: str = "misbehaving-1",
        context_length: int = 8192,
        interval_s: float = 0.01,
        dribble_delay_s: float = 0.05,
        huge_bytes: int = 64 << 20,
        malformed: str = "choices-string",
        redirect_to: str | None = None,
        hold_s: float = 30.0,
        max_bytes: int = 256 << 20,
        answer_fault: str | None = None,
        answer_path: str = "/v1/models",
        trickle_delay_s: float = 0.2,
        bomb_bytes: int = 256 << 20,
        usage: dict | None = None,
        calls: list[dict] | None = None,
        tokens_per_char: float = 0.25,
        tls: tuple[str, str] | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; one of {', '.join(MODES)}")
        if answer_fault is not None and answer_fault not in ANSWER_FAULTS:
            raise ValueError(f"unknown answer fault {answer_fault!r}; one of {', '.join(ANSWER_FAULTS)}")
        if malformed not in MALFORMED:
            raise ValueError(f"unknown malformed event {malformed!r}; one of {', '.join(MALFORMED)}")
        self.mode = mode
        self.tokens = list(tokens)
        self.model = model
        self.context_length = context_length
        self.interval_s = interval_s
        self.dribble_delay_s = dribble_delay_s
        self.huge_bytes = huge_bytes
        self.malformed = malformed
        self.redirect_to = redirect_to
        self.hold_s = hold_s
        self.max_bytes = max_bytes
        self.answer_fault = answer_fault
        self.answer_path = answer_path
        self.trickle_delay_s = trickle_delay_s
        self.bomb_bytes = bomb_bytes
        self.usage = usage
        self.calls = list(calls or [])
        self.tokens_per_char = tokens_per_char
        self.tls = tls
        #: finish chunks sent by mode ``flipflop``
        self.finishes_sent = 0
        #: body bytes of the misbehaving answers read whole
        self.answer_bytes_sent = 0
        self.requests: list[tuple[str, str, Any]] = []
        self.stream_started = threading.Event()
        self.preamble_sent = threading.Event()
        self.client_gone = threading.Event()
        self.release = threading.Event()
        self.bytes_sent = 0
        self.streams_done = 0
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._httpd is not None, "the server is not started"
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        """The address to give Iris (``model.base_url``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> MisbehavingServer:
        httpd = (_TLSServer(("127.0.0.1", 0), _Handler, self.tls) if self.tls
                 else ThreadingHTTPServer(("127.0.0.1", 0), _Handler))
        httpd.daemon_threads = False  # server_close() joins every handler
        httpd.block_on_close = True
        httpd.owner = self  # type: ignore[attr-defined]
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": STEP_S},
                                        name="misbehaving-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and end every connection (each handler notices within STEP_S)."""
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> MisbehavingServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- for the handlers ----------------------------------------------------------------

    def _record(self, method: str, path: str, body: Any) -> None:
        with self._lock:
            self.requests.append((method, path, body))

    def _count(self, sent: int) -> None:
        with self._lock:
            self.bytes_sent += sent


class _TLSServer(ThreadingHTTPServer):
    """Every connection over TLS (the handshake when it is accepted; one that fails is
    closed, which a client that spoke plain HTTP sees as a reset)."""

    def __init__(self, address: tuple[str, int], handler: Any, tls: tuple[str, str]) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(*tls)
        super().__init__(address, handler)

    def get_request(self) -> tuple[Any, Any]:
        sock, address = super().get_request()
        sock.settimeout(5)
        try:
            return self.context.wrap_socket(sock, server_side=True), address
        except (OSError, ValueError):
            sock.close()
            raise OSError("the TLS handshake failed") from None


class _ClientGone(Exception):
    """The client closed the connection, or the server must stop now."""


class _Handler(BaseHTTPRequestHandler):
    server_version = "misbehaving/1"
    #: a write that cannot go out within this long (a client that stopped reading) is
    #: retried after checking the stop, so no handler blocks for good
    timeout = 1.0

    @property
    def owner(self) -> MisbehavingServer:
        return self.server.owner  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        pass  # quiet: the tests read ``requests``

    # -- routing -----------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.owner._record("GET", self.path, None)
        if self._redirected():
            return
        if self.owner.mode == "bad_counts" and self.path == "/props":
            self._json(200, BAD_PROPS)
        elif self.owner.mode == "llama" and self.path == "/props":
            self._json(200, {"default_generation_settings": {"n_ctx": self.owner.context_length},
                             "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [
                {"id": self.owner.model, "object": "model", "owned_by": "misbehaving",
                 "context_length": self.owner.context_length}]})
        elif self.path == "/health":
            self._json(200, {"status": "ok"})
        else:
            self._json(404, {"error": {"message": f"no {self.path} here", "code": 404}})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        self.owner._record("POST", self.path, body)
        if self._redirected():
            return
        if self.owner.mode == "bad_counts" and self.path in BAD_COUNTS:
            self._json(200, BAD_COUNTS[self.path])
            return
        if self.owner.mode == "llama" and self.path in ("/apply-template", "/tokenize"):
            self._json(200, self._llama_count(body if isinstance(body, dict) else {}))
            return
        if self.path != "/v1/chat/completions":
            self._json(404, {"error": {"message": f"no {self.path} here", "code": 404}})
            return
        if not (isinstance(body, dict) and body.get("stream")):
            self._json(200, self._completion())
            return
        self.owner.stream_started.set()
        try:
            self._stream(body)
        except (_ClientGone, OSError):
            self.owner.client_gone.set()
        finally:
            with self.owner._lock:
                self.owner.streams_done += 1
            self.close_connection = True

    def _redirected(self) -> bool:
        if self.owner.mode != "redirect":
            return False
        target = self.owner.redirect_to or f"http://127.0.0.1:{self.owner.port}/moved{self.path}"
        self.send_response(302)
        self.send_header("Location", target)
        self.send_header("Content-Length", "0")
        self.end_headers()
        return True

    def _json(self, status: int, answer: Any) -> None:
        data = json.dumps(answer).encode()
        if self.owner.answer_fault is not None and self.path == self.owner.answer_path:
            try:
                self._misbehave(status, data)
            except (_ClientGone, OSError):
                pass
            self.close_connection = True
            return
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _completion(self) -> dict:
        text = "".join(self.owner.tokens)
        return {"id": "chatcmpl-misbehaving", "object": "chat.completion", "created": 0,
                "model": self.owner.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": "stop"}],
                "usage": self._usage(len(self.owner.tokens))}

    def _llama_count(self, body: dict) -> dict:
        if self.path == "/apply-template":
            return {"prompt": "".join(str(m.get("content") or "") for m in body.get("messages") or [])}
        count = max(1, int(len(str(body.get("content") or "")) * self.owner.tokens_per_char))
        return {"tokens": [1000 + i % 1000 for i in range(count)]}

    def _usage(self, n: int) -> Any:
        if self.owner.usage is not None:
            return self.owner.usage
        return {"prompt_tokens": 100, "completion_tokens": n, "total_tokens": 100 + n}

    # -- an answer read whole, misbehaving ---------------------------------------------------

    def _misbehave(self, status: int, data: bytes) -> None:
        owner = self.owner
        self._deadline = time.monotonic() + owner.hold_s
        fault = owner.answer_fault
        if fault == "trickle_headers":
            head = (f"HTTP/1.0 {status} OK\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(data)}\r\n\r\n").encode()
            for i in range(len(head)):
                self._raw(head[i:i + 1])
                self._pause(owner.trickle_delay_s)
            self._raw(data)
            return
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if fault == "trickle":
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.flush()
            for i in range(len(data)):
                self._pause(owner.trickle_delay_s)
                self._raw(data[i:i + 1])
        elif fault == "endless":  # HTTP/1.0 without a length: the body ends when the server closes
            self.end_headers()
            self.wfile.flush()
            self._raw(b'{"data": [')
            piece = b'{"id": "x", "object": "model"}, ' * 2048
            while True:
                self._raw(piece)
        elif fault == "empties":
            key, empty = (b"tokens", b"[]") if self.path == "/tokenize" else (b"data", b"{}")
            head, piece, tail = b'{"' + key + b'": [', (empty + b", ") * 16384, empty + b"]}"
            pieces = owner.bomb_bytes // len(piece)  # sent a piece at a time: the server's own
            self.send_header("Content-Length",  # memory stays out of what a test measures
                             str(len(head) + pieces * len(piece) + len(tail)))
            self.end_headers()
            self.wfile.flush()
            self._raw(head)
            for _ in range(pieces):
                self._raw(piece)
            self._raw(tail)
        elif fault == "gzip_bomb":
            bomb = _gzip_bomb(owner.bomb_bytes)
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(bomb)))
            self.end_headers()
            self.wfile.flush()
            self._raw(bomb)

    def _raw(self, data: bytes) -> None:
        """As _send, counted in ``answer_bytes_sent``."""
        before = self.owner.bytes_sent
        self._send(data)
        with self.owner._lock:
            self.owner.answer_bytes_sent += self.owner.bytes_sent - before

    # -- a streamed reply ------------------------------------------------------------------

    def _stream(self, body: dict) -> None:
        owner = self.owner
        self._deadline = time.monotonic() + owner.hold_s
        mode = owner.mode
        if mode == "slow_headers":
            self._hold()
            return
        if mode == "web_page":
            page = (b"<html><body><h1>Welcome</h1><p>Please <a href='https://example.com/login'>"
                    b"sign in</a>.</p></body></html>")
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self._send(page)
            return
        if mode == "garbled_too_long":
            self._json(400, {"error": {"code": 400, "type": "exceed_context_size_error",
                                       "message": "the request exceeds the available context size",
                                       "n_prompt_tokens": "x", "n_ctx": "big"}})
            return
        if mode == "not_http":  # an SSH server's greeting, then it closes
            self._send(b"SSH-2.0-OpenSSH_9.6\r\n")
            return
        if mode == "bad_chunk":
            self._bad_chunk()
            return
        if mode == "gzip_bomb":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Encoding", "gzip")
            self.end_headers()
            self.wfile.flush()
            self._send(_gzip_bomb(owner.bomb_bytes, b"data: "))  # whole: the client reads big chunks
            self._hold()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json" if mode == "json_typed"
                         else "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        self.wfile.flush()
        self._event(self._chunk({"role": "assistant", "content": ""}))
        for token in owner.tokens:
            self._pause(owner.interval_s)
            self._event(self._chunk({"content": token}))
        owner.preamble_sent.set()
        if mode == "tool_call":
            self._event(self._chunk({"tool_calls": owner.calls}))
            self._event(self._chunk({}, "tool_calls"))
            self._send(b"data: [DONE]\n\n")
        elif mode == "flipflop":  # a finish reason that keeps changing, and never [DONE]
            while True:
                self._event(self._chunk({}, f"r{owner.finishes_sent}"))
                with owner._lock:
                    owner.finishes_sent += 1
                self._pause(owner.interval_s)
        elif mode in FINISHING:
            self._event(self._chunk({}, "stop"))
            n = len(owner.tokens)
            self._event({"id": "chatcmpl-misbehaving", "object": "chat.completion.chunk",
                         "created": 0, "model": owner.model, "choices": [],
                         "usage": self._usage(n)})
            if mode != "finish_then_hold":
                self._send(b"data: [DONE]\n\n")
            else:
                self._hold()
        elif mode == "silent":
            self._hold()
        elif mode == "forever":
            i = 0
            while True:
                self._pause(owner.interval_s)
                self._event(self._chunk({"content": f" w{i}"}))
                i += 1
        elif mode == "keepalive":
            while True:
                self._pause(owner.interval_s)
                self._send(b": keep-alive\n\n\n")
        elif mode == "empty":
            empties = [self._chunk({}), self._chunk({"content": ""}),
                       self._chunk({"role": "assistant"}), self._chunk({"content": None}),
                       self._chunk({"tool_calls": []}),
                       {"id": "chatcmpl-misbehaving", "object": "chat.completion.chunk",
                        "created": 0, "model": owner.model, "choices": []}]
            i = 0
            while True:
                self._pause(owner.interval_s)
                self._event(empties[i % len(empties)])
                i += 1
        elif mode == "dribble":
            while True:
                data = b"data: " + json.dumps(self._chunk({"content": " drip"})).encode() + b"\n\n"
                for i in range(len(data)):
                    self._pause(owner.dribble_delay_s)
                    self._send(data[i:i + 1])
        elif mode == "huge_line":
            self._send(b"data: ")
            piece = b"x" * (64 << 10)
            left = owner.huge_bytes
            while left > 0:
                self._send(piece[:left])
                left -= len(piece)
            self._hold()
        elif mode == "tool_flood":
            piece = "x" * (900 << 10)
            i = 0
            while True:
                function = ({"name": "read_file", "arguments": '{"path": "'} if i == 0
                            else {"arguments": piece})
                self._event(self._chunk({"tool_calls": [{"index": 0, "id": "c0",
                                                         "type": "function", "function": function}]}))
                i += 1
        elif mode == "many_calls":
            i = 0
            while True:
                self._event(self._chunk({"tool_calls": [
                    {"index": n, "id": f"c{n}", "type": "function",
                     "function": {"name": "read_file", "arguments": '{"path": "a"}'}}
                    for n in range(i, i + 1000)]}))
                i += 1000
        elif mode == "malformed":
            bad = MALFORMED[owner.malformed]
            self._send(b"data: " + (bad if isinstance(bad, bytes) else json.dumps(bad).encode())
                       + b"\n\n")
            self._hold()

    def _bad_chunk(self) -> None:
        """Chunked: each token an event in a chunk of its own, then a chunk header that is
        none (16 KB of ANSI codes), then holds."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        for token in self.owner.tokens:
            event = b"data: " + json.dumps(self._chunk({"content": token})).encode() + b"\n\n"
            self._send(b"%x\r\n" % len(event) + event + b"\r\n")
        self.owner.preamble_sent.set()
        self._send(b"Z" + b"\x1b[31m" * 2000 + b"\r\n")
        self._hold()

    def _chunk(self, delta: dict, finish: str | None = None) -> dict:
        return {"id": "chatcmpl-misbehaving", "object": "chat.completion.chunk", "created": 0,
                "model": self.owner.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    def _event(self, event: Any) -> None:
        self._send(b"data: " + json.dumps(event).encode() + b"\n\n")

    def _send(self, data: bytes) -> None:
        """Write ``data`` whole, checking the bounds between tries; raises _ClientGone."""
        owner = self.owner
        view = memoryview(data)
        while view:
            self._check()
            if owner.bytes_sent >= owner.max_bytes:
                raise _ClientGone("max_bytes sent")
            try:
                sent = self.connection.send(view)
            except TimeoutError:
                continue  # the client is not reading: check the bounds, then try again
            except OSError as exc:
                raise _ClientGone(str(exc)) from None
            owner._count(sent)
            view = view[sent:]

    def _check(self) -> None:
        owner = self.owner
        if owner._stopping.is_set() or owner.release.is_set() or time.monotonic() > self._deadline:
            raise _ClientGone("the server stops this reply")

    def _pause(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while True:
            self._check()
            left = end - time.monotonic()
            if left <= 0:
                return
            if self._left(min(left, STEP_S)):
                raise _ClientGone("the client left")

    def _hold(self) -> None:
        """Send nothing until a bound ends it; raises _ClientGone when the client left."""
        while True:
            self._check()
            if self._left(STEP_S):
                raise _ClientGone("the client left")

    def _left(self, wait_s: float) -> bool:
        """Whether the client closed its side, waiting up to ``wait_s`` for a sign."""
        try:
            readable, _, _ = select.select([self.connection], [], [], wait_s)
            if not readable:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True


def _gzip_pieces(size: int, prefix: bytes = b"") -> Any:
    """A gzip stream of ``prefix`` and then ``size`` bytes of ``x``, in pieces (about a
    thousandth of ``size`` in all)."""
    packer = zlib.compressobj(1, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    yield packer.compress(prefix)
    block = b"x" * (1 << 20)
    left = size
    while left > 0:
        out = packer.compress(block[:left])
        left -= len(block)
        if out:
            yield out
    yield packer.flush()


@functools.lru_cache(maxsize=4)
def _gzip_bomb(size: int, prefix: bytes = b"") -> bytes:
    """A whole gzip body that inflates to ``prefix`` and ``size`` bytes of ``x``."""
    return b"".join(_gzip_pieces(size, prefix))
