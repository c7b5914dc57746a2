"""Small helpers the tests (and the benchmarks) share."""

from __future__ import annotations

from typing import Any

from iris_desktop.core.compaction import CompactionEvent, CompactionSettings, Compactor
from iris_desktop.core.engine import ContextParams
from iris_desktop.core.planner import Planner
from iris_desktop.core.store import Store
from iris_desktop.core.tokens import TokenCounter


def compactor_for(store: Store, counter: TokenCounter, params: ContextParams,
                  settings: CompactionSettings | None = None, **kw: Any) -> Compactor:
    """A Compactor through a planner of these parts (what the app builds from settings)."""
    return Compactor(store, Planner(params, counter, compaction=settings), **kw)


def compact_while_due(compactor: Compactor, thread_id: int, limit: int = 12
                      ) -> list[CompactionEvent]:
    """Compact until no trigger is due (an imported long chat); stops at the first event
    that is not ``ok``."""
    events: list[CompactionEvent] = []
    for _ in range(limit):
        trigger, _ = compactor.check(thread_id)
        if trigger == "none":
            break
        events.append(compactor.compact(thread_id, trigger))
        if events[-1].outcome != "ok":
            break
    return events


def complete(model: Any, messages: list[dict], **kw: Any) -> tuple[str, Any]:
    """The whole reply and its statistics (a stream, joined)."""
    text = "".join(model.stream(messages, **kw))
    return text, model.last_stats
