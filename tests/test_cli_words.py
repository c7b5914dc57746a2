"""Small words of the CLI found by a newcomer's audit: ``threads`` said "1 messages", and
``export -o`` wrote its file without a word (the window says where it wrote)."""

from __future__ import annotations

import json

from support.helpers import run_cli as run


def test_threads_says_one_message_and_export_says_where_it_wrote(capsys, tmp_path):
    data = tmp_path / "data"
    one = tmp_path / "one.json"
    one.write_text(json.dumps([{"role": "user", "content": "A single question?"}]))
    two = tmp_path / "two.json"
    two.write_text(json.dumps([{"role": "user", "content": "Hi"},
                               {"role": "assistant", "content": "Hello"}]))
    for path in (one, two):
        assert run(capsys, "--data-dir", data, "import", path)[0] == 0
    code, out, _ = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0
    lines = out.splitlines()
    assert "     1 message   " in lines[-1] or "     1 message   " in lines[0]
    assert "1 messages" not in out and "     2 messages  " in out
    assert len({line.index("≈") for line in lines}) == 1  # the columns still line up

    target = tmp_path / "out.md"
    code, out, err = run(capsys, "--data-dir", data, "export", "1", "--format", "md", "-o", target)
    assert code == 0 and out == "" and target.read_text().startswith("#")
    assert err == f"iris-desktop: exported thread 1 to {target} (Markdown, the branch shown)\n"


def test_config_reset_leaves_no_empty_table_but_keeps_a_commented_one(capsys, tmp_path):
    """Before (an audit): resetting a section's last key left "[storage]" and "[context]"
    behind, empty, for good."""
    data = tmp_path / "data"
    for key, value in (("model.max_tokens", "48"), ("context.window", "4096"),
                       ("storage.encrypt", "false")):
        assert run(capsys, "--data-dir", data, "config", "set", key, value)[0] == 0
    config = data / "config.toml"
    config.write_text(config.read_text() + "\n[tools]\n# why the shell is off\nshell = false\n")
    for key in ("context.window", "storage.encrypt", "tools.shell"):
        assert run(capsys, "--data-dir", data, "config", "reset", key)[0] == 0
    assert config.read_text() == "[model]\nmax_tokens = 48\n\n[tools]\n# why the shell is off\n"


def _arguments(parser, name="iris-desktop"):
    """(command, argument, help) for every argument and sub-command of ``parser``."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                yield name, choice.dest, choice.help
            for sub_name, sub in action.choices.items():
                yield from _arguments(sub, f"{name} {sub_name}")
        elif not isinstance(action, argparse._HelpAction):
            yield name, "/".join(action.option_strings) or action.dest, action.help


def test_every_argument_of_every_command_says_what_it_is(capsys):
    """``models search --help`` listed ``text`` and ``--json`` with no word about them."""
    from iris_desktop.cli import build_parser

    bare = [f"{command} {argument}" for command, argument, text in _arguments(build_parser())
            if not text]
    assert bare == []
    import pytest

    with pytest.raises(SystemExit) as done:
        run(capsys, "models", "search", "--help")
    out = capsys.readouterr().out
    assert done.value.code == 0
    assert "WORDS" in out and "qwen2.5 coder instruct" in out and "print JSON" in out
