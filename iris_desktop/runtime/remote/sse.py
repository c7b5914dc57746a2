"""A streamed reply: Server-Sent Events split into lines (none longer than
:data:`MAX_LINE_BYTES`), read on a helper thread (:class:`_EventReader`) so that the
caller can stop within :data:`POLL_S`, each ``data:`` field checked to be a JSON object
of the expected shape, and what the events told gathered in a :class:`_Reply` (text,
tool calls, usage numbers believed only as token counts)."""

from __future__ import annotations

import itertools
import json
import logging
import math
import queue
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from iris_desktop.generation import GenerationStats

from ..errors import PromptTooLongError, ServerError
from ..http import (
    MAX_JSON_DEPTH,
    AnswerUndecodable,
    decoded_chunks,
    failure_cause,
    json_answer,
    nested_deeper,
    short_reason,
    valid_text,
)
from .transport import _WANTED, _describe, _http_error, _kind, _read_some, server_said

log = logging.getLogger("iris.runtime.remote")

#: the longest line a stream may send (one event is a few hundred bytes; a reply's whole
#: text in one event, 32,768 tokens of it, fits too)
MAX_LINE_BYTES = 1 << 20
#: lines read ahead of the caller at most
QUEUE_LINES = 1024
#: how often a waiting stream checks Stop, the deadline and close
POLL_S = 0.1
#: a token count a server reports is believed up to this; more, a negative number or a
#: fraction is a broken server's, ignored (with a note in the log)
MAX_REPORTED_TOKENS = 10**9


class LineTooLong(ValueError):
    """A stream's line grew past its limit before it ended."""


_LINE_END = re.compile(rb"\r\n|\r|\n")


def _sse_lines(chunks: Iterable[bytes], limit: int = MAX_LINE_BYTES) -> Iterator[str]:
    """The lines of an event stream (ended by CRLF, CR or LF, as SSE allows), decoded as
    UTF-8. Raises LineTooLong as soon as a line exceeds ``limit`` bytes: no more than
    ``limit`` and one chunk is ever held. Each byte is searched for a line end once (a
    line that came in 1,024 pieces was searched again from its start for each: 512 MiB
    searched for a line of 1 MiB)."""
    buffer = bytearray()
    searched = 0  # the buffer's first bytes, searched already and holding no line end
    for chunk in chunks:
        buffer += chunk
        start = 0
        while True:
            found = _LINE_END.search(buffer, max(start, searched))
            # a CR at the end may be the first half of a CRLF: wait for the next chunk
            if found is None or (found.group() == b"\r" and found.end() == len(buffer)):
                break
            if found.start() - start > limit:
                raise LineTooLong(found.start() - start)
            yield buffer[start:found.start()].decode("utf-8", "replace")
            start = found.end()
        del buffer[:start]
        # a CR at the end is searched again: the next chunk may begin with its LF
        searched = len(buffer) - buffer.endswith(b"\r")
        if searched > limit:
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
        #: the stream ended with ``data: [DONE]``: the server finished the reply (some
        #: send no finish reason before it)
        self.done = False
        #: ``time.monotonic()`` when the response headers came (None: not yet)
        self.answered_at: float | None = None
        #: the headers came with an error status: its body is read for its message (for
        #: ``runtime.http.ERROR_BODY_WAIT_S`` at most), and the status is the answer
        self.refused = False
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
                    self.refused = True
                    self._put(_http_error(self._address, _read_some(response, self._shutdown),
                                          "/v1/chat/completions"))
                    return
                try:
                    # decoded here a step at a time: a compressed line cannot balloon unseen
                    chunks = decoded_chunks(response)
                    first = next((c for c in chunks if c.strip()), b"")
                    not_a_stream = _not_a_stream(first, chunks)
                    if not_a_stream:
                        self._put(ServerError(
                            f"{self._address} answered with {not_a_stream}, not a stream of "
                            "events, so there is no reply; check that model.base_url is an "
                            "OpenAI-compatible server's address (it usually ends in /v1) and "
                            "that it streams"))
                        return
                    for line in _sse_lines(itertools.chain([first], chunks)):
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
        ``event:`` or ``id:`` field), so that the caller can check its time limits (not
        while an error answer's body is read: its status comes next, not a timeout).
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
                raise self._failed(item) from None
            if item is None:
                if not self.refused:  # an error's body, read for a few seconds at most, is
                    yield None, time.monotonic()  # no time limit's: its status is the answer
                continue
            when, line = item
            if not line.startswith("data:"):
                yield None, when
                continue
            event = _parse_data(line[5:].strip(), self._address)
            if event is None:
                self.done = True
                return
            yield event, when

    def _failed(self, exc: Exception) -> ServerError:
        """The sentence for a stream that failed: a cause the user can put right (TLS, a
        certificate, not HTTP); "could not reach" only when nothing connected (before, a
        server that answered "SSH-2.0-…" was "not reached … is it running?"); else the
        connection lost mid-reply or before the answer. Never what the server sent."""
        log.info("%s: the stream failed: %s", self._address, short_reason(exc, 300))
        why = _describe(exc) if isinstance(exc, httpx.HTTPError) else short_reason(exc)
        if self.answered_at is not None:
            return ServerError(f"{self._address}: the connection was lost mid-reply ({why})")
        cause = failure_cause(exc, "model.base_url") if isinstance(exc, httpx.HTTPError) else None
        if cause:
            return ServerError(f"the server at {self._address} {cause}")
        with self._lock:
            connected = self._socket is not None
        if not connected:  # nothing came back: it was never reached
            return ServerError(f"could not reach the server at {self._address} ({why}); "
                               "is it running?")
        return ServerError(f"the server at {self._address} took the request but did not "
                           f"answer it ({why})")

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


def _unreadable(address: str, what: str) -> ServerError:
    return ServerError(f"{address} sent a reply Iris cannot read: {what}")


def _parse_data(payload: str, address: str) -> dict | None:
    """The JSON object of one ``data:`` field; None for ``[DONE]``. Raises ServerError for
    an error event (llama.cpp sends ``data: {"error": ...}`` once the stream has begun)
    and for anything but a JSON object."""
    if payload == "[DONE]":
        return None
    try:  # a lone surrogate ("\\ud800") becomes U+FFFD: the store could not hold it
        event = valid_text(json.loads(payload), payload)
    except ValueError:
        raise _unreadable(address, f"an event is not JSON ({payload[:80]!r})") from None
    except RecursionError:  # before: "The model failed: maximum recursion depth exceeded"
        raise _unreadable(address, "an event's JSON is nested too deeply") from None
    if isinstance(event, dict) and event.get("error"):
        error = event["error"]
        message = error.get("message") if isinstance(error, dict) else str(error)
        raise ServerError(f"{address}: the server failed mid-reply: {server_said(message)}")
    if not isinstance(event, dict):
        raise _unreadable(address, f"an event is {_kind(event)}, not an object")
    return event


def _field(value: Any, wanted: type, what: str, address: str) -> Any:
    """``value`` when it is None (absent) or a ``wanted``; else ServerError naming the
    field ``what`` and what it is instead."""
    if value is None or (isinstance(value, wanted) and not isinstance(value, bool)):
        return value
    raise _unreadable(address, f"{what} is {_kind(value)}, not {_WANTED[wanted]}")



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


#: a generation rate a server reports is believed up to this many tokens a second
MAX_REPORTED_RATE = 1e5
#: ... and up to this many times the rate the reply's own timing shows
MAX_RATE_RATIO = 10.0


def _rate(value: Any, address: str, completion: int = 0, span_s: float = 0.0) -> float:
    """A tokens-per-second figure the server reported (0.0: none usable): a number from
    0 to :data:`MAX_REPORTED_RATE`, and at most :data:`MAX_RATE_RATIO` times
    ``completion`` tokens over ``span_s``, the seconds from the reply's first text to its
    last, when those are known (a server's 999,999,999 tok/s for a 2-token reply was
    shown as it came)."""
    if value is None:
        return 0.0
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) \
            and 0 <= value <= MAX_REPORTED_RATE and not (
                completion > 1 and span_s > 0 and value > MAX_RATE_RATIO * completion / span_s):
        return float(value)
    log.warning("%s reported predicted_per_second = %.80r; ignored", address, value)
    return 0.0


#: a reported prompt size outside these times the count made before sending is a broken
#: report (as the calibration's bounds: no tokenizer is four times another)
MIN_REPORTED_RATIO = 0.25
MAX_REPORTED_RATIO = 4.0


@dataclass
class ServerGenerationStats(GenerationStats):
    """GenerationStats with what a server's reply had besides its text: ``thought_chars``,
    the characters of reasoning it streamed (``reasoning_content``), which Iris neither
    shows nor keeps, so that a reply that is only thinking can be said as such."""

    thought_chars: int = 0
    #: the reply had text or a tool call (False: nothing but thinking, if anything)
    answered: bool = True
    #: the max_tokens sent: model.max_tokens, or less where the window left less room
    max_tokens_sent: int | None = None


#: the most tool calls one streamed reply may make (tools.max_calls_per_turn is at most
#: a few dozen; more is a server gone wrong)
MAX_STREAMED_CALLS = 64


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
        #: characters of reasoning (``reasoning_content``), which is neither shown nor kept
        self.thought_chars = 0
        self.usage: dict = {}
        self.timings: dict = {}
        self.finish_reason: str | None = None
        #: the streamed tool calls by index: their name and their arguments' pieces
        self.calls: dict[int, dict[str, Any]] = {}
        #: a choice came with a ``delta``: the stream is in the chat schema
        self.deltas = False

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
            if choice.get("index") not in (None, 0):  # another reply (n > 1): before, the
                continue  # choices' texts were merged into one ("A0 B1 ")
            delta = _field(choice.get("delta"), dict, "'delta'", address)
            if delta is None:  # not the chat stream's schema, or a chunk with nothing
                delta = self._undelta(choice)
            else:
                self.deltas = True
            piece = _field(delta.get("content"), str, "'content'", address) or ""
            calls = _field(delta.get("tool_calls"), list, "'tool_calls'", address) or []
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            finish = _field(choice.get("finish_reason"), str, "'finish_reason'", address)
            text += piece
            for call in calls:
                self._add_call(call)
            self.finish_reason = finish or self.finish_reason
            if isinstance(thought, str):
                self.thought_chars += len(thought)
            if piece or calls or (isinstance(thought, str) and thought):
                now = time.perf_counter()
                self.first = self.first or now
                self.last = now
                self.pieces += 1
                self.chunks += 1
        self.chars += len(text)
        return text

    def _undelta(self, choice: dict) -> dict:
        """What a choice without a ``delta`` carries, as one: its ``message`` (the schema of
        an answer read whole: its content, its calls) or its ``text`` (a completion's);
        before, their text was dropped and the model blamed for an empty reply. Not once
        the stream has sent deltas: then a ``message`` is the whole reply again."""
        if self.deltas:
            return {}
        message, text = choice.get("message"), choice.get("text")
        if isinstance(message, dict):
            return message
        return {"content": text} if isinstance(text, str) else {}

    def _add_call(self, delta: Any) -> None:
        """OpenAI streams a call as deltas: the name once, the arguments in pieces. Their
        characters count toward the reply's bound as its text does, and a reply holds at
        most :data:`MAX_STREAMED_CALLS` calls (before, a server's 900 KiB pieces grew one
        call to gigabytes, and 50,000 calls became 50,000 rows of the history)."""
        address = self.address
        if not isinstance(delta, dict):
            raise _unreadable(address, f"a tool call is {_kind(delta)}, not an object")
        index = _field(delta.get("index"), int, "a tool call's 'index'", address)
        function = _field(delta.get("function"), dict, "'function'", address) or {}
        name = _field(function.get("name"), str, "'name'", address) or ""
        call_id = delta.get("id") if isinstance(delta.get("id"), str) else ""
        if index is None:  # some servers send none: a delta goes on with the last call
            last = self.calls.get(max(self.calls)) if self.calls else None  # unless it starts
            new = last is None or (call_id and call_id != last["id"]) or (name and last["name"])
            index = len(self.calls) if new else max(self.calls)  # another (an id or a name)
        if index not in self.calls and len(self.calls) >= MAX_STREAMED_CALLS:
            raise ServerError(f"{address} sent more than {MAX_STREAMED_CALLS} tool calls in one "
                              "reply, so the reply was cut off there")
        entry = self.calls.setdefault(index, {"name": "", "arguments": [], "id": call_id})
        arguments = function.get("arguments")
        if isinstance(arguments, dict):  # some servers send the arguments as an object
            try:
                arguments = json.dumps(arguments, ensure_ascii=False)
            except RecursionError:  # its event only just parsed
                raise _unreadable(address, "a tool call's arguments are nested too "
                                           "deeply") from None
        piece = _field(arguments, str, "'arguments'", address) or ""
        entry["name"] = entry["name"] or name
        entry["id"] = entry["id"] or call_id
        entry["arguments"].append(piece)
        self.chars += len(name) + len(piece)

    def tool_call_text(self) -> str:
        """The streamed tool calls as ``<tool_call>{"name", "arguments"}</tool_call>``
        blocks, which ``core.toolcalls.parse_tool_calls`` turns into stored calls (arguments
        that are not JSON, or nest deeper than :data:`MAX_JSON_DEPTH`, stay a string, and
        become a malformed call the model hears of)."""
        blocks = []
        for index in sorted(self.calls):
            call = self.calls[index]
            text = "".join(call["arguments"])
            arguments: Any = text
            if not nested_deeper(text, MAX_JSON_DEPTH):  # 5,000 deep: "The model failed:
                try:  # maximum recursion depth exceeded" before; 960: tracebacks in the window
                    arguments = valid_text(json.loads(text or "{}"), text)
                except (ValueError, RecursionError):
                    arguments = _repeated_whole(call["arguments"], text)
            blocks.append("<tool_call>" + json.dumps(
                {"name": call["name"], "arguments": arguments}, ensure_ascii=False)
                + "</tool_call>")
        return "".join(blocks)

    def prompt_tokens(self, prompt_size: int, n_ctx: int) -> int | None:
        """The ``prompt_tokens`` the server reported, when it can be this prompt's size:
        at most the window ``n_ctx`` and within :data:`MIN_REPORTED_RATIO` to
        :data:`MAX_REPORTED_RATIO` of ``prompt_size``, the count made before sending;
        None otherwise (said in the log). A server's 999,999,999 was stored as the
        thread's last prompt size, and made compaction due at every turn."""
        reported = _tokens(self.usage.get("prompt_tokens"), "prompt_tokens", self.address)
        if not reported:
            return reported
        if reported > n_ctx or (prompt_size > 0 and not MIN_REPORTED_RATIO
                                <= reported / prompt_size <= MAX_REPORTED_RATIO):
            log.warning("%s reported prompt_tokens = %d for a prompt counted as %d in a "
                        "%d-token window; ignored", self.address, reported, prompt_size, n_ctx)
            return None
        return reported

    def stats(self, prompt_size: int, outcome: str | None, n_ctx: int = MAX_REPORTED_TOKENS,
              max_tokens: int = MAX_REPORTED_TOKENS) -> GenerationStats:
        """GenerationStats from what the server reported (``usage``; llama.cpp's
        ``timings``: ``cache_n`` reused, ``prompt_n`` evaluated), else from the count
        made before sending and what was seen. A count the server sent as anything but
        a whole number from 0 to :data:`MAX_REPORTED_TOKENS` counts as not sent
        (:func:`_tokens`), a prompt size that cannot be this prompt's too
        (:meth:`prompt_tokens`), none exceeds the prompt it is part of, and the reply
        is at most the ``max_tokens`` it was asked for."""
        usage, timings, address = self.usage, self.timings, self.address

        def count(source: dict, key: str) -> int | None:
            return _tokens(source.get(key), key, address)

        prompt = self.prompt_tokens(prompt_size, n_ctx) or prompt_size
        details = usage.get("prompt_tokens_details")
        cached = (count(details, "cached_tokens") or 0) if isinstance(details, dict) else 0
        reused = count(timings, "cache_n")
        reused = min(prompt, cached if reused is None else reused)
        # a stream stopped before the server said anything: nothing is known evaluated
        evaluated = count(timings, "prompt_n")
        if evaluated is None:
            evaluated = prompt - reused if self.first or usage else 0
        evaluated = min(prompt, evaluated)
        completion = next((n for n in (count(usage, "completion_tokens"),
                                       count(timings, "predicted_n")) if n and n <= max_tokens),
                          min(max_tokens, self.pieces))  # more than asked for: not this reply's
        span = (self.last - self.first) if self.first and self.last else 0.0
        rate = _rate(timings.get("predicted_per_second"), address, completion, span)
        if not rate and completion > 1 and self.first and self.last and self.last > self.first:
            rate = (completion - 1) / (self.last - self.first)
        # "content_filter": the server's filter cut the reply (before, stored as finished)
        finish = outcome or (self.finish_reason if self.finish_reason in ("length", "content_filter")
                             else "stop")
        return ServerGenerationStats(
            prompt_tokens=prompt, reused_tokens=reused, evaluated_tokens=evaluated,
            completion_tokens=completion,
            time_to_first_token_s=(self.first - self.started) if self.first else 0.0,
            tokens_per_s=rate, duration_s=time.perf_counter() - self.started,
            finish_reason=finish, thought_chars=self.thought_chars,
            answered=self.chars > 0, max_tokens_sent=max_tokens)


def _repeated_whole(pieces: list[str], text: str) -> Any:
    """The arguments of a call whose every delta repeated the whole JSON object (some
    servers stream a call so), as that object; else ``text`` as it came."""
    whole = [p for p in pieces if p]
    if whole and all(p == whole[0] for p in whole):
        try:
            value = valid_text(json.loads(whole[0]), whole[0])
        except (ValueError, RecursionError):
            return text
        if isinstance(value, dict):
            return value
    return text


def _not_a_stream(first: bytes, rest: Iterator[bytes]) -> str:
    """What a streamed reply's body is, in words, when its first bytes show it is not a
    stream of events (whatever its ``Content-Type`` says: some servers send a real
    stream as ``application/json``): a web page, or a whole JSON answer (its error's
    message when it has one); "" otherwise."""
    start = first.lstrip()[:1]
    if start == b"<":
        return "a web page"
    if start != b"{":
        return ""
    body = bytearray(first)
    for chunk in rest:  # a whole answer is small; read at most 64 KiB of it
        body += chunk
        if len(body) > 1 << 16:
            break
    try:
        answer = json_answer(bytes(body))
    except (ValueError, RecursionError):  # not JSON, or nested too deeply to read
        return "one whole JSON answer"
    error = answer.get("error") if isinstance(answer, dict) else None
    message = (error.get("message") if isinstance(error, dict) else error) or ""
    return f"an error ({server_said(message)})" if message else "one whole JSON answer"
