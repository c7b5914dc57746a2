"""What a turn in a long chat changes in the window's views, read as the turn and not as
the whole chat (a 50,000-message chat read ~150,000 rows and froze the window for
0.4-0.8 s after every send):

* :func:`tail_since`: the transcript entries from the newest user message loaded before
  onwards, when the branch is the one loaded then (:func:`tail_holds`: that message still
  on it, no summary made since); otherwise the window reads its newest page again
  (:mod:`.pages`).
* :func:`states_since`: each message's state in the next request, reading only the
  messages whose state can have changed since the states computed before; all of them
  (``describe``) after a compaction, a branch change or in another chat.

Both run on the DB thread, take a Store and return plain data; no Qt here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from iris_desktop.core.views import load_transcript, message_states

#: a tail this long (messages written elsewhere meanwhile) reads the branch points at once
_FEW = 64


@dataclass(frozen=True)
class Loaded:
    """What the transcript shows of a thread: where a tail read starts (the newest user
    message shown, whose turn is read again) and the summaries its dividers show."""

    thread_id: int
    anchor: int | None
    summaries: tuple[int, ...]


def anchor_of(entries: Sequence[Any]) -> int | None:
    """The newest user message among ``entries`` (where a tail read starts again)."""
    return next((e.message_id for e in reversed(entries) if e.kind == "message" and e.role == "user"), None)


def tail_holds(store: Any, thread_id: int, loaded: Loaded | None, summaries: Sequence[Any]) -> bool:
    """Whether ``loaded`` is this thread's and still holds (``summaries``: the thread's
    now): its anchor on the active branch (so everything before it is as loaded: a branch
    is one chain) and the same summaries, none covering the anchor."""
    return not (loaded is None or loaded.thread_id != thread_id or loaded.anchor is None
                or loaded.summaries != tuple(s.id for s in summaries)
                or any(s.covers_through_id >= loaded.anchor for s in summaries)
                or not store.on_path(thread_id, [loaded.anchor]))


def tail_since(store: Any, thread_id: int, loaded: Loaded) -> list:
    """The entries from ``loaded``'s anchor on (it holds: :func:`tail_holds`): its turn
    again (the reply that can be regenerated, the last that can be continued, a
    regenerated reply's alternatives) and what came after."""

    def points(rows: list[dict[str, Any]]) -> dict[int, tuple[int, int]]:
        if len(rows) > _FEW:
            return store.branch_points(thread_id)
        found = {}  # (same thread, same parent, same role: branch_points' groups)
        for row in rows:
            alternatives = store.alternatives(row["id"])
            if len(alternatives) > 1:
                found[row["id"]] = (alternatives.index(row["id"]) + 1, len(alternatives))
        return found

    return load_transcript(store, thread_id, loaded.anchor - 1, points)


# -- states --------------------------------------------------------------------------------


class States(dict):
    """message id → state. Held: the messages read (a turn's, a streaming reply); any
    other message of the branch has ``rule``'s state, asked with :meth:`get` (a message's
    state follows from the request's id sets, so opening a 50,000-message chat no longer
    reads every message's row for it: 0.3 s on the DB thread and a collection that stalled
    the window). ``changed``: those that changed since the states before (None: any may
    have: compare them all)."""

    changed: dict[int, str] | None = None
    rule: _Sets | None = None

    def get(self, mid: Any, default: Any = None) -> Any:
        if dict.__contains__(self, mid):
            return dict.__getitem__(self, mid)
        if self.rule is not None and isinstance(mid, int):
            return self.rule.state(mid, False)
        return default

    def whole(self) -> States:
        """The same states, said as all of them (``changed`` None)."""
        out = States(self)
        out.rule = self.rule
        return out


@dataclass(frozen=True)
class StatesBasis:
    """The states computed last, and what they were computed from."""

    thread_id: int
    summary_id: int | None
    head: int
    planned: int
    marked: frozenset[int]  # the request's included, pruned, clipped and pinned messages
    streaming: frozenset[int]
    states: States


def _marked(request: Any) -> frozenset[int]:
    return frozenset((*request.included_ids, *request.pruned_ids, *request.clipped_ids,
                      *request.pinned_ids))


@dataclass(frozen=True)
class _Sets:
    """A request's ids as sets, and its planned head and summary's reach."""

    pinned: frozenset[int]
    pruned: frozenset[int]
    clipped: frozenset[int]
    included: frozenset[int]
    planned: int
    covered: int

    @classmethod
    def of(cls, request: Any) -> _Sets:
        return cls(frozenset(request.pinned_ids), frozenset(request.pruned_ids),
                   frozenset(request.clipped_ids), frozenset(request.included_ids),
                   request.head_id if request.head_id is not None else 2**62,
                   request.summary.covers_through_id if request.summary else 0)

    def state(self, mid: int, streaming: bool) -> str:
        """``ContextEngine.describe``'s state of one message."""
        if mid in self.pinned or mid > self.planned or streaming:
            return "verbatim"
        if mid in self.pruned:
            return "pruned"
        if mid in self.clipped:
            return "clipped"
        if mid in self.included or mid > self.covered:
            return "verbatim" if mid in self.included else "dropped"
        return "summarized"


def states_since(engine: Any, request: Any, basis: StatesBasis | None) -> tuple[States, StatesBasis | None]:
    """(states, the basis for the next call) for ``request``. With a ``basis`` of the same
    thread and summary whose head is still on the active branch, only the messages after
    the older of the two planned heads (and any streaming then) are read: every other
    message's state can change only by joining or leaving a request (its ids are known)."""
    store, tid = engine.store, request.thread_id
    head = store.head(tid) if tid > 0 else None
    summary_id = request.summary.id if request.summary else None
    sets = _Sets.of(request)
    if head is None or request.head_id is None:
        states = States(message_states(engine, request))
        return states, None
    if (basis is None or basis.thread_id != tid or basis.summary_id != summary_id
            or not store.on_path(tid, [basis.head])):
        streaming = frozenset(store.on_path(tid, store.streaming_ids(tid)))
        states = States({mid: "verbatim" for mid in streaming})
    else:
        low = min(basis.planned, sets.planned, basis.head, *basis.streaming)
        metas = store.meta_range(tid, engine.counter.name, head, after_id=low - 1)
        read = {m.id: sets.state(m.id, m.status == "streaming") for m in metas}
        for mid in (basis.marked | _marked(request)):
            if mid < low:
                read[mid] = sets.state(mid, False)
        # (a message below ``low`` that neither request marks has the state the summary
        # gives it under both rules: only those read can have changed)
        states = States(read)
        states.changed = {k: v for k, v in read.items() if basis.states.get(k) != v}
        streaming = frozenset(m.id for m in metas if m.status == "streaming")
    states.rule = sets
    return states, StatesBasis(tid, summary_id, head, sets.planned, _marked(request), streaming, states)
