"""The server backend: the same context engine over an OpenAI-compatible server.

Against real servers on 127.0.0.1 (``tests/support/servers.py``): llama.cpp's ``llama-server``
(window from ``/props``, exact counts, so predicted == reported prompt tokens through the
planner; compaction, recall, Stop, a server killed mid-reply), and ``python -m
llama_cpp.server``, which cannot count (estimated and calibrated counts, the window from
settings). What no server here can be (vLLM, Ollama) is read from recorded answers.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from dataclasses import replace

import httpx
import keyring
import pytest

from iris_desktop.core.config import AgentConfig, CompactionSettings, ContextParams, ToolsConfig
from iris_desktop.core.events import ReplySaved, ReplyToken, ToolFinished, TurnDone, TurnFailed
from iris_desktop.core.planner import Planner
from iris_desktop.core.store import row_to_message
from iris_desktop.core.toolcalls import parse_tool_calls
from iris_desktop.generation import GenerationRequest, GenerationStats
from iris_desktop.host import build_agent, build_compactor
from iris_desktop.runtime import remote  # remote.test_connection: pytest would collect the name
from iris_desktop.runtime.errors import PromptTooLongError
from iris_desktop.runtime.protocol import Runtime, Unsupported
from iris_desktop.runtime.remote import (
    ExactRemoteRuntime,
    RemoteRuntime,
    ServerError,
    delete_api_key,
    get_api_key,
    is_loopback,
    privacy_warning,
    server_address,
    set_api_key,
)
from iris_desktop.runtime.remote.counting import _Calibration
from iris_desktop.runtime.remote.probe import _probe
from iris_desktop.runtime.remote.sse import _Reply

from conftest import SYNTHETIC_CHAT
from support.helpers import complete, protocol_problems
from support.hub_server import MemoryKeyring
from support.servers import ServerUnavailable, free_port, start_llama_server, start_python_server

SYSTEM = "You are Iris, a helpful assistant."
N_CTX = 4096
#: why a test against llama.cpp's server skips (make test builds it first, and fails if
#: it cannot: a skip means pytest was run on its own without that build)
NO_LLAMA_SERVER = ("llama.cpp's llama-server is not available (build it with "
                   "`python tests/support/servers.py --build`, as make test does)")


@pytest.fixture(autouse=True)
def memory_keyring():
    before = keyring.get_keyring()
    backend = MemoryKeyring()
    keyring.set_keyring(backend)
    yield backend
    keyring.set_keyring(before)


@pytest.fixture(scope="module")
def llama_server(model_path, tmp_path_factory):
    try:
        server = start_llama_server(model_path, tmp_path_factory.mktemp("llama-server"), N_CTX)
    except ServerUnavailable as exc:
        pytest.skip(reason=f"{NO_LLAMA_SERVER}: {exc}")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def exact(llama_server):
    runtime = RemoteRuntime.connect(llama_server.base_url, fallback_window=8192)
    yield runtime
    runtime.close()


@pytest.fixture(scope="module")
def python_server(model_path, tmp_path_factory):
    try:
        server = start_python_server(model_path, tmp_path_factory.mktemp("py-server"), N_CTX,
                                     "--api_key", "sk-test-0123456789")
    except ServerUnavailable as exc:
        pytest.skip(reason=f"llama-cpp-python's own server cannot start here (make test installs its "
                    f"[server] extra): {exc}")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def chat():
    return json.loads(SYNTHETIC_CHAT.read_text())["messages"]


def planner_on(runtime, window=None, recall=0, folder=None, summary_max_tokens=96,
               system=SYSTEM, **agent) -> Planner:
    """A planner on ``runtime`` as the app makes one (short replies: the prompt is what
    these tests measure)."""
    params = ContextParams(window=window or runtime.n_ctx, system_prompt=system,
                           recall_max_tokens=recall)
    tools = ToolsConfig(allowed_paths=(str(folder),) if folder else ())
    return Planner(params, runtime.counter(), runtime=runtime, tools=tools,
                   agent=AgentConfig(**{"max_tokens": 4, "temperature": 0.0, **agent}),
                   compaction=CompactionSettings(summary_max_tokens=summary_max_tokens,
                                                 timeout_s=240))


# -- without a server --------------------------------------------------------------------


def test_where_a_conversation_goes():
    assert server_address("http://127.0.0.1:8080/v1") == "127.0.0.1:8080"
    assert server_address("https://API.example.com/v1") == "api.example.com:443"
    assert server_address("http://[::1]:8080") == "[::1]:8080"
    for url in ("http://localhost:11434", "http://127.0.0.2:80", "http://[::1]:1"):
        assert is_loopback(url) and privacy_warning(url) is None
    assert not is_loopback("https://api.example.com") and privacy_warning("https://api.example.com") is None
    warning = privacy_warning("http://192.168.1.20:8080")
    assert "192.168.1.20:8080" in warning and "plain http" in warning
    with pytest.raises(ValueError):
        server_address("ftp://example.com")


def test_the_api_key_lives_in_the_keyring_under_host_and_port(memory_keyring):
    set_api_key("https://api.example.com/v1", "sk-secret")
    assert memory_keyring.passwords == {("iris-desktop", "api.example.com:443"): "sk-secret"}
    assert get_api_key("https://api.example.com") == "sk-secret"  # same server, other spelling
    delete_api_key("https://api.example.com")
    delete_api_key("https://api.example.com")  # nothing saved: nothing to do
    assert get_api_key("https://api.example.com") is None


class RecordedHttp:
    """Answers recorded from vLLM and Ollama (their documented fields), by path."""

    address = "gpu-box:8000"

    def __init__(self, answers):
        self.answers = answers

    def get(self, path, missing_ok=False):
        return self.answers.get(("GET", path))

    def post(self, path, body, missing_ok=False):
        answer = self.answers.get(("POST", path))
        return answer(body) if callable(answer) else answer


def test_vllm_and_ollama_windows_come_from_their_own_fields():
    vllm = RecordedHttp({
        ("GET", "/v1/models"): {"object": "list", "data": [
            {"id": "Qwen/Qwen2.5-7B-Instruct", "object": "model", "owned_by": "vllm",
             "root": "Qwen/Qwen2.5-7B-Instruct", "max_model_len": 32768}]},
        ("POST", "/tokenize"): {"count": 20, "max_model_len": 32768, "tokens": [1] * 20},
    })
    info = _probe(vllm, "http://gpu-box:8000/v1")
    assert (info.kind, info.counting, info.models[0].context_length) == ("vllm", "vllm-tokenize", 32768)
    shown = {"qwen2.5:7b": {"parameters": "num_ctx 16384\nstop \"<|im_end|>\"",
                            "model_info": {"general.architecture": "qwen2",
                                           "qwen2.context_length": 32768}},
             "llama3.2:3b": {"parameters": "stop \"<|eot_id|>\"",
                             "model_info": {"general.architecture": "llama",
                                            "llama.context_length": 131072}},
             "phi3:mini": {"parameters": "", "model_info": {"general.architecture": "phi3",
                                                             "phi3.context_length": 4096}}}
    ollama = RecordedHttp({
        ("GET", "/api/version"): {"version": "0.12.3"},
        ("GET", "/v1/models"): {"object": "list", "data": [
            {"id": name, "object": "model", "owned_by": "library"} for name in shown]},
        ("GET", "/api/ps"): {"models": [{"name": "llama3.2:3b", "context_length": 4096}]},
        ("POST", "/api/show"): lambda body: shown[body["model"]],
    })
    info = _probe(ollama, "http://gpu-box:11434")
    assert info.kind == "ollama" and not info.exact_counts
    # num_ctx from the Modelfile; else the loaded model's window; never the trained length
    assert [(m.context_length, m.trained_length) for m in info.models] == [
        (16384, 32768), (4096, 131072), (None, 4096)]


def test_streamed_tool_calls_become_calls_the_agent_parses():
    reply = _Reply(time.perf_counter())
    deltas = [
        {"choices": [{"delta": {"role": "assistant", "content": "Let me look."}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                                "function": {"name": "read_file", "arguments": ""}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"path": '}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"a.txt"}'}}]}}]},
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 120, "completion_tokens": 9,
                                  "prompt_tokens_details": {"cached_tokens": 100}}},
    ]
    text = "".join(reply.feed(d) for d in deltas) + reply.tool_call_text()
    parsed = parse_tool_calls(text, {"read_file"})
    assert parsed.content == "Let me look."
    assert [(c.name, c.arguments) for c in parsed.calls] == [("read_file", {"path": "a.txt"})]
    stats = reply.stats(prompt_size=0, outcome=None)
    assert (stats.prompt_tokens, stats.reused_tokens, stats.evaluated_tokens,
            stats.completion_tokens, stats.finish_reason) == (120, 100, 20, 9, "stop")


def test_calibration_keeps_the_largest_ratio_plus_a_margin():
    calibration = _Calibration()
    assert calibration.factor("s") == remote.UNCALIBRATED_FACTOR
    calibration.observe("s", 110, 100)
    calibration.observe("s", 95, 100)  # a smaller ratio never lowers the factor
    calibration.observe("s", 30, 10)  # too short a prompt to say anything
    assert calibration.factor("s") == 1.20  # 1.10 × 1.05, rounded up to a step of 0.05


# -- llama.cpp's server: exact --------------------------------------------------------------


def test_llama_server_reports_its_window_template_and_counts(llama_server, exact):
    props = httpx.get(llama_server.base_url + "/props", trust_env=False).json()
    assert props["default_generation_settings"]["n_ctx"] == N_CTX
    assert "<|im_start|>" in props["chat_template"]
    meta = httpx.get(llama_server.base_url + "/v1/models", trust_env=False).json()["data"][0]["meta"]
    assert meta["n_ctx_train"] == 32768
    info = remote.test_connection(llama_server.base_url)
    assert (info.kind, info.counting, info.models[0].context_length) == ("llama.cpp", "input_tokens", N_CTX)
    assert isinstance(exact, ExactRemoteRuntime)
    assert (exact.n_ctx, exact.window_source, exact.where) == (
        N_CTX, "server", f"server: {server_address(llama_server.base_url)}")
    assert exact.counter().name.startswith(f"server:{server_address(llama_server.base_url)}:")
    # the two ways llama.cpp counts agree: one call, or the template then the tokenizer
    older = ExactRemoteRuntime(exact._http, replace(exact.server, counting="apply-template"),
                               exact.model, exact.n_ctx, "server")
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Tabs\tand <|im_end|> and ünïcödé"}]
    assert older.count_prompt(messages) == exact.count_prompt(messages) > 20
    assert older.count_text("hello world") == exact.count_text("hello world") == 2


def test_predicted_prompt_tokens_equal_the_reported_ones(exact, fresh_store, chat, tmp_path):
    """Through the planner and the agent, with native tools: every request the agent
    sent was predicted to the token (the store records both numbers)."""
    (tmp_path / "notes.txt").write_text("The launch code is 1234.\n")
    planner = planner_on(exact, folder=tmp_path)
    thread = fresh_store.create_thread("t")
    fresh_store.add_messages(thread, chat[:40])
    for text in ("What did Rosa paint last?", "And Tomas?", "Summarize both in one line."):
        events = list(build_agent(planner, fresh_store, compact=False).send(thread, text))
        assert isinstance(events[-1], TurnDone) and events[-1].finish_reason in ("stop", "length")
    rows = fresh_store.requests(thread)
    assert len(rows) >= 3
    assert all(r["predicted_prompt_tokens"] == r["prompt_tokens"] for r in rows), rows
    request = planner.plan(fresh_store, thread)
    assert request.exact and request.tool_definitions  # tools went to the server's template


def test_a_tool_call_the_server_streams_runs_in_the_sandbox(exact, fresh_store, tmp_path):
    """llama.cpp parses the model's call into OpenAI ``tool_calls`` deltas; they reach the
    agent as a stored call, the tool runs, and the request with its result is exact."""
    (tmp_path / "notes.txt").write_text("The launch code is 1234.\n")
    planner = planner_on(exact, folder=tmp_path, system="You are Iris. Use the tools to read files.",
                         max_tokens=120)
    thread = fresh_store.create_thread("t")
    events = list(build_agent(planner, fresh_store, compact=False).send(
        thread, f"Read the file {tmp_path}/notes.txt and tell me the launch code."))
    ran = [e for e in events if isinstance(e, ToolFinished)]
    assert ran and ran[0].name == "read_file" and ran[0].ok and "1234" in ran[0].text
    call = row_to_message(fresh_store.messages(thread)[1])
    assert call["tool_calls"][0]["function"]["name"] == "read_file"
    rows = fresh_store.requests(thread)
    assert len(rows) >= 2 and all(r["predicted_prompt_tokens"] == r["prompt_tokens"] for r in rows)


def test_compaction_and_recall_run_on_the_server(exact, fresh_store, chat):
    """The compactor asks the server for its summary (a JSON-schema response format),
    the next request is still exact, and recall finds what was summarized away. Whether
    the 0.5B model's summary passes validation is the model's business: the request must
    not fail (a refused response_format would say "LLM summary failed")."""
    planner = planner_on(exact, window=2048, recall=512)
    thread = fresh_store.create_thread("t")
    fresh_store.add_messages(thread, chat[:80])
    compactor = build_compactor(planner, fresh_store)
    assert compactor.runtime is exact
    generations = []
    streaming = exact.stream
    with pytest.MonkeyPatch.context() as patch:  # see what each summary call reported
        patch.setattr(exact, "stream", lambda *a, **kw: generations.append(streaming(*a, **kw))
                      or generations[-1])
        event = compactor.compact(thread, "manual")
    assert event.outcome == "ok" and not (event.error or "").startswith("LLM summary failed"), event
    assert generations and generations[-1].stats.completion_tokens > 0
    fresh_store.add_message(thread, {"role": "user", "content": "Which city did Rosa move to?"})
    request = planner.plan(fresh_store, thread)
    assert request.summary is not None and request.breakdown.recall > 0 and request.exact
    _, stats = complete(exact, request.messages, max_tokens=2, temperature=0)
    assert stats.prompt_tokens == request.predicted_prompt_tokens


def test_both_server_runtimes_satisfy_the_runtime_protocol(exact, python_server):
    """The exact runtime (llama.cpp counts) and the estimating one (a server that cannot)
    have the interface of every runtime, and say what they cannot do."""
    estimating = RemoteRuntime.connect(python_server.base_url, api_key="sk-test-0123456789",
                                       fallback_window=N_CTX)
    try:
        for runtime, exact_counts in ((exact, True), (estimating, False)):
            assert protocol_problems(runtime, Runtime) == [], type(runtime).__name__
            assert isinstance(runtime, Runtime)
            caps = runtime.capabilities
            assert (caps.exact_counts, caps.native_tools, caps.prefill, caps.kv_state) == (
                exact_counts, True, False, False)
            with pytest.raises(Unsupported):
                runtime.prefill([{"role": "user", "content": "hi"}])
            assert runtime.kv_state() is None
            facts = runtime.describe()
            assert facts.where == runtime.where and facts.base_url == runtime.base_url
            assert facts.n_ctx == runtime.n_ctx and facts.file == runtime.model_name
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi."}]
            generation = runtime.stream(GenerationRequest(messages, max_tokens=2, temperature=0))
            assert generation.stats is None and generation.text() is not None
            assert generation.stats.prompt_tokens > 0
            if exact_counts:
                assert generation.stats.prompt_tokens == runtime.count_prompt(messages)
    finally:
        estimating.close()


def test_an_estimating_runtime_learns_from_the_usage_a_server_streams(exact):
    """What a server that cannot count (Ollama, a hosted API) does once it reports
    ``usage`` in its stream: llama.cpp's server here, treated as one (under a name of its
    own, whose calibration starts empty; llama.cpp serves its model whatever the name)."""
    estimating = RemoteRuntime(exact._http, replace(exact.server, counting="estimated"),
                               "estimating-test", exact.n_ctx, "server")
    before = estimating.counter()
    assert before.factor == remote.UNCALIBRATED_FACTOR
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Tell me about the harbour. " * 40}]
    _, stats = complete(estimating, messages, max_tokens=1, temperature=0)
    ratio = stats.prompt_tokens / estimating._raw_estimate(messages, None)
    after = estimating.counter()
    assert after.factor == math.ceil(ratio * (1 + remote.SAFETY_MARGIN) * 20) / 20
    assert after.name != before.name  # counts cached with the old factor are not reused
    too_long = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "harbour " * 6000}]
    with pytest.raises(PromptTooLongError) as refused:  # the server's own numbers
        "".join(estimating.stream(GenerationRequest(too_long, max_tokens=1)))
    assert refused.value.n_ctx == N_CTX and refused.value.prompt_tokens > N_CTX
    with pytest.raises(PromptTooLongError):  # counted exactly: refused before sending
        "".join(exact.stream(GenerationRequest(too_long, max_tokens=1)))


def test_the_server_reuses_the_prompt_prefix(exact, chat):
    messages = [{"role": "system", "content": SYSTEM}, *chat[:30]]
    _, first = complete(exact, messages, max_tokens=1, temperature=0)
    _, second = complete(exact, messages + [{"role": "assistant", "content": "Yes."},
                                            {"role": "user", "content": "And then?"}],
                         max_tokens=1, temperature=0)
    assert second.reused_tokens >= first.prompt_tokens - 8
    assert second.evaluated_tokens == second.prompt_tokens - second.reused_tokens < 40


def test_stop_acts_during_the_reply_and_during_the_prompt(exact, fresh_store, chat):
    planner = planner_on(exact, max_tokens=400, temperature=0.7)
    thread = fresh_store.create_thread("t")
    fresh_store.add_messages(thread, chat[:10])
    cancel = threading.Event()
    events = []
    for event in build_agent(planner, fresh_store, compact=False).send(thread, "Tell me a long story.",
                                                                cancel):
        events.append(event)
        if sum(isinstance(e, ReplyToken) for e in events) == 3:
            cancel.set()
    saved = next(e for e in events if isinstance(e, ReplySaved))
    assert events[-1].finish_reason == "cancelled" and saved.stats.finish_reason == "cancelled"
    assert fresh_store.messages(thread)[-1]["status"] == "interrupted"
    # a long prompt the server is still evaluating: Stop ends the wait at once
    long = [{"role": "system", "content": SYSTEM}, *chat[:120],
            {"role": "user", "content": "Go on."}]
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    started = time.monotonic()
    text, stats = complete(exact, long, max_tokens=50, cancel=cancel)
    assert text == ""
    assert time.monotonic() - started < 0.3 + 1.0
    assert stats.finish_reason == "cancelled"
    # the server stopped too: the next request is answered promptly
    assert complete(exact, long[:3], max_tokens=1, temperature=0)[1].finish_reason in ("stop", "length")


def test_a_server_killed_mid_reply_loses_nothing(model_path, tmp_path, fresh_store):
    try:
        server = start_llama_server(model_path, tmp_path, N_CTX)
    except ServerUnavailable as exc:
        pytest.skip(reason=f"{NO_LLAMA_SERVER}: {exc}")
    with server, RemoteRuntime.connect(server.base_url) as runtime:
        planner = planner_on(runtime, max_tokens=400, temperature=0.7)
        thread = fresh_store.create_thread("t")
        events = []
        for event in build_agent(planner, fresh_store, compact=False).send(
                thread, "Write a long poem about the sea."):
            events.append(event)
            if sum(isinstance(e, ReplyToken) for e in events) == 5:
                server.kill()
    partial = "".join(e.text for e in events if isinstance(e, ReplyToken))
    failed = next(e for e in events if isinstance(e, TurnFailed))
    assert "connection was lost mid-reply" in failed.text and events[-1].finish_reason == "error"
    stored = fresh_store.messages(thread)[-1]
    assert (stored["status"], stored["content"]) == ("error", partial) and partial


# -- a server that cannot count: estimated ----------------------------------------------------


def test_a_server_that_cannot_count_is_estimated_and_calibrated(python_server, real_model,
                                                               fresh_store, chat, caplog):
    caplog.set_level(logging.DEBUG)
    key = "sk-test-0123456789"
    with pytest.raises(ServerError, match="refused the API key"):
        RemoteRuntime.connect(python_server.base_url, api_key="sk-wrong", fallback_window=N_CTX)
    runtime = RemoteRuntime.connect(python_server.base_url, api_key=key, fallback_window=N_CTX)
    try:
        assert type(runtime) is RemoteRuntime and not runtime.capabilities.exact_counts
        assert (runtime.n_ctx, runtime.window_source) == (N_CTX, "config")
        counter = runtime.counter()
        assert not counter.exact and ":estimated:" in counter.name
        assert counter.factor != remote.UNCALIBRATED_FACTOR  # the connect request calibrated it
        planner = planner_on(runtime)
        thread = fresh_store.create_thread("t")
        fresh_store.add_messages(thread, chat[:60])
        request = planner.plan(fresh_store, thread)
        assert not request.exact  # so the meter and the inspector say "estimated"
        real = real_model.count_prompt(request.messages)  # the same GGUF, counted exactly
        assert real <= request.predicted_prompt_tokens <= real * 1.25
        _, stats = complete(runtime, request.messages, max_tokens=2, temperature=0)
        assert isinstance(stats, GenerationStats)
        assert stats.finish_reason in ("stop", "length")
    finally:
        runtime.close()
    assert key not in caplog.text


def test_requests_go_to_the_base_url_only(python_server, monkeypatch):
    """A proxy in the environment is not used: the conversation goes to the server."""
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("ALL_PROXY", "http://127.0.0.1:9")
    info = remote.test_connection(python_server.base_url, "sk-test-0123456789")
    assert info.kind == "openai" and info.models


# -- the GUI's parts ------------------------------------------------------------------------


def test_the_server_dialog_tests_the_connection_and_keeps_the_key(qtbot, llama_server, exact,
                                                                  memory_keyring):
    from PySide6.QtWidgets import QDialogButtonBox

    from iris_desktop.ui.server_dialog import ServerDialog

    dialog = ServerDialog()
    qtbot.addWidget(dialog)
    dialog.url.setText("http://192.168.1.20:8080")  # only typed: nothing is sent there
    assert "plain http" in dialog.warning.text()
    dialog.url.setText(llama_server.base_url)
    assert dialog.warning.text() == ""
    dialog.test_button.click()
    qtbot.waitUntil(lambda: dialog.info is not None, timeout=30_000)
    result = dialog.result.text()
    assert "llama.cpp" in result and "4,096 tokens" in result and "counts: exact" in result
    assert dialog.model.currentText() == exact.model
    dialog.key.setText("sk-local")
    with qtbot.waitSignal(dialog.serverChosen) as chosen:
        dialog.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    assert chosen.args == [llama_server.base_url, exact.model]
    address = server_address(llama_server.base_url)
    assert memory_keyring.passwords == {("iris-desktop", address): "sk-local"}
    again = ServerDialog(llama_server.base_url, exact.model)  # the key is never shown again
    qtbot.addWidget(again)
    assert again.key.text() == "" and "keyring" in again.key.placeholderText()
    with qtbot.waitSignal(again.serverRemoved):
        again.remove_button.click()
    assert memory_keyring.passwords == {}


def test_the_first_send_to_another_machine_is_confirmed_once(qtbot, tmp_path):
    from PySide6.QtCore import QSettings, QTimer
    from PySide6.QtWidgets import QApplication, QMessageBox

    from iris_desktop.ui.server_dialog import confirm_send, forget_send_confirmation

    state = QSettings(str(tmp_path / "ui-state.ini"), QSettings.Format.IniFormat)
    asked = []

    def answer(button) -> None:
        box = QApplication.activeModalWidget()
        asked.append(box.text())
        box.button(button).click()

    assert confirm_send("http://127.0.0.1:8080", state)  # this machine: never asked
    QTimer.singleShot(0, lambda: answer(QMessageBox.StandardButton.No))
    assert not confirm_send("https://gpu-box.lan:8443", state)
    QTimer.singleShot(0, lambda: answer(QMessageBox.StandardButton.Yes))
    assert confirm_send("https://gpu-box.lan:8443/v1", state)
    assert confirm_send("https://gpu-box.lan:8443", state)  # remembered for that server
    assert asked == ["Send your conversation to gpu-box.lan:8443?"] * 2
    # plain http to the same host and port is another agreement (a review: it was covered,
    # and its plain-http warning never shown)
    QTimer.singleShot(0, lambda: answer(QMessageBox.StandardButton.No))
    assert not confirm_send("http://gpu-box.lan:8443", state) and len(asked) == 3
    forget_send_confirmation("https://gpu-box.lan:8443", state)
    QTimer.singleShot(0, lambda: answer(QMessageBox.StandardButton.No))
    assert not confirm_send("https://gpu-box.lan:8443", state)


# -- as a user runs it ----------------------------------------------------------------------


def test_the_cli_chats_through_llama_server_with_exact_counts(llama_server, tmp_path):
    """The README's commands, as a user types them, in a real process: the reply comes
    from the server, and ``context --json`` shows the server's window and an exact count."""
    import subprocess
    import sys

    base = [sys.executable, "-m", "iris_desktop", "--data-dir", str(tmp_path / "home"),
            "--set", "model.backend=openai", "--set", f"model.base_url={llama_server.base_url}/v1"]
    done = subprocess.run([*base, "chat", "--new", "--json", "Say hi in two words."],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert reply["reply"].strip()
    assert reply["where"] == f"server: {server_address(llama_server.base_url)}"
    assert reply["chat_format"] == "server:llama.cpp" and reply["prompt_tokens"] > 0
    done = subprocess.run([*base, "context", "--json", "--draft", "And now?",
                           str(reply["thread_id"])], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    context = json.loads(done.stdout)
    assert (context["window_source"], context["window"]) == ("server", N_CTX)
    assert context["prompt_exact"] is True and context["counter"].startswith("server:")


def test_the_cli_uses_an_estimated_counter_where_the_server_cannot_count(
        python_server, tmp_path, capsys, memory_keyring):
    """llama_cpp.server: the key comes from the keyring (never the config file), the window
    from model.n_ctx (said as "config"), and the count is marked estimated."""
    from iris_desktop.cli import main

    url = python_server.base_url + "/v1"
    set_api_key(url, "sk-test-0123456789")
    home = tmp_path / "home"
    base = ["--data-dir", str(home), "--set", "model.backend=openai",
            "--set", f"model.base_url={url}", "--set", "model.n_ctx=4096"]
    assert main([*base, "chat", "--json", "Reply with one word."]) == 0
    reply = json.loads(capsys.readouterr().out)
    assert reply["reply"].strip() and reply["chat_format"] == "server:openai"
    assert main([*base, "context", "--json", str(reply["thread_id"])]) == 0
    context = json.loads(capsys.readouterr().out)
    assert (context["window_source"], context["window"]) == ("config", 4096)
    assert context["prompt_exact"] is False and ":estimated:" in context["counter"]
    assert main([*base, "context", str(reply["thread_id"])]) == 0
    assert "(predicted, estimated)" in capsys.readouterr().out
    stored = "".join(p.read_text(errors="replace") for p in home.rglob("*")
                     if p.is_file() and p.suffix in (".toml", ".log", ".ini"))
    assert "sk-test-0123456789" not in stored


def test_a_server_without_an_address_or_out_of_reach_is_a_clear_error(tmp_path, capsys):
    from iris_desktop.cli import main

    home = ["--data-dir", str(tmp_path / "home")]
    assert main([*home, "--set", "model.backend=openai", "chat", "hi"]) != 0
    assert "model.base_url" in capsys.readouterr().err
    assert main([*home, "--set", "model.base_url=ftp://x"]) != 0
    assert "http:// or https://" in capsys.readouterr().err
    port = free_port()  # nothing listens there
    assert main([*home, "--set", "model.backend=openai", "--set",
                 f"model.base_url=http://127.0.0.1:{port}/v1", "chat", "hi"]) != 0
    err = capsys.readouterr().err
    assert "cannot use the server" in err and f"127.0.0.1:{port}" in err


def test_the_window_adds_tests_chooses_and_removes_a_server(qtbot, llama_server, exact, tmp_path,
                                                             model_path, memory_keyring):
    """Model ▸ Server…: the real window connects to the server, says where the text goes,
    chats through it, saves the choice, and goes back to the local model on Remove."""
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QAction
    from PySide6.QtWidgets import QDialogButtonBox

    from iris_desktop.host import Host
    from iris_desktop.settings import load_settings
    from iris_desktop.ui.main_window import main_window

    session = Host(tmp_path / "data", {"model.path": str(model_path), "model.n_ctx": "2048"},
                   compact=False)
    window = main_window(session)
    qtbot.addWidget(window)
    window.show()
    try:
        qtbot.waitUntil(lambda: window.model_state == "ready", timeout=120_000)
        assert window.where_label.text() == "local"
        window.findChild(QAction, "server").trigger()  # Model ▸ Server…
        dialog = window.models.server_dialog
        assert dialog is not None and dialog.isVisible()
        dialog.url.setText(llama_server.base_url + "/v1")
        dialog.test_button.click()
        qtbot.waitUntil(lambda: dialog.info is not None, timeout=30_000)
        assert "counts: exact" in dialog.result.text()
        dialog.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
        address = server_address(llama_server.base_url)
        qtbot.waitUntil(lambda: window.where_label.text() == f"server: {address}",
                        timeout=60_000)
        assert window.model_state == "ready"
        saved = load_settings(session.paths.config_path, {}, {})
        assert (saved["model.backend"], saved["model.base_url"]) == (
            "openai", llama_server.base_url + "/v1")
        window.composer.edit.setFocus()
        window.composer.set_text("Say hi.")
        qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)
        qtbot.waitUntil(lambda: window.thread_id is not None and not window.generating,
                        timeout=120_000)
        rows = session.store.messages(window.thread_id)
        assert rows[-1]["role"] == "assistant" and rows[-1]["content"].strip()
        assert window.context.planner.window_source == "server"

        again = window.models.open_server()
        assert again.base_url() == llama_server.base_url + "/v1"
        again.remove_button.click()
        qtbot.waitUntil(lambda: window.where_label.text() == "local", timeout=120_000)
        saved = load_settings(session.paths.config_path, {}, {})
        assert (saved["model.backend"], saved["model.base_url"]) == ("local", "")
    finally:
        window.shutdown()
        session.close()


def test_the_local_default_still_answers_with_no_network_at_all(tmp_path, model_path):
    """Adding a server backend changed nothing for the local default: in a network
    namespace with no interface but loopback, ``chat`` answers and says "local"."""
    import shutil
    import subprocess
    import sys

    unshare = shutil.which("unshare")
    prefix = next((p for p in (["unshare", "-n"], ["unshare", "-rn"]) if unshare and
                   subprocess.run([*p, "true"], capture_output=True).returncode == 0), None)
    if prefix is None:
        pytest.skip(reason="unshare -n is not permitted here")
    data = tmp_path / "data"
    (data / "models").mkdir(parents=True)
    for name in (model_path.name, model_path.name + ".verified"):
        (data / "models" / name).symlink_to(model_path.parent / name)
    done = subprocess.run([*prefix, sys.executable, "-m", "iris_desktop", "--data-dir", str(data),
                           "--set", "model.temperature=0", "--set", "model.max_tokens=8",
                           "chat", "--new", "--json", "What is the capital of France? One word."],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert reply["where"] == "local" and "paris" in reply["reply"].lower()
