"""Every request to one server (:class:`_Http`): to the base URL's host only, with the
API key as a bearer token, connects retried and never a request in flight; an answer
read whole is bounded in size and time (``runtime.http``). Also what went wrong, in
words: a failed connection, an error answer, a redirect (followed never), and an answer
of the wrong shape."""

from __future__ import annotations

import html
import re
import time
from collections.abc import Callable
from typing import Any

import httpx

from ..errors import PromptTooLongError, ServerError
from ..http import (
    ERROR_BODY_BYTES,
    MIN_VALUES,
    AnswerError,
    AnswerTooComplex,
    AnswerTooLarge,
    AnswerTooSlow,
    failure_cause,
    json_answer,
    read_answer,
    read_error_body,
    short_reason,
    shown_address,
    size_words,
)
from .address import clean_api_key, refuse_query, server_address
from .deadline import ConnectClock


class ServerRefused(ServerError):
    """The server answered a request with an error (``status``: its HTTP status), as
    opposed to not answering at all: a count whose probe shape a template refuses (a
    4xx) is estimated instead; a server that cannot be reached is no such refusal."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


CONNECT_TIMEOUT_S = 5.0
#: a refused or timed-out connect is tried again this many times (a reply never is)
CONNECT_RETRIES = 2
#: a probe or a count may take this long, the whole exchange (connecting, headers, body)
REQUEST_TIMEOUT_S = 30.0
#: the most an answer read whole (a probe, a model list, the calibration) may hold, counted
#: after decoding (a gzip body is inflated a step at a time, so a gzip bomb stops here)
MAX_ANSWER_BYTES = 8 << 20
#: the same for a count's answer, which grows with the prompt (``/tokenize`` lists every
#: token, ``/apply-template`` returns the whole prompt); a ``/tokenize`` answer is bounded
#: by its text as well (:func:`tokens_answer_limit`)
MAX_COUNT_ANSWER_BYTES = 64 << 20
#: a count that is one number (``{"input_tokens": 12}``) needs no more than this
MAX_NUMBER_ANSWER_BYTES = 1 << 16
#: the most tokens a text can be, beyond one per byte (BOS, EOS, a leading space)
TEXT_MARGIN_TOKENS = 16
#: ... and a whole request, beyond one per byte of its JSON: what the template adds (its
#: turn markers, a default system prompt, the instructions around tools)
TEMPLATE_MARGIN_TOKENS = 4096
#: bytes of a ``/tokenize`` answer per token at most (an id of up to 7 digits and a comma)
BYTES_PER_TOKEN = 16


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
    count) and ``answer_timeout_s`` for the whole exchange (``runtime.http``); while
    ``clock`` is set (a connect), by what is left of its deadline too, and waited for
    through it (:class:`~.deadline.ConnectClock`: what is awaited is said, a cancel heard).
    """

    #: the connect under way, if any (set by the one who connects, then cleared)
    clock: ConnectClock | None = None

    def __init__(self, base_url: str, api_key: str | None, *, answer_limit: int | None = None,
                 answer_timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.address = server_address(base_url)
        refuse_query(base_url)
        root = base_url.strip().rstrip("/")
        self.root = root[:-3] if root.endswith("/v1") else root
        self.answer_limit = answer_limit
        self.answer_timeout_s = float(answer_timeout_s)
        api_key = clean_api_key(base_url, api_key)
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

    def post(self, path: str, body: dict, *, missing_ok: bool = False,
             limit: int | None = None) -> Any:
        """As :meth:`get`; ``limit``: the answer's cap in bytes, when less than usual."""
        return self._send("POST", path, body, missing_ok, limit)

    def _send(self, method: str, path: str, body: dict | None, missing_ok: bool,
              limit: int | None = None) -> Any:
        """The JSON answer (:func:`runtime.http.json_answer`: its values bounded by its
        cap, its text valid Unicode); None for an endpoint this server does not have (404,
        405, 501) when ``missing_ok``. Raises ServerError (PromptTooLongError for a prompt
        the server says does not fit)."""
        cap = self.answer_limit or _LIMITS.get(path, MAX_ANSWER_BYTES)
        limit = min(cap, limit) if limit else cap
        clock = self.clock
        timeout = (self.answer_timeout_s if clock is None
                   else clock.timeout_for(path, self.answer_timeout_s))
        sent = time.monotonic()
        try:
            request = self.client.build_request(method, self.url(path), json=body)

            def read() -> Any:
                return read_answer(self.client, request, limit=limit, timeout_s=timeout)

            response = read() if clock is None else clock.wait(path, read)
        except AnswerError as exc:
            if isinstance(exc, AnswerTooSlow) and clock is not None \
                    and timeout < self.answer_timeout_s:  # the connect's time ran out, not its own
                raise clock.expired(path, time.monotonic() - sent) from None
            raise ServerError(self._bound_error(exc, path)) from None
        except httpx.HTTPError as exc:
            raise ServerError(_failure(self.address, exc)) from None
        except UnicodeEncodeError:  # a model name that is not text (checked by the probe)
            raise ServerError(f"{self.address}: the request to {path} holds text that cannot be "
                              "sent (not valid Unicode)") from None
        if missing_ok and response.status_code in (404, 405, 501):
            return None
        if response.status_code >= 300:
            raise _http_error(self.address, response, path)
        try:
            return json_answer(response.content, limit,
                               values=MIN_VALUES if path == "/apply-template" else None)
        except AnswerError as exc:
            raise ServerError(self._bound_error(exc, path)) from None
        except ValueError:
            raise ServerError(f"{self.address}: {path} did not answer JSON") from None
        except RecursionError:  # a Python error before ("maximum recursion depth exceeded")
            raise ServerError(f"{self.address} answered {path} in a way Iris cannot read: "
                              f"its JSON is nested too deeply") from None

    def _bound_error(self, exc: AnswerError, path: str) -> str:
        """One sentence naming the server and the bound its answer to ``path`` broke."""
        what = f"{_ANSWERS.get(path, 'its answer')} ({path})"
        server = f"the server at {self.root}"
        if isinstance(exc, AnswerTooLarge):  # a Content-Length: said as announced, not sent
            if exc.announced is not None:
                return (f"{server} announced an answer of {size_words(exc.announced)} "
                        f"(Content-Length) for {what}, more than the {size_words(exc.limit)} "
                        f"Iris reads, so Iris did not read it; check that model.base_url is a "
                        f"model server")
            return (f"{server} sent more than {size_words(exc.limit)} for {what}, so Iris stopped "
                    f"reading it; check that model.base_url is a model server")
        if isinstance(exc, AnswerTooComplex):  # before: parsed, 8 MiB of {} took 190 MB
            return (f"{server} sent {what} as more than {exc.values:,} JSON values, more than a "
                    f"real one holds, so Iris did not read it; check that model.base_url is a "
                    f"model server")
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
#: the caps of the answers that are not :data:`MAX_ANSWER_BYTES`: those that grow with the
#: prompt counted, and a count that is one number
_LIMITS = {"/v1/chat/completions/input_tokens": MAX_NUMBER_ANSWER_BYTES,
           "/tokenize": MAX_COUNT_ANSWER_BYTES, "/apply-template": MAX_COUNT_ANSWER_BYTES}


def tokens_answer_limit(text_bytes: int, margin: int = TEXT_MARGIN_TOKENS) -> int:
    """The most a ``/tokenize`` answer for ``text_bytes`` bytes may hold: a token per byte
    and ``margin`` more, :data:`BYTES_PER_TOKEN` each (a 64 MiB answer for five
    characters took 1.7 GB to read)."""
    return BYTES_PER_TOKEN * (text_bytes + margin) + 4096


def _failure(address: str, exc: httpx.HTTPError) -> str:
    """The sentence for a request to the server at ``address`` that failed on its way:
    the cause the user can put right when there is one (TLS, a certificate, not HTTP)."""
    cause = failure_cause(exc, "model.base_url")
    return f"the server at {address} {cause}" if cause else f"{address}: {_describe(exc)}"


def _describe(exc: httpx.HTTPError) -> str:
    """What went wrong on the way to the server, in words (the OS's text in brackets, cut
    short; never what the server sent: a 16 KB ``bytearray(b'…')`` reached the terminal)."""
    text, low = short_reason(exc), str(exc).lower()
    if isinstance(exc, httpx.ConnectError):
        if "refused" in low:
            return ("nothing answers at that address (connection refused); check that the "
                    "server is running and the address and port are right")
        if "name or service not known" in low or "nodename nor servname" in low \
                or "getaddrinfo" in low:
            return f"the host name cannot be found; check the address ({text})"
        return f"cannot connect ({text})"
    if isinstance(exc, httpx.TimeoutException):
        return "the server did not answer in time; check that it is running and not overloaded"
    if isinstance(exc, httpx.RemoteProtocolError):
        return next((words for key, words in _PROTOCOL_WORDS if key in low),
                    "the server broke off the connection or answered something that is not HTTP")
    if isinstance(exc, httpx.LocalProtocolError):  # its text can quote a header: the key
        return "Iris could not make a valid HTTP request of it (a header was malformed)"
    if isinstance(exc, httpx.NetworkError):  # before: "ReadError: [Errno 104] …"
        return ("the server reset the connection" if "reset" in low
                else f"the connection failed ({text})")
    return f"the request failed ({text})"


#: what h11 says of a peer's answer that is not valid HTTP, in words (h11 quotes the bytes)
_PROTOCOL_WORDS = (
    ("chunk", "the server sent a malformed HTTP chunk"),
    ("complete message body", "the server closed the connection before its answer was complete"),
    ("without sending a response", "the server closed the connection without answering"),
    ("status line", "the server answered something that is not HTTP"),
    ("response line", "the server answered something that is not HTTP"),
    ("header", "the server sent a malformed HTTP header"),
    ("buffer too long", "the server sent HTTP headers larger than Iris reads"),
)


#: the most of a server's own error message an error repeats, in characters
SERVER_MESSAGE_CHARS = 300


def server_said(message: Any) -> str:
    """A server's error message as part of one sentence: on one line, at most
    :data:`SERVER_MESSAGE_CHARS` characters ("…" where cut; an 800 KB message reached the
    terminal, the log and the chat whole), a web page named as one, none said as none."""
    text = " ".join(str(message).split()) if message is not None else ""
    said = ""
    if text[:1] == "<" and any(tag in text[:300].lower() for tag in ("<html", "<!doctype", "<body")):
        said = "it answered with a web page"  # its words, without the markup
        text = re.sub(r"(?is)<(script|style)\b.*?</\1\s*>|<[^>]*>", " ", text)
        text = " ".join(html.unescape(text).split())
        if not text:
            return said
        said += ": "
    if not text:
        return "it did not say why"
    cut = SERVER_MESSAGE_CHARS - len(said)
    return said + (text if len(text) <= cut else text[:cut - 1] + "…")


def _http_error(address: str, response: httpx.Response, path: str = "") -> Exception:
    """The exception for an error answer: PromptTooLongError when llama.cpp says the
    prompt exceeds the context (it gives both numbers), a ServerError saying where a
    redirect points (Iris follows none), else ServerError with the server's own
    message. ``path``: what was asked, from the base URL (``/props``)."""
    if 300 <= response.status_code < 400:
        return _redirect_error(address, response, path or response.request.url.path)
    try:
        answer = json_answer(response.content, ERROR_BODY_BYTES)
    except (ValueError, RecursionError, AnswerError):  # not JSON, or nested too deeply to read
        answer = {}
    # llama.cpp and OpenAI nest {"error": {...}}; vLLM puts "message" at the top
    error = (answer.get("error") or answer) if isinstance(answer, dict) else {}
    if not isinstance(error, dict):
        error = {"message": str(error)}
    if error.get("type") == "exceed_context_size_error":
        prompt, window = _whole(error.get("n_prompt_tokens")), _whole(error.get("n_ctx"))
        if prompt and window:  # else a broken report: said as the HTTP error it is
            return PromptTooLongError(prompt, window)
    if response.status_code in (401, 403):
        if not response.request.headers.get("authorization"):  # none was sent: none is set
            return ServerError(f"{address} needs an API key and none is set (HTTP "
                               f"{response.status_code}); type it in Model ▸ Server… in the "
                               f"window (it is kept in the system keyring, where the "
                               f"iris-desktop command finds it too)")
        return ServerError(f"{address} refused the API key (HTTP {response.status_code})")
    message = (error.get("message") or (None if answer else response.text[:1000])
               or response.reason_phrase)  # a JSON answer without a message: the status
    return ServerRefused(f"{address}: HTTP {response.status_code}: {server_said(message)}",
                         response.status_code)


def _redirect_error(address: str, response: httpx.Response, path: str) -> ServerError:
    """A redirect of ``path`` (from the base URL), said with its target and the address
    to set instead: following one could carry the conversation and the API key to
    another host."""
    location = response.headers.get("location", "").strip()
    if not location:
        return ServerError(f"{address} redirected {path} (HTTP {response.status_code}) without "
                           f"saying where; Iris does not follow redirects, so set "
                           f"model.base_url to the server's final address")
    try:
        target = str(response.request.url.join(location))
    except (httpx.InvalidURL, ValueError):
        target = location
    final = target.split("?", 1)[0].split("#", 1)[0]  # a query may hold a token
    suggestion = f"{final[:-len(path)]}/v1" if path and final.endswith(path) else None
    return ServerError(f"{address} redirected {path} to {shown_address(final, SHOWN_URL_CHARS)}; Iris does not "
                       f"follow redirects, so set model.base_url to the final address"
                       + (f" ({shown_address(suggestion, SHOWN_URL_CHARS)})" if suggestion else ""))


#: the most of a URL a server gave that an error repeats, in characters (a 60 KB
#: ``Location`` was repeated whole)
SHOWN_URL_CHARS = 200


def _read_some(response: httpx.Response, cut: Callable[[], object],
               limit: int = ERROR_BODY_BYTES) -> httpx.Response:
    """``response`` with at most ``limit`` bytes of its body read, for at most
    ``runtime.http.ERROR_BODY_WAIT_S`` (then ``cut()`` shuts its connection down): an
    error answer is read for its message, and a server can make that neither hold more
    nor hide the status (a ``500`` whose body never came was said as "sent no text
    within 600 s")."""
    data = read_error_body(response, limit, cut)
    headers = {k: v for k, v in response.headers.items()
               if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")}
    return httpx.Response(response.status_code, headers=headers, content=data,
                          request=response.request)


# ---------------------------------------------------------------------------
# the shape of an answer

_KINDS = {dict: "an object", list: "a list", str: "a string", bool: "true or false",
          int: "a number", float: "a number", type(None): "null"}
_WANTED = {dict: "an object", list: "a list", str: "a string", int: "a whole number"}


def _kind(value: Any) -> str:
    """What a JSON value is, in words ("a string")."""
    return _KINDS.get(type(value), type(value).__name__)


def _obj(value: Any) -> dict:
    """``value`` when it is a JSON object, else {} (a description field of another shape
    is as good as absent)."""
    return value if isinstance(value, dict) else {}


#: a context window (or a count of tokens in one) a server states is believed up to this
#: (16 Mi tokens; ``model.n_ctx`` allows 1 Mi): a larger one is a broken server's, and
#: taken for the window would mean a chat that never compacts
MAX_SERVER_WINDOW = 1 << 24


def _whole(value: Any) -> int | None:
    """``value`` when it is a whole number from 1 to :data:`MAX_SERVER_WINDOW`, else None."""
    return (value if isinstance(value, int) and not isinstance(value, bool)
            and 0 < value <= MAX_SERVER_WINDOW else None)


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

