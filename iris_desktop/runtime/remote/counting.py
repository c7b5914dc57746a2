"""Counting a server's prompts. A server that cannot count gets tiktoken's cl100k count
times a factor calibrated from the ``prompt_tokens`` it reports
(:class:`EstimatedTokenCounter`, :class:`_Calibration`); one that can counts with its own
tokenizer and template (:class:`ServerTokenCounter`, whose runtime caches its answers in
an :class:`_LRU`)."""

from __future__ import annotations

import hashlib
import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

from iris_desktop.tokens import Message

log = logging.getLogger("iris.runtime.remote")

#: server counts kept per runtime (each one cost an HTTP request)
COUNT_CACHE_SIZE = 4096
#: how exact counts are made; part of the counter's name, so counts the store cached
#: under an older scheme are never mixed in
COUNT_SCHEME = 1
#: before a server has reported any prompt_tokens: tiktoken under-counts gemma's
#: tokenizer by 17.3% on the SWE-agent transcripts (docs/context-engine.md)
UNCALIBRATED_FACTOR = 1.25
#: on top of the largest reported/estimated ratio seen
SAFETY_MARGIN = 0.05
#: a prompt estimated below this does not calibrate (its per-message framing dominates)
MIN_CALIBRATION_TOKENS = 64
#: what a template wraps around tool definitions (Qwen2.5's: about 90 cl100k tokens)
TOOL_FRAMING_TOKENS = 128
#: a message's role marker and separators, when a template refuses every probe shape
_FALLBACK_FRAMING_TOKENS = 4
#: a reported/estimated ratio outside these is a broken report, not a tokenizer (no chat
#: model's tokenizer splits text into four times as many tokens as cl100k, or a quarter)
MIN_CALIBRATION_RATIO = 0.25
MAX_CALIBRATION_RATIO = 4.0

#: sent once when connecting to a server that cannot count, to calibrate the estimate
#: before the first reply (prose, code, numbers and non-English text, as chats have)
_CALIBRATION_TEXT = (
    "Could you look at this function before Friday's release? It parses the 2024-03-14 "
    "invoices (1,284 rows, €12,950.40 in total) and fails on rows like 'ACME GmbH; 19%'.\n"
    "```python\ndef parse(row: str) -> dict[str, float]:\n    name, rate = row.split(';')\n"
    "    return {name.strip(): float(rate.strip().rstrip('%')) / 100}\n```\n"
    "Der Kunde möchte außerdem eine Übersicht pro Quartal; 顧客は四半期ごとの概要も希望しています。"
)


class _LRU:
    """A small thread-safe cache of counts (the DB thread plans while the model thread
    streams). It keeps a digest of each key, not the key: a key can be a whole request."""

    def __init__(self, size: int = COUNT_CACHE_SIZE) -> None:
        self._data: OrderedDict[bytes, int] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, text: str, compute: Callable[[], int]) -> int:
        key = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return self._data[key]
        value = compute()  # outside the lock: an HTTP request
        with self._lock:
            self._data[key] = value
            while len(self._data) > self._size:
                self._data.popitem(last=False)
        return value


class _Calibration:
    """The largest ratio of reported to estimated prompt tokens seen per server and model,
    kept for the life of the process (a reconnect starts from what was learned)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ratios: dict[str, float] = {}

    def factor(self, key: str) -> float:
        """The estimate's multiplier: the largest ratio plus the margin, rounded up to a
        multiple of 0.05 (so that the counter's name, and the store's cached counts with
        it, change only in steps); UNCALIBRATED_FACTOR before any report."""
        with self._lock:
            ratio = self._ratios.get(key)
        if ratio is None:
            return UNCALIBRATED_FACTOR
        return math.ceil(ratio * (1 + SAFETY_MARGIN) * 20 - 1e-9) / 20

    def known(self, key: str) -> bool:
        with self._lock:
            return key in self._ratios

    def observe(self, key: str, reported: int, estimated: int) -> None:
        if estimated < MIN_CALIBRATION_TOKENS or reported <= 0:
            return
        if not MIN_CALIBRATION_RATIO <= reported / estimated <= MAX_CALIBRATION_RATIO:
            # a broken report would make every prompt look too large (or too small) for good
            log.warning("%s: ignored a report of %d prompt tokens for about %d estimated "
                        "(not a tokenizer's count: beyond %g to %g times as many)", key, reported,
                        estimated, MIN_CALIBRATION_RATIO, MAX_CALIBRATION_RATIO)
            return
        with self._lock:
            self._ratios[key] = max(self._ratios.get(key, 0.0), reported / estimated)


_calibration = _Calibration()


class EstimatedTokenCounter:
    """tiktoken's cl100k count times a server's calibrated factor
    (``iris_desktop.tokens.TokenCounter``), for servers that cannot count. ``exact`` is False and
    the name says ``estimated`` and the factor, so counts cached with another factor are
    never reused."""

    exact = False

    def __init__(self, base: Any, factor: float, name: str) -> None:
        self._base = base
        self.factor = factor
        self.name = name

    def count_text(self, text: str) -> int:
        return math.ceil(self._base.count_text(text) * self.factor)

    def count_message(self, message: Message) -> int:
        return math.ceil(self._base.count_message(message) * self.factor)

    def prompt_overhead(self) -> int:
        return math.ceil(self._base.prompt_overhead() * self.factor)

    def __repr__(self) -> str:
        return f"<EstimatedTokenCounter {self.name}>"


class _ServerCounts(Protocol):
    """What :class:`ServerTokenCounter` asks of its runtime (``ExactRemoteRuntime``)."""

    counter_name: str

    def count_text(self, text: str) -> int: ...

    def message_tokens(self, message: Message) -> int: ...

    def prompt_overhead(self) -> int: ...


class ServerTokenCounter:
    """Counts with the server's own tokenizer and chat template
    (``iris_desktop.tokens.TokenCounter``). A message's count is what it adds to a probe
    conversation, so ``exact`` is False as for a local Jinja template; the planner
    counts every whole request with :meth:`ExactRemoteRuntime.count_prompt`, which is
    exact. Nothing is cached here (the runtime caches server answers, the store caches
    per message and counter name)."""

    exact = False

    def __init__(self, runtime: _ServerCounts) -> None:
        self._runtime = runtime
        self.name = runtime.counter_name

    def count_text(self, text: str) -> int:
        return self._runtime.count_text(text)

    def count_message(self, message: Message) -> int:
        return self._runtime.message_tokens(message)

    def prompt_overhead(self) -> int:
        return self._runtime.prompt_overhead()

    def __repr__(self) -> str:
        return f"<ServerTokenCounter {self.name}>"
