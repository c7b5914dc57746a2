"""What the context engine and a compaction say about themselves is true: recall's reason
when nothing is recalled, which part of an agent's turn is too large, what fixes a chat
whose window shrank, and how a compaction is told (an audit of compaction and context
honesty)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from iris_desktop.core.config import CompactionSettings, ContextParams
from iris_desktop.core.engine import SHORTEST_SUMMARY, ContextEngine, ConversationTooLargeException
from iris_desktop.core.events import CompactionEvent, CompactionFinished, TurnFailed
from iris_desktop.core.planner import Planner
from iris_desktop.core.recall import Recaller
from iris_desktop.host import build_agent
from iris_desktop.tokens import HeuristicCounter

from conftest import SYNTHETIC_CHAT
from support.fakes import ScriptedRuntime
from support.helpers import compact_while_due, compactor_for
from support.invariants import check_request

QUESTION = "Which city did Rosa move to?"


def params(window=2048, **kw):
    return ContextParams(window=window, system_prompt="You are Iris.", recall_max_tokens=512, **kw)


def compacted_chat(store, counter, p):
    thread = store.create_thread("t")
    store.add_messages(thread, json.loads(SYNTHETIC_CHAT.read_text())["messages"])
    events = compact_while_due(compactor_for(store, counter, p), thread)
    assert events and all(e.outcome == "ok" for e in events)
    return thread


def test_matches_with_no_room_left_are_said_to_have_no_room_not_to_be_missing(fresh_store):
    """Before: a question whose answer is summarized, asked when the history left only a
    few tokens, was told "recall none (nothing summarized matches)" (the CLI's context and
    the JSON's "nothing was recalled (nothing summarized matches)"), though the same
    question with more room recalled six messages. Now: "no room", with the room there
    was; "nothing summarized matches" stays for a question that matches nothing."""
    counter = HeuristicCounter()
    p = params()
    thread = compacted_chat(fresh_store, counter, p)
    full = ContextEngine(fresh_store, counter, p).build(thread, draft=QUESTION)
    assert full.recall.ids  # the answer is summarized and found
    b = full.breakdown
    leftover = b.available - b.summary - b.history - b.draft
    squeeze = (b.budget - leftover + 12) / p.window  # the same history, about 12 tokens left
    tight = ContextEngine(fresh_store, counter, replace(p, token_budget_ratio=squeeze))
    request = tight.build(thread, draft=QUESTION)
    check_request(tight, request)
    t = request.breakdown
    left = t.available - t.summary - t.history - t.draft
    assert 0 < left < 20 and request.included_ids == full.included_ids
    assert not request.recall.ids and request.breakdown.recall == 0
    assert request.recall.reason == f"no room: no match fits in {left} tokens"

    # the recaller itself: hits that do not fit are "no room"; none at all still "nothing"
    recaller = Recaller(fresh_store, counter)
    covered = full.summary.covers_through_id
    ranking = recaller.rank(thread, covered, QUESTION)
    assert ranking.ranked and recaller.block(ranking, 512).ids
    assert recaller.block(ranking, 30).reason == "no room"
    everything = frozenset(ranking.ranked)
    assert recaller.block(ranking, 512, everything).reason == "nothing summarized matches"
    nothing = recaller.rank(thread, covered, "Which zeppelin did Quetzalcoatl charter?")
    assert not nothing.ranked
    assert recaller.block(nothing, 512).reason == "nothing summarized matches"


def call(cid: str) -> dict:
    return {"id": cid, "type": "function", "function": {"name": "bash", "arguments": "{}"}}


def test_a_long_task_message_with_long_steps_blames_the_steps_not_the_small_result(fresh_store):
    """Before: an imported agent transcript (a 835-token task message, ten steps, a
    178-token result just asked for) was refused as "the result the model just asked for
    is too large to shorten into what is left", because the steps were named only when
    the task message took under half the room. The steps are what overflow, and one
    compaction makes the next request fit. Now the sentence names them whatever the task
    message costs, and what it promises holds."""
    thread = fresh_store.create_thread("t")
    task = "Fix the failing serializer test; the traceback and the spec follow. " + "spec " * 380
    fresh_store.add_messages(thread, [{"role": "user", "content": task}])
    for n in range(8):
        fresh_store.add_messages(thread, [
            {"role": "assistant", "content": f"Step {n}: " + "thinking it through " * 40,
             "tool_calls": [call(f"c{n}")]},
            {"role": "tool", "tool_call_id": f"c{n}", "name": "bash", "content": "ok " * 3}])
    counter = HeuristicCounter()
    p = ContextParams(window=1024, system_prompt="sys", compaction_min_turns=20)
    engine = ContextEngine(fresh_store, counter, p)
    with pytest.raises(ConversationTooLargeException) as err:
        engine.build(thread)
    allowed = err.value.allowed
    opening = counter.count_message({"role": "user", "content": task})
    assert allowed // 2 < opening < allowed  # the task message is over half the room
    text = str(err.value)
    assert "too large to shorten" not in text
    assert "its message and the model's steps before the result it just asked for are" in text
    assert "compacting the chat (Compact now, or the next send) summarizes the earlier steps" in text
    assert compactor_for(fresh_store, counter, p).compact(thread, "manual").outcome == "ok"
    check_request(engine, engine.build(thread))


def test_a_chat_whose_window_shrank_is_told_that_a_send_refits_its_summary(fresh_store):
    """Before: a chat compacted at a 4,096-token window, opened at a smaller one, was
    refused with "the system prompt (1,505 tokens) and the summary (578 tokens) alone take
    the whole 1,680-token budget …; shorten the system prompt …, or raise context.window",
    though sending a message works: compaction runs first and writes a summary that fits
    (157 tokens). Now the sentence says so first, and the send does what it says."""
    counter = HeuristicCounter()
    system = "Answer briefly and cite the turn you rely on. " * 60
    wide = ContextParams(window=4096, system_prompt=system, compaction_min_turns=0)
    extractive = CompactionSettings(summarizer="extractive")
    thread = fresh_store.create_thread("t")
    for n in range(40):
        fresh_store.add_messages(thread, [
            {"role": "user", "content": f"On {1 + n % 28} May I visited Lisbon and bought "
                                        f"{n + 3} books. " + "u" * 200},
            {"role": "assistant", "content": f"That sounds lovely, {n} books! " + "a" * 200}])
    first = compactor_for(fresh_store, counter, wide, extractive).compact(thread, "manual")
    assert first.outcome == "ok"
    frame = ContextEngine(fresh_store, counter, wide).frame(thread)
    assert frame.summary_tokens > 4 * SHORTEST_SUMMARY
    # a window whose budget holds the system prompt and half of today's summary
    window = math.ceil((frame.system_tokens + frame.summary_tokens // 2) / 0.7)
    narrow = replace(wide, window=window)
    with pytest.raises(ConversationTooLargeException) as err:
        ContextEngine(fresh_store, counter, narrow).build(thread, draft="Did it work?")
    text = str(err.value)
    assert "alone take the whole" in text and "leaving nothing for the conversation; " in text
    assert ("sending a message summarizes the chat again, shorter, to make room for it; or "
            "shorten the system prompt") in text

    runtime = ScriptedRuntime(["It did."], n_ctx=window)
    planner = Planner(narrow, counter, runtime=runtime, compaction=extractive)
    events = list(build_agent(planner, fresh_store).send(thread, "Did it work?"))
    assert not [e for e in events if isinstance(e, TurnFailed)]
    assert [e for e in events if isinstance(e, CompactionFinished)]
    assert fresh_store.messages(thread)[-1]["content"] == "It did."
    assert fresh_store.latest_summary(thread).id != first.summary_id

    # without room beside the system prompt for even the shortest summary, it is not said
    tiny = replace(wide, window=math.ceil((frame.system_tokens + 10) / 0.7))
    with pytest.raises(ConversationTooLargeException) as err:
        ContextEngine(fresh_store, counter, tiny).build(thread, draft="Did it work?")
    assert "sending a message" not in str(err.value)


def test_the_shortest_summary_is_compactions_own():
    from iris_desktop.core.compaction import MIN_SUMMARY_TOKENS

    assert SHORTEST_SUMMARY == MIN_SUMMARY_TOKENS


def test_a_compaction_of_one_turn_says_turn_4_and_recall_only_can_bring_it_back():
    """Before: "compacted (manual, extractive): turns 4–4, …" and "Turns 4–4 (2 messages)
    are summarized now …", and every compaction promised "recall brings them back when you
    ask about them", though recall may be off (context.recall_max_tokens = 0) or find no room. Now: "turn
    4", and recall "can bring them back when a question needs them"."""
    one = CompactionEvent("manual", "ok", "chunked", 1, 2, 2_154, 1_671, 1, 157, 0.1,
                          first_turn=4, last_turn=4)
    assert one.describe().startswith("compacted (manual, chunked): turn 4, 2 messages archived, ")
    assert one.plain() == ("Turn 4 (2 messages) is summarized now, in under a second. It stays "
                           "in the chat, dimmed, and recall can bring it back when a question "
                           "needs it.")
    many = CompactionEvent("budget", "ok", "extractive", 53, 106, 24_259, 3_069, 8, 222, 1.1,
                           first_turn=1, last_turn=53, fallback="stopped")
    assert "turns 1–53, 106 messages archived" in many.describe()
    assert many.plain() == ("Iris summarized turns 1–53 (106 messages) itself, quickly and "
                            "without the model, because you pressed Stop. They stay in the chat, "
                            "dimmed, and recall can bring them back when a question needs them.")
    mixed = CompactionEvent("budget", "ok", "chunked", 53, 106, 24_259, 3_069, 8, 222, 95.0,
                            first_turn=1, last_turn=53, extracted_last_turn=1)
    assert mixed.plain().endswith(" Iris summarized the oldest (turn 1) itself, to keep the "
                                  "wait short.")
    for event in (one, many, mixed):
        assert "–4 " not in event.describe() and "brings them back" not in event.plain()
