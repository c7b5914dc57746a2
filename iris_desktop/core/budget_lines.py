"""The live budget's breakdown in sentences (Preferences, under the pages), in plain words:
what one request may fill (the meter's dashed line), what is sent, what recall adds, when
older turns are summarized (the dashed line, the red line, the turn count: whichever comes
first), and which turns keep their tool output. ``BudgetPreview.lines`` (``core.views``)
says them; this module has them so that views stays within its size.

Also the note under "When older turns are summarized" when its red line lies at or above
the request budget: a request, bounded by the budget, then hardly ever reaches it."""

from __future__ import annotations

from typing import Any

from iris_desktop.core.engine import PRUNED_PLACEHOLDER

#: why a summary is due, by the engine's trigger names
TRIGGER_WORDS = {
    "budget": "the oldest turns no longer fit the budget",
    "tokens": "the last request reached the red line",
    "turns": "the turn count was reached",
}


def tokens(n: int | float | None) -> str:
    """12345 → '12,345'; None → '–'."""
    return "–" if n is None else f"{int(n):,}"


def plural(n: int, word: str) -> str:
    """'1 turn', '2 turns'."""
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def counter_label(name: str) -> str:
    """What counts the tokens, in words: a counter's ``name`` is a cache key
    (``model:2ac093d88508:2:jinja``), not something to show a person."""
    kind = name.split(":", 1)[0]
    if kind == "model":
        return "the model's own tokenizer"
    if kind == "server":
        return ("tiktoken, scaled to the server's counts" if ":estimated:" in name
                else "the server's tokenizer")
    if kind == "tiktoken":
        return f"tiktoken ({name.split(':', 1)[1]})"  # tiktoken (cl100k_base)
    if kind == "heuristic":
        return "an estimate of about 4 characters a token"
    return name


def _history(p: Any, history_budget: int) -> list[str]:
    b, out = p.breakdown, []
    if p.unsummarized_turns:
        fit = ("all of them fit" if not p.dropped_turns else
               f"{plural(p.dropped_turns, 'older turn')} do not fit")
        out.append(f"History: {p.history_turns:,} of the {plural(p.unsummarized_turns, 'turn')} "
                   f"not yet summarized are sent, {tokens(b.history)} tokens; {fit}")
        if p.dropped_why:
            out.append(p.dropped_why)
    else:
        out.append("History: this thread has no messages yet")
    if not p.recall_max:
        out.append("Recall: off")
    elif b.recall:
        out.append(f"Recall: {tokens(b.recall)} tokens, {p.recalled} summarized message(s) "
                   f"found for the draft (at most {tokens(p.recall_max)}, from what the "
                   "history leaves free)")
    elif b.summary:
        left = max(history_budget - b.history - b.draft, 0)
        out.append(f"Recall: up to {tokens(min(p.recall_max, left))} tokens of summarized "
                   "messages that match your next message")
    else:
        out.append(f"Recall: up to {tokens(p.recall_max)} tokens, once a summary exists")
    return out


def _summaries(p: Any) -> list[str]:
    b = p.breakdown
    last = ("" if p.last_prompt_tokens is None
            else f"; the last request was {tokens(p.last_prompt_tokens)}")
    due = ("a summary is due: " + ", ".join(TRIGGER_WORDS.get(t, t) for t in p.triggers)
           if p.compaction_due else "no summary is due")
    out = [f"Red line: {tokens(b.threshold)} tokens ({p.threshold_ratio:g} × window){last}; {due}"]
    if p.min_turns:
        out.append(f"By count: older turns are also summarized once {p.min_turns:,} turns are "
                   f"not yet summarized (now {p.unsummarized_turns:,})")
    return out


def _tool_output(p: Any) -> str:
    cleared = (f"{plural(p.pruned_outputs, 'older output')} shown to the model as "
               f"'{PRUNED_PLACEHOLDER}' (your history keeps them)")
    if p.protect_turns:
        text = (f"Tool output: the newest {plural(p.protect_turns, 'turn')} keep theirs "
                f"({plural(p.protected_outputs, 'output')}); {cleared}")
    else:
        text = f"Tool output: no turn keeps its tool output; {cleared}"
    if p.fallback:
        text += (f" — fewer turns keep it than set ({p.protect_turns} of "
                 f"{p.protect_configured}): theirs did not fit")
    return text


def budget_lines(p: Any) -> list[str]:
    """Plain sentences, one per fact, for the dialog: ``p`` is a ``views.BudgetPreview``."""
    budget = int(p.window * p.ratio)
    out = [f"Window {tokens(p.window)} tokens ({p.window_source}) × ratio {p.ratio:g} = "
           f"budget {tokens(budget)} (the dashed line)"]
    if p.breakdown is None:
        out.append(p.error or "No thread is open: only the budget is shown.")
        return out
    b = p.breakdown
    out.append(f"− system {tokens(b.system)} − tools {tokens(b.tools)} = available "
               f"{tokens(b.available)} tokens")
    history_budget = b.available - b.summary
    if b.summary:
        out.append(f"− summary {tokens(b.summary)} = {tokens(history_budget)} tokens for "
                   "the history sent word for word")
    out += _history(p, history_budget) + _summaries(p)
    out.append(_tool_output(p))
    out.append(f"Counted with {counter_label(p.counter)}"
               + ("" if p.counter_exact else " (approximate)"))
    return out


def threshold_note(values: dict[str, Any]) -> str:
    """The note under "When older turns are summarized" when its red line is at or above
    the request budget ('' when it is below): a request never fills more than the budget,
    so summaries start when the oldest turns no longer fit it, before the red line; the
    red line then still sizes what stays word for word after a summary."""
    threshold = float(values["context.compaction_threshold"])
    ratio = float(values["context.token_budget_ratio"])
    if threshold < ratio:
        return ""
    return (f"Note: at or above the request budget ({ratio:g}), which a request does not "
            "exceed, this line is seldom reached: summaries start when the oldest turns no "
            "longer fit the budget, or after a reply that leaves the next request within one "
            "typical turn of this line. It still sets how much stays word for word after a "
            f"summary. Below {ratio:g}, summaries start earlier.")
