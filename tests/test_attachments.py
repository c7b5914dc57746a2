"""Attached files: text only, read once, stored with the message (the model reads them
after the typed text), shown as chips, counted by the engine, kept by export/import."""

from __future__ import annotations

import json

import pytest

from iris_desktop.cli import main
from iris_desktop.core.attachments import (
    AttachmentError,
    model_text,
    read_attachment,
    shown,
    with_attachments,
)
from iris_desktop.core.events import UserSaved
from iris_desktop.core.views import load_transcript
from iris_desktop.host import Host

from support.fakes import ScriptedRuntime


def test_only_text_files_are_read_and_each_refusal_says_why(tmp_path):
    (tmp_path / "notes.md").write_text("# Notes\r\nBuy basil.\r\n", encoding="utf-8")
    note = read_attachment(tmp_path / "notes.md")
    assert note.name == "notes.md" and note.text == "# Notes\nBuy basil.\n"
    (tmp_path / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0")
    # (Latin-1 and Windows-1252 are read now, and said: tests/test_cp1252_text.py; another
    # script's 8-bit text, here Windows-1251's Russian, is not)
    (tmp_path / "cp1251.txt").write_bytes("кафе".encode("cp1251"))
    (tmp_path / "big.txt").write_text("x" * 2000)
    cases = {tmp_path / "photo.png": "not a text file (binary data at byte 8)",
             tmp_path / "cp1251.txt": "not UTF-8 text (byte 0)",
             tmp_path: "is a folder",
             tmp_path / "missing.txt": "cannot read missing.txt"}
    for path, words in cases.items():
        with pytest.raises(AttachmentError, match=words.replace("(", r"\(").replace(")", r"\)")):
            read_attachment(path)
    with pytest.raises(AttachmentError, match="more than the 1,000 a file may have"):
        read_attachment(tmp_path / "big.txt", limit=1000)


def test_a_message_with_files_is_what_the_model_reads_and_shows_chips(tmp_path):
    (tmp_path / "a.csv").write_text("name,qty\nlemon,3\n")
    files = [read_attachment(tmp_path / "a.csv")]
    message = with_attachments("How many lemons?", files, [11])
    assert message["content"] == model_text("How many lemons?", files)
    assert message["content"].startswith("How many lemons?\n\n<file name=\"a.csv\">\nname,qty")
    assert shown(message) == ("How many lemons?", [("a.csv", 11)])
    assert shown({"role": "user", "content": "plain"}) == ("plain", [])
    assert with_attachments("hi", []) == {"role": "user", "content": "hi"}


def test_a_sent_file_is_counted_stored_shown_and_exported(tmp_path, capsys):
    (tmp_path / "list.md").write_text("- 3 lemons\n- basil\n")
    runtime = ScriptedRuntime(["Three."])
    with Host(tmp_path / "data", {"context.recall_semantic": "false"}, runtime=runtime,
              compact=False) as host:
        host.load_model()
        events = list(host.send(None, "How many lemons?",
                                attachments=[read_attachment(tmp_path / "list.md")]))
        saved = next(e for e in events if isinstance(e, UserSaved))
        assert saved.text == "How many lemons?" and saved.attachments[0][0] == "list.md"
        assert saved.attachments[0][1] > 0
        assert "- 3 lemons" in runtime.requests[0][-1]["content"]  # the model read the file
        thread = events[0].thread_id
        entry = load_transcript(host.store, thread)[0]
        assert entry.text == "How many lemons?" and entry.attachments == [saved.attachments[0]]
        request = host.planner().plan(host.store, thread)
        assert request.breakdown.history > saved.attachments[0][1]  # counted with the message
    data = ["--data-dir", str(tmp_path / "data")]
    assert main([*data, "export", "1", "-o", str(tmp_path / "out.json")]) == 0
    exported = json.loads((tmp_path / "out.json").read_text())["messages"]
    assert exported[0]["attachments"]["files"][0]["name"] == "list.md"
    assert main([*data, "import", str(tmp_path / "out.json")]) == 0  # the same chat: not again
    assert "1 chat was imported before (thread 1)" in capsys.readouterr().err
    assert main([*data, "import", "--again", str(tmp_path / "out.json")]) == 0
    assert main([*data, "export", "2"]) == 0
    assert json.loads(capsys.readouterr().out.split("\n", 1)[1])["messages"] == exported


def test_the_cli_refuses_a_binary_attachment_before_anything_is_stored(tmp_path, capsys):
    (tmp_path / "bin.dat").write_bytes(b"ab\0cd")
    data = ["--data-dir", str(tmp_path / "data")]
    assert main([*data, "chat", "--attach", str(tmp_path / "bin.dat"), "what is it"]) == 2
    assert "not a text file" in capsys.readouterr().err
    assert main([*data, "threads", "--json", "--no-model"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_an_edit_with_attach_keeps_its_file(tmp_path, capsys, model_path):
    """Before: ``chat --edit … --attach FILE`` silently dropped the file. The edited
    message carries it like a sent one: stored, shown as a chip, read by the model."""
    (tmp_path / "list.md").write_text("- 3 lemons\n- basil\n")
    data = ["--data-dir", str(tmp_path / "data"), "--set", f"model.path={model_path}",
            "--set", "model.max_tokens=4", "--set", "model.temperature=0", "--set", "model.n_ctx=2048"]
    assert main([*data, "chat", "--json", "How many lemons?"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    code = main([*data, "chat", "--thread", "1", "--edit", "1", "--attach", str(tmp_path / "list.md"),
                 "--json", "How many lemons are on my list?"])
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    with Host(tmp_path / "data", {}) as host:
        rows = host.store.messages(1)
        edited = rows[0]
        assert edited["id"] != 1 and "- 3 lemons" in edited["content"]
        entry = load_transcript(host.store, 1)[0]
        assert entry.text == "How many lemons are on my list?"
        assert [name for name, _ in entry.attachments] == ["list.md"]
