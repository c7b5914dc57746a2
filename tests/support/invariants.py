"""The context engine's invariants, checked the same way by every test that builds requests."""

from __future__ import annotations

from iris_desktop.core.engine import ContextEngine, ContextRequest, wire_message
from iris_desktop.core.store import row_to_message


def snapshot(store, thread_id: int) -> list[tuple]:
    return [
        tuple(r.values())
        for r in store.db.query("SELECT * FROM messages WHERE thread_id = ? ORDER BY id", [thread_id])
    ]


def check_request(engine: ContextEngine, request: ContextRequest) -> list[dict]:
    """Assert every invariant of one built request; returns describe()."""
    store = engine.store
    b = request.breakdown
    # the budget is never exceeded
    assert b.summary + b.recall + b.history + b.draft <= b.available, b
    # recall shows only summarized messages, within its cap
    covered_id = request.summary.covers_through_id if request.summary else 0
    assert all(i <= covered_id for i in request.recall.ids)
    assert b.recall <= engine.params.recall_max_tokens
    assert bool(request.recall.ids) == (b.recall > 0)
    rows = store.messages(request.thread_id)
    by_id = {r["id"]: r for r in rows}
    described = engine.describe(request)
    assert [m["id"] for m in described] == [r["id"] for r in rows]
    states = {m["id"]: m["state"] for m in described}
    # chronological order, whole turns
    assert request.included_ids == sorted(request.included_ids)
    included = set(request.included_ids)
    turn_of = {r["id"]: r["turn"] for r in rows}
    for turn in {turn_of[i] for i in included}:
        members = [r["id"] for r in rows if r["turn"] == turn and r["id"] not in request.pinned_ids]
        covered = request.summary.covers_through_id if request.summary else 0
        members = [i for i in members if i > covered]
        assert set(members) <= included, f"turn {turn} is split"
    # the newest turn is present (unless a draft is the newest turn)
    unsummarized = [
        r for r in rows
        if r["id"] not in request.pinned_ids
        and r["id"] > (request.summary.covers_through_id if request.summary else 0)
    ]
    if unsummarized and b.draft == 0:
        newest = max(r["turn"] for r in unsummarized)
        assert all(r["id"] in included for r in unsummarized if r["turn"] == newest)
    # tool call / result pairs are intact
    call_ids_in = set()
    for i in request.included_ids:
        for call in row_to_message(by_id[i]).get("tool_calls") or []:
            call_ids_in.add(call["id"])
    for i in request.included_ids:
        if by_id[i]["role"] == "tool":
            assert by_id[i]["tool_call_id"] in call_ids_in, f"orphaned tool result {i}"
    results_in = {by_id[i]["tool_call_id"] for i in request.included_ids if by_id[i]["role"] == "tool"}
    all_results = {r["tool_call_id"] for r in rows if r["role"] == "tool"}
    assert (call_ids_in & all_results) <= results_in, "a tool call lost its result"
    # pruning never reaches protected turns; a reduced protection is reported
    assert request.protect_turns <= request.configured_protect_turns
    assert request.fallback == (request.protect_turns != request.configured_protect_turns)
    included_turns = sorted({turn_of[i] for i in included}, reverse=True)
    newest_turns = included_turns if b.draft == 0 else [None, *included_turns]
    protected = set(newest_turns[: request.protect_turns])
    for i in request.pruned_ids:
        assert by_id[i]["role"] == "tool"
        assert turn_of[i] not in protected, f"pruned {i} inside a protected turn"
    # dropped only with compaction due, trigger budget
    dropped = [i for i, s in states.items() if s == "dropped"]
    assert bool(dropped) == (request.dropped_turns > 0)
    if dropped:
        assert request.compaction_due and request.trigger == "budget"
        assert not included or max(dropped) < min(included), "a dropped turn is newer"
    # exact accounting: the counter agrees with the breakdown
    counter = engine.counter
    assert counter.count_message(request.messages[0]) + counter.prompt_overhead() == (
        b.system + b.tools + b.summary
    )
    assert sum(counter.count_message(wire_message(m)) for m in request.messages[1:]) == (
        b.history + b.draft + b.recall
    )
    return described
