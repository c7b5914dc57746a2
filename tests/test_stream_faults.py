"""A server that misbehaves mid-reply: every way ends within its time limit, the text that
came is saved in the real store (also while the server is silent, within about a second),
memory stays bounded, and the user reads one sentence naming the cause.

Against :class:`misbehaving_server.MisbehavingServer`, a real HTTP server on 127.0.0.1;
the runtime gets short limits through its constructor (``idle_timeout_s``,
``start_timeout_s``), the app gets them from ``model.stream_idle_timeout_s``.
"""

from __future__ import annotations

import json
import threading
import time
import tracemalloc

import pytest

from iris_desktop.core.config import AgentConfig, ContextParams
from iris_desktop.core.events import ReplySaved, ReplyToken, TurnDone, TurnFailed
from iris_desktop.core.planner import Planner
from iris_desktop.core.store import Store
from iris_desktop.generation import GenerationRequest
from iris_desktop.host import build_agent, connect_server
from iris_desktop.runtime import remote  # remote.test_connection: pytest would collect the name
from iris_desktop.runtime.remote import MAX_LINE_BYTES, RemoteRuntime, ServerError
from iris_desktop.runtime.remote.sse import _sse_lines
from iris_desktop.settings import SettingsError, defaults

from support.misbehaving_server import MALFORMED, MisbehavingServer

TOKENS = ["Hello", ",", " world", "."]
PREAMBLE = "".join(TOKENS)
#: the limits these tests run with (the app's idle minimum is 5 s; the runtime takes less)
IDLE_S = 1.0
START_S = 2.0
#: no fault may take longer than this to end (generous: a slow machine is not a failure);
#: a server's own bound (``hold_s``) is longer, so a hang fails the test
CEILING_S = 12.0
HOLD_S = 25.0


def connect(server: MisbehavingServer, **limits) -> RemoteRuntime:
    return RemoteRuntime.connect(server.base_url, **{"idle_timeout_s": IDLE_S,
                                                     "start_timeout_s": START_S, **limits})


def planner_on(runtime: RemoteRuntime, max_tokens: int = 64) -> Planner:
    params = ContextParams(window=runtime.n_ctx, system_prompt="You are Iris.", recall_max_tokens=0)
    return Planner(params, runtime.counter(), runtime=runtime,
                   agent=AgentConfig(max_tokens=max_tokens, temperature=0.0))


def one_sentence(text: str) -> bool:
    """What the user reads: one line, one sentence, no traceback or Python repr."""
    return ("\n" not in text and "Traceback" not in text and ". " not in text.rstrip(".")
            and "object has no attribute" not in text and "Error(" not in text)


def measured_turn(runtime: RemoteRuntime, store: Store) -> tuple[list, float, int]:
    """:func:`run_turn`, and the most memory it took (tracemalloc's peak)."""
    tracemalloc.start()
    try:
        events, took = run_turn(runtime, store)
        return events, took, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def run_turn(runtime: RemoteRuntime, store: Store, max_tokens: int = 64) -> tuple[list, float]:
    thread = store.create_thread("t")
    started = time.monotonic()
    events = list(build_agent(planner_on(runtime, max_tokens), store, compact=False).send(thread, "hi"))
    return events, time.monotonic() - started


# -- saved while the server is silent -------------------------------------------------------


def test_a_silent_servers_partial_reply_is_saved_within_about_a_second(tmp_path):
    """The reply is saved on the one-second cadence also when no token arrives: a kill -9
    while the server is silent loses at most a second of text (issue 26, item 5)."""
    db = tmp_path / "iris.db"
    with MisbehavingServer("silent", tokens=TOKENS, hold_s=HOLD_S) as server, \
            RemoteRuntime.connect(server.base_url) as runtime:  # the default limits: no timeout here
        writer = Store(db)
        thread = writer.create_thread("t")
        events: list = []
        cancel = threading.Event()
        agent = build_agent(planner_on(runtime), writer, compact=False)
        turn = threading.Thread(target=lambda: events.extend(agent.send(thread, "hi", cancel)))
        turn.start()
        reader = Store(db)
        try:
            assert server.preamble_sent.wait(CEILING_S)
            sent_at = time.monotonic()
            saved_after = None
            while time.monotonic() - sent_at < CEILING_S:
                rows = [r for r in reader.messages(thread) if r["role"] == "assistant"]
                if rows and rows[-1]["content"] == PREAMBLE:
                    saved_after = time.monotonic() - sent_at
                    break
                time.sleep(0.05)
            # saved while the stream was still stalled: the server still holds it open
            still_streaming = turn.is_alive() and not server.client_gone.is_set()
            assert saved_after is not None, "the partial reply was not saved while the server was silent"
            assert still_streaming and rows[-1]["status"] == "streaming"
        finally:
            cancel.set()
            turn.join(CEILING_S)
            reader.close()
        assert not turn.is_alive()
        assert "".join(e.text for e in events if isinstance(e, ReplyToken)) == PREAMBLE
        assert all(e.text for e in events if isinstance(e, ReplyToken))  # no empty tokens shown
        writer.close()


# -- every hang ends within its limit, the text kept -----------------------------------------


IDLE = f"sent no new text for {IDLE_S:g} s (model.stream_idle_timeout_s)"


@pytest.mark.parametrize(("mode", "tokens", "limit_s", "why"), [
    ("silent", TOKENS, IDLE_S, IDLE),
    ("keepalive", TOKENS, IDLE_S, IDLE),
    ("empty", TOKENS, IDLE_S, IDLE),
    ("dribble", TOKENS, IDLE_S, IDLE),
    # nothing said yet: the server may still be reading the prompt, which has longer
    ("keepalive", [], START_S, f"answered but sent no text within {START_S:g} s of the request"),
    ("empty", [], START_S, f"answered but sent no text within {START_S:g} s of the request"),
    ("slow_headers", TOKENS, START_S, f"did not start answering within {START_S:g} s (not even the "
     f"response headers came)"),
], ids=["silent", "keepalive", "empty", "dribble", "keepalive-only", "empty-only", "slow-headers"])
def test_a_stalled_stream_ends_within_its_limit_and_keeps_the_text(mode, tokens, limit_s, why,
                                                                   fresh_store):
    with MisbehavingServer(mode, tokens=tokens, hold_s=HOLD_S) as server, connect(server) as runtime:
        events, took = run_turn(runtime, fresh_store)
        assert server.client_gone.wait(CEILING_S)  # Iris hung up: the server may stop generating
    assert limit_s <= took < CEILING_S
    failed = next(e for e in events if isinstance(e, TurnFailed))
    assert why in failed.text and one_sentence(failed.text), failed.text
    assert isinstance(events[-1], TurnDone) and events[-1].finish_reason == "error"
    shown = "".join(e.text for e in events if isinstance(e, ReplyToken))
    row = fresh_store.messages(failed.thread_id)[-1]
    assert (row["role"], row["status"], row["content"]) == ("assistant", "error", shown)
    assert shown == ("" if mode == "slow_headers" else "".join(tokens))


def test_a_stream_past_max_tokens_is_cut_off_with_a_note(fresh_store):
    with MisbehavingServer("forever", tokens=TOKENS, interval_s=0.001, hold_s=HOLD_S) as server, \
            connect(server, idle_timeout_s=30.0) as runtime:
        events, took = run_turn(runtime, fresh_store, max_tokens=8)
        assert server.client_gone.wait(CEILING_S)
    assert took < CEILING_S
    failed = next(e for e in events if isinstance(e, TurnFailed))
    assert "8-token limit" in failed.text and "model.max_tokens" in failed.text
    assert one_sentence(failed.text), failed.text
    shown = "".join(e.text for e in events if isinstance(e, ReplyToken))
    row = fresh_store.messages(failed.thread_id)[-1]
    assert (row["status"], row["content"]) == ("error", shown) and shown.startswith(PREAMBLE)
    assert len(shown) < 1000


def test_a_normal_stream_is_untouched_by_the_limits(fresh_store):
    with MisbehavingServer("normal", tokens=TOKENS) as server, connect(server) as runtime:
        events, _ = run_turn(runtime, fresh_store)
    assert not [e for e in events if isinstance(e, TurnFailed)]
    saved = next(e for e in events if isinstance(e, ReplySaved))
    assert (saved.text, saved.status) == (PREAMBLE, "complete")
    assert [e.text for e in events if isinstance(e, ReplyToken)] == TOKENS
    row = fresh_store.messages(saved.thread_id)[-1]
    assert (row["status"], row["content"]) == ("complete", PREAMBLE)


def test_a_finished_reply_on_a_connection_held_open_ends_as_complete(fresh_store):
    """Its finish reason came, then only silence on an open connection: the reply ends
    after a short grace for the usage chunk (it was held for the whole idle limit, 60 s
    by default, the window "generating" all along)."""
    with MisbehavingServer("finish_then_hold", tokens=TOKENS, hold_s=HOLD_S) as server, \
            connect(server, idle_timeout_s=HOLD_S) as runtime:
        events, took = run_turn(runtime, fresh_store)
    assert took < CEILING_S < HOLD_S
    assert not [e for e in events if isinstance(e, TurnFailed)]
    saved = next(e for e in events if isinstance(e, ReplySaved))
    assert (saved.text, saved.status, saved.stats.finish_reason) == (PREAMBLE, "complete", "stop")


# -- bounded memory ---------------------------------------------------------------------------


def test_one_huge_line_is_refused_at_the_limit_and_never_held_whole(fresh_store):
    huge = 64 << 20
    with MisbehavingServer("huge_line", tokens=TOKENS, huge_bytes=huge, hold_s=HOLD_S) as server, \
            connect(server, idle_timeout_s=30.0) as runtime:
        events, took, peak = measured_turn(runtime, fresh_store)
        assert server.client_gone.wait(CEILING_S)
        sent = server.bytes_sent
    assert took < CEILING_S
    failed = next(e for e in events if isinstance(e, TurnFailed))
    assert f"longer than {MAX_LINE_BYTES >> 20} MiB" in failed.text and one_sentence(failed.text), failed.text
    # never read whole: memory stays a few times the limit, and the rest was never sent
    assert peak < 6 * MAX_LINE_BYTES, f"{peak / 2**20:.1f} MiB traced"
    assert sent < huge // 3
    row = fresh_store.messages(failed.thread_id)[-1]
    assert (row["status"], row["content"]) == ("error", PREAMBLE)


def test_lines_are_split_on_every_sse_line_end_and_bounded():
    lines = _sse_lines([b"data: a\r\nda", b"ta: b\rdata: c\r", b"\ndata: d\n\n: x"], limit=64)
    assert list(lines) == ["data: a", "data: b", "data: c", "data: d", "", ": x"]
    with pytest.raises(remote.LineTooLong):
        list(_sse_lines([b"data: ", b"x" * 40, b"x" * 40], limit=64))
    with pytest.raises(remote.LineTooLong):
        list(_sse_lines([b"x" * 65 + b"\n"], limit=64))


# -- what is wrong, said plainly --------------------------------------------------------------

#: what each malformed event is called in the error
MALFORMED_SAYS = {
    "event-list": "an event is a list, not an object",
    "event-string": "an event is a string, not an object",
    "choices-string": "'choices' is a string, not a list",
    "choice-string": "a choice is a string, not an object",
    "delta-string": "'delta' is a string, not an object",
    "content-number": "'content' is a number, not a string",
    "content-object": "'content' is an object, not a string",
    "tool-calls-string": "'tool_calls' is a string, not a list",
    "tool-call-string": "a tool call is a string, not an object",
    "tool-call-index-string": "a tool call's 'index' is a string, not a whole number",
    "function-string": "'function' is a string, not an object",
    "arguments-number": "'arguments' is a number, not a string",
    "finish-number": "'finish_reason' is a number, not a string",
    "usage-string": "'usage' is a string, not an object",
    "timings-list": "'timings' is a list, not an object",
    "not-json": "an event is not JSON",
}


def test_every_malformed_field_is_named_in_one_sentence(fresh_store):
    assert set(MALFORMED_SAYS) == set(MALFORMED)
    with MisbehavingServer("malformed", tokens=TOKENS, hold_s=HOLD_S) as server, connect(server) as runtime:
        for name, says in MALFORMED_SAYS.items():
            server.malformed = name
            generation = runtime.stream(GenerationRequest([{"role": "user", "content": "hi"}], max_tokens=16))
            pieces = []
            started = time.monotonic()
            with pytest.raises(ServerError) as raised:
                for piece in generation:
                    pieces.append(piece)
            message = str(raised.value)
            assert message.startswith(f"127.0.0.1:{server.port} sent a reply Iris cannot read: ")
            assert says in message and one_sentence(message), (name, message)
            assert "".join(pieces) == PREAMBLE and time.monotonic() - started < CEILING_S
            assert generation.stats.finish_reason == "error"
        # through the agent: the text that came is kept, the reply marked as failed
        server.malformed = "choices-string"
        events, _ = run_turn(runtime, fresh_store)
    failed = next(e for e in events if isinstance(e, TurnFailed))
    assert "'choices' is a string, not a list" in failed.text and one_sentence(failed.text)
    row = fresh_store.messages(failed.thread_id)[-1]
    assert (row["status"], row["content"]) == ("error", PREAMBLE)


def test_a_redirect_names_its_target_and_the_setting_to_change():
    with MisbehavingServer("redirect") as server:
        moved = f"http://127.0.0.1:{server.port}/moved"
        for attempt in (lambda: remote.test_connection(server.base_url),
                        lambda: RemoteRuntime.connect(server.base_url)):
            with pytest.raises(ServerError) as raised:
                attempt()
            message = str(raised.value)
            assert f"redirected /props to {moved}/props" in message, message
            assert "does not follow redirects" in message and "model.base_url" in message
            assert f"{moved}/v1" in message and one_sentence(message), message
        # a redirect of the reply itself
        server.mode = "normal"
        with connect(server) as runtime:
            server.mode = "redirect"
            with pytest.raises(ServerError) as raised:
                runtime.stream(GenerationRequest([{"role": "user", "content": "hi"}], max_tokens=4)).text()
    message = str(raised.value)
    assert f"redirected /v1/chat/completions to {moved}/v1/chat/completions" in message, message
    assert one_sentence(message)


def test_a_server_description_or_count_of_the_wrong_shape_is_named():
    """A window of the wrong shape is as good as none (the settings' window is used); a
    count of the wrong shape is a sentence naming the endpoint and the field."""
    with MisbehavingServer("bad_counts") as server, connect(server) as runtime:
        assert (runtime.kind, runtime.window_source) == ("llama.cpp", "config")
        with pytest.raises(ServerError) as raised:
            runtime.count_prompt([{"role": "user", "content": "hi"}])
        message = str(raised.value)
        assert message == (f"127.0.0.1:{server.port} answered /v1/chat/completions/input_tokens in "
                           f"a way Iris cannot read: 'input_tokens' is a string, not a whole number")
        with pytest.raises(ServerError, match="answered /tokenize in a way Iris cannot read: "
                                              "'tokens' is a number, not a list"):
            runtime.count_text("hi")


def test_absurd_counts_and_windows_are_not_believed(monkeypatch):
    """Before: a count of 10**12 made every request "too large" (the window "allows 0"), a
    count of -5 left more room than the window, and a window of 10**12 was taken, so the
    chat would never compact."""
    from support import misbehaving_server

    monkeypatch.setitem(misbehaving_server.BAD_PROPS, "n_ctx", 10**12)
    for count in (10**12, -5):
        monkeypatch.setitem(misbehaving_server.BAD_COUNTS, "/v1/chat/completions/input_tokens",
                            {"input_tokens": count})
        with MisbehavingServer("bad_counts") as server, connect(server) as runtime:
            assert runtime.window_source == "config"  # 10**12 is no window
            with pytest.raises(ServerError) as raised:
                runtime.count_prompt([{"role": "user", "content": "hi"}])
            assert str(raised.value) == (
                f"127.0.0.1:{server.port} answered /v1/chat/completions/input_tokens with "
                f"{count:,} tokens, which cannot be a count of this conversation")


def test_a_web_page_for_a_reply_is_named_as_one(fresh_store):
    """Before: "the stream ended before the reply did (the connection was lost
    mid-reply)" for a login portal's page."""
    with MisbehavingServer("web_page") as server, connect(server) as runtime:
        events, took = run_turn(runtime, fresh_store)
        port = server.port
    failed = next(e for e in events if isinstance(e, TurnFailed))
    assert f"127.0.0.1:{port} answered with a web page, not a stream of events" \
        in failed.text and "model.base_url" in failed.text and "lost" not in failed.text
    assert took < CEILING_S


def test_a_stream_sent_as_json_is_read_as_the_stream_it_is(fresh_store):
    with MisbehavingServer("json_typed", tokens=TOKENS) as server, connect(server) as runtime:
        events, _ = run_turn(runtime, fresh_store)
    assert not [e for e in events if isinstance(e, TurnFailed)]
    assert next(e for e in events if isinstance(e, ReplySaved)).text == PREAMBLE


def test_a_too_long_answer_with_garbled_counts_is_the_http_error_it_is(fresh_store):
    """Before: "the connection was lost mid-reply (ValueError(\"invalid literal for int()
    …'x'\"))"."""
    with MisbehavingServer("garbled_too_long") as server, connect(server) as runtime:
        events, _ = run_turn(runtime, fresh_store)
        port = server.port
    failed = next(e for e in events if isinstance(e, TurnFailed))
    assert (f"127.0.0.1:{port}: HTTP 400: the request exceeds the available context size"
            in failed.text and "ValueError" not in failed.text)


def test_text_past_the_reply_limit_is_neither_shown_nor_kept(fresh_store):
    """Before: one event of 900,000 characters was shown and stored whole, though a reply
    of 16 tokens may hold 1,024."""
    from iris_desktop.runtime.remote.runtime import CHARS_PER_TOKEN

    with MisbehavingServer("normal", tokens=["x" * 900_000]) as server, connect(server) as runtime:
        events, _ = run_turn(runtime, fresh_store, max_tokens=16)
    shown = "".join(e.text for e in events if isinstance(e, ReplyToken))
    assert len(shown) == 16 * CHARS_PER_TOKEN
    failed = next(e for e in events if isinstance(e, TurnFailed))
    assert "kept sending past the 16-token limit" in failed.text
    kept = fresh_store.messages(failed.thread_id)[-1]
    assert (kept["content"], kept["status"]) == (shown, "error")


def test_an_address_with_a_password_is_refused_before_it_is_saved_or_logged():
    from iris_desktop.settings import lookup

    with pytest.raises(SettingsError) as raised:
        lookup("model.base_url").parse("http://alice:hunter2@127.0.0.1:8080/v1")
    assert "hunter2" not in str(raised.value) and "Model ▸ Server…" in str(raised.value)


# -- the setting reaches the runtime ----------------------------------------------------------


def test_the_idle_setting_reaches_the_server_runtime():
    with MisbehavingServer("normal") as server:
        settings = defaults().with_overrides({
            "model.backend": "openai", "model.base_url": server.base_url,
            "model.stream_idle_timeout_s": "5"})
        with connect_server(settings) as runtime:
            assert runtime.idle_timeout_s == 5.0
            assert runtime.start_timeout_s >= runtime.idle_timeout_s
        with pytest.raises(SettingsError):  # the range stays the settings' own: 5 s at least
            defaults().with_overrides({"model.stream_idle_timeout_s": "1"})


def test_a_server_gone_since_it_was_chosen_is_named_as_not_reached(fresh_store):
    """Before (an audit): a server stopped after Iris connected to it failed the next send
    with "the connection was lost mid-reply", though nothing had connected. Now: "could
    not reach the server … is it running?", in one sentence."""
    with MisbehavingServer("normal", tokens=TOKENS) as server:
        runtime = connect(server)
    with runtime:  # the server has stopped: its port refuses
        events, _ = run_turn(runtime, fresh_store)
    failed = next(e for e in events if isinstance(e, TurnFailed))
    assert "could not reach the server at " in failed.text, failed.text
    assert "is it running?" in failed.text and "mid-reply" not in failed.text
    assert one_sentence(failed.text.rstrip("."))


def test_a_servers_error_message_is_said_short_on_one_line():
    """Before (an audit): a 60 KB message in an HTTP 500, or 800 KB in a mid-stream error
    event, became the whole "sentence" on stderr, in the log and in the chat, line breaks
    and a fake traceback included; ``{"error": {"code": 500}}`` read as "…: None"."""
    import httpx

    from iris_desktop.runtime.remote.sse import _parse_data
    from iris_desktop.runtime.remote.transport import SERVER_MESSAGE_CHARS, _http_error

    request = httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
    huge = "model crashed:\n  at line 2\n" + "y" * 800_000
    for answer, said in [
        (httpx.Response(500, json={"error": {"message": huge}}, request=request),
         "model crashed: at line 2 yyy"),
        (httpx.Response(429, text="<html><head><style>p {}</style></head><body><p>Slow "
                        "&amp; down</p>" + "z" * 5000, request=request),
         "answered with a web page: Slow & down zzz"),
        (httpx.Response(500, json={"error": {"code": 500}}, request=request),
         "Internal Server Error"),
    ]:
        text = str(_http_error("127.0.0.1:9", answer))
        assert one_sentence(text) and said in text and len(text) < SERVER_MESSAGE_CHARS + 60, text
    for event, said in [({"error": {"message": huge}}, "model crashed: at line 2 yyy"),
                        ({"error": {"code": 500}}, "it did not say why")]:
        with pytest.raises(ServerError) as caught:
            _parse_data(json.dumps(event), "127.0.0.1:9")
        text = str(caught.value)
        assert one_sentence(text) and said in text and len(text) < SERVER_MESSAGE_CHARS + 80, text


@pytest.mark.parametrize("mode,said", [
    ("tool_flood", "kept sending past the 64-token limit"),
    ("many_calls", "sent more than 64 tool calls in one reply"),
])
def test_streamed_tool_calls_are_held_to_the_replys_bounds(fresh_store, mode, said):
    """Before (an audit): a tool call's arguments did not count toward the reply's bound:
    900 KiB pieces held ~1 GB at max_tokens 256 (~3.7 GB at the default), and 50,000
    calls in one reply became 50,000 rows of the history. Now they end the reply in one
    sentence, in bounded memory, and nothing of them is stored as a call."""
    with MisbehavingServer(mode) as server, connect(server) as runtime:
        events, took, peak = measured_turn(runtime, fresh_store)
    failed = next(e for e in events if isinstance(e, TurnFailed))
    assert said in failed.text and one_sentence(failed.text), failed.text
    assert took < CEILING_S and peak < 64 << 20
    rows = fresh_store.all_messages(1)
    assert len(rows) == 2 and not rows[-1]["tool_calls"]
