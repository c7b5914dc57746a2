"""KV shifting (``model.kv_shift``): after a compaction, the tail that stayed verbatim is
kept in the KV cache and moved to its new positions, so the first request evaluates the
new summary and the new message only. Counted in tokens evaluated, on the real bundled
model; the run finder is checked on its own."""

from __future__ import annotations

import threading

import pytest

from iris_desktop.generation import GenerationRequest
from iris_desktop.runtime.kv_reuse import SHIFT_MIN_TOKENS, moved_run
from iris_desktop.runtime.model import LocalModel

SYSTEM = {"role": "system", "content": "You are Iris, a helpful assistant."}


def turns(first: int, last: int) -> list[dict]:
    out = []
    for i in range(first, last):
        out += [{"role": "user", "content": f"Tell me fact number {i} about the ocean, please."},
                {"role": "assistant", "content": f"Fact {i}: the ocean covers most of Earth, and "
                                                 f"its deepest point is the Challenger Deep ({i})."}]
    return out


def summary(text: str) -> dict:
    return {"role": "system", "content": f"Summary of the conversation so far: {text}"}


# -- the run finder ---------------------------------------------------------------------


def test_moved_run_finds_the_tail_after_a_new_middle():
    cached = [1, 2, 3] + [50] * 10 + list(range(100, 200))
    tokens = [1, 2, 3] + [60, 61] + list(range(100, 200)) + [7, 8]
    assert moved_run(cached, tokens, 3, 64) == (5, 13, 100)


def test_moved_run_after_a_pure_removal():
    cached = [1, 2] + [9] * 30 + list(range(300, 400))
    tokens = [1, 2] + list(range(300, 400)) + [5]
    assert moved_run(cached, tokens, 2, 64) == (2, 32, 100)


def test_no_run_shorter_than_the_minimum_and_none_before_start():
    cached = list(range(100))
    assert moved_run(cached, [0] + list(range(50, 80)), 1, 64) is None
    # the matching run lies before ``start``: not a moved run
    assert moved_run(cached, list(range(100)) + [1000] * 70, 100, 64) is None


def test_moved_run_prefers_the_longest_and_repetition_stays_linear():
    cached = [0] + list(range(10, 90)) + [5] * 3 + list(range(200, 400))
    tokens = [0] + [7] + list(range(200, 400)) + list(range(10, 90))
    at, was, length = moved_run(cached, tokens, 1, 64)
    assert (at, was, length) == (2, 84, 200)
    # a cache of one repeated token: each k-gram keeps a few positions, so this is quick
    same = [3] * 5000
    assert moved_run(same, [4] + same, 0, 64) == (1, 0, 5000)


# -- on the real model ------------------------------------------------------------------


@pytest.fixture(scope="module")
def shifting(model_path):
    m = LocalModel.load(model_path, n_ctx=4096, kv_shift=True)
    yield m
    m.close()


@pytest.fixture(scope="module")
def plain(model_path):
    m = LocalModel.load(model_path, n_ctx=4096)
    yield m
    m.close()


def compacted(model: LocalModel) -> tuple[list[dict], list[dict], int, int]:
    """The prompt before a compaction (cached), the one after, how many of the second's
    tokens before its tail are new (the new summary, from where it first differs from the
    old one), and the new message's tokens."""
    before = [SYSTEM, summary("the user asked for ocean facts 0 to 3."), *turns(4, 12)]
    new_summary = summary("the user asked for ocean facts 0 to 7; Iris gave each one.")
    question = {"role": "user", "content": "Which fact was about the deepest point?"}
    after = [SYSTEM, new_summary, *turns(8, 12), question]
    old, new = model.prompt_tokens(before), model.prompt_tokens(after)
    common = next(i for i, (a, b) in enumerate(zip(old, new)) if a != b)
    tail_starts = len(model.prompt_tokens(after[:2])) - len(model._generation_tokens)
    tail_ends = len(model.prompt_tokens(after[:-1])) - len(model._generation_tokens)
    return before, after, tail_starts - common, len(new) - tail_ends  # message + generation prompt


def test_after_a_compaction_only_the_summary_and_the_message_are_evaluated(shifting, plain):
    for model in (shifting, plain):
        before, after, summary_tokens, message_tokens = compacted(model)
        model.llm.reset()
        model.prefill(before).run()
        generation = model.stream(GenerationRequest(after, max_tokens=8, temperature=0))
        reply = generation.text()
        stats = generation.stats
        assert stats.prompt_tokens == model.count_prompt(after)
        assert stats.evaluated_tokens + stats.reused_tokens == stats.prompt_tokens
        if model is shifting:
            # the new part of the summary, then the message and the generation prompt (a
            # few of the summary's last tokens may equal those before the tail in the cache)
            assert message_tokens < stats.evaluated_tokens <= summary_tokens + message_tokens
            assert reply.strip()
        else:
            tail = sum(len(model.message_tokens(m)) for m in turns(8, 12))
            assert stats.evaluated_tokens >= summary_tokens + tail + message_tokens
        # the cache now holds the new prompt, in order: the next turn reuses all of it
        cached = model.kv_tokens()
        assert cached[:len(model.prompt_tokens(after))] == model.prompt_tokens(after)
        nxt = [*after, {"role": "assistant", "content": reply},
               {"role": "user", "content": "Thanks!"}]
        again = model.stream(GenerationRequest(nxt, max_tokens=1, temperature=0))
        again.text()
        assert again.stats.evaluated_tokens <= 24


def test_a_warm_up_after_a_compaction_evaluates_only_the_summary(shifting):
    before, after, summary_tokens, message_tokens = compacted(shifting)
    shifting.llm.reset()
    shifting.prefill(before).run()
    warm = shifting.prefill(after[:-1]).run()  # the app warms the new prefix up
    assert 0 < warm.evaluated_tokens <= summary_tokens and not warm.stopped
    assert warm.reused_tokens == warm.prompt_tokens - warm.evaluated_tokens
    send = shifting.stream(GenerationRequest(after, max_tokens=1, temperature=0))
    send.text()
    # the message (the warm-up's generation prompt may share its first token)
    assert message_tokens - 3 <= send.stats.evaluated_tokens <= message_tokens


def test_a_warm_up_stopped_during_the_summary_leaves_a_usable_cache(shifting):
    """A send that stops the warm-up in the middle of the summary: the moved tail waits on
    the scratch sequence, and the send goes on from there (the tail is not read again)."""
    before, after, summary_tokens, message_tokens = compacted(shifting)
    shifting.llm.reset()
    shifting.prefill(before).run()
    stop = threading.Event()
    stop.set()  # asked to stop at once: the summary's evaluation is aborted
    stopped = shifting.prefill(after[:-1], cancel=stop).run()
    assert stopped.stopped and stopped.evaluated_tokens <= summary_tokens
    # the scratch sequence is empty and the cache a prefix of the prompt: a full answer works
    generation = shifting.stream(GenerationRequest(after, max_tokens=4, temperature=0))
    generation.text()
    stats = generation.stats
    assert stats.finish_reason in {"stop", "length"}
    assert stats.evaluated_tokens + stats.reused_tokens == stats.prompt_tokens
    assert stats.evaluated_tokens <= summary_tokens - stopped.evaluated_tokens + message_tokens
    cached = shifting.kv_tokens()
    assert cached[:stats.prompt_tokens] == shifting.prompt_tokens(after)


def test_a_parked_tail_is_dropped_when_the_next_prompt_is_another(shifting):
    before, after, _, _ = compacted(shifting)
    shifting.llm.reset()
    shifting.prefill(before).run()
    stop = threading.Event()
    stop.set()
    assert shifting.prefill(after[:-1], cancel=stop).run().stopped
    other = [SYSTEM, {"role": "user", "content": "Something else entirely, please."}]
    generation = shifting.stream(GenerationRequest(other, max_tokens=2, temperature=0))
    generation.text()
    assert generation.stats.evaluated_tokens + generation.stats.reused_tokens == generation.stats.prompt_tokens
    assert shifting.kv_tokens()[:generation.stats.prompt_tokens] == shifting.prompt_tokens(other)
    import llama_cpp
    memory = llama_cpp.llama_get_memory(shifting.llm.ctx)
    assert llama_cpp.llama_memory_seq_pos_max(memory, 1) == -1  # the scratch sequence is empty


def test_a_removed_middle_is_skipped_without_evaluating(shifting):
    """A run that only moved back (turns deleted before it, nothing new in their place)
    costs no evaluation at all but the new message."""
    shifting.llm.reset()
    full = [SYSTEM, *turns(0, 10)]
    shifting.prefill(full).run()
    shorter = [SYSTEM, *turns(3, 10), {"role": "user", "content": "Go on."}]
    generation = shifting.stream(GenerationRequest(shorter, max_tokens=1, temperature=0))
    generation.text()
    assert generation.stats.evaluated_tokens <= len(shifting.message_tokens(shorter[-1])) + 8


def test_off_by_default_and_below_the_minimum_nothing_moves(plain, shifting):
    assert not plain.kv_shift and SHIFT_MIN_TOKENS >= 32
    shifting.llm.reset()
    short = [SYSTEM, summary("a."), {"role": "user", "content": "Hi there."}]
    shifting.prefill(short).run()
    changed = [SYSTEM, summary("b, c and d."), {"role": "user", "content": "Hi there."}]
    stats = shifting.prefill(changed).run()
    # the moved part is too short to keep: evaluated again from where they differ
    assert stats.reused_tokens < len(shifting.prompt_tokens(changed)) - 8


def test_the_setting_reaches_the_loaded_model(tmp_path, model_path):
    from iris_desktop.host import Host

    for value, expected in (("true", True), ("false", False)):
        host = Host(tmp_path / f"data-{value}", {"model.path": str(model_path), "model.n_ctx": "1024",
                                                 "model.kv_shift": value})
        try:
            assert host.load_model().kv_shift is expected
        finally:
            host.close()
