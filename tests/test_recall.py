"""Recall: summarized messages found again for the newest message, within the free budget."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from iris_desktop.core.engine import ContextEngine, ContextParams
from iris_desktop.core.recall import RECALL_FOOTER, RECALL_HEADER, asks, fts_query, query_terms
from iris_desktop.core.tokens import HeuristicCounter

from conftest import AGENT_FILES, CHAT_FILES, CORPUS, load_corpus
from helpers import compact_while_due, compactor_for
from invariants import check_request, snapshot

LOCOMO_26 = CORPUS / "long-chats" / "locomo-26.json"
QUESTION = "When did Caroline go to the LGBTQ support group?"


def params(window=4096, recall=512, **kw):
    return ContextParams(window=window, system_prompt="You are Iris.", recall_max_tokens=recall, **kw)


def compacted(store, messages, counter, p):
    thread = store.create_thread("t")
    store.add_messages(thread, messages)
    events = compact_while_due(compactor_for(store, counter, p), thread)
    assert all(e.outcome == "ok" for e in events)
    return thread


@pytest.fixture(scope="module")
def locomo():
    return json.loads(LOCOMO_26.read_text())


def test_query_terms_skip_stopwords_question_words_and_speakers(fresh_store):
    names = {"user": ["Caroline"], "assistant": ["Mel", "Melanie"]}
    assert query_terms(QUESTION, names) == ["lgbtq", "support", "group"]
    assert query_terms("What paintings did Melanie make?", names) == ["paint", "make"]
    assert query_terms("", names) == [] and query_terms("did you? what!", names) == []
    assert fts_query(["lgbtq", "go"]) == '"lgbtq"* OR "go"'
    # quotes and FTS5 operators in a message are words, never syntax
    assert query_terms('NEAR("x" AND y) OR -z*', {}) == ["near"]
    thread = fresh_store.create_thread("t")
    fresh_store.add_message(thread, {"role": "user", "content": "NEAR AND OR NOT near"})
    hits = fresh_store.recall_hits(thread, 10**9, fts_query(["near", "and", "or", "not"]))
    assert [h[1] for h in hits] == ["user"]


def test_recall_finds_the_summarized_answer_dated(fresh_store, locomo):
    counter = HeuristicCounter()
    thread = compacted(fresh_store, locomo["messages"], counter, params())
    before = snapshot(fresh_store, thread)
    engine = ContextEngine(fresh_store, counter, params())
    request = engine.build(thread, draft=QUESTION)
    described = check_request(engine, request)

    recall = request.recall
    assert recall.ids and 0 < request.breakdown.recall <= 512
    covered = request.summary.covers_through_id
    assert all(i <= covered for i in recall.ids)
    block = request.messages[-1]["content"]
    assert block.startswith(RECALL_HEADER) and block.endswith(f"{RECALL_FOOTER}\n\n{QUESTION}")
    # the message that says it, with "yesterday" anchored to the session's date
    assert "LGBTQ support group yesterday (7 May 2023)" in block
    assert "\n8 May 2023:\n- Caroline: " in block  # dated, and named as the chat names her
    assert {m["id"] for m in described if m["recalled"]} == set(recall.ids)
    assert all(m["state"] == "summarized" for m in described if m["recalled"])
    assert snapshot(fresh_store, thread) == before  # only the request carries the block


def test_recall_runs_for_messages_that_ask(fresh_store, locomo):
    assert asks(QUESTION) and asks("what did I say about pottery") and asks("Remind me of the race")
    assert not asks("I went to a LGBTQ support group yesterday.") and not asks("")
    counter = HeuristicCounter()
    thread = compacted(fresh_store, locomo["messages"], counter, params())
    engine = ContextEngine(fresh_store, counter, params())
    statement = engine.build(thread, draft="I went to a LGBTQ support group again.")
    assert not statement.recall.ids and statement.breakdown.recall == 0
    assert statement.recall.reason == "the message asks nothing"
    assert statement.messages[-1]["content"] == "I went to a LGBTQ support group again."
    assert engine.build(thread, draft=QUESTION).recall.ids


def test_recall_never_displaces_history_and_is_off_without_a_summary(fresh_store, locomo):
    counter = HeuristicCounter()
    thread = compacted(fresh_store, locomo["messages"], counter, params())
    on = ContextEngine(fresh_store, counter, params()).build(thread, draft=QUESTION)
    off = ContextEngine(fresh_store, counter, params(recall=0)).build(thread, draft=QUESTION)
    assert on.included_ids == off.included_ids and on.dropped_turns == off.dropped_turns
    assert on.breakdown.history == off.breakdown.history and off.breakdown.recall == 0
    assert off.messages[-1]["content"] == QUESTION
    assert on.breakdown.used == off.breakdown.used + on.breakdown.recall

    fresh = fresh_store.create_thread("no summary")
    fresh_store.add_messages(fresh, locomo["messages"][:20])
    request = ContextEngine(fresh_store, counter, params()).build(fresh, draft=QUESTION)
    assert request.summary is None and not request.recall.ids and request.breakdown.recall == 0
    assert request.recall.reason == "nothing is summarized yet"


def test_recall_uses_only_the_space_history_leaves(fresh_store, locomo):
    counter = HeuristicCounter()
    p = params()
    thread = compacted(fresh_store, locomo["messages"], counter, p)
    full = ContextEngine(fresh_store, counter, p).build(thread, draft=QUESTION)
    leftover = full.breakdown.available - full.breakdown.summary - full.breakdown.history \
        - full.breakdown.draft
    # a budget ratio that leaves only ~100 tokens after the same history
    squeeze = (full.breakdown.budget - leftover + 100) / p.window
    tight = ContextEngine(fresh_store, counter, replace(p, token_budget_ratio=squeeze))
    request = tight.build(thread, draft=QUESTION)
    check_request(tight, request)
    assert request.included_ids == full.included_ids
    assert request.breakdown.recall <= 100 < full.breakdown.recall


def test_every_step_of_one_turn_gets_the_same_block(fresh_store, locomo):
    """A stable prefix: the agent's tool steps reuse the KV cache of the recalled block."""
    counter = HeuristicCounter()
    thread = compacted(fresh_store, locomo["messages"], counter, params())
    engine = ContextEngine(fresh_store, counter, params())
    fresh_store.add_message(thread, {"role": "user", "content": QUESTION})
    first = engine.build(thread)
    assert first.recall.ids
    call = {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
    fresh_store.add_messages(thread, [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "name": "read_file", "content": "notes " * 40},
    ])
    second = engine.build(thread)
    check_request(engine, second)
    user_at = len(second.messages) - 3
    assert second.messages[user_at]["content"] == first.messages[-1]["content"]
    assert second.recall.ids == first.recall.ids


@pytest.mark.parametrize("path", AGENT_FILES + CHAT_FILES, ids=lambda p: p.stem)
def test_invariants_with_recall_on_every_compacted_corpus_file(tmp_path, path):
    from iris_desktop.core.store import Store

    store = Store(tmp_path / "r.db")
    try:
        counter = HeuristicCounter()
        messages = load_corpus(path)
        p = params(window=4096)
        thread = compacted(store, messages, counter, p)
        engine = ContextEngine(store, counter, p)
        user_texts = [m["content"] for m in messages if m["role"] == "user" and m["content"]]
        for draft in (user_texts[0][:300], user_texts[-1][:300], None):
            check_request(engine, engine.build(thread, draft=draft))
    finally:
        store.close()


def test_real_model_counts_the_recalled_prompt_exactly(fresh_store, locomo, real_model):
    counter = real_model.counter()
    thread = compacted(fresh_store, locomo["messages"], counter, params())
    fresh_store.add_message(thread, {"role": "user", "content": QUESTION})
    engine = ContextEngine(fresh_store, counter, params())
    request = engine.build(thread)
    check_request(engine, request)
    assert request.breakdown.recall > 0
    "".join(real_model.stream(request.messages, max_tokens=2, temperature=0))
    stats = real_model.last_stats
    assert stats.prompt_tokens == request.predicted_prompt_tokens
