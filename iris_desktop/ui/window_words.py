"""The two windows of Preferences in words: the context the model is loaded with
(``model.n_ctx``) and the part of it that Iris budgets (``context.window``), said in one
line so that they never read as two contradicting "windows"; the sentence a candidate
``model.n_ctx`` below the window gets (it was worded as the loaded model's); and the
sentence a meter shows instead of its bar when a chat does not fit (it was empty).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from iris_desktop.core.views import BudgetPreview
from iris_desktop.settings import AUTO

#: words of an engine refusal that already says what to do (the system prompt and tools
#: alone fill the budget: "..., or raise context.window")
SAYS_WHAT_TO_DO = "raise context.window"


@dataclass
class PreferencesPreview(BudgetPreview):
    """A BudgetPreview with the model's context beside the window it budgets: ``n_ctx``
    the tokens the model holds (``n_ctx_source`` "loaded", or "server"), or will hold
    after the reload the candidate asks for ("reload"; "load" with none loaded now); None
    with "" (no model loaded) or "other" (another model file, its size known once it
    loads)."""

    n_ctx: int | None = None
    n_ctx_source: str = ""

    @classmethod
    def of(cls, preview: BudgetPreview, n_ctx: int | None, source: str) -> PreferencesPreview:
        values = {f.name: getattr(preview, f.name) for f in fields(BudgetPreview)}
        return cls(**values, n_ctx=n_ctx, n_ctx_source=source)


def window_line(window: int, configured: Any, n_ctx: int | None, source: str) -> str:
    """One line with both numbers: "Model loaded at 8,192 tokens (model.n_ctx); Iris uses
    4,096 of them (context.window)" (the status bar said "8,192-token window" beside a
    meter of 4,096)."""
    key = "context.window" if configured != AUTO else "context.window: auto"
    if not n_ctx:
        why = {"other": "model.n_ctx, for the model chosen here; its own limit is known once "
                        "it loads"}.get(source, "model.n_ctx; no model is loaded")
        return f"Window: {window:,} tokens ({key if configured != AUTO else why})."
    head = {"reload": f"The model would reload at {n_ctx:,} tokens (model.n_ctx)",
            "load": f"The model would load at {n_ctx:,} tokens (model.n_ctx)",
            "server": f"The server runs the model at {n_ctx:,} tokens"}.get(
                source, f"Model loaded at {n_ctx:,} tokens (model.n_ctx)")
    used = "all of them" if window >= n_ctx else f"{window:,} of them"
    return f"{head}; Iris uses {used} ({key})."



def window_label(n_ctx: int, planner: Any) -> str:
    """The status bar's words for the window beside the model's name: "8,192-token window",
    or "4,096 of 8,192 tokens" when ``context.window`` budgets less than the model holds
    (the label said "8,192-token window" beside a meter of 4,096)."""
    window = getattr(getattr(planner, "params", None), "window", None)
    if isinstance(window, int) and 0 < window < n_ctx:
        return f"{window:,} of {n_ctx:,} tokens"
    return f"{n_ctx:,}-token window"

def reload_problems(candidate: Any, current: Any, n_ctx: int,
                    verb: str = "reload") -> dict[str, str]:
    """A candidate window above the ``n_ctx`` a candidate ``model.n_ctx`` reloads the model
    at, said as what it is (it read "more than the loaded model's n_ctx of 2,048" while the
    loaded model held 8,192): under model.n_ctx, the field that asks for the reload, and
    under context.window too when that was changed here. OK stays disabled, as before.
    ``verb``: "load" while no model is loaded."""
    window = int(candidate["context.window"])
    problems = {"model.n_ctx": (
        f"model.n_ctx: the model would {verb} at {n_ctx:,} tokens, fewer than "
        f"context.window's {window:,}; use {window:,} or more, or lower context.window")}
    if candidate["context.window"] != current["context.window"]:
        problems["context.window"] = (
            f"context.window: {window:,} tokens is more than the {n_ctx:,} tokens the model "
            f"would {verb} at (model.n_ctx); lower it, or raise model.n_ctx")
    return problems


def too_large_sentence(error: str) -> str:
    """The engine's refusal for the values shown (``BudgetPreview.error``: "Conversation
    too large: …"), as one sentence that ends with what to do."""
    error = error.rstrip(". ")
    if SAYS_WHAT_TO_DO in error:
        return f"{error}."
    return f"{error}; raise context.window or context.token_budget_ratio for this chat to fit."
