"""What the desktop app shows, computed without Qt.

The GUI (``iris_desktop.ui``) only draws what these functions return: the transcript
entries with each message's state, the compaction divider text, the budget meter's
segments (the engine's own :class:`Breakdown`, never a separate estimate), the live
breakdown under the settings fields, and the inspector's tables. Every function here
takes a Store or plain rows, so it runs on whichever worker thread owns the Store and is
tested with no display. None of them modifies the database (the engine may fill its
token-count cache).
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from iris_desktop.core.attachments import shown
from iris_desktop.core.budget_lines import budget_lines, counter_label  # noqa: F401 (said here before)
from iris_desktop.core.conversation import CONTENT_FILTERED, imported_from
from iris_desktop.core.engine import (
    PRUNED_PLACEHOLDER,
    Breakdown,
    ContextEngine,
    ContextRequest,
    ConversationTooLargeException,
)
from iris_desktop.core.planner import Planner
from iris_desktop.core.recall import Recall
from iris_desktop.core.store import Store, SummaryRow, row_to_message
from iris_desktop.core.store.recovery import set_aside_files
from iris_desktop.settings import PINNED, SETTINGS, Setting, Settings, SettingsError
from iris_desktop.tokens import message_text

#: the summary's eight fields, in the order the divider shows them
SUMMARY_FIELDS: tuple[tuple[str, str], ...] = (
    ("summary", "Summary"),
    ("accomplishments", "Accomplishments"),
    ("key_decisions", "Key decisions"),
    ("relevant_files", "Relevant files"),
    ("active_goals", "Active goals"),
    ("emotional_thread", "Emotional thread"),
    ("relationship_dynamics", "Relationship dynamics"),
    ("evolving_themes", "Evolving themes"),
)

#: labels for fields beyond the eight (Iris's own additions)
EXTRA_FIELD_LABELS = {"facts": "Facts (dated)"}

#: states in which the model no longer sees a message verbatim (the view dims them)
DIMMED_STATES = frozenset({"summarized", "dropped"})

#: the meter's segments, left to right, then "free"
METER_PARTS: tuple[str, ...] = ("system", "tools", "summary", "recall", "history", "draft")

ROLE_LABELS = {"user": "You", "assistant": "Iris", "system": "System", "tool": "Tool"}


def tokens(n: int | float | None) -> str:
    """12345 → '12,345'; None → '–'."""
    return "–" if n is None else f"{int(n):,}"


# -- the transcript ------------------------------------------------------------------------


@dataclass
class Entry:
    """One row of the transcript: a message, a tool card or a compaction divider."""

    kind: str  # "message" | "tool" | "divider"
    key: str  # stable identity across reloads: "m:<id>" or "s:<summary id>"
    message_id: int | None = None
    role: str = ""
    turn: int = 0
    text: str = ""
    status: str = "complete"  # complete | streaming | interrupted | error
    state: str = "verbatim"  # verbatim | pruned | clipped | summarized | dropped
    #: assistant rows: the calls it made, as "name(arguments)"
    calls: list[str] = field(default_factory=list)
    #: tool rows: name, pretty arguments, whether the result is an error
    tool_name: str = ""
    arguments: str = ""
    error: bool = False
    #: dividers: the heading and the summary's fields, in SUMMARY_FIELDS order
    title: str = ""
    fields: list[tuple[str, str]] = field(default_factory=list)
    #: messages with alternatives (regenerated replies, edited user messages): this one's
    #: place among them, (1-based index, count); None when it has none
    branch: tuple[int, int] | None = None
    #: an assistant reply that was stopped or cut off at its token cap, the newest of its
    #: branch: "Continue" can go on from where it stopped
    can_continue: bool = False
    #: the newest reply of the branch: "Regenerate" makes another alternative of it
    can_regenerate: bool = False
    #: files attached to a user message: (name, tokens) for each chip
    attachments: list[tuple[str, int]] = field(default_factory=list)
    #: who spoke, when the message names its speaker (an imported group chat's ``name``),
    #: or the app an imported reply was written in ("ChatGPT": not Iris)
    name: str = ""
    #: a message whose stored text is damaged on disk (read with U+FFFD): what is wrong,
    #: what it means and what can be done, in words for the user; "" when it reads whole
    damaged: str = ""
    #: a reply a server's content filter cut short (its request's finish reason, or the
    #: ``"finish_reason"`` of an imported export): its card says so, as the export does
    filtered: bool = False

    @property
    def speaker(self) -> str:
        """The header's word: the message's own speaker name, else You, Iris, …; an
        app's notice: "Iris could not answer" (an error) or "Note"."""
        if self.kind == "notice":
            return "Iris could not answer" if self.error else "Note"
        if self.name and self.role in ("user", "assistant"):
            return self.name
        return ROLE_LABELS.get(self.role, self.role.capitalize())

    @property
    def dimmed(self) -> bool:
        return self.state in DIMMED_STATES

    @property
    def pruned(self) -> bool:
        return self.state == "pruned"

    def copy_text(self) -> str:
        """What "Copy" puts on the clipboard."""
        if self.kind == "tool":
            return f"{self.tool_name}({self.arguments})\n\n{self.text}"
        if self.kind == "divider":
            return self.title + "\n\n" + "\n\n".join(f"{k}:\n{v}" for k, v in self.fields)
        extra = "".join(f"\n→ {c}" for c in self.calls)
        return self.text + extra


def sum_sentence(b: Breakdown) -> str:
    """The meter's total as the sum of its parts: "Next request: system 29 + history 113 +
    draft 9 = 151 of 8,192 tokens" (parts of 0 left out, the system prompt always in)."""
    parts = [(name, getattr(b, name)) for name in METER_PARTS]
    shown = [f"{name} {tokens(n)}" for name, n in parts if n or name == "system"]
    return (f"Next request: {' + '.join(shown)} = {tokens(b.used)} of the "
            f"{tokens(b.window)}-token window (the bar above)")


#: arguments nested too deeply to write again, their text not at hand (json recurses per
#: level: 960 deep raised six times on the window's thread, replies stayed "streaming")
TOO_DEEP = "(arguments nested too deeply to show)"


def pretty_arguments(raw: Any) -> str:
    """Tool arguments (JSON text, or the value) indented; text not JSON, or nested too
    deeply to parse or write again, as it is."""
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
        return json.dumps(value, ensure_ascii=False, indent=2)
    except (ValueError, RecursionError):
        return raw if isinstance(raw, str) else TOO_DEEP


def arguments_text(arguments: str) -> str:
    """Tool arguments for reading: one ``name: value`` per argument, strings unescaped
    (an edit command shows as the lines it writes, not as one JSON string); text that is
    not JSON, or nests too deeply to parse or write again, as it is."""
    try:
        value = json.loads(arguments) if arguments else {}
        if not isinstance(value, dict):
            return arguments
        if not value:
            return "(no arguments)"
        return "\n".join(f"{k}: {v}" if isinstance(v, str) else
                         f"{k}: {json.dumps(v, ensure_ascii=False)}" for k, v in value.items())
    except (ValueError, RecursionError):
        return arguments


def call_label(call: Mapping[str, Any]) -> tuple[str, str]:
    """(name, arguments on one line) of a stored call (as :func:`pretty_arguments`)."""
    function = call.get("function") or {}
    name = str(function.get("name") or call.get("name") or "?")
    raw = function.get("arguments", call.get("arguments", {}))
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
        if isinstance(value, dict):
            return name, ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}"
                                   for k, v in value.items())
        return name, json.dumps(value, ensure_ascii=False)
    except (ValueError, RecursionError):
        return name, raw if isinstance(raw, str) else TOO_DEEP


def field_text(value: Any) -> str:
    """A summary field as readable text (lists become bullet lines)."""
    if value is None or value == "" or value == []:
        return "—"
    if isinstance(value, list):
        return "\n".join(f"• {v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}"
                         for v in value)
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False, indent=2)
    return str(value)


def divider_text(summary: SummaryRow, event: Mapping[str, Any] | None = None) -> str:
    """'Earlier turns summarized (turns 1–18, 41,200 → 3,100 tokens)'."""
    turns = (f"turn {summary.first_turn}" if summary.first_turn == summary.last_turn
             else f"turns {summary.first_turn}–{summary.last_turn}")
    before = event.get("tokens_before") if event else None
    after = event.get("tokens_after") if event else None
    if before is not None and after is not None:
        size = f"{tokens(before)} → {tokens(after)} tokens"
    else:
        size = f"summary {tokens(summary.tokens)} tokens"
    return f"Earlier turns summarized ({turns}, {size})"


def divider_entry(summary: SummaryRow, event: Mapping[str, Any] | None = None) -> Entry:
    fields = [(label, field_text(summary.fields.get(key))) for key, label in SUMMARY_FIELDS]
    # fields a newer compactor adds still show, after the known eight
    known = {k for k, _ in SUMMARY_FIELDS}
    fields += [(EXTRA_FIELD_LABELS.get(k, k), field_text(v)) for k, v in summary.fields.items()
               if k not in known]
    return Entry("divider", f"s:{summary.id}", title=divider_text(summary, event), fields=fields,
                 turn=summary.last_turn)


def transcript_entries(
    rows: Sequence[Mapping[str, Any]],
    summaries: Sequence[SummaryRow] = (),
    events: Sequence[Mapping[str, Any]] = (),
    states: Mapping[int, str] | None = None,
) -> list[Entry]:
    """Stored rows (oldest first) → transcript entries, with a divider after the last
    message each summary covers. Tool results become cards that carry their call's
    arguments; their text is always the full stored output."""
    events_by_summary = {e.get("summary_id"): e for e in events if e.get("summary_id")}
    pending = sorted(summaries, key=lambda s: (s.covers_through_id, s.id))
    calls: dict[str, tuple[str, str]] = {}
    entries: list[Entry] = []

    def flush_dividers(before_id: int | None) -> None:
        while pending and (before_id is None or pending[0].covers_through_id < before_id):
            summary = pending.pop(0)
            entries.append(divider_entry(summary, events_by_summary.get(summary.id)))

    for row in rows:
        flush_dividers(row["id"])
        message = row_to_message(dict(row))
        content = message.get("content")
        text = content if isinstance(content, str) else (
            "" if content is None else message_text({"content": content}))
        chips: list[tuple[str, int]] = []
        if row["role"] == "user":
            text, chips = shown(message) if isinstance(content, str) else (text, [])
        entry = Entry("message", f"m:{row['id']}", row["id"], row["role"], row["turn"], text,
                      row.get("status") or "complete", attachments=chips)
        if row["role"] in ("user", "assistant") and isinstance(message.get("name"), str):
            entry.name = " ".join(message["name"].split())
        entry.name = entry.name or imported_from(message)
        if row["role"] == "assistant":
            entry.filtered = message.get("finish_reason") == "content_filter"
            # the column, not row_to_message: a streamed reply's key list predates its calls
            raw_calls = row.get("tool_calls")
            tool_calls = json.loads(raw_calls) if isinstance(raw_calls, str) else (
                message.get("tool_calls") or [])
            for call in tool_calls:
                name, short = call_label(call)
                function = call.get("function") or {}
                calls[str(call.get("id"))] = (name, pretty_arguments(function.get("arguments", {})))
                entry.calls.append(f"{name}({short})")
        elif row["role"] == "tool":
            name, arguments = calls.get(str(message.get("tool_call_id")), ("", ""))
            entry.kind = "tool"
            entry.tool_name = message.get("name") or name or "tool"
            entry.arguments = arguments
            entry.error = text.lstrip().startswith("error")
        if states:
            entry.state = states.get(row["id"], entry.state)
        entries.append(entry)
    flush_dividers(None)
    return entries


def load_transcript(store: Store, thread_id: int, after_id: int = 0, points: Any = None) -> list[Entry]:
    """Every stored message of the thread's active branch with its dividers (states not applied yet), and what can
    be done with them: their place among their alternatives (``points(rows)``, default the thread's), regenerating
    the newest reply, continuing a stopped or cut-off one; ``after_id``: those after it only, without dividers."""
    rows = store.messages(thread_id, after_id)
    entries = transcript_entries(rows, *(() if after_id else (
        store.summaries(thread_id), store.compaction_events(thread_id, branch=True))))
    mark_entries(store, thread_id, entries, points(rows) if points else store.branch_points(thread_id))
    return entries


def mark_entries(store: Store, thread_id: int, entries: list[Entry], points: Mapping[int, Any],
                 newest: bool = True) -> None:
    """What can be done with ``entries`` (a branch's, oldest first): each message's place
    among its alternatives (``points``), and, when they end at the branch's newest
    (``newest``), Regenerate on the newest reply and Continue on a stopped one; and the
    messages found damaged on disk, with what that means."""
    messages = [e for e in entries if e.kind in ("message", "tool")]
    filtered = store.filtered_replies([e.message_id for e in messages if e.role == "assistant"])
    for entry in messages:
        entry.branch = points.get(entry.message_id)
        entry.filtered = entry.filtered or entry.message_id in filtered
    if newest:
        newest_user = max((i for i, e in enumerate(messages) if e.role == "user"), default=None)
        if newest_user is not None and newest_user + 1 < len(messages):
            reply = messages[newest_user + 1]
            reply.can_regenerate = reply.role == "assistant" and reply.status != "streaming"
        last = messages[-1] if messages else None
        if (last is not None and last.kind == "message" and last.text
                and store.stopped_reply(thread_id) == last.message_id):  # (an assistant's, no calls)
            last.can_continue = True
    damage = store.damaged  # found while reading these rows (or earlier on this Store)
    hurt = [e for e in messages if e.message_id in damage]
    remedy = damage_remedy(store) if hurt else ""
    for entry in hurt:
        entry.damaged = f"{damage[entry.message_id]}. {remedy}"


def damage_remedy(store: Store) -> str:
    """What a message damaged on disk means for its chat and what can be done, true of
    this history: ``recover`` is named only where it lists a copy set aside earlier (it
    cannot mend a message; before, the user would have been sent to a list of none)."""
    copies = len(set_aside_files(store.path))
    remedy = (f"'iris-desktop recover' lists {copies:,} earlier cop{'y' if copies == 1 else 'ies'} "
              "of the history Iris set aside, which may hold the text whole" if copies else
              "Iris keeps no second copy of a message: a backup of the data folder, or an "
              "export of this chat, may hold the text whole")
    return f"The rest of the chat reads normally; Iris has changed nothing in the history. {remedy}."


def message_states(engine: ContextEngine, request: ContextRequest) -> dict[int, str]:
    """message id → verbatim | pruned | clipped | summarized | dropped (``describe``),
    tokenizing nothing: a state needs no count (a long chat's every message was counted)."""
    return {m["id"]: m["state"] for m in engine.describe(request, count=False)}


# -- the budget meter ----------------------------------------------------------------------


@dataclass(frozen=True)
class MeterPart:
    name: str
    tokens: int
    fraction: float  # of the window


def _b(breakdown: Breakdown | Mapping[str, Any]) -> dict[str, Any]:
    return breakdown.as_dict() if isinstance(breakdown, Breakdown) else dict(breakdown)


def meter_parts(breakdown: Breakdown | Mapping[str, Any]) -> list[MeterPart]:
    """The stacked bar: system | tools | summary | recall | history | draft | free, exactly the
    engine's numbers (free may be negative when a request overflows; drawn as 0)."""
    b = _b(breakdown)
    window = max(int(b["window"]), 1)
    parts = [MeterPart(n, int(b[n]), int(b[n]) / window) for n in METER_PARTS]
    free = int(b["free"])
    parts.append(MeterPart("free", free, max(free, 0) / window))
    return parts


def threshold_fraction(breakdown: Breakdown | Mapping[str, Any]) -> float:
    b = _b(breakdown)
    return int(b["threshold"]) / max(int(b["window"]), 1)


# -- the live breakdown under the settings fields ------------------------------------------


def dropped_report(request: ContextRequest, described: Sequence[Mapping[str, Any]],
                   events: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any] | None:
    """What the next request leaves out and why, or None when it leaves nothing out:
    ``turns`` (first, last), ``messages``, ``tokens`` and ``why``, whole sentences that are
    never shortened (the inspector, the settings' breakdown and ``context`` print them in
    full). ``described``: the engine's ``describe(request)``; ``events``: the thread's
    compaction events, oldest first (the last one says why compaction has not covered
    these turns yet)."""
    dropped = [m for m in described if m.get("state") == "dropped"]
    if not dropped and not request.dropped_turns:
        return None
    turn_numbers = sorted({m["turn"] for m in dropped if m.get("turn") is not None})
    count = len(turn_numbers) or request.dropped_turns
    spent = sum(int(m.get("tokens") or 0) for m in dropped)
    b = request.breakdown
    budget = b.available - b.summary
    newer = b.history + b.draft
    if turn_numbers and turn_numbers[0] != turn_numbers[-1]:
        which = f"Turns {turn_numbers[0]}–{turn_numbers[-1]}"
    elif turn_numbers:
        which = f"Turn {turn_numbers[0]}"
    else:
        which = f"{count} older turn{'s' if count != 1 else ''}"
    plural = count != 1
    what = (f"{which} ({len(dropped):,} message{'s' if len(dropped) != 1 else ''}, "
            f"{tokens(spent)} tokens) {'are' if plural else 'is'} not sent to the model: "
            f"{'they do' if plural else 'it does'} not fit the {tokens(budget)}-token history "
            f"budget (window {tokens(b.window)} × ratio {b.ratio:g} − system {tokens(b.system)} "
            f"− tools {tokens(b.tools)} − summary {tokens(b.summary)}) beside the newer turns, "
            f"which take {tokens(newer)}, and no summary covers {'them' if plural else 'it'} "
            "yet.")
    them = "them" if plural else "it"
    last = events[-1] if events else None
    if last is not None and last.get("outcome") in ("failed", "skipped"):
        verb = "failed" if last["outcome"] == "failed" else "was skipped"
        reason = " ".join(str(last.get("error") or "no reason was recorded").split())
        after = (f"{'They stay' if plural else 'It stays'} stored; the last compaction "
                 f"({last.get('trigger')}) {verb}, so no summary holds {them}: "
                 f"{reason.rstrip('.')}.")
    else:
        after = (f"{'They stay' if plural else 'It stays'} stored, and compaction folds "
                 f"{them} into the summary before the next request is sent.")
    return {"turns": [turn_numbers[0], turn_numbers[-1]] if turn_numbers else None,
            "count": count, "messages": len(dropped), "tokens": spent,
            "why": f"{what} {after}"}


def cut_off(stats: Any, max_tokens: int, n_ctx: int | None = None) -> str | None:
    """Why a reply ended before the model finished it, in a clause (None: it finished,
    or was stopped or failed, which are said otherwise): the length limit, a window
    with no room left, or (a server) its own length limit with the window not full
    (``n_ctx``: the window; "filled the model's window" was said of 105 tokens in
    8,192). A reply that was all thinking (``thought_chars``: a server's reasoning,
    neither shown nor kept) says so: it looked empty. Before, a reply cut mid-sentence
    was shown as if complete."""
    if stats is not None and stats.finish_reason == "content_filter":  # (a server's: it cut
        return CONTENT_FILTERED  # the reply short; it was stored as finished, unsaid)
    if stats is None or stats.finish_reason != "length":
        return None
    thought = getattr(stats, "thought_chars", 0)
    thinking = (f"; the model was still thinking ({thought:,} characters of reasoning, "
                "not shown) and had not begun its answer") if thought and not getattr(
        stats, "answered", True) else ""
    if stats.completion_tokens >= max_tokens:
        return f"the reply reached model.max_tokens ({max_tokens:,} tokens){thinking}"
    sent = getattr(stats, "max_tokens_sent", None)  # a server: less where the window left less
    if sent is not None and sent < max_tokens and stats.completion_tokens >= sent:
        return (f"the reply used the room Iris left for it in the window ({sent:,} tokens; "
                f"Iris counted the prompt larger than the server did){thinking}")
    used = stats.prompt_tokens + stats.completion_tokens
    if n_ctx and used < n_ctx * WINDOW_FULL:
        return (f"the server ended the reply at its own length limit ({stats.completion_tokens:,} "
                f"tokens, below model.max_tokens; the window was not full: {used:,} of "
                f"{n_ctx:,} tokens){thinking}")
    return (f"the reply filled the model's window ({stats.prompt_tokens:,} tokens of prompt "
            f"and {stats.completion_tokens:,} of reply){thinking}")


def only_thought(stats: Any) -> str | None:
    """A reply that ended without a word of answer after the model's reasoning (a
    server's ``reasoning_content``, neither shown nor kept: the reply looked empty), in
    a sentence both faces say; None otherwise."""
    if getattr(stats, "answered", True) is False and getattr(stats, "thought_chars", 0):
        return "the model only thought (its reasoning is not shown) and wrote no answer"
    return None


def wrote_nothing(answer: str | None, finish_reason: str | None) -> str | None:
    """A turn whose last reply ended on its own (not stopped, cut off or failed) without
    a word (``answer``: its saved text, None when no reply was saved), in a clause both
    faces say, each with its own way to ask again; None otherwise. Before, the CLI exited
    0 with nothing on stdout and the window showed an empty reply and "Ready"."""
    if answer is None or answer.strip() or finish_reason != "stop":
        return None
    return "the model ended its reply without writing anything"


#: a reply cut off at "length" with prompt and reply below this share of the window did
#: not fill it (a server's own limit did)
WINDOW_FULL = 0.9


def dropped_status(request: ContextRequest | None, outcome: str | None = None) -> str | None:
    """The status bar's sentence when the next request leaves turns out: short enough for
    the bar, and whole (the full why is the inspector's, :func:`dropped_report`); None
    when nothing is left out. ``outcome``: the compaction that just ran (failed, skipped)."""
    if request is None or not request.dropped_turns:
        return None
    n = request.dropped_turns
    lead = {"failed": "Compaction failed: ", "skipped": "Compaction skipped: "}.get(outcome or "", "")
    sentence = (f"{n:,} older turn{'s are' if n != 1 else ' is'} not sent; the inspector "
                "(Ctrl+I) says why.")
    return lead + (sentence if lead else sentence[0].upper() + sentence[1:])


@dataclass
class BudgetPreview:
    """What candidate settings would do to the current thread's next request."""

    window: int
    window_source: str
    ratio: float
    threshold_ratio: float
    breakdown: Breakdown | None = None
    error: str | None = None
    counter: str = ""
    counter_exact: bool = False
    history_turns: int = 0  # turns in the request
    unsummarized_turns: int = 0
    dropped_turns: int = 0
    protect_configured: int = 0
    protect_turns: int = 0
    fallback: bool = False
    protected_outputs: int = 0
    pruned_outputs: int = 0
    compaction_due: bool = False
    triggers: list[str] = field(default_factory=list)
    last_prompt_tokens: int | None = None
    min_turns: int = 0
    recall_max: int = 0
    recalled: int = 0  # summarized messages recalled for the draft
    #: what is left out and why, in full (``dropped_report``'s ``why``)
    dropped_why: str = ""

    def lines(self) -> list[str]:
        """Plain sentences, one per fact, for the dialog (``budget_lines``)."""
        return budget_lines(self)


def budget_preview(
    store: Store,
    planner: Planner,
    thread_id: int | None,
    draft: str | None = None,
) -> BudgetPreview:
    """The next request of ``thread_id`` under the candidate settings ``planner`` was
    made from, explained. Never modifies stored messages; ``thread_id`` None shows only
    the budget."""
    p = planner.params
    preview = BudgetPreview(
        window=p.window, window_source=p.window_source, ratio=p.token_budget_ratio,
        threshold_ratio=p.compaction_threshold, counter=planner.counter.name,
        counter_exact=bool(getattr(planner.counter, "exact", False)),
        protect_configured=p.prune_protect_turns, min_turns=p.compaction_min_turns,
        recall_max=p.recall_max_tokens,
    )
    try:
        request = planner.plan(store, thread_id if thread_id is not None else -1, draft)
    except ConversationTooLargeException as exc:
        preview.error = f"Conversation too large: {exc}"
        return preview
    preview.counter_exact = preview.counter_exact or request.exact
    preview.breakdown = request.breakdown
    if thread_id is None:
        return preview
    described = planner.engine(store).describe(request)
    included = set(request.included_ids)
    preview.history_turns = len({m["turn"] for m in described if m["id"] in included})
    preview.unsummarized_turns = request.unsummarized_turns - (1 if draft is not None else 0)
    preview.dropped_turns = request.dropped_turns
    dropped = dropped_report(request, described, store.compaction_events(thread_id, branch=True))
    preview.dropped_why = dropped["why"] if dropped else ""
    preview.recalled = len(request.recall.ids)
    preview.protect_turns = request.protect_turns
    preview.fallback = request.fallback
    preview.pruned_outputs = len(request.pruned_ids)
    preview.protected_outputs = sum(
        1 for m in described if m["role"] == "tool" and m["state"] == "verbatim")
    preview.compaction_due = request.compaction_due
    preview.triggers = list(request.triggers)
    preview.last_prompt_tokens = request.last_prompt_tokens
    return preview


# -- the settings dialog -------------------------------------------------------------------

SECTION_TITLES = {"context": "Context", "model": "Model", "models": "Downloads", "tools": "Tools",
                  "chat": "Chat", "storage": "Storage"}


def settings_sections(
    settings: Mapping[str, Setting] | None = None,
) -> list[tuple[str, str, list[Setting]]]:
    """(section, page title, settings) for every section in SETTINGS, known ones first.

    The dialog makes one page per section and one field per setting, so a key added to
    SETTINGS appears with no UI change.
    """
    settings = SETTINGS if settings is None else settings
    by_section: dict[str, list[Setting]] = {}
    for setting in settings.values():
        by_section.setdefault(setting.section, []).append(setting)
    order = [s for s in SECTION_TITLES if s in by_section]
    order += sorted(s for s in by_section if s not in SECTION_TITLES)
    return [(s, SECTION_TITLES.get(s, s.replace("_", " ").capitalize()), by_section[s])
            for s in order]


def ratio_meaning(key: str, values: Mapping[str, Any], window: int) -> str:
    """What a ratio setting means in tokens for ``window``, for beside its slider."""
    value = float(values[key])
    if key == "context.keep_recent_ratio":
        trigger = window * float(values.get("context.compaction_threshold", 0.75))
        return f"≈ {tokens(value * trigger)} tokens of the {tokens(trigger)}-token red line"
    return f"= {tokens(math.floor(window * value))} of {tokens(window)} tokens"


def field_label(setting: Setting) -> str:
    """'context.token_budget_ratio' → 'Token budget ratio'."""
    return setting.key.split(".", 1)[1].replace("_", " ").capitalize()


def field_hint(setting: Setting) -> str:
    """The help text plus the allowed values and unit, for under the field."""
    unit = f" ({setting.unit})" if setting.unit else ""
    reload = " Changing it reloads the model." if setting.needs_reload else ""
    return f"{setting.help} Allowed: {setting.describe_allowed()}{unit}.{reload}"


def locked_reason(settings: Settings, key: str, trying: Collection[str] = ()) -> str | None:
    """Why a field cannot be edited here (set by the environment or --set, or ``trying``:
    the model chosen in the window is loading with it), or None."""
    source = settings.source(key)
    if source == "env":
        return f"Set by the environment variable {SETTINGS[key].env_var}; unset it to edit here."
    if source == "cli" and key in trying:
        return ("Being tried: the model you chose is loading with it; it is saved once the "
                "model has loaded.")
    if source == "cli":
        return f"Set for this run with --set {key}=…; it is not saved."
    return None


def parse_fields(
    base: Settings, raw: Mapping[str, Any]
) -> tuple[Settings, dict[str, str]]:
    """Candidate settings from the dialog's raw field values, and an error per bad key.

    A bad value keeps the base value in the candidate; the error is SettingsError's text.
    """
    values = dict(base.values)
    sources = dict(base.sources)
    errors: dict[str, str] = {}
    for key, value in raw.items():
        try:
            parsed = SETTINGS[key].parse(value)
        except SettingsError as exc:
            errors[key] = str(exc)
            continue
        if parsed != base.values.get(key):
            values[key] = parsed  # saved, a default is removed from the file (not PINNED)
            sources[key] = ("default" if parsed == SETTINGS[key].default and key not in PINNED
                            else "file")
    return Settings(values, sources, list(base.problems), base.config_path,
                    base.file_unreadable), errors


def changed_keys(base: Settings, candidate: Settings) -> list[str]:
    """Keys whose value differs, in SETTINGS order, leaving out locked ones."""
    return [k for k in SETTINGS
            if candidate.values.get(k) != base.values.get(k) and locked_reason(base, k) is None]


def needs_reload(keys: Iterable[str]) -> list[str]:
    return [k for k in keys if k in SETTINGS and SETTINGS[k].needs_reload]


# -- the context inspector -----------------------------------------------------------------


#: why recall is not reranked when the setting says so
RERANK_OFF = "context.recall_rerank is off"


def rerank_fact(recall: Recall, planner: Planner, problem: str | None = None) -> dict[str, Any]:
    """Whether this request's recall was reranked by the cross-encoder (``reranked``), and
    when not, why in one sentence (``rerank_reason``): the setting is off, the reranker
    could not load (``problem``: the host's ``reranker_problem``), none is loaded, nothing
    was recalled, or the reranker itself did not reorder (it failed). ``context --json``
    and the inspector show the same fact."""
    if recall.reranked:
        return {"reranked": True, "rerank_reason": None}
    if not planner.rerank:
        reason = RERANK_OFF
    elif planner.reranker is None:  # the host's sentence, without its "recall is not reranked: "
        reason = (problem or "").removeprefix("recall is not reranked: ") or "the reranker is not loaded"
    elif not recall.ids:
        reason = f"nothing was recalled ({recall.reason})" if recall.reason else "nothing was recalled"
    else:
        reason = recall.rerank_reason or "the reranker did not reorder the candidates"
    return {"reranked": False, "rerank_reason": reason}


def inspector_report(
    store: Store, planner: Planner, thread_id: int, draft: str | None = None,
    request: ContextRequest | ConversationTooLargeException | None = None,
    rerank_problem: str | None = None, embedder_problem: str | None = None,
) -> dict[str, Any]:
    """Everything the inspector dock shows for one thread. Never modifies messages.

    ``request``: one row per message of the exact next request (system first), with its
    state and the tokens it costs there; ``states``: how many stored messages are in
    each state; ``summaries``, ``events``, ``requests``: the stored telemetry. Pass the
    planner's ``request`` when one is at hand (the agent reported it), else it is planned.
    ``rerank``: whether recall was reranked, and why not (:func:`rerank_fact`;
    ``rerank_problem`` is the host's ``reranker_problem``); ``embedder_problem``: the
    host's, why recall by meaning does not use the embedder the settings name.
    """
    report: dict[str, Any] = {"thread_id": thread_id, "error": None, "request": [],
                              "states": {}, "breakdown": None, "dropped": None,
                              "embedder_problem": embedder_problem}
    if request is None:
        request = planner.plan_or_error(store, thread_id, draft)
    if isinstance(request, ConversationTooLargeException):
        report["error"] = f"Conversation too large: {request}"
    else:
        engine = planner.engine(store)
        described = {m["id"]: m for m in engine.describe(request)}
        counts: dict[str, int] = {}
        for m in described.values():
            counts[m["state"]] = counts.get(m["state"], 0) + 1
        dropped = dropped_report(request, list(described.values()),
                                 store.compaction_events(thread_id, branch=True))
        report.update(
            dropped=dropped,
            request=_request_rows(engine, request, described, draft), states=counts,
            breakdown=request.breakdown.as_dict(), protect_turns=request.protect_turns,
            fallback=request.fallback, compaction_due=request.compaction_due,
            triggers=list(request.triggers), counter=request.counter,
            predicted_prompt_tokens=request.predicted_prompt_tokens,
            exact=request.exact or bool(getattr(planner.counter, "exact", False)),
            recalled_ids=list(request.recall.ids),
            recalled=_recalled(store, request.recall.ids),
            rerank=rerank_fact(request.recall, planner, rerank_problem),
        )
        if report["recalled"]:  # the recall row names its messages, not only their count
            row = next(r for r in report["request"] if r["state"] == "recalled")
            row["preview"] = (f"{len(report['recalled'])} summarized messages recalled for "
                              f"“{' '.join(request.recall.terms[:8])}”: " + "; ".join(
                                  f"#{m['id']} {m['speaker']}: {m['preview']}"
                                  for m in report["recalled"]))
    report.update(_telemetry(store, thread_id))
    return report


def _request_rows(engine: ContextEngine, request: ContextRequest,
                  described: Mapping[int, dict[str, Any]], draft: str | None
                  ) -> list[dict[str, Any]]:
    """One row per message of the request as sent; the rows' tokens add up to the
    predicted prompt (template framing is in the system row)."""
    b = request.breakdown
    rows: list[dict[str, Any]] = [{
        "id": None, "role": "system", "turn": None, "state": "verbatim",
        "tokens": b.system + b.tools + b.summary,
        "preview": _preview(request.messages[0].get("content")),
    }]
    for mid, message in zip(request.included_ids, request.messages[1:]):
        meta = described.get(mid, {})
        cost = meta["sent_tokens"] if "sent_tokens" in meta else engine.counter.count_message(message)
        rows.append({"id": mid, "role": message["role"], "turn": meta.get("turn"),
                     "state": meta.get("state", "verbatim"), "tokens": cost,
                     "preview": _preview(message.get("content") or message_text(message))})
    if draft is not None:
        rows.append({"id": None, "role": "user", "turn": None, "state": "draft",
                     "tokens": b.draft, "preview": _preview(draft)})
    if request.recall.ids:  # the block travels with the newest user message
        at = max(i for i, r in enumerate(rows) if r["role"] == "user")
        rows.insert(at, {
            "id": None, "role": "recall", "turn": None, "state": "recalled",
            "tokens": b.recall,
            "preview": f"{len(request.recall.ids)} summarized messages recalled for "
                       f"“{' '.join(request.recall.terms[:8])}”: ids "
                       + ", ".join(str(i) for i in request.recall.ids)})
    return rows


def _recalled(store: Store, ids: Sequence[int]) -> list[dict[str, Any]]:
    """Each recalled message: its id, who wrote it and the start of its text."""
    rows = store.messages_by_id(list(ids))
    out = []
    for mid in ids:
        row = rows.get(mid)
        if row is None:
            continue
        message = row_to_message(dict(row))
        speaker = Entry("message", "", role=row["role"],
                        name=message.get("name") or imported_from(message)).speaker
        out.append({"id": mid, "role": row["role"], "speaker": speaker,
                    "preview": _preview(message.get("content") or message_text(message), 60)})
    return out


def _telemetry(store: Store, thread_id: int) -> dict[str, Any]:
    """The stored history of a thread's context: summaries, compactions, requests."""
    summaries = [
        {"id": s.id, "prev_id": s.prev_id, "turns": f"{s.first_turn}–{s.last_turn}",
         "covers_through_id": s.covers_through_id, "tokens": s.tokens, "path": s.path,
         "created_at": s.created_at,
         "fields": [(label, field_text(s.fields.get(key))) for key, label in SUMMARY_FIELDS]}
        for s in store.summaries(thread_id)
    ]
    events = store.compaction_events(thread_id, branch=True)
    requests = [
        {"id": r["id"], "created_at": r["created_at"],
         "prompt_tokens": r.get("prompt_tokens"),
         "predicted": r.get("predicted_prompt_tokens"), "window": r.get("window"),
         "reused": r.get("reused_tokens"), "evaluated": r.get("evaluated_tokens"),
         "ttft": r.get("time_to_first_token_s"), "tps": r.get("tokens_per_s")}
        for r in store.requests(thread_id, branch=True)
    ]
    return {"summaries": summaries, "events": events, "requests": requests,
            "chart": chart_points(requests, events)}


def _preview(content: Any, limit: int = 160) -> str:
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    text = " ".join((text or "").split())
    if text == PRUNED_PLACEHOLDER:
        return text
    return text if len(text) <= limit else text[: limit - 1] + "…"


def chart_points(
    requests: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Prompt tokens per request (reported, else predicted) and the request index at
    which each compaction happened (it falls between two requests)."""
    values = [int(r.get("prompt_tokens") or r.get("predicted") or 0) for r in requests]
    times = [r.get("created_at") or 0 for r in requests]
    marks = []
    for event in events:
        at = event.get("created_at") or 0
        index = sum(1 for t in times if t <= at)
        marks.append({"index": index, "outcome": event.get("outcome"),
                      "trigger": event.get("trigger")})
    window = max([int(r.get("window") or 0) for r in requests] or [0])
    return {"values": values, "compactions": marks, "window": window}
