"""The context engine on hand-made, random (hypothesis) and real conversations."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from iris_desktop.core.config import ContextParams
from iris_desktop.core.engine import (
    PRUNED_PLACEHOLDER,
    ContextEngine,
    ConversationTooLargeException,
    TokenBudgetCalculator,
)
from iris_desktop.core.store import Store
from iris_desktop.tokens import HeuristicCounter, TiktokenCounter

from conftest import AGENT_FILES, CHAT_FILES, load_corpus
from support.invariants import check_request, snapshot


def call(cid: str, name: str = "bash") -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": "{}"}}


def agent_turn(n: int, steps: int, size: int) -> list[dict]:
    msgs = [{"role": "user", "content": f"task {n} " + "u" * size}]
    for s in range(steps):
        cid = f"c{n}_{s}"
        msgs.append({"role": "assistant", "content": f"step {s}", "tool_calls": [call(cid)]})
        msgs.append({"role": "tool", "tool_call_id": cid, "name": "bash", "content": "o" * size * 4})
    msgs.append({"role": "assistant", "content": f"done {n}"})
    return msgs


def engine_for(store, window, ratio=0.7, protect=2, min_turns=20, counter=None, prompt="sys"):
    params = ContextParams(window=window, token_budget_ratio=ratio, prune_protect_turns=protect,
                           compaction_min_turns=min_turns, system_prompt=prompt)
    return ContextEngine(store, counter or HeuristicCounter(), params)


def test_budget_formula():
    calc = TokenBudgetCalculator(8192, 0.7, 0.75)
    assert calc.budget == 5734
    assert calc.available(system=300, tools=200) == 5234
    b = calc.breakdown(300, 200, 100, 1000, 10)
    assert b.free == 8192 - 1610 and b.threshold == 6144


def test_prunes_outside_protected_turns_only(fresh_store):
    thread = fresh_store.create_thread("t")
    for n in range(4):
        fresh_store.add_messages(thread, agent_turn(n, 2, 20))
    engine = engine_for(fresh_store, 32768, protect=2)
    request = engine.build(thread)
    check_request(engine, request)
    turns = {r["id"]: r["turn"] for r in fresh_store.messages(thread)}
    assert {turns[i] for i in request.pruned_ids} == {1, 2}
    assert sum(m["content"] == PRUNED_PLACEHOLDER for m in request.messages) == 4
    assert request.trigger == "none" and not request.fallback


def test_loads_newest_first_and_marks_dropped(fresh_store):
    thread = fresh_store.create_thread("t")
    for n in range(30):
        fresh_store.add_messages(thread, [{"role": "user", "content": f"q{n} " + "x" * 400},
                                          {"role": "assistant", "content": "a" * 400}])
    before = snapshot(fresh_store, thread)
    engine = engine_for(fresh_store, 4096, min_turns=0)
    request = engine.build(thread)
    described = check_request(engine, request)
    assert request.compaction_due and request.trigger == "budget"
    assert request.dropped_turns > 0
    states = [m["state"] for m in described]
    assert states[: 2 * request.dropped_turns] == ["dropped"] * (2 * request.dropped_turns)
    assert set(states[2 * request.dropped_turns:]) == {"verbatim"}
    assert request.messages[-1]["content"] == "a" * 400
    assert snapshot(fresh_store, thread) == before


def test_turns_trigger(fresh_store):
    thread = fresh_store.create_thread("t")
    for _ in range(5):
        fresh_store.add_messages(thread, [{"role": "user", "content": "q"},
                                          {"role": "assistant", "content": "a"}])
    assert engine_for(fresh_store, 8192, min_turns=5).build(thread).triggers == ["turns"]
    assert engine_for(fresh_store, 8192, min_turns=6).build(thread).trigger == "none"
    assert engine_for(fresh_store, 8192, min_turns=0).build(thread).trigger == "none"


def test_tokens_trigger_uses_last_reported_prompt_tokens(fresh_store):
    thread = fresh_store.create_thread("t")
    fresh_store.add_messages(thread, [{"role": "user", "content": "q"}])
    fresh_store.add_request(thread, {"prompt_tokens": 6144, "summary_id": None})
    assert engine_for(fresh_store, 8192).build(thread).trigger == "tokens"
    fresh_store.add_request(thread, {"prompt_tokens": 6143, "summary_id": None})
    assert engine_for(fresh_store, 8192).build(thread).trigger == "none"


def test_fallback_reduces_protection_step_by_step(fresh_store):
    thread = fresh_store.create_thread("t")
    fresh_store.add_messages(thread, agent_turn(0, 3, 300))
    fresh_store.add_messages(thread, [{"role": "user", "content": "next"}])
    engine = engine_for(fresh_store, 2048, ratio=0.5, protect=3)
    request = engine.build(thread)
    check_request(engine, request)
    assert request.fallback and request.protect_turns == 1
    assert len(request.pruned_ids) == 3


def test_newest_turn_pruned_when_nothing_else_fits_but_keeps_in_flight_result(fresh_store):
    thread = fresh_store.create_thread("t")
    msgs = agent_turn(0, 3, 150)[:-1]  # ends on a tool result the model must see
    fresh_store.add_messages(thread, msgs)
    engine = engine_for(fresh_store, 600, ratio=0.9, protect=2)
    request = engine.build(thread)
    check_request(engine, request)
    assert request.protect_turns == 0 and request.fallback
    assert request.messages[-1]["content"] == "o" * 600  # the result it just asked for
    assert len(request.pruned_ids) == 2


def test_a_system_prompt_that_takes_the_whole_budget_is_named_not_the_message(fresh_store):
    """Before (an audit): "the newest turn alone is at least 1 tokens (5 bytes of text);
    the window allows 0" for a "hello" beside a system prompt larger than the budget."""
    thread = fresh_store.create_thread("t")
    fresh_store.add_messages(thread, [{"role": "user", "content": "hello"}])
    with pytest.raises(ConversationTooLargeException) as err:
        engine_for(fresh_store, 512, prompt="word " * 1000).build(thread)
    text = str(err.value)
    assert text.startswith("the system prompt (") and "alone takes the whole 358-token budget" in text
    assert "chat.system_prompt" in text and "newest turn" not in text
    assert err.value.allowed == 358 and err.value.needed > 358


def test_too_large_raises_with_numbers_and_writes_nothing(fresh_store):
    thread = fresh_store.create_thread("t")
    fresh_store.add_messages(thread, [{"role": "user", "content": "x" * 40000}])
    before = snapshot(fresh_store, thread)
    with pytest.raises(ConversationTooLargeException) as err:
        engine_for(fresh_store, 2048).build(thread)
    assert "the newest turn alone is 10,004 tokens" in str(err.value)
    assert "the history budget allows 1,4" in str(err.value)
    assert err.value.needed > err.value.allowed
    assert snapshot(fresh_store, thread) == before


def test_draft_is_the_newest_turn(fresh_store):
    thread = fresh_store.create_thread("t")
    fresh_store.add_messages(thread, agent_turn(0, 2, 10))
    engine = engine_for(fresh_store, 8192, protect=1)
    request = engine.build(thread, draft="hello there")
    check_request(engine, request)
    assert request.messages[-1] == {"role": "user", "content": "hello there"}
    assert request.breakdown.draft == HeuristicCounter().count_message(request.messages[-1])
    assert len(request.pruned_ids) == 2  # the stored turn is no longer protected


def test_thread_system_message_is_pinned(fresh_store):
    thread = fresh_store.create_thread("t")
    fresh_store.add_messages(thread, [{"role": "system", "content": "be terse"},
                                      {"role": "user", "content": "hi"}])
    engine = engine_for(fresh_store, 8192, prompt="default prompt")
    request = engine.build(thread)
    assert request.messages[0]["content"] == "be terse"
    assert [m["state"] for m in check_request(engine, request)] == ["verbatim", "verbatim"]


def test_build_reads_only_what_fits(tmp_path):
    """Cost follows the window: a long thread is not read past the budget."""
    store = Store(tmp_path / "long.db")
    thread = store.create_thread("t")
    rows = [{"role": "user" if i % 2 == 0 else "assistant", "content": "m" * 200}
            for i in range(4000)]
    store.add_messages(thread, rows)
    engine = engine_for(store, 4096, min_turns=0)
    engine.build(thread)  # fills the count cache for what it read
    cached = store.conn.execute("SELECT count(*) FROM token_counts").fetchone()[0]
    assert cached < 300
    store.close()


# -- property-based -------------------------------------------------------------------------

message_sizes = st.integers(min_value=0, max_value=3000)


@st.composite
def conversations(draw):
    turns = []
    for n in range(draw(st.integers(min_value=1, max_value=12))):
        msgs = [{"role": "user", "content": "u" * draw(message_sizes)}]
        for s in range(draw(st.integers(min_value=0, max_value=4))):
            cids = [f"c{n}_{s}_{k}" for k in range(draw(st.integers(min_value=1, max_value=2)))]
            msgs.append({"role": "assistant", "content": None,
                         "tool_calls": [call(c) for c in cids]})
            for c in cids:
                msgs.append({"role": "tool", "tool_call_id": c, "name": "bash",
                             "content": "o" * draw(message_sizes)})
        if draw(st.booleans()):
            msgs.append({"role": "assistant", "content": "a" * draw(message_sizes)})
        turns.append(msgs)
    if draw(st.booleans()):
        turns[0].insert(0, {"role": "system", "content": "s" * draw(st.integers(0, 800))})
    return turns


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    conversation=conversations(),
    window=st.integers(min_value=512, max_value=16384),
    ratio=st.floats(min_value=0.1, max_value=0.95),
    protect=st.integers(min_value=0, max_value=5),
    draft=st.one_of(st.none(), st.text(max_size=200)),
)
def test_invariants_hold_for_random_conversations(tmp_path_factory, conversation, window, ratio,
                                                  protect, draft):
    store = Store(tmp_path_factory.mktemp("prop") / "p.db")
    try:
        thread = store.create_thread("t")
        for turn in conversation:
            store.add_messages(thread, turn)
        before = snapshot(store, thread)
        engine = engine_for(store, window, ratio=ratio, protect=protect)
        try:
            request = engine.build(thread, draft=draft)
        except ConversationTooLargeException as exc:
            assert exc.needed > exc.allowed
            # the newest turn is what does not fit, or the system prompt (tools, summary)
            # leaves it nothing: the sentence names which
            assert ("the newest turn alone is" in str(exc)
                    or "leaving nothing for the conversation" in str(exc))
        else:
            check_request(engine, request)
        assert snapshot(store, thread) == before
    finally:
        store.close()


# -- the real corpus ------------------------------------------------------------------------

CORPUS_FILES = AGENT_FILES + CHAT_FILES
SETTINGS_GRID = [(0.7, 2), (0.1, 0), (0.95, 5), (0.5, 1)]
WINDOWS = [2048, 4096, 8192, 16384, 32768]


@pytest.fixture(scope="module")
def corpus_store(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("corpus") / "corpus.db")
    ids = {}
    for path in CORPUS_FILES:
        thread = store.create_thread(path.stem)
        store.add_messages(thread, load_corpus(path))
        ids[path.stem] = thread
    # several transcripts in one thread: each task starts a new user turn
    multi = store.create_thread("multi")
    for path in AGENT_FILES[:5]:
        store.add_messages(multi, [m for m in load_corpus(path) if m["role"] != "system"])
    ids["multi"] = multi
    yield store, ids
    store.close()


@pytest.mark.parametrize("name", [p.stem for p in CORPUS_FILES] + ["multi"])
def test_invariants_on_every_corpus_file(corpus_store, name):
    store, ids = corpus_store
    thread = ids[name]
    before = snapshot(store, thread)
    for window in WINDOWS:
        for ratio, protect in SETTINGS_GRID:
            engine = engine_for(store, window, ratio=ratio, protect=protect)
            try:
                request = engine.build(thread)
            except ConversationTooLargeException as exc:
                assert exc.needed > exc.allowed
                continue
            check_request(engine, request)
    assert snapshot(store, thread) == before


def test_exact_tiktoken_counting_on_corpus(corpus_store):
    store, ids = corpus_store
    engine = engine_for(store, 8192, counter=TiktokenCounter())
    request = engine.build(ids["multi"])
    check_request(engine, request)


# -- a large in-flight tool result, and the task a summary cut through --------------------------


def test_a_huge_in_flight_result_is_shortened_for_the_model_not_the_store(fresh_store):
    """The model asked for it, so it is never cleared; when it alone overflows the window it
    is shortened, with a marker, in the request only, and the agent can go on."""
    thread = fresh_store.create_thread("t")
    fresh_store.add_messages(thread, [
        {"role": "user", "content": "Read the log."},
        {"role": "assistant", "content": "Reading.", "tool_calls": [call("c1", "read_file")]},
        {"role": "tool", "tool_call_id": "c1", "name": "read_file",
         "content": "".join(f"line {i}: something happened\n" for i in range(3000))},
    ])
    before = snapshot(fresh_store, thread)
    engine = engine_for(fresh_store, 2048)
    request = engine.build(thread)
    described = check_request(engine, request)
    result_id = fresh_store.messages(thread)[-1]["id"]
    assert request.clipped_ids == [result_id]
    sent = request.messages[-1]["content"]
    assert sent.startswith("line 0: something happened")
    assert "output shortened for the model" in sent and "the full output is stored" in sent
    assert {m["id"]: m["state"] for m in described}[result_id] == "clipped"
    assert snapshot(fresh_store, thread) == before  # the store keeps every line


def test_a_small_result_beside_a_huge_one_is_sent_whole_and_the_huge_one_gets_the_rest(fresh_store):
    """An audit: two results of one step (a 44 KB listing and a 39-token README) were each
    given half of the room: the README was whole in a half it did not need, the listing
    cut to the other half, and the rest of the budget (1,361 of 2,854 tokens) was unused."""
    thread = fresh_store.create_thread("t")
    fresh_store.add_messages(thread, [
        {"role": "user", "content": "Look around."},
        {"role": "assistant", "content": "Listing.", "tool_calls": [call("c1", "bash"),
                                                                  call("c2", "read_file")]},
        {"role": "tool", "tool_call_id": "c1", "name": "bash",
         "content": "".join(f"file_{i}.py\n" for i in range(8000))},
        {"role": "tool", "tool_call_id": "c2", "name": "read_file", "content": "A small README."},
    ])
    engine = engine_for(fresh_store, 2048)
    request = engine.build(thread)
    check_request(engine, request)
    listing, readme = fresh_store.messages(thread)[-2:]
    assert request.clipped_ids == [listing["id"]]
    assert request.messages[-1]["content"] == "A small README."
    budget = request.breakdown.budget - request.breakdown.system - request.breakdown.tools
    assert request.breakdown.history > budget * 0.9  # the room is used, not half of it


def test_a_tool_output_shorter_than_its_placeholder_is_sent_as_it_is(fresh_store):
    """An audit: outputs of 13 and 16 tokens were "cleared" into an 18-token placeholder,
    the request growing for it and the window saying they were cleared."""
    thread = fresh_store.create_thread("t")
    for n in range(3):
        fresh_store.add_messages(thread, [
            {"role": "user", "content": f"Step {n}"},
            {"role": "assistant", "content": "", "tool_calls": [call(f"a{n}"), call(f"b{n}")]},
            {"role": "tool", "tool_call_id": f"a{n}", "name": "bash", "content": "ok"},
            {"role": "tool", "tool_call_id": f"b{n}", "name": "bash", "content": "output " * 200},
            {"role": "assistant", "content": f"Done {n}."}])
    engine = engine_for(fresh_store, 8192, protect=0)
    request = engine.build(thread)
    described = {m["id"]: m for m in check_request(engine, request)}
    rows = fresh_store.messages(thread)
    small = [r["id"] for r in rows if r["content"] == "ok"]
    large = [r["id"] for r in rows if r["role"] == "tool" and r["content"] != "ok"]
    assert set(request.pruned_ids) == set(large)
    assert all(described[i]["state"] == "verbatim" for i in small)
    sent = {i: m["content"] for i, m in zip(request.included_ids, request.messages[1:])}
    assert all(sent[i] == "ok" for i in small)


def test_a_turn_whose_steps_overflow_names_them_and_compaction_makes_it_fit(fresh_store):
    """An audit: a turn of long steps before a 31-token result was refused as if the
    result were "too large to shorten"; the steps are what overflow, and compacting the
    chat summarizes the earlier ones (the next send does so)."""
    from support.helpers import compactor_for

    thread = fresh_store.create_thread("t")
    fresh_store.add_messages(thread, [{"role": "user", "content": "Fix the bug."}])
    for n in range(8):
        fresh_store.add_messages(thread, [
            {"role": "assistant", "content": f"Step {n}: " + "thinking it through " * 40,
             "tool_calls": [call(f"c{n}")]},
            {"role": "tool", "tool_call_id": f"c{n}", "name": "bash", "content": "ok " * 3}])
    engine = engine_for(fresh_store, 1024)
    with pytest.raises(ConversationTooLargeException) as err:
        engine.build(thread)
    text = str(err.value)
    assert "its message and the model's steps before the result it just asked for are" in text
    assert "compacting the chat (Compact now, or the next send) summarizes the earlier steps" in text
    compactor = compactor_for(fresh_store, HeuristicCounter(), engine.params)
    assert compactor.compact(thread, "manual").outcome == "ok"
    check_request(engine, engine.build(thread))


def test_too_large_says_what_was_tried(fresh_store):
    thread = fresh_store.create_thread("t")
    fresh_store.add_messages(thread, [
        {"role": "user", "content": "x " * 5000},  # the user's own message cannot be shortened
        {"role": "assistant", "content": "", "tool_calls": [call("c1")]},
        {"role": "tool", "tool_call_id": "c1", "name": "bash", "content": "y " * 5000},
    ])
    with pytest.raises(ConversationTooLargeException) as err:
        engine_for(fresh_store, 1024).build(thread)
    assert "too large to shorten into what is left" in str(err.value)
    thread = fresh_store.create_thread("plain")
    fresh_store.add_messages(thread, [{"role": "user", "content": "z " * 5000}])
    with pytest.raises(ConversationTooLargeException) as err:
        engine_for(fresh_store, 1024).build(thread)
    # a message without tool outputs: nothing to clear, so "even with every tool output
    # cleared" is not said
    assert str(err.value).startswith("the newest turn alone is ")
    assert "tokens; the history budget allows " in str(err.value) and "cleared" not in str(err.value)


def test_the_current_tasks_request_stays_verbatim_when_its_first_steps_are_summarized(fresh_store):
    from support.helpers import compactor_for

    thread = fresh_store.create_thread("t")
    fresh_store.add_messages(thread, agent_turn(1, 12, 120)[:-1])  # one long turn, in progress
    task_id = fresh_store.messages(thread)[0]["id"]
    engine = engine_for(fresh_store, 4096, min_turns=0)
    assert compactor_for(fresh_store, HeuristicCounter(), engine.params).compact(
        thread, "budget").outcome == "ok"
    summary = fresh_store.latest_summary(thread)
    assert summary.covers_through_id > task_id  # the early steps of this turn are summarized
    request = engine.build(thread)
    described = check_request(engine, request)
    assert request.kept_ids == [task_id]
    assert request.messages[1]["content"].startswith("task 1")  # right after the system prompt
    assert {m["id"]: m["state"] for m in described}[task_id] == "verbatim"


def test_a_huge_paste_is_refused_from_its_size_before_it_is_counted(fresh_store):
    """Megabytes of text need at least one token per MAX_BYTES_PER_TOKEN bytes with any
    counter, so the engine refuses them without tokenizing (stored or as a draft)."""

    class Watching(HeuristicCounter):
        longest = 0

        def count_text(self, text):
            Watching.longest = max(Watching.longest, len(text))
            return super().count_text(text)

        def count_message(self, message):
            Watching.longest = max(Watching.longest, len(str(message.get("content") or "")))
            return super().count_message(message)

    thread = fresh_store.create_thread("t")
    fresh_store.add_messages(thread, [{"role": "user", "content": "hi"},
                                      {"role": "assistant", "content": "hello"}])
    paste = "word " * 400_000  # 2 MB
    engine = engine_for(fresh_store, 4096, counter=Watching())
    with pytest.raises(ConversationTooLargeException) as err:
        engine.build(thread, draft=paste)
    assert "at least 7,813 tokens (1,999,999 bytes of text)" in str(err.value)
    fresh_store.add_message(thread, {"role": "user", "content": paste})
    with pytest.raises(ConversationTooLargeException):
        engine.build(thread)
    assert Watching.longest < 1000  # the paste itself was never counted


def test_a_build_costs_the_same_on_a_long_thread_counted_in_sqlite_steps(fresh_store):
    """The cost of a request follows the window, not the history: the SQLite virtual
    machine steps one build takes on a 40k-message thread are within 1.5x of a 2k one
    (counted, not timed; a query that read every user message of the thread took 20x)."""
    engine = engine_for(fresh_store, 8192)
    steps = {}
    for size in (2_000, 40_000):
        thread = fresh_store.create_thread(f"{size}")
        fresh_store.add_messages(thread, [
            {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " + "word " * 12}
            for i in range(size)])
        engine.build(thread)  # counts cached, as on a thread in use
        steps[size] = 0

        def step(size: int = size) -> int:
            steps[size] += 1
            return 0

        fresh_store.conn.set_progress_handler(step, 100)
        engine.build(thread)
        fresh_store.conn.set_progress_handler(None, 0)
    assert steps[40_000] <= 1.5 * steps[2_000], steps


def test_a_reply_written_after_its_request_is_not_shown_as_left_out(fresh_store):
    """The request a turn sent does not include the reply being written to it: the views
    draw its states from that request, and the reply must not read "not sent"."""
    engine = engine_for(fresh_store, 4096)
    thread = fresh_store.create_thread("t")
    fresh_store.add_message(thread, {"role": "user", "content": "Hello"})
    request = engine.build(thread)
    reply = fresh_store.add_message(thread, {"role": "assistant", "content": ""}, status="streaming")
    states = {m["id"]: m["state"] for m in engine.describe(request)}
    assert states[reply] == "verbatim"
    fresh_store.update_streaming(reply, "Hi!", status="complete")
    assert {m["id"]: m["state"] for m in engine.describe(request)}[reply] == "verbatim"
