"""ChatGPT's exports since early 2026 hold no conversations.json: the chats are split
into conversations-000.json, conversations-001.json… (beside export_manifest.json,
user.json, chat.html). Both the .zip as downloaded and its unzipped folder were refused
("a zip archive with no conversations.json in it"; "is a folder"). A real SQLite file,
the real CLI."""

from __future__ import annotations

import json
import zipfile

import pytest

from support.helpers import chatgpt_export, one_sentence, run_cli


def sharded(tmp_path, chats: int, parts: int):
    """A folder laid out as a newer ChatGPT export: ``chats`` chats in ``parts`` files."""
    made = json.loads(chatgpt_export(tmp_path, chats).read_text())
    (tmp_path / "conversations.json").unlink()
    folder = tmp_path / "export"
    folder.mkdir()
    step = -(-chats // parts)
    for n in range(parts):
        (folder / f"conversations-{n:03d}.json").write_text(json.dumps(made[n * step:(n + 1) * step]))
    for name in ("export_manifest.json", "user.json", "user_settings.json"):
        (folder / name).write_text("{}")
    (folder / "chat.html").write_text("<html></html>")
    return folder


def zipped(folder):
    archive = folder.with_suffix(".zip")
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as out:
        for file in sorted(folder.iterdir()):
            out.write(file, file.name)
    return archive


@pytest.mark.parametrize("as_zip", [False, True], ids=["folder", "zip"])
def test_a_sharded_chatgpt_export_imports_every_chat(tmp_path, capsys, as_zip):
    folder = sharded(tmp_path, 7, 3)
    source = zipped(folder) if as_zip else folder
    code, out, err = run_cli(capsys, "--data-dir", tmp_path / "data", "import", source)
    assert code == 0, err
    assert len(out.split()) == 7  # the new chats' ids
    code, out, err = run_cli(capsys, "--data-dir", tmp_path / "data", "threads", "--json")
    assert code == 0, err
    titles = sorted(t["title"] for t in json.loads(out))
    assert titles == sorted(f"Chat {n}" for n in range(7))
    code, out, err = run_cli(capsys, "--data-dir", tmp_path / "data", "import", source)
    assert code == 0 and out.split() == []  # imported before: none again


def test_a_shard_that_is_not_a_list_is_refused_and_nothing_is_stored(tmp_path, capsys):
    folder = sharded(tmp_path, 4, 2)
    (folder / "conversations-001.json").write_text('{"title": "not a list"}')
    code, _, err = run_cli(capsys, "--data-dir", tmp_path / "data", "import", zipped(folder))
    assert code == 2 and one_sentence(err), err
    assert "conversations-001.json is not a list of chats" in err
    assert err.count("nothing was") == 1, err  # (said once, not "…; nothing was imported" too)


@pytest.mark.parametrize("as_zip", [False, True], ids=["folder", "zip"])
def test_a_shard_that_is_not_valid_json_is_named(tmp_path, capsys, as_zip):
    """Before: "its conversations.json is not a ChatGPT or Claude export", naming a file
    the export does not have, for a part with a stray comma."""
    folder = sharded(tmp_path, 6, 3)
    good = (folder / "conversations-002.json").read_text()
    (folder / "conversations-002.json").write_text(good[:-1] + " ,]")
    source = zipped(folder) if as_zip else folder
    code, _, err = run_cli(capsys, "--data-dir", tmp_path / "data", "import", source)
    assert code == 2 and one_sentence(err), err
    assert "its conversations-002.json is not valid JSON" in err and "conversations.json" not in err
    code, out, _ = run_cli(capsys, "--data-dir", tmp_path / "data", "threads", "--json")
    assert json.loads(out) == []
