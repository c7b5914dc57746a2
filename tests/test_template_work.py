"""The WORK of a model's chat template is bounded, not only its steps (hostile audit s67).

The sandbox counted one step per loop step or call whatever each cost, and measured a
result only after it was made: 300,000 ``upper()`` of an 8 MB text held a load silent for
minutes; ``('x' * 30000).replace('x', 'y' * 30000)`` made 900 MB before "more than 64 MiB";
a list of lists written out was 3 TB of text; under a memory cap the ``MemoryError`` was
swallowed by the load-time probes, so the format loaded and every turn retried. Every risky
call runs in a daemon thread joined with a bound, so that a regression fails instead of
hanging; what is asserted is the step or size refusal, never a time.
"""

from __future__ import annotations

import logging
import tracemalloc

import pytest

from iris_desktop.runtime import template_sandbox
from iris_desktop.runtime.chat_format import (
    ChatMLFormat,
    JinjaFormat,
    TemplateError,
    TemplateTooCostly,
    select_chat_format,
)
from iris_desktop.runtime.gguf import read_gguf_info

from support.gguf_fixtures import CHATML, tiny_metadata, write_gguf
from support.helpers import finished_within

#: generous for a slow, shared machine: a bounded rendering ends in about a second
BOUND_S = 120
#: an 8 MB text, made within every cap
EIGHT_MB = "{% set b = 'x' * 1000000 %}{% set b = b ~ b ~ b ~ b ~ b ~ b ~ b ~ b %}"
SLOW = (EIGHT_MB + "{% for i in range(1000) %}{% for j in range(300) %}"
        "{% if b.upper() == 'y' %}{% endif %}{% endfor %}{% endfor %}")
HI = [{"role": "user", "content": "hi"}]


def _finished(call):
    """``call()`` in a daemon thread: (finished, its result or exception)."""
    return finished_within(call, BOUND_S)


@pytest.mark.parametrize("bomb", [
    SLOW,  # 300,000 steps by count, each 8 MB of work: 2.4 TB by size
    "{% set l = [0] * 1000000 %}{{ [l] * 1000000 }}",  # a list written out: 3 TB
    # 600,000 steps by count, each a search or a comparison of 8 MB by size
    EIGHT_MB + "{% for i in range(300) %}{% for j in range(1000) %}{% if 'y' in b %}{% endif %}"
               "{% endfor %}{% endfor %}",
    EIGHT_MB + "{% set c = b ~ '' %}{% for i in range(300) %}{% for j in range(1000) %}"
               "{% if b == c %}{% endif %}{% endfor %}{% endfor %}",
    EIGHT_MB + "{% for i in range(1000) %}{% for j in range(1000) %}{% set r = b[::-1] %}"
               "{% endfor %}{% endfor %}",
])
def test_a_template_whose_steps_are_costly_is_refused(bomb):
    done, outcome = _finished(lambda: JinjaFormat(bomb + CHATML))
    assert done, "the template's rendering is not bounded"
    assert isinstance(outcome, TemplateTooCostly), outcome
    assert "seconds" not in str(outcome)  # refused by its steps or sizes, not the clock


def test_a_gguf_whose_template_does_costly_steps_loads_with_chatml(tmp_path, caplog):
    """``iris-desktop chat --model slow.gguf hi`` was silent for minutes in
    ``select_chat_format``, before llama.cpp loads."""
    info = read_gguf_info(write_gguf(tmp_path / "slow.gguf", tiny_metadata(template=SLOW + CHATML)))
    with caplog.at_level(logging.WARNING, logger="iris.runtime"):
        done, fmt = _finished(lambda: select_chat_format(info))
    assert done, "the template's rendering is not bounded"
    assert isinstance(fmt, ChatMLFormat), fmt
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "the model's chat template did not finish (it took more than 1,000,000 steps)" in said
    assert "using ChatML" in said


def test_lipsum_is_not_there_for_a_template():
    """``lipsum(100000)`` took seconds a call, one step by count."""
    fmt = JinjaFormat("{% if messages %}{% for i in range(1000) %}{{ lipsum(100000) }}"
                      "{% endfor %}{% endif %}" + CHATML)
    done, outcome = _finished(lambda: fmt.render_prompt(HI))
    assert done
    assert isinstance(outcome, TemplateError), outcome
    assert "'lipsum' is undefined" in str(outcome)


@pytest.mark.parametrize("bomb", [
    "{{ ('x' * 30000).replace('x', 'y' * 30000)|length }}",  # 900 MB before the check
    "{{ ('y' * 30000).join('x' * 30000)|length }}",
    "{{ ('y' * 30000).join(['x'] * 30000)|length }}",
    "{{ ('\t' * 10000).expandtabs(90000)|length }}",
    "{{ ('{0}' * 100000).format('x' * 100000)|length }}",
    "{{ ('{:>99999}' * 10000).format(*([1] * 10000))|length }}",
    "{{ (('%s' * 100000) % ('x' * 10000,))|length }}",
    "{{ ('%s' * 100000)|format('x' * 10000)|length }}",
    "{{ ('\n' * 1000000)|indent(99999)|length }}",
    EIGHT_MB + "{% set s = ' x' * 500000 %}{% set s = s ~ s ~ s ~ s ~ s ~ s ~ s ~ s %}"
               "{{ s.split()|length }}",  # 4 million texts of 50 bytes each
    EIGHT_MB + "{{ (b ~ b)|list|length }}",
    "{% set l = [0] * 1000000 %}{{ ([l] * 1000)|string|length }}",
    "{% set l = [0] * 1000000 %}{{ (([l] * 1000) ~ '')|length }}",
    "{% set l = [0] * 1000000 %}{{ ([l] * 1000)|join(',')|length }}",
    "{% set l = [[[1]]] * 1000 %}{{ ([l] * 1000)|tojson(indent=99999)|length }}",
])
def test_a_str_method_is_refused_before_it_makes_a_huge_text(bomb):
    tracemalloc.start()
    try:
        done, outcome = _finished(lambda: JinjaFormat("{% if messages %}" + bomb + "{% endif %}"
                                                      + CHATML).render_prompt(HI))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert done
    assert isinstance(outcome, TemplateTooCostly), outcome
    assert peak < 100 << 20, f"{peak >> 20} MB made before the refusal"


def test_running_out_of_memory_in_a_template_refuses_it_once(tmp_path, monkeypatch, caplog):
    """A ``MemoryError`` (an address-space cap, a real shortage) was swallowed by the
    load-time probes: the format loaded and every turn rendered it again."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    def exhausted(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(Jinja2ChatFormatter, "strftime_now", exhausted)
    template = "{{ strftime_now('%d %b %Y') }}" + CHATML
    with pytest.raises(TemplateTooCostly, match="it ran out of memory"):
        JinjaFormat(template)
    info = read_gguf_info(write_gguf(tmp_path / "dated.gguf", tiny_metadata(template=template)))
    with caplog.at_level(logging.WARNING, logger="iris.runtime"):
        assert isinstance(select_chat_format(info), ChatMLFormat)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "did not finish (it ran out of memory); using ChatML" in said[0]


def test_a_rendering_past_its_time_is_refused_whatever_it_counted(monkeypatch):
    """The clock is a backstop for work no count sees: a rendering past
    :data:`TEMPLATE_SECONDS` of CPU is refused within 1,024 steps."""
    fmt = JinjaFormat("{% for i in range(2000) %}{% endfor %}" + CHATML)
    monkeypatch.setattr(template_sandbox, "TEMPLATE_SECONDS", -1.0)  # already past
    with pytest.raises(TemplateTooCostly, match="it took more than -1 seconds of CPU"):
        fmt.render_prompt(HI)


def test_a_long_real_conversation_is_charged_by_its_size_and_renders_as_before():
    """Real templates render byte for byte as llama-cpp-python renders them; a 1 MB
    conversation of 500 messages takes a small part of the budget, more than the same
    messages made short (the size is charged)."""
    from llama_cpp.llama_chat_format import (
        CHATML_CHAT_TEMPLATE,
        LLAMA3_INSTRUCT_CHAT_TEMPLATE,
        MISTRAL_INSTRUCT_CHAT_TEMPLATE,
        Jinja2ChatFormatter,
    )

    long = "word " * 20000 + "\n\ttabbed <b>&'\"</b> ß é 漢字"

    def conversation(text: str) -> list[dict]:
        return [{"role": ("user", "assistant")[i % 2], "content": f"{i} {text if i % 50 == 0 else ''}"}
                for i in range(499)]

    for template in (CHATML_CHAT_TEMPLATE, LLAMA3_INSTRUCT_CHAT_TEMPLATE,
                     MISTRAL_INSTRUCT_CHAT_TEMPLATE):
        fmt = JinjaFormat(template, bos_token="<s>", eos_token="</s>")
        plain = Jinja2ChatFormatter(template, "</s>", "<s>", True)
        steps = {}
        for text in ("", long):
            messages = conversation(text)
            assert fmt.render_prompt(messages) == plain(messages=messages).prompt
            env = fmt._compiled._env
            env._budget.left = 10**9
            list(fmt._compiled._template.generate(messages=messages, add_generation_prompt=True,
                                                  **fmt._compiled._names))
            steps[text], env._budget.left = 10**9 - env._budget.left, None
        assert steps[long] < 100_000, steps
        assert steps[long] > steps[""] + 2_000, steps  # 1 MB of text is charged
