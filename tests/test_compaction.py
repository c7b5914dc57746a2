"""Compaction: triggers, split, chain, fallback, verify-then-commit, breaker, in-loop."""

from __future__ import annotations

import json
import threading

import pytest

from iris_desktop.core.compaction import _transcript_lines
from iris_desktop.core.config import CompactionSettings, ContextParams
from iris_desktop.core.engine import ContextEngine
from iris_desktop.core.events import CompactionFinished, CompactionStarted
from iris_desktop.core.records import said_from_row
from iris_desktop.core.store import Store, row_to_message
from iris_desktop.core.summary import FIELDS, ConversationSummary, SummaryInvalid, close_cut_json
from iris_desktop.core.turns import StopOrGiveWay
from iris_desktop.generation import GenerationRequest
from iris_desktop.stop import StopEvent, stop_reason
from iris_desktop.tokens import HeuristicCounter, TiktokenCounter

from conftest import AGENT_FILES, CHAT_FILES, load_corpus
from support.fakes import ScriptedRuntime
from support.helpers import compact_while_due, compactor_for, llm_json
from support.invariants import check_request, snapshot


def params(window=4096, **kw):
    return ContextParams(window=window, system_prompt="You are Iris.", **kw)


def chat_thread(store, n_turns=40, size=300):
    thread = store.create_thread("chat")
    for n in range(n_turns):
        store.add_messages(thread, [
            {"role": "user", "content": f"[1:00 pm on {1 + n % 28} May, 2023] Yesterday I visited "
                                        f"Lisbon with Maria and bought {n + 3} books. " + "u" * size},
            {"role": "assistant", "content": f"That sounds lovely, {n} books is a lot! " + "a" * size},
        ])
    return thread


def test_budget_trigger_compacts_and_nothing_is_dropped(fresh_store):
    thread = chat_thread(fresh_store)
    engine = ContextEngine(fresh_store, HeuristicCounter(), params())
    assert engine.build(thread).trigger == "budget"
    before = snapshot(fresh_store, thread)
    compactor = compactor_for(fresh_store, HeuristicCounter(), params())
    event = compactor.compact(thread, "budget")
    assert event.outcome == "ok" and event.path == "extractive"
    assert event.tokens_after < event.tokens_before
    request = engine.build(thread)
    described = check_request(engine, request)
    assert {m["state"] for m in described} == {"summarized", "verbatim"}
    assert request.predicted_prompt_tokens < 4096 * 0.75
    assert request.trigger == "none"
    assert snapshot(fresh_store, thread) == before  # stored messages untouched
    assert request.messages[0]["content"].count("Summary of the earlier conversation") == 1
    row = fresh_store.compaction_events(thread)[0]
    for key in ("trigger", "turns_archived", "tokens_before", "tokens_after", "kept_turns",
                "summary_tokens", "path", "duration_s", "outcome"):
        assert row[key] is not None


def test_summaries_chain(fresh_store):
    thread = chat_thread(fresh_store, 30)
    compactor = compactor_for(fresh_store, HeuristicCounter(), params())
    first = compactor.compact(thread, "budget")
    chat_more = [{"role": "user", "content": "more " * 300}, {"role": "assistant", "content": "ok " * 300}]
    for _ in range(8):
        fresh_store.add_messages(thread, chat_more)
    second = compactor.compact(thread, "budget")
    assert first.outcome == second.outcome == "ok"
    chain = fresh_store.summaries(thread)
    assert chain[1].prev_id == chain[0].id
    assert chain[1].first_turn == chain[0].first_turn == 1
    assert chain[1].covers_through_id > chain[0].covers_through_id
    # the second run says the turns it summarized, not the chain's (before, an audit:
    # "Turns 1–177 (8 messages) are summarized now" of turns 174–177)
    assert first.first_turn == 1 and second.first_turn == first.last_turn + 1
    assert second.plain().startswith(f"Turns {first.last_turn + 1}–{second.last_turn} "
                                     f"({second.messages_archived:,} messages)")
    assert f"turns {first.last_turn + 1}–{second.last_turn}, " in second.describe()


def test_short_turns_do_not_loop_on_the_turns_trigger(fresh_store):
    thread = fresh_store.create_thread("t")
    for n in range(25):
        fresh_store.add_messages(thread, [{"role": "user", "content": f"hi {n}"},
                                          {"role": "assistant", "content": f"hello {n}"}])
    p = params(compaction_min_turns=20)
    engine = ContextEngine(fresh_store, HeuristicCounter(), p)
    assert engine.build(thread).trigger == "turns"
    compactor = compactor_for(fresh_store, HeuristicCounter(), p)
    assert compactor.compact(thread, "turns").outcome == "ok"
    request = engine.build(thread)
    assert request.trigger == "none" and request.unsummarized_turns < 20
    assert list(compactor.before_request(thread)) == []  # nothing due: no second compaction


def test_llm_path_and_the_compaction_call_never_overflows(fresh_store):
    thread = chat_thread(fresh_store, 60, 400)
    runtime = ScriptedRuntime([llm_json()] * 100, n_ctx=2048)
    compactor = compactor_for(fresh_store, HeuristicCounter(), params(),
                              CompactionSettings(summary_max_tokens=256, max_parts=0),
                              runtime=runtime)
    event = compactor.compact(thread, "budget")
    assert event.outcome == "ok" and event.path == "chunked"
    assert len(runtime.requests) > 1
    counter = HeuristicCounter()
    for request in runtime.requests:
        prompt = counter.prompt_overhead() + sum(counter.count_message(m) for m in request)
        assert prompt + 256 <= 2048  # the reply (llm cap 256 here) always has room
    # chained folding: every chunk after the first sees the previous summary
    assert all("fact0" in r[1]["content"] for r in runtime.requests[1:])
    fields = fresh_store.latest_summary(thread).fields
    assert fields["summary"].startswith("fact0") and fields["facts"]


def test_the_model_reads_at_most_max_parts_and_the_oldest_turns_are_extracted(fresh_store):
    """Before: a long imported chat's first summary made the model read every old turn,
    part after part (at ~130 tokens/s, 500,000 tokens are an hour before the answer). Now
    the model reads the newest ``max_parts`` windows, folded onto the extractive summary
    of the older turns, whose facts stay in the ledger; each part's progress says which
    part of how many, and how long the finished ones took."""
    from iris_desktop.core.events import PromptProgress

    thread = chat_thread(fresh_store, 60, 400)
    unlimited = ScriptedRuntime([llm_json()] * 100, n_ctx=2048)
    compactor_for(fresh_store, HeuristicCounter(), params(),
                  CompactionSettings(summary_max_tokens=256, max_parts=0),
                  runtime=unlimited).compact(thread, "budget", force=True)
    assert len(unlimited.requests) > 3  # what the limit is for

    thread = chat_thread(fresh_store, 60, 400)
    runtime = ScriptedRuntime([llm_json()] * 100, n_ctx=2048)
    seen: list[PromptProgress] = []
    compactor = compactor_for(fresh_store, HeuristicCounter(), params(),
                              CompactionSettings(summary_max_tokens=256, max_parts=2),
                              runtime=runtime, progress=seen.append)
    event = compactor.compact(thread, "budget")
    assert event.outcome == "ok" and event.path == "chunked" and len(runtime.requests) == 2
    assert event.error.startswith("turns 1–") and "summarized by extraction" in event.error
    oldest = int(event.error.split("–")[1].split(" ")[0])
    assert 1 < oldest < event.last_turn
    # the first part is folded onto the extract of the older turns
    assert "In turns 1–" in runtime.requests[0][1]["content"]
    first_line = next(line for line in runtime.requests[0][1]["content"].splitlines()
                      if line.startswith("User: "))
    assert f"bought {oldest + 3} books" in first_line  # the turn after the extracted ones
    ledger = " ".join(fresh_store.latest_summary(thread).fields["facts"])
    assert "Lisbon" in ledger and "bought 3 books" in ledger  # turn 1, never read by the model
    assert {(p.part, p.parts) for p in seen} == {(1, 2), (2, 2)}
    assert all(p.part_s is None for p in seen if p.part == 1)
    assert all(p.part_s is not None for p in seen if p.part == 2)
    assert "Iris summarized the oldest (turns 1–" in event.plain()


def test_a_summarys_progress_in_parts_reads_as_the_whole_job():
    from iris_desktop.core.events import PromptProgress

    first = PromptProgress(1, 1_000, 4_000, 0, 10.0, "summary", part=1, parts=3)
    assert first.fraction == pytest.approx(0.25 / 3)
    assert first.describe() == ("Summarizing earlier turns, part 1 of 3… 8% of all, about "
                                "30 s left to read this part")
    later = PromptProgress(1, 2_000, 4_000, 0, 20.0, "summary", part=2, parts=3, part_s=100.0)
    assert later.fraction == pytest.approx(0.5)
    assert later.describe() == "Summarizing earlier turns, part 2 of 3… 50% of all, about 2 min left"
    writing = PromptProgress(1, 4_000, 4_000, 0, 40.0, "summary", part=3, parts=3, part_s=90.0)
    assert writing.describe() == ("Summarizing earlier turns, part 3 of 3: the model writes "
                                  "this part's summary…")
    one = PromptProgress(1, 1_536, 4_096, 0, 12.0, "summary")
    assert one.describe() == ("Summarizing earlier turns… 1,536 of 4,096 tokens (37%), about "
                              "20 s left")


@pytest.mark.parametrize(("fallback", "why"), [
    ("stopped", "you pressed Stop"),
    ("timed_out", "the model took too long"),
    ("gave_way", "you sent a message meanwhile"),
    ("unusable", "the model's summary was not usable"),
    ("failed", "the model could not write one"),
])
def test_a_compaction_is_told_in_plain_words(fallback, why):
    from iris_desktop.core.events import CompactionEvent

    done = CompactionEvent("budget", "ok", "extractive", 53, 106, 24_259, 3_069, 8, 222, 1.1,
                           "a note for the log, in any words", first_turn=1, last_turn=53,
                           fallback=fallback)
    assert done.plain() == (
        f"Iris summarized turns 1–53 (106 messages) itself, quickly and without the model, "
        f"because {why}. They stay in the chat, dimmed, and recall can bring them back when a "
        "question needs them.")
    model = CompactionEvent("budget", "ok", "chunked", 53, 106, 24_259, 3_069, 8, 222, 95.0,
                            first_turn=1, last_turn=53)
    assert model.plain().startswith("Turns 1–53 (106 messages) are summarized now, in 95 s.")
    failed = CompactionEvent("budget", "failed", error="no room for a summary")
    assert failed.plain() == ("The earlier turns could not be summarized: no room for a "
                              "summary. Nothing is lost.")
    for event in (done, model, failed):
        assert "(budget" not in event.plain() and "→" not in event.plain()


def test_a_summary_cut_at_its_token_cap_is_closed_and_used(fresh_store):
    thread = chat_thread(fresh_store)
    runtime = ScriptedRuntime([llm_json(words=2000)], n_ctx=8192, cut_at_cap=True)
    compactor = compactor_for(fresh_store, HeuristicCounter(), params(), runtime=runtime)
    event = compactor.compact(thread, "budget")
    assert runtime.finished[-1].finish_reason == "length"
    assert event.outcome == "ok" and event.path == "llm" and event.error is None
    fields = fresh_store.latest_summary(thread).fields
    # the narrative kept as far as it got; the fields it never reached are empty
    assert fields["summary"].startswith("fact0 fact1") and "fact1999" not in fields["summary"]
    assert fields["emotional_thread"] == "" and fields["evolving_themes"] == []


def test_each_summary_call_gets_the_whole_timeout_and_renews_the_lease(fresh_store):
    thread = chat_thread(fresh_store, 60, 400)
    leases: list[float] = []

    def reply(_messages):
        row = fresh_store.conn.execute(
            "SELECT expires_at FROM compaction_leases WHERE thread_id = ?", (thread,)).fetchone()
        leases.append(row[0])
        return llm_json()

    runtime = ScriptedRuntime([reply] * 100, n_ctx=2048)
    compactor = compactor_for(fresh_store, HeuristicCounter(), params(),
                              CompactionSettings(summary_max_tokens=256, timeout_s=60,
                                                 max_parts=0), runtime=runtime)
    event = compactor.compact(thread, "budget")
    assert event.path == "chunked" and len(runtime.deadlines) > 2
    # a long first compaction is slow for its size: each part has the whole timeout
    assert all(55 < d <= 60 for d in runtime.deadlines)
    assert leases == sorted(leases) and leases[-1] > leases[0]


@pytest.mark.parametrize("reply", [
    "not json at all",
    json.dumps({"summary": "too short"}),
    llm_json(words=0),
    llm_json(summary="same " * 100),
    RuntimeError("model crashed"),
])
def test_unusable_llm_output_falls_back_to_extractive(fresh_store, reply):
    thread = chat_thread(fresh_store)
    compactor = compactor_for(fresh_store, HeuristicCounter(), params(),
                              runtime=ScriptedRuntime([reply] * 5, n_ctx=8192))
    event = compactor.compact(thread, "budget")
    assert event.outcome == "ok" and event.path == "extractive"
    assert "one made of the chat's own sentences was used instead" in event.error


def test_timeout_falls_back_to_extractive(fresh_store):
    thread = chat_thread(fresh_store)
    slow = ScriptedRuntime([llm_json(words=400)], n_ctx=8192, delay_s=0.05)  # 20 s of words
    compactor = compactor_for(fresh_store, HeuristicCounter(), params(),
                              CompactionSettings(timeout_s=0.3), runtime=slow)
    event = compactor.compact(thread, "budget")
    assert event.path == "extractive" and "timed out" in event.error
    assert event.fallback == "timed_out" and "because the model took too long" in event.plain()
    assert slow.finished[-1].completion_tokens < 400  # stopped by the deadline, not finished


@pytest.mark.parametrize(("which", "fallback", "words"), [
    ("cancel", "stopped", "because you pressed Stop"),
    ("give_way", "gave_way", "because you sent a message meanwhile")])
def test_stop_during_an_llm_summary_falls_back_to_extractive(fresh_store, which, fallback, words):
    """The user's Stop and a summary giving way to the next message end the same way, and
    the event says which (the window's sentence comes from it, not from the log note)."""
    thread = chat_thread(fresh_store)
    cancel = StopOrGiveWay(StopEvent(), threading.Event())
    slow = ScriptedRuntime([llm_json(words=400)], n_ctx=8192, delay_s=0.05)
    threading.Timer(0.2, getattr(cancel, which).set).start()
    event = compactor_for(fresh_store, HeuristicCounter(), params(), runtime=slow).compact(
        thread, "budget", cancel=cancel)
    assert event.outcome == "ok" and event.path == "extractive"
    assert event.fallback == fallback and words in event.plain()
    assert stop_reason(cancel) in event.error


def stopped_while_extracting(store, reason):
    """A compaction whose model reads the newest two parts, the oldest turns extracted
    first; the user presses Stop (or closes Iris: ``reason``) during that extraction.
    Returns (the event, the runtime, the number of messages each extraction read)."""
    thread = chat_thread(store, 60, 400)
    runtime = ScriptedRuntime([llm_json()] * 10, n_ctx=2048)
    cancel = StopEvent()
    compactor = compactor_for(store, HeuristicCounter(), params(),
                              CompactionSettings(summary_max_tokens=256, max_parts=2),
                              runtime=runtime)
    summarize, read = compactor.extractive.summarize, []

    def extracting(previous, said, *args, **kwargs):
        read.append(len(said))
        if len(read) == 1:
            cancel.reason = reason
            cancel.set()
        return summarize(previous, said, *args, **kwargs)

    compactor.extractive.summarize = extracting
    return compactor.compact(thread, "budget", cancel=cancel), runtime, read


def test_stop_while_the_oldest_turns_are_extracted_asks_no_model_and_extracts_each_once(fresh_store):
    """Before: Stop during a long chat's first summary let the extraction of the oldest
    turns finish, then started the model on part 1 anyway, then extracted every turn
    again (20,000 messages: Stop ended 16 s later, as long as no Stop). Now no model
    call follows a Stop, and the fallback goes on from what was extracted."""
    event, runtime, read = stopped_while_extracting(fresh_store, "stopped by the user")
    assert runtime.requests == []
    assert event.outcome == "ok" and event.path == "extractive" and event.fallback == "stopped"
    assert len(read) == 2 and sum(read) == event.messages_archived  # each message read once
    ledger = " ".join(fresh_store.latest_summary(1).fields["facts"])
    assert "Lisbon" in ledger and "bought 3 books" in ledger  # turn 1, from the first part


def test_a_model_part_that_times_out_goes_on_from_the_extracted_turns(fresh_store):
    """The same after a timeout: the fallback extracts the turns the model was to read,
    onto the oldest ones already extracted (they were extracted a second time)."""
    thread = chat_thread(fresh_store, 60, 400)
    slow = ScriptedRuntime([llm_json(words=400)] * 3, n_ctx=2048, delay_s=0.05)
    compactor = compactor_for(fresh_store, HeuristicCounter(), params(),
                              CompactionSettings(summary_max_tokens=256, max_parts=2,
                                                 timeout_s=0.3), runtime=slow)
    summarize, read = compactor.extractive.summarize, []
    compactor.extractive.summarize = lambda previous, said, *a, **k: (
        read.append(len(said)), summarize(previous, said, *a, **k))[1]
    event = compactor.compact(thread, "budget")
    assert event.outcome == "ok" and event.path == "extractive" and event.fallback == "timed_out"
    assert len(read) == 2 and sum(read) == event.messages_archived


def test_closing_during_a_summary_leaves_it_for_the_next_start(fresh_store):
    """Before: closing the window during a long chat's first summary froze it ~15 s while
    the extraction ran to its end and was saved. Now the extraction stops at the close,
    nothing is saved, and the skip does not count towards the circuit breaker."""
    from iris_desktop.stop import CLOSING

    event, runtime, read = stopped_while_extracting(fresh_store, CLOSING)
    assert runtime.requests == [] and read == [read[0]]  # no second extraction
    assert event.outcome == "skipped" and event.error == CLOSING
    assert fresh_store.summaries(1) == []


def test_a_chat_with_nothing_worth_compacting_says_so_and_is_not_a_failure(fresh_store):
    """Before: "compaction failed … only 25 tokens to reclaim", three of those opened the
    circuit breaker. Now: skipped, "nothing to compact yet", and the breaker stays shut."""
    thread = fresh_store.create_thread("t")
    for n in range(3):
        fresh_store.add_messages(thread, [{"role": "user", "content": f"q{n}"},
                                          {"role": "assistant", "content": f"a{n}"}])
    compactor = compactor_for(fresh_store, HeuristicCounter(), params(),
                              CompactionSettings(summary_max_tokens=2000),
                              runtime=ScriptedRuntime([llm_json(words=250)]))
    for _ in range(4):
        event = compactor.compact(thread, "manual")
        assert event.outcome == "skipped" and event.error.startswith("nothing to compact yet (")
        # one colon in the window's sentence (a newcomer's audit: "…not summarized: nothing
        # to compact yet: the unsummarized history…")
        assert event.plain().count(":") == 1
    assert "compaction skipped (manual): nothing to compact yet" in event.describe()
    assert fresh_store.summaries(thread) == [] and not compactor.breaker_open(thread)


def test_a_summary_that_would_grow_the_context_is_replaced_by_a_shorter_extract(fresh_store):
    """Before: the summary came out longer than the turns it replaced ("would not shrink
    the context (320 → 325)") and the compaction failed; an extract can always be made
    shorter than what it replaces, so a shorter one is used and the context shrinks."""
    thread = fresh_store.create_thread("t")
    for n in range(6):
        fresh_store.add_messages(thread, [
            {"role": "user", "content": f"My cousin number {n} is called Name{n} Surname{n}."},
            {"role": "assistant", "content": f"Noted: cousin {n} is Name{n} Surname{n}."}])
    compactor = compactor_for(fresh_store, HeuristicCounter(), params(window=1024),
                              CompactionSettings(summary_max_tokens=2000),
                              runtime=ScriptedRuntime([llm_json(words=400)] * 3))
    full = compactor._record  # the model's summary, made to cost more than it replaces

    def padded(plan, previous_row, summary, path):
        record = full(plan, previous_row, summary, path)
        if path != "extractive":
            record["text"] += "\n" + "padding " * 200
            record["tokens"] += 260
        return record

    compactor._record = padded
    event = compactor.compact(thread, "manual")
    assert event.outcome == "ok" and event.path == "extractive", event.describe()
    assert event.tokens_after < event.tokens_before
    assert "would not shrink the context" in event.error and "shorter extractive summary" in event.error
    assert len(fresh_store.summaries(thread)) == 1


def failing(compactor):
    """A compactor whose every attempt fails (the breaker's logic is what is tested)."""
    from iris_desktop.core.compaction import CompactionFailed

    def fail(*args, **kwargs):
        raise CompactionFailed("no room for a summary: the kept tail needs the whole budget")

    compactor._plan = fail
    return compactor


def test_circuit_breaker_after_three_failures(fresh_store):
    thread = fresh_store.create_thread("t")
    fresh_store.add_messages(thread, [{"role": "user", "content": "only one turn"}])
    compactor = failing(compactor_for(fresh_store, HeuristicCounter(), params()))
    for _ in range(3):
        assert compactor.compact(thread, "budget").outcome == "failed"
    assert compactor.breaker_open(thread)
    skipped = compactor.compact(thread, "budget")
    assert skipped.outcome == "skipped" and "circuit breaker" in skipped.error
    outcomes = [e["outcome"] for e in fresh_store.compaction_events(thread)]
    assert outcomes == ["failed"] * 3 + ["skipped"]  # the skip is recorded, not attempted
    assert compactor.compact(thread, "manual", force=True).outcome == "failed"


def test_the_breaker_half_opens_after_a_cool_down_of_turns(fresh_store):
    from iris_desktop.core.compaction import BREAKER_COOLDOWN_TURNS

    thread = fresh_store.create_thread("t")
    fresh_store.add_messages(thread, [{"role": "user", "content": "only one turn"}])
    compactor = failing(compactor_for(fresh_store, HeuristicCounter(), params()))
    for _ in range(3):
        compactor.compact(thread, "budget")
    assert compactor.breaker_open(thread)
    fresh_store.add_messages(thread, [
        m for n in range(BREAKER_COOLDOWN_TURNS)
        for m in ({"role": "assistant", "content": f"a{n}"}, {"role": "user", "content": f"u{n}"})])
    assert not compactor.breaker_open(thread)  # half-open: one attempt goes through
    attempt = compactor.compact(thread, "budget")
    assert attempt.outcome != "skipped"
    if attempt.outcome == "failed":
        assert compactor.breaker_open(thread)  # and its failure opens it again


def test_summarizer_input_is_dated_named_and_keeps_tool_findings_clipped(fresh_store):
    thread = fresh_store.create_thread("t")
    fresh_store.add_messages(thread, [
        {"role": "user", "content": "   ", "created_at": "2024-05-02T10:00:00+02:00"},
        {"role": "user", "name": "Ana", "content": "Find the bug.",
         "created_at": "2024-05-02T10:01:00+02:00"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "bash", "arguments": "{\"c\": 1}"}}]},
        {"role": "tool", "tool_call_id": "c", "name": "bash",
         "content": "FOUND: off-by-one in parse.py line 12 " + "x" * 5000},
    ])
    lines = _transcript_lines([said_from_row(r) for r in fresh_store.messages(thread)])
    assert lines[0] == "[2 May 2024] Ana: Find the bug."  # dated once, named; empty dropped
    assert lines[1].startswith("Assistant: [calls bash(")
    # what the tool found reaches the summarizer, clipped
    assert lines[2].startswith("Tool bash: FOUND: off-by-one in parse.py line 12")
    assert len(lines[2]) < 700


def test_in_loop_compaction_on_a_replayed_swe_transcript(fresh_store):
    """One long agent turn in a 4,096 window: before every model call, the result just
    asked for is there (verbatim, or shortened with a marker when even after compaction
    the task and the result do not both fit), the task stays verbatim, and no call is
    without its result."""
    # 12.5k tokens over 44 messages: three times the window, in one turn
    messages = load_corpus(next(p for p in AGENT_FILES if "i_got_id_demo" in p.name))
    thread = fresh_store.create_thread("swe")
    p = params(4096)
    counter = TiktokenCounter()
    compactor = compactor_for(fresh_store, counter, p)
    engine = ContextEngine(fresh_store, counter, p)
    compactions = 0
    for message in messages:
        fresh_store.add_message(thread, message)
        if message["role"] != "tool":
            continue
        events = list(compactor.before_request(thread))
        compactions += sum(1 for e in events if isinstance(e, CompactionFinished))
        request = engine.build(thread)
        check_request(engine, request)
        sent = request.messages[-1]["content"]
        if request.clipped_ids:  # shortened for the model, never lost: the store has it all
            head = sent.split("\n[… output shortened for the model")[0]
            assert message["content"].startswith(head) and len(head) > 100
        else:
            assert sent == message["content"]
        assert not request.dropped_turns
        if request.summary is not None and request.kept_ids:
            assert request.messages[1]["content"] == messages[1]["content"]  # the task
    assert compactions >= 1
    assert all(e["outcome"] == "ok" for e in fresh_store.compaction_events(thread))


@pytest.mark.parametrize("path", AGENT_FILES + CHAT_FILES, ids=lambda p: p.stem)
def test_every_corpus_conversation_compacts_cleanly(tmp_path, path):
    store = Store(tmp_path / "c.db")
    original = load_corpus(path)
    thread = store.create_thread(path.stem)
    store.add_messages(thread, original)
    p = params(8192)
    counter = TiktokenCounter()
    compactor = compactor_for(store, counter, p)
    engine = ContextEngine(store, counter, p)
    assert all(e.outcome == "ok" for e in compact_while_due(compactor, thread))
    request = engine.build(thread)
    described = check_request(engine, request)
    assert request.trigger == "none"
    assert "dropped" not in {m["state"] for m in described}
    assert request.predicted_prompt_tokens < 8192 * 0.75
    assert [row_to_message(r) for r in store.messages(thread)] == original
    store.close()


def test_real_model_produces_structured_json(real_model, fresh_store):
    """The grammar keeps the bundled model to the schema."""
    thread = chat_thread(fresh_store, 12, 120)
    compactor = compactor_for(fresh_store, real_model.counter(), params(8192),
                              CompactionSettings(summary_max_tokens=64), runtime=real_model)
    text = "".join(real_model.stream(
        GenerationRequest([{"role": "system", "content": "Summarize as JSON."},
         {"role": "user", "content": "User: I moved to Lisbon in May 2023.\nAssistant: Nice!"}],
        max_tokens=600, temperature=0.0, repeat_penalty=1.15, json_schema=__import__(
            "iris_desktop.core.summary", fromlist=["JSON_SCHEMA"]).JSON_SCHEMA)))
    data = json.loads(text)
    assert set(FIELDS) <= set(data)
    event = compactor.compact(thread, "manual")
    assert event.outcome == "ok" and event.path in ("llm", "chunked", "extractive")
    row = fresh_store.latest_summary(thread)
    summary = ConversationSummary.from_fields(row.fields)
    assert summary.summary and row.path == event.path
    assert event.summary_tokens <= 64 + 8  # the cap holds (plus the injection header)


def test_background_compaction_runs_after_the_reply_not_before_the_send(fresh_store):
    thread = fresh_store.create_thread("t")
    for n in range(19):
        fresh_store.add_messages(thread, [{"role": "user", "content": f"hi {n}"},
                                          {"role": "assistant", "content": f"hello {n}"}])
    p = params(compaction_min_turns=20)
    compactor = compactor_for(fresh_store, HeuristicCounter(), p)
    assert list(compactor.before_request(thread)) == []  # 19 turns: not due yet
    events = list(compactor.after_reply(thread))  # the next user turn would make it due
    assert [type(e) for e in events] == [CompactionStarted, CompactionFinished]
    assert events[-1].event.trigger == "early" and events[-1].event.outcome == "ok"
    fresh_store.add_messages(thread, [{"role": "user", "content": "next"}])
    assert list(compactor.before_request(thread)) == []  # the send does not wait


def test_one_process_compacts_a_thread_at_a_time(fresh_store):
    """A per-thread lease in the database: a second process skips, visibly, while the
    first holds it; the lease is free as soon as its process is gone."""
    import subprocess
    import sys
    import textwrap

    thread = chat_thread(fresh_store)
    path = fresh_store.path
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from iris_desktop.core.store import Store
        store = Store({str(path)!r})
        assert store.take_compaction_lease({thread}, "other", 600) is None
        print("held", flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        compactor = compactor_for(fresh_store, HeuristicCounter(), params())
        skipped = compactor.compact(thread, "budget")
        assert skipped.outcome == "skipped"
        assert f"another Iris process (pid {holder.pid}) has been compacting" in skipped.error
        assert fresh_store.latest_summary(thread) is None
        assert not compactor.breaker_open(thread)
    finally:
        holder.kill()
        holder.wait()
    event = compactor.compact(thread, "budget")  # its process is gone: the lease is free
    assert event.outcome == "ok"
    assert fresh_store.conn.execute("SELECT count(*) FROM compaction_leases").fetchone()[0] == 0


def test_a_summary_saved_by_another_process_meanwhile_is_used_not_redone(fresh_store):
    thread = chat_thread(fresh_store)
    compactor = compactor_for(fresh_store, HeuristicCounter(), params())
    other = Store(fresh_store.path)
    original = fresh_store.take_compaction_lease

    def racing(thread_id, token, seconds):
        # the other process commits its summary just before this one gets the lease
        compactor_for(other, HeuristicCounter(), params()).compact(thread_id, "budget")
        return original(thread_id, token, seconds)

    fresh_store.take_compaction_lease = racing
    event = compactor.compact(thread, "budget")
    assert event.outcome == "skipped" and "compacted this thread just now" in event.error
    assert len(fresh_store.summaries(thread)) == 1
    other.close()


def test_a_raw_control_character_inside_a_json_string_does_not_waste_the_summary():
    """Seen from the bundled model on an agent transcript: a literal tab or newline
    inside a string (not valid strict JSON). The summary is kept, flattened, and no
    control character reaches the prompt."""
    raw = (llm_json(key_decisions=["use the@TAB@fast path", "bell@BEL@ ok"])
           .replace("fact1 fact2", "fact1\nfact2").replace("@TAB@", "\t").replace("@BEL@", "\x07"))
    with pytest.raises(json.JSONDecodeError):
        json.loads(raw)  # strict JSON refuses it
    summary = ConversationSummary.parse(raw)
    assert summary.key_decisions == ["use the fast path", "bell ok"]
    assert "fact1 fact2" in summary.summary
    assert not any(ord(c) < 32 for c in summary.render().replace("\n", ""))


@pytest.mark.parametrize(("cut", "closed"), [
    ('{"summary": "Dana met Rosa in', {"summary": "Dana met Rosa in"}),
    ('{"summary": "a", "accomplishments": ["x", "y', {"summary": "a", "accomplishments": ["x", "y"]}),
    ('{"summary": "a", "accomplishments": ["x"], "key_dec', {"summary": "a", "accomplishments": ["x"]}),
    ('{"summary": "a", "key_decisions":', {"summary": "a"}),
    ('{"summary": "tab\\', {"summary": "tab"}),
    ('{"summary": "caf\\u00', {"summary": "caf"}),
    ('{"summary": "a", "accomplishments": [', {"summary": "a", "accomplishments": []}),
])
def test_json_cut_at_the_token_cap_is_closed_where_it_stopped(cut, closed):
    """Seen from the bundled model on an agent transcript: the reply reached its token
    cap inside a string ("Unterminated string"). What it wrote is kept."""
    assert json.loads(close_cut_json(cut)) == closed


@pytest.mark.parametrize("text", ["", "not json", '{"summary": "a"}}', '{"a": [}'])
def test_what_cannot_be_closed_stays_invalid(text):
    assert close_cut_json(text) is None
    with pytest.raises(SummaryInvalid):
        ConversationSummary.parse(text, cut=True)


def test_a_cut_reply_is_only_closed_when_the_model_hit_its_cap():
    cut = llm_json()[:-40]
    with pytest.raises(SummaryInvalid, match="Unterminated|Expecting"):
        ConversationSummary.parse(cut)  # a reply that ended by itself: broken, not cut
    assert ConversationSummary.parse(cut, cut=True).summary.startswith("fact0")


#: what the bundled model wrote once, its cache warm from other requests (test_recall
#: before this file): 19 words, then one character 110 times
LOOPED = ("Yesterday I visited Lisbon with Maria and bought 3 books. That sounds lovely, "
          "1 book is a lot! [date] " + "u" * 110)


def test_a_narrative_that_loops_on_one_character_is_not_a_summary():
    fields = {name: "" if name in ("summary", "emotional_thread", "relationship_dynamics")
              else [] for name in FIELDS}
    with pytest.raises(SummaryInvalid, match="repeats one character"):
        ConversationSummary.parse(json.dumps({**fields, "summary": LOOPED}))
    for fine in ("—", "a budget of 10000000000000000 won"):
        ConversationSummary.parse(json.dumps({**fields, "summary": LOOPED.replace("u" * 110, fine)}))


@pytest.mark.parametrize("cap", [64, 40, 20, 12, 3])
def test_fit_keeps_the_cap_when_only_a_short_narrative_of_long_words_is_left(cap):
    """fit() trims a narrative by words only above 20 of them; a shorter one with long
    words (numbers, paths, a loop) was returned over the cap. It is cut to what fits."""
    counter = HeuristicCounter()
    summary = ConversationSummary(summary=LOOPED.replace(" [date] ", " /srv/" + "x" * 300 + " "))
    fitted = summary.fit(counter, cap)
    assert counter.count_text(fitted.render()) <= cap
    assert summary.summary.startswith(fitted.summary.removesuffix(" …"))
    assert not fitted.summary or fitted.summary.endswith(" …")


def agent_thread(store, files):
    """One agent turn per file: it views the file (the path only in the call's
    arguments), the tool answers with its text (no path in it), the agent comments."""
    thread = store.create_thread("agent")
    for n, path in enumerate(files):
        args = json.dumps({"command": "view", "path": path})
        store.add_messages(thread, [
            {"role": "user", "content": f"Step {n}: look further. " + "u" * 300},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{n}", "type": "function",
                 "function": {"name": "str_replace_editor", "arguments": args}}]},
            {"role": "tool", "tool_call_id": f"c{n}", "name": "str_replace_editor",
             "content": "def main():\n    return 1\n" + "x" * 600},
            {"role": "assistant", "content": "Nothing wrong there. " + "a" * 300},
        ])
    return thread


@pytest.mark.parametrize("summarizer", ["extractive", "llm"])
def test_files_the_agent_only_named_in_its_calls_survive_compaction(fresh_store, summarizer):
    """Seen on an agent transcript: the model's summary kept 1 of the 7 files the agent
    had viewed, because the paths were only in the calls' arguments."""
    files = [f"/testbed/src/pkg/module_{n}.py" for n in range(6)]
    thread = agent_thread(fresh_store, files)
    runtime = ScriptedRuntime([llm_json()] * 20) if summarizer == "llm" else None
    compactor = compactor_for(fresh_store, HeuristicCounter(), params(), runtime=runtime)
    event = compactor.compact(thread, "manual")
    assert event.outcome == "ok" and (event.path == "extractive") == (summarizer == "extractive")
    summary = fresh_store.latest_summary(thread)
    archived = {f for n, f in enumerate(files)
                if any(m["tool_calls"] and f in json.dumps(m["tool_calls"])
                       for m in fresh_store.messages(thread) if m["id"] <= summary.covers_through_id)}
    assert archived and archived <= set(summary.fields["relevant_files"])
    assert all(f in summary.text for f in archived)


@pytest.mark.parametrize("summarizer", ["extractive", "llm"])
def test_the_files_acted_on_last_survive_a_chain_that_holds_many(fresh_store, summarizer):
    """An audit: the extractive summary kept the last 12 of its files, which, ranked with
    the acted-on first, dropped exactly those (a pydicom fix listed only the files of its
    demonstration text); the model's kept the first 24 of the chain, so once it held 24
    no new file got in."""
    from iris_desktop.core.extractive import merge_files

    assert merge_files(["acted_on.py", *[f"m{n}.py" for n in range(15)]], [], limit=12)[0] == \
        "acted_on.py"
    mentioned = " ".join(f"/repo/docs/mention_{n}.md" for n in range(30))
    thread = fresh_store.create_thread("agent")
    for n in range(4):  # turns mentioning 30 files, compacted first
        fresh_store.add_messages(thread, [
            {"role": "user", "content": f"Read these ({n}): {mentioned}"},
            {"role": "assistant", "content": f"Noted {mentioned}"}])
    runtime = ScriptedRuntime([llm_json()] * 40) if summarizer == "llm" else None
    compactor = compactor_for(fresh_store, HeuristicCounter(), params(), runtime=runtime)
    assert compactor.compact(thread, "manual").outcome == "ok"
    assert len(fresh_store.latest_summary(thread).fields["relevant_files"]) >= 10
    args = json.dumps({"command": "str_replace", "path": "/testbed/src/fixed_now.py"})
    for n in range(6):
        fresh_store.add_messages(thread, [
            {"role": "user", "content": f"Step {n}: fix it. {mentioned}"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{n}", "type": "function",
                 "function": {"name": "str_replace_editor", "arguments": args}}]},
            {"role": "tool", "tool_call_id": f"c{n}", "name": "str_replace_editor",
             "content": "edited " + "x" * 600},
            {"role": "assistant", "content": "Fixed. " + "a" * 300}])
    event = compactor.compact(thread, "manual")
    assert event.outcome == "ok"
    assert "/testbed/src/fixed_now.py" in fresh_store.latest_summary(thread).fields["relevant_files"]
