"""Other apps' real files (tests/fixtures/real/, each one's source in SOURCES.md there),
imported through the real CLI in-process into a real SQLite store. The formats' own tests
use files written after each app's documentation; these are files the apps (or their
projects) wrote, and each test here failed before the fix it names.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from test_foreign_import import exported, imported, threads

REAL = Path(__file__).parent / "fixtures" / "real"


def test_fastchats_sharegpt_file_keeps_each_conversations_own_system_prompt(capsys):
    """FastChat's data/dummy_conversation_with_system.json gives a conversation's system
    prompt as its ``system`` field, beside its turns. Before, it was dropped: the chat
    was imported without it (and counted as a copy of the same turns imported before)."""
    ids, err = imported(capsys, REAL / "sharegpt" / "fastchat-dummy_conversation_with_system.json")
    assert len(ids) == 2 and err == "iris-desktop: imported 2 chats from a ShareGPT file\n"
    first, second = (exported(capsys, i) for i in ids)
    assert [m["role"] for m in first] == ["system", "user", "assistant", "user", "assistant"]
    assert first[0]["content"].startswith("A chat between a curious user and an artificial "
                                          "intelligence assistant whose name is Vicuna.")
    assert [m["role"] for m in second] == ["system", "user", "assistant"]
    assert "whose name is Vick." in second[0]["content"]


def test_sillytaverns_humanized_send_dates_date_the_messages(capsys):
    """A SillyTavern chat of 2023 (its repository's public/chats/Megumin) dates its
    messages "2023-4-21 @20h 02m 47s 124ms" (SillyTavern's humanizedISO8601DateTime, which
    its server still writes for imported chats) and its start as a number (ms). Before, no
    message got a date (the chat was dated and listed by the import) and the title had no
    date."""
    ids, err = imported(capsys, REAL / "sillytavern" / "Megumin-1673323621108.jsonl")
    assert len(ids) == 1 and err == "iris-desktop: imported 1 chat from a SillyTavern chat\n"
    messages = exported(capsys, ids[0])
    assert [m["role"] for m in messages] == ["assistant", "user", "assistant"]
    assert messages[1]["content"] == ("I am here to go on an adventure with you Megumin. "
                                      "I happen to be a mage too!")

    def local(*fields: int) -> datetime:  # (the local time of the machine that wrote it)
        return datetime.fromtimestamp(datetime(*fields).timestamp(), UTC)

    dated = [datetime.fromisoformat(m["created_at"]) for m in messages]
    expected = [local(2023, 4, 21, 20, 2, 47), local(2023, 4, 21, 20, 3, 6),
                local(2023, 4, 21, 20, 3, 13)]
    assert [abs((d - e).total_seconds()) < 1 for d, e in zip(dated, expected)] == [True] * 3
    began = datetime.fromtimestamp(1674559900991 / 1000).strftime("%Y-%m-%d@%Hh%Mm%Ss")
    assert threads(capsys)[0]["title"] == f"Megumin ({began})"  # (its create_date: ms)


def test_llamacpps_first_web_ui_conversation_is_imported_not_refused(capsys):
    """llama.cpp's tools/server/webui/public/demo-conversation.json: a conversation as the
    web UI's first version kept it, ``{id: "conv-…", lastModified, messages}`` with no tree
    (and a tool result without ``tool_call_id``). Before, it was read as an OpenAI message
    list and refused: "messages[6]: a tool result needs a tool_call_id"."""
    ids, err = imported(capsys, REAL / "llamacpp" / "demo-conversation.json")
    assert len(ids) == 1 and err.splitlines()[0] == (
        "iris-desktop: imported 1 chat from a llama.cpp web UI export")
    messages = exported(capsys, ids[0])
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user",
                                             "assistant", "assistant"]
    assert messages[5]["content"] == "Let me check that for you!"  # (its <think> dropped)
    assert messages[6]["content"] == "The weather in San Francisco is currently 20°C and sunny."
    assert all(m.get("imported_from") == "llama.cpp" for m in messages if m["role"] == "assistant")


def test_llamacpps_numbered_current_node_picks_the_branch_shown(capsys, tmp_path):
    """The web UI of early 2025 numbered its messages with Date.now() (a real download of
    it, conversation_conv-1740318651623.json, is quoted in a public repository whose
    license is not known, so only its shape is kept here: numeric ids and ``currNode``, a
    root whose ``parent`` is -1). Before, a numeric ``currNode`` was ignored and the newest
    reply made active, not the one the user had chosen."""
    conv = "conv-1740318651623"
    messages = [
        {"id": 1740318651623, "convId": conv, "type": "root", "timestamp": 1740318651623,
         "role": "system", "content": "", "parent": -1, "children": [1740318651641]},
        {"id": 1740318651641, "timestamp": 1740318651641, "type": "text", "convId": conv,
         "role": "user", "content": "What about `gdb -tui`?", "parent": 1740318651623,
         "children": [1740318651701, 1740318769492]},
        {"id": 1740318651701, "convId": conv, "type": "text", "timestamp": 1740318651701,
         "role": "assistant", "content": "It is GDB's text user interface.",
         "parent": 1740318651641, "children": []},
        {"id": 1740318769492, "convId": conv, "type": "text", "timestamp": 1740318769492,
         "role": "assistant", "content": "A regenerated reply.", "parent": 1740318651641,
         "children": []}]
    source = tmp_path / f"conversation_{conv}.json"
    source.write_text(json.dumps({"conv": {"id": conv, "lastModified": 1740320776805,
                                           "currNode": 1740318651701, "name": "GDB"},
                                  "messages": messages}, indent=2))
    ids, _ = imported(capsys, source)
    active = [(m["role"], m["content"]) for m in exported(capsys, ids[0]) if m["iris"]["active"]]
    assert active == [("user", "What about `gdb -tui`?"),
                      ("assistant", "It is GDB's text user interface.")]


def test_llamacpps_jsonl_export_is_imported_not_refused(capsys, tmp_path):
    """The web UI's JSONL export (2026): a session line ``{"harness": "llama.app", "type":
    "session", ...conv}``, then ``{"message": {...}, "type": "message"}`` a line, keys in the
    order of the real files of ontouchstart/ontouchstart.github.io (for example
    llama.cpp/transcripts/2026/08/31/2026-08-31_11-26-26_conv_260146b8.jsonl; that repository
    gives no license, so only its shape is kept here, the texts are this test's). Before, it
    was read as an OpenAI message list: "line 1: unknown role None"."""
    conv = "260146b8-616d-46b3-96a9-148d70293fc0"

    def message(id_: str, parent: str | None, children: list[str], role: str, content: str,
                when: int, **more) -> dict:
        return {"message": {"children": children, "content": content, "convId": conv,
                            "role": role, "timestamp": when, "type": "root" if parent is None
                            else "text", "id": id_, "parent": parent, **more},
                "type": "message"}

    lines = [
        {"harness": "llama.app", "type": "session", "currNode": "a1", "id": conv,
         "lastModified": 1788175586856, "name": "Open Source in the Age of Automated Synthesis",
         "reasoningEffort": "default"},
        message("root", None, ["u1"], "system", "", 1788175586827),
        message("u1", "root", ["a1", "a2"], "user", "Open Source in the Age of Automated "
                "Synthesis", 1788175586833, extra=[]),
        message("a1", "u1", [], "assistant", "The intersection of open source and synthesis.",
                1788175586858, model="models/gemma-4-12B-it-Q8_0.gguf",
                reasoningContent="The user gives a title.", timings={"prompt_n": 107}),
        message("a2", "u1", [], "assistant", "A regenerated essay.", 1788175686858)]
    source = tmp_path / "2026-08-31_11-26-26_conv_260146b8_open_source_in_the_a.jsonl"
    source.write_text("\n".join(json.dumps(line) for line in lines))
    ids, err = imported(capsys, source)
    assert len(ids) == 1 and err == "iris-desktop: imported 1 chat from a llama.cpp web UI export\n"
    assert threads(capsys)[0]["title"] == "Open Source in the Age of Automated Synthesis"
    shown = [(m["role"], m["content"], m["iris"]["active"]) for m in exported(capsys, ids[0])]
    assert shown == [
        ("user", "Open Source in the Age of Automated Synthesis", True),
        ("assistant", "The intersection of open source and synthesis.", True),
        ("assistant", "A regenerated essay.", False)]
