"""What one turn reports, as one frozen dataclass per kind, and the one dispatcher.

The agent and the host (``iris_desktop.host``) yield these; the CLI and the GUI both
consume them through :func:`dispatch`, which calls the matching ``on_*`` method of a
:class:`TurnListener`. A listener overrides only what it shows. Nothing travels in loose
dicts: a compaction carries a :class:`CompactionEvent`, a request the
:class:`~iris_desktop.core.engine.ContextRequest` that was sent.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from iris_desktop.core.engine import ContextRequest
from iris_desktop.generation import GenerationStats

#: how the reason of a compaction skipped for another process's begins (:attr:`CompactionEvent.elsewhere`)
ELSEWHERE = "another Iris process"


@dataclass
class CompactionEvent:
    """One compaction attempt, as stored in ``compaction_events`` (plus its id, the turns
    it covered, and, not stored, how its summary came about). ``outcome``: ok | failed |
    skipped. ``fallback``: why an extractive summary stands where the model's was meant
    to (stopped | gave_way | timed_out | unusable | too_long | failed); ``extracted_last_turn``:
    the last of the oldest turns summarized by extraction beside the model's parts."""

    trigger: str
    outcome: str = "failed"
    path: str | None = None
    turns_archived: int | None = None
    messages_archived: int | None = None
    tokens_before: int | None = None
    tokens_after: int | None = None
    kept_turns: int | None = None
    summary_tokens: int | None = None
    duration_s: float | None = None
    error: str | None = None
    summary_id: int | None = None
    id: int | None = None
    first_turn: int | None = None
    last_turn: int | None = None
    fallback: str | None = None
    extracted_last_turn: int | None = None

    @property
    def elsewhere(self) -> bool:
        """Skipped because another Iris process compacts (or just compacted) the thread:
        its summary is the one used, and :attr:`error` says so (:data:`ELSEWHERE`)."""
        return self.outcome == "skipped" and (self.error or "").startswith(ELSEWHERE)

    def row(self) -> dict[str, Any]:
        """The columns stored in ``compaction_events``."""
        return {k: v for k, v in asdict(self).items() if k in _EVENT_COLUMNS}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """One line for logs, the CLI and the GUI."""
        if self.outcome == "ok":
            return (f"compacted ({self.trigger}, {self.path}): "
                    f"{turn_span(self.first_turn, self.last_turn)}, {self.messages_archived:,} messages archived, "
                    f"{self.tokens_before:,} → {self.tokens_after:,} tokens, summary "
                    f"{self.summary_tokens:,} tokens, kept {self.kept_turns} "
                    f"{'turn' if self.kept_turns == 1 else 'turns'}, "
                    f"{self.duration_s or 0:.1f} s" + (f" ({self.error})" if self.error else ""))
        return f"compaction {self.outcome} ({self.trigger}): {self.error}"

    def plain(self) -> str:
        """What happened, in the window's words (no field names): "Turns 1–140 (382
        messages) are summarized now, in 95 s: …"."""
        if self.outcome == "skipped":
            return f"The earlier turns were not summarized: {self.error}."
        if self.outcome != "ok":
            return f"The earlier turns could not be summarized: {self.error}. Nothing is lost."
        n, one = self.messages_archived or 0, self.first_turn == self.last_turn
        turns = f"{turn_span(self.first_turn, self.last_turn)} ({n:,} message{'' if n == 1 else 's'})"
        # the event does not know whether recall is on or will have room: "can", not "brings"
        kept = (f"{'It stays' if one else 'They stay'} in the chat, dimmed, and recall can bring "
                f"{'it' if one else 'them'} back when a question needs {'it' if one else 'them'}.")
        if self.path == "extractive" and self.fallback:
            why = _FALLBACK_WORDS.get(self.fallback, _FALLBACK_WORDS["failed"])
            return (f"Iris summarized {turns} itself, quickly and without the model, because "
                    f"{why}. {kept}")
        took = self.duration_s or 0
        text = (f"{turns[0].upper()}{turns[1:]} {'is' if one else 'are'} summarized now, in "
                f"{'under a second' if took < 1 else duration_words(took)}. {kept}")
        if self.extracted_last_turn is not None:  # the oldest, beyond the model's parts
            text += (f" Iris summarized the oldest ({turn_span(self.first_turn, self.extracted_last_turn)}) "
                     "itself, to keep the wait short.")
        return text


def turn_span(first: int | None, last: int | None) -> str:
    """"turns 1–4", or "turn 4" for one (before: "turns 4–4")."""
    return f"turn {first}" if first == last else f"turns {first}–{last}"


#: :attr:`CompactionEvent.fallback` in the window's words ("… because {words}")
_FALLBACK_WORDS = {
    "stopped": "you pressed Stop",
    "gave_way": "you sent a message meanwhile",
    "timed_out": "the model took too long",
    "unusable": "the model's summary was not usable",
    "too_long": "the model's summary was too long to save room",
    "failed": "the model could not write one",
}


_EVENT_COLUMNS = ("trigger", "outcome", "path", "turns_archived", "messages_archived",
                  "tokens_before", "tokens_after", "kept_turns", "summary_tokens", "duration_s",
                  "error", "summary_id")


@dataclass(frozen=True)
class ThreadCreated:
    """A new thread was made for the first message of a new chat."""

    thread_id: int


@dataclass(frozen=True)
class CacheStatus:
    """What the KV cache is doing for a thread while the user reads or types.

    ``state``: restored (its saved state was loaded: ``done`` tokens) | warming (the
    prompt after a compaction) | prefilling (the draft's prompt), with ``done`` of
    ``total`` prompt tokens evaluated | warmed | prefilled | stopped (it gave way, or
    failed, after its progress was said).
    """

    thread_id: int | None
    state: str
    done: int = 0
    total: int = 0
    #: of a warm-up or prefill: the tokens in the cache before it began, and its time so far
    start: int = 0
    elapsed_s: float = 0.0

    def describe(self) -> str:
        """The status bar's words: "Restored from cache", "Warming up… 1,536 of 4,096
        tokens (37%), about 12 s left"."""
        if self.state in ("warming", "prefilling"):
            label = "Warming up" if self.state == "warming" else "Prefilling"
            return progress_words(label, self.done, self.total, self.start, self.elapsed_s)
        return {"restored": "Restored from cache", "warmed": "Ready (warmed up)",
                "prefilled": "Prefilled", "stopped": "Ready"}.get(self.state, self.state)


def seconds_left(done: int, total: int, start: int, elapsed_s: float) -> float | None:
    """The time an evaluation of ``total`` tokens still needs at its pace so far
    (``done - start`` tokens in ``elapsed_s``); None before there is a pace."""
    read = done - start
    if read <= 0 or elapsed_s <= 0:
        return None
    return (total - done) * elapsed_s / read


def duration_words(seconds: float) -> str:
    """"12 s", "95 s", "4 min": seconds up to two minutes, then whole minutes."""
    return f"{seconds:,.0f} s" if seconds < 120 else f"{seconds / 60:,.0f} min"


def progress_words(label: str, done: int, total: int, start: int, elapsed_s: float) -> str:
    """"Reading the conversation… 1,536 of 4,096 tokens (37%), about 12 s left"."""
    left = seconds_left(done, total, start, elapsed_s)
    eta = f", about {duration_words(left)} left" if left is not None and done < total else ""
    return f"{label}… {done:,} of {total:,} tokens ({100 * done // max(total, 1)}%){eta}"


@dataclass(frozen=True)
class PromptProgress:
    """How far the model has read a prompt the user waits for: ``done`` of ``total``
    prompt tokens are in its cache (``start`` of them were there before it began),
    ``elapsed_s`` since it began. ``what``: reply | summary. It arrives while the
    evaluation runs, through the ``progress`` callback of the host's turn operations
    (a generator cannot yield in the middle of an evaluation).

    A summary of many old turns is written in ``parts`` model calls, this one the
    ``part``-th; ``part_s`` is how long each finished part took on average (None in the
    first), which times the parts still to come."""

    thread_id: int
    done: int
    total: int
    start: int = 0
    elapsed_s: float = 0.0
    what: str = "reply"
    part: int = 1
    parts: int = 1
    part_s: float | None = None

    @property
    def fraction(self) -> float:
        """Of the whole job: a summary's parts count alike."""
        own = self.done / self.total if self.total else 1.0
        return (self.part - 1 + own) / self.parts if self.parts > 1 else own

    def seconds_left(self) -> float | None:
        """At the pace so far; None before there is one."""
        return seconds_left(self.done, self.total, self.start, self.elapsed_s)

    def describe(self) -> str:
        """"Reading the conversation… 1,536 of 4,096 tokens (37%), about 12 s left";
        a summary in parts: "Summarizing earlier turns, part 2 of 5… 40% of all, about
        4 min left", or while the model writes: "…, part 2 of 5: the model writes this
        part's summary…"."""
        if self.what == "reply":
            return progress_words("Reading the conversation", self.done, self.total,
                                  self.start, self.elapsed_s)
        if self.parts <= 1:
            if self.done >= self.total:
                return "Summarizing earlier turns: the model writes the summary…"
            return progress_words("Summarizing earlier turns", self.done, self.total,
                                  self.start, self.elapsed_s)
        label = f"Summarizing earlier turns, part {self.part} of {self.parts}"
        if self.done >= self.total:
            return f"{label}: the model writes this part's summary…"
        left = self.seconds_left()
        if self.part_s is not None:  # this part at its pace, the rest as the finished ones
            this = left if left is not None else self.part_s * (1 - self.done / self.total)
            eta = f", about {duration_words(this + self.part_s * (self.parts - self.part))} left"
        else:
            eta = f", about {duration_words(left)} left to read this part" if left else ""
        return f"{label}… {100 * self.fraction:.0f}% of all{eta}"


def progress_reporter(report: Callable[[PromptProgress], None], thread_id: int, what: str,
                      clock: Callable[[], float] = time.monotonic, part: int = 1,
                      parts: int = 1, part_s: float | None = None
                      ) -> Callable[[int, int], None]:
    """A runtime's ``progress(done, total)`` callback for one evaluation, as PromptProgress
    events to ``report`` (the first call, before the evaluation, sets ``start``)."""
    started = clock()
    first: list[int] = []

    def progress(done: int, total: int) -> None:
        if not first:
            first.append(done)
        report(PromptProgress(thread_id, done, total, first[0], clock() - started, what,
                              part, parts, part_s))

    return progress


@dataclass(frozen=True)
class UserSaved:
    """The user's message is committed: the typed ``text``, and its attached files as
    (name, tokens)."""

    thread_id: int
    message_id: int
    text: str
    attachments: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class RecallSearch:
    """The newest message asks something, and its search of the summarized history was
    not done while it was typed (it was sent without a pause): the send waits for it now,
    the cross-encoder reading its candidates (about 1–2.5 s on a laptop's CPU). The next
    event is RequestSent."""

    thread_id: int

    def describe(self) -> str:
        return "Finding earlier messages for your question…"


@dataclass(frozen=True)
class RequestSent:
    """The request that goes to the model now: the meter and the states draw from it."""

    thread_id: int
    request: ContextRequest


@dataclass(frozen=True)
class CompactionStarted:
    thread_id: int
    trigger: str


@dataclass(frozen=True)
class CompactionFinished:
    thread_id: int
    event: CompactionEvent

    @property
    def text(self) -> str:
        return self.event.describe()


@dataclass(frozen=True)
class ReplyStarted:
    """An assistant row exists, empty or (a continued reply) holding ``text`` already;
    tokens follow. ``replaces``: the stopped reply a continued one stands beside."""

    thread_id: int
    message_id: int
    text: str = ""
    replaces: int | None = None


@dataclass(frozen=True)
class ReplyToken:
    thread_id: int
    message_id: int
    text: str


@dataclass(frozen=True)
class ReplySaved:
    """The reply is committed (complete, or interrupted by Stop)."""

    thread_id: int
    message_id: int
    text: str
    status: str  # complete | interrupted
    stats: GenerationStats | None = None  # None when the runtime gives none
    tool_calls: tuple[dict, ...] = ()


@dataclass(frozen=True)
class ToolFinished:
    """A tool ran (or was refused) and its full result is committed."""

    thread_id: int
    message_id: int
    name: str
    arguments: Any
    ok: bool
    text: str
    tool_call_id: str


@dataclass(frozen=True)
class TurnFailed:
    """The turn cannot go on. ``kind``: too_large | model | internal."""

    thread_id: int
    text: str
    kind: str
    message_id: int | None = None
    needed: int | None = None
    allowed: int | None = None


@dataclass(frozen=True)
class TurnDone:
    """The last event of every turn.

    ``next_request`` is the request the thread would send next (built once, after the
    reply and any background compaction); views draw from it instead of building again.
    """

    thread_id: int
    finish_reason: str  # stop | length | cancelled | error
    stats: GenerationStats | None = None
    next_request: ContextRequest | None = None


TurnEvent = (ThreadCreated | CacheStatus | PromptProgress | UserSaved
             | RecallSearch | RequestSent | CompactionStarted
             | CompactionFinished | ReplyStarted | ReplyToken | ReplySaved | ToolFinished
             | TurnFailed | TurnDone)


class TurnListener:
    """Override the ``on_*`` methods you need; the rest do nothing."""

    def on_thread_created(self, event: ThreadCreated) -> None: ...
    def on_cache(self, event: CacheStatus) -> None: ...
    def on_progress(self, event: PromptProgress) -> None: ...
    def on_user(self, event: UserSaved) -> None: ...
    def on_recall_search(self, event: RecallSearch) -> None: ...
    def on_request(self, event: RequestSent) -> None: ...
    def on_compaction_started(self, event: CompactionStarted) -> None: ...
    def on_compaction_finished(self, event: CompactionFinished) -> None: ...
    def on_reply_started(self, event: ReplyStarted) -> None: ...
    def on_token(self, event: ReplyToken) -> None: ...
    def on_reply(self, event: ReplySaved) -> None: ...
    def on_tool(self, event: ToolFinished) -> None: ...
    def on_failed(self, event: TurnFailed) -> None: ...
    def on_done(self, event: TurnDone) -> None: ...


def dispatch(event: TurnEvent, listener: TurnListener) -> None:
    """Call the listener method for ``event``'s type (the one dispatcher of CLI and GUI)."""
    match event:
        case ThreadCreated():
            listener.on_thread_created(event)
        case CacheStatus():
            listener.on_cache(event)
        case PromptProgress():
            listener.on_progress(event)
        case UserSaved():
            listener.on_user(event)
        case RecallSearch():
            listener.on_recall_search(event)
        case RequestSent():
            listener.on_request(event)
        case CompactionStarted():
            listener.on_compaction_started(event)
        case CompactionFinished():
            listener.on_compaction_finished(event)
        case ReplyStarted():
            listener.on_reply_started(event)
        case ReplyToken():
            listener.on_token(event)
        case ReplySaved():
            listener.on_reply(event)
        case ToolFinished():
            listener.on_tool(event)
        case TurnFailed():
            listener.on_failed(event)
        case TurnDone():
            listener.on_done(event)
        case _:
            raise TypeError(f"not a turn event: {event!r}")
