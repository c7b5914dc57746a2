"""The budget meter's words: its numbers as rows (the window draws them as a table, whose
columns line up in any font: padded with spaces, they zig-zagged in the tooltip's
proportional font) and as plain text, and the sentences that say what its two lines are.

The lines, as the engine uses them (``engine._triggers``): the dashed line is the budget
(window × token_budget_ratio), past which the oldest turns are not sent; the red line is
window × compaction_threshold, which the last request's prompt may reach. Compaction is
due at whichever comes first (or at the turn count, context.compaction_min_turns); with
the defaults (0.70 < 0.75) it is mostly the dashed line."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from iris_desktop.core.engine import Breakdown
from iris_desktop.core.views import METER_PARTS, tokens

#: what "Free" is: window − used, where the reply is written (up to model.max_tokens of it:
#: "room for the reply" read as the reply's length, 7,999 beside a cap of 1,024)
FREE_LABEL = "Free (the reply is written here, up to model.max_tokens)"

#: when summaries start, true to the engine's triggers (the red line alone was said)
WHEN_SUMMARIZED = ("Summaries start when the oldest turns no longer fit the budget (the dashed "
                   "line) or a request reaches the red line, whichever comes first, or after "
                   "a set number of turns (Preferences ▸ Context).")


def _b(breakdown: Breakdown | Mapping[str, Any]) -> dict[str, Any]:
    return breakdown.as_dict() if isinstance(breakdown, Breakdown) else dict(breakdown)


def meter_heading(breakdown: Breakdown | Mapping[str, Any], estimated: bool = False) -> str:
    b = _b(breakdown)
    return (f"Context window: {tokens(b['window'])} tokens"
            + (" (counts estimated, not the model's own)" if estimated else " (exact counts)"))


def meter_rows(breakdown: Breakdown | Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, number) for each part, then Used and Free: the engine's own numbers."""
    b = _b(breakdown)
    rows = [(name.capitalize(), tokens(b[name])) for name in METER_PARTS]
    return [*rows, ("Used", tokens(b["used"])), (FREE_LABEL, tokens(b["free"]))]


def meter_lines(breakdown: Breakdown | Mapping[str, Any]) -> list[str]:
    """The sentences under the numbers: the two lines, and when summaries start."""
    b = _b(breakdown)
    return [f"Budget (the dashed line): window × {b['ratio']:g} = {tokens(b['budget'])} "
            f"tokens; {tokens(b['available'])} of them for summary + history.",
            f"Red line: {tokens(b['threshold'])} tokens.",
            WHEN_SUMMARIZED]


def meter_tooltip(breakdown: Breakdown | Mapping[str, Any], estimated: bool = False) -> str:
    """The numbers, one per line, as plain text (for a monospaced terminal; the window
    draws ``meter_rows`` as a table); says when they are estimates (no model tokenizer,
    or a server that cannot count)."""
    rows = meter_rows(breakdown)
    width = max(len(label) for label, _ in rows)
    return "\n".join([meter_heading(breakdown, estimated),
                      *(f"{label:<{width}} {number:>9}" for label, number in rows),
                      *meter_lines(breakdown)])
