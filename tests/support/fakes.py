"""A scripted runtime for what the real model cannot do on demand (a given tool call), and
an embedder that makes vectors at once, where the store's work is what is counted.

It satisfies the same :class:`~iris_desktop.runtime.protocol.Runtime` as the local model
and the server runtimes (``tests/test_protocol.py`` checks it member by member), so it
cannot drift from the interface the engine and the host use.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np

from iris_desktop.generation import GenerationRequest, GenerationStats
from iris_desktop.runtime.protocol import (
    Capabilities,
    Generation,
    KVState,
    ModelFacts,
    Prefill,
    Unsupported,
)
from iris_desktop.tokens import HeuristicCounter


class ScriptedFormat:
    name = "scripted"


class ScriptedRuntime:
    """Replies with the scripted texts in order; each reply streams word by word.

    A script item may be a string, an Exception (raised mid-stream after one word), or a
    callable taking the request messages and returning a string. With ``cut_at_cap``, a
    reply longer than ``max_tokens`` words stops there with ``finish_reason == "length"``,
    as a real model's does. ``deadlines`` holds each call's deadline, as seconds from the
    call; ``finished`` each generation's stats (what a test inspects afterwards).
    """

    capabilities = Capabilities()
    base_model = False
    chat_format = ScriptedFormat()
    identity = "scripted"
    model_name = "ScriptedRuntime"
    where = "local"
    base_url = None
    is_loopback = True
    warning = None
    load_time_s = 0.0
    window_source = "model"

    def __init__(self, replies, n_ctx: int = 8192, counter=None, delay_s: float = 0.0,
                 cut_at_cap: bool = False):
        self.replies = list(replies)
        self.cut_at_cap = cut_at_cap
        self.deadlines: list[float | None] = []
        self.n_ctx = n_ctx
        self._counter = counter or HeuristicCounter()
        self.delay_s = delay_s
        self.requests: list[list[dict]] = []
        self.finished: list[GenerationStats] = []
        self.started = threading.Event()
        self.closed = False

    def counter(self):
        return self._counter

    def count_prompt(self, messages, tools=None) -> int:
        """The counter's estimate (``capabilities.exact_counts`` is False)."""
        return self._counter.prompt_overhead() + sum(
            self._counter.count_message(m) for m in messages)

    def tool_tokens(self, tools) -> int:
        return 0

    def render_prompt(self, messages) -> str:
        return json.dumps(messages, ensure_ascii=False)

    def stream(self, request: GenerationRequest) -> Generation:
        return Generation(lambda result: self._stream(
            result, request.messages, request.max_tokens, request.cancel, request.deadline,
            request.progress))

    def _stream(self, result, messages, max_tokens, cancel, deadline, progress=None):
        self.requests.append(messages)
        self.deadlines.append(None if deadline is None else deadline - time.monotonic())
        item = self.replies.pop(0) if self.replies else "(no more scripted replies)"
        text = item(messages) if callable(item) and not isinstance(item, Exception) else item
        prompt = self.count_prompt(messages)
        if progress is not None:  # as a real model reports its prompt: before, and after it
            progress(0, prompt)
            progress(prompt, prompt)
        pieces = (text if isinstance(text, str) else "partial reply").split(" ")
        finish = "stop"
        produced = 0
        try:
            for i, word in enumerate(pieces):
                if (cancel is not None and cancel.is_set()) or (
                        deadline is not None and time.monotonic() > deadline):
                    finish = "cancelled"
                    break
                if isinstance(text, Exception) and i == 1:
                    finish = "error"
                    raise text
                if self.cut_at_cap and produced >= max_tokens:
                    finish = "length"
                    break
                self.started.set()
                produced += 1
                yield word if i == 0 else " " + word
                if self.delay_s:
                    time.sleep(self.delay_s)
        except GeneratorExit:
            finish = "cancelled"
            raise
        finally:
            result.stats = GenerationStats(prompt, 0, prompt, produced, 0.0, 0.0, 0.0, finish)
            self.finished.append(result.stats)

    def prefill(self, messages, tools=None, *, cancel=None) -> Prefill:
        raise Unsupported("a scripted runtime has no cache")

    def kv_state(self) -> KVState | None:
        return None

    def restore_kv_state(self, state: KVState) -> bool:
        return False

    def describe(self) -> ModelFacts:
        return ModelFacts(name="ScriptedRuntime", file=self.model_name,
                          path=str(Path(self.model_name)), n_ctx=self.n_ctx,
                          chat_format=self.chat_format.name)

    def close(self) -> None:
        self.closed = True


class ZeroEmbedder:
    """Zero vectors of all-MiniLM-L6-v2's size, made at once: for counting or timing the
    store's part of embedding (the tests and benches that need what vectors say use the
    real models). Satisfies ``core.semantic.TextEmbedder``."""

    dimensions = 384

    def __init__(self, identity: str = "zero@test"):
        self.identity = identity

    def embed(self, text: str) -> np.ndarray:
        return np.zeros(self.dimensions, dtype=np.float32)

    embed_query = embed

    def embed_many(self, texts) -> np.ndarray:
        return np.zeros((len(texts), self.dimensions), dtype=np.float32)
