"""Import findings of session 67's hostile audit, each through the real CLI into a real
SQLite store (or the real reader with a small limit in place of 512 MB):

- a deep JSON file (LibreChat's "recursive" export) cut short, or with a stray byte, was
  refused as "JSON nested too deeply … (more than 1,000 levels)": its syntax error is said
  as a shallow file's (``conversation._loads`` reads it at any depth);
- a text-generation-webui history whose attached file Iris could not record (over 8 MiB,
  a name of 300 characters or with a '/', the 1,001st file) was refused whole, with advice
  to fix the record; a lone UTF-16 half in an attached file's text or name refused it too
  ("not of the expected kind (UnicodeEncodeError)");
- a JSONL file over the size limit was read as one JSON value without its line breaks
  ("invalid JSON at line 1, column 34: Extra data", after 25 s): the size refusal stands,
  as it does for a file whose string holds a raw line break (the squeeze would make it
  JSON), and a squeezed file's error says it was read so, not a line and column of it;
- a NUL in a JSON string was "Invalid control character at".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_foreign_import import exported, imported

from support.helpers import one_sentence
from support.helpers import run_cli as run

REFUSED = "iris-desktop: import refused, nothing was written: "


def _librechat_recursive(n: int) -> str:
    """LibreChat's 'recursive' export of a chain of n messages (2n levels deep)."""
    opened = "".join(f'{{"messageId":"m{i}","text":"t{i}","isCreatedByUser":'
                     f'{"true" if i % 2 == 0 else "false"},"children":[' for i in range(n))
    return ('{"conversationId":"c","title":"deep","recursive":true,"messages":['
            + opened + "]}" * n + "]}")


# -- a deep file with a syntax error ----------------------------------------------------------


def test_a_truncated_recursive_librechat_export_says_it_ends_early(tmp_path, capsys):
    text = _librechat_recursive(1500)
    whole = tmp_path / "whole.json"
    whole.write_text(text)
    assert run(capsys, "import", whole)[0] == 0  # the whole export imports (3,000 levels)
    cut = tmp_path / "cut.json"
    cut.write_text(text[: len(text) - 2000])  # a download cut short
    code, out, err = run(capsys, "import", cut)
    assert code != 0 and one_sentence(err) and err.startswith(REFUSED), err
    assert "nested too deeply" not in err, err  # was: "… (more than 1,000 levels)"
    assert err == f"{REFUSED}{cut}: the file ends early (line 1)\n", err


def test_a_stray_byte_in_a_deep_export_is_said_where_it_is(tmp_path, capsys):
    text = _librechat_recursive(1500)
    at = text.index('"m700"') - 1  # between "messageId" and its colon
    source = tmp_path / "stray.json"
    source.write_text(text[:at] + "x" + text[at:])
    code, out, err = run(capsys, "import", source)
    assert code != 0 and one_sentence(err), err
    assert err == (f"{REFUSED}{source}: invalid JSON at line 1, column {at + 1}: "
                   "Expecting ':' delimiter\n"), err


def test_a_deep_file_with_a_too_long_number_says_so(tmp_path, capsys):
    text = _librechat_recursive(800).replace('"t799"', "1" * 5000)
    source = tmp_path / "number.json"
    source.write_text(text[:-3])  # (cut short too: the number is met first)
    code, out, err = run(capsys, "import", source)
    assert code != 0 and one_sentence(err), err
    assert "digits, which is not a value a conversation holds" in err, err


def test_a_deep_file_that_is_json_is_still_nested_too_deeply_without_a_wrong_count(
        tmp_path, capsys):
    source = tmp_path / "deep.json"
    source.write_text("[" * 5000 + "]" * 5000)
    code, out, err = run(capsys, "import", source)
    assert err == f"{REFUSED}{source}: JSON nested too deeply to be a conversation\n", err
    lines = tmp_path / "deep.jsonl"  # (a deep line of JSONL: the same)
    lines.write_text('{"role": "user", "content": "hi"}\n' + "[" * 5000 + "]" * 5000 + "\n")
    code, out, err = run(capsys, "import", lines)
    assert code != 0 and one_sentence(err) and "nested" in err and "levels" not in err, err


# -- text-generation-webui's attachments -------------------------------------------------------


def _textgen(tmp_path: Path, *attachments: dict) -> Path:
    path = tmp_path / "history.json"
    path.write_text(json.dumps({"internal": [["read this", "done"]], "visible": [],
                                "metadata": {"user_0": {"attachments": list(attachments)}}}))
    return path


def _question(capsys, path: Path) -> tuple[dict, str]:
    ids, err = imported(capsys, path)
    return exported(capsys, ids[0])[0], err


BIG = 8 * 1024 * 1024 + 1  # one byte over what Iris attaches


def test_an_attached_file_over_the_limit_is_kept_as_the_questions_text(tmp_path, capsys):
    question, err = _question(capsys, _textgen(
        tmp_path, {"name": "notes.txt", "type": "text/plain", "content": "x" * BIG},
        {"name": "small.txt", "type": "text/plain", "content": "small"}))
    assert err == "iris-desktop: imported 1 chat from a text-generation-webui chat history\n", err
    kept = 'read this\n\n<file name="notes.txt">\n' + "x" * BIG + "\n</file>"
    assert question["content"] == kept + '\n\n<file name="small.txt">\nsmall\n</file>'
    # (the model reads what it read; the transcript shows the big file as text, a chip for the other)
    assert question["attachments"] == {"text_chars": len(kept),
                                       "files": [{"name": "small.txt", "bytes": 5}]}


def test_a_file_past_the_thousandth_is_kept_as_text(tmp_path, capsys):
    files = [{"name": f"f{i}.txt", "type": "text/plain", "content": f"file {i}"}
             for i in range(1001)]
    question, err = _question(capsys, _textgen(tmp_path, *files))
    assert len(question["attachments"]["files"]) == 1000
    typed = question["content"][:question["attachments"]["text_chars"]]
    assert typed == 'read this\n\n<file name="f1000.txt">\nfile 1000\n</file>'


@pytest.mark.parametrize(("name", "recorded"), [
    ("n" * 300 + ".txt", "n" * 251 + ".txt"),  # cut to 255 characters, its extension kept
    ("docs/notes.txt", "notes.txt"),  # a path: its last part
    ("notes\0.txt", "notes.txt"),
    ("docs/", "attached.txt"),
])
def test_a_name_iris_cannot_record_is_made_a_file_name(tmp_path, capsys, name, recorded):
    question, err = _question(capsys, _textgen(
        tmp_path, {"name": name, "type": "text/plain", "content": "hello"}))
    assert "remove the key" not in err, err  # was: refused, "… fix it or remove the key"
    assert question["attachments"]["files"] == [{"name": recorded, "bytes": 5}]
    assert question["content"] == f'read this\n\n<file name="{recorded}">\nhello\n</file>'


def test_a_lone_surrogate_in_an_attached_text_is_mended(tmp_path, capsys):
    question, err = _question(capsys, _textgen(
        tmp_path, {"name": "a.txt", "type": "text/plain", "content": "cut \ud83d"}))
    # was: "… not of the expected kind (UnicodeEncodeError)"
    assert err.splitlines()[1] == ("iris-desktop: 1 broken character (half of an emoji's or "
                                   "other character's UTF-16 pair) was replaced with \ufffd."), err
    assert question["content"] == 'read this\n\n<file name="a.txt">\ncut \ufffd\n</file>'


def test_a_lone_surrogate_in_an_attached_files_name_counts_once(tmp_path, capsys):
    """The name is in the record and in the text the model reads: one broken character."""
    question, err = _question(capsys, _textgen(
        tmp_path, {"name": "a\udc00.txt", "type": "text/plain", "content": "fine"},
        {"name": "b.txt", "type": "text/plain", "content": "and \ud83d"}))
    assert "2 broken characters" in err, err
    assert [f["name"] for f in question["attachments"]["files"]] == ["a\ufffd.txt", "b.txt"]


# -- a file over the size limit read without its indentation ----------------------------------


def test_a_jsonl_file_over_the_limit_is_not_squeezed_into_one_line(tmp_path):
    from iris_desktop.core.conversation import ConversationFormatError
    from iris_desktop.core.foreign_text import read_text, squeezed
    path = tmp_path / "chat.jsonl"
    line = json.dumps({"role": "user", "content": "hi"}) + "\n"
    path.write_text(line * 1000)
    limit = path.stat().st_size - 500  # over the limit, fits once its line breaks are gone
    assert squeezed(path, limit) is None  # was: the lines joined into one "{...}{...}"
    with pytest.raises(ConversationFormatError, match="larger than the limit"):
        read_text(path, limit)


def test_a_string_with_a_raw_line_break_is_not_squeezed_into_json(tmp_path):
    """No JSON string holds a raw line break; taking out the break and the indentation
    after it would make such a file JSON (its string joined): it is not read so."""
    from iris_desktop.core.foreign_text import squeezed
    path = tmp_path / "broken.json"
    message = '  {\n    "role": "user",\n    "content": "a line\n        and the next"\n  }'
    path.write_text("[\n" + ",\n".join([message] * 200) + "\n]")
    with pytest.raises(json.JSONDecodeError):
        json.loads(path.read_text())
    joined = path.read_text().replace("\n        ", "").replace("\n    ", "").replace("\n  ", "")
    assert len(json.loads(joined.replace("\n", ""))) == 200  # (what the squeeze made of it)
    assert squeezed(path, path.stat().st_size - 1000) is None  # (it would fit)
    escaped = tmp_path / "escaped.json"  # its escapes, a quote and a backslash: read so
    escaped.write_text(path.read_text().replace('a line\n        and', 'a \\"line\\\\\\" and'))
    assert json.loads(squeezed(escaped, escaped.stat().st_size - 1000)) == json.loads(
        escaped.read_text())


def test_a_squeezed_files_error_says_it_was_read_without_its_indentation(
        tmp_path, capsys, monkeypatch):
    import iris_desktop.core.foreign as foreign

    monkeypatch.setattr(foreign, "MAX_IMPORT_BYTES", 20_000)
    source = tmp_path / "indented.json"
    message = {"role": "user", "content": "hello"}
    source.write_text(json.dumps({"messages": [message] * 400}, indent=8)[:-20] + "x}")
    assert source.stat().st_size > 20_000
    code, out, err = run(capsys, "import", source)
    assert code != 0 and one_sentence(err), err
    assert "read without its line breaks and indentation" in err and "line 1" not in err, err
    source.write_text(json.dumps({"messages": [message] * 400}, indent=8)[:-60])  # cut short
    code, out, err = run(capsys, "import", source)
    assert err == f"{REFUSED}{source}: the file ends early\n", err  # (no "line 1")


# -- a control character in a string ---------------------------------------------------------


@pytest.mark.parametrize(("char", "said"), [
    ("\0", "a NUL character (U+0000)"), ("\t", "a tab (U+0009)"),
    ("\x1b", "a control character (U+001B)")])
def test_a_control_character_in_a_string_is_named(tmp_path, capsys, char, said):
    source = tmp_path / "nul.json"
    source.write_text('{"messages": [{"role": "user", "content": "a' + char + 'b"}]}')
    code, out, err = run(capsys, "import", source)
    assert err == (f"{REFUSED}{source}: invalid JSON at line 1, column 45: {said} inside a "
                   f"string, which JSON allows only as an escape (\\u{ord(char):04x})\n"), err
