"""When the window loads the model in use again without being asked (``ModelControl``,
after a turn): what the planner was made with no longer holds. Qt-free: it reads the
runtime's and the loaded model's facts only."""

from __future__ import annotations

from typing import Any

from iris_desktop.runtime.first_use import WARM_UP


def reload_reason(runtime: Any, info: dict[str, Any], planner: Any) -> str | None:
    """Why the model in use is loaded again now, in a sentence said once it is ("": nothing
    to say), or None when it need not be:

    * its GPU failed during a reply or a warm-up (``gpu_failed``: recorded off for Iris, so
      the load plans the CPU; before, every next reply failed the same way until the user
      reloaded);
    * the server said mid-reply that it now runs another window (restarted with ``-c 512``:
      every send failed "the prompt is 566 tokens but the context window is 512" while the
      status bar still said 1,024);
    * the user has just agreed to send the server the conversation: its exact counts
      replace the estimate counted before (a connect only probes the server; nothing of the
      chat is sent)."""
    failed = getattr(runtime, "gpu_failed", None)
    if failed:
        during = WARM_UP if f"during {WARM_UP}" in failed else "the reply"
        return f"The GPU failed during {during}, so Iris loaded the model again on the CPU"
    if not info.get("base_url"):
        return None
    if runtime.n_ctx != info.get("n_ctx"):
        return (f"The server now runs a {runtime.n_ctx:,}-token window (it ran {info['n_ctx']:,}); "
                "Iris uses it from now on")
    if runtime.capabilities.exact_counts and planner is not None and ":estimated:" in planner.counter.name:
        return ""
    return None
