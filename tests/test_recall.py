"""Recall: summarized messages found again for the newest message, within the free budget."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace

import pytest

from iris_desktop.core.config import ContextParams
from iris_desktop.core.engine import ContextEngine
from iris_desktop.core.planner import Planner
from iris_desktop.core.recall import (
    COUNTING_HIT_CHARS,
    RECALL_CUTOFF,
    RECALL_FOOTER,
    RECALL_HEADER,
    Ranking,
    Recaller,
    _interleave,
    _statements,
    asked_role,
    asks,
    clip_around,
    fts_query,
    fuse,
    query_terms,
    question_parts,
)
from iris_desktop.core.records import Period, periods_in
from iris_desktop.generation import GenerationRequest
from iris_desktop.tokens import HeuristicCounter

from conftest import AGENT_FILES, CHAT_FILES, SYNTHETIC_CHAT, load_corpus
from support.helpers import compact_while_due, compactor_for
from support.invariants import check_request, snapshot

QUESTION = "Which city did Rosa move to?"


def params(window=2048, recall=512, **kw):
    return ContextParams(window=window, system_prompt="You are Iris.", recall_max_tokens=recall, **kw)


def compacted(store, messages, counter, p):
    thread = store.create_thread("t")
    store.add_messages(thread, messages)
    events = compact_while_due(compactor_for(store, counter, p), thread)
    assert all(e.outcome == "ok" for e in events)
    return thread


@pytest.fixture(scope="module")
def chat():
    """A two-person chat with names and timestamps, as imported by a user."""
    return json.loads(SYNTHETIC_CHAT.read_text())


def test_query_terms_skip_stopwords_question_words_and_speakers(fresh_store):
    names = ["Rosa", "Tomas"]
    assert query_terms(QUESTION, names) == ["city", "move"]
    assert query_terms("What paintings did Tomas make?", names) == ["paint", "make"]
    assert query_terms("", names) == [] and query_terms("did you? what!", names) == []
    assert fts_query(["city", "go"]) == '"city"* OR "go"'
    # quotes and FTS5 operators in a message are words, never syntax
    assert query_terms('NEAR("x" AND y) OR -z*', []) == ["near"]
    thread = fresh_store.create_thread("t")
    fresh_store.add_message(thread, {"role": "user", "content": "NEAR AND OR NOT near"})
    hits = fresh_store.recall_hits(thread, 10**9, fts_query(["near", "and", "or", "not"]))
    assert len(hits) == 1


def test_reciprocal_rank_fusion_rewards_agreement():
    scores = fuse([[1, 2, 3], [3, 1]])
    assert max(scores, key=scores.get) == 1 and scores[3] > scores[2]


def test_recall_finds_the_summarized_answer_dated_and_named(fresh_store, chat):
    counter = HeuristicCounter()
    thread = compacted(fresh_store, chat["messages"], counter, params())
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
    # who and when from the records; "last week" anchored to the day it was said
    assert ("\n4 March 2024:\n- Rosa: We finally moved to Tallinn last week (the week before "
            "4 March 2024)") in block
    assert {m["id"] for m in described if m["recalled"]} == set(recall.ids)
    assert all(m["state"] == "summarized" for m in described if m["recalled"])
    assert snapshot(fresh_store, thread) == before  # only the request carries the block


def test_recall_runs_for_messages_that_ask(fresh_store, chat):
    assert asks(QUESTION) and asks("what did I say about pottery") and asks("Remind me of the race")
    assert not asks("I moved to Tallinn last week.") and not asks("")
    counter = HeuristicCounter()
    thread = compacted(fresh_store, chat["messages"], counter, params())
    engine = ContextEngine(fresh_store, counter, params())
    statement = engine.build(thread, draft="I moved to Tallinn again.")
    assert not statement.recall.ids and statement.breakdown.recall == 0
    assert statement.recall.reason == "the message asks nothing"
    assert statement.messages[-1]["content"] == "I moved to Tallinn again."
    assert engine.build(thread, draft=QUESTION).recall.ids


def test_recall_never_displaces_history_and_is_off_without_a_summary(fresh_store, chat):
    counter = HeuristicCounter()
    thread = compacted(fresh_store, chat["messages"], counter, params())
    on = ContextEngine(fresh_store, counter, params()).build(thread, draft=QUESTION)
    off = ContextEngine(fresh_store, counter, params(recall=0)).build(thread, draft=QUESTION)
    assert on.included_ids == off.included_ids and on.dropped_turns == off.dropped_turns
    assert on.breakdown.history == off.breakdown.history and off.breakdown.recall == 0
    assert off.messages[-1]["content"] == QUESTION
    assert on.breakdown.used == off.breakdown.used + on.breakdown.recall

    fresh = fresh_store.create_thread("no summary")
    fresh_store.add_messages(fresh, chat["messages"][:20])
    request = ContextEngine(fresh_store, counter, params()).build(fresh, draft=QUESTION)
    assert request.summary is None and not request.recall.ids and request.breakdown.recall == 0
    assert request.recall.reason == "nothing is summarized yet"


def test_recall_uses_only_the_space_history_leaves(fresh_store, chat):
    counter = HeuristicCounter()
    p = params()
    thread = compacted(fresh_store, chat["messages"], counter, p)
    full = ContextEngine(fresh_store, counter, p).build(thread, draft=QUESTION)
    leftover = full.breakdown.available - full.breakdown.summary - full.breakdown.history \
        - full.breakdown.draft
    # a budget ratio that leaves only ~100 tokens after the same history
    squeeze = (full.breakdown.budget - leftover + 100) / p.window
    tight = ContextEngine(fresh_store, counter, replace(p, token_budget_ratio=squeeze))
    searches = []
    hits = fresh_store.recall_hits
    fresh_store.recall_hits = lambda *a, **kw: searches.append(a) or hits(*a, **kw)
    request = tight.build(thread, draft=QUESTION)
    check_request(tight, request)
    assert request.included_ids == full.included_ids
    assert 0 < request.breakdown.recall <= 100 < full.breakdown.recall
    # the full block did not fit: it was filled again from the same search, not searched again
    assert len(searches) == 1


def test_every_step_of_one_turn_gets_the_same_block(fresh_store, chat):
    """A stable prefix: the agent's tool steps reuse the KV cache of the recalled block."""
    counter = HeuristicCounter()
    thread = compacted(fresh_store, chat["messages"], counter, params())
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


def test_real_model_counts_the_recalled_prompt_exactly(fresh_store, chat, real_model):
    counter = real_model.counter()
    thread = compacted(fresh_store, chat["messages"], counter, params())
    fresh_store.add_message(thread, {"role": "user", "content": QUESTION})
    planner = Planner(params(), counter, runtime=real_model)
    request = planner.plan(fresh_store, thread)
    check_request(planner.engine(fresh_store), request)
    assert request.breakdown.recall > 0 and request.exact
    generation = real_model.stream(GenerationRequest(request.messages, max_tokens=2, temperature=0))
    generation.text()
    stats = generation.stats
    assert stats.prompt_tokens == request.predicted_prompt_tokens


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    from iris_desktop.runtime.embedder import Embedder, ensure_embedding_model

    from conftest import MODEL_CACHE

    model = Embedder.load(ensure_embedding_model(MODEL_CACHE / "models"))
    yield model
    model.close()


def test_recall_by_meaning_finds_a_paraphrase_that_shares_no_word(fresh_store, chat, embedder):
    """'Where is Rosa's new home?' shares no content word with 'We finally moved to Tallinn
    last week': bm25 alone finds other things; fused with the embedder it finds it."""
    counter = HeuristicCounter()
    thread = compacted(fresh_store, chat["messages"], counter, params())
    question = "Where is Rosa's new home?"
    words = Planner(params(), counter).plan(fresh_store, thread, question)
    assert "Tallinn" not in words.messages[-1]["content"]
    meaning = Planner(params(), counter, embedder=embedder)
    index = meaning.index(fresh_store)
    while index.index_pending(limit=64):
        pass
    request = meaning.plan(fresh_store, thread, question)
    check_request(meaning.engine(fresh_store), request)
    assert request.recall.semantic and "moved to Tallinn" in request.messages[-1]["content"]


def test_the_ranking_by_meaning_drops_questions_not_a_statement_that_ends_asking():
    """A question holds no fact, but chat messages often say something and then ask:
    "Oscar, my guinea pig, is great. How are your pets?" answers "what pet does she have?"."""
    rows = {1: {"content": "Where did you go last week?"},
            2: {"content": "Yup, Oscar, my guinea pig. He's been great. How are your pets?"},
            3: {"content": "We got a cat!"},
            4: {"content": "We got a  CAT!"},  # the same words again
            5: {"content": "Really? Why?"},
            6: {"content": 'Have you read "Dune?"'},
            7: {"content": ""}}
    assert _statements([1, 2, 3, 4, 5, 6, 7, 8], rows) == [2, 3]


def test_the_ranking_by_meaning_drops_questions_in_any_script():
    """CJK sentences end without a space and have no ASCII words: "我的猫叫什么名字？"
    only asks (it was kept as a statement), "我的猫叫米米。你呢？" says something first."""
    rows = {1: {"content": "我的猫叫什么名字？"},
            2: {"content": "我的猫叫米米。你呢？"},
            3: {"content": "ما اسم قطتي؟"},
            4: {"content": "猫の名前は何？ 教えて？"},
            5: {"content": "Моего кота зовут Мими."}}
    assert _statements([1, 2, 3, 4, 5], rows) == [2, 5]


def test_dates_a_question_names_are_read_in_any_common_form():
    day, month = dt.date(2023, 4, 9), dt.date(2023, 8, 1)
    assert periods_in("Which show did she see on 9 April, 2023?") == [Period(day, day)]
    assert periods_in("what about April 9th, 2023") == [Period(day, day)]
    assert periods_in("the 9th of Apr 2023") == [Period(day, day)]
    assert periods_in("Where was he during the first weekend of August 2023?") == [
        Period(month, dt.date(2023, 8, 31))]
    assert periods_in("What did she bake in May?") == [Period(month=5)]
    assert periods_in("Where did they live in 2022?") == [
        Period(dt.date(2022, 1, 1), dt.date(2022, 12, 31))]
    # a verb is not a month; an impossible day falls back to its month
    assert periods_in("I may go, may I?") == [] and periods_in("") == []
    assert periods_in("on 31 February 2023") == [Period(dt.date(2023, 2, 1), dt.date(2023, 2, 28))]
    # a message written on the day, or up to a week after it ("last Sunday"), tells of it
    assert Period(day, day).holds(day + dt.timedelta(days=7))
    assert not Period(day, day).holds(day - dt.timedelta(days=1)) and not Period(day, day).holds(None)
    assert Period(month=5).holds(dt.date(2021, 5, 30)) and not Period(month=5).holds(dt.date(2021, 7, 1))


def add_dated_chat(store, thread: int, said: list[tuple[str, str]]) -> list[int]:
    """Rosa says each text on its day, Tomas answers "Sounds good." a minute later."""
    return store.add_messages(thread, [
        message for day, text in said for message in (
            {"role": "user", "name": "Rosa", "content": text, "created_at": f"{day}T10:00:00"},
            {"role": "assistant", "name": "Tomas", "content": "Sounds good.",
             "created_at": f"{day}T10:01:00"})])


def test_a_question_naming_a_date_ranks_what_was_written_then_first(fresh_store):
    """Two messages match the words equally; the one written in the month the question
    names comes first (dates from the records, not from the text)."""
    thread = fresh_store.create_thread("t")
    said = [("2024-03-02", "I cooked a lentil soup for the neighbours."),
            ("2024-05-10", "I cooked a mushroom risotto for the neighbours.")]
    ids = add_dated_chat(fresh_store, thread, said)
    recaller = Recaller(fresh_store, HeuristicCounter())
    ranked = lambda question: recaller._rank(  # noqa: E731
        thread, ids[-1], question, query_terms(question, ["Rosa", "Tomas"]), ["Rosa", "Tomas"])[0]
    assert ranked("What did Rosa cook for the neighbours?")[0] == ids[0]  # a tie: older first
    assert ranked("What did Rosa cook for the neighbours in May 2024?")[0] == ids[2]
    assert ranked("What did Rosa cook for the neighbours on 2 March 2024?")[0] == ids[0]
    # the block for given messages shows each with the two after it, dated
    block = recaller.block_for(thread, ids[-1], [ids[2]])
    assert block.splitlines()[1:4] == [
        "10 May 2024:", "- Rosa: I cooked a mushroom risotto for the neighbours.",
        "- Tomas: Sounds good."]


def test_dates_a_question_names_relative_to_the_day_it_is_asked():
    today = dt.date(2023, 6, 17)  # a Saturday
    day = dt.timedelta(days=1)
    assert periods_in("What did I tell you yesterday?", today) == [Period(today - day, today - day)]
    assert periods_in("What did we talk about last week?", today) == [
        Period(dt.date(2023, 6, 5), dt.date(2023, 6, 11))]  # Monday to Sunday before this week
    assert periods_in("and last weekend?", today) == [Period(dt.date(2023, 6, 10), dt.date(2023, 6, 11))]
    assert periods_in("What did I buy last Friday?", today) == [Period(today - day, today - day)]
    assert periods_in("the film I saw last Saturday", today) == [Period(today - 7 * day, today - 7 * day)]
    assert periods_in("What did I cook two weeks ago?", today) == [
        Period(dt.date(2023, 5, 31), dt.date(2023, 6, 6))]  # that week, three days either side
    assert periods_in("3 months ago", today) == [Period(dt.date(2023, 3, 1), dt.date(2023, 3, 31))]
    assert periods_in("How many films did I watch in the last 3 months?", today) == [
        Period(dt.date(2023, 3, 17), today)]
    assert periods_in("anything this month", today) == [Period(dt.date(2023, 6, 1), today)]
    assert periods_in("last year", today) == [Period(dt.date(2022, 1, 1), dt.date(2022, 12, 31))]
    assert periods_in("last month", dt.date(2024, 3, 31)) == [Period(dt.date(2024, 2, 1), dt.date(2024, 2, 29))]
    # a week of a named month is not the week before today; vague times name no days
    assert periods_in("Where was he in the last week of October 2023?", today) == [
        Period(dt.date(2023, 10, 1), dt.date(2023, 10, 31))]
    assert periods_in("What did she paint recently? And lately?", today) == []
    # without the day it is asked, only the dates it names
    assert periods_in("What did I tell you yesterday?") == []
    assert periods_in("on 9 April 2023, and last month", today) == [
        Period(dt.date(2023, 5, 1), dt.date(2023, 5, 31)), Period(dt.date(2023, 4, 9), dt.date(2023, 4, 9))]


def test_a_question_about_last_week_ranks_what_was_written_then_first(fresh_store):
    """The same words written twice; "last week" means the week before the day the
    question is asked: the draft's day (the planner's clock), or a sent message's own
    day, so an imported chat's questions mean what they meant then. The block has room
    for one of the two."""
    thread = fresh_store.create_thread("t")
    said = [("2024-03-06", "I cooked a lentil soup for the neighbours."), ("2024-04-06", "Rain all week."),
            ("2024-05-08", "I cooked a mushroom risotto for the neighbours.")]
    ids = add_dated_chat(fresh_store, thread, said)
    summary_id = fresh_store.add_summary(thread, {
        "prev_id": None, "first_message_id": ids[0], "covers_through_id": ids[-1],
        "first_turn": 1, "last_turn": 3, "fields": "{}",
        "text": "Rosa and Tomas talked about cooking.", "tokens": 10, "counter": "heuristic",
        "path": "extractive"})
    fresh_store.add_compaction_event(thread, {
        "trigger": "tokens", "outcome": "ok", "path": "extractive", "turns_archived": 3,
        "tokens_before": 100, "tokens_after": 20, "kept_turns": 0, "summary_tokens": 10,
        "duration_s": 0.1, "summary_id": summary_id})
    counter = HeuristicCounter()
    p = params(window=1024, recall=44)
    question = "What did I cook for the neighbours last week?"
    lentil, risotto = ids[0], ids[4]
    for today, first, second in ((dt.date(2024, 3, 13), lentil, risotto),
                                 (dt.date(2024, 5, 15), risotto, lentil)):
        planner = Planner(p, counter, today=lambda today=today: today)
        shown = planner.plan(fresh_store, thread, question).recall.ids
        assert first in shown and second not in shown
    # sent: its own date counts, whatever the clock says
    fresh_store.add_message(thread, {"role": "user", "name": "Rosa", "content": question,
                                     "created_at": "2024-03-12T09:00:00"})
    planner = Planner(p, counter, today=lambda: dt.date(2024, 5, 15))
    shown = planner.plan(fresh_store, thread).recall.ids
    assert lentil in shown and risotto not in shown


def test_the_days_a_period_holds_as_ranges_of_days():
    day = dt.date(2023, 4, 9)
    assert Period(day, day).days(2020, 2024) == [(day, dt.date(2023, 4, 17))]
    assert Period(month=2).days(2023, 2024) == [
        (dt.date(2023, 2, 1), dt.date(2023, 3, 8)), (dt.date(2024, 2, 1), dt.date(2024, 3, 8))]
    for first, last in Period(month=2).days(2023, 2024):  # the same days as holds()
        assert Period(month=2).holds(first) and Period(month=2).holds(last)
        assert not Period(month=2).holds(last + dt.timedelta(days=1))


def test_a_threads_speakers_follow_its_messages(fresh_store, tmp_path):
    """Most used first, tools left out; kept between calls, and read again once the
    thread has a new message, in this Store or another one on the same file."""
    from iris_desktop.core.store import Store

    thread = fresh_store.create_thread("t")
    assert fresh_store.thread_speakers(thread) == []
    fresh_store.add_messages(thread, [
        {"role": "user", "name": "Ana", "content": "a"},
        {"role": "assistant", "name": "Ben", "content": "b"},
        {"role": "tool", "name": "search", "content": "c", "tool_call_id": "x"},
        {"role": "assistant", "name": "Ben", "content": "d"}])
    assert fresh_store.thread_speakers(thread) == ["Ben", "Ana"]
    assert fresh_store.thread_speakers(thread) == ["Ben", "Ana"]
    fresh_store.add_message(thread, {"role": "user", "name": "Cleo", "content": "e"})
    assert fresh_store.thread_speakers(thread) == ["Ben", "Ana", "Cleo"]
    other = Store(fresh_store.path)
    try:
        other.add_messages(thread, [{"role": "user", "name": "Cleo", "content": f"{i}"} for i in range(3)])
    finally:
        other.close()
    assert fresh_store.thread_speakers(thread) == ["Cleo", "Ben", "Ana"]
    assert fresh_store.thread_speakers(thread, limit=1) == ["Cleo"]
    fresh_store.delete_thread(thread)
    assert fresh_store.thread_speakers(thread) == []


def test_messages_are_found_by_when_they_were_written(fresh_store):
    thread = fresh_store.create_thread("t")
    assert fresh_store.sent_years(thread) is None
    ids = fresh_store.add_messages(thread, [
        {"role": "user", "content": "a", "created_at": "2022-12-31T23:30:00-05:00"},
        {"role": "assistant", "content": "b", "created_at": "2023-01-01T09:00:00+02:00"},
        {"role": "tool", "content": "c", "tool_call_id": "x", "created_at": "2023-01-01T10:00:00"},
        {"role": "user", "content": "d"},  # written when, nobody knows
        {"role": "user", "content": "e", "created_at": "2024-06-01T08:00:00"}])
    assert fresh_store.sent_years(thread) == (2022, 2024)
    new_year = [(dt.date(2023, 1, 1), dt.date(2023, 1, 1))]
    assert fresh_store.sent_within(thread, ids[-1], new_year) == [ids[1]]  # the writer's day; no tool
    assert fresh_store.sent_within(thread, ids[-1], [(dt.date(2022, 12, 31), dt.date(2023, 1, 1)),
                                                     (dt.date(2024, 1, 1), dt.date(2024, 12, 31))]) \
        == [ids[0], ids[1], ids[4]]
    assert fresh_store.sent_within(thread, ids[0], new_year) == []  # up to through_id only


def test_a_question_naming_a_date_finds_what_the_whole_chats_ranking_leaves_out(fresh_store):
    """Seventy messages about trips rank above the one trip told in May 2024 (bm25 prefers
    the short, repeated ones), more than recall's bm25 list holds. A question that names
    May 2024 searches the messages written then too, and finds it."""
    thread = fresh_store.create_thread("t")
    messages = [{"role": "user", "name": "Rosa", "content": "Trip! Such a trip.",
                 "created_at": f"2023-{1 + i % 12:02d}-{1 + i % 28:02d}T10:00:00"} for i in range(70)]
    messages.append({"role": "user", "name": "Rosa", "created_at": "2024-05-20T10:00:00",
                     "content": "Our trip to Porto took a while to plan, with the kids and the dog "
                                "and everything else going on, but it was lovely in the end."})
    ids = fresh_store.add_messages(thread, [*messages, {"role": "assistant", "content": "Nice."}])
    recaller = Recaller(fresh_store, HeuristicCounter())
    assert "Porto" not in recaller.recall(thread, ids[-1], "Where did Rosa go on her trip?", 400).text
    question = "Where did Rosa go on her trip in May 2024?"
    assert recaller._rank(thread, ids[-1], question, query_terms(question, ["Rosa"]), ["Rosa"])[0][0] \
        == ids[70]
    assert "20 May 2024:\n- Rosa: Our trip to Porto" in recaller.recall(thread, ids[-1], question, 400).text


def test_a_question_naming_one_speaker_ranks_that_speakers_messages_first(fresh_store):
    thread = fresh_store.create_thread("t")
    ids = fresh_store.add_messages(thread, [
        {"role": "user", "name": "Rosa", "content": "I cooked a lentil soup."},
        {"role": "assistant", "name": "Tomas", "content": "I cooked a lentil soup too."}])
    recaller = Recaller(fresh_store, HeuristicCounter())
    names = ["Rosa", "Tomas"]
    ranked = lambda question: recaller._rank(  # noqa: E731
        thread, ids[-1], question, query_terms(question, names), names)[0]
    assert ranked("What soup was cooked?")[0] == ids[0]  # the closer match (shorter)
    assert ranked("What soup did Tomas cook?")[0] == ids[1]
    assert ranked("What soup did Rosa and Tomas cook?")[0] == ids[0]  # two named: no boost


def test_a_question_sent_gets_the_block_its_draft_was_prefilled_with(fresh_store, chat):
    """Storing the question adds a document with its words to bm25's statistics, which
    may reorder near ties: the send reuses the draft's search, so the prefilled KV cache
    holds the block that is sent."""
    counter = HeuristicCounter()
    planner = Planner(params(), counter)
    thread = compacted(fresh_store, chat["messages"], counter, params())
    searches = []
    hits = fresh_store.recall_hits
    fresh_store.recall_hits = lambda *a, **kw: searches.append(a) or hits(*a, **kw)
    draft = planner.plan(fresh_store, thread, QUESTION)
    fresh_store.add_message(thread, {"role": "user", "content": QUESTION})
    sent = planner.plan(fresh_store, thread)
    assert draft.recall.ids and sent.recall.ids == draft.recall.ids
    assert sent.messages[-1]["content"] == draft.messages[-1]["content"]
    assert len(searches) == 1
    # another planner (new settings) searches again, and finds the same messages here
    again = Planner(params(), counter).plan(fresh_store, thread)
    assert len(searches) == 2 and again.recall.ids == sent.recall.ids


def test_a_long_message_is_clipped_around_the_questions_words():
    """A recalled message too long for its line keeps the sentences that hold the
    question's words, in order, with "…" where text was left out; without any such
    sentence, its start; a short one whole."""
    text = ("I'm interested in renewable energy, can you recommend some documentaries? "
            "By the way, I finished the chapter on DNA in \"A Short History of Nearly "
            "Everything\" and I'm now on page 220. Also my sister visits next week. "
            "Anyway, solar panels seem expensive.")
    terms = query_terms("How many pages of 'A Short History of Nearly Everything' have I read?")
    clipped = clip_around(text, terms, 160)
    assert clipped.startswith("… By the way") and "page 220." in clipped and len(clipped) <= 160
    assert "sister" not in clipped and clipped.endswith("…")
    assert clip_around(text, ["unrelated"], 60) == text[:59].rstrip() + "…"
    assert clip_around("Short and whole.", terms, 160) == "Short and whole."
    # one sentence longer than the limit is cut into parts, the part that matches shown
    run_on = " ".join(["word"] * 80 + ["page", "220"] + ["word"] * 80)
    assert "page 220" in clip_around(run_on, terms, 120) and len(clip_around(run_on, terms, 120)) <= 124


def test_a_question_about_several_things_is_searched_per_part():
    """Two or more quoted phrases are the parts; else the question splits where clauses
    or alternatives join (a comma outside a date, "or", never inside quotes), and a part
    needs two searchable words of its own; names are not searchable."""
    assert question_parts("Which device did I set up first, the smart thermostat or the mesh "
                          "network system?") == [
        "Which device did I set up first", "the smart thermostat", "the mesh network system?"]
    assert question_parts("What is the order of: 'I joined the gym', 'I ran the half marathon' and "
                          "'I sold my bike'?") == ["I joined the gym", "I ran the half marathon", "I sold my bike"]
    assert question_parts("How many pages of 'A Short History of Nearly Everything' have I read?") == []
    assert question_parts("Did I read 'To Adapt or Not to Adapt' or 'Dune' first?") == ["To Adapt or Not to Adapt",
                                                                                       "Dune"]
    assert question_parts("What did Rosa bake on 3 June, 2023 for the party?", ["Rosa"]) == []
    assert question_parts("Did Rosa paint the black and white bowl or the blue vase?", ["Rosa"]) == [
        "Did Rosa paint the black and white bowl", "the blue vase?"]
    assert question_parts("What activities has Rosa done with her family or friends?", ["Rosa"]) == []
    assert question_parts("How much did my brother's car cost?") == []  # an apostrophe is no quote
    # only the sentences that ask are split: a greeting, news or a photo's caption is no part
    assert question_parts("Sounds special, those beach trips! Do you have any other summer traditions "
                          "you all do together? Create those memories!") == []
    assert question_parts("Awesome, Mel! Family support's huge. What else do you guys like doing "
                          "together? [shares a photo: a family walking through a forest]", ["Mel"]) == []
    assert question_parts("Great news, really. Did Rosa paint the black and white bowl or the blue "
                          "vase?", ["Rosa"]) == ["Did Rosa paint the black and white bowl", "the blue vase?"]
    assert question_parts("Would Tim enjoy reading books by C. S. Lewis or John Greene?", ["Tim"]) == [
        "Would Tim enjoy reading books by C. S. Lewis", "John Greene?"]  # an initial ends no sentence
    assert question_parts("Tell me the order of 'the red barn', 'the old mill' and 'the stone "
                          "bridge'.") == ["the red barn", "the old mill", "the stone bridge"]
    assert _interleave([[1, 2, 3], [4, 1], [5]]) == [1, 4, 5, 2, 3]


def test_each_part_of_a_question_gets_its_best_hit_into_the_ranking(fresh_store, monkeypatch):
    """bm25 over the whole question favours the messages that match most of its words;
    searched per part, the long message that matches only the other part comes second,
    not last."""
    thread = fresh_store.create_thread("t")
    filler = [{"role": "user", "content": f"We talked about lunch and the weather, day {i}."} for i in range(30)]
    mesh = [{"role": "user", "content": f"The mesh network system {w} is set up."} for w in ("works", "helps", "rocks")]
    thermostat = "We spoke about many other things that day, " * 8 + "and the thermostat came too."
    ids = fresh_store.add_messages(thread, [*filler, *mesh, {"role": "user", "content": thermostat}])
    recaller = Recaller(fresh_store, HeuristicCounter())
    question = "Which did I set up first, the smart thermostat or the mesh network system?"
    ranked = lambda: recaller._rank(thread, ids[-1], question, query_terms(question), [])[0]  # noqa: E731
    assert ranked()[:2] == [ids[-4], ids[-1]]
    monkeypatch.setattr("iris_desktop.core.recall.MAX_PARTS", 0)  # the whole question only
    assert ranked()[:4] == ids[-4:]


def test_each_part_of_a_question_ranks_the_asked_sides_messages_up_too(fresh_store):
    """A part's ranking gets the whole question's boosts: for "did I…", the user's message
    about one part comes before the assistant's that repeats that part's words more."""
    thread = fresh_store.create_thread("t")
    filler = [{"role": "user", "content": f"We talked about lunch and the weather, day {i}."} for i in range(30)]
    ids = fresh_store.add_messages(thread, [
        *filler,
        {"role": "assistant", "content": "A mesh network system covers the house; the mesh network system is fast."},
        {"role": "user", "content": "I got the mesh network working on Sunday."},
        {"role": "user", "content": "I installed the smart thermostat in March."},
    ])
    recaller = Recaller(fresh_store, HeuristicCounter())
    question = "Which did I set up first, the smart thermostat or the mesh network system?"
    ranked = recaller._rank(thread, ids[-1], question, query_terms(question), [])[0]
    assert ranked.index(ids[-2]) < ranked.index(ids[-3])


def test_a_question_that_counts_shows_more_hits_each_alone_and_clipped(fresh_store):
    """"How many…" gathers mentions from many places: each hit is shown without the
    messages after it and clipped around the question's words to COUNTING_HIT_CHARS, so
    the same budget holds more of them; a question about no one side still shows the replies."""
    recaller = Recaller(fresh_store, HeuristicCounter())
    chatter = "We also talked about the weather and lunch for a while. " * 8  # ~450 characters
    messages = []
    for festival in ("Sundance", "Cannes", "Tribeca", "Berlinale", "Venice", "Toronto"):
        messages += [{"role": "user", "content": f"{chatter}I went to the {festival} film festival."},
                     {"role": "assistant", "content": f"How lovely! {festival} sounds like fun. " * 6}]
    thread = fresh_store.create_thread("t")
    ids = fresh_store.add_messages(thread, messages)
    visits = set(ids[0::2])
    counted = recaller.recall(thread, ids[-1], "How many film festivals did I go to?", 600)
    assert set(counted.ids) <= visits and len(counted.ids) >= 4  # hits only, several of them
    assert all(len(line) <= len("- User: ") + COUNTING_HIT_CHARS + 2
               for line in counted.text.splitlines() if line.startswith("- User:"))
    assert all("film festival." in line for line in counted.text.splitlines() if line.startswith("- User:"))
    other = recaller.recall(thread, ids[-1], "Which film festivals were visited?", 600)
    assert set(other.ids) - visits  # the replies after the hits
    assert len(set(other.ids) & visits) < len(counted.ids)


def test_who_a_question_asks_about_follows_its_grammatical_person():
    """"did I" asks about the user's own words, "did you" about the assistant's; the
    asking itself ("can you remind me") says nothing; both, or a name, name no role."""
    assert asked_role("What new kitchen gadget did I buy before the air fryer?") == "user"
    assert asked_role("Can you suggest some activities I can do in the evening?") == "user"
    assert asked_role("What did you recommend for the soup?") == "assistant"
    assert asked_role("Can you remind me what the average framerate gain was?") is None
    assert asked_role("Can you remind me which beer you recommended for my stew?") is None
    assert asked_role("What did Rosa cook?") is None and asked_role("") is None


def test_a_question_about_my_own_words_ranks_the_users_messages_first(fresh_store):
    """Two messages match the words equally; "did I" puts the user's first, "did you"
    the assistant's, whichever is older (ties are otherwise older first)."""
    recaller = Recaller(fresh_store, HeuristicCounter())
    said = {"assistant": "A lentil soup with cumin is a good start.",
            "user": "I cooked a lentil soup with cumin yesterday."}
    for order, question, first in ((("assistant", "user"), "Which lentil soup with cumin did I cook?", "user"),
                                   (("user", "assistant"), "Which lentil soup with cumin did you suggest?",
                                    "assistant")):
        thread = fresh_store.create_thread("t")
        ids = fresh_store.add_messages(thread, [{"role": role, "content": said[role]} for role in order])
        ranked = recaller._rank(thread, ids[-1], question, query_terms(question), [])[0]
        assert ranked[0] == ids[order.index(first)] == ids[1]


def test_a_question_about_one_sides_words_shows_more_of_that_sides_messages(fresh_store):
    """"What did I…" shows each hit alone, without the reply after it; a question about
    someone named shows the full reply and the speaker's next words, as before. The same
    budget then holds more of the user's words."""
    recaller = Recaller(fresh_store, HeuristicCounter())
    reply = "That sounds like a lovely evening. " * 20  # a long assistant reply, ~700 characters
    messages = []
    for topic in ("tulips", "roses", "daffodils", "lilies"):
        messages += [{"role": "user", "content": f"I planted {topic} along the garden fence today."},
                     {"role": "assistant", "content": reply},
                     {"role": "user", "content": "Thanks! Anyway, how do I descale a kettle?"}]
    thread = fresh_store.create_thread("t")
    ids = fresh_store.add_messages(thread, messages)
    mine = recaller.recall(thread, ids[-1], "Which flowers did I plant along the garden fence?", 2000)
    plants = [ids[i] for i in range(0, len(ids), 3)]
    assert set(mine.ids) == set(plants)  # every planting shown, and only those
    assert not any(line.startswith("- Assistant:") for line in mine.text.splitlines())
    assert all(f"I planted {topic}" in mine.text for topic in ("tulips", "roses", "daffodils", "lilies"))

    theirs = recaller.recall(thread, ids[-1], "Which flowers were planted along the garden fence?", 2000)
    assert {ids[1], ids[2]} <= set(theirs.ids)  # the whole reply, and the speaker's next words
    assert any(len(line) > 600 for line in theirs.text.splitlines())

    budget = 200  # room for a few groups only
    assert len(set(plants) & set(recaller.recall(thread, ids[-1], "Which flowers did I plant along the garden "
                                                 "fence?", budget).ids)) > \
        len(set(plants) & set(recaller.recall(thread, ids[-1], "Which flowers were planted along the garden "
                                              "fence?", budget).ids))


def test_a_question_about_my_words_says_who_i_am_in_a_chat_with_named_sides(fresh_store):
    """In a chat imported with names, "What did I plant?" is about the user side's
    speaker: the block ends by saying so ("I am Rosa."; the bundled model answered with
    Tomas's tomatoes until told). A question naming someone, one about the assistant's
    words, an unnamed chat and a user side with two names say nothing of the kind; the
    line is counted within the budget."""
    counter = HeuristicCounter()
    recaller = Recaller(fresh_store, counter)

    def chat(user_names):
        thread = fresh_store.create_thread("t")
        messages = []
        for k, (plant, city) in enumerate((("sunflowers", "Tallinn"), ("tomatoes", "Valencia"))):
            name = user_names[k % len(user_names)]
            messages += [{"role": "user", "content": f"I planted {plant} on the balcony in {city}.",
                          **({"name": name} if name else {})},
                         {"role": "assistant", "content": f"Lovely! I planted {plant} too.",
                          **({"name": "Tomas"} if name else {})}]
        return thread, fresh_store.add_messages(thread, messages)

    thread, ids = chat(["Rosa"])
    mine = recaller.recall(thread, ids[-1], "What did I plant on the balcony?", 400)
    assert mine.text.endswith(f"{RECALL_FOOTER}\nI am Rosa.") and "- Rosa: I planted sunflowers" in mine.text
    assert counter.count_text(mine.text) <= 400
    for question in ("What did Tomas plant on the balcony?", "What did you plant on the balcony?",
                     "Which plants were on the balcony?"):
        assert recaller.recall(thread, ids[-1], question, 400).text.endswith(RECALL_FOOTER), question
    for names in ([None], ["Rosa", "Ana"]):
        thread, ids = chat(names)
        block = recaller.recall(thread, ids[-1], "What did I plant on the balcony?", 400).text
        assert block.endswith(RECALL_FOOTER) and "I am" not in block, names
    # the room it takes is counted: a budget that fits the line and one hit holds both
    thread, ids = chat(["Rosa"])
    small = recaller.recall(thread, ids[-1], "What did I plant on the balcony?", 40)
    assert small.text.endswith("I am Rosa.") and counter.count_text(small.text) <= 40


#: a relative cutoff as measured in docs/benchmarks.md (the highest that kept every LongMemEval
#: evidence message; the shipped RECALL_CUTOFF is 0, none, since every cutoff measured lost
#: LoCoMo probes)
CUT = 0.4


@pytest.fixture
def cutoff(monkeypatch):
    monkeypatch.setattr("iris_desktop.core.recall.RECALL_CUTOFF", CUT)
    return CUT


def _cutoff_chat(store, n=12):
    """``n`` short messages that all match "blue boat", user and assistant in turns."""
    thread = store.create_thread("t")
    ids = store.add_messages(thread, [{"role": "user" if i % 2 == 0 else "assistant",
                                       "content": f"Message {i} is about the blue boat."} for i in range(n)])
    return thread, ids


def test_the_cutoff_leaves_out_hits_far_below_the_best_and_keeps_close_ones(fresh_store, monkeypatch, cutoff):
    """The block ends where the evidence does, not where the room does: after the first
    hit, a hit whose strength (its score over the best one's) is below RECALL_CUTOFF is
    left out, with the messages that would follow it, though the budget has room for it;
    a hit close to the best is shown, wherever it stands in the ranking."""
    thread, ids = _cutoff_chat(fresh_store)
    best, far, close, closer = ids[0], ids[3], ids[6], ids[9]  # each followed by two messages
    strength = {best: 1.0, far: cutoff / 3, close: cutoff + (1 - cutoff) / 4, closer: 0.95}
    ranking = Ranking(thread, ids[-1], ["blue", "boat"], [best, far, close, closer], strength=strength)
    recaller = Recaller(fresh_store, HeuristicCounter())
    block = recaller.block(ranking, 2000)
    assert {best, close, closer} <= set(block.ids)
    assert not set(ids[3:6]) & set(block.ids)  # the far hit, and its replies
    assert "Message 3 " not in block.text and "Message 6 " in block.text
    monkeypatch.setattr("iris_desktop.core.recall.RECALL_CUTOFF", 0.0)  # no cutoff: the room decides
    assert set(recaller.block(ranking, 2000).ids) == set(ids)


def test_a_questions_best_hit_is_always_shown_however_weak(fresh_store, cutoff):
    """The cutoff only ever ends the block after its first hit: the message ranked first
    is shown whatever its strength (a ranking whose scores are all low, a part's best hit
    merged first); what follows it is measured against the cutoff."""
    thread, ids = _cutoff_chat(fresh_store, 6)
    weak = cutoff / 10
    ranking = Ranking(thread, ids[-1], ["blue", "boat"], [ids[3], ids[0]], strength={ids[3]: weak, ids[0]: weak})
    block = Recaller(fresh_store, HeuristicCounter()).block(ranking, 2000)
    assert block.ids == ids[3:6]  # the first hit with its two replies; the second left out
    # a ranking without strengths (none measured) is filled by room alone, as before
    assert set(Recaller(fresh_store, HeuristicCounter()).block(replace(ranking, strength={}), 2000).ids) == set(ids)


def test_with_a_reranker_the_block_keeps_the_evidence_and_ends_where_the_matches_weaken(fresh_store, monkeypatch,
                                                                                          cutoff):
    """Through the real ranking: the first stage and a cross-encoder agree on the answer,
    which ranks first with strength 1.0 and is shown; the many messages that only share a
    word rank far below it and are left out, though the room would hold them."""
    thread = fresh_store.create_thread("t")
    filler = [{"role": "user", "content": f"The weather in the city was grey on day {i}, nothing else."}
              for i in range(40)]
    ids = fresh_store.add_messages(thread, [
        {"role": "user", "name": "Rosa", "content": "We finally moved to the city of Tallinn last spring."},
        {"role": "user", "name": "Tomas", "content": "Oh wow, good for you."},
        *filler])
    answer = ids[0]

    class Agrees:  # the cross-encoder's reading: the answer far above the rest
        identity = "agrees"

        def score(self, query, passages):
            return [8.0 if "Tallinn" in p else -8.0 for p in passages]

    recaller = Recaller(fresh_store, HeuristicCounter(), reranker=Agrees())
    ranking = recaller.rank(thread, ids[-1], "Which city did Rosa move to?")
    assert ranking.reranked and ranking.ranked[0] == answer and ranking.strength[answer] == 1.0
    assert all(0 < ranking.strength[i] <= 1 for i in ranking.ranked)
    block = recaller.block(ranking, 4000)
    assert answer in block.ids and "Tallinn" in block.text
    strong = [i for i in ranking.ranked if ranking.strength[i] >= cutoff]
    assert len(strong) < len(ranking.ranked)  # some are far below the answer
    # every message shown is a strong hit or one of the two messages after one
    assert set(block.ids) <= {i + k for i in strong for k in range(3)}
    monkeypatch.setattr("iris_desktop.core.recall.RECALL_CUTOFF", 0.0)
    assert len(recaller.block(ranking, 4000).ids) > len(block.ids)  # the room alone holds more
    assert RECALL_CUTOFF == 0.0  # shipped: none (every cutoff measured lost LoCoMo probes)


def test_without_the_reranker_the_room_fills_the_block(fresh_store, cutoff):
    """The cutoff reads the reranked order's strengths only (where it was measured): a
    ranking the cross-encoder did not reorder carries none, and its block is filled by room."""
    thread, ids = _cutoff_chat(fresh_store, 30)
    ranking = Recaller(fresh_store, HeuristicCounter()).rank(thread, ids[-1], "What about the blue boat?")
    assert not ranking.reranked and ranking.strength == {}
    assert set(Recaller(fresh_store, HeuristicCounter()).block(ranking, 4000).ids) == set(ids)


def test_one_question_is_ranked_once_across_a_files_stores_and_threads(fresh_store, tmp_path):
    """The GUI's DB thread (the meter) and its model thread (the turn) each hold a Store of
    the same file, and a send plans on both at once: one ranking serves both, the second
    caller waiting for the first rather than running the cross-encoder again beside the
    model reading the prompt."""
    import threading
    import time

    from iris_desktop.core.store import Store

    thread = fresh_store.create_thread("t")
    ids = fresh_store.add_messages(thread, [{"role": "user", "content": f"We planted {n} tomatoes."}
                                            for n in range(20)])
    calls = []

    class SlowRecaller(Recaller):
        def rank(self, *args, **kwargs):
            calls.append(threading.current_thread().name)
            time.sleep(0.3)  # as a cross-encoder call would take
            return super().rank(*args, **kwargs)

    planner = Planner(ContextParams(window=4096, recall_max_tokens=400), HeuristicCounter())
    second = Store(fresh_store.path)
    try:
        assert planner.rankings_for(second) is planner.rankings_for(fresh_store)
        with Store(tmp_path / "other.db") as elsewhere:  # another file: its own rankings
            assert planner.rankings_for(elsewhere) is not planner.rankings_for(fresh_store)
        got = {}

        def ask(store, name):
            got[name] = planner.rankings_for(store).rank(
                SlowRecaller(store, HeuristicCounter()), thread, 1, ids[-1], "How many tomatoes?")

        workers = [threading.Thread(target=ask, args=(s, n), name=n)
                   for s, n in ((fresh_store, "model"), (second, "meter"))]
        for w in workers:
            w.start()
        for w in workers:
            w.join(10)
        assert len(calls) == 1 and got["model"] is got["meter"] and got["model"].ranked
        assert planner.rankings_for(second).holds(thread, 1, ids[-1], "How many tomatoes?")
        assert not planner.rankings_for(second).holds(thread, 1, ids[-1], "How many carrots?")
    finally:
        second.close()



def test_a_long_message_searches_the_words_of_its_question_first():
    """Recall searches at most MAX_TERMS words: a long message that asks after more words
    than that searched only its preamble. Its asking sentences' words come first now; a
    message within the cap keeps its words in order."""
    from iris_desktop.core.recall import MAX_TERMS, query_terms

    chatter = " ".join(f"topic{i}" for i in range(40))
    terms = query_terms(f"So much happened: {chatter}. Which dentist did Rosa recommend?")
    assert len(terms) == MAX_TERMS and terms[:3] == ["dentist", "rosa", "recommend"]
    assert terms[3:] == [t for t in query_terms(f"So much happened: {chatter}.")][:MAX_TERMS - 3]
    short = "Which dentist did Rosa recommend after the move to Lisbon?"
    assert query_terms(short) == ["dentist", "rosa", "recommend", "after", "move", "lisbon"]


def test_a_turn_whose_task_message_is_summarized_says_so_not_answered(fresh_store):
    """An audit: a long agent turn compacted with its task message summarized (it did not
    fit with the steps) sent no user message, and recall said "the newest turn is
    answered" although it was still in progress."""
    thread = fresh_store.create_thread("t")
    ids = fresh_store.add_messages(thread, [
        {"role": "user", "content": "Earlier chat about the bug."},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "Fix the bug in parser.py. " * 300},  # over the budget
        {"role": "assistant", "content": "Looking.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "bash", "content": "parser.py:12 error"},
    ])
    summary_id = fresh_store.add_summary(thread, {
        "prev_id": None, "first_message_id": ids[0], "covers_through_id": ids[2],
        "first_turn": 1, "last_turn": 2, "fields": "{}", "text": "The user asked for a fix.",
        "tokens": 8, "counter": "heuristic", "path": "extractive"})
    fresh_store.add_compaction_event(thread, {
        "trigger": "tokens", "outcome": "ok", "path": "extractive", "turns_archived": 1,
        "tokens_before": 100, "tokens_after": 20, "kept_turns": 0, "summary_tokens": 8,
        "duration_s": 0.1, "summary_id": summary_id})
    request = Planner(params(), HeuristicCounter()).plan(fresh_store, thread)
    assert [m["role"] for m in request.messages] == ["system", "assistant", "tool"]
    assert request.recall.reason == "the message that opened the newest turn is summarized"


def test_an_agents_result_in_a_summarized_tool_output_is_recalled(fresh_store):
    """An audit: after compaction, what an agent found lived only in a tool output (a CTF
    flag, a traceback), and recall searched user and assistant messages only: asked for
    it, the model made a flag up. Tool outputs are searched too, shown as the tool's."""
    counter = HeuristicCounter()
    p = params(window=2048, recall=512)
    messages = []
    for n in range(12):
        found = "Flag: HTB{l00k_47_7h3_w4ll}" if n == 1 else f"nothing in chunk {n}"
        messages += [
            {"role": "user", "content": f"Task {n}: look at the next file. " + "context " * 60},
            {"role": "assistant", "content": "Running it.", "tool_calls": [
                {"id": f"c{n}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"c{n}", "name": "bash",
             "content": f"$ python decrypt.py\n{found}\n" + "log line " * 80},
            {"role": "assistant", "content": f"Step {n} done."}]
    thread = compacted(fresh_store, messages, counter, p)
    summary = fresh_store.latest_summary(thread)
    flag_id = next(m["id"] for m in fresh_store.messages(thread) if "HTB{" in (m["content"] or ""))
    assert flag_id <= summary.covers_through_id  # summarized
    request = Planner(p, counter).plan(fresh_store, thread, "Which flag did decrypt.py print?")
    assert flag_id in request.recall.ids
    assert "- Tool bash: " in request.recall.text and "HTB{l00k_47_7h3_w4ll}" in request.recall.text
    check_request(ContextEngine(fresh_store, counter, p), request)


def test_a_question_typed_with_a_full_width_or_arabic_question_mark_asks():
    """Before (an audit): "我的猫叫什么名字？" and "ما اسم قطتي؟" got no recall ("the
    message asks nothing"): only the ASCII "?" counted. The question marks people's
    keyboards type count, and a sentence ending in one holds no fact for the summary.
    (No message of either dev set holds one: their results cannot change.)"""
    from iris_desktop.core.recall import _is_question

    for question in ("我的猫叫什么名字？", "猫の名前は何ですか？", "ما اسم قطتي؟", "Πού είναι\u037e"):
        assert asks(question), question
        assert _is_question(question) and _is_question(f"「{question}」")
    assert not asks("我喜欢猫。") and not asks("أحب القطط.")
