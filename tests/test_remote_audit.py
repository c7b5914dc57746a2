"""The server backend against a server that behaves as servers do when they are not
llama.cpp at its best (an audit of the OpenAI-compatible backend): a server on another
machine not yet agreed to gets nothing of the chat; a server restarted with a smaller
window, one that does not say its window, one that reports impossible usage, one that
streams only reasoning, a ``[DONE]`` without a finish reason, tool calls in the shapes
some servers send, and the count that fails because the server is down.

The server is a real HTTP server on 127.0.0.1 (:class:`ScriptedServer`), scripted per
test: it passes for llama.cpp (``/props`` with its window, exact counts at
``/v1/chat/completions/input_tokens``) or for a plain OpenAI-compatible server, and
records every request, so that a test can say what reached it. "Another machine" is
127.0.0.1 with ``is_loopback`` answering False, so the test needs no second address.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import keyring
import pytest

from iris_desktop.generation import GenerationRequest
from iris_desktop.runtime.errors import PromptTooLongError
from iris_desktop.runtime.remote import RemoteRuntime, ServerError
from iris_desktop.runtime.remote.sse import _Reply

from support.hub_server import MemoryKeyring

SECRET = "My bank PIN is 4321"
DRAFT = "my new password is hunter2"


def chat_with_a_secret(data_dir) -> int:
    """A chat in a new history at ``data_dir`` whose first message holds SECRET."""
    from iris_desktop.core.store import Store

    data_dir.mkdir(parents=True)
    with Store(data_dir / "iris.db") as store:
        thread = store.create_thread("old")
        store.add_message(thread, {"role": "user", "content": SECRET})
        store.add_message(thread, {"role": "assistant", "content": "Noted."})
    return thread


@pytest.fixture(autouse=True)
def memory_keyring():
    before = keyring.get_keyring()
    keyring.set_keyring(MemoryKeyring())
    yield
    keyring.set_keyring(before)


class ScriptedServer:
    """An OpenAI-compatible server on 127.0.0.1. ``llama``: it passes for llama.cpp
    (``/props`` says ``window``; counts at ``/v1/chat/completions/input_tokens``, a
    token per four characters of the messages); else it says ``window`` in
    ``/v1/models`` unless ``window`` is None. ``events``: the ``data:`` payloads of a
    streamed reply (dicts, or a string sent as it is); ``refuse``: answer a streamed
    request with llama.cpp's ``exceed_context_size_error`` for that window;
    ``count_status``: answer counts with that HTTP status. ``requests``: (path, body)."""

    def __init__(self, *, llama: bool = True, window: int | None = 4096,
                 events: list[Any] | None = None) -> None:
        self.llama = llama
        self.window = window
        self.events = events if events is not None else [
            {"choices": [{"index": 0, "delta": {"content": "Hello."}, "finish_reason": None}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            {"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 2}}, "[DONE]"]
        self.refuse: int | None = None
        self.count_status = 200
        self.requests: list[tuple[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _json(self, status: int, answer: Any) -> None:
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                server.requests.append((self.path, None))
                if self.path == "/props" and server.llama:
                    return self._json(200, {"default_generation_settings":
                                            {"n_ctx": server.window}, "chat_template": "t"})
                if self.path == "/v1/models":
                    entry: dict[str, Any] = {"id": "scripted", "object": "model"}
                    if server.window and not server.llama:
                        entry["context_length"] = server.window
                    return self._json(200, {"object": "list", "data": [entry]})
                return self._json(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                server.requests.append((self.path, body))
                if self.path == "/v1/chat/completions/input_tokens" and server.llama:
                    if server.count_status != 200:
                        return self._json(server.count_status, {"error": {"message": "no"}})
                    text = json.dumps(body.get("messages")) + json.dumps(body.get("tools"))
                    return self._json(200, {"input_tokens": len(text) // 4})
                if self.path == "/tokenize" and server.llama:
                    return self._json(200, {"tokens": list(range(len(body["content"]) // 4))})
                if self.path != "/v1/chat/completions":
                    return self._json(404, {"error": {"message": "not found"}})
                if not body.get("stream"):  # the calibration
                    return self._json(200, {"choices": [{"message": {"content": "Ok"}}],
                                            "usage": {"prompt_tokens": 100, "completion_tokens": 1}})
                if server.refuse:
                    return self._json(400, {"error": {
                        "type": "exceed_context_size_error", "n_prompt_tokens": 566,
                        "n_ctx": server.refuse, "message": "too long"}})
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for event in server.events:
                    data = event if isinstance(event, str) else json.dumps(event)
                    self.wfile.write(b"data: " + data.encode() + b"\n\n")
                self.wfile.flush()
                self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def carrying(self, text: str) -> list[str]:
        """The paths of the requests whose body holds ``text``."""
        return [path for path, body in self.requests if text in json.dumps(body)]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    made: list[ScriptedServer] = []

    def make(**kwargs: Any) -> ScriptedServer:
        made.append(ScriptedServer(**kwargs))
        return made[-1]

    yield make
    for s in made:
        s.close()


def chunk(delta: dict, finish: str | None = None) -> dict:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def reply_of(runtime, messages=None, max_tokens: int = 64):
    """(text, stats, error) of one streamed reply."""
    generation = runtime.stream(GenerationRequest(
        messages or [{"role": "user", "content": "hi"}], max_tokens=max_tokens))
    text, error = "", None
    try:
        for piece in generation:
            text += piece
    except Exception as exc:  # noqa: BLE001 (the test reads it)
        error = exc
    return text, generation.stats, error


# -- 1. nothing of the chat before the user agrees ------------------------------------------


def test_a_runtime_held_back_counts_locally_and_sends_nothing(server):
    """``conversation_allowed`` False: counts are the local estimate (said as estimated),
    a reply is refused before anything is sent; True: the server counts again."""
    s = server()
    runtime = RemoteRuntime.connect(s.base_url)
    try:
        runtime.conversation_allowed = False
        before = len(s.requests)
        messages = [{"role": "system", "content": "."}, {"role": "user", "content": SECRET}]
        assert runtime.count_prompt(messages) > 0
        assert runtime.tool_tokens([{"type": "function", "function": {"name": "f"}}]) > 0
        assert runtime.capabilities.exact_counts is False
        assert ":estimated:" in runtime.counter().name
        assert runtime.counter().count_message(messages[1]) > 0
        with pytest.raises(ServerError, match="not agreed"):
            runtime.stream(GenerationRequest(messages, max_tokens=4))
        assert s.requests[before:] == []
        runtime.conversation_allowed = True
        assert runtime.capabilities.exact_counts and runtime.counter().name.startswith("server:")
        runtime.count_prompt(messages)
        assert s.carrying(SECRET) == ["/v1/chat/completions/input_tokens"]
    finally:
        runtime.close()


def test_a_window_on_a_server_not_agreed_to_sends_it_nothing_of_the_chat(
        server, make_window, data_dir, qtbot, monkeypatch):
    """Opening a chat and typing a draft with a server on another machine the user has
    not agreed to: not one request carries the chat or the draft (they were posted to
    be counted). After Yes at the first send, the conversation goes, and the window
    connects again so that the counts are the server's own."""
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication, QMessageBox

    from iris_desktop.ui import server_dialog

    monkeypatch.setattr(server_dialog, "is_loopback", lambda url: False)  # "another machine"
    s = server()
    tid = chat_with_a_secret(data_dir)
    window = make_window(runtime=None, overrides={
        "model.backend": "openai", "model.base_url": s.base_url,
        "context.recall_semantic": "false"})
    assert window.model_state == "ready", window.app_state.model_error
    window.open_thread(tid)
    window.composer.set_text(DRAFT)
    qtbot.wait(1500)  # the meter's count and the draft's prefill would have gone by now
    qtbot.waitUntil(lambda: window.background.idle, timeout=20_000)
    assert s.carrying(SECRET) == [] and s.carrying("hunter2") == []
    assert window.context.planner.counter.exact is False
    assert ":estimated:" in window.context.planner.counter.name

    QTimer.singleShot(0, lambda: QApplication.activeModalWidget().button(
        QMessageBox.StandardButton.Yes).click())
    window.send("Hello?")
    qtbot.waitUntil(lambda: not window.generating and bool(s.carrying("Hello?")), timeout=30_000)
    qtbot.waitUntil(lambda: window.model_state == "ready" and window.context.planner
                    .counter.name.startswith("server:"), timeout=30_000)
    assert "/v1/chat/completions" in s.carrying(SECRET)


def test_the_cli_says_the_chat_is_sent_to_be_counted(server, tmp_path, capsys, monkeypatch):
    """``context`` against a counting server on another machine sends it the chat: said,
    as ``chat`` says it."""
    from iris_desktop.cli import main
    from iris_desktop.runtime.remote import runtime as remote_runtime

    monkeypatch.setattr(remote_runtime, "is_loopback", lambda url: False)
    s = server()
    base = ["--data-dir", str(tmp_path / "home"), "--set", "model.backend=openai",
            "--set", f"model.base_url={s.base_url}"]
    assert main([*base, "chat", "--json", "hi"]) == 0
    out = capsys.readouterr()
    assert "this conversation is sent to server: 127.0.0.1" in out.err
    thread = json.loads(out.out)["thread_id"]
    assert main([*base, "context", "--json", str(thread)]) == 0
    assert "this conversation is sent to server: 127.0.0.1:" in capsys.readouterr().err


# -- 2. a server restarted with a smaller window ---------------------------------------------


def test_a_server_restarted_with_a_smaller_window_is_followed(server):
    s = server(window=1024)
    runtime = RemoteRuntime.connect(s.base_url)
    try:
        assert runtime.n_ctx == 1024
        s.refuse = 512
        _, stats, error = reply_of(runtime)
        assert isinstance(error, PromptTooLongError) and error.n_ctx == 512
        assert "now runs a 512-token window" in str(error)
        assert runtime.n_ctx == 512 and stats.finish_reason == "error"
    finally:
        runtime.close()


def test_the_window_reconnects_when_the_server_says_it_runs_another_window(
        server, make_window, qtbot):
    s = server(window=1024)
    window = make_window(runtime=None, overrides={
        "model.backend": "openai", "model.base_url": s.base_url,
        "context.recall_semantic": "false"})
    assert "1,024-token window" in window.model_label.text()
    s.refuse, s.window = 512, 512  # restarted: /props says so too
    window.send("Thanks.")
    qtbot.waitUntil(lambda: "512-token window" in window.model_label.text(), timeout=30_000)
    assert window.context.planner.params.window == 512


# -- 3. a server that does not say its window ------------------------------------------------


def test_a_stream_closed_before_any_text_names_the_assumed_window(server):
    s = server(llama=False, window=None, events=[])
    runtime = RemoteRuntime.connect(s.base_url, fallback_window=8192)
    try:
        assert runtime.window_source == "config"
        _, _, error = reply_of(runtime)
        text = str(error)
        assert "model.n_ctx = 8,192" in text and "about" in text and "set model.n_ctx" in text.lower()
        assert "connection was lost" not in text
    finally:
        runtime.close()


def test_done_without_a_finish_reason_is_a_finished_reply(server):
    s = server(llama=False, events=[chunk({"content": "Partial text"}), "[DONE]"])
    runtime = RemoteRuntime.connect(s.base_url)
    try:
        text, stats, error = reply_of(runtime)
        assert (text, error, stats.finish_reason) == ("Partial text", None, "stop")
    finally:
        runtime.close()


# -- 4. usage that cannot be true ------------------------------------------------------------


def test_impossible_usage_is_not_believed():
    reply = _Reply(0.0, "x:1")
    reply.feed({"choices": [], "usage": {"prompt_tokens": 999_999_999,
                                         "completion_tokens": 999_999_999}})
    stats = reply.stats(120, None, n_ctx=8192, max_tokens=64)
    assert (stats.prompt_tokens, stats.completion_tokens) == (120, 0)  # none seen
    far = _Reply(0.0, "x:1")
    far.feed({"choices": [], "usage": {"prompt_tokens": 5000}})  # in the window, 40× the count
    assert far.stats(120, None, n_ctx=8192).prompt_tokens == 120
    fine = _Reply(0.0, "x:1")
    fine.feed({"choices": [], "usage": {"prompt_tokens": 150, "completion_tokens": 3}})
    assert fine.stats(120, None, n_ctx=8192, max_tokens=64).prompt_tokens == 150


# -- 5. a server's own length limit, and reasoning -------------------------------------------


def test_a_reply_of_only_reasoning_is_said_as_thinking_not_a_full_window(server):
    from iris_desktop.core.views import cut_off

    s = server(llama=False, events=[*(chunk({"reasoning_content": f"step {i}. "})
                                      for i in range(20)), chunk({}, "length"),
                                    {"choices": [], "usage": {"prompt_tokens": 100,
                                                              "completion_tokens": 5}}, "[DONE]"])
    runtime = RemoteRuntime.connect(s.base_url)
    try:
        text, stats, error = reply_of(runtime, max_tokens=512)
        assert (text, error) == ("", None)
        said = cut_off(stats, 512, runtime.n_ctx)
        assert "server ended the reply at its own length limit" in said
        assert "still thinking" in said and "filled the model's window" not in said
        assert stats.time_to_first_token_s > 0
    finally:
        runtime.close()


def test_a_full_window_is_still_said_as_one():
    from iris_desktop.core.views import cut_off
    from iris_desktop.generation import GenerationStats

    stats = GenerationStats(4000, 0, 4000, 90, 0.1, 10.0, 1.0, "length")
    assert "filled the model's window" in cut_off(stats, 512, 4096)
    assert "filled the model's window" in cut_off(stats, 512)  # the window not known


# -- 6. smaller ------------------------------------------------------------------------------


def test_tool_calls_in_the_shapes_some_servers_send():
    def calls(*deltas: dict) -> list[dict]:
        reply = _Reply(0.0, "x:1")
        for delta in deltas:
            reply.feed(chunk({"tool_calls": [delta]}))
        text = reply.tool_call_text()
        return [json.loads(b) for b in text.replace("</tool_call>", "").split("<tool_call>")[1:]]

    want = [{"name": "list_directory", "arguments": {"path": "/tmp"}}]
    # arguments as an object
    assert calls({"index": 0, "id": "c1", "function": {"name": "list_directory",
                                                       "arguments": {"path": "/tmp"}}}) == want
    # no index: the pieces go on with the last call
    assert calls({"id": "c1", "function": {"name": "list_directory", "arguments": ""}},
                 {"function": {"arguments": '{"pa'}}, {"function": {"arguments": 'th": "/tmp"}'}}
                 ) == want
    # every delta repeats the whole call
    whole = {"index": 0, "id": "c1", "function": {"name": "list_directory",
                                                  "arguments": '{"path": "/tmp"}'}}
    assert calls(whole, whole) == want
    # two calls without an index stay two
    assert len(calls({"id": "a", "function": {"name": "f", "arguments": "{}"}},
                     {"id": "b", "function": {"name": "g", "arguments": "{}"}})) == 2


def test_a_count_that_fails_because_the_server_is_down_is_no_template_refusal(server):
    s = server()
    runtime = RemoteRuntime.connect(s.base_url)
    try:
        s.count_status = 400  # a template refusing the probe shape: estimated
        assert runtime.message_tokens({"role": "user", "content": "x" * 40}) > 0
        s.count_status = 503  # the server failing: the count fails, nothing is estimated
        with pytest.raises(ServerError, match="503"):
            runtime.message_tokens({"role": "user", "content": "y" * 40})
    finally:
        runtime.close()


def test_a_base_url_with_a_query_string_is_refused_without_repeating_it():
    with pytest.raises(ServerError, match="query string") as refused:
        RemoteRuntime.connect("http://127.0.0.1:9/v1?api_key=sk-secret")
    assert "sk-secret" not in str(refused.value)


@pytest.mark.parametrize("key", ["model.base_url", "models.hub_url"])
def test_a_query_string_is_refused_by_the_settings_before_it_is_kept(key, tmp_path, capsys):
    """An audit: `config set model.base_url 'https://…/v1?api_key=sk-…'` was written to
    config.toml (and shown by `config list`); only a connect refused it. Now the settings
    refuse it, as an address with a password, without repeating it; nothing is written."""
    from iris_desktop.cli import main

    data = tmp_path / "home"
    code = main(["--data-dir", str(data), "config", "set", key,
                 "https://api.example.com/v1?api_key=sk-secret"])
    err = capsys.readouterr().err
    assert code == 2 and "query string or fragment" in err and "sk-secret" not in err
    assert not (data / "config.toml").exists() or "sk-secret" not in (
        data / "config.toml").read_text()


def test_the_cli_keeps_the_text_of_a_reply_that_failed_midway(server, tmp_path, capsys):
    from iris_desktop.cli import main

    s = server(llama=False, events=[chunk({"content": "The answer "}),
                                    chunk({"content": "is being written "})])
    base = ["--data-dir", str(tmp_path / "home"), "--set", "model.backend=openai",
            "--set", f"model.base_url={s.base_url}"]
    assert main([*base, "chat", "--json", "hi"]) != 0
    assert json.loads(capsys.readouterr().out)["reply"] == "The answer is being written "



def test_threads_counts_locally_for_a_server_on_another_machine(server, tmp_path, capsys,
                                                                monkeypatch):
    """A review found `threads` counted every chat's uncounted text through a counting
    server on another machine, saying nothing: a listing sends no chat; it estimates."""
    from iris_desktop.cli import main
    from iris_desktop.core.store import Store
    from iris_desktop.runtime.remote import runtime as remote_runtime

    monkeypatch.setattr(remote_runtime, "is_loopback", lambda url: False)
    s = server()
    home = tmp_path / "home"
    base = ["--data-dir", str(home), "--set", "model.backend=openai",
            "--set", f"model.base_url={s.base_url}"]
    assert main([*base, "threads"]) == 0
    capsys.readouterr()
    with Store(home / "iris.db") as store:
        store.add_message(store.create_thread("old"), {"role": "user", "content": SECRET})
    assert main([*base, "threads"]) == 0
    assert "≈" in capsys.readouterr().out  # estimated, and said so
    assert s.carrying(SECRET) == []


def test_a_server_switched_to_is_held_back_before_any_planner_can_count_through_it(
        server, make_window, data_dir, qtbot, monkeypatch):
    """A review found a gap: the new runtime was allowed the conversation from its connect
    until the window held it back, and a planner made meanwhile (a setting applied while
    it loaded) counted the chat and the draft through a server not agreed to. The host
    holds such a runtime back before it is in use."""
    import time

    from iris_desktop.host import Host
    from iris_desktop.runtime.remote import runtime as remote_runtime
    from iris_desktop.ui import server_dialog

    a, b = server(), server()
    remote = lambda url: url.rstrip("/") != b.base_url  # noqa: E731  (b: another machine)
    monkeypatch.setattr(server_dialog, "is_loopback", remote)
    monkeypatch.setattr(remote_runtime, "is_loopback", remote)
    thread = chat_with_a_secret(data_dir)
    window = make_window(runtime=None, overrides={
        "model.backend": "openai", "model.base_url": a.base_url, "context.recall_semantic": "false"})
    window.open_thread(thread)
    window.composer.set_text(DRAFT)
    qtbot.waitUntil(lambda: window.background.idle, timeout=20_000)
    real = Host.load_embedder

    def slow(self, settings=None):  # the moment between the connect and the window's hold
        time.sleep(1.5)
        return real(self, settings)

    monkeypatch.setattr(Host, "load_embedder", slow)
    host = window.model.worker.host
    window.models.use_server(b.base_url, "")
    qtbot.waitUntil(lambda: host.runtime is not None
                    and host.runtime.base_url.rstrip("/") == b.base_url, timeout=20_000)
    assert host.runtime.conversation_allowed is False
    window.app_state.set_settings(window.app_state.settings.with_overrides(
        {"model.max_tokens": 700}))  # a setting applied meanwhile: a new planner
    qtbot.waitUntil(lambda: window.model_state == "ready", timeout=20_000)
    qtbot.waitUntil(lambda: window.background.idle, timeout=20_000)
    assert b.carrying(SECRET) == [] and b.carrying("hunter2") == []


def test_a_smaller_window_the_server_refuses_with_is_kept_while_its_probe_says_the_old_one(
        server, make_window, qtbot):
    """A review found: a server (a proxy, a slot smaller than the total) refusing at 512
    while its /props still said 1,024: each reconnect took 1,024 again, every send failed,
    and the window reconnected after every turn. The refusal's window is kept until the
    probe reports another one."""
    s = server(window=1024)
    window = make_window(runtime=None, overrides={
        "model.backend": "openai", "model.base_url": s.base_url, "context.recall_semantic": "false"})
    states: list[str] = []
    window.app_state.modelStateChanged.connect(states.append)
    s.refuse = 512
    window.send("Thanks.")
    qtbot.waitUntil(lambda: not window.generating, timeout=30_000)
    qtbot.waitUntil(lambda: window.model_state == "ready"
                    and window.context.planner.params.window == 512, timeout=30_000)
    reloads = states.count("loading")
    window.send("Again.")
    qtbot.waitUntil(lambda: not window.generating, timeout=30_000)
    qtbot.wait(500)
    assert window.context.planner.params.window == 512 and states.count("loading") == reloads


def test_a_reply_stopped_at_the_room_iris_left_is_not_called_the_servers_limit(server):
    """A review found: for a server that cannot count, Iris caps max_tokens to the room
    its estimate leaves; a reply stopped there, with the server counting the prompt
    smaller, was said as "the server ended the reply at its own length limit"."""
    from iris_desktop.core.views import cut_off

    s = server(llama=False, window=4096)
    runtime = RemoteRuntime.connect(s.base_url)
    try:
        messages = [{"role": "user", "content": "word " * 4000}]
        room = 4096 - runtime.count_prompt(messages)
        s.events = [chunk({"content": "x"}), chunk({}, "length"),
                    {"choices": [], "usage": {"prompt_tokens": int((4096 - room) * 0.8),
                                              "completion_tokens": room}}, "[DONE]"]
        _text, stats, _error = reply_of(runtime, messages, max_tokens=2048)
        said = cut_off(stats, 2048, runtime.n_ctx)
        assert stats.max_tokens_sent == room < 2048
        assert said.startswith(f"the reply used the room Iris left for it in the window ({room:,} tokens")
    finally:
        runtime.close()
