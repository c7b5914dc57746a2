"""Reusing the KV cache across requests: the prefix ``Llama.generate`` keeps (and
llama-server's sliding-window rule), a cached run moved to another position (the KV
shift after a compaction), and a sequence's cache saved and put back."""

from __future__ import annotations

import ctypes
import logging
from typing import Any

from .llama_binding import EvalStopped

log = logging.getLogger("iris.runtime")
#: the one sequence of a context: its KV cache is what a KV state holds
SEQ_ID = 0

#: the shortest run of cached tokens worth moving (below it, evaluating is as cheap)
SHIFT_MIN_TOKENS = 64
#: a k-gram of this many tokens finds candidate runs; each is then extended
_SHIFT_KEY = 16


def moved_run(cached: list[int], tokens: list[int], start: int,
              min_length: int = SHIFT_MIN_TOKENS) -> tuple[int, int, int] | None:
    """The longest run ``tokens[at:at+length] == cached[was:was+length]`` with ``at`` and
    ``was`` both at or after ``start`` (where the two first differ) and ``length`` at
    least ``min_length``, as ``(at, was, length)``; None when there is none. Ties go to
    the earliest ``at``. Linear in practice: candidates come from an index of the
    cache's k-grams, a match skips ahead by its length, and each k-gram keeps at most a
    few positions (a chat's repeated template text is short)."""
    key = min(_SHIFT_KEY, min_length)
    if key < 1 or len(cached) - start < min_length or len(tokens) - start < min_length:
        return None
    index: dict[tuple[int, ...], list[int]] = {}
    for was in range(start, len(cached) - key + 1):
        spots = index.setdefault(tuple(cached[was:was + key]), [])
        if len(spots) < 8:
            spots.append(was)
    best: tuple[int, int, int] | None = None
    at = start
    while at <= len(tokens) - key:
        longest = 0
        for was in index.get(tuple(tokens[at:at + key]), ()):
            length = key
            while (at + length < len(tokens) and was + length < len(cached)
                   and tokens[at + length] == cached[was + length]):
                length += 1
            if length >= min_length and (best is None or length > best[2]):
                best = (at, was, length)
            longest = max(longest, length)
        at += longest if longest >= min_length else 1
    return best


def read_sequence(ctx: Any) -> bytes:
    """llama.cpp's copy of the keys and values of :data:`SEQ_ID` (no logits)."""
    import llama_cpp

    size = llama_cpp.llama_state_seq_get_size(ctx, SEQ_ID)
    buffer = (ctypes.c_uint8 * size)()
    written = llama_cpp.llama_state_seq_get_data(ctx, buffer, size, SEQ_ID)
    return bytes(memoryview(buffer).cast("B")[:written])  # one copy (was two: tens of MB
    # each, with Python's lock held, the window's thread waiting)


def write_sequence(llm: Any, tokens: list[int], data: bytes) -> bool:
    """Clear ``llm``'s cache and put ``data`` (:func:`read_sequence`'s, for ``tokens``)
    into it; False if llama.cpp refuses it (the cache is then empty). The next request
    computes the logits it did not save."""
    import llama_cpp

    llm.reset()
    memory = llama_cpp.llama_get_memory(llm.ctx)
    llama_cpp.llama_memory_clear(memory, True)
    buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
    if llama_cpp.llama_state_seq_set_data(llm.ctx, buffer, len(data), SEQ_ID) == 0:
        llama_cpp.llama_memory_clear(memory, True)
        return False
    llm.input_ids[: len(tokens)] = tokens
    llm.n_tokens = len(tokens)
    llm._requires_eval = True  # no logits were saved
    return True


class KVReuse:
    """How much of a prompt the KV cache of ``_llm`` (a
    :func:`.llama_binding.counting_llama_class` instance) already holds, and the shift
    that makes more of it reusable. Mixed into :class:`.model.LocalModel`, which sets
    these attributes and calls these methods under its generation lock."""

    _llm: Any
    #: reuse a moved part of the cache by shifting its positions (see _shift_reuse)
    kv_shift: bool
    swa_full: bool
    _n_swa: int
    #: (at, was, run): a shift stopped part-way left ``run`` on the scratch sequence
    _parked: tuple[int, int, list[int]] | None

    def _shift_reuse(self, tokens: list[int], step: int | None = None) -> tuple[int, bool]:
        """Reuse a run of cached tokens that sits at another position in ``tokens``.

        After a compaction the prompt is ``system + new summary + tail`` while the cache
        holds ``system + old summary + compacted turns + tail``: the longest common
        prefix ends after the system prompt, so a plain reuse evaluates the whole tail
        again. When :attr:`kv_shift` is on, the tail's cells are kept instead: parked on
        the scratch sequence, the cells in between dropped, what is new (the summary)
        evaluated at its positions, and the tail's positions shifted after it
        (``llama_memory_seq_add``; llama.cpp rotates the keys' RoPE). Only the new part
        and what follows the moved run are evaluated.

        This is not exact: the moved cells' keys and values were computed while the old
        summary and the compacted turns stood before them (llama-server's
        ``--cache-reuse`` makes the same trade). So it is a setting (``model.kv_shift``).
        Models with a sliding window or a cache that cannot shift always re-evaluate.

        Returns (tokens evaluated, stopped part-way). The cache then holds a prefix of
        ``tokens`` (through the moved run), and the usual prefix reuse goes on from it.
        """
        import llama_cpp

        llm = self._llm
        parked, self._parked = self._parked, None
        n = int(llm.n_tokens)
        if not self.kv_shift or self._n_swa > 0 or n == 0 or len(tokens) < 2:
            if parked is not None:  # the cache was reset meanwhile: the run is not wanted
                llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(llm.ctx), SEQ_ID + 1, -1, -1)
            return 0, False
        if int(llm.context_params.n_seq_max) < 2:  # loaded without the scratch sequence
            return 0, False
        mem = llama_cpp.llama_get_memory(llm.ctx)
        if not llama_cpp.llama_memory_can_shift(mem):
            return 0, False
        start = self._common_prefix(tokens)
        if parked is not None:  # a shift stopped part-way: its run waits on the scratch sequence
            at, was, run = parked
            same = 0  # how much of the run this prompt has at ``at`` (its end may differ)
            for a, b in zip(run, tokens[at:len(tokens) - 1]):
                if a != b:
                    break
                same += 1
            if (start == n and at >= n and same >= SHIFT_MIN_TOKENS
                    and llama_cpp.llama_memory_seq_pos_min(mem, SEQ_ID + 1) == was
                    and llama_cpp.llama_memory_seq_pos_max(mem, SEQ_ID + 1) == was + len(run) - 1):
                return self._move_run(tokens, n, at, was, run[:same], step)
            llama_cpp.llama_memory_seq_rm(mem, SEQ_ID + 1, -1, -1)  # not this prompt's: dropped
        if start >= n:  # the cache is a prefix of the prompt: nothing moved
            return 0, False
        cached = [int(t) for t in llm.input_ids[:n]]
        # keep the prompt's last token for the evaluation that produces the logits
        found = moved_run(cached, tokens[:-1], start, SHIFT_MIN_TOKENS)
        if found is None:
            return 0, False
        at, was, length = found  # tokens[at:at+length] == cached[was:was+length]
        run = cached[was:was + length]
        if at == start:  # only removed before the run: drop those cells, move it back
            llama_cpp.llama_memory_seq_rm(mem, SEQ_ID, start, was)
            llama_cpp.llama_memory_seq_rm(mem, SEQ_ID, was + length, -1)
            llama_cpp.llama_memory_seq_add(mem, SEQ_ID, was, was + length, at - was)
            llm.input_ids[at:at + length] = run
            llm.n_tokens = at + length
            llm._requires_eval = True
            return 0, False
        llama_cpp.llama_memory_seq_cp(mem, SEQ_ID, SEQ_ID + 1, was, was + length)
        llama_cpp.llama_memory_seq_rm(mem, SEQ_ID, start, -1)
        llm.n_tokens = start
        return self._move_run(tokens, start, at, was, run, step)

    def _move_run(self, tokens: list[int], start: int, at: int, was: int,
                  run: list[int], step: int | None = None) -> tuple[int, bool]:
        """The second half of :meth:`_shift_reuse`: with ``run`` parked on the scratch
        sequence at ``was`` and the cache holding ``tokens[:start]``, evaluate
        ``tokens[start:at]``, then move the run to ``at`` after it. Stopped part-way, the
        run stays parked (``_parked``) and the next request goes on from there."""
        import llama_cpp

        llm = self._llm
        mem = llama_cpp.llama_get_memory(llm.ctx)
        scratch, length = SEQ_ID + 1, len(run)
        before = int(llm.iris_evaluated)
        try:
            llm.iris_decode_at(tokens[start:at], step)
        except EvalStopped:
            self._parked = (at, was, list(run))
            llm._requires_eval = True
            return int(llm.iris_evaluated) - before, True
        except BaseException:
            llama_cpp.llama_memory_seq_rm(mem, scratch, -1, -1)
            llm.reset()
            llama_cpp.llama_memory_clear(mem, True)
            raise
        evaluated = int(llm.iris_evaluated) - before
        llama_cpp.llama_memory_seq_add(mem, scratch, was, was + length, at - was)
        llama_cpp.llama_memory_seq_cp(mem, scratch, SEQ_ID, at, at + length)
        llama_cpp.llama_memory_seq_rm(mem, scratch, -1, -1)
        llm.input_ids[at:at + length] = run
        llm.n_tokens = at + length
        llm._requires_eval = True  # the logits are not the moved run's last token's
        log.debug("KV shift: kept %d cached tokens moved from %d to %d; evaluated %d before them",
                  length, was, at, evaluated)
        return evaluated, False

    def _common_prefix(self, tokens: list[int]) -> int:
        """How many of ``tokens`` the KV cache holds at their start."""
        import numpy as np

        llm = self._llm
        m = min(int(llm.n_tokens), len(tokens))
        cached = llm.input_ids[:m]
        diff = np.nonzero(cached != np.asarray(tokens[:m], dtype=cached.dtype))[0]
        return int(diff[0]) if len(diff) else m

    def _plan_reuse(self, tokens: list[int]) -> int:
        """How many prompt tokens ``Llama.generate`` will keep from the KV cache.

        Mirrors ``Llama.generate``: the longest common prefix of the context and the
        prompt; when the whole prompt is already there, the last token is evaluated
        again to refresh the logits (unless the context is exactly the prompt and its
        logits are live). With ``swa_full=False`` this also applies llama-server's
        sliding-window rule and resets the context when the reuse would be wrong.
        """
        import llama_cpp

        llm = self._llm
        n = int(llm.n_tokens)
        if n == 0 or not tokens:
            return 0
        common = self._common_prefix(tokens)
        consumed = common == len(tokens)
        if consumed and n == len(tokens) and not llm._requires_eval:
            reuse = len(tokens)
        else:
            reuse = common - 1 if consumed else common
        if reuse > 0 and self._n_swa > 0 and not self.swa_full:
            mem = llama_cpp.llama_get_memory(llm.ctx)
            pos_min = llama_cpp.llama_memory_seq_pos_min(mem, 0)
            if pos_min > max(0, reuse - self._n_swa):
                log.info("prefix of %d tokens not reusable: the sliding-window cache starts "
                         "at position %d (swa_full=False); re-evaluating the prompt",
                         reuse, pos_min)
                llm.reset()
                return 0
        return max(reuse, 0)
