"""`chat "…"` on a terminal says how to go on in the chat it made: a newcomer's second
`chat` started another chat and the model knew nothing of the first ("I'm not sure what
you mean"), with only "[thread 1]" as a clue (a newcomer audit). A real terminal (a pty),
the real CLI and the bundled model; a pipe or a script sees "[thread N]" alone, as before."""

from __future__ import annotations

from support.helpers import on_a_terminal, run_cli


def test_a_new_chat_on_a_terminal_says_how_to_go_on_in_it(tmp_path):
    data = tmp_path / "data"
    code, seen = on_a_terminal(["--data-dir", data, "--set", "model.max_tokens=4", "chat",
                                "Say hi."], {})
    text = seen.decode("utf-8", "replace")
    assert code == 0, text
    assert "[thread 1]" in text
    assert 'to go on in it: iris-desktop chat --thread 1 "…"' in text, text
    code, seen = on_a_terminal(["--data-dir", data, "--set", "model.max_tokens=4", "chat",
                                "--thread", "1", "And again."], {})
    text = seen.decode("utf-8", "replace")
    assert code == 0 and "[thread 1]" in text and "to go on in it" not in text, text


def test_a_pipe_sees_the_thread_alone(tmp_path, capsys):
    code, _, err = run_cli(capsys, "--data-dir", tmp_path / "data", "--set", "model.max_tokens=4",
                           "chat", "Say hi.")
    assert code == 0, err
    assert "[thread 1]" in err and "to go on in it" not in err
