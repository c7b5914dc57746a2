"""A newcomer's first commands (newcomer audit, session 64): `--help` lists `chat` first
(it was tenth of fourteen, after `recover` and `rekey`), and `context` without a thread
shows the chat written to last, named on stderr (it was a usage error: "the following
arguments are required: thread"). The real CLI in-process, a real SQLite file."""

from __future__ import annotations

import json
import re

import pytest

from support.helpers import on_a_terminal, one_sentence, run_cli


def test_help_lists_chat_first_and_the_maintenance_commands_last(capsys):
    try:
        run_cli(capsys, "--help")
    except SystemExit:
        pass
    out = capsys.readouterr().out
    commands = re.findall(r"^    (\w+) ", out, flags=re.M)
    assert commands[:3] == ["chat", "threads", "context"], commands
    assert commands.index("recover") > commands.index("models")
    assert commands.index("rekey") > commands.index("models")


def test_context_without_a_thread_shows_the_chat_written_to_last(capsys, tmp_path):
    data = ["--data-dir", tmp_path / "data"]
    code, _, err = run_cli(capsys, *data, "context", "--no-model")
    assert code == 2 and one_sentence(err) and "there are no chats yet" in err, err
    for text in ("first", "second"):
        source = tmp_path / f"{text}.json"
        source.write_text(json.dumps([{"role": "user", "content": f"the {text} chat"},
                                      {"role": "assistant", "content": "noted"}]))
        code, out, err = run_cli(capsys, *data, "import", source)
        assert code == 0, err
    newest = int(out.split()[0])
    code, out, err = run_cli(capsys, *data, "context", "--json", "--no-model")
    assert code == 0, err
    assert json.loads(out)["thread_id"] == newest
    assert err == f"iris-desktop: thread {newest} (the chat written to last)\n"
    code, out, _ = run_cli(capsys, *data, "context", "1", "--json", "--no-model")
    assert code == 0 and json.loads(out)["thread_id"] == 1


def test_an_import_on_a_terminal_says_what_its_number_is(capsys, tmp_path):
    """A newcomer's audit: ``import thousand.json`` printed a bare "5". On a terminal it
    now also says what was imported, as which chat; in a pipe the ids stay alone (scripts
    read them)."""
    source = tmp_path / "thousand.json"
    source.write_text(json.dumps([{"role": "user" if i % 2 == 0 else "assistant", "content": f"m {i}"}
                                  for i in range(1_000)]))
    code, shown = on_a_terminal(["--data-dir", tmp_path / "data", "import", source], {})
    assert code == 0
    assert shown.splitlines()[-2:] == [b"1", b"iris-desktop: imported 1 chat (1,000 messages) as chat 1"]
    code, out, err = run_cli(capsys, "--data-dir", tmp_path / "data", "import", source, "--again")
    assert code == 0 and out == "2\n" and err == ""


@pytest.mark.parametrize("word", ["doctor", "self-test"])
def test_a_check_command_that_is_not_there_points_to_the_self_test(capsys, word):
    with pytest.raises(SystemExit) as ended:
        run_cli(capsys, word)
    err = capsys.readouterr().err
    assert ended.value.code == 2 and one_sentence(err)
    assert "; to check the installation: iris-desktop --self-test (see" in err, err
