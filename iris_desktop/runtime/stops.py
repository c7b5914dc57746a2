"""Stop sequences: a stop string that is one control token becomes a token id (control
tokens detokenize to nothing, so they never match as text); the others are matched in the
text as it streams, holding back what could be the start of one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def split_stops(stops: list[str], tokenize: Callable[[str], list[int]], vocab: Any) -> tuple[set[int], list[str]]:
    """``stops`` as (control-token ids, stop strings); ``tokenize`` recognizes control
    tokens, ``vocab`` is llama.cpp's vocabulary of the model."""
    import llama_cpp

    ids: set[int] = set()
    strings: list[str] = []
    for s in stops:
        if not s:
            continue
        toks = tokenize(s)
        if len(toks) == 1 and llama_cpp.llama_vocab_is_control(vocab, toks[0]):
            ids.add(toks[0])
        else:
            strings.append(s)
    return ids, strings


class StopMatcher:
    """Holds back text that could be the start of a stop string."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Return (text safe to emit, a stop string was found)."""
        self.pending += text
        if not self.stops:
            out, self.pending = self.pending, ""
            return out, False
        first = -1
        for s in self.stops:
            i = self.pending.find(s)
            if i != -1 and (first == -1 or i < first):
                first = i
        if first != -1:
            out, self.pending = self.pending[:first], ""
            return out, True
        keep = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.pending)), 0, -1):
                if self.pending.endswith(s[:n]):
                    keep = max(keep, n)
                    break
        cut = len(self.pending) - keep
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out

