"""Every runtime satisfies the one written runtime interface (``runtime.protocol``), and
what ``core`` asks of a model (``core.ports``) is part of it. The server runtimes are
checked against real servers in tests/test_remote.py with the same helper."""

from __future__ import annotations

import threading

import pytest

from iris_desktop.core.ports import ChatModel
from iris_desktop.generation import GenerationRequest
from iris_desktop.runtime.protocol import Generation, ModelFacts, Prefill, Runtime, Unsupported

from support.fakes import ScriptedRuntime
from support.helpers import protocol_members, protocol_problems, signature_problems


def test_what_core_asks_of_a_model_is_part_of_the_runtime_interface():
    runtime = protocol_members(Runtime)
    problems = []
    for name, declared in protocol_members(ChatModel).items():
        if name not in runtime:
            problems.append(f"core asks for {name}, which runtimes need not have")
        elif callable(declared) and not isinstance(declared, property):
            problems += signature_problems(name, declared, runtime[name])
    assert problems == []


def test_the_checker_finds_what_a_runtime_lacks():
    class Broken(ScriptedRuntime):
        describe = None  # type: ignore[assignment]

        def stream(self, messages):  # the request's old keyword signature, half of it
            return super().stream(GenerationRequest(messages, max_tokens=8))

        def count_prompt(self, messages, tools=5):  # another default
            return super().count_prompt(messages, None)

        def prefill(self, messages, tools=None, cancel=None):  # positional, not keyword-only
            return super().prefill(messages, tools, cancel=cancel)

    problems = protocol_problems(Broken([]), Runtime)
    assert "describe is not a method" in problems
    assert any("prefill(cancel) is positional or keyword" in p for p in problems)
    assert any("count_prompt(tools) defaults to 5" in p for p in problems)
    assert any("no parameter 'request'" in p for p in problems)


def test_the_scripted_runtime_satisfies_the_protocol():
    runtime = ScriptedRuntime(["a reply"])
    assert protocol_problems(runtime, Runtime) == []
    assert isinstance(runtime, Runtime)
    generation = runtime.stream(GenerationRequest([{"role": "user", "content": "hi"}], max_tokens=8))
    assert isinstance(generation, Generation) and generation.stats is None
    assert generation.text() == "a reply" and generation.stats.finish_reason == "stop"
    assert not runtime.capabilities.prefill and not runtime.capabilities.kv_state
    with pytest.raises(Unsupported):
        runtime.prefill([])
    assert runtime.kv_state() is None


def test_the_local_model_satisfies_the_protocol(real_model):
    assert protocol_problems(real_model, Runtime) == []
    assert isinstance(real_model, Runtime)
    caps = real_model.capabilities
    assert caps.exact_counts and caps.prefill and caps.kv_state and caps.native_tools
    facts = real_model.describe()
    assert isinstance(facts, ModelFacts) and facts.n_ctx == real_model.n_ctx
    assert facts.where == "local" and facts.base_url is None and "Apache-2.0" in facts.license
    messages = [{"role": "user", "content": "Say one word."}]
    generation = real_model.stream(GenerationRequest(messages, max_tokens=3, temperature=0))
    text = generation.text()
    assert generation.stats.prompt_tokens == real_model.count_prompt(messages) and text
    work = real_model.prefill([*messages, {"role": "assistant", "content": text},
                               {"role": "user", "content": "Again."}], cancel=threading.Event())
    assert isinstance(work, Prefill)
    stats = work.run()
    assert stats.reused_tokens > 0 and not stats.stopped
    state = real_model.kv_state()
    assert state is not None and len(state.tokens) == stats.prompt_tokens
    assert real_model.restore_kv_state(state) and real_model.kv_tokens() == state.tokens
