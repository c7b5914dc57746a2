"""llama.cpp's own web UI exports (an audit's F2, reproduced first): a conversation it
downloads (``{"conv": {...}, "messages": [...]}``) and its "export all" file (a list of
those). Before, the first was read as an OpenAI message list: every branch one after
another as one chat, and the tree's empty root message its system prompt; the second was
refused as "unknown role None". Now each is a chat whose branches are Iris branches,
``currNode``'s the active one, the root skipped, a system prompt message the chat's
system prompt, the model's thinking dropped and attachments counted.

The files are written here in the web UI's shape (``tools/server/webui``:
``DatabaseConversation`` {id, lastModified, currNode, name} and ``DatabaseMessage`` {id,
convId, type, timestamp, role, content, parent, thinking, toolCalls, children, extra,
timings, model}; ``DatabaseService.createRootMessage``: type "root", role "system",
content ""); the real CLI in-process and the real SQLite store.
"""

from __future__ import annotations

import json
from pathlib import Path

from test_foreign_import import context_messages, exported, imported, shape, threads

from iris_desktop.core.foreign import load_conversations

T0 = 1760000000000  # ms, as the web UI's timestamps


def message(conv: str, key: str, role: str, content: str, parent: str | None,
            children: list[str], n: int, kind: str = "text", **extra) -> dict:
    return {"id": key, "convId": conv, "type": kind, "timestamp": T0 + n * 1000, "role": role,
            "content": content, "parent": parent, "thinking": "", "toolCalls": "",
            "children": children, **extra}


def branchy(conv: str = "conv-1", name: str = "Colours") -> dict:
    """A conversation of the web UI's database: root, a system prompt, a question, a first
    answer and its regeneration (the one shown), and a follow-up on it."""
    return {"conv": {"id": conv, "lastModified": T0 + 9000, "currNode": "m5", "name": name},
            "messages": [
                message(conv, "root", "system", "", None, ["sys"], 0, "root"),
                message(conv, "sys", "system", "Answer in one short sentence.", "root", ["m1"],
                        1, "system"),
                message(conv, "m1", "user", "Name a colour.", "sys", ["m2", "m3"], 2,
                        extra=[{"type": "imageFile", "name": "a.png",
                                "base64Url": "data:image/png;base64,AAAA"}]),
                message(conv, "m2", "assistant", "Red.", "m1", [], 3),
                message(conv, "m3", "assistant", "<think>Pick one.</think>Blue.", "m1", ["m5"], 4,
                        thinking="The user wants one colour.", model="qwen3-8b",
                        timings={"prompt_n": 12, "predicted_n": 3}),
                message(conv, "m5", "user", "Why blue?", "m3", [], 5)]}


def write(path: Path, value) -> Path:
    path.write_text(json.dumps(value, indent=2))
    return path


def test_a_downloaded_conversation_is_a_tree_with_the_shown_branch_active(capsys, tmp_path):
    ids, err = imported(capsys, write(tmp_path / "Colours-2025-10-09_10-00-00.json", branchy()))
    assert len(ids) == 1
    assert err.splitlines() == [
        "iris-desktop: imported 1 chat from a llama.cpp web UI export",
        "iris-desktop: 1 image was left out: Iris imports text only."]
    assert threads(capsys)[0]["title"] == "Colours"
    assert shape(exported(capsys, ids[0])) == [
        ("system", "Answer in one short sentence.", None, True),
        ("user", "Name a colour.", 0, True),
        ("assistant", "Red.", 1, False),
        ("assistant", "Blue.", 1, True),
        ("user", "Why blue?", 3, True)]
    sent = context_messages(capsys, ids[0])  # the shown branch, under its system prompt
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]


def test_the_export_of_all_conversations_is_one_chat_each(capsys, tmp_path):
    other = branchy("conv-2", "Second")
    other["conv"]["currNode"] = "m2"  # the first answer shown
    ids, err = imported(capsys, write(tmp_path / "all_conversations_2025-10-09.json",
                                      [branchy(), other]))
    assert len(ids) == 2 and err.startswith("iris-desktop: imported 2 chats from a llama.cpp ")
    second = next(t["id"] for t in threads(capsys) if t["title"] == "Second")
    assert [a for *_, a in shape(exported(capsys, second))] == [True, True, True, False, False]


def test_the_open_conversation_downloaded_holds_its_branch_alone(tmp_path):
    """The web UI downloads the open conversation's shown branch (no root); without a
    ``currNode`` the newest message ends the shown branch, as the web UI shows it."""
    whole = branchy()
    shown = {"conv": {**whole["conv"], "currNode": ""},
             "messages": [m for m in whole["messages"] if m["id"] in ("sys", "m1", "m3", "m5")]}
    loaded = load_conversations(write(tmp_path / "open.json", shown))
    assert [(m["role"], m["content"]) for m in loaded.chats[0].messages] == [
        ("system", "Answer in one short sentence."), ("user", "Name a colour."),
        ("assistant", "Blue."), ("user", "Why blue?")]
    assert loaded.chats[0].messages[2]["imported_from"] == "llama.cpp"
