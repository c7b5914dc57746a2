"""The context engine: what the model sees next, and why.

One request is built in this order (seed 1 and ADR-0079 as one design):

1. ``TokenBudgetCalculator``: available = window × token_budget_ratio − system − tools.
2. The latest summary (if any) is injected into the system prompt and paid from
   ``available``; the rest is the history budget.
3. Tool-output pruning: tool results outside the newest ``prune_protect_turns`` turns are
   replaced by ``[Tool output cleared]`` *in the request only*.
4. Budget-based loading: whole turns, newest first, until the next one does not fit; then
   back to chronological order. The newest turn is always included.
5. The invariant: no turn leaves the request unless a summary covers it. A turn that does
   not fit is marked ``dropped`` and the request says ``compaction_due`` (trigger
   ``budget``); compaction makes that state unreachable.
6. Progressive truncation: when the summary plus the protected turns do not fit, the
   protection shrinks (configured → 1 → 0); when even the newest turn with every tool
   output cleared does not fit, :class:`ConversationTooLargeException`.
7. Recall (``core.recall``): once a summary exists, the summarized messages that best
   match the newest user message are shown with it, dated, in the space the history
   left free (at most ``recall_max_tokens``). It never displaces verbatim history.

Building a request never writes messages; it only fills the token-count cache.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from itertools import islice
from typing import Any

from iris_desktop.core.config import ContextParams
from iris_desktop.core.counts import ensure_counts, wire_message  # noqa: F401 (imported from here)
from iris_desktop.core.ports import Reranker
from iris_desktop.core.prompt_vars import filled
from iris_desktop.core.recall import RankingCache, Recall, Recaller, SemanticSearch, attach
from iris_desktop.core.records import day_of, names_relative_date
from iris_desktop.core.store import (
    MessageMeta,
    Store,
    SummaryRow,
    in_flight,
    min_tokens,
    row_to_message,
    utf8_length,
)
from iris_desktop.tokens import Message, TokenCounter

PRUNED_PLACEHOLDER = "[Tool output cleared]"
SUMMARY_HEADER = "## Summary of the earlier conversation"
STATES = ("verbatim", "pruned", "clipped", "summarized", "dropped")
#: an in-flight tool result is never clipped below this (it would say nothing)
MIN_CLIP_TOKENS = 64
CLIP_MARKER = ("\n[… output shortened for the model: {shown:,} of {total:,} characters shown; "
               "the full output is stored]")
TRIGGERS = ("none", "tokens", "budget", "turns")
#: the shortest summary compaction writes (``compaction.MIN_SUMMARY_TOKENS``, which imports this)
SHORTEST_SUMMARY = 48
#: a thread's own system messages are looked for among its first this many messages
PINNED_LOOKAHEAD = 8
#: messages read per batch while walking a thread newest-first
_BATCH = 128


def _tokens(n: int) -> str:
    """``n`` tokens in words: "1 token", "1,043 tokens"."""
    return f"{n:,} token{'' if n == 1 else 's'}"


class ConversationTooLargeException(Exception):
    """Even the newest turn, with every tool output cleared, does not fit the budget."""

    def __init__(self, message: str, needed: int, allowed: int, about: str = "turn"):
        super().__init__(message)  # about: "turn", or "frame" (the fixed parts fill the budget)
        self.needed, self.allowed, self.about = needed, allowed, about


@dataclass
class Breakdown:
    """Where the window goes. The GUI's meter draws exactly these numbers."""

    window: int
    ratio: float
    budget: int  # floor(window × ratio)
    system: int  # system prompt + template framing (BOS, generation prompt)
    tools: int
    summary: int
    history: int  # the included history turns, draft excluded
    draft: int
    available: int  # budget − system − tools
    threshold: int  # floor(window × compaction_threshold)
    recall: int = 0  # recalled summarized messages, shown with the newest user message

    @property
    def used(self) -> int:
        return self.system + self.tools + self.summary + self.recall + self.history + self.draft

    @property
    def free(self) -> int:
        return self.window - self.used

    def as_dict(self) -> dict[str, int | float]:
        return {**asdict(self), "used": self.used, "free": self.free}


class TokenBudgetCalculator:
    """available = window × ratio − system − tools."""

    def __init__(self, window: int, ratio: float, threshold: float):
        self.window = window
        self.ratio = ratio
        self.threshold = threshold

    @property
    def budget(self) -> int:
        return math.floor(self.window * self.ratio)

    def available(self, system: int, tools: int) -> int:
        return self.budget - system - tools

    def breakdown(
        self, system: int, tools: int, summary: int, history: int, draft: int, recall: int = 0
    ) -> Breakdown:
        return Breakdown(
            window=self.window,
            ratio=self.ratio,
            budget=self.budget,
            system=system,
            tools=tools,
            summary=summary,
            history=history,
            draft=draft,
            available=self.available(system, tools),
            threshold=math.floor(self.window * self.threshold),
            recall=recall,
        )


@dataclass
class Turn:
    """One user message plus everything up to the next user message.

    A draft (the message about to be sent) is a turn of its own with ``extra`` tokens.
    """

    number: int
    messages: list[MessageMeta] = field(default_factory=list)  # chronological
    extra: int = 0

    def cost(self, pruned: bool, pruned_cost: dict[int, int], keep: set[int],
             clipped: dict[int, int] | None = None) -> int:
        total = self.extra
        for m in self.messages:
            if pruned and m.role == "tool" and m.id not in keep and m.id in pruned_cost:
                total += pruned_cost[m.id]
            elif clipped and m.id in clipped:
                total += clipped[m.id]
            else:
                total += m.tokens or 0
        return total


@dataclass
class ContextRequest:
    """The request that would be sent next, and the accounting behind it."""

    thread_id: int
    messages: list[Message]  # what the model sees, system first
    breakdown: Breakdown
    counter: str
    window_source: str
    protect_turns: int  # after any fallback
    configured_protect_turns: int
    fallback: bool
    compaction_due: bool
    trigger: str
    triggers: list[str]
    included_ids: list[int]
    pruned_ids: list[int]
    dropped_turns: int
    unsummarized_turns: int
    summary: SummaryRow | None
    last_prompt_tokens: int | None
    pinned_ids: list[int]
    recall: Recall = field(default_factory=Recall)
    #: tool definitions passed to a chat template that renders them itself
    tool_definitions: list[dict] = field(default_factory=list)
    #: the prompt size is the runtime's count of this exact rendering (not a sum of parts)
    exact: bool = False
    #: template tokens the per-message counts miss (merged turns, inserted text); they
    #: are part of ``breakdown.system``
    framing: int = 0
    #: in-flight tool results shown shortened (too large for the window); the store keeps
    #: them whole
    clipped_ids: list[int] = field(default_factory=list)
    #: the current turn's user message, shown verbatim although the summary covers it
    #: (the steps after it were summarized in the middle of the task)
    kept_ids: list[int] = field(default_factory=list)
    #: the newest message of the branch when it was planned (a message after it, such as
    #: the reply being written to this request, goes into the next request)
    head_id: int | None = None

    @property
    def predicted_prompt_tokens(self) -> int:
        return self.breakdown.used


class _CountCache:
    """Counts of synthetic messages (system prompt, placeholders), per counter."""

    def __init__(self, size: int = 256):
        self._data: OrderedDict[tuple, int] = OrderedDict()
        self._size = size

    def count(self, counter: TokenCounter, message: Message) -> int:
        key = (
            counter.name,
            message.get("role"),
            message.get("content"),
            message.get("name"),
            message.get("tool_call_id"),
        )
        if key in self._data:
            self._data.move_to_end(key)
            return self._data[key]
        value = counter.count_message(message)
        self._data[key] = value
        if len(self._data) > self._size:
            self._data.popitem(last=False)
        return value


_synthetic = _CountCache()


def summary_block(text: str) -> str:
    """A summary as it is injected into the system prompt."""
    return f"{SUMMARY_HEADER}\n{text}"


def compose_system(base: str, tools_text: str = "", summary_text: str = "") -> str:
    """The system message: the prompt, then tool descriptions, then the summary.

    This order keeps the prefix stable: the summary changes only at a compaction.
    """
    parts = [p for p in (base.strip(), tools_text.strip(), summary_text.strip()) if p]
    return "\n\n".join(parts)


def certainly_too_large(params: ContextParams, n_bytes: int,
                        frame: Callable[[], Frame] | None = None) -> str | None:
    """Why ``n_bytes`` of text in the newest turn certainly fit no history budget of this
    window (they need at least ``min_tokens(n_bytes)`` tokens), known without tokenizing
    (10 MiB take seconds and a gigabyte); None when they might fit. ``frame``, called only
    to refuse, says what the system prompt, tools and summary leave: the number ``context``
    gives (before: the whole budget, a second number). The CLI refuses a message with it."""
    p, needed = params, min_tokens(n_bytes)
    if needed <= TokenBudgetCalculator(p.window, p.token_budget_ratio, p.compaction_threshold).budget:
        return None
    return f"conversation too large: {oversized(p, needed, n_bytes, frame and frame())}"


def oversized(p: ContextParams, needed: int, n_bytes: int, frame: Frame | None) -> str:
    """Why a newest turn of ``n_bytes`` (≥ ``needed`` tokens) does not fit ``frame``'s room."""
    fixed = (f" − system {frame.system_tokens:,} − tools {frame.tool_tokens:,} − summary "
             f"{frame.summary_tokens:,}" if frame else "")
    allowed = max(frame.history_budget, 0) if frame else math.floor(p.window * p.token_budget_ratio)
    return (f"the newest turn alone is at least {_tokens(needed)} ({n_bytes:,} bytes of text); "
            f"the history budget allows {'' if frame else 'at most '}{allowed:,} (window {p.window:,} × "
            f"ratio {p.token_budget_ratio}{fixed})")


@dataclass
class Frame:
    """The fixed part of one request and the history budget it leaves."""

    summary: SummaryRow | None
    pinned_ids: list[int]
    system_message: Message
    system_tokens: int
    tool_tokens: int
    summary_tokens: int
    history_budget: int

    @property
    def lower_id(self) -> int:
        """Messages at or below this id are summarized or pinned: not history."""
        covered = self.summary.covers_through_id if self.summary else 0
        return max([covered, *self.pinned_ids])


class _TurnSource:
    """The thread's unsummarized turns, newest first, read lazily (a build's cost follows
    the window, not the history). The draft, if any, is the newest turn. ``keep`` holds
    the in-flight tool results (after the last assistant message): the model asked for
    them, so they are never pruned."""

    def __init__(self, engine: ContextEngine, thread_id: int, frame: Frame,
                 draft: Message | None, anchored: bool = True):
        self.engine = engine
        self.thread_id = thread_id
        self.draft_tokens = engine.counter.count_message(draft) if draft is not None else 0
        covered = frame.summary.covers_through_id if frame.summary else 0
        found = engine.open_turn_anchor(thread_id, covered)
        self.anchor = found if anchored else None
        self.anchor_skipped = None if anchored else found
        source = engine._turns_newest_first(thread_id, covered, set(frame.pinned_ids),
                                            self.anchor)
        if draft is not None:
            span = engine.store.turn_span(thread_id)
            source = _chain(Turn((span[1] if span else 0) + 1, extra=self.draft_tokens), source)
        self._source = source
        self.loaded: list[Turn] = []  # newest first
        self.pruned_costs: dict[int, int] = {}
        self.keep: set[int] = set()
        self.clipped: dict[int, tuple[Message, int]] = {}  # id → (shortened, its tokens)
        newest = self.get(0)
        self.keep.update(m.id for m in in_flight(newest.messages if newest is not None else []))

    def close(self) -> None:
        """Let go of the history's open read: a lazy cursor left open keeps this
        connection's snapshot, and once another connection commits, SQLite refuses every
        write of this one (SQLITE_BUSY_SNAPSHOT: a turn's reply, its lease) until the
        collector happens to free it."""
        self._source.close()

    def get(self, index: int) -> Turn | None:
        while len(self.loaded) <= index:
            turn = next(self._source, None)
            if turn is None:
                return None
            for m in turn.messages:
                if m.role == "tool" and self.engine.prunable(m):
                    self.pruned_costs[m.id] = self.engine.pruned_cost(m)
            self.loaded.append(turn)
        return self.loaded[index]

    def cost(self, index: int, protect: int) -> int:
        """Tokens of turn ``index`` (0 = newest) when the newest ``protect`` keep their
        tool outputs."""
        turn = self.get(index)
        clipped = {i: tokens for i, (_, tokens) in self.clipped.items()}
        return 0 if turn is None else turn.cost(index >= protect, self.pruned_costs, self.keep,
                                                clipped)


class ContextEngine:
    """Builds requests for one thread. Never modifies stored messages."""

    def __init__(self, store: Store, counter: TokenCounter, params: ContextParams,
                 semantic: SemanticSearch | None = None, rankings: RankingCache | None = None,
                 today: Callable[[], dt.date] = dt.date.today, reranker: Reranker | None = None):
        self.store = store
        #: the day a draft is asked on (what its "yesterday" means); a sent message's is its own
        self.today = today
        self.counter = counter
        self.params = params
        self.semantic = semantic  # recall's ranking by meaning, when an embedder exists
        self.rankings = rankings  # recall's recent searches, shared by a planner's engines
        self.reranker = reranker  # reorders recall's first candidates, when one is loaded
        self.calc = TokenBudgetCalculator(
            params.window, params.token_budget_ratio, params.compaction_threshold
        )

    # -- pieces ---------------------------------------------------------------------------

    def pinned_system(self, thread_id: int) -> tuple[list[int], str | None]:
        """The thread's own leading system message(s): always sent, never summarized."""
        ids: list[int] = []
        texts: list[str] = []
        for row in self.store.leading_messages(thread_id, PINNED_LOOKAHEAD):
            if row["role"] != "system":
                break
            ids.append(row["id"])
            texts.append(row["content"] or "")
        return ids, ("\n\n".join(texts) if ids else None)

    def base_system(self, thread_id: int) -> tuple[list[int], str]:
        """(the thread's leading system message ids, the system prompt its requests start
        with): the chat's own prompt (set in its settings) if it has one, else its own
        leading system message(s), else ``chat.system_prompt``."""
        pinned_ids, thread_system = self.pinned_system(thread_id)
        own = self.store.system_prompt_of(thread_id) if thread_id > 0 else None
        if own is None:
            own = thread_system if thread_system is not None else self.params.system_prompt
        return pinned_ids, filled(own)  # ({{CURRENT_DATE}}: prompt_vars)

    def summary_text(self, summary: SummaryRow | None) -> str:
        return summary_block(summary.text) if summary else ""

    def system_costs(
        self, base: str, tools_text: str, summary_text: str
    ) -> tuple[int, int, int, Message]:
        """(system, tools, summary) tokens, exact by differencing, plus the message."""
        count = lambda text: _synthetic.count(self.counter, {"role": "system", "content": text})
        overhead = self.counter.prompt_overhead()
        base_only = count(compose_system(base)) + overhead
        with_tools = count(compose_system(base, tools_text)) + overhead
        full_text = compose_system(base, tools_text, summary_text)
        full = count(full_text) + overhead
        return base_only, with_tools - base_only, full - with_tools, {
            "role": "system",
            "content": full_text,
        }

    def prunable(self, meta: MessageMeta) -> bool:
        """Whether clearing this tool output saves tokens: one no longer than its
        placeholder is sent as it is (13 tokens became 18, marked "cleared")."""
        return meta.tokens is None or meta.tokens > self.pruned_cost(meta)

    def pruned_cost(self, meta: MessageMeta) -> int:
        placeholder: Message = {"role": "tool", "content": PRUNED_PLACEHOLDER}
        if meta.tool_call_id:
            placeholder["tool_call_id"] = meta.tool_call_id
        if meta.name:
            placeholder["name"] = meta.name
        return _synthetic.count(self.counter, placeholder)

    def request_costs(self, metas: Sequence[MessageMeta]) -> dict[int, int]:
        """What each message costs in a request at the configured protection: tool
        outputs outside the newest ``prune_protect_turns`` turns count as cleared (the
        rule of :meth:`_prune`; compaction sizes its split with it)."""
        turns = sorted({m.turn for m in metas}, reverse=True)
        protected = set(turns[: self.params.prune_protect_turns])
        return {m.id: (self.pruned_cost(m) if m.role == "tool" and m.turn not in protected
                       and self.prunable(m) else m.tokens or 0) for m in metas}

    def open_turn_anchor(self, thread_id: int, covered: int) -> MessageMeta | None:
        """The user message that opens a turn the summary boundary cuts through (its
        first steps summarized in the middle of the task, later ones not): the request
        keeps it verbatim, so the model never loses what it was asked to do."""
        if covered <= 0:
            return None
        anchor = self.store.turn_anchor_id(covered)
        if anchor is None:
            return None
        metas = self.store.meta_range(thread_id, self.counter.name, through_id=anchor,
                                      after_id=anchor - 1)
        return ensure_counts(self.store, self.counter, metas)[0] if metas else None

    def _turns_newest_first(
        self, thread_id: int, after_id: int, skip: set[int], anchor: MessageMeta | None = None
    ) -> Iterator[Turn]:
        """Whole turns, newest first, read lazily in batches with counts filled in. A
        reply another process is still streaming is not history yet and is left out.
        ``anchor`` (see :meth:`open_turn_anchor`) opens the oldest turn."""
        cursor = self.store.iter_meta_desc(thread_id, self.counter.name, after_id)
        try:  # (closed with this generator: see _TurnSource.close)
            current: Turn | None = None
            while True:
                batch = [m for m in islice(cursor, _BATCH)
                         if m.id not in skip and m.status != "streaming"]
                if not batch:
                    break
                for meta in ensure_counts(self.store, self.counter, batch):
                    if current is not None and meta.turn != current.number:
                        yield current
                        current = None
                    if current is None:
                        current = Turn(meta.turn)
                    current.messages.insert(0, meta)
            if anchor is not None and current is not None and current.number == anchor.turn:
                current.messages.insert(0, anchor)
            if current is not None:
                yield current
        finally:
            cursor.close()

    # -- the request ----------------------------------------------------------------------

    def build(
        self, thread_id: int, *, tools_text: str = "", draft: str | None = None,
        native_tool_tokens: int = 0, reserve: int = 0,
    ) -> ContextRequest:
        """The request that would be sent next. Raises ConversationTooLargeException.

        The steps, in order: frame (system, tools, summary, budget) → load (whole turns
        newest first) with prune (which tool outputs are cleared) and progressive
        truncation → recall → triggers. Tools are either described in the system prompt
        (``tools_text``) or rendered by the chat template itself, which then adds
        ``native_tool_tokens``. ``reserve`` tokens are kept out of the history budget
        (the planner's room for template framing it measured on a full rendering).
        """
        frame = self.frame(thread_id, tools_text, native_tool_tokens, reserve)
        self._refuse_oversized(thread_id, frame, draft)
        draft_message = {"role": "user", "content": draft} if draft is not None else None
        turns, protect = self._fit(thread_id, frame, draft_message)
        included, spent, dropped_turns, history, pruned_ids = self._loaded(turns, frame, protect)
        if draft_message is not None:
            history.append(draft_message)
        recall, recall_tokens = self._recall(
            thread_id, frame.summary, history, included, draft_message,
            frame.history_budget - spent, set(frame.pinned_ids),
        )
        unsummarized = self.store.count_turns(thread_id, frame.lower_id) + (
            1 if draft_message is not None else 0)
        last = self.store.last_request(thread_id, frame.summary.id if frame.summary else None)
        last_prompt = last["prompt_tokens"] if last else None
        # shortening the result the model asked for is the last resort, after compaction
        triggers = self._triggers(dropped_turns or bool(turns.clipped), last_prompt, unsummarized)
        breakdown = self.calc.breakdown(
            frame.system_tokens, frame.tool_tokens, frame.summary_tokens,
            spent - turns.draft_tokens, turns.draft_tokens, recall_tokens,
        )
        return ContextRequest(
            thread_id=thread_id,
            messages=[frame.system_message, *history],
            breakdown=breakdown,
            counter=self.counter.name,
            window_source=self.params.window_source,
            protect_turns=protect,
            configured_protect_turns=self.params.prune_protect_turns,
            fallback=protect != self.params.prune_protect_turns,
            compaction_due=bool(triggers),
            trigger=triggers[0] if triggers else "none",
            triggers=triggers,
            included_ids=[m.id for t in included for m in t.messages],
            pruned_ids=pruned_ids,
            dropped_turns=dropped_turns,
            unsummarized_turns=unsummarized,
            summary=frame.summary,
            last_prompt_tokens=last_prompt,
            pinned_ids=frame.pinned_ids,
            recall=recall,
            clipped_ids=sorted(turns.clipped),
            kept_ids=[turns.anchor.id] if turns.anchor is not None and any(
                m.id == turns.anchor.id for t in included for m in t.messages) else [],
            head_id=self.store.thread_state(thread_id)[0] if thread_id > 0 else None,
        )

    def _loaded(self, turns: _TurnSource, frame: Frame, protect: int) -> tuple[Any, ...]:
        """:meth:`_load`, then :meth:`_prune`; the history's read closed after
        (:meth:`_TurnSource.close`)."""
        try:
            included, spent, dropped = self._load(turns, frame, protect)
            return included, spent, dropped, *self._prune(included, protect, turns)
        finally:
            turns.close()

    def _refuse_oversized(self, thread_id: int, frame: Frame, draft: str | None) -> None:
        """A huge paste is refused before anything tokenizes it: every counter spends a
        token per MAX_BYTES_PER_TOKEN bytes at most, so the newest turn's user text gives
        a floor on its tokens from its size alone (a 10 MiB message would otherwise be
        tokenized, seconds and a gigabyte, only to be refused)."""
        self._refuse_full_frame(frame)
        n_bytes = (utf8_length(draft.strip()) if draft is not None
                   else self.store.newest_turn_text_bytes(thread_id, frame.lower_id))
        allowed, needed = max(frame.history_budget, 0), min_tokens(n_bytes)
        if needed > allowed:
            raise ConversationTooLargeException(oversized(self.params, needed, n_bytes, frame),
                                                needed=needed, allowed=allowed)

    def _refuse_full_frame(self, frame: Frame) -> None:
        """ConversationTooLargeException naming the system prompt, the tools and the summary
        when they alone leave nothing of the budget (the sentence blamed the newest turn:
        "the newest turn alone is at least 1 tokens … the window allows 0")."""
        if frame.history_budget > 0:
            return
        p = self.params
        budget = math.floor(p.window * p.token_budget_ratio)
        parts = [f"the system prompt ({_tokens(frame.system_tokens)})"]
        fixes = ["shorten the system prompt (chat.system_prompt, or the chat's own)"]
        if frame.tool_tokens:
            parts.append(f"the tools' descriptions ({_tokens(frame.tool_tokens)})")
            fixes.append("turn tools off (tools.enabled)")
        if frame.summary_tokens:
            parts.append(f"the summary ({_tokens(frame.summary_tokens)})")
        # a send compacts first, re-fitting the summary to the room (before: only these fixes)
        refit = frame.summary_tokens and frame.history_budget + frame.summary_tokens > SHORTEST_SUMMARY
        raise ConversationTooLargeException(
            f"{' and '.join([', '.join(parts[:-1]), parts[-1]] if len(parts) > 1 else parts)} "
            f"alone take{'' if len(parts) > 1 else 's'} the whole {budget:,}-token budget (window {p.window:,} × ratio "
            f"{p.token_budget_ratio}), leaving nothing for the conversation; "
            f"{'sending a message summarizes the chat again, shorter, to make room for it; or ' if refit else ''}"
            f"{', '.join(fixes)}, or raise context.window",
            # what the fixed parts take, and a token at least for the conversation
            needed=budget - frame.history_budget + 1, allowed=budget, about="frame")

    def frame(self, thread_id: int, tools_text: str = "", native_tool_tokens: int = 0,
              reserve: int = 0) -> Frame:
        """Step 1, the budget: what the system message, tools and summary cost, and what
        is left for verbatim history (``TokenBudgetCalculator``)."""
        summary = self.store.latest_summary(thread_id)
        pinned_ids, base = self.base_system(thread_id)
        system_tokens, tool_tokens, summary_tokens, system_message = self.system_costs(
            base, tools_text, self.summary_text(summary))
        tool_tokens += native_tool_tokens
        available = self.calc.available(system_tokens, tool_tokens)
        return Frame(
            summary=summary, pinned_ids=pinned_ids, system_message=system_message,
            system_tokens=system_tokens, tool_tokens=tool_tokens, summary_tokens=summary_tokens,
            history_budget=available - summary_tokens - reserve,
        )

    def _fit(self, thread_id: int, frame: Frame, draft: Message | None
             ) -> tuple[_TurnSource, int]:
        """The newest turn must fit. What gives way, in order: finished tool outputs
        (progressive truncation), then the in-flight results (shortened), then the current
        task's opening message that a summary already covers. Raises
        ConversationTooLargeException when even that does not fit."""
        for anchored in (True, False):
            turns = _TurnSource(self, thread_id, frame, draft, anchored)
            if not anchored and turns.anchor_skipped is None:
                turns.close()
                break  # there was no anchor to leave out
            try:
                return turns, self._choose_protection(turns, frame)
            except ConversationTooLargeException as exc:
                error = exc
                if self._clip_in_flight(turns, frame):
                    try:
                        return turns, self._choose_protection(turns, frame)
                    except ConversationTooLargeException as clipped:
                        error = clipped
            turns.close()
        raise error

    def _choose_protection(self, turns: _TurnSource, frame: Frame) -> int:
        """Progressive truncation: the newest ``protect`` turns keep their tool outputs,
        configured → 1 → 0, whichever first fits together with the newest turn. Raises
        ConversationTooLargeException when even 0 does not fit."""
        configured = self.params.prune_protect_turns
        for protect in sorted({configured, min(configured, 1), 0}, reverse=True):
            needed = sum(turns.cost(i, protect) for i in range(max(protect, 1)))
            if needed <= frame.history_budget:
                return protect
        needed = turns.cost(0, 0)
        allowed = max(frame.history_budget, 0)
        self._refuse_full_frame(frame)
        if turns.clipped:
            cleared = ("every finished tool output cleared and the result the model just "
                       "asked for shortened")
        elif turns.keep and (steps := needed - self._in_flight_tokens(turns)) > allowed \
                and self._steps_overflow(turns):
            # the steps before the result overflow, not the result (a 31-token one was blamed)
            cleared = ("every finished tool output cleared: its message and the model's steps "
                       f"before the result it just asked for are {_tokens(steps)} alone; "
                       "compacting the chat (Compact now, or the next send) summarizes the "
                       "earlier steps")
        elif turns.keep:
            cleared = ("every finished tool output cleared (the result the model just asked for "
                       "is too large to shorten into what is left)")
        elif turns.cost(0, 1) != needed:
            cleared = "every tool output cleared"
        else:  # a message without tool outputs: nothing was cleared
            cleared = ""
        p = self.params
        raise ConversationTooLargeException(
            f"the newest turn alone is {_tokens(needed)}{f' even with {cleared}' if cleared else ''}; the history "
            f"budget allows {allowed:,} (window {p.window:,} × ratio {p.token_budget_ratio} − system "
            f"{frame.system_tokens:,} − tools {frame.tool_tokens:,} − summary "
            f"{frame.summary_tokens:,})",
            needed=needed, allowed=allowed,
        )

    def _load(self, turns: _TurnSource, frame: Frame, protect: int
              ) -> tuple[list[Turn], int, int]:
        """Step 2, load: whole turns newest first until the next one does not fit.

        Returns (the included turns in chronological order, their tokens, the number of
        unsummarized turns left out: ``dropped``, which makes compaction due)."""
        spent = 0
        index = 0
        dropped = 0
        while (turn := turns.get(index)) is not None:
            cost = turns.cost(index, protect)
            if index > 0 and spent + cost > frame.history_budget:
                span = self.store.turn_span(turns.thread_id, frame.lower_id)
                dropped = turn.number - span[0] + 1 if span and turn.messages else 0
                break
            spent += cost
            index += 1
        return list(reversed(turns.loaded[:index])), spent, dropped

    def _prune(self, included: list[Turn], protect: int, turns: _TurnSource
               ) -> tuple[list[Message], list[int]]:
        """Step 3, prune: the included messages as sent, with tool outputs outside the
        newest ``protect`` turns replaced by ``[Tool output cleared]`` (never the
        in-flight results, which are shortened only if they alone overflow). Stored
        messages are not touched."""
        rows = self.store.messages_by_id([m.id for t in included for m in t.messages])
        history: list[Message] = []
        pruned_ids: list[int] = []
        for age, turn in zip(range(len(included) - 1, -1, -1), included):
            for meta in turn.messages:
                message = wire_message(row_to_message(rows[meta.id]))
                if meta.id in turns.clipped:
                    message = turns.clipped[meta.id][0]
                elif age >= protect and meta.role == "tool" and meta.id not in turns.keep \
                        and meta.id in turns.pruned_costs:
                    message = {**message, "content": PRUNED_PLACEHOLDER}
                    pruned_ids.append(meta.id)
                history.append(message)
        return history, pruned_ids

    @staticmethod
    def _steps_overflow(turns: _TurnSource) -> bool:
        """The newest turn has steps (two or more) that compaction summarizes, whatever its
        message costs (before: a task message over half the room blamed the result; once
        summarized, the message is left out of the request when it does not fit)."""
        newest = turns.get(0)
        return newest is not None and sum(m.role == "assistant" for m in newest.messages) >= 2

    @staticmethod
    def _in_flight_tokens(turns: _TurnSource) -> int:
        newest = turns.get(0)
        return 0 if newest is None else sum(m.tokens or 0 for m in newest.messages
                                            if m.id in turns.keep)

    def _clip_in_flight(self, turns: _TurnSource, frame: Frame) -> bool:
        """The in-flight tool results, shortened to share what the newest turn leaves of
        the history budget (each at least MIN_CLIP_TOKENS), so the agent can go on. Only
        the request changes: the store keeps the whole output. False when even that does
        not fit."""
        newest = turns.get(0)
        if newest is None or not turns.keep:
            return False
        kept = [m for m in newest.messages if m.id in turns.keep]
        others = turns.cost(0, 0) - sum(m.tokens or 0 for m in kept)
        # water-filling: a result that fits its share is sent whole, and what it leaves
        # goes to the larger ones (an equal share left a 39-token result's room unused
        # beside a 44 KB listing cut to half the budget)
        room, larger = frame.history_budget - others, sorted(kept, key=lambda m: m.tokens or 0)
        while larger and (larger[0].tokens or 0) <= room // len(larger):
            room -= larger.pop(0).tokens or 0
        share = room // max(len(larger), 1)
        if share < MIN_CLIP_TOKENS:
            return False
        rows = self.store.messages_by_id([m.id for m in kept])
        for meta in larger:
            if (meta.tokens or 0) > share:
                message = wire_message(row_to_message(rows[meta.id]))
                turns.clipped[meta.id] = self._shorten(message, share)
        return bool(turns.clipped)

    def _shorten(self, message: Message, limit: int) -> tuple[Message, int]:
        """``message`` with its content cut (at a character found by bisection) and a
        marker, so that it costs at most ``limit`` tokens; (message, its tokens)."""
        content = str(message.get("content") or "")
        low, high = 0, len(content)
        best = ({**message, "content": CLIP_MARKER.format(shown=0, total=len(content))}, None)
        while low <= high:
            middle = (low + high) // 2
            shortened = {**message, "content": content[:middle]
                         + CLIP_MARKER.format(shown=middle, total=len(content))}
            tokens = self.counter.count_message(shortened)
            if tokens <= limit:
                best, low = (shortened, tokens), middle + 1
            else:
                high = middle - 1
        shortened, tokens = best
        return shortened, tokens if tokens is not None else self.counter.count_message(shortened)

    def _triggers(self, dropped_turns: int, last_prompt: int | None,
                  unsummarized_turns: int) -> list[str]:
        """Step 5, triggers: every reason compaction is due now, strongest first."""
        p = self.params
        triggers = []
        if dropped_turns:
            triggers.append("budget")
        if last_prompt is not None and last_prompt >= p.window * p.compaction_threshold:
            triggers.append("tokens")
        # the newest turn is always kept, so one unsummarized turn can never be compacted
        if p.compaction_min_turns and unsummarized_turns >= max(p.compaction_min_turns, 2):
            triggers.append("turns")
        return triggers

    def _recall(
        self, thread_id: int, summary: SummaryRow | None, history: list[Message],
        included: list[Turn], draft: Message | None, leftover: int, pinned: set[int],
    ) -> tuple[Recall, int]:
        """Recall for the newest user message (the draft, or the user message that opens
        the newest turn), in place in ``history``; (recall, its exact tokens).

        The block is filled to the full ``recall_max_tokens`` first, so every step of one
        agent turn gets the same block (a stable prefix); only when the turn has grown so
        much that it no longer fits is it filled again, from the same search, within what
        is left."""
        limit = self.params.recall_max_tokens
        if limit <= 0:
            return Recall(reason="off"), 0
        if summary is None:
            return Recall(reason="nothing is summarized yet"), 0
        if leftover <= 0:
            return Recall(reason="no room"), 0
        if draft is not None:
            index = len(history) - 1
        elif included and _in_progress(included[-1]):
            index = len(history) - len(included[-1].messages)
        elif included and _in_progress(included[-1], opened=False):
            # its task message is summarized (it did not fit with the steps): said, not
            # "answered" as before
            return Recall(reason="the message that opened the newest turn is summarized"), 0
        else:  # a finished turn: the next message will get its own recall
            return Recall(reason="the newest turn is answered"), 0
        message = history[index]
        content = message.get("content")
        if not isinstance(content, str) or not content.strip():
            return Recall(reason="no text to search"), 0
        plain = self.counter.count_message(message)
        today = None  # the day it is asked, read only when it names a relative date
        if names_relative_date(content):
            if draft is not None:
                today = self.today()
            else:  # the day it was sent: its block stays the same after midnight
                first = included[-1].messages[0].id
                today = day_of(self.store.messages_by_id([first]).get(first, {}).get("sent_at"))
        recaller = Recaller(self.store, self.counter, self.semantic, self.reranker)
        ranking = (self.rankings.rank(recaller, thread_id, summary.id, summary.covers_through_id,
                                      content, today) if self.rankings is not None
                   else recaller.rank(thread_id, summary.covers_through_id, content, today))
        budget = limit
        for _ in range(3):  # the full limit; what is left; that less what the message adds
            found = recaller.block(ranking, budget, frozenset(pinned))
            # matches that do not fit say so, with the room (before: "nothing matches")
            no_room = f"no room: no match fits in {_tokens(max(min(budget, leftover), 0))}"
            if not found.text:
                return (replace(found, reason=no_room) if found.reason == "no room" else found), 0
            tokens = self.counter.count_message({**message, "content": attach(found.text, content)}) - plain
            if tokens <= leftover:
                history[index] = {**message, "content": attach(found.text, content)}
                return found, tokens
            budget = leftover if budget > leftover else budget - (tokens - leftover)
        return Recall(terms=found.terms, reason=f"no room: no match fits in {_tokens(leftover)}"), 0

    # -- the full picture -----------------------------------------------------------------

    def describe(self, request: ContextRequest, count: bool = True) -> list[dict[str, Any]]:
        """Every stored message of the active branch, in order, with its turn, tokens (as
        stored), state and ``sent_tokens`` (what it costs in the request: a pruned or
        clipped message as it is sent, 0 when it is not sent). ``count=False``: the states
        alone (a message never counted keeps ``tokens`` None; nothing is tokenized)."""
        thread_id = request.thread_id
        last = self.store.head(thread_id) if thread_id > 0 else None
        if last is None:
            return []
        metas = self.store.meta_range(thread_id, self.counter.name, last)
        metas = ensure_counts(self.store, self.counter, metas) if count else metas
        included = set(request.included_ids)
        pruned = set(request.pruned_ids)
        clipped = set(request.clipped_ids)
        pinned = set(request.pinned_ids)
        recalled = set(request.recall.ids)
        covered = request.summary.covers_through_id if request.summary else 0
        # a message written after the request was planned (the reply to it, streaming or
        # saved since) was not left out of it: it goes into the next one
        planned = request.head_id if request.head_id is not None else 2**62
        # a clipped result is counted as sent; a pruned output costs its placeholder
        sent = {mid: self.counter.count_message(message)
                for mid, message in zip(request.included_ids, request.messages[1:])
                if mid in clipped}
        result = []
        for m in metas:
            if m.id in pinned or m.id > planned or m.status == "streaming":
                state = "verbatim"
            elif m.id in pruned:
                state = "pruned"
            elif m.id in clipped:
                state = "clipped"
            elif m.id in included:
                state = "verbatim"  # a kept anchor is included although it is covered
            elif m.id <= covered:
                state = "summarized"
            else:
                state = "dropped"
            cost = (self.pruned_cost(m) if state == "pruned" else sent.get(m.id, 0)
                    if state == "clipped" else (m.tokens or 0) if state == "verbatim" else 0)
            result.append(
                {"id": m.id, "role": m.role, "turn": m.turn, "tokens": m.tokens, "state": state,
                 "sent_tokens": cost, "recalled": m.id in recalled}
            )
        return result


def _in_progress(turn: Turn, opened: bool = True) -> bool:
    """A turn opened by a user message (``opened``: that message is in ``turn``, not
    left out of it) and not yet answered: the user message alone, or tool steps after
    it (the final reply is an assistant message without tool calls)."""
    first, last = turn.messages[0], turn.messages[-1]
    return (first.role == "user") == opened and (
        last.role in ("user", "tool") or (last.role == "assistant" and last.has_tool_calls))


def _chain(first: Turn, rest: Iterator[Turn]) -> Iterator[Turn]:
    yield first
    yield from rest

