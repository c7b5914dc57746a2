"""Bounded HTTP answers: every answer Iris reads whole (a model server's probes and
counts, the one-token calibration, the hub's searches and file lists) goes through
:func:`read_answer`, so that a broken or hostile peer can neither fill the memory nor
hold the caller.

* **Size.** The body is read as it arrives and counted *after* decoding: a
  ``Content-Encoding: gzip`` or ``deflate`` body is inflated here, a bounded step at a
  time (:class:`Inflater`), never by httpx in one go, so a gzip bomb stops at the cap
  with no more than the cap and one step held. A ``Content-Length`` over the cap is
  refused before a byte is read. Error answers are read for their message only (their
  first :data:`ERROR_BODY_BYTES`).
* **Time.** One deadline covers the whole exchange (connecting, the headers, every byte
  of the body, redirects): the request runs on a helper thread and the caller waits
  for it no longer than ``timeout_s``; at the deadline the request's socket is shut down
  (which wakes a blocked read) and the caller gets :class:`AnswerTooSlow`. A peer that
  answers a byte a second is bounded by that, not only by the per-read timeouts.
* **Redirects** (the hub's only) are followed here without reading their bodies
  (httpx reads a redirect's whole body before following it).

Streamed answers (a reply's events, a download) are read by their callers; they use
:func:`decoded_chunks` for a bounded decoding of a compressed stream.

Nothing here knows a server or a hub: the errors say the cause in words
(:attr:`AnswerError.cause`), and the caller names the peer.
"""

from __future__ import annotations

import socket
import threading
import time
import zlib
from collections.abc import Iterator
from typing import Any

import httpx

__all__ = [
    "ACCEPT_ENCODING",
    "ERROR_BODY_BYTES",
    "AnswerError",
    "AnswerTooLarge",
    "AnswerTooSlow",
    "AnswerUndecodable",
    "Inflater",
    "decoded_chunks",
    "open_following",
    "read_answer",
    "size_words",
]

#: the encodings :class:`Inflater` decodes, as a request asks for them
ACCEPT_ENCODING = "gzip, deflate"
#: an error answer is read this far for its message
ERROR_BODY_BYTES = 1 << 16
#: decoded bytes produced per step at most
DECODE_STEP = 1 << 16
#: redirects followed at most (httpx's default)
MAX_REDIRECTS = 20


class AnswerError(Exception):
    """An answer broke a bound. ``cause`` says how, in words, without naming the peer
    (``sent more than 8 MiB``); the caller makes the sentence."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


class AnswerTooLarge(AnswerError):
    """The decoded body grew past the cap (or its Content-Length says it would)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"sent more than {size_words(limit)}")
        self.limit = limit


class AnswerTooSlow(AnswerError):
    """The whole exchange did not end within its deadline."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"did not finish answering within {timeout_s:g} s")
        self.timeout_s = timeout_s


class AnswerUndecodable(AnswerError):
    """A Content-Encoding Iris did not ask for, or compressed data that does not inflate."""


def size_words(n: int) -> str:
    """``8 MiB``, ``64 KiB``, ``100 bytes``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            value = n / (1 << shift)
            return f"{value:g} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n:,} bytes"


# ---------------------------------------------------------------------------
# decoding


class Inflater:
    """Decodes one body's ``Content-Encoding`` (none, ``identity``, ``gzip``, ``x-gzip``,
    ``deflate``; a multi-member gzip too) in steps of at most ``step`` decoded bytes:
    however much a few compressed bytes inflate to, no more than one step is held.
    Raises :class:`AnswerUndecodable` for any other encoding, a stack of two, or data
    that does not decompress."""

    def __init__(self, encoding: str | None, step: int = DECODE_STEP) -> None:
        codings = [c.strip().lower() for c in (encoding or "").split(",")]
        codings = [c for c in codings if c and c != "identity"]
        if len(codings) > 1:
            raise AnswerUndecodable(f"sent its answer encoded twice ({encoding}), which Iris does not decode")
        self.coding = codings[0] if codings else ""
        if self.coding not in ("", "gzip", "x-gzip", "deflate"):
            raise AnswerUndecodable(f"sent its answer in an encoding Iris did not ask for "
                                    f"({self.coding[:40]})")
        self.step = step
        self._zlib: Any = None
        self._raw_deflate = False
        self._started = False
        self._done = False
        self._carry = b""
        self._new()

    def _new(self) -> None:
        if self.coding in ("gzip", "x-gzip"):
            self._zlib = zlib.decompressobj(zlib.MAX_WBITS | 16)
        elif self.coding == "deflate":  # zlib-wrapped as the RFC says; raw deflate as some send
            self._zlib = zlib.decompressobj(-zlib.MAX_WBITS if self._raw_deflate else zlib.MAX_WBITS)

    def feed(self, data: bytes) -> Iterator[bytes]:
        """The decoded bytes of ``data``, a step at a time."""
        if self._zlib is None:
            for start in range(0, len(data), self.step):
                yield data[start:start + self.step]
            return
        if self._done:
            return
        first = not self._started
        pending, self._carry = self._carry + data, b""
        more = False
        while pending or more:
            if self._zlib.eof:
                if self.coding == "deflate" or (len(pending) >= 2 and pending[:2] != b"\x1f\x8b"):
                    self._done = True  # what follows the stream is ignored, as httpx does
                    return
                if len(pending) < 2:
                    self._carry = pending  # the next member's magic may come in the next chunk
                    return
                self._new()  # the next member of a multi-member gzip
            try:
                out = self._zlib.decompress(pending, self.step)
            except zlib.error:
                if self.coding == "deflate" and first and not self._raw_deflate:
                    self._raw_deflate = True  # not zlib-wrapped: raw deflate, from the start
                    self._new()
                    yield from self.feed(data)
                    return
                raise AnswerUndecodable(f"sent compressed data ({self.coding}) that does not "
                                        "decompress") from None
            more = len(out) == self.step  # a full step may leave output behind
            if out:
                self._started = True
                yield out
            pending = self._zlib.unused_data if self._zlib.eof else self._zlib.unconsumed_tail


def decoded_chunks(response: httpx.Response, step: int = DECODE_STEP) -> Iterator[bytes]:
    """``response``'s body as it arrives, decoded by :class:`Inflater` in steps of at
    most ``step`` bytes (never httpx's own decoding, which inflates a whole received
    chunk at once). Raises AnswerUndecodable, httpx.HTTPError."""
    inflater = Inflater(response.headers.get("content-encoding"), step)
    for raw in response.iter_raw():
        yield from inflater.feed(raw)


# ---------------------------------------------------------------------------
# the whole exchange


class _Watch:
    """The socket of one exchange (when known), shut down at its deadline."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sockets: list[Any] = []
        self.expired = threading.Event()

    def trace(self, event: str, info: dict) -> None:
        # a new connection (over TLS the TLS socket replaces the TCP one)
        if event in ("connection.connect_tcp.complete", "connection.start_tls.complete") \
                and info.get("return_value") is not None:
            self.attach(info["return_value"])

    def attach(self, stream: Any) -> None:
        try:
            sock = stream.get_extra_info("socket") if stream is not None else None
        except Exception:  # a transport without sockets (tests' mocks)
            sock = None
        if sock is None:
            return
        with self._lock:
            self._sockets.append(sock)
        if self.expired.is_set():
            self._shutdown()

    def expire(self) -> None:
        self.expired.set()
        self._shutdown()

    def _shutdown(self) -> None:
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed
                pass


def open_following(client: httpx.Client, request: httpx.Request, *, follow: bool = True,
                   watch: _Watch | None = None) -> httpx.Response:
    """The response to ``request``, its headers read and its body not (close it, or read
    it with :func:`decoded_chunks`); redirects are followed when ``follow`` without
    reading their bodies, which httpx would read whole. The request to another origin
    goes without the token, as httpx builds it. Raises httpx.HTTPError."""
    for _ in range(MAX_REDIRECTS + 1):
        response = client.send(request, stream=True, follow_redirects=False)
        if watch is not None:
            watch.attach(response.extensions.get("network_stream"))
        if not follow or response.next_request is None:
            return response
        request = response.next_request
        response.close()
        if watch is not None and watch.expired.is_set():
            raise AnswerTooSlow(0)  # the caller has gone already
    raise httpx.TooManyRedirects("Exceeded maximum allowed redirects.", request=request)


def _body(response: httpx.Response, limit: int, watch: _Watch) -> bytes:
    """The decoded body, at most ``limit`` bytes (an error answer: its first
    :data:`ERROR_BODY_BYTES`, cut there quietly)."""
    ok = response.status_code < 300
    if 300 <= response.status_code < 400:
        return b""  # a redirect not followed: only its Location matters
    cap = limit if ok else min(limit, ERROR_BODY_BYTES)
    length = response.headers.get("content-length", "")
    if ok and length.strip().isdigit() and int(length) > limit \
            and not response.headers.get("content-encoding"):
        raise AnswerTooLarge(limit)
    data = bytearray()
    for piece in decoded_chunks(response):
        if watch.expired.is_set():
            break
        if len(data) + len(piece) > cap:
            if ok:
                raise AnswerTooLarge(limit)
            data += piece[:cap - len(data)]
            break
        data += piece
    return bytes(data)


def read_answer(client: httpx.Client, request: httpx.Request, *, limit: int, timeout_s: float,
                follow_redirects: bool = False) -> httpx.Response:
    """Send ``request`` with ``client`` and read the whole answer: at most ``limit``
    decoded bytes of body, everything (redirects included, when ``follow_redirects``)
    within ``timeout_s`` seconds. Returns a Response holding the decoded body (no
    Content-Encoding left), whose ``json()``, ``text``, ``links`` and ``request`` work as
    usual. Raises AnswerTooLarge, AnswerTooSlow, AnswerUndecodable or httpx.HTTPError."""
    watch = _Watch()
    extensions = dict(request.extensions)
    extensions["trace"] = watch.trace
    # no single read may wait longer than the whole exchange may take
    per_read = httpx.Timeout(timeout_s)
    extensions["timeout"] = {k: min(v, timeout_s) if v is not None else timeout_s
                             for k, v in (request.extensions.get("timeout") or per_read.as_dict()).items()}
    request.extensions = extensions
    # what Inflater decodes (httpx's default would also ask for br and zstd when installed)
    request.headers["Accept-Encoding"] = ACCEPT_ENCODING
    outcome: list[Any] = []
    done = threading.Event()

    def work() -> None:
        try:
            response = open_following(client, request, follow=follow_redirects, watch=watch)
            try:
                body = _body(response, limit, watch)
            finally:
                response.close()
            headers = [(k, v) for k, v in response.headers.multi_items()
                       if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
            outcome.append(httpx.Response(
                response.status_code, headers=headers, content=body, request=response.request,
                extensions={k: v for k, v in response.extensions.items()
                            if k in ("http_version", "reason_phrase")}))
        except BaseException as exc:  # handed to the caller
            outcome.append(exc)
        finally:
            done.set()

    started = time.monotonic()
    thread = threading.Thread(target=work, name="iris-http-answer", daemon=True)
    thread.start()
    if not done.wait(timeout_s):
        watch.expire()  # wakes the helper; it ends by itself, its result unread
        raise AnswerTooSlow(timeout_s)
    result = outcome[0]
    if isinstance(result, BaseException):
        if watch.expired.is_set() or (isinstance(result, httpx.TimeoutException)
                                      and time.monotonic() - started >= timeout_s * 0.99):
            raise AnswerTooSlow(timeout_s) from None
        raise result
    return result
