"""What ``chat`` prints when the model calls a tool, writes nothing, or the chat compacts:
the real CLI (``main``) on a real SQLite file, with a scripted model in place of the
real one."""

from __future__ import annotations

import io
import json
import sqlite3
import sys

import pytest

from iris_desktop.cli import main

from conftest import SYNTHETIC_CHAT
from support.fakes import ScriptedRuntime

LIST = '<tool_call>{"name": "list_directory", "arguments": {"path": "."}}</tool_call>'


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class GoneReader(io.StringIO):
    """A pipe whose reader left (``| head`` done): every write fails."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


@pytest.fixture
def chat(tmp_path, monkeypatch):
    """``chat(replies, *argv)``: the CLI's exit code, with the model's ``replies``
    scripted and a folder the tools may read (three files)."""
    folder = tmp_path / "allowed"
    folder.mkdir()
    for name in ("a.txt", "b.txt", "c.txt"):
        (folder / name).write_text("x")
    data = tmp_path / "data"

    def run(replies, *argv: str, options: tuple[str, ...] = ()) -> int:
        runtime = ScriptedRuntime(replies, cut_at_cap=True)
        monkeypatch.setattr("iris_desktop.host.load_runtime", lambda *a, **k: runtime)
        return main(["--data-dir", str(data), "--set", "context.recall_semantic=false",
                     "--set", f"tools.allowed_paths={json.dumps([str(folder)])}", *options,
                     "chat", *argv])

    run.db = data / "iris.db"
    return run


def replies(db) -> list[tuple[str, str]]:
    with sqlite3.connect(db) as con:
        return con.execute("SELECT role, content FROM messages ORDER BY id").fetchall()


def test_a_tool_calls_markup_never_reaches_a_file_or_a_pipe(chat, capsys):
    """Before (an audit): `chat "What files are there?" > answer.txt` wrote
    `<tool_call>{"name": "list_directory", …}</tool_call>There are three files.` into the
    file (the real model: six copies of the call's JSON). Now stdout, not a terminal,
    holds each reply as it was saved: the answer, and words the model wrote before a call
    on a line of their own; the call is said on stderr."""
    code = chat([LIST, "There are three files."], "What files are there?")
    out, err = capsys.readouterr()
    assert code == 0 and out == "There are three files.\n"
    assert "[tool list_directory: ok]" in err and "tool_call" not in out + err
    code = chat([f"Let me look. {LIST}", "There are three files."], "--thread", "1",
                "And now?")
    out, err = capsys.readouterr()
    assert code == 0 and out == "Let me look.\nThere are three files.\n", out


def test_on_a_terminal_a_reply_that_calls_a_tool_ends_its_line(chat, monkeypatch):
    """On a terminal the reply streams as it comes, so the call's markup is shown as the
    model writes it. Before, with stderr elsewhere (``2>log``), the answer was then glued
    onto the call on the same line. Now the line ends where the call does; on a terminal
    that shows both, the ``[tool …]`` line follows it, with no blank line between."""
    out, log = Terminal(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", log)
    assert chat([LIST, "There are three files."], "What files are there?") == 0
    assert out.getvalue() == f"{LIST}\nThere are three files.\n"
    assert log.getvalue() == "[tool list_directory: ok]\n[thread 1]\n"
    both = Terminal()
    monkeypatch.setattr(sys, "stdout", both)
    monkeypatch.setattr(sys, "stderr", both)
    assert chat([LIST, "Still three."], "--thread", "1", "And now?") == 0
    assert f"{LIST}\n[tool list_directory: ok]\n" in both.getvalue()
    assert both.getvalue().endswith("Still three.\n[thread 1]\n")


def test_a_held_reply_is_printed_as_far_as_it_came_when_the_model_fails(chat, capsys):
    """A reply held until it is saved and never saved (the model failed after a word)
    is still printed, as the streamed one was, before the failure's sentence."""
    code = chat([RuntimeError("the server went away")], "Hello")
    out, err = capsys.readouterr()
    assert code == 1 and out == "partial\n"
    assert "iris-desktop: The model failed" in err and "Traceback" not in err


def test_a_continued_reply_is_printed_whole_once(chat, capsys):
    """A continued reply held to its end: what it said before and what follows, once."""
    options = ("--set", "model.max_tokens=3")
    assert chat(["one two three four five"], "Count", options=options) == 0
    assert capsys.readouterr().out == "one two three\n"
    assert chat([" four five."], "--thread", "1", "--continue") == 0
    out = capsys.readouterr().out
    assert out == "one two three four five.\n" and replies(chat.db)[-1][1] == out.strip()


def test_a_reader_that_left_stops_the_turn_quietly(chat, monkeypatch, capsys):
    """A reader that left (``| head``) stops the reply at the first word it could not
    take, as Stop does, quietly. Before, that word was the call's markup: the reply was
    cut inside the call, which never ran. Now the call, held back, runs, and the answer
    is the reply that stops."""
    monkeypatch.setattr(sys, "stdout", GoneReader())
    code = chat([LIST, "There are three files."], "What files are there?")
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err and "[tool list_directory: ok]" in err
    with sqlite3.connect(chat.db) as con:
        rows = con.execute("SELECT role, content, status FROM messages ORDER BY id").fetchall()
    assert [row[0] for row in rows] == ["user", "assistant", "tool", "assistant"]
    assert "a.txt" in rows[2][1] and rows[3][1:] == ("There", "interrupted")


def test_a_turn_whose_answer_is_empty_says_so(chat, capsys):
    """Before (an audit): a tool call, then an answer with no words: exit 0, stdout
    empty, stderr only "[tool list_directory: ok]" and "[thread 1]". Now stderr says
    the model wrote nothing, and how to ask again."""
    code = chat([LIST, ""], "What files are there?")
    out, err = capsys.readouterr()
    assert code == 0 and out == ""
    assert ("iris-desktop: the model ended its reply without writing anything; 'iris-desktop "
            "chat --thread 1 --regenerate' asks for another reply") in err
    code = chat([LIST, "Three."], "--thread", "1", "Again?")
    assert code == 0 and "without writing anything" not in capsys.readouterr().err


def test_a_piped_chat_says_when_it_starts_to_compact(tmp_path, monkeypatch, capsys):
    """Before (an audit): a 20,000-message chat, piped, printed nothing between
    "preparing the model…" and the compaction's line 190 s later (its progress line is a
    terminal's only). Now a stderr that is no terminal gets one line when it starts; a
    terminal keeps its progress line, without that one."""
    data = ("--data-dir", str(tmp_path / "data"))
    assert main([*data, "import", str(SYNTHETIC_CHAT)]) == 0
    small = ("--set", "context.window=2048", "--set", "context.recall_semantic=false")
    runtime = ScriptedRuntime(["Lisbon."] * 8, n_ctx=2048)
    monkeypatch.setattr("iris_desktop.host.load_runtime", lambda *a, **k: runtime)
    capsys.readouterr()
    assert main([*data, *small, "chat", "--thread", "1", "Which city did Rosa move to?"]) == 0
    err = capsys.readouterr().err
    started = err.index("iris-desktop: summarizing the earlier turns so that the chat fits "
                        "the model's window (on a long chat this takes minutes)…")
    assert started < err.index("[compacted (")
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    from iris_desktop.commands.chat import _ChatPrinter
    from iris_desktop.core.events import CompactionStarted, dispatch

    dispatch(CompactionStarted(1, "budget"), _ChatPrinter(False))
    assert terminal.getvalue() == ""


def test_a_pipe_gets_a_reply_as_it_is_written_up_to_where_a_call_may_begin():
    """What of a reply being written goes to a pipe at once (``| head`` still stops the
    model, and ``| tee`` still shows the reply as it comes): all of plain text, none of a
    reply that may be a call as a whole, and text up to a call's markup, even when a
    token ends inside the marker."""
    from iris_desktop.commands.chat import printable

    for text in ("Hello there", "1 2 3", "`x` is a name", "```python\nprint(1)", "<b>bold</b>"):
        assert printable(text) == len(text), text
    for text in ("", "  ", "{", ' {"name": "read_file"', "[TOOL_CALLS] [", "<", "<|python",
                 "<|python_tag|>{", "```", "```json\n", "```json\n{", "<tool_", LIST):
        assert printable(text) == 0, text
    assert printable("Let me look. <tool") == len("Let me look.")
    assert printable(f"Let me look. {LIST} Done.") == len("Let me look.")
    assert printable("See [TOOL_CALLS] x") == len("See")
    assert printable("It is <b>") == len("It is <b>")
    assert printable("Trailing spaces wait  ") == len("Trailing spaces wait")
