"""Hostile model files: what a downloaded or renamed ``*.gguf`` may be, and what it may
hold. A named pipe held the library's listing (and the window's Quit) waiting for a
writer; a chat template of 10^10 loop steps held a load at 100% CPU for ever; arrays of
arrays 2,000 deep emptied the whole listing with "this is a bug". Every risky call runs
in a daemon thread, joined with a bound, so that a regression fails instead of hanging.
"""

from __future__ import annotations

import logging
import os
import struct
from pathlib import Path

import pytest

from iris_desktop.runtime.chat_format import (
    ChatMLFormat,
    JinjaFormat,
    TemplateError,
    TemplateTooCostly,
    select_chat_format,
)
from iris_desktop.runtime.gguf import GGUFError, read_gguf_info

from support.gguf_fixtures import tiny_metadata, tiny_model, write_gguf
from support.helpers import finished_within, run_cli

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")

#: the bound on each risky call: generous for a slow, shared machine; a bounded call ends
#: in well under a second, an unbounded one never
BOUND_S = 120


def _finished(call):
    """``call()`` in a daemon thread: (finished, its result or exception)."""
    return finished_within(call, BOUND_S)


def _release(fifo: Path) -> None:
    """Let a reader stuck on ``fifo`` go (a writer opens it), so the test can end."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:  # no reader waits: nothing to release
        pass


def _nested_gguf(path: Path, depth: int = 2000) -> Path:
    """24 KB: one metadata key whose value is an array of an array of … (``depth``)."""
    kv = struct.pack("<Q", 4) + b"test" + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * depth
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + kv + struct.pack("<IQ", 4, 0)
                     + bytes(64))
    return path


def _entry(listing: str, name: str) -> str:
    """The lines ``iris-desktop models`` prints for the file named ``name``."""
    return listing.split(f"{name} (file)\n", 1)[1].split("\n  /", 1)[0]


@pytest.fixture
def models(tmp_path, monkeypatch) -> Path:
    """The data folder's models folder, with one good tiny model; no other library."""
    home = tmp_path / "user-home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("USERPROFILE", str(home))
    for var in ("OLLAMA_MODELS", "HF_HOME", "HF_HUB_CACHE", "XDG_CACHE_HOME", "XDG_DATA_HOME"):
        monkeypatch.delenv(var, raising=False)
    folder = Path(os.environ["IRIS_HOME"]) / "models"
    folder.mkdir(parents=True)
    tiny_model(folder / "good.gguf", "Good Tiny")
    return folder


# -- 1. a named pipe named *.gguf ----------------------------------------------------


def test_a_named_pipe_named_gguf_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "stuck.gguf"
    os.mkfifo(fifo)
    done, outcome = _finished(lambda: read_gguf_info(fifo))
    if not done:
        _release(fifo)
    assert done, "read_gguf_info waited for a writer on a named pipe"
    assert isinstance(outcome, GGUFError), outcome
    assert "named pipe" in str(outcome) and "not a GGUF file" in str(outcome)


def test_a_device_named_gguf_is_refused_by_its_type(tmp_path):
    link = tmp_path / "zero.gguf"
    link.symlink_to("/dev/zero")
    with pytest.raises(GGUFError, match="character device"):
        read_gguf_info(link)


def test_models_lists_the_others_beside_a_named_pipe(models, capsys):
    fifo = models / "stuck.gguf"
    os.mkfifo(fifo)
    done, outcome = _finished(lambda: run_cli(capsys, "models"))
    if not done:
        _release(fifo)
    assert done, "`iris-desktop models` waited for a writer on a named pipe"
    code, out, err = outcome
    assert code == 0, err
    assert "Good Tiny" in out
    assert "unusable: is a named pipe (FIFO), not a GGUF file" in _entry(out, "stuck"), out
    assert "this is a bug" not in err


# -- 3. arrays nested 2,000 deep ------------------------------------------------------


def test_arrays_nested_too_deep_are_a_corrupt_header(tmp_path):
    with pytest.raises(GGUFError, match=r"corrupt header: arrays nested more than 8 deep in 'test'"):
        read_gguf_info(_nested_gguf(tmp_path / "nested.gguf"))


def _nested(levels: int) -> list:
    value: list = [1, 2]
    for _ in range(levels - 1):
        value = [value, value]
    return value


def test_arrays_nested_up_to_8_deep_are_read(tmp_path):
    info = read_gguf_info(write_gguf(tmp_path / "eight.gguf", tiny_metadata(test=_nested(8))))
    assert info.metadata["test"] == _nested(8)
    with pytest.raises(GGUFError, match="nested more than 8 deep"):
        read_gguf_info(write_gguf(tmp_path / "nine.gguf", tiny_metadata(test=_nested(9))))


def test_models_lists_the_others_beside_a_deeply_nested_gguf(models, capsys):
    _nested_gguf(models / "nested.gguf")
    done, outcome = _finished(lambda: run_cli(capsys, "models"))
    assert done
    code, out, err = outcome
    assert code == 0, err
    assert "Good Tiny" in out
    assert "unusable: corrupt header: arrays nested more than 8 deep" in _entry(out, "nested"), out
    assert "this is a bug" not in err


# -- 2. a chat template that never finishes, or makes gigabytes -----------------------

_FOR_EVER = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
_CHATML = tiny_metadata()["tokenizer.chat_template"]


def test_a_chat_template_that_never_finishes_falls_back_to_chatml(tmp_path, caplog):
    path = write_gguf(tmp_path / "loop.gguf", tiny_metadata(template=_FOR_EVER + _CHATML))
    info = read_gguf_info(path)
    with caplog.at_level(logging.WARNING, logger="iris.runtime"):
        done, fmt = _finished(lambda: select_chat_format(info))
    assert done, "the template's rendering is not bounded"
    assert isinstance(fmt, ChatMLFormat), fmt
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "the model's chat template did not finish" in said and "using ChatML" in said


@pytest.mark.parametrize("bomb", [
    "{{ 'x' * 10000000000 }}",
    "{{ ['x'] * 10000000000 }}",
    "{{ 10 ** 100000000 }}",
    "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
    "{% endfor %}",
    "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
    "{% endfor %}",
    "{{ 'x'|center(10000000000) }}",
    "{{ 'x'.ljust(10000000000) }}",
    "{{ '{:>9999999999}'.format(1) }}",
    "{{ '%9999999999d' % 1 }}",
    "{{ '%9999999999d'|format(1) }}",
    "{% set s = 'x' * 1000000 %}{{ ([s] * 1000000)|join }}",
    "{% set s = 'x' * 1000000 %}{{ s|replace('x', s) }}",
    "{% set s = 'x' * 1000000 %}{% for i in range(90000) %}{{ s }}{% endfor %}",
    "{% set s = 'x' * 1000000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
    "{% macro f(n) %}{% if n %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}{{ f(60) }}",
])
def test_a_chat_template_that_makes_too_much_is_refused_at_load(bomb):
    done, outcome = _finished(lambda: JinjaFormat(bomb + _CHATML))
    assert done, "the template's rendering is not bounded"
    assert isinstance(outcome, TemplateTooCostly), outcome


def test_a_template_too_costly_for_a_long_conversation_refuses_that_conversation():
    cubed = ("{% for a in messages %}{% for b in messages %}{% for c in messages %}"
             "{% endfor %}{% endfor %}{% endfor %}")
    fmt = JinjaFormat(cubed + _CHATML)  # an empty conversation costs nothing
    done, outcome = _finished(lambda: fmt.render_prompt([{"role": "user", "content": "hi"}] * 200))
    assert done
    assert isinstance(outcome, TemplateTooCostly), outcome
    assert str(outcome).startswith("the model's chat template refused the conversation: "
                                   "it did not finish (it took more than 1,000,000 steps)")
    assert fmt.render_message({"role": "user", "content": "hi"}) == "<|im_start|>user\nhi<|im_end|>\n"


@pytest.mark.parametrize(("template", "said"), [
    ("{{ raise_exception('This template refuses everything') }}",
     "the model's chat template refused the conversation: This template refuses everything"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{% if messages %}{{ f() }}{% endif %}",
     "the model's chat template refused the conversation: maximum recursion depth exceeded"),
])
def test_a_template_error_while_rendering_says_it_is_the_template(template, said):
    fmt = JinjaFormat(template + _CHATML)
    with pytest.raises(TemplateError) as caught:
        fmt.render_prompt([{"role": "user", "content": "hi"}])
    assert str(caught.value).startswith(said)


def test_the_bundled_template_renders_as_llama_cpp_python_renders_it(model_path):
    """The bounded sandbox changes nothing for a real template: the bundled model's
    renders exactly as ``Jinja2ChatFormatter`` does, for long conversations with tools,
    within a small part of the budget."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    info = read_gguf_info(model_path)
    bos = info.special_tokens.get("bos", "")
    eos = info.special_tokens.get("eot") or info.special_tokens.get("eos", "")
    fmt = select_chat_format(info)
    assert isinstance(fmt, JinjaFormat)
    plain = Jinja2ChatFormatter(info.chat_template, eos, bos, True)
    tools = [{"type": "function", "function": {
        "name": "bash", "description": "Run a command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}]
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": {"cmd": "ls"}}}
    turn = [{"role": "user", "content": "list the files <|im_end|>"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "a.txt\nb.txt"},
            {"role": "assistant", "content": "Two files: a.txt and b.txt."}]
    for messages in ([{"role": "system", "content": "Be brief."}] + turn, turn * 125):
        for given in (None, tools):
            want = plain(messages=messages, tools=given).prompt
            assert fmt.render_prompt(messages, tools=given) == want
    env = fmt._compiled._env  # the steps a 500-message conversation with tools takes
    env._budget.left = 10**9
    list(fmt._compiled._template.generate(messages=turn * 125, tools=tools,
                                          add_generation_prompt=True, **fmt._compiled._names))
    assert 10**9 - env._budget.left < 10_000
