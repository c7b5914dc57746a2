"""The server backend against more hostile servers (an audit of the OpenAI-compatible
path): tool-call arguments nested thousands deep, an error status whose body never
comes, a reply's text in another schema than the chat stream's, and a line that comes
in many pieces.

Against real HTTP servers on 127.0.0.1 (``support/misbehaving_server.py``, and
``support/network.py``'s :class:`ScriptedSocketServer` for answers written byte for
byte), the real runtime, the real agent and a real SQLite store. Nothing is timed: a
hang is bounded by the timeouts the test sets, and costs are counted.
"""

from __future__ import annotations

import json
import random

import pytest

from iris_desktop.core.config import AgentConfig, ContextParams, ToolsConfig
from iris_desktop.core.events import ToolFinished, TurnFailed
from iris_desktop.core.planner import Planner
from iris_desktop.core.toolcalls import MAX_ARGUMENT_DEPTH, parse_tool_calls
from iris_desktop.core.views import TOO_DEEP, arguments_text, call_label, pretty_arguments
from iris_desktop.generation import GenerationRequest
from iris_desktop.host import build_agent
from iris_desktop.runtime import http
from iris_desktop.runtime.remote import RemoteRuntime, ServerError, sse

from support.misbehaving_server import MisbehavingServer
from support.network import Held, ScriptedSocketServer, event_stream, http_answer, openai_answers

pytestmark = pytest.mark.usefixtures("no_proxy_no_keyring")

HI = [{"role": "user", "content": "hi"}]


def reply(runtime: RemoteRuntime) -> str:
    return runtime.stream(GenerationRequest(HI, max_tokens=1024)).text()


def deep_list(depth: int) -> str:
    return "[" * depth + "]" * depth


def deep_object(depth: int) -> str:
    return '{"path": ' * depth + '"x"' + "}" * depth


def nested_value(depth: int) -> dict:
    """``{"path": {"path": … "x"}}``, ``depth`` objects deep (built without recursion)."""
    value: object = "x"
    for _ in range(depth):
        value = {"path": value}
    return value  # type: ignore[return-value]


def call_of(arguments: object) -> list[dict]:
    return [{"index": 0, "id": "call_1", "type": "function",
             "function": {"name": "read_file", "arguments": arguments}}]


# -- 1. tool-call arguments nested too deeply ---------------------------------------------


@pytest.mark.parametrize("arguments", [
    deep_list(5000),                                 # before: "The model failed: maximum recursion"
    deep_object(960),                                # before: parsed here, six tracebacks in the window
    deep_object(MAX_ARGUMENT_DEPTH + 1),             # before: a call with arguments 101 deep
    nested_value(MAX_ARGUMENT_DEPTH + 1),            # sent as an object, not as text
], ids=["list-5000-deep", "object-960-deep", "object-101-deep", "as-an-object-101-deep"])
def test_arguments_nested_too_deeply_are_a_malformed_call_the_model_hears_of(arguments):
    """Before: arguments nested 5,000 deep ended the turn with "The model failed: maximum
    recursion depth exceeded while decoding a JSON array"; 960 deep parsed on the worker
    thread, and failed again on the window's (six tracebacks, replies stuck "streaming").
    Now: any deeper than MAX_ARGUMENT_DEPTH is a malformed call that says so."""
    with MisbehavingServer("tool_call", tokens=[], calls=call_of(arguments)) as server, \
            RemoteRuntime.connect(server.base_url) as runtime:
        text = reply(runtime)
    parsed = parse_tool_calls(text, {"read_file"})
    assert [(c.name, c.arguments) for c in parsed.calls] == [("read_file", None)]
    assert "nested too deeply" in parsed.calls[0].error
    json.dumps(parsed.calls[0].to_openai())  # what is stored and shown: shallow


def test_arguments_as_deep_as_allowed_are_a_call():
    arguments = {"path": "notes.txt", "deep": json.loads(deep_list(MAX_ARGUMENT_DEPTH - 1))}
    with MisbehavingServer("tool_call", tokens=[], calls=call_of(json.dumps(arguments))) as server, \
            RemoteRuntime.connect(server.base_url) as runtime:
        text = reply(runtime)
    [call] = parse_tool_calls(text, {"read_file"}).calls
    assert (call.error, call.arguments) == (None, arguments)


def test_one_depth_bound_for_both_layers():
    """core cannot import the runtime: its bound is a copy, which must not drift."""
    assert MAX_ARGUMENT_DEPTH == http.MAX_JSON_DEPTH


def test_a_turn_whose_call_nests_5000_deep_tells_the_model(fresh_store, tmp_path):
    """The whole turn: the call is answered "malformed … nested too deeply" and that goes
    back to the model; the turn does not fail with Python's words."""
    (tmp_path / "allowed").mkdir()
    with MisbehavingServer("tool_call", tokens=[], calls=call_of(deep_list(5000))) as server, \
            RemoteRuntime.connect(server.base_url) as runtime:
        planner = Planner(ContextParams(window=runtime.n_ctx, system_prompt="You are Iris."),
                          runtime.counter(), runtime=runtime, agent=AgentConfig(),
                          tools=ToolsConfig(allowed_paths=(str(tmp_path / "allowed"),),
                                            max_calls_per_turn=2))
        agent = build_agent(planner, fresh_store, compact=False)
        events = list(agent.send(fresh_store.create_thread("t"), "look"))
        streamed = [body for method, path, body in server.requests
                    if path == "/v1/chat/completions" and (body or {}).get("stream")]
    finished = [e for e in events if isinstance(e, ToolFinished)]
    assert finished and "nested too deeply" in finished[0].text and not finished[0].ok
    assert all("recursion" not in e.text for e in events if isinstance(e, TurnFailed))
    heard = [m for m in streamed[1]["messages"] if m["role"] == "tool"]
    assert heard and "nested too deeply" in heard[0]["content"]


@pytest.mark.parametrize("raw", [deep_list(100_000), nested_value(100_000)],
                         ids=["text", "value"])
def test_the_views_show_arguments_nested_too_deeply_without_raising(raw):
    """Before: ``pretty_arguments``, ``arguments_text`` and ``call_label`` caught only
    ValueError, and wrote a parsed value out again: RecursionError on the window's thread.
    Now: the text as it came, or a word that says why there is none."""
    shown = raw if isinstance(raw, str) else TOO_DEEP
    assert pretty_arguments(raw) == shown
    assert call_label({"function": {"name": "read_file", "arguments": raw}}) == ("read_file", shown)
    if isinstance(raw, str):
        assert arguments_text(raw) == raw


# -- 2. an error status whose body never comes ---------------------------------------------

#: an error status, and a Content-Length whose body never comes (the connection held)
HELD_503 = Held(http_answer("503 Service Unavailable", length=200))
#: ... and one whose body comes in part
HELD_503_PART = Held(http_answer("503 Service Unavailable", b'{"error": {"message": "busy',
                                 length=200))


@pytest.mark.parametrize("answer", [HELD_503, HELD_503_PART], ids=["no-body", "part-of-it"])
def test_an_error_status_whose_body_never_comes_is_said_as_that_status(monkeypatch, answer):
    """Before: a reply answered ``500`` whose body never came was said, after the start
    timeout (600 s), as "answered but sent no text within 600 s", the status never
    named. Now: the body is read for ERROR_BODY_WAIT_S at most, then the status is the
    answer; here the start timeout passes first, and the status is still what is said."""
    monkeypatch.setattr(http, "ERROR_BODY_WAIT_S", 1.0, raising=False)  # > start timeout
    with ScriptedSocketServer(openai_answers(answer)) as server, \
            RemoteRuntime.connect(server.base_url, start_timeout_s=0.5) as runtime:
        with pytest.raises(ServerError) as raised:
            reply(runtime)
        assert server.held == 1
    assert "HTTP 503" in str(raised.value), str(raised.value)
    if answer is HELD_503_PART:
        assert "busy" in str(raised.value)


@pytest.mark.parametrize("bound", ["error body wait", "answer timeout", "connect deadline"])
def test_an_error_status_for_the_model_list_is_said_as_that_status(monkeypatch, bound):
    """Before: ``/v1/models`` answered ``503`` whose body never came was said after 30 s as
    "did not finish answering /v1/models". Now: the status, whichever bound ends the
    wait (the error body's own, the answer's timeout or the connect's deadline)."""
    limits = {"answer_timeout_s": 3.0}
    if bound == "error body wait":
        monkeypatch.setattr(http, "ERROR_BODY_WAIT_S", 0.5, raising=False)
    else:
        limits = {"answer_timeout_s": 0.5} if bound == "answer timeout" else {"deadline_s": 0.5}
    with ScriptedSocketServer({"/v1/models": HELD_503}) as server, \
            pytest.raises(ServerError) as raised:
        RemoteRuntime.connect(server.base_url, **limits)
    said = str(raised.value)
    assert "HTTP 503: Service Unavailable" in said and "did not finish" not in said, said


# -- 3. text in another schema -------------------------------------------------------------


def choice(**fields: object) -> dict:
    return {"choices": [{"index": 0, **fields}]}


@pytest.mark.parametrize("events", [
    [choice(text="Hello"), choice(text=" legacy"), choice(text="", finish_reason="stop")],
    [choice(message={"role": "assistant", "content": "Hello legacy"}, finish_reason="stop")],
], ids=["completion-text", "whole-message"])
def test_text_in_another_schema_is_the_reply(events):
    """Before: text in ``choices[].text`` (a completion's) or ``choices[].message.content``
    (an answer read whole) was dropped, and the reply said to be empty."""
    with ScriptedSocketServer(openai_answers(event_stream(*events))) as server, \
            RemoteRuntime.connect(server.base_url) as runtime:
        generation = runtime.stream(GenerationRequest(HI, max_tokens=64))
        text = generation.text()
    assert text == "Hello legacy" and generation.stats.answered


def test_a_whole_message_after_the_deltas_is_not_the_reply_again():
    """A server that ends its deltas with the whole message: the text once."""
    events = [choice(delta={"content": "Hello"}), choice(delta={"content": " there"}),
              choice(message={"role": "assistant", "content": "Hello there"},
                     finish_reason="stop")]
    with ScriptedSocketServer(openai_answers(event_stream(*events))) as server, \
            RemoteRuntime.connect(server.base_url) as runtime:
        assert reply(runtime) == "Hello there"


# -- 4. a long line in many pieces ----------------------------------------------------------


class CountingSearch:
    """``sse._LINE_END`` with the bytes each search looks at counted."""

    def __init__(self, pattern) -> None:
        self.pattern, self.searched = pattern, 0

    def search(self, buffer, pos=0):
        self.searched += len(buffer) - pos
        return self.pattern.search(buffer, pos)

    def split(self, data):
        return self.pattern.split(data)


def test_a_line_in_many_pieces_is_searched_once(monkeypatch):
    """Before: every piece of a line searched the whole line again for its end: a 1 MiB
    line in 1 KiB pieces, 512 MiB searched. Now: each byte once."""
    counting = CountingSearch(sse._LINE_END)
    monkeypatch.setattr(sse, "_LINE_END", counting)
    line = b"data: " + b"x" * ((1 << 20) - 100) + b"\n"
    pieces = [line[i:i + 1024] for i in range(0, len(line), 1024)]
    assert [len(text) for text in sse._sse_lines(pieces)] == [len(line) - 1]
    assert counting.searched <= 2 * len(line)


@pytest.mark.parametrize("seed", range(8))
def test_lines_are_the_same_however_they_are_cut(seed):
    """CRLF, CR and LF line ends, cut anywhere (a CRLF between two pieces among them)."""
    data = b"data: a\r\n\r\ndata: b\rdata: c\n: keep\r\n\ndata: " + b"d" * 3000 + b"\r\nlast"
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(data)), 40))
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    assert list(sse._sse_lines(pieces)) == list(sse._sse_lines([data]))
    assert list(sse._sse_lines([data])) == ["data: a", "", "data: b", "data: c", ": keep", "",
                                            "data: " + "d" * 3000, "last"]
