"""BetterChatGPT's exports of 2023 may lack ``titleSet`` (its own importer fills it in):
such a file, a list of ``{title, messages, config}``, is imported as BetterChatGPT's
(session 66's review: it went to the OpenAI-list reader, "message index 0: unknown role
None")."""

from __future__ import annotations

import json

from test_foreign_import import exported, imported, threads


def test_a_2023_export_without_title_set_is_imported(capsys, tmp_path):
    source = tmp_path / "export.json"
    source.write_text(json.dumps([{"id": "a1", "title": "Packing list", "messages": [
        {"role": "system", "content": "You are ChatGPT"},
        {"role": "user", "content": "What should I pack?"},
        {"role": "assistant", "content": "Layers."}], "config": {"temperature": 1}}]))
    ids, err = imported(capsys, source)
    assert err == "iris-desktop: imported 1 chat from a BetterChatGPT export\n", err
    messages = exported(capsys, ids[0])
    assert [(m["role"], m["content"]) for m in messages] == [
        ("system", "You are ChatGPT"), ("user", "What should I pack?"), ("assistant", "Layers.")]
    assert threads(capsys)[0]["title"] == "Packing list"


def test_a_chat_that_cannot_be_read_is_named_by_its_place_in_the_file(capsys, tmp_path):
    """BetterChatGPT lists its newest chat first: its chats are stored oldest first (the
    file's first on top of Iris's list) but read, and counted in a refusal, in the file's
    order (a fix of the order had the refusal count from the file's end: "chat 3" for its
    first)."""
    source = tmp_path / "export.json"
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
            "config": {}}
    source.write_text(json.dumps({"chats": [{"messages": "no", "config": {}}, {**good, "title": "Middle"},
                                            {**good, "title": "Oldest"}], "folders": {}, "version": 1}))
    ids, err = imported(capsys, source)
    assert "skipped 1 (chat 1: " in err, err
    assert [t["title"] for t in threads(capsys)] == ["Middle", "Oldest"]
