"""Sampling as the settings ask for it, on the real bundled model: llama.cpp's DRY sampler
sits in the chain right after the penalties (llama-cpp-python's ``generate`` has no
parameter for it), and the settings reach every request."""

from __future__ import annotations

import llama_cpp

from iris_desktop.core.config import AgentConfig
from iris_desktop.generation import GenerationRequest
from iris_desktop.settings import defaults


def chain_names(sampler) -> list[bytes]:
    chain = sampler.sampler
    return [llama_cpp.llama_sampler_name(llama_cpp.llama_sampler_chain_get(chain, i)).lstrip(b"?")
            for i in range(llama_cpp.llama_sampler_chain_n(chain))]


def test_dry_follows_the_penalties_and_only_when_asked(real_model):
    llm = real_model._llm
    try:
        llm.iris_dry = 0.0
        plain = chain_names(llm._init_sampler(temp=0.7, repeat_penalty=1.1))
        llm.iris_dry = 0.8
        with_dry = chain_names(llm._init_sampler(temp=0.7, repeat_penalty=1.1))
        greedy = chain_names(llm._init_sampler(temp=0.0))
    finally:
        llm.iris_dry = 0.0
    assert b"dry" not in plain and plain[0] == b"penalties"
    assert with_dry == [plain[0], b"dry", *plain[1:]]
    assert greedy[:2] == [b"penalties", b"dry"]


def test_a_reply_with_dry_is_generated_and_the_next_without_it_is_as_before(real_model):
    messages = [{"role": "user", "content": "List three colours."}]
    request = GenerationRequest(messages, max_tokens=24, temperature=0.0, seed=1)
    before = real_model.stream(request).text()
    with_dry = real_model.stream(request.but(dry_multiplier=0.8)).text()
    assert with_dry and real_model._llm.iris_dry == 0.8
    assert real_model.stream(request).text() == before  # the setting is per request


def test_the_sampling_settings_reach_the_agent():
    config = AgentConfig.from_settings(defaults().with_overrides(
        {"model.dry_multiplier": "0", "model.repeat_penalty": "1.2", "model.top_k": "7"}))
    assert (config.dry_multiplier, config.repeat_penalty, config.top_k) == (0.0, 1.2, 7)
    assert AgentConfig.from_settings(defaults()).dry_multiplier == 0.8
