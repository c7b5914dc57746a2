"""Connecting to a slow server: one deadline for the whole connect (each probe was bounded
on its own, not their sequence: four slow answers held "Connecting…" for 107 s), and
what it waits for said as it waits, in the CLI and in the window's status line.

The server is real (``http.server`` on 127.0.0.1) and slow by design: every answer waits
``delay_s`` first, each far under the per-request bound. The deadline is made short
through its module constant, and the tests count requests instead of timing them."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from iris_desktop.runtime.remote import RemoteRuntime, ServerError
from iris_desktop.runtime.remote import deadline as connect_deadline

from support.helpers import run_cli
from support.windows import settle

pytestmark = pytest.mark.usefixtures("no_proxy_no_keyring")

#: the models the Ollama-like server lists: Iris asks ``/api/show`` for each
MODELS = [f"slow-{n}" for n in range(6)]


class SlowServer:
    """An OpenAI-compatible server on 127.0.0.1 whose every answer waits ``delay_s``
    (``delays`` by path overrides it). ``kind`` "ollama": it passes for Ollama (``/props``
    404, ``/api/version``, ``/api/ps``, ``/api/show`` per model); "openai": a plain
    OpenAI-compatible one (estimated counts, the one-token calibration answered).
    ``requests`` lists each path as it arrives."""

    def __init__(self, kind: str = "ollama", delay_s: float = 0.4,
                 delays: dict[str, float] | None = None) -> None:
        self.kind, self.delay_s, self.delays = kind, delay_s, delays or {}
        self.requests: list[str] = []
        self.closing = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                outer.answer(self)

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.answer(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.address = f"127.0.0.1:{self.server.server_address[1]}"

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        path = handler.path
        self.requests.append(path)
        self.closing.wait(self.delays.get(path, self.delay_s))
        body = self.body(path)
        data = json.dumps(body).encode() if body is not None else b'{"error": "not found"}'
        handler.send_response(200 if body is not None else 404)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        try:
            handler.wfile.write(data)
        except OSError:  # the client gave up on it
            pass

    def body(self, path: str) -> object:
        ollama = self.kind == "ollama"
        if path == "/v1/models":
            names = MODELS if ollama else ["slow-1"]
            return {"object": "list", "data": [{"id": n, "object": "model"} for n in names]}
        if ollama and path == "/api/version":
            return {"version": "0.5.0"}
        if ollama and path == "/api/ps":
            return {"models": []}
        if ollama and path == "/api/show":
            return {"parameters": "num_ctx 4096", "model_info": {}}
        if not ollama and path == "/v1/chat/completions":
            return {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                 "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 40, "completion_tokens": 1, "total_tokens": 41}}
        return None

    def __enter__(self) -> SlowServer:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()


#: the requests a whole connect to the Ollama-like server makes: four probes and a
#: description of each model
WHOLE_CONNECT = 4 + len(MODELS)


def short_deadline(monkeypatch, seconds: float) -> None:
    monkeypatch.setattr(connect_deadline, "CONNECT_DEADLINE_S", seconds)


def say_waits_at_once(monkeypatch) -> None:
    """What a connect waits for is said from the start, and often (not after 2 s, each
    second): the tests' slow answers are short."""
    monkeypatch.setattr(connect_deadline, "SAY_WAIT_AFTER_S", 0.0)
    monkeypatch.setattr(connect_deadline, "SAY_WAIT_EVERY_S", 0.1)


def waited_for(message: str) -> str:
    """The request a deadline error says was waiting."""
    found = re.search(r"waiting for its answer to (\S+), for ", message)
    assert found, message
    return found.group(1)


# -- the runtime ------------------------------------------------------------------------------


def test_slow_answers_each_within_their_bound_cannot_hold_a_connect_past_its_deadline(monkeypatch):
    """Each answer takes 0.4 s of its 30 s bound; eleven of them took 4.4 s and the connect
    succeeded. With a 1.5 s deadline the connect ends at the request that was waiting,
    named in the one sentence, long before the sequence's end."""
    short_deadline(monkeypatch, 1.5)
    with SlowServer("ollama", delay_s=0.4) as server:
        with pytest.raises(ServerError) as raised:
            RemoteRuntime.connect(server.base_url)
        asked = list(server.requests)
    message = str(raised.value)
    assert isinstance(raised.value, connect_deadline.ConnectExpired)
    assert message.startswith(f"the server at http://{server.address} did not finish connecting "
                              "within 1.5 s (Iris was waiting for its answer to ")
    assert "check that the server is running and not overloaded, then try again" in message
    assert waited_for(message) == asked[-1]  # the one in flight when the time ran out
    assert 1 < len(asked) < WHOLE_CONNECT, asked
    assert "\n" not in message and "Traceback" not in message


def test_a_deadline_never_cuts_an_answer_below_its_own_bound_nor_says_it_ran_out(monkeypatch):
    """A single answer slower than its own bound is that answer's fault, said as before;
    the deadline's sentence is only for the connect's time running out."""
    short_deadline(monkeypatch, 30.0)
    with SlowServer("openai", delays={"/props": 3.0}) as server:
        with pytest.raises(ServerError) as raised:
            RemoteRuntime.connect(server.base_url, answer_timeout_s=1.0)
    assert not isinstance(raised.value, connect_deadline.ConnectExpired)
    assert "did not finish answering /props within 1 s" in str(raised.value)


def test_the_wait_is_said_with_its_request_and_a_cancel_ends_it(monkeypatch):
    """``on_wait`` hears the request awaited and its seconds, on the connecting thread;
    setting ``cancel`` ends the wait, naming the server, long before the answer."""
    say_waits_at_once(monkeypatch)
    heard: list[tuple[str, float, str]] = []
    cancel = threading.Event()

    def on_wait(path: str, waited_s: float) -> None:
        heard.append((path, waited_s, threading.current_thread().name))
        if path == "/v1/models" and len([h for h in heard if h[0] == path]) >= 3:
            cancel.set()

    with SlowServer("openai", delay_s=0.0, delays={"/v1/models": 20.0}) as server:
        with pytest.raises(connect_deadline.ConnectCancelled) as raised:
            RemoteRuntime.connect(server.base_url, on_wait=on_wait, cancel=cancel)
    assert str(raised.value) == (f"connecting to http://{server.address} was cancelled (it was "
                                 "waiting for /v1/models)")
    said = [waited for path, waited, _ in heard if path == "/v1/models"]
    assert len(said) >= 3 and said == sorted(said)  # its seconds go up
    assert {name for *_, name in heard} == {threading.current_thread().name}


def test_a_calibration_the_deadline_leaves_no_time_for_is_skipped_not_a_failure(monkeypatch, caplog):
    """The one-token calibration is an optimisation (the replies calibrate too): the
    probes taking the connect's time leaves it out, and the connect succeeds."""
    short_deadline(monkeypatch, 1.0)
    with SlowServer("openai", delay_s=0.0, delays={"/v1/chat/completions": 10.0}) as server:
        with RemoteRuntime.connect(server.base_url) as runtime:
            assert runtime.kind == "openai"
    assert "no time was left to calibrate the token estimate" in caplog.text


# -- the CLI ----------------------------------------------------------------------------------


def test_the_cli_says_what_a_connect_waits_for_and_ends_at_the_deadline_in_one_sentence(
        monkeypatch, capsys):
    short_deadline(monkeypatch, 1.5)
    say_waits_at_once(monkeypatch)
    with SlowServer("ollama", delay_s=0.4) as server:
        code, out, err = run_cli(capsys, "--set", "model.backend=openai",
                                 "--set", f"model.base_url={server.base_url}", "chat", "hello")
        asked = list(server.requests)
    assert code == 1 and out == "", err
    lines = err.splitlines()
    # off a terminal, each request waited for is said once (a log gets no line a second)
    waits = [line for line in lines if "… waiting for " in line]
    assert waits and all(line.startswith(f"iris-desktop: connecting to {server.address}… waiting "
                                         "for /") for line in waits), err
    said = [re.search(r"waiting for (\S+) \(", line).group(1) for line in waits]
    assert len(said) == len(set(said)) and set(said) <= set(asked)
    assert lines[-1].startswith(f"iris-desktop: cannot use the server: the server at "
                                f"http://{server.address} did not finish connecting within 1.5 s")
    assert waited_for(lines[-1]) == asked[-1] and len(asked) < WHOLE_CONNECT
    assert len(lines) == len(waits) + 1 and "Traceback" not in err


# -- the window -------------------------------------------------------------------------------


def test_the_window_s_status_line_says_what_a_connect_waits_for(make_window, qtbot, monkeypatch):
    say_waits_at_once(monkeypatch)
    with SlowServer("openai", delay_s=0.0, delays={"/v1/models": 1.5}) as server:
        window = make_window(runtime=None, load=False, overrides={
            "model.backend": "openai", "model.base_url": server.base_url})
        window.load_model()
        expected = f"Connecting to {server.address}… waiting for /v1/models ("
        qtbot.waitUntil(lambda: expected in window.status_area.state.text(), timeout=20_000)
        qtbot.waitUntil(lambda: window.model_state == "ready", timeout=30_000)
        settle(qtbot, window)
    assert window.status_area.state.text().startswith("Ready (server connected in ")


def test_the_window_says_a_connect_s_deadline_in_its_error_box(
        make_window, qtbot, monkeypatch):
    short_deadline(monkeypatch, 1.5)
    with SlowServer("ollama", delay_s=0.4) as server:
        window = make_window(runtime=None, load=False, overrides={
            "model.backend": "openai", "model.base_url": server.base_url})
        window.load_model()
        qtbot.waitUntil(lambda: window.model_state == "failed", timeout=30_000)
        asked = list(server.requests)
    box = window.models.box
    assert box is not None and box.isVisible()
    text = box.informativeText()
    assert text.startswith(f"the server at http://{server.address} did not finish connecting "
                           "within 1.5 s"), text
    assert waited_for(text) == asked[-1]


def test_the_server_dialogs_test_connection_says_what_it_waits_for(qtbot, monkeypatch):
    """Model ▸ Server…'s "Test connection" had the deadline but said only "Connecting to …"
    however long a request waited."""
    from iris_desktop.ui.server_dialog import ServerDialog

    say_waits_at_once(monkeypatch)
    with SlowServer("openai", delay_s=0.0, delays={"/v1/models": 1.5}) as server:
        dialog = ServerDialog()
        qtbot.addWidget(dialog)
        dialog.url.setText(server.base_url)
        dialog.test()
        expected = f"Connecting to {server.address}… waiting for /v1/models ("
        qtbot.waitUntil(lambda: dialog.result.text().startswith(expected), timeout=20_000)
        qtbot.waitUntil(lambda: dialog.info is not None, timeout=30_000)
    assert dialog.result.text().startswith("openai server at ")  # the answer replaces the wait
    dialog.reject()


def test_a_cancel_without_words_to_say_does_not_spin(monkeypatch):
    """A review: with a cancel to watch but no ``on_wait``, the wait looped without
    sleeping once the time to speak had passed (637,899 turns of the loop in 1.5 s).
    Counted, not timed: the cancel is looked at about once per CANCEL_POLL_S."""
    monkeypatch.setattr(connect_deadline, "SAY_WAIT_AFTER_S", 0.0)
    cancel = threading.Event()
    looks = []
    real = cancel.is_set
    cancel.is_set = lambda: looks.append(1) or real()
    clock = connect_deadline.connect_clock("http://127.0.0.1:9", 30, cancel=cancel)
    finished = threading.Event()
    clock.wait("/v1/models", lambda: finished.wait(1.0))
    assert len(looks) <= 1.0 / connect_deadline.CANCEL_POLL_S + 3
