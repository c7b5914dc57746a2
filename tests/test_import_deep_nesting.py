"""A file nested deeper than ``json.loads`` reads (``core/big_json._deep``). LibreChat's
export dialog writes a "recursive" export by default: each reply nested inside the message
before it, so a chat of 500 messages is 1,000 levels deep. Before, such a chat was refused
("JSON nested too deeply to be a conversation (more than 1,000 levels)"); now it imports
whole, through the real CLI into a real SQLite store."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
from test_foreign_import import exported, imported, threads

from iris_desktop.core.big_json import _deep, parse

TREE = Path(__file__).parent / "fixtures" / "local-apps" / "librechat" / "librechat-tree.json"


def recursive_export(count: int, indent: int = 0) -> str:
    """LibreChat's own test export (its fields, its options), its chat made ``count``
    messages long, each nested in the one before, as LibreChat writes it; with ``indent``
    spaces a level, as its export indents it (each message two levels deeper)."""
    source = json.loads(TREE.read_text(encoding="utf-8"))
    fields = {k: v for k, v in source["messages"][0].items() if k != "children"}
    head, tail = [], []
    for i in range(count):
        message = {**fields, "messageId": f"m{i}", "isCreatedByUser": i % 2 == 0,
                   "parentMessageId": f"m{i - 1}" if i else "00000000-0000-0000-0000-000000000000",
                   "text": f"message {i} of the long chat"}
        pad = "\n" + " " * (indent * (2 * i + 2)) if indent else ""
        inner = pad + " " * indent if indent else ""
        head.append("{" + ",".join(f"{inner}{json.dumps(k)}: {json.dumps(v)}" for k, v in message.items())
                    + f',{inner}"children": [' + (inner + " " * indent if indent else ""))
        tail.append(f"{inner}]{pad}}}")
    document = json.dumps({**source, "title": "A long LibreChat chat", "messages": None}, indent=indent or None)
    return document.replace('"messages": null', '"messages": [' + "".join(head) + "".join(reversed(tail)) + "]")


def test_a_long_recursive_librechat_export_imports_whole(capsys, tmp_path):
    source = tmp_path / "long.json"
    source.write_text(recursive_export(5_000), encoding="utf-8")
    with pytest.raises(RecursionError):  # what json.loads makes of it
        json.loads(source.read_text(encoding="utf-8"))
    ids, err = imported(capsys, source)
    assert len(ids) == 1 and err == "iris-desktop: imported 1 chat from a LibreChat export\n", err
    messages = exported(capsys, ids[0])
    assert messages[0]["role"] == "system"  # (the export's promptPrefix)
    said = [(m["role"], m["content"]) for m in messages[1:]]
    assert len(said) == 5_000
    assert said[0] == ("user", "message 0 of the long chat")
    assert said[-1] == ("assistant", "message 4999 of the long chat")
    assert threads(capsys)[0]["title"] == "A long LibreChat chat"


def test_the_deep_reader_reads_what_json_reads_and_refuses_what_it_refuses():
    """Every value ``json.loads`` reads (random documents, and its own edge cases) comes
    back the same; every text it refuses is refused (a ValueError)."""
    rng = random.Random(7)

    def made(depth: int):
        pick = rng.random()
        if depth > 4 or pick < 0.3:
            return rng.choice([0, -12, 2.5e-7, 1e300, "", "é\n\"\\\u2028", None, True, False])
        if pick < 0.65:
            return [made(depth + 1) for _ in range(rng.randint(0, 4))]
        return {f"k{rng.randint(0, 3)}": made(depth + 1) for _ in range(rng.randint(0, 4))}

    texts = [json.dumps(made(0), indent=rng.choice([None, 1]), ensure_ascii=rng.random() < 0.5)
             for _ in range(500)]
    texts += ['{"a": 1, "a": 2}', " [ ] ", "-0.0", "[NaN, Infinity, -Infinity]", '"\\ud83d\\ude00"']
    for text in texts:
        assert repr(_deep(text)) == repr(json.loads(text)), text
    for bad in ["{", "[1,]", '{"a" 1}', "[1 2]", '{"a":1,}', "01", "[1]x", "", "nul", "{1:2}",
                '"abc', "[-]", "[1e]", "tru"]:
        with pytest.raises(ValueError):
            json.loads(bad)
        with pytest.raises(ValueError):
            _deep(bad)


def test_depth_is_no_limit_and_the_recursion_limit_is_left_alone():
    limit = sys.getrecursionlimit()
    value = parse("[" * 200_000 + "]" * 200_000)
    depth = 0
    while value:
        value, depth = value[0], depth + 1
    assert depth == 199_999 and sys.getrecursionlimit() == limit


def test_an_indented_recursive_export_over_the_limit_is_read_without_its_indentation(
        capsys, tmp_path, monkeypatch):
    """LibreChat indents its export, and a "recursive" one nests each reply a level deeper:
    the file grows with the square of the chat (4,000 messages of 600 characters: 580 MB,
    over the import's 512 MB limit; session 66's review). Such a file is read without its
    lines' indentation where that fits the limit: here a 1,000-message export of ~30 MB
    under a limit of 4 MB (the JSON itself is ~1 MB), imported whole."""
    import iris_desktop.core.foreign as foreign

    monkeypatch.setattr(foreign, "MAX_IMPORT_BYTES", 4_000_000)
    source = tmp_path / "indented.json"
    source.write_text(recursive_export(1_000, indent=2), encoding="utf-8")
    assert source.stat().st_size > 25_000_000
    ids, err = imported(capsys, source)
    assert err == "iris-desktop: imported 1 chat from a LibreChat export\n", err
    said = [m["content"] for m in exported(capsys, ids[0])[1:]]
    assert len(said) == 1_000 and said[-1] == "message 999 of the long chat"
