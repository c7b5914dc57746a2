"""core.views, the UI's pure logic, against a real temporary database (no Qt)."""

from __future__ import annotations

import json

import pytest

from iris_desktop.core.config import ContextParams
from iris_desktop.core.engine import ContextEngine
from iris_desktop.core.planner import Planner
from iris_desktop.core.store import SummaryRow
from iris_desktop.core.views import (
    SUMMARY_FIELDS,
    budget_preview,
    changed_keys,
    counter_label,
    divider_text,
    inspector_report,
    load_transcript,
    locked_reason,
    message_states,
    meter_parts,
    parse_fields,
    settings_sections,
    transcript_entries,
)
from iris_desktop.settings import SETTINGS, load_settings
from iris_desktop.tokens import HeuristicCounter

FIELDS = {key: f"{label} text" for key, label in SUMMARY_FIELDS}


def summary_row(**kw) -> SummaryRow:
    values = dict(id=1, thread_id=1, prev_id=None, first_message_id=1, covers_through_id=36,
                  first_turn=1, last_turn=18, fields=FIELDS, text="s", tokens=3100,
                  counter="heuristic", path="llm", created_at=0.0)
    values.update(kw)
    return SummaryRow(**values)


def add_chat(store, turns: int, words: int = 30) -> int:
    thread = store.create_thread("chat")
    messages = []
    for i in range(turns):
        messages.append({"role": "user", "content": f"question {i} " + "word " * words})
        messages.append({"role": "assistant", "content": f"answer {i} " + "word " * words})
    store.add_messages(thread, messages)
    return thread


def add_summary(store, thread: int, through: int, first_turn=1, last_turn=None) -> int:
    rows = store.messages(thread, through_id=through)
    summary_id = store.add_summary(thread, {
        "prev_id": None, "first_message_id": rows[0]["id"], "covers_through_id": through,
        "first_turn": first_turn, "last_turn": last_turn or rows[-1]["turn"], "fields": FIELDS,
        "text": "They talked about words.", "tokens": 40, "counter": "heuristic", "path": "llm"})
    store.add_compaction_event(thread, {
        "trigger": "tokens", "outcome": "ok", "path": "llm", "turns_archived": 10,
        "tokens_before": 41200, "tokens_after": 3100, "kept_turns": 2, "summary_tokens": 40,
        "duration_s": 1.5, "summary_id": summary_id})
    return summary_id


def test_divider_text_names_turns_and_tokens():
    event = {"tokens_before": 41200, "tokens_after": 3100}
    assert divider_text(summary_row(), event) == (
        "Earlier turns summarized (turns 1–18, 41,200 → 3,100 tokens)")
    assert divider_text(summary_row(first_turn=4, last_turn=4)) == (
        "Earlier turns summarized (turn 4, summary 3,100 tokens)")


def test_transcript_has_divider_after_covered_messages_and_all_eight_fields(fresh_store):
    thread = add_chat(fresh_store, 6)
    ids = [r["id"] for r in fresh_store.messages(thread)]
    add_summary(fresh_store, thread, ids[5])
    entries = load_transcript(fresh_store, thread)
    kinds = [e.kind for e in entries]
    assert kinds.index("divider") == 6 and kinds.count("divider") == 1
    divider = entries[6]
    assert divider.title == "Earlier turns summarized (turns 1–3, 41,200 → 3,100 tokens)"
    assert [label for label, _ in divider.fields] == [label for _, label in SUMMARY_FIELDS]


def test_tool_card_carries_call_arguments_and_full_output(fresh_store):
    thread = fresh_store.create_thread("t")
    output = "\n".join(f"line {i}" for i in range(500))
    fresh_store.add_messages(thread, [
        {"role": "user", "content": "read it"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "c1", "type": "function",
            "function": {"name": "read_file", "arguments": json.dumps({"path": "a.txt"})}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "read_file", "content": output},
        {"role": "assistant", "content": "done"},
    ])
    entries = transcript_entries(fresh_store.messages(thread))
    assert entries[1].calls == ['read_file(path="a.txt")']
    card = entries[2]
    assert card.kind == "tool" and card.tool_name == "read_file"
    assert json.loads(card.arguments) == {"path": "a.txt"}
    assert card.text == output and not card.error


def test_states_come_from_the_engine(fresh_store):
    thread = add_chat(fresh_store, 40, words=60)
    ids = [r["id"] for r in fresh_store.messages(thread)]
    add_summary(fresh_store, thread, ids[9])
    engine = ContextEngine(fresh_store, HeuristicCounter(),
                           ContextParams(window=2048, compaction_min_turns=0))
    request = engine.build(thread)
    states = message_states(engine, request)
    assert all(states[i] == "summarized" for i in ids[:10])
    assert states[ids[-1]] == "verbatim"
    assert "dropped" in states.values()  # 40 long turns do not fit 2,048 tokens
    entries = transcript_entries(fresh_store.messages(thread), fresh_store.summaries(thread),
                                 states=states)
    assert all(e.dimmed for e in entries if e.message_id in ids[:10])
    assert not entries[-1].dimmed


def test_meter_parts_are_the_breakdown(fresh_store):
    thread = add_chat(fresh_store, 3)
    engine = ContextEngine(fresh_store, HeuristicCounter(), ContextParams(window=4096))
    b = engine.build(thread, draft="a draft message").breakdown
    parts = {p.name: p.tokens for p in meter_parts(b)}
    assert parts == {"system": b.system, "tools": b.tools, "summary": b.summary,
                     "recall": b.recall, "history": b.history, "draft": b.draft, "free": b.free}
    assert sum(p.fraction for p in meter_parts(b)) == pytest.approx(1.0)


def test_every_setting_has_a_section_and_context_keys_are_together():
    sections = settings_sections()
    listed = [s.key for _, _, items in sections for s in items]
    assert sorted(listed) == sorted(SETTINGS)
    assert sections[0][1] == "Context"
    assert {s.key for s in sections[0][2]} == {k for k in SETTINGS if k.startswith("context.")}


def test_parse_fields_reports_settings_error_per_key(tmp_path):
    base = load_settings(tmp_path / "config.toml", env={})
    candidate, errors = parse_fields(base, {"context.token_budget_ratio": "3",
                                            "context.window": "4096"})
    assert set(errors) == {"context.token_budget_ratio"}
    assert "context.token_budget_ratio" in errors["context.token_budget_ratio"]
    assert "0.1 to 0.95" in errors["context.token_budget_ratio"]
    assert candidate["context.window"] == 4096
    assert changed_keys(base, candidate) == ["context.window"]


def test_env_override_is_locked_with_its_variable(tmp_path):
    base = load_settings(tmp_path / "config.toml", env={"IRIS_CONTEXT_WINDOW": "4096"})
    assert "IRIS_CONTEXT_WINDOW" in locked_reason(base, "context.window")
    assert locked_reason(base, "context.token_budget_ratio") is None
    candidate, _ = parse_fields(base, {"context.window": "2048"})
    assert changed_keys(base, candidate) == []  # a locked key is never written


def test_budget_preview_explains_the_window(fresh_store, tmp_path):
    thread = add_chat(fresh_store, 30, words=60)
    settings = load_settings(tmp_path / "c.toml", env={}).with_overrides(
        {"context.window": "4096", "context.token_budget_ratio": "0.5"})
    preview = budget_preview(fresh_store, Planner.from_settings(settings), thread)
    b = preview.breakdown
    assert b.window == 4096 and b.budget == 2048
    assert b.available == 2048 - b.system - b.tools
    assert preview.dropped_turns > 0 and preview.compaction_due
    text = "\n".join(preview.lines())
    assert "4,096" in text and "2,048" in text and f"available {b.available:,}" in text
    assert "Tool output:" in text and "Red line: 3,072" in text
    assert "Recall: up to 1,536 tokens, once a summary exists" in text
    assert "Counted with an estimate of about 4 characters a token (approximate)" in text


def test_the_counter_is_named_in_words_not_by_its_cache_key():
    assert counter_label("model:2ac093d88508:2:jinja") == "the model's own tokenizer"
    assert counter_label("server:ab12:qwen:fp:chatml") == "the server's tokenizer"
    assert counter_label("server:ab12:estimated:x1.07") == "tiktoken, scaled to the server's counts"
    assert counter_label("tiktoken:cl100k_base") == "tiktoken (cl100k_base)"


def test_budget_preview_says_what_recall_adds_for_the_draft(fresh_store, tmp_path):
    thread = add_chat(fresh_store, 5)
    ids = [r["id"] for r in fresh_store.messages(thread)]
    add_summary(fresh_store, thread, ids[3])
    settings = load_settings(tmp_path / "c.toml", env={}).with_overrides({"context.window": "4096"})
    draft = "What was question 0 about?"
    preview = budget_preview(fresh_store, Planner.from_settings(settings), thread, draft=draft)
    text = "\n".join(preview.lines())
    assert preview.recalled > 0 and preview.breakdown.recall > 0
    assert (f"Recall: {preview.breakdown.recall:,} tokens, {preview.recalled} summarized "
            "message(s) found for the draft") in text
    off = budget_preview(fresh_store, Planner.from_settings(
        settings.with_overrides({"context.recall_max_tokens": "0"})), thread, draft=draft)
    assert "Recall: off" in off.lines() and off.breakdown.recall == 0


def test_inspector_report_lists_the_exact_request(fresh_store, tmp_path):
    thread = add_chat(fresh_store, 5)
    ids = [r["id"] for r in fresh_store.messages(thread)]
    add_summary(fresh_store, thread, ids[3])
    fresh_store.add_request(thread, {"prompt_tokens": 900, "predicted_prompt_tokens": 890,
                                     "window": 4096})
    settings = load_settings(tmp_path / "c.toml", env={}).with_overrides({"context.window": "4096"})
    planner = Planner.from_settings(settings)
    report = inspector_report(fresh_store, planner, thread, draft="next")
    request = planner.plan(fresh_store, thread, "next")
    assert len(report["request"]) == len(request.messages)
    assert report["request"][0]["role"] == "system"
    assert [r["id"] for r in report["request"][1:-1]] == request.included_ids
    assert report["request"][-1]["state"] == "draft"
    assert report["states"]["summarized"] == 4
    assert report["summaries"][0]["turns"] == "1–2"
    assert report["chart"]["values"] == [900]
    assert report["events"][0]["tokens_before"] == 41200


def test_inspector_report_shows_what_recall_adds(fresh_store, tmp_path):
    thread = add_chat(fresh_store, 5)
    ids = [r["id"] for r in fresh_store.messages(thread)]
    add_summary(fresh_store, thread, ids[3])
    settings = load_settings(tmp_path / "c.toml", env={}).with_overrides({"context.window": "4096"})
    planner = Planner.from_settings(settings)
    draft = "What was question 0 about?"  # asks about a summarized message
    report = inspector_report(fresh_store, planner, thread, draft=draft)
    request = planner.plan(fresh_store, thread, draft)
    assert request.recall.ids and report["recalled_ids"] == request.recall.ids
    assert all(i <= ids[3] for i in request.recall.ids)
    # one row for the block, just before the message it travels with, at its exact cost
    assert [r["state"] for r in report["request"][-2:]] == ["recalled", "draft"]
    assert report["request"][-2]["tokens"] == report["breakdown"]["recall"] > 0
    assert sum(r["tokens"] for r in report["request"]) == request.predicted_prompt_tokens
    assert [p.name for p in meter_parts(report["breakdown"])][:4] == [
        "system", "tools", "summary", "recall"]
