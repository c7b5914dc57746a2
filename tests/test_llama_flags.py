"""The llama.cpp flags Iris ships (issue 29, bench/throughput.py): threads are the physical
cores, for prompts and replies alike; flash attention is on. Checked on the real bundled
model by what llama.cpp was given and by tokens counted, never by time."""

from __future__ import annotations

import llama_cpp

from iris_desktop.generation import GenerationRequest
from iris_desktop.host import load_runtime
from iris_desktop.paths import app_paths
from iris_desktop.runtime.cpu import physical_cores
from iris_desktop.runtime.model import LocalModel
from iris_desktop.settings import load_settings

PROMPT = [{"role": "user", "content": "The capital of France is Paris. The capital of Italy is"}]


def test_the_app_loads_with_physical_core_threads_and_flash_attention(model_path):
    settings = load_settings(None, env={}, cli={"model.path": str(model_path)})
    model = load_runtime(settings, app_paths())
    try:
        params = model.llm.context_params
        assert params.n_threads == params.n_threads_batch == physical_cores()
        assert params.flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
    finally:
        model.close()


def test_the_thread_setting_sets_both_and_flash_attention_can_be_turned_off(model_path):
    settings = load_settings(None, env={"IRIS_MODEL_N_THREADS": "1", "IRIS_MODEL_FLASH_ATTN": "false"},
                             cli={"model.path": str(model_path)})
    model = load_runtime(settings, app_paths())
    try:
        params = model.llm.context_params
        assert (params.n_threads, params.n_threads_batch) == (1, 1)
        assert params.flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    finally:
        model.close()


def test_flash_attention_keeps_counts_exact_and_the_greedy_reply(model_path):
    """Prompt tokens predicted == evaluated on a cold cache, with and without flash
    attention, and the greedy reply to a plain question is the same token for token."""
    replies = []
    for flash in (False, True):
        with LocalModel.load(model_path, n_ctx=2048, flash_attn=flash) as model:
            generation = model.stream(GenerationRequest(PROMPT, max_tokens=12, temperature=0.0))
            replies.append(generation.text())
            stats = generation.stats
            assert stats.prompt_tokens == model.count_prompt(PROMPT) == stats.evaluated_tokens
            assert stats.reused_tokens == 0 and stats.completion_tokens >= 1
    assert replies[0] == replies[1] and "Rome" in replies[1]


def test_a_kv_state_saved_with_the_other_flash_attention_setting_is_refused(model_path):
    """Flash attention lays the V cache out untransposed: a state saved without it (any
    chat saved before it was the default) must be refused, not read as garbage; the next
    request then evaluates the whole prompt."""
    with LocalModel.load(model_path, n_ctx=2048, flash_attn=False) as before:
        before.prefill(PROMPT).run()
        state = before.kv_state()
        assert state is not None and len(state.tokens) == before.count_prompt(PROMPT)
    with LocalModel.load(model_path, n_ctx=2048, flash_attn=True) as after:
        assert after.restore_kv_state(state) is False
        generation = after.stream(GenerationRequest(PROMPT, max_tokens=2, temperature=0.0))
        generation.text()
        assert generation.stats.reused_tokens == 0
        assert generation.stats.evaluated_tokens == len(state.tokens)
