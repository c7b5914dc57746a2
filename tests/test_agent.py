"""The turn loop with a scripted runtime: tool loop, malformed calls, the limit, cancel."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from iris_desktop.core.agent import Agent
from iris_desktop.core.config import AgentConfig, ContextParams, ToolsConfig
from iris_desktop.core.engine import ConversationTooLargeException
from iris_desktop.core.events import (
    ReplyToken,
    RequestSent,
    ToolFinished,
    TurnDone,
    TurnFailed,
    UserSaved,
)
from iris_desktop.core.planner import Planner
from iris_desktop.host import build_agent
from iris_desktop.runtime.protocol import Capabilities

from support.fakes import ScriptedRuntime


def call(name: str, **arguments) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "allowed"
    root.mkdir()
    (root / "notes.txt").write_text("the launch code is 1234\n" * 3)
    return root


def planner_for(runtime, params, folder=None, **config) -> Planner:
    tools = ToolsConfig(allowed_paths=(str(folder),) if folder else ())
    return Planner(params, runtime.counter(), runtime=runtime, agent=AgentConfig(**config),
                   tools=tools)


def make_agent(store, replies, folder=None, **config):
    runtime = ScriptedRuntime(replies)
    planner = planner_for(runtime, ContextParams(window=8192, system_prompt="You are Iris."),
                          folder, **config)
    return build_agent(planner, store, compact=False), runtime


def kinds(events):
    return [type(e).__name__ for e in events]


def test_plain_answer(fresh_store):
    thread = fresh_store.create_thread("New chat")
    agent, runtime = make_agent(fresh_store, ["Hello there, friend."])
    events = list(agent.send(thread, "Hi Iris"))
    assert kinds(events)[:3] == ["UserSaved", "RequestSent", "ReplyStarted"]
    assert kinds(events)[-2:] == ["ReplySaved", "TurnDone"]
    assert "".join(e.text for e in events if isinstance(e, ReplyToken)) == "Hello there, friend."
    rows = fresh_store.messages(thread)
    assert [(r["role"], r["content"], r["status"]) for r in rows] == [
        ("user", "Hi Iris", "complete"), ("assistant", "Hello there, friend.", "complete")]
    assert fresh_store.thread(thread)["title"] == "Hi Iris"
    request = fresh_store.requests(thread)[0]
    assert request["prompt_tokens"] == request["predicted_prompt_tokens"]


def test_tool_loop_call_result_answer(fresh_store, folder):
    thread = fresh_store.create_thread("t")
    agent, runtime = make_agent(
        fresh_store, [call("read_file", path="notes.txt"), "The code is 1234."], folder)
    events = list(agent.send(thread, "What is the launch code?"))
    assert "ToolFinished" in kinds(events)
    rows = fresh_store.messages(thread)
    assert [r["role"] for r in rows] == ["user", "assistant", "tool", "assistant"]
    calls = json.loads(rows[1]["tool_calls"])
    assert calls[0]["function"]["name"] == "read_file"
    assert rows[2]["tool_call_id"] == calls[0]["id"] and "1234" in rows[2]["content"]
    # the second request showed the model its call and the full result
    second = runtime.requests[1]
    assert second[-1]["role"] == "tool" and "launch code is 1234" in second[-1]["content"]
    assert "read_file" in runtime.requests[0][0]["content"]  # tools described in the system prompt
    assert rows[3]["content"] == "The code is 1234."


def test_malformed_call_goes_back_as_a_tool_error(fresh_store, folder):
    thread = fresh_store.create_thread("t")
    agent, runtime = make_agent(
        fresh_store, ['<tool_call>{"name": "read_file", "arguments": {oops}</tool_call>', "Sorry."],
        folder)
    events = list(agent.send(thread, "read it"))
    tool = [e for e in events if isinstance(e, ToolFinished)][0]
    assert not tool.ok and "malformed tool call" in tool.text
    assert isinstance(events[-1], TurnDone)
    assert fresh_store.messages(thread)[-1]["content"] == "Sorry."


def test_tool_call_limit(fresh_store, folder):
    thread = fresh_store.create_thread("t")
    agent, runtime = make_agent(
        fresh_store, [call("list_directory", path=".")] * 3 + ["Done."], folder,
        max_calls_per_turn=2)
    events = list(agent.send(thread, "look around"))
    tools = [e for e in events if isinstance(e, ToolFinished)]
    # after the limit the model is asked without tools; a call it makes anyway is read as
    # one and answered "limit reached" (an audit: it was shown as the answer, raw markup)
    assert [t.ok for t in tools] == [True, True, False]
    assert "tool call limit reached (tools.max_calls_per_turn = 2)" in tools[2].text
    assert "list_directory" not in runtime.requests[2][0]["content"]
    assert isinstance(events[-1], TurnDone) and events[-1].finish_reason == "stop"
    assert len(runtime.requests) == 4
    assert fresh_store.messages(thread)[-1]["content"] == "Done."
    assert all("<tool_call>" not in (m["content"] or "") for m in fresh_store.messages(thread))


def test_a_model_that_keeps_calling_past_the_limit_is_stopped_and_said(fresh_store, folder):
    thread = fresh_store.create_thread("t")
    agent, runtime = make_agent(fresh_store, [call("list_directory", path=".")] * 10, folder,
                                max_calls_per_turn=2)
    events = list(agent.send(thread, "look around"))
    failed = [e for e in events if isinstance(e, TurnFailed)]
    assert len(failed) == 1 and "kept calling tools after tools.max_calls_per_turn (2)" in failed[0].text
    assert isinstance(events[-1], TurnDone) and events[-1].finish_reason == "error"
    assert len(runtime.requests) == 4  # two with tools, one told none remain, one more: stop
    assert all("<tool_call>" not in (m["content"] or "") for m in fresh_store.messages(thread))


def test_cancel_keeps_partial_reply_marked_interrupted(fresh_store):
    thread = fresh_store.create_thread("t")
    cancel = threading.Event()
    agent, runtime = make_agent(fresh_store, [" ".join(["word"] * 200)])
    events = []
    for event in agent.send(thread, "talk", cancel):
        events.append(event)
        if isinstance(event, ReplyToken) and len(events) > 6:
            cancel.set()
    assert events[-1].finish_reason == "cancelled"
    reply = fresh_store.messages(thread)[-1]
    assert reply["status"] == "interrupted" and 0 < len(reply["content"]) < 200 * 5
    assert fresh_store.messages(thread)[0]["content"] == "talk"


def test_partial_text_is_saved_while_streaming(fresh_store):
    thread = fresh_store.create_thread("t")
    ticks = iter(range(1000))
    runtime = ScriptedRuntime([" ".join(f"w{i}" for i in range(10))])
    agent = Agent(fresh_store, planner_for(runtime, ContextParams(window=8192), save_interval_s=2.0),
                  clock=lambda: next(ticks))
    seen = []
    for event in agent.send(thread, "go"):
        if isinstance(event, ReplyToken):
            seen.append(fresh_store.messages(thread)[-1]["content"])
    # saved every 2 clock ticks, so the stored text trails the stream by at most one save
    assert any(s.startswith("w0 w1") for s in seen)
    assert fresh_store.messages(thread)[-1]["status"] == "complete"


def test_a_save_the_write_lock_holds_off_does_not_end_the_reply(fresh_store, tmp_path):
    """Before, a periodic save of the reply that met another process's write lock past
    the busy timeout (a long import) ended the reply as "The model failed", and the error
    save met the lock too: the reply stayed 'streaming'. The save is skipped and made
    later; the reply is saved whole when it ends (the lock let go by then)."""
    import sqlite3

    thread = fresh_store.create_thread("t")
    fresh_store.conn.execute("PRAGMA busy_timeout = 20")  # a busy timeout run out at once
    other = sqlite3.connect(fresh_store.path, isolation_level=None)
    ticks = iter(range(1000))
    words = [f"w{i}" for i in range(12)]
    runtime = ScriptedRuntime([" ".join(words)])
    agent = Agent(fresh_store, planner_for(runtime, ContextParams(window=8192), save_interval_s=2.0),
                  clock=lambda: next(ticks))
    events, holding = [], False
    for event in agent.send(thread, "go"):
        events.append(event)
        tokens = sum(isinstance(e, ReplyToken) for e in events)
        if tokens == 2 and not holding:
            other.execute("BEGIN IMMEDIATE")  # another process writes for a long time
            holding = True
        if tokens == 8 and holding:
            other.execute("COMMIT")
            holding = False
    assert not [e for e in events if isinstance(e, TurnFailed)]
    reply = fresh_store.messages(thread)[-1]
    assert reply["status"] == "complete" and reply["content"] == " ".join(words)
    other.close()


def test_model_failure_mid_reply_keeps_everything(fresh_store):
    thread = fresh_store.create_thread("t")
    agent, _ = make_agent(fresh_store, [RuntimeError("GPU on fire")])
    events = list(agent.send(thread, "hello"))
    assert [e for e in events if isinstance(e, TurnFailed)][0].text.endswith("GPU on fire")
    rows = fresh_store.messages(thread)
    assert rows[0]["content"] == "hello" and rows[1]["status"] == "error"


def test_a_message_too_large_for_any_request_is_refused_before_it_is_stored(fresh_store):
    thread = fresh_store.create_thread("t")
    runtime = ScriptedRuntime(["never"])
    agent = Agent(fresh_store, planner_for(runtime, ContextParams(window=1024)))
    events = list(agent.send(thread, "x " * 20000))
    error = [e for e in events if isinstance(e, TurnFailed)][0]
    assert error.kind == "too_large" and "the history budget allows" in error.text
    assert error.message_id is None and not [e for e in events if isinstance(e, UserSaved)]
    assert runtime.requests == []
    assert fresh_store.messages(thread) == []  # nothing stored


def test_a_message_that_fits_alone_but_not_beside_the_system_prompt_is_refused_with_contexts_numbers(
        fresh_store):
    """Before: the message alone was compared with the whole budget (window × ratio): one
    that fit that but not beside the system prompt was stored, then refused with another
    number ("allows 358" before storing, "allows 333" after, for one window), and the chat
    kept a question that could never be answered. Now it is refused before it is stored,
    in the planner's words and numbers; one that fits is sent as before."""
    thread = fresh_store.create_thread("t")
    runtime = ScriptedRuntime(["Fine."])
    params = ContextParams(window=1024, system_prompt="Be brief. " * 150)
    planner = planner_for(runtime, params)
    agent = Agent(fresh_store, planner)
    events = list(agent.send(thread, "word " * 500))
    error = [e for e in events if isinstance(e, TurnFailed)][0]
    assert error.kind == "too_large" and runtime.requests == []
    assert error.message_id is None and fresh_store.messages(thread) == []
    with pytest.raises(ConversationTooLargeException) as planned:
        planner.plan(fresh_store, thread, "word " * 500)
    assert error.text == (f"Not sent: {planned.value}; shorten the message or its attached "
                          "files, or raise context.window and model.n_ctx")  # what to do, too
    assert "− system " in error.text
    assert (error.needed, error.allowed) == (planned.value.needed, planned.value.allowed)
    events = list(agent.send(thread, "word " * 20))
    assert fresh_store.messages(thread)[-1]["content"] == "Fine."


def test_a_message_that_fits_once_compaction_shortens_the_summary_is_sent(fresh_store):
    """Before (a review of the check above): in a compacted chat, a message larger than
    the room beside today's summary was refused ("allows 2,481 … − summary 375"), though
    compaction, due once it is stored, writes a shorter summary and makes room for it (it
    was answered before the check). Now only a message that not even the shortest summary
    leaves room for is refused, and the sentence says so."""
    from iris_desktop.core.compaction import MIN_SUMMARY_TOKENS
    from iris_desktop.core.config import CompactionSettings
    from iris_desktop.core.events import CompactionFinished

    from support.helpers import llm_json

    thread = fresh_store.create_thread("t")
    for n in range(40):
        fresh_store.add_messages(thread, [
            {"role": "user", "content": f"On {1 + n % 28} May I visited Lisbon with Maria and "
                                        f"bought {n + 3} books. " + "u" * 300},
            {"role": "assistant", "content": f"That sounds lovely, {n} books! " + "a" * 300}])
    runtime = ScriptedRuntime([llm_json(words=400)] * 3 + ["Answer."] * 3, n_ctx=4096)
    planner = Planner(ContextParams(window=4096, system_prompt="You are Iris."),
                      runtime.counter(), runtime=runtime,
                      compaction=CompactionSettings(summary_max_tokens=900))
    agent = build_agent(planner, fresh_store)
    list(agent.send(thread, "hello"))  # the first compaction
    frame = planner.engine(fresh_store, recall=False).frame(thread)
    assert frame.summary_tokens > MIN_SUMMARY_TOKENS + 200
    counter = runtime.counter()
    words = next(n for n in range(100, 4000, 10)
                 if counter.count_message({"role": "user", "content": "word " * n})
                 > frame.history_budget + 100)
    events = list(agent.send(thread, "word " * words))
    assert not [e for e in events if isinstance(e, TurnFailed)]
    assert [e for e in events if isinstance(e, CompactionFinished)]  # it made the room
    assert fresh_store.messages(thread)[-1]["content"] == "Answer."
    room = frame.history_budget + frame.summary_tokens - MIN_SUMMARY_TOKENS
    too_many = next(n for n in range(words, 8000, 10)
                    if counter.count_message({"role": "user", "content": "word " * n}) > room + 400)
    events = list(agent.send(thread, "word " * too_many))
    failed = [e for e in events if isinstance(e, TurnFailed)]
    assert failed and failed[0].kind == "too_large" and failed[0].message_id is None
    assert "even beside the shortest summary compaction writes the history budget allows" in failed[0].text
    assert f"− summary {MIN_SUMMARY_TOKENS})" in failed[0].text


def test_full_turn_opens_no_network_connection(fresh_store, folder, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    thread = fresh_store.create_thread("t")
    agent, _ = make_agent(fresh_store, [call("search_files", pattern="launch", path="."), "ok"],
                          folder)
    events = list(agent.send(thread, "search"))
    assert [e for e in events if isinstance(e, ToolFinished)][0].ok


def test_native_tool_templates_get_the_definitions(fresh_store, folder):
    class NativeRuntime(ScriptedRuntime):
        capabilities = Capabilities(native_tools=True)

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.tools_seen = []

        def tool_tokens(self, tools):
            return 123

        def stream(self, request):
            self.tools_seen.append(request.tools)
            return super().stream(request)

    runtime = NativeRuntime([call("read_file", path="notes.txt"), "done"])
    agent = build_agent(planner_for(runtime, ContextParams(window=8192, system_prompt="S"), folder),
                        fresh_store, compact=False)
    events = list(agent.send(fresh_store.create_thread("t"), "go"))
    request = [e for e in events if isinstance(e, RequestSent)][0].request
    assert request.breakdown.tools == 123 and request.tool_definitions
    assert runtime.requests[0][0]["content"] == "S"  # not described in the system prompt
    assert runtime.tools_seen[0][0]["function"]["name"] == "read_file"


def test_the_models_own_tool_calls_stay_in_history(fresh_store, folder):
    from iris_desktop.core.store import row_to_message

    thread = fresh_store.create_thread("t")
    agent, runtime = make_agent(
        fresh_store, [call("read_file", path="notes.txt"), "The code is 1234."], folder)
    list(agent.send(thread, "What is the launch code?"))
    stored = [row_to_message(r) for r in fresh_store.messages(thread)]
    assert stored[1]["tool_calls"][0]["function"]["name"] == "read_file"
    second = runtime.requests[1]
    assert second[-2]["role"] == "assistant" and second[-2]["tool_calls"]


def test_the_summary_after_a_reply_gives_way_to_the_next_message(fresh_store):
    """A model-written summary after a reply is background work: when the user waits for
    the model (a send or a draft to prefill), it stops and the extractive summary is
    used, so the next message does not wait for it. Without anyone waiting it runs on."""
    from iris_desktop.core.events import CompactionFinished

    from support.helpers import llm_json

    for waiting in (True, False):
        thread = fresh_store.create_thread("chat")
        for n in range(4):
            fresh_store.add_messages(thread, [
                {"role": "user", "content": f"On {n + 1} May I met Maria in Lisbon and bought {n + 3} "
                                            "books. " + "We walked along the river for hours. " * 20},
                {"role": "assistant", "content": f"{n + 3} books from Lisbon, lovely. "
                                                 + "Walking by the river sounds wonderful. " * 20}])
        give_way = threading.Event()

        def summary(_messages, waiting=waiting, give_way=give_way):
            if waiting:  # the user sends the next message while the summary is written
                threading.Timer(0.2, give_way.set).start()
            return llm_json(words=400 if waiting else 40)

        runtime = ScriptedRuntime(["Noted, Maria and the books.", summary], delay_s=0.02)
        planner = planner_for(runtime, ContextParams(window=8192, system_prompt="You are Iris.",
                                                     compaction_min_turns=6))
        agent = build_agent(planner, fresh_store, give_way=give_way)
        events = list(agent.send(thread, "And on 5 May I flew home."))
        finished = [e for e in events if isinstance(e, CompactionFinished)]
        assert len(finished) == 1 and finished[0].event.outcome == "ok"
        assert len(runtime.finished) == 2  # the reply, then the summary's one call
        if waiting:
            assert finished[0].event.path == "extractive"
            assert "gave way to your next message" in finished[0].event.error
            assert runtime.finished[-1].finish_reason == "cancelled"
            assert runtime.finished[-1].completion_tokens < 400
        else:
            assert finished[0].event.path == "llm" and not finished[0].event.error
        assert isinstance(events[-1], TurnDone) and events[-1].finish_reason == "stop"
        assert events[-1].next_request is not None  # planned on the new summary


def test_continue_runs_no_call_written_before_only_what_the_model_writes_now(fresh_store, folder):
    """Before (an audit): Continue on a stopped reply, imported, whose text held a finished
    ``<tool_call>`` ran that call (``read_file`` of a private file, no question asked:
    text the user imported, not text the model wrote, made it), and stored the old text
    with its markup removed."""
    (folder / "private.txt").write_text("secret=hunter2\n")
    thread = fresh_store.create_thread("imported")
    old = ('Let me look.\n<tool_call>{"name": "read_file", "arguments": {"path": "private.txt"}}'
           '</tool_call> Then')
    fresh_store.add_messages(thread, [{"role": "user", "content": "hi"}])
    fresh_store.add_message(thread, {"role": "assistant", "content": old}, status="interrupted")
    agent, runtime = make_agent(fresh_store, [" I answer."], folder)
    events = list(agent.continue_reply(thread))
    assert not [e for e in events if isinstance(e, ToolFinished)]
    assert "hunter2" not in json.dumps([dict(r) for r in fresh_store.all_messages(thread)])
    assert fresh_store.messages(thread)[-1]["content"] == old + " I answer."
    # a call the model writes as it goes on is a call, as in any reply
    fresh_store.add_message(thread, {"role": "user", "content": "and the notes?"})
    fresh_store.add_message(thread, {"role": "assistant", "content": "Sure,"}, status="interrupted")
    runtime.replies.extend([" reading.\n" + call("read_file", path="notes.txt"), "1234."])
    events = list(agent.continue_reply(thread))
    finished = [e for e in events if isinstance(e, ToolFinished)]
    assert len(finished) == 1 and "1234" in finished[0].text
    reply = next(r for r in fresh_store.messages(thread) if r["tool_calls"])
    assert reply["content"] == "Sure, reading."


def test_a_large_result_the_model_waits_on_leaves_room_to_summarize_the_turns_before(
        fresh_store, tmp_path):
    """Before (an audit): compaction sized its split with the result the model was waiting
    on at full size (104,060 tokens), which the request sends clipped; every tool step's
    compaction failed ("no room for a summary"), the third opened the circuit breaker, and
    the chat's first turns were dropped with no summary: "my badge number is 5521" was
    gone from the next question's request."""
    import random

    from iris_desktop.core.config import CompactionSettings
    from iris_desktop.core.events import CompactionFinished

    folder = tmp_path / "allowed"
    folder.mkdir()
    rng = random.Random(5)
    words = "river stone lantern copper orchard violet harbor meadow signal pepper quartz".split()
    (folder / "big.txt").write_text("\n".join(" ".join(rng.choice(words) for _ in range(14))
                                              for _ in range(3000)))
    store = fresh_store
    thread = store.create_thread("t")
    store.add_messages(thread, [{"role": "user", "content": "I'm Odile; my badge number is 5521."},
                                {"role": "assistant", "content": "Noted: badge 5521."}])
    for i in range(30):
        store.add_messages(thread, [
            {"role": "user", "content": f"Topic {i}: " + " ".join(rng.choice(words) for _ in range(120))},
            {"role": "assistant", "content": "Reply: " + " ".join(rng.choice(words) for _ in range(120))}])
    runtime = ScriptedRuntime([call("read_file", path="big.txt")] * 4 + ["A word list.", "5521."])
    planner = Planner(ContextParams(window=8192, system_prompt="You are Iris."), runtime.counter(),
                      runtime=runtime, agent=AgentConfig(),
                      compaction=CompactionSettings(summarizer="extractive"),
                      tools=ToolsConfig(allowed_paths=(str(folder),)))
    agent = build_agent(planner, store)
    events = list(agent.send(thread, "Read big.txt four times and tell me what it is."))
    outcomes = [e.event for e in events if isinstance(e, CompactionFinished)]
    assert outcomes and not [e for e in outcomes if "no room for a summary" in (e.error or "")]
    assert not [e for e in outcomes if e.outcome == "skipped" and "breaker" in (e.error or "")]
    list(agent.send(thread, "What is my badge number?"))
    assert any("5521" in (m.get("content") or "") for m in runtime.requests[-1])
    assert planner.plan(store, thread).dropped_turns == 0


def test_an_edit_keeps_the_files_the_message_had(fresh_store):
    """Before (an audit): Edit… on a message with an attached file started a branch
    holding the new text only: the model no longer read the file, and nothing said so."""
    from iris_desktop.core.attachments import Attachment, shown
    from iris_desktop.core.events import UserSaved
    from iris_desktop.core.store import row_to_message

    thread = fresh_store.create_thread("t")
    agent, runtime = make_agent(fresh_store, ["Eggs.", "Eggs and milk."])
    list(agent.send(thread, "What is on my list?",
                    attachments=[Attachment("notes.txt", "- eggs\n- milk\n")]))
    asked = fresh_store.newest_user_message(thread)
    events = list(agent.edit(thread, asked, "What is on my shopping list?"))
    saved = next(e for e in events if isinstance(e, UserSaved))
    assert saved.text == "What is on my shopping list?" and saved.attachments[0][0] == "notes.txt"
    row = fresh_store.messages_by_id([saved.message_id])[saved.message_id]
    typed, chips = shown(row_to_message(row))
    assert typed == "What is on my shopping list?" and [c[0] for c in chips] == ["notes.txt"]
    sent = runtime.requests[-1][-1]["content"]
    assert sent.startswith("What is on my shopping list?\n\n<file") and "- milk" in sent


def test_every_call_gets_a_result_when_the_turn_is_interrupted_at_a_tool(fresh_store, folder,
                                                                        monkeypatch):
    """Before (an audit): a second Ctrl+C at the CLI's shell question raised out of the
    tool (KeyboardInterrupt is no Exception), and the call stayed without a result: the
    next request sent it unanswered, which strict servers refuse."""
    from iris_desktop.core.tools import Sandbox

    thread = fresh_store.create_thread("t")
    agent, runtime = make_agent(
        fresh_store, ['<tool_call>{"name": "list_directory", "arguments": {"path": "."}}</tool_call>'
                      '<tool_call>{"name": "list_directory", "arguments": {"path": "."}}</tool_call>',
                      "Fine."], folder)

    def interrupted(self, *_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Sandbox, "run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        list(agent.send(thread, "look around"))
    rows = fresh_store.messages(thread)
    calls = [c["id"] for c in json.loads(rows[1]["tool_calls"])]
    results = {r["tool_call_id"]: r["content"] for r in rows if r["role"] == "tool"}
    assert len(calls) == 2 and set(results) == set(calls)
    assert set(results.values()) == {"error: the turn was broken off at this call; no result was kept"}
