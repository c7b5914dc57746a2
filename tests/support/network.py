"""Fixtures for tests that reach the network on loopback: no proxy from the developer's
shell (a loopback server must be reached directly, by subprocesses too), a keyring in
memory (or none at all), and a record of every address the process connects to or looks
up. Loaded as a
pytest plugin by ``tests/conftest.py``; a module asks for the first with
``pytestmark = pytest.mark.usefixtures("no_proxy_no_keyring")``. Also
:class:`ScriptedSocketServer`, a loopback server whose answers a test writes byte for
byte (:func:`http_answer`, :func:`event_stream`, :func:`openai_answers`)."""

from __future__ import annotations

import json
import socket
import threading
from typing import Any

import keyring
import pytest

from support.hub_server import MemoryKeyring

PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy",
              "all_proxy", "no_proxy")


@pytest.fixture
def no_proxy_no_keyring(monkeypatch):
    """No proxy variable, and a keyring in memory (the system's is never touched)."""
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
    before = keyring.get_keyring()
    keyring.set_keyring(MemoryKeyring())
    yield
    keyring.set_keyring(before)


@pytest.fixture
def no_keyring(monkeypatch):
    """No keyring, whatever the developer's machine has (a test may plug in its own, as
    :func:`memory_keyring` does); subprocesses get none either."""
    from keyring.backends.fail import Keyring as Fail

    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.fail.Keyring")
    previous = keyring.get_keyring()
    keyring.set_keyring(Fail())
    yield
    keyring.set_keyring(previous)


def memory_keyring() -> dict[tuple[str, str], str]:
    """A keyring in memory plugged in (the keyring package's own extension point; it
    refuses to delete what it does not hold, as real keyrings do): its passwords by
    (service, user)."""
    memory = MemoryKeyring()
    keyring.set_keyring(memory)
    return memory.passwords


@pytest.fixture
def connects(monkeypatch):
    """Every address this process connects a socket to (or looks up), from now on."""
    seen: list = []
    connect, connect_ex, lookup = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo

    def record_connect(self, address):
        seen.append(address)
        return connect(self, address)

    def record_connect_ex(self, address):
        seen.append(address)
        return connect_ex(self, address)

    def record_lookup(host, *args, **kwargs):
        seen.append(("lookup", host))
        return lookup(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", record_connect)
    monkeypatch.setattr(socket.socket, "connect_ex", record_connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", record_lookup)
    return seen


class Held(bytes):
    """An answer after which :class:`ScriptedSocketServer` holds the connection open."""


class ScriptedSocketServer:
    """A loopback HTTP server whose answers a test writes byte for byte, on raw sockets
    (what ``http.server`` cannot send: a status and a ``Content-Length`` whose body never
    comes). ``answers`` maps a path to its answer: the bytes sent back, or a callable of
    the request's JSON body (None for none) returning them; a path not there is answered
    404. After the bytes the connection is closed, or, for bytes that are :class:`Held`,
    held open and silent until :meth:`stop` (``held`` counts those held so far).
    ``requests``: ``(method, path, body)`` of each request. A context manager."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.requests: list[tuple[str, str, Any]] = []
        self.held = 0
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._threads: list[threading.Thread] = []
        self.base_url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/v1"

    def __enter__(self) -> ScriptedSocketServer:
        self._listener.settimeout(0.05)
        self._spawn(self._accept)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for thread in list(self._threads):
            thread.join(5)
        self._listener.close()

    def _spawn(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._spawn(self._serve, conn)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                request = _read_request(conn)
                if request is None:
                    return
                self.requests.append(request)
                _method, path, body = request
                answer = self.answers.get(path)
                data = (answer(body) if callable(answer) else answer) if answer is not None \
                    else http_answer("404 Not Found", b'{"error": {"message": "not here"}}')
                conn.sendall(data)
            except OSError:  # the client left, or never asked
                return
            if isinstance(data, Held):
                self.held += 1
                while not self._stop.wait(0.05):
                    pass


def _read_request(conn: socket.socket) -> tuple[str, str, Any] | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path = lines[0].split(" ")[:2]
    length = next((int(line.split(":", 1)[1]) for line in lines[1:]
                   if line.lower().startswith("content-length:")), 0)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return method, path, json.loads(body) if body else None


def http_answer(status: str, body: bytes = b"", *, length: int | None = None,
                content_type: str = "application/json") -> bytes:
    """An HTTP/1.1 answer: ``status`` (``"503 Service Unavailable"``), a
    ``Content-Length`` of ``length`` (None: the body's), then ``body``."""
    size = len(body) if length is None else length
    return (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {size}\r\n"
            f"Connection: close\r\n\r\n").encode() + body


def event_stream(*events: Any) -> bytes:
    """A streamed reply: ``200`` headers, each event as a ``data:`` line (an object as
    its JSON), ``data: [DONE]``; the connection then closes."""
    lines = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
            + lines + b"data: [DONE]\n\n")


def openai_answers(stream: Any) -> dict[str, Any]:
    """The answers of a plain OpenAI-compatible server (one model, ``m``, a calibration
    answer) whose streamed reply is ``stream``: bytes, or a callable of the request's
    body returning them."""
    models = json.dumps({"object": "list", "data": [{"id": "m", "context_length": 8192}]})
    calibration = json.dumps({"choices": [{"index": 0, "message": {"content": "x"}}],
                              "usage": {"prompt_tokens": 40, "completion_tokens": 1}})

    def completions(body: Any) -> bytes:
        if isinstance(body, dict) and body.get("stream"):
            return stream(body) if callable(stream) else stream
        return http_answer("200 OK", calibration.encode())

    return {"/v1/models": http_answer("200 OK", models.encode()),
            "/v1/chat/completions": completions}
