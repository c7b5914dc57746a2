"""A scripted runtime for what the real model cannot do on demand (a given tool call)."""

from __future__ import annotations

import threading
import time

from iris_desktop.core.tokens import HeuristicCounter
from iris_desktop.runtime.model import GenerationStats


class ScriptedRuntime:
    """Replies with the scripted texts in order; each reply streams word by word.

    A script item may be a string, an Exception (raised mid-stream after one word), or a
    callable taking the request messages and returning a string. With ``cut_at_cap``, a
    reply longer than ``max_tokens`` words stops there with ``finish_reason == "length"``,
    as a real model's does. ``deadlines`` holds each call's deadline, as seconds from the
    call.
    """

    def __init__(self, replies, n_ctx: int = 8192, counter=None, delay_s: float = 0.0,
                 cut_at_cap: bool = False):
        self.replies = list(replies)
        self.cut_at_cap = cut_at_cap
        self.deadlines: list[float | None] = []
        self.n_ctx = n_ctx
        self._counter = counter or HeuristicCounter()
        self.delay_s = delay_s
        self.requests: list[list[dict]] = []
        self.last_stats: GenerationStats | None = None
        self.started = threading.Event()

    def counter(self):
        return self._counter

    def stream(self, messages, *, max_tokens, temperature=0.7, cancel=None, deadline=None, **_):
        self.requests.append(messages)
        self.deadlines.append(None if deadline is None else deadline - time.monotonic())
        item = self.replies.pop(0) if self.replies else "(no more scripted replies)"
        text = item(messages) if callable(item) and not isinstance(item, Exception) else item
        prompt = self._counter.prompt_overhead() + sum(
            self._counter.count_message(m) for m in messages
        )
        pieces = (text if isinstance(text, str) else "partial reply").split(" ")
        finish = "stop"
        produced = 0
        for i, word in enumerate(pieces):
            if (cancel is not None and cancel.is_set()) or (
                    deadline is not None and time.monotonic() > deadline):
                finish = "cancelled"
                break
            if isinstance(text, Exception) and i == 1:
                raise text
            if self.cut_at_cap and produced >= max_tokens:
                finish = "length"
                break
            self.started.set()
            produced += 1
            yield word if i == 0 else " " + word
            if self.delay_s:
                time.sleep(self.delay_s)
        self.last_stats = GenerationStats(prompt, 0, prompt, produced, 0.0, 0.0, 0.0, finish)
