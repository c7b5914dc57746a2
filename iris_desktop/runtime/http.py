"""Bounded HTTP answers: every answer Iris reads whole (a model server's probes and
counts, the one-token calibration, the hub's searches and file lists) goes through
:func:`read_answer`, so that a broken or hostile peer can neither fill the memory nor
hold the caller.

* **Size.** The body is read as it arrives and counted *after* decoding: a
  ``Content-Encoding: gzip`` or ``deflate`` body is inflated here, a bounded step at a
  time (:class:`Inflater`), never by httpx in one go, so a gzip bomb stops at the cap
  with no more than the cap and one step held. A ``Content-Length`` over the cap is
  refused before a byte is read. Error answers are read for their message only (their
  first :data:`ERROR_BODY_BYTES`, for :data:`ERROR_BODY_WAIT_S` at most: then the status
  is the answer, with what of the body came).
* **Time.** One deadline covers the whole exchange (connecting, the headers, every byte
  of the body, redirects): the request runs on a helper thread and the caller waits
  for it no longer than ``timeout_s``; at the deadline the request's socket is shut down
  (which wakes a blocked read) and the caller gets :class:`AnswerTooSlow`. A peer that
  answers a byte a second is bounded by that, not only by the per-read timeouts.
* **Structure.** An answer is parsed by :func:`json_answer`: at most one JSON value per
  :data:`BYTES_PER_VALUE` bytes of its cap (parsed, each small value costs 20 to 60 times
  its bytes: 8 MiB of ``{},`` took 190 MB), its text valid Unicode (a lone surrogate
  escape, ``"\\ud800"``, becomes U+FFFD: UTF-8 cannot store it, and a reply with one was
  lost).
* **Redirects** (the hub's only) are followed here without reading their bodies
  (httpx reads a redirect's whole body before following it), to http:// and https://
  addresses only (:class:`RedirectRefused`).

Streamed answers (a reply's events, a download) are read by their callers; they use
:func:`decoded_chunks` for a bounded decoding of a compressed stream.

Nothing here knows a server or a hub: the errors say the cause in words
(:attr:`AnswerError.cause`, :func:`failure_cause`), and the caller names the peer.
"""

from __future__ import annotations

import json
import re
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import httpx

__all__ = [
    "ACCEPT_ENCODING",
    "ERROR_BODY_BYTES",
    "AnswerError",
    "AnswerTooComplex",
    "AnswerTooLarge",
    "AnswerTooSlow",
    "AnswerUndecodable",
    "ERROR_BODY_WAIT_S",
    "Inflater",
    "MAX_JSON_DEPTH",
    "RedirectRefused",
    "decoded_chunks",
    "failure_cause",
    "json_answer",
    "nested_deeper",
    "open_following",
    "read_answer",
    "read_error_body",
    "size_words",
    "valid_text",
]

#: the encodings :class:`Inflater` decodes, as a request asks for them
ACCEPT_ENCODING = "gzip, deflate"
#: an error answer is read this far for its message
ERROR_BODY_BYTES = 1 << 16
#: ... and for this long at most: its status is the answer, and a body that never comes
#: hid it (a ``500`` whose 200 bytes never came was said as "sent no text within 600 s")
ERROR_BODY_WAIT_S = 5.0
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
    """The decoded body grew past the cap (or its Content-Length, ``announced``, says it
    would: said as announced, not as sent; before, a 60-byte body that announced 2 GB
    was said to have sent more than 8 MiB)."""

    def __init__(self, limit: int, announced: int | None = None) -> None:
        super().__init__(f"sent more than {size_words(limit)}" if announced is None else
                         f"announced an answer of {size_words(announced)} (Content-Length), "
                         f"more than the {size_words(limit)} Iris reads")
        self.limit = limit
        self.announced = announced


class AnswerTooSlow(AnswerError):
    """The whole exchange did not end within its deadline."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"did not finish answering within {timeout_s:g} s")
        self.timeout_s = timeout_s


class AnswerUndecodable(AnswerError):
    """A Content-Encoding Iris did not ask for, or compressed data that does not inflate."""


class AnswerTooComplex(AnswerError):
    """The answer holds more JSON values than its size allows (:func:`json_answer`)."""

    def __init__(self, values: int) -> None:
        super().__init__(f"sent more than {values:,} JSON values")
        self.values = values


class RedirectRefused(AnswerError):
    """A redirect to an address that is not http:// or https:// (``file:///etc/passwd``)."""

    def __init__(self, location: str) -> None:
        super().__init__(f"redirected to {shown_address(location)}, which is not an http:// or "
                         "https:// address, and Iris did not follow it")
        self.location = location


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
    """The socket of one exchange (when known), shut down at its deadline; and an error
    answer once its status came (``refused``) with what of its body came so far
    (``partial``), which is the answer if the deadline passes before the rest."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sockets: list[Any] = []
        self.expired = threading.Event()
        self.refused: httpx.Response | None = None
        self.partial = bytearray()

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

    def cut(self) -> None:
        """Shut the connection down (an error answer's body took too long)."""
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
    reading their bodies, which httpx would read whole, to http(s) addresses only
    (RedirectRefused otherwise). The request to another origin goes without the token,
    as httpx builds it. Raises httpx.HTTPError."""
    for _ in range(MAX_REDIRECTS + 1):
        response = client.send(request, stream=True, follow_redirects=False)
        if watch is not None:
            watch.attach(response.extensions.get("network_stream"))
        if not follow or response.next_request is None:
            return response
        request = response.next_request
        response.close()
        if request.url.scheme not in ("http", "https"):  # before: "cannot be reached
            raise RedirectRefused(response.headers.get("location", ""))  # (UnsupportedProtocol)"
        if watch is not None and watch.expired.is_set():
            raise AnswerTooSlow(0)  # the caller has gone already
    raise httpx.TooManyRedirects("Exceeded maximum allowed redirects.", request=request)


def _body(response: httpx.Response, limit: int, watch: _Watch) -> bytes:
    """The decoded body, at most ``limit`` bytes (an error answer: what
    :func:`read_error_body` reads of it)."""
    if 300 <= response.status_code < 400:
        return b""  # a redirect not followed: only its Location matters
    if response.status_code >= 300:
        watch.refused = response
        return read_error_body(response, min(limit, ERROR_BODY_BYTES), watch.cut, into=watch.partial)
    length = response.headers.get("content-length", "")
    if length.strip().isdigit() and int(length) > limit \
            and not response.headers.get("content-encoding"):
        raise AnswerTooLarge(limit, int(length))
    data = bytearray()
    for piece in decoded_chunks(response):
        if watch.expired.is_set():
            break
        if len(data) + len(piece) > limit:
            raise AnswerTooLarge(limit)
        data += piece
    return bytes(data)


def read_error_body(response: httpx.Response, limit: int, cut: Callable[[], object],
                    wait_s: float | None = None, into: bytearray | None = None) -> bytes:
    """The first ``limit`` decoded bytes of an error answer's body (gathered in ``into``
    as they come, when given), read for ``wait_s`` at most (None:
    :data:`ERROR_BODY_WAIT_S`): then ``cut()`` shuts the connection down, which wakes the
    read, and what came is the body. A body broken off or that does not decode is what
    came of it too: the status says enough."""
    data = bytearray() if into is None else into
    timer = threading.Timer(ERROR_BODY_WAIT_S if wait_s is None else wait_s, cut)
    timer.daemon = True
    timer.start()
    try:
        for piece in decoded_chunks(response):
            data += piece[:limit - len(data)]
            if len(data) >= limit:
                break
    except (httpx.HTTPError, AnswerUndecodable):
        pass  # cut at its time, broken off, or not decodable
    finally:
        timer.cancel()
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
            outcome.append(_read(response, body))
        except BaseException as exc:  # handed to the caller
            outcome.append(exc)
        finally:
            done.set()

    started = time.monotonic()
    thread = threading.Thread(target=work, name="iris-http-answer", daemon=True)
    thread.start()
    if not done.wait(timeout_s):
        watch.expire()  # wakes the helper; it ends by itself, its result unread
        if watch.refused is not None:  # an error status came, its body did not: the status
            return _read(watch.refused, bytes(watch.partial))  # is the answer (before: "too slow")
        raise AnswerTooSlow(timeout_s)
    result = outcome[0]
    if isinstance(result, BaseException):
        if watch.expired.is_set() or (isinstance(result, httpx.TimeoutException)
                                      and time.monotonic() - started >= timeout_s * 0.99):
            raise AnswerTooSlow(timeout_s) from None
        raise result
    return result


def _read(response: httpx.Response, body: bytes) -> httpx.Response:
    """``response`` as read: ``body``, decoded, in place of its stream."""
    headers = [(k, v) for k, v in response.headers.multi_items()
               if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
    return httpx.Response(
        response.status_code, headers=headers, content=body, request=response.request,
        extensions={k: v for k, v in response.extensions.items()
                    if k in ("http_version", "reason_phrase")})


# ---------------------------------------------------------------------------
# the answer parsed

#: an answer may hold one JSON value per this many bytes of its cap (its brackets and
#: commas counted, outside its strings): a real answer has a few per hundred bytes
BYTES_PER_VALUE = 16
#: ... and this many whatever its cap
MIN_VALUES = 1 << 17

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
#: a JSON string, its escapes included: what the count of values leaves out (a prompt
#: holding a CSV, an /apply-template answer of one string, has commas that are no values)
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_SURROGATE = re.compile("[\ud800-\udfff]")


def json_answer(data: bytes | str, limit: int | None = None,
                hook: Callable[[list], Any] | None = None, *, values: int | None = None) -> Any:
    """``data`` (UTF-8; a byte that is not becomes U+FFFD) parsed as JSON, its objects made
    by ``hook`` (json's ``object_pairs_hook``) when given, its text valid Unicode
    (:func:`valid_text`). At most ``values`` JSON values (by default one per
    :data:`BYTES_PER_VALUE` bytes of ``limit``, at least :data:`MIN_VALUES`; neither
    given: no bound), counted before parsing: more raise AnswerTooComplex (parsed, 8 MiB
    of ``{},`` took 190 MB). Raises ValueError and RecursionError as ``json.loads``."""
    text = data.decode("utf-8-sig", "replace") if isinstance(data, bytes | bytearray) else data
    if values is None and limit is not None:
        values = max(MIN_VALUES, limit // BYTES_PER_VALUE)
    if values is not None and _values(text, values) > values:
        raise AnswerTooComplex(values)
    return valid_text(json.loads(text, object_pairs_hook=hook), text)


def _values(text: str, bound: int | None = None) -> int:
    """An upper bound of the JSON values in ``text``: its commas and opening brackets
    outside strings (inside, they are text: a prompt's CSV was refused as "too complex");
    counted in the strings too first, which is quicker, and that count is the answer when
    it is within ``bound``."""
    def count(text: str) -> int:
        return text.count(",") + text.count("{") + text.count("[")

    rough = count(text)
    if bound is not None and rough <= bound or '"' not in text:
        return rough
    return count(_STRING.sub('""', text))


#: JSON a peer sends that Iris keeps as a value (a tool call's arguments: a real one nests
#: a few levels) nests at most this deep; deeper is kept as text. Python's json recurses
#: once per level: arguments nested 5,000 deep ended the turn with "maximum recursion
#: depth exceeded", and 960 deep parsed here but not again on the window's thread.
#: ``core.toolcalls.MAX_ARGUMENT_DEPTH`` is the same (core cannot import this module).
MAX_JSON_DEPTH = 100
_NESTING = re.compile(r"[\[\]{}]")
#: a JSON string; one that does not end runs to the end of the text, as a parser reads it
_STRING_TO_END = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.S)


def nested_deeper(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON text ``text`` nests lists and objects more than ``limit`` levels
    deep: its brackets outside strings counted, before any parser recurses into them."""
    if text.count("[") + text.count("{") <= limit:
        return False  # the usual case: not that many brackets at all
    bare = _STRING_TO_END.sub("", text)  # brackets in strings are text
    if bare.count("[") + bare.count("{") <= limit:
        return False
    depth = 0
    for bracket in _NESTING.findall(bare):
        if bracket in "[{":
            depth += 1
            if depth > limit:
                return True
        elif depth:
            depth -= 1
    return False


def valid_text(value: Any, source: str) -> Any:
    """``value``, parsed from the JSON text ``source``, with every lone surrogate in its
    strings (a ``"\\ud800"`` escape without its pair, which no UTF-8 can hold: storing a
    reply with one failed and lost it) replaced by U+FFFD, as an invalid byte is. Lists
    and objects are changed in place; a string is returned new."""
    if not _SURROGATE_ESCAPE.search(source):  # the usual case: nothing to walk
        return value
    root = [value]
    pending: list[Any] = [root]
    while pending:  # no recursion: the JSON may be nested as deep as json allows
        node = pending.pop()
        items = list(enumerate(node)) if isinstance(node, list) else list(node.items())
        for key, item in items:
            if isinstance(item, list | dict):
                pending.append(item)
            elif isinstance(item, str):
                node[key] = _SURROGATE.sub("\ufffd", item)
            if isinstance(key, str) and _SURROGATE.search(key):
                node[_SURROGATE.sub("\ufffd", key)] = node.pop(key)
    return root[0]


# ---------------------------------------------------------------------------
# what went wrong, in words

#: OpenSSL's words when an https:// request reached a server that does not speak TLS
_NOT_TLS = ("wrong version number", "http request", "packet length too long",
            "record layer failure", "unknown protocol")
#: ... and for a certificate it does not trust (the reason in OpenSSL's words, then ours)
_UNTRUSTED = (
    ("self-signed", "has a self-signed certificate, which this computer does not trust"),
    ("self signed", "has a self-signed certificate, which this computer does not trust"),
    ("local issuer", "has a certificate from an authority this computer does not trust"),
    ("mismatch", "has a certificate for another name than the one in its address"),
    ("expired", "has an expired certificate"),
    ("not yet valid", "has a certificate that is not valid yet (is this computer's clock right?)"),
)
#: how long :func:`failure_cause` waits for a TLS handshake with a peer that reset
TLS_PROBE_S = 3.0


def tls_trouble(exc: httpx.HTTPError) -> tuple[str, str] | None:
    """A connection TLS failed: (``"untrusted"``, ``"not-tls"`` or ``"handshake"``, what
    the peer did, as words that follow its name); None for any other failure."""
    text = str(exc).lower()
    if not isinstance(exc, httpx.ConnectError) or not ("ssl" in text or "certificate" in text):
        return None
    if "certificate verify failed" in text or "certificate_verify_failed" in text:
        return "untrusted", next((words for key, words in _UNTRUSTED if key in text),
                                 "has a certificate this computer does not trust")
    if any(words in text for words in _NOT_TLS):
        return "not-tls", "does not answer with TLS at that port"
    return "handshake", "failed the TLS handshake"


def failure_cause(exc: httpx.HTTPError, setting: str, *, tls_probe: bool = True) -> str | None:
    """What a failed exchange says of the peer, as words that follow its name ("answers
    with TLS: use https:// in model.base_url"), when it is something the user can put
    right (TLS asked of a plain server or the reverse, a certificate not trusted) or a
    peer that does not speak HTTP; None otherwise (the caller says it its own way). Never
    a repr of what the peer sent (a 16 KB ``bytearray(b'…')`` reached the terminal).
    ``setting`` names the address to fix; ``tls_probe``: a peer that reset the connection
    of an http:// request is asked for a TLS handshake (at most :data:`TLS_PROBE_S`) to
    tell a TLS server (do not, through a proxy: the probe goes direct)."""
    text = str(exc).lower()
    url = _url_of(exc)
    scheme = url.scheme if url is not None else ""
    trouble = tls_trouble(exc)
    if trouble is not None:
        kind, said = trouble
        if kind == "untrusted":
            return (f"{said}, so Iris did not connect; give the server a certificate from an "
                    f"authority this computer trusts, or use http:// in {setting} on a network "
                    "you trust")
        if kind == "not-tls":
            return f"{said}: use http:// in {setting}"
        return f"{said}; check that {setting} is its https:// address"
    if isinstance(exc, httpx.RemoteProtocolError):
        if "\\x15\\x03" in text or "\\x16\\x03" in text:  # a TLS record for a status line
            return f"answers with TLS: use https:// in {setting}"
        if "status line" in text or "response line" in text:
            return (f"is not an HTTP server (it answered something else); check the port in "
                    f"{setting}")
    reset = isinstance(exc, httpx.NetworkError) and "reset" in text
    silent = isinstance(exc, httpx.RemoteProtocolError) and "without sending a response" in text
    if (reset or silent) and scheme == "http" and tls_probe and url is not None \
            and _speaks_tls(url):
        return f"answers with TLS: use https:// in {setting}"
    if silent:
        return (f"closed the connection without an HTTP answer; check that {setting} is the "
                "address and port of an HTTP server")
    return None


def short_reason(exc: BaseException, chars: int = 120) -> str:
    """An exception's text as part of a sentence: one line, at most ``chars`` characters,
    what a peer sent (``bytearray(b'…')``, ``b'…'``) left out."""
    text = " ".join(str(exc).split())
    text = re.sub(r"(?:bytearray\()?(?<!\w)b(['\"]).*?\1\)?", "…", text)
    return text if len(text) <= chars else text[:chars - 1] + "…"


def shown_address(url: str, chars: int = 120) -> str:
    """An address a peer gave, as part of a sentence: one line, its query left out, at
    most ``chars`` characters."""
    text = "".join(str(url).split()).split("?", 1)[0].split("#", 1)[0]
    return text if len(text) <= chars else text[:chars - 1] + "…"


def _url_of(exc: httpx.HTTPError) -> httpx.URL | None:
    try:
        return exc.request.url
    except RuntimeError:  # an exception made without its request
        return None


def _speaks_tls(url: httpx.URL) -> bool:
    """Whether the peer at ``url``'s host and port completes a TLS handshake (any
    certificate: only the protocol is asked)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((url.host, url.port or 80), timeout=TLS_PROBE_S) as raw, \
                context.wrap_socket(raw, server_hostname=url.host or None):
            return True
    except (OSError, ValueError):  # ssl.SSLError is an OSError
        return False
