"""An audit of attached files and ``chat --file``: one reading for both (UTF-16 read by
its mark, a NUL refused, every line ending ``\\n``), a folder named by its name, and a
message too large for the window refused with the room ``context`` gives."""

from __future__ import annotations

import json

import pytest

from iris_desktop.cli import main
from iris_desktop.core.attachments import AttachmentError, read_attachment
from iris_desktop.core.engine import ConversationTooLargeException, certainly_too_large
from iris_desktop.core.events import TurnFailed
from iris_desktop.host import Host

from support.fakes import ScriptedRuntime

NO_MODEL = ("--set", "model.path=/nonexistent.gguf")


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-32"])
def test_a_utf16_or_utf32_file_with_its_mark_is_read_as_its_text(capsys, tmp_path, encoding):
    """Windows PowerShell's ``>`` and older Notepad's "Unicode" write UTF-16 with a
    byte-order mark: the mark says what the bytes are, so they are read (before: "notes.txt
    is UTF-16 text; Iris reads UTF-8 (save the file as UTF-8)"; earlier still, "not a text
    file (binary data at byte 3)", the NUL of its second character)."""
    path = tmp_path / "notes.txt"
    data = "Buy basil 🌿.\r\n".encode(encoding)
    path.write_bytes(data if encoding != "utf-16-be" else b"\xfe\xff" + data)
    assert read_attachment(path).text == "Buy basil 🌿.\n"


def test_a_file_that_starts_as_utf16_but_is_not_is_named_so(capsys, tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"\xff\xfe" + "Buy".encode("utf-16-le") + b"\x00\xd8")  # a lone half at the end
    words = "not UTF-16 text, though it starts as UTF-16 does (byte 8)"
    with pytest.raises(AttachmentError) as caught:
        read_attachment(path)
    assert str(caught.value) == f"notes.txt is {words}"
    home = ["--data-dir", str(tmp_path / "data"), *NO_MODEL]
    code, out, err = run(capsys, *home, "chat", "--attach", str(path), "hi")
    assert code == 2 and out == "" and err == (f"iris-desktop: --attach: notes.txt is {words}; "
                                               "nothing was sent or stored\n")
    code, out, err = run(capsys, *home, "chat", "--file", str(path))
    assert code == 2 and err == f"iris-desktop: --file: {path}: {words}\n"


def test_attaching_a_folder_by_dot_or_slash_names_it(capsys, tmp_path, monkeypatch):
    """Before: ``--attach .`` said "--attach:  is a folder; attach a file", an empty name
    (``Path('.').name``). Now the folder's own name, or the path where it has none."""
    (tmp_path / "notes").mkdir()
    monkeypatch.chdir(tmp_path / "notes")
    code, out, err = run(capsys, "--data-dir", str(tmp_path / "data"), *NO_MODEL, "chat",
                         "--attach", ".", "hi")
    assert code == 2 and err == ("iris-desktop: --attach: notes is a folder; attach a file; "
                                 "nothing was sent or stored\n")
    for path, name in ((".", "notes"), ("..", tmp_path.name), ("/", "/")):
        with pytest.raises(AttachmentError, match=f"^{name} is a folder; attach a file$"):
            read_attachment(path)


def test_a_nul_byte_is_refused_by_file_as_by_attach(capsys, tmp_path):
    """Before: ``chat --file`` sent and stored a file holding ``abc\\0def`` (its title
    "abc\\x00def") that ``--attach`` refused as binary data. Now both refuse it, in the
    same words, before the model loads; nothing is stored."""
    path = tmp_path / "nul.txt"
    path.write_bytes(b"abc\0def\n")
    home = ["--data-dir", str(tmp_path / "data")]
    code, out, err = run(capsys, *home, *NO_MODEL, "chat", "--file", str(path))
    assert code == 2 and out == ""
    assert err == f"iris-desktop: --file: {path}: not a text file (binary data at byte 3)\n"
    with pytest.raises(AttachmentError, match=r"^nul.txt is not a text file \(binary data at "
                                              r"byte 3\); attach text"):
        read_attachment(path)
    assert json.loads(run(capsys, *home, "threads", "--json", "--no-model")[1]) == []


def test_a_lone_cr_ends_a_line_in_an_attached_file_and_in_file(capsys, tmp_path, monkeypatch):
    """Before: only CRLF became ``\\n``; a lone CR (old Mac files, a mix) stayed in the
    text the model read and the chat stored. Now every line ending is ``\\n``, for an
    attached file and for ``chat --file`` alike."""
    path = tmp_path / "mixed.txt"
    path.write_bytes(b"a\nb\rc\r\nd\r")
    assert read_attachment(path).text == "a\nb\nc\nd\n"
    runtime = ScriptedRuntime(["Four lines."])
    monkeypatch.setattr("iris_desktop.host.load_runtime", lambda *a, **k: runtime)
    home = ["--data-dir", str(tmp_path / "data")]
    code, out, err = run(capsys, *home, "chat", "--file", str(path))
    assert code == 0 and out.strip() == "Four lines."
    assert runtime.requests[0][-1]["content"] == "a\nb\nc\nd"
    code, out, err = run(capsys, *home, "export", "1")
    exported = json.loads(out)
    assert exported["messages"][0]["content"] == "a\nb\nc\nd"


def test_a_message_certainly_too_large_is_refused_with_the_room_context_gives(tmp_path):
    """Before: the refusal of a message certainly too large for the window (the ``chat``
    command's, the "Not sent" notice's) said "the window allows at most 5,734 (window 8,192
    × ratio 0.7)", the budget before the system prompt, while ``context`` and the draft
    said 5,709 fit. Now, given the chat's frame, it is the planner's own sentence with the
    same room, "… − system 25 − tools 0 − summary 0"; the frame is asked for only to
    refuse, so a message that may fit costs nothing more than before."""
    def never():
        raise AssertionError("the frame is built only to refuse")

    with Host(tmp_path / "data", {"context.recall_semantic": "false", "context.window": 1024,
                                  "chat.system_prompt": "You answer in one short sentence."},
              runtime=ScriptedRuntime([]), compact=False) as host:
        host.load_model()
        planner = host.planner()
        tools = planner.tool_prompt(True)
        frame = planner.engine(host.store, recall=False).frame(-1, tools.text, tools.native_tokens)
        draft = "word " * 40_000  # 200,000 bytes: at least 782 tokens, more than 1024 × 0.7
        with pytest.raises(ConversationTooLargeException) as caught:
            planner.plan(host.store, -1, draft)
        n_bytes = len(draft.strip().encode())
        refusal = certainly_too_large(planner.params, n_bytes, lambda: frame)
        assert refusal == f"conversation too large: {caught.value}"
        assert f"the history budget allows {caught.value.allowed:,} (window 1,024 × ratio 0.7 − system " \
            f"{frame.system_tokens:,} − tools" in refusal and frame.system_tokens > 0
        assert certainly_too_large(planner.params, 100, never) is None
        assert "the history budget allows at most 716 (window 1,024 × ratio 0.7)" in \
            certainly_too_large(planner.params, n_bytes)

def test_chat_and_the_not_sent_notice_give_the_room_context_gives(capsys, tmp_path, monkeypatch):
    """Before: ``chat`` and the window's "Not sent" notice said "the window allows at most
    716 (window 1,024 × ratio 0.7)" for a message certainly too large, while ``context``
    said fewer fit (the system prompt's share taken). Now all three give one number."""
    runtime = ScriptedRuntime([])
    monkeypatch.setattr("iris_desktop.host.load_runtime", lambda *a, **k: runtime)
    home = ["--data-dir", str(tmp_path / "data"), "--set", "context.window=1024",
            "--set", "chat.system_prompt=You answer in one short sentence."]
    big = tmp_path / "big.txt"
    big.write_text("word " * 40_000)
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps([{"role": "user", "content": "Hi"},
                                {"role": "assistant", "content": "Hello!"}]))
    assert main([*home, "import", str(chat)]) == 0
    capsys.readouterr()
    code = main([*home, "context", "1", "--no-model", "--json", "--draft", "word " * 40_000])
    out = capsys.readouterr().out
    allowed = json.loads(out)["allowed"]
    code = main([*home, "chat", "--thread", "1", "--file", str(big)])
    err = capsys.readouterr().err
    assert code == 3 and f"the history budget allows {allowed:,} (window 1,024 × ratio 0.7 − system " in err
    with Host(tmp_path / "data", {"context.window": 1024, "context.recall_semantic": "false",
                                  "chat.system_prompt": "You answer in one short sentence."},
              runtime=ScriptedRuntime([]), compact=False) as host:
        host.load_model()
        failed = [e for e in host.send(1, "word " * 40_000) if isinstance(e, TurnFailed)]
    assert f"the history budget allows {allowed:,} (window 1,024 × ratio 0.7 − system " in failed[0].text
    assert failed[0].allowed == allowed
