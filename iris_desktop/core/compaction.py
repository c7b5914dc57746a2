"""Compaction: fold the oldest turns into a chained ConversationSummary.

When (any of):
- ``tokens``: the last request's reported prompt_tokens ≥ window × compaction_threshold;
- ``budget``: the unsummarized history (plus the new message) no longer fits;
- ``turns``: unsummarized turns ≥ compaction_min_turns.

What:
1. split: a verbatim tail ≤ keep_recent_ratio × the trigger line, in whole turns (or, in
   one long turn, at a step boundary after a complete tool call/result), with at most
   half of compaction_min_turns turns, and always the newest turn (or step); the rest is
   archived;
2. input: the previous summary, then the archived messages as dated, named lines (tool
   outputs clipped, empty messages dropped); chunked and folded in order when it does
   not fit the model;
3. generate a ConversationSummary with grammar-constrained JSON (each field described
   by its meaning, list lengths from the cap), capped at summary_max_tokens; the
   extractive summarizer when that fails, times out (summary_timeout_s), is stopped or
   is unusable; a dated fact ledger is added either way;
4. verify (smaller than before, nothing dropped, under the threshold); a summary that
   would not shrink the context is replaced by a shorter extract (an extract can always
   be made shorter than what it replaces) before anything is called failed; commit the
   summary and its event atomically; on failure nothing is saved and the event says why;
   three failures in a row open a circuit breaker. A chat with nothing worth compacting
   yet (everything summarized, one turn, too few tokens for a summary) is a skip that
   says so ("nothing to compact yet"), not a failure;
5. record one telemetry row per event and log it as one line.

Stored messages are never modified or deleted.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from iris_desktop.core.engine import (
    MIN_CLIP_TOKENS,
    ContextEngine,
    ContextRequest,
    ConversationTooLargeException,
    ensure_counts,
    summary_block,
)
from iris_desktop.core.events import (
    ELSEWHERE,
    CompactionEvent,
    CompactionFinished,
    CompactionStarted,
    PromptProgress,
    TurnEvent,
    progress_reporter,
)
from iris_desktop.core.extractive import ExtractiveSummarizer, merge_files, paths_in
from iris_desktop.core.planner import Planner
from iris_desktop.core.ports import ChatModel
from iris_desktop.core.records import Said, fmt_date, said_from_row
from iris_desktop.core.store import MessageMeta, Store, explain, in_flight
from iris_desktop.core.summary import (
    FIELD_MEANINGS,
    FIELDS,
    ConversationSummary,
    SummaryInvalid,
    json_schema,
)
from iris_desktop.generation import GenerationRequest
from iris_desktop.stop import GAVE_WAY, Stop, Stopped, WhenClosing, closing, stop_reason, stopping
from iris_desktop.tokens import Message

log = logging.getLogger("iris.compaction")

BREAKER_FAILURES = 3
#: one process compacts a thread at a time: its lease lasts this many summary timeouts
#: (a chunked summary makes several calls, each with the timeout), and is free at once
#: if the process is gone
LEASE_TIMEOUTS = 4
LEASE_MIN_S = 600.0
#: a tripped breaker lets one attempt through after this many new turns, or this long
BREAKER_COOLDOWN_TURNS = 5
BREAKER_COOLDOWN_S = 600
#: a summary below this cannot hold the eight fields in a sentence each: refuse to compact
MIN_SUMMARY_TOKENS = 48
#: a summary takes at most this share of what it replaces, so compaction always shrinks
MAX_SUMMARY_SHARE = 0.8
#: room kept between the split's arithmetic and the verification build (template edges)
SPLIT_SLACK_TOKENS = 16
#: the LLM writes at least this many tokens (fit() trims to the cap afterwards) ...
MIN_LLM_SUMMARY_TOKENS = 128
#: ... and at most this many, or a quarter of its window: a small model that repeats
#: itself stops in bounded time
MAX_LLM_SUMMARY_TOKENS = 1536
#: slack for the summarizer's own prompt framing beyond the counted instructions
SUMMARIZER_PROMPT_SLACK = 64
#: a chunk smaller than this cannot carry a meaningful part of the conversation
MIN_CHUNK_TOKENS = 128
#: one message larger than a chunk keeps its start: at most this many chars per token
CHARS_PER_TOKEN_CEILING = 3
#: a tool output reaches the summarizer clipped to this many characters
TOOL_OUTPUT_CHARS = 600
TOOL_CALL_CHARS = 200
#: the narrative's share of the summary cap, and English's tokens per word
NARRATIVE_SHARE = 0.5
TOKENS_PER_WORD = 1.3


class CompactionFailed(Exception):
    """A compaction (or the model's part of one) that did not finish. ``why``, for the
    model's part: stopped (the user's Stop) | gave_way (to the user's next message) |
    timed_out (``context.summary_timeout_s``) | failed."""

    def __init__(self, message: str, why: str = "failed") -> None:
        super().__init__(message)
        self.why = why
        #: (the summary of the oldest messages, how many): what extraction had done when
        #: the model's part ended (a fallback goes on from it rather than doing it again)
        self.extracted: tuple[ConversationSummary | None, int] = (None, 0)


def _stopped(cancel: Stop, extracted: ConversationSummary | None, early: int) -> CompactionFailed:
    """The model's part ended by ``cancel``, with what extraction had done before it (the
    summary of the ``early`` oldest messages, when no model part had been read onto it)."""
    reason = stop_reason(cancel)
    failed = CompactionFailed(reason, "gave_way" if reason == GAVE_WAY else "stopped")
    if extracted is not None and early:
        failed.extracted = (extracted, early)
    return failed


class NothingToCompact(CompactionFailed):
    """The chat has nothing worth compacting yet: not a failure (the breaker does not
    count it), and said so."""


class _TooLong(CompactionFailed):
    """The summary would not leave the context smaller (or under the threshold): a
    shorter one may."""


@dataclass
class _Unit:
    """A run of messages that is archived or kept as a whole (a turn, or one step)."""

    metas: list[MessageMeta]
    turn: int


@dataclass
class _Plan:
    """What one compaction archives and keeps, and the arithmetic behind it."""

    archived: list[MessageMeta]
    tail: list[MessageMeta]
    cost: dict[int, int]
    fixed: int  # system + tools
    base: str  # the system prompt the summary is injected into
    old_summary: int
    cap: int = 0
    tools: Any = field(default=None, repr=False)

    @property
    def tokens_before(self) -> int:
        return (self.fixed + self.old_summary + sum(self.cost[m.id] for m in self.archived)
                + sum(self.cost[m.id] for m in self.tail))


class Compactor:
    """Decides when to compact a thread, and does it, with the planner's arithmetic.
    ``runtime`` writes the summaries (the host chooses it, as ``context.summarizer``
    says); None: only the extractive summarizer."""

    def __init__(
        self,
        store: Store,
        planner: Planner,
        runtime: ChatModel | None = None,
        summarizer_window: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        progress: Callable[[PromptProgress], None] | None = None,
    ):
        self.store = store
        self.planner = planner
        self.counter = planner.counter
        self.params = planner.params
        self.settings = planner.compaction
        self.runtime = runtime
        self.summarizer_window = summarizer_window or (runtime.n_ctx if runtime else None)
        self.clock = clock
        #: told how far the model has read each summary prompt (PromptProgress)
        self.progress = progress
        self._thread_id = 0  # the thread being compacted, for the progress events
        self.extractive = ExtractiveSummarizer(self.counter)

    # -- when -----------------------------------------------------------------------------

    def engine(self) -> ContextEngine:
        """The engine without recall: compaction compares what the summary and tail cost
        (recall depends on the next message, and only fills space they leave free)."""
        return self.planner.engine(self.store, recall=False)

    @property
    def trigger_tokens(self) -> int:
        return math.floor(self.params.window * self.params.compaction_threshold)

    def check(self, thread_id: int) -> tuple[str, ContextRequest | None]:
        """The trigger that makes compaction due now ('none' if none), and the planner's
        next request (recall never changes a trigger)."""
        try:
            request = self.planner.plan(self.store, thread_id)
        except ConversationTooLargeException:
            return "budget", None
        return request.trigger, request

    def breaker_open(self, thread_id: int) -> bool:
        """True after BREAKER_FAILURES failed attempts in a row (skips do not count),
        until a cool-down passes: BREAKER_COOLDOWN_TURNS new turns or BREAKER_COOLDOWN_S
        seconds since the last failure. Then it is half-open: one attempt is let through,
        and its failure opens it again for another cool-down."""
        attempts = [e for e in self.store.compaction_events(thread_id)
                    if e["outcome"] in ("ok", "failed")][-BREAKER_FAILURES:]
        if len(attempts) < BREAKER_FAILURES or any(e["outcome"] != "failed" for e in attempts):
            return False
        failed_at = attempts[-1]["created_at"]
        if time.time() - failed_at >= BREAKER_COOLDOWN_S:
            return False
        new_turns = self.store.user_messages_since(thread_id, failed_at)
        return new_turns < BREAKER_COOLDOWN_TURNS

    def before_request(self, thread_id: int, cancel: threading.Event | None = None
                       ) -> Iterator[TurnEvent]:
        """Agent hook: compact first when the next request is due (the planner caches
        that request, so the agent's own plan afterwards costs no second build)."""
        with stopping(cancel):  # a question's rerank in this plan ends at the user's Stop
            trigger, _ = self.check(thread_id)
        if trigger != "none":
            yield from self.run_events(thread_id, trigger, cancel)

    def after_reply(self, thread_id: int, cancel: threading.Event | None = None
                    ) -> Iterator[TurnEvent]:
        """Agent hook (background compaction): compact right after a reply when the next
        request would be due, or would be within one typical turn of the threshold."""
        trigger, request = self.check(thread_id)
        if trigger == "none" and request is not None:
            # the next request adds a turn: compact now if that one would be due
            typical = self._typical_turn_tokens(thread_id)
            floor = self.params.compaction_min_turns
            if request.predicted_prompt_tokens + typical >= self.trigger_tokens or (
                floor and request.unsummarized_turns + 1 >= max(floor, 2)
            ):
                trigger = "early"
        if trigger != "none":
            yield from self.run_events(thread_id, trigger, cancel)

    def run_events(self, thread_id: int, trigger: str, cancel: threading.Event | None = None,
                   force: bool = False) -> Iterator[TurnEvent]:
        """Compact now, reported as CompactionStarted then CompactionFinished."""
        yield CompactionStarted(thread_id, trigger)
        yield CompactionFinished(thread_id, self.compact(thread_id, trigger, force, cancel))

    def _typical_turn_tokens(self, thread_id: int) -> int:
        rows = self.store.requests(thread_id)[-4:]
        prompts = [r["prompt_tokens"] for r in rows if r["prompt_tokens"]]
        growth = [b - a for a, b in zip(prompts, prompts[1:]) if b > a]
        return int(sum(growth) / len(growth)) if growth else 0

    # -- what -----------------------------------------------------------------------------

    def compact(self, thread_id: int, trigger: str = "manual", force: bool = False,
                cancel: threading.Event | None = None) -> CompactionEvent:
        """Compact now. Returns the event (also stored). Never raises for a failed summary,
        nor for a database that refuses its writes (a full disk): the event, not stored,
        says so in the store's words (before, a full disk after a reply failed the turn
        whose reply was saved). ``cancel`` (the user's Stop) ends a model-written summary
        early: the extractive summary is used instead, so the context still shrinks."""
        started = self.clock()
        if not force and self.breaker_open(thread_id):
            return self._skip(
                thread_id, trigger, f"circuit breaker open: the last {BREAKER_FAILURES} "
                f"compactions failed; it tries again after {BREAKER_COOLDOWN_TURNS} more turns "
                f"or {BREAKER_COOLDOWN_S // 60} minutes, or now with Compact now "
                "('iris-desktop compact')")
        seen = self.store.latest_summary(thread_id)
        token = uuid.uuid4().hex
        lease_s = max(LEASE_MIN_S, LEASE_TIMEOUTS * self.settings.timeout_s)
        try:
            holder = self.store.take_compaction_lease(thread_id, token, lease_s)
        except sqlite3.OperationalError as exc:  # a full disk: nothing can be kept now
            return self._unsaved(thread_id, CompactionEvent(trigger), exc)
        if holder is not None:
            since = time.strftime("%H:%M:%S", time.localtime(holder["acquired_at"]))
            return self._skip(thread_id, trigger, f"{ELSEWHERE} (pid {holder['pid']}) "
                              f"has been compacting this thread since {since}; this one "
                              "skipped, and uses its summary once it is saved")
        try:
            latest = self.store.latest_summary(thread_id)
            if not force and (latest and latest.id) != (seen and seen.id):
                return self._skip(thread_id, trigger, f"{ELSEWHERE} compacted this "
                                  "thread just now; its summary is used")
            event, record = CompactionEvent(trigger), None
            self._thread_id = thread_id
            head = self.store.head(thread_id)  # the branch it compacts (one may be switched to)
            try:
                event, record = self._compact(
                    thread_id, trigger, cancel,
                    renew=lambda: self.store.take_compaction_lease(thread_id, token, lease_s))
            except NothingToCompact as exc:
                # (in brackets: the window's sentence ends "…not summarized: {error}.")
                event = CompactionEvent(trigger, "skipped", error=f"nothing to compact yet ({exc})")
            except CompactionFailed as exc:
                event.error = str(exc)
                if closing(cancel):  # not a failure: the next start compacts again
                    event.outcome = "skipped"
            except sqlite3.Error as exc:  # a full disk, a write lock held: the store's words
                event.error = explain(exc, self.store.path)
                log.warning("compaction failed: %s", event.error)
            except Exception as exc:  # a bug must not lose history either: record and go on
                log.exception("compaction crashed")
                event.error = f"{type(exc).__name__}: {exc}"
            event.duration_s = round(self.clock() - started, 3)
            self._save(thread_id, event, record, head)
        finally:  # (one the disk refuses to delete is this process's to take over)
            self.store.release_compaction_lease(thread_id, token)
        log.info("compaction thread=%s %s", thread_id, event.describe())
        return event

    def _save(self, thread_id: int, event: CompactionEvent, record: dict | None = None,
              head: int | None = None) -> CompactionEvent:
        """Store ``event`` with the summary ``record`` it made, atomically (``head``: the
        branch it compacted; None: the thread's active one). A database that refuses the
        write (a full disk, another process's write lock) keeps neither: :meth:`_unsaved`;
        a chat deleted meanwhile raises, as a turn says it (IntegrityError)."""
        try:
            with self.store.transaction():
                if record is not None:
                    event.summary_id = self.store.add_summary(thread_id, record)
                event.id = self.store.add_compaction_event(thread_id, {**event.row(),
                                                                       "head_id": head})
        except sqlite3.OperationalError as exc:
            return self._unsaved(thread_id, event, exc)
        return event

    def _unsaved(self, thread_id: int, event: CompactionEvent, exc: sqlite3.Error
                 ) -> CompactionEvent:
        """``event``, which the database refused to store (a full disk): a compaction that
        had worked failed (its summary is not kept), in the store's words; a failure or
        a skip keeps its own reason."""
        event.id = event.summary_id = None
        why = explain(exc, self.store.path)
        if event.outcome == "ok" or not event.error:
            event.outcome, event.error = "failed", why
        log.warning("compaction thread=%s not recorded: %s", thread_id, why)
        return event

    def _skip(self, thread_id: int, trigger: str, why: str) -> CompactionEvent:
        """A compaction that did not run, recorded and logged (a skip is not a failure:
        the circuit breaker does not count it)."""
        log.warning("compaction thread=%s skipped: %s", thread_id, why)
        return self._save(thread_id, CompactionEvent(trigger, "skipped", error=why))

    def _compact(self, thread_id: int, trigger: str, cancel: threading.Event | None = None,
                 renew: Callable[[], object] | None = None) -> tuple[CompactionEvent, dict]:
        """(the event, the summary record to commit with it); raises CompactionFailed.
        ``renew`` extends the lease before each model call of a chunked summary."""
        previous_row = self.store.latest_summary(thread_id)
        previous = ConversationSummary.from_fields(previous_row.fields) if previous_row else None
        plan = self._plan(thread_id, previous_row)
        rows = self.store.messages_by_id([m.id for m in plan.archived])
        said = [said_from_row(rows[m.id]) for m in plan.archived]
        try:  # extraction of a long chat takes seconds: a close does not wait for it
            with stopping(WhenClosing(cancel)):
                summary, path, note, fallback, early_last = self._summarize(
                    previous, said, plan.archived, plan.cap, cancel, renew)
        except Stopped as exc:
            raise CompactionFailed(str(exc), "stopped") from None
        cap = plan.cap
        while True:  # a summary too long for the context to shrink: a shorter extract
            record = self._record(plan, previous_row, summary, path)
            try:
                tokens_after = self._verify(thread_id, record, plan.tokens_before)
                break
            except _TooLong as exc:
                cap //= 2
                if cap < MIN_SUMMARY_TOKENS:
                    raise CompactionFailed(f"{exc}, even with a summary of {cap * 2:,} tokens") from None
                turns = (plan.archived[0].turn, plan.archived[-1].turn)
                if path != "extractive":  # the model's summary did not save room
                    fallback, early_last = "too_long", None
                summary, path = self.extractive.summarize(previous, said, cap, turns), "extractive"
                note = "; ".join(filter(None, [note, f"{exc}: a shorter extractive summary "
                                                     f"({cap:,} tokens at most) used"]))
        event = CompactionEvent(
            trigger, "ok", path=path, turns_archived=len({m.turn for m in plan.archived}),
            messages_archived=len(plan.archived), tokens_before=plan.tokens_before,
            tokens_after=tokens_after, kept_turns=len({m.turn for m in plan.tail}),
            # the turns this run summarized (the summary row keeps the chain's first turn:
            # "turns 1–177 (8 messages)" was said of a second compaction of turns 174–177)
            summary_tokens=record["tokens"], error=note, first_turn=plan.archived[0].turn,
            last_turn=record["last_turn"], fallback=fallback, extracted_last_turn=early_last)
        return event, record

    def _record(self, plan: _Plan, previous_row: Any, summary: ConversationSummary,
                path: str) -> dict:
        """The summary row that would be committed for ``plan``."""
        text = summary.render()
        summary_tokens = self.engine().system_costs(plan.base, plan.tools.text,
                                                    summary_block(text))[2]
        return {
            "prev_id": previous_row.id if previous_row else None,
            "first_message_id": plan.archived[0].id,
            "covers_through_id": plan.archived[-1].id,
            "first_turn": previous_row.first_turn if previous_row else plan.archived[0].turn,
            "last_turn": plan.archived[-1].turn,
            "fields": summary.as_fields(),
            "text": text,
            "tokens": summary_tokens,
            "counter": self.counter.name,
            "path": path,
        }

    def _plan(self, thread_id: int, previous_row: Any) -> _Plan:
        """Split the unsummarized history into archived and kept, and size the summary:
        at most ``summary_max_tokens``, MAX_SUMMARY_SHARE of what it replaces, and what the
        budget leaves beside the kept tail."""
        engine = self.engine()
        tools = self.planner.tool_prompt()
        frame = engine.frame(thread_id, tools.text, tools.native_tokens)
        metas = [m for m in ensure_counts(
            self.store, self.counter,
            self.store.meta_range(thread_id, self.counter.name, after_id=frame.lower_id))]
        if not metas:
            raise NothingToCompact("every message is already summarized")
        plan = _Plan([], [], engine.request_costs(metas), frame.system_tokens + frame.tool_tokens,
                     engine.base_system(thread_id)[1],
                     frame.summary_tokens, tools=tools)
        # a split inside the newest turn keeps that turn's request verbatim (the engine's
        # anchor), so its cost is held back from the tail's share; when it cannot fit
        # beside the tail and a summary, the engine leaves it out, and so does this plan
        task = _newest_task(metas)
        tail = self._fit_tail(plan, metas, task)
        waiting = in_flight(metas)
        if self._summary_room(plan, tail) < MIN_SUMMARY_TOKENS and waiting:
            # the results the model waits on are sent shortened to what is left beside
            # the summary (the engine clips them): counted whole, a large one left no
            # room for any summary, so compaction failed at every step, the breaker
            # opened, and the turns before it were dropped unsummarized (an audit)
            for meta in waiting:
                plan.cost[meta.id] = min(plan.cost[meta.id], MIN_CLIP_TOKENS)
            tail = self._fit_tail(plan, metas, task)
        if not plan.archived:
            raise NothingToCompact("the unsummarized history is one step of one turn, which is kept")
        replaced = plan.old_summary + sum(plan.cost[m.id] for m in plan.archived)
        plan.cap = min(self.settings.summary_max_tokens, int(replaced * MAX_SUMMARY_SHARE),
                       self._summary_room(plan, tail))
        if int(replaced * MAX_SUMMARY_SHARE) < MIN_SUMMARY_TOKENS:
            raise NothingToCompact(f"the turns before the newest hold only {replaced:,} tokens, "
                                   "fewer than a summary of them would take")
        if plan.cap < MIN_SUMMARY_TOKENS:
            budget = math.floor(self.params.window * self.params.token_budget_ratio)
            raise CompactionFailed(
                f"no room for a summary: the kept tail needs {tail:,} of the "
                f"{budget - plan.fixed:,} tokens the {budget:,}-token budget leaves after the "
                f"system prompt and tools ({plan.fixed:,})")
        return plan

    def _fit_tail(self, plan: _Plan, metas: list[MessageMeta], task: MessageMeta | None) -> int:
        """Split ``plan`` into archived and tail (see :meth:`_plan`); the tail's tokens."""
        for anchor in ([plan.cost[task.id]] if task is not None else []) + [0]:
            plan.archived, plan.tail = self._split(metas, plan.cost, plan.fixed + anchor)
            tail = sum(plan.cost[m.id] for m in plan.tail)
            if anchor and task in plan.archived:
                tail += anchor
            if self._summary_room(plan, tail) >= MIN_SUMMARY_TOKENS:
                break
        return tail

    def _summary_room(self, plan: _Plan, tail: int) -> int:
        """What the budget leaves for the summary beside the fixed part and the tail."""
        budget = math.floor(self.params.window * self.params.token_budget_ratio)
        return budget - plan.fixed - tail - SPLIT_SLACK_TOKENS

    def _split(self, metas: list[MessageMeta], cost: dict[int, int], fixed: int):
        """(archived, tail): the largest allowed tail within the bounds."""
        units = _units(metas)
        bound = min(
            self.settings.keep_recent_ratio * self.trigger_tokens,
            self.params.window * self.params.token_budget_ratio - fixed
            - self.settings.summary_max_tokens,
        )
        # half the count floor: the `turns` trigger then fires again only after as many new
        # turns, instead of on the very next one (a tail of floor − 1 turns would do that)
        floor = self.params.compaction_min_turns
        max_turns = max(floor // 2, 1) if floor else None
        chosen = len(units) - 1  # at least the newest unit is kept
        spent = 0
        turns: set[int] = set()
        for start in range(len(units) - 1, 0, -1):
            spent += sum(cost[m.id] for m in units[start].metas)
            turns.add(units[start].turn)
            if spent > bound or (max_turns is not None and len(turns) > max_turns):
                break
            chosen = start
        archived = [m for u in units[:chosen] for m in u.metas]
        tail = [m for u in units[chosen:] for m in u.metas]
        return archived, tail

    def _summarize(self, previous, said, archived, cap, cancel=None, renew=None):
        """(summary, path, note, fallback, early_last): the LLM when it works, else
        extractive; facts added. ``fallback``: why the model's summary was not used
        (``CompactionFailed.why``, or unusable); ``early_last``: the last turn of the
        oldest ones summarized by extraction beside the model's parts."""
        turns = (archived[0].turn, archived[-1].turn)
        note = fallback = None
        if self.runtime is not None:
            try:
                summary, chunks, early = self._llm_summary(previous, said, archived, cap,
                                                           cancel, renew)
                summary.facts = list(previous.facts) if previous else []
                # the chat's first facts open the ledger, whoever wrote the fields
                summary.first_facts = previous.first_facts if previous else 0
                # files must survive a chain even when the model drops them; the newest
                # first (the oldest went last: once 24 were kept, no new file got in)
                summary.relevant_files = merge_files(
                    summary.relevant_files, paths_in(said),
                    previous.relevant_files if previous else [], limit=24)
                summary = self.extractive.fill_facts(summary, said, cap, opening=previous is None)
                early_last = archived[early - 1].turn if early else None
                if early:
                    note = (f"turns {turns[0]}–{early_last} summarized by "
                            f"extraction: the model reads at most {self.settings.max_parts} "
                            f"{'part' if self.settings.max_parts == 1 else 'parts'} at once "
                            "(context.summary_max_parts)")
                return summary, ("chunked" if chunks > 1 else "llm"), note, None, early_last
            except (SummaryInvalid, CompactionFailed) as exc:
                if closing(cancel):  # nothing more is done: the next start compacts again
                    raise CompactionFailed(stop_reason(cancel), "stopped") from None
                note = (f"the model's summary could not be used ({exc}); one made of the chat's "
                        "own sentences was used instead")
                fallback = exc.why if isinstance(exc, CompactionFailed) else "unusable"
                done, early = exc.extracted if isinstance(exc, CompactionFailed) else (None, 0)
                if done is not None:  # the oldest messages are extracted: go on from them
                    previous, said, turns = done, said[early:], (archived[early].turn, turns[1])
            except Stopped:  # Iris is closing (WhenClosing): nothing more is done
                raise
            except Exception as exc:  # the model failed; the extractive path still works
                note = (f"the model's summary failed ({type(exc).__name__}: {exc}); one made of the "
                        "chat's own sentences was used instead")
                fallback = "failed"
            log.warning("compaction: %s", note)
        summary = self.extractive.summarize(previous, said, cap, turns)
        return summary, "extractive", note, fallback, None

    def _llm_summary(self, previous, said, archived, cap, cancel=None, renew=None
                     ) -> tuple[ConversationSummary, int, int]:
        """(summary, model calls, how many of the oldest messages the extractive summary
        took instead). The model writes the eight fields as grammar-constrained JSON,
        part by part, each fold chained on the last. A deadline
        (``context.summary_timeout_s``) and ``cancel`` act within about half a second,
        also during prompt evaluation."""
        runtime = self.runtime
        window = self.summarizer_window or 4096
        # generation may run past the cap: fit() trims the rendering to it afterwards
        llm_cap = min(max(MIN_LLM_SUMMARY_TOKENS, cap), MAX_LLM_SUMMARY_TOKENS, window // 4)
        schema = json_schema(cap)
        instructions = summary_instructions(cap)

        def parts_of(start, base):  # (the said index of each line, the parts)
            numbered = _numbered_lines(said[start:])
            return [start + i for i, _ in numbered], list(self._chunks(
                [line for _, line in numbered], base, window, llm_cap, instructions))

        summary, early = previous, 0
        owners, parts = parts_of(0, previous)
        limit = self.settings.max_parts
        while limit and len(parts) > limit:  # the oldest parts: extracted, not read
            early = owners[sum(len(part) for part in parts[:-limit])]
            summary = self.extractive.summarize(previous, said[:early], cap,
                                                (archived[0].turn, archived[early - 1].turn))
            owners, parts = parts_of(early, summary)
        clock = self.clock
        began = clock()
        for number, chunk in enumerate(parts, 1):
            if cancel is not None and cancel.is_set():  # Stop while extracting, or between parts
                raise _stopped(cancel, summary if number == 1 else None, early)
            if renew is not None and number > 1:
                renew()
            # each call gets the whole timeout: a long import's first compaction folds
            # several parts, and is slow for its size, not stuck
            deadline = time.monotonic() + self.settings.timeout_s
            per_part = (clock() - began) / (number - 1) if number > 1 else None
            report = None if self.progress is None else progress_reporter(
                self.progress, self._thread_id, "summary", clock, number, len(parts), per_part)
            generation = runtime.stream(GenerationRequest(
                _summary_prompt(summary, chunk, instructions), max_tokens=llm_cap,
                temperature=0.0, cancel=cancel, json_schema=schema, repeat_penalty=1.15,
                deadline=deadline, progress=report))
            text = "".join(generation)
            stats = generation.stats
            if stats is not None and stats.finish_reason == "cancelled":
                if cancel is not None and cancel.is_set():
                    raise _stopped(cancel, summary if number == 1 else None, early)
                timed_out = CompactionFailed(
                    f"timed out after {self.settings.timeout_s:.0f} s (part {number})", "timed_out")
                if number == 1 and early:  # the fallback goes on from the extracted turns
                    timed_out.extracted = (summary, early)
                raise timed_out
            cut = stats is not None and stats.finish_reason == "length"
            summary = ConversationSummary.parse(text, cut=cut)
        if summary is None:
            raise CompactionFailed("no input to summarize")
        return summary, len(parts), early

    def _chunks(self, lines: list[str], previous, window: int, llm_cap: int,
                instructions: str) -> Iterator[list[str]]:
        """Transcript lines in groups that fit the summarizer's window with the previous
        summary, the instructions and the reply: the compaction call never overflows."""
        overhead = self.counter.count_message({"role": "system", "content": instructions})
        overhead += self.counter.prompt_overhead() + SUMMARIZER_PROMPT_SLACK
        prior = self.counter.count_text(previous.render()) if previous else 0
        # the previous summary of a later chunk is at most llm_cap (plus its facts)
        room = window - overhead - llm_cap - max(prior, llm_cap) - SPLIT_SLACK_TOKENS
        if room < MIN_CHUNK_TOKENS:
            raise CompactionFailed(f"the model's window ({window}) is too small to summarize")
        chunk: list[str] = []
        used = 0
        for line in lines:
            size = self.counter.count_text(line) + 1
            if size > room:  # one giant message: keep its start, it is cleared anyway
                line = line[: room * CHARS_PER_TOKEN_CEILING] + " …"
                size = self.counter.count_text(line) + 1
            if chunk and used + size > room:
                yield chunk
                chunk, used = [], 0
            chunk.append(line)
            used += size
        if chunk:
            yield chunk

    def _verify(self, thread_id: int, record: dict, tokens_before: int) -> int:
        """Build the next request with the new summary in place (rolled back): it must be
        smaller than before, drop nothing and stay under the threshold."""
        with self.store.trial():
            self.store.add_summary(thread_id, record)
            try:
                request = self.planner.plan(self.store, thread_id, recall=False, cache=False)
            except ConversationTooLargeException as exc:
                raise CompactionFailed(f"still too large after compaction: {exc}") from None
        after = request.predicted_prompt_tokens
        if request.dropped_turns:
            b = request.breakdown
            n = request.dropped_turns
            raise CompactionFailed(
                f"{n} turn{'s' if n != 1 else ''} would still be dropped after compaction: "
                f"with the new summary ({b.summary:,} tokens) the history budget is "
                f"{b.available - b.summary:,} tokens, and the newer turns take {b.history:,} "
                f"of it")
        # a shortened in-flight result fills what is left by design: growth is then only
        # the result getting more room, and the check is the threshold's
        if after >= tokens_before and not request.clipped_ids:
            raise _TooLong(
                f"compaction would not shrink the context ({tokens_before} → {after} tokens)")
        if after >= self.trigger_tokens:
            raise _TooLong(
                f"the context would stay above the threshold ({after} ≥ {self.trigger_tokens})")
        return after


def _newest_task(metas: list[MessageMeta]) -> MessageMeta | None:
    """The user message that opens the newest turn, if it is among ``metas``."""
    if not metas:
        return None
    newest = [m for m in metas if m.turn == metas[-1].turn]
    return newest[0] if newest[0].role == "user" else None


def _units(metas: list[MessageMeta]) -> list[_Unit]:
    """Whole turns; the newest turn is split further at step boundaries (after a complete
    tool call/result group), so one long agent turn can still be compacted."""
    turns: list[_Unit] = []
    for meta in metas:
        if not turns or meta.turn != turns[-1].turn:
            turns.append(_Unit([], meta.turn))
        turns[-1].metas.append(meta)
    if not turns:
        return []
    newest = turns.pop()
    steps: list[_Unit] = [_Unit([], newest.turn)]
    for i, meta in enumerate(newest.metas):
        previous = newest.metas[i - 1] if i else None
        if meta.role == "assistant" and previous is not None and previous.role == "tool":
            steps.append(_Unit([], newest.turn))
        steps[-1].metas.append(meta)
    return [*turns, *steps]


def _transcript_lines(said: list[Said]) -> list[str]:
    """The summarizer's input, one line per message: '[date] Speaker: text', the date
    when it changes. Tool outputs come clipped (what a tool found survives even when the
    assistant never restated it); empty messages are dropped."""
    return [line for _, line in _numbered_lines(said)]


def _numbered_lines(said: list[Said]) -> list[tuple[int, str]]:
    """The transcript's lines, each with the index in ``said`` of its message."""
    lines: list[tuple[int, str]] = []
    current = None
    for index, message in enumerate(said):
        text = " ".join(message.text.split())
        if message.role == "tool":
            text = _clip(text, TOOL_OUTPUT_CHARS) or "(no output)"
        for call in message.calls:
            text += f" [calls {_clip(call, TOOL_CALL_CHARS)}]"
        if not text.strip():
            continue
        date = fmt_date(message.date) if message.date else None
        prefix = f"[{date}] " if date and date != current else ""
        current = date or current
        lines.append((index, f"{prefix}{message.speaker}: {text.strip()}"))
    return lines


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def summary_instructions(cap: int) -> str:
    """What the model is told: each field with its meaning, and a narrative length the
    token cap allows (150–300 words at the default cap)."""
    words = max(40, min(300, int(cap * NARRATIVE_SHARE / TOKENS_PER_WORD)))
    lower = min(150, max(30, words // 2))
    fields = "\n".join(f"- {name}: {FIELD_MEANINGS[name]}"
                        + (f" ({lower}-{words} words)" if name == "summary" else "")
                        for name in FIELDS)
    return (
        "You keep the running summary of a long conversation. You get the previous "
        "summary (JSON, or none) and the next part of the conversation, one message per "
        "line as 'Speaker: text', with '[date]' where a new day starts. Write ONE updated "
        "summary as a JSON object with these fields:\n" + fields + "\n"
        "Rules: keep every name, date, number, place and file path exactly as written; say "
        "who did what and when; carry over from the previous summary what still matters, "
        "because the new summary replaces it; write lists as short items."
    )


def _summary_prompt(previous: ConversationSummary | None, chunk: list[str],
                    instructions: str) -> list[Message]:
    prior = json.dumps({k: v for k, v in previous.as_fields().items()
                        if k not in ("facts", "first_facts")},
                       ensure_ascii=False) if previous else "(none)"
    body = f"Previous summary:\n{prior}\n\nNext part of the conversation:\n" + "\n".join(chunk)
    return [
        {"role": "system", "content": instructions},
        {"role": "user", "content": body},
    ]
