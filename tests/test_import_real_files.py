"""Other apps' real files (tests/fixtures/real/, each one's source in SOURCES.md there),
imported through the real CLI in-process into a real SQLite store. The formats' own tests
use files written after each app's documentation; these are files the apps (or their
projects) wrote, and each test here failed before the fix it names (but Jan's threads,
which a guard keeps imported as they are).
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


def test_chatgpts_picture_without_a_type_is_one_image_not_also_a_file(capsys):
    """A real ChatGPT conversation of June 2025 (aucontraire/echomine's golden master
    002_with_images/raw.json): the user's picture is an ``image_asset_pointer`` part and,
    in ``metadata.attachments``, an entry with its id, width and height but no
    ``mime_type``. Before, that entry was counted as a file besides the image: "1 image
    and 1 other file were left out", where the user had attached one picture."""
    ids, err = imported(capsys, REAL / "chatgpt" / "echomine-002_with_images.json")
    assert len(ids) == 1 and err == ("iris-desktop: imported 1 chat from a ChatGPT export\n"
                                     "iris-desktop: 1 image was left out: Iris imports text "
                                     "only.\n")
    messages = exported(capsys, ids[0])
    assert [(m["role"], m["content"][:30]) for m in messages] == [
        ("user", "Interpret this painting "),
        ("assistant", "This painting presents a surre"),
        ("user", "Could there also be erotic con"),
        ("assistant", "Yes — it’s quite plausible tha")]
    assert messages[0]["created_at"].startswith("2025-06-12T00:23:18")
    assert threads(capsys)[0]["title"] == "Interpretación pintura surrealista"


def test_chatgpts_older_citation_markers_become_the_cited_pages(capsys):
    """LibreChat's api/server/utils/import/__data__/chatgpt-export.json: two conversations
    of a ChatGPT export (January 2024, browsing with Bing, and October 2023); the first's
    replies cite as 2023 to 2024's ChatGPT did, ``【6†source】`` in the text and
    ``metadata.citations`` giving each marker's place and page. Before, the markers were
    kept (shown, and sent to the model); now each is the page's link, as LibreChat's own
    import writes it."""
    ids, err = imported(capsys, REAL / "chatgpt" / "librechat-chatgpt-export.json")
    assert len(ids) == 2 and err == (
        "iris-desktop: imported 2 chats from a ChatGPT export\n"
        "iris-desktop: 4 tool steps (web searches, code runs, image generation) were left "
        "out; the replies that used them are kept.\n")
    browsed = exported(capsys, ids[0])
    assert [m["role"] for m in browsed] == ["user", "assistant"] * 3
    assert not any("†" in m["content"] for m in browsed)
    drive = ("([Volkswagen Transporter Review - Drive](https://www.drive.com.au/reviews/"
             "volkswagen-transporter-review/))")
    assert browsed[1]["content"].endswith(
        "maintenance of the vehicle ([2021 Volkswagen Transporter T6.1 L2H1 2.0 TDI 110HP "
        "specs, dimensions](https://www.ultimatespecs.com/car-specs/Volkswagen/118424/"
        f"2021-Volkswagen-Transporter-T61-L2H1-20-TDI-110HP.html)) {drive}.")
    assert browsed[3]["content"].endswith(
        "due to the additional weight ([Volkswagen Transporter TDI340 2014 - Pricing & "
        "Specifications | carsales.com.au](https://www.carsales.com.au/volkswagen/"
        "transporter/price/2014/tdi340-381631/)).")
    assert [m["created_at"][:19] for m in browsed[::2]] == [
        "2024-01-07T12:18:35", "2024-01-07T12:19:21", "2024-01-07T12:20:26"]
    plain = exported(capsys, ids[1])
    assert plain[3]["content"].startswith("Certainly! Here's the same logic written in the C#")


def test_librechats_branched_export_is_imported(capsys):
    """LibreChat's api/server/utils/import/__data__/librechat-export.json: a conversation
    as LibreChat's export writes it with branches and ``recursive``, its messages as a
    tree under ``messagesTree`` (no ``messages``). Before, it got the refusal of a file
    nobody made, "not a conversation Iris knows", then (where LibreChat's files were
    refused by name) "which Iris cannot import yet"; now it is imported (its tree is one
    branch: three questions, three replies)."""
    ids, err = imported(capsys, REAL / "librechat" / "librechat-export.json")
    assert len(ids) == 1 and err == "iris-desktop: imported 1 chat from a LibreChat export\n"
    messages = exported(capsys, ids[0])
    assert [(m["role"], m["content"][:28]) for m in messages] == [
        ("user", "What is the fuel consumption"), ("assistant", "The fuel consumption of a Vo"),
        ("user", "What about 10 year old model"), ("assistant", "The fuel consumption of a 20"),
        ("user", "Is it for fully loaded    ca"), ("assistant", "The fuel consumption figures")]
    assert messages[0]["created_at"] == "2024-04-09T14:32:05+00:00"
    assert threads(capsys)[0]["title"] == "Conversation 1. Web Search"


def test_text_generation_webuis_2023_history_is_imported(capsys, tmp_path):
    """text-generation-webui kept a chat's history in early 2023 as ``{"data": [[asked,
    replied], …], "data_visible": […]}`` (``logs/persistent.json``, ``logs/<character>_
    persistent.json``; SillyTavern's importer still reads it so). A real one,
    Nat-Amato/-SaA-Vtuber-AI's text-generation-webui/logs/persistent.json (April 2023), is
    in a repository that gives no license: only its shape is kept here (its keys, an
    ``<audio>`` tag the TTS extension put in the visible copy), the texts are this
    test's. Before, it got "not a conversation Iris knows", then (where
    text-generation-webui's histories were refused by name) "which Iris cannot import
    yet"; now the model's copy (``data``) is imported, the visible one's markup not."""
    asked, replied = "What is the chemical formula of water?", "It is H2O."
    source = tmp_path / "persistent.json"
    source.write_text(json.dumps({
        "data": [["", ""], [asked, replied]],
        "data_visible": [["", ""], [asked, '<audio src="file/extensions/silero_tts/outputs/'
                                            'None_1680727413.wav" controls ></audio><br><br>'
                                            + replied]]}, indent=2))
    ids, err = imported(capsys, source)
    assert len(ids) == 1 and err == ("iris-desktop: imported 1 chat from a text-generation-webui "
                                     "chat history\n")
    assert [(m["role"], m["content"]) for m in exported(capsys, ids[0])] == [
        ("user", asked), ("assistant", replied)]


def test_open_webuis_export_naming_a_deleted_message_shows_its_conversation(capsys, tmp_path):
    """fractuscontext/openwebui-chat-repair's tests/bad-test-1.json: an Open WebUI export
    (March 2026, four exchanges with Grok) that its author broke as Open WebUI breaks
    chats that no longer open (open-webui issues 15189, 19225): ``currentId`` names a
    message that is not there, a ``childrenIds`` entry names one either, and a stray
    message's ``parentId`` names a missing one. Before, that stray message, the last one,
    was made the branch shown, and the whole conversation a hidden branch."""
    ids, err = imported(capsys, REAL / "openwebui" / "chat-repair-bad-test-1.json")
    assert len(ids) == 1 and err == "iris-desktop: imported 1 chat from an Open WebUI export\n"
    messages = exported(capsys, ids[0])
    shown = [(m["role"], m["content"][:16]) for m in messages if m["iris"]["active"]]
    assert shown == [("user", "test"), ("assistant", "Test received! 🚀"),
                     ("user", "hello"), ("assistant", "Hello! 👋 How's i"),
                     ("user", "bad"), ("assistant", "Aw, sorry to hea"),
                     ("user", "my friend told m"), ("assistant", "Haha, the classi")]
    stray = [m["content"] for m in messages if not m["iris"]["active"]]
    assert stray == ["This node is completely orphaned and should get pruned!"]
    assert not any("<details" in m["content"] for m in messages)
    # the same chat with its own system prompt: the stray message hangs from it too
    chats = json.loads((REAL / "openwebui" / "chat-repair-bad-test-1.json").read_text())
    chats[0]["chat"]["params"] = {"system": "Answer briefly."}
    (tmp_path / "chat-export.json").write_text(json.dumps(chats))
    ids, _ = imported(capsys, tmp_path / "chat-export.json", "--again")
    messages = exported(capsys, ids[0])
    assert [m["content"] for m in messages if not m["iris"]["active"]] == stray
    assert messages[0]["content"] == "Answer briefly." and messages[0]["iris"]["active"]


def test_jans_own_upgrade_fixture_threads_import_as_a_folder(capsys):
    """janhq/jan's src-tauri/tests/fixtures/upgrade/0.8.3/threads: two threads Jan 0.8.3
    wrote (its upgrade tests' fixture), each a folder of ``thread.json`` (the assistant's
    ``instructions``, ``created`` in seconds) and ``messages.jsonl`` (``created_at`` in
    milliseconds, ``content`` as OpenAI's text parts). A guard: the threads folder is
    imported whole, each thread with its title, its instructions as the system prompt,
    its messages in order and dated to the second."""
    ids, err = imported(capsys, REAL / "jan" / "threads")
    assert len(ids) == 2 and err == "iris-desktop: imported 2 chats from a Jan threads folder\n"
    instructions = json.loads((REAL / "jan" / "threads" / "784952d3-dc72-474e-ab24-0d78e7035280"
                               / "thread.json").read_text(encoding="utf-8"))
    instructions = instructions["assistants"][0]["instructions"]
    listed = {t["id"]: t for t in threads(capsys)}
    expected = {"784952d3": ("QA reply at 154646 to Summarize the following conversation into",
                             "QA thread 1 created on v0.8.3 - confirm mock roundtrip",
                             "15:46:46", 1789721206948, 1789721206977),
                "1fa772e9": ("QA reply at 154715 to Summarize the following conversation into",
                             "QA thread 2 on v0.8.3 - second data point",
                             "15:47:15", 1789721235436, 1789721235453)}
    seen = set()
    for thread_id in ids:
        messages = exported(capsys, thread_id)
        key = next(k for k, v in expected.items() if v[1] == messages[1]["content"])
        title, asked, said, asked_ms, said_ms = expected[key]
        seen.add(key)
        assert listed[thread_id]["title"] == title
        assert [m["role"] for m in messages] == ["system", "user", "assistant"]
        assert messages[0]["content"] == instructions  # (the assistant's instructions)
        assert messages[2]["content"] == f"QA reply at {said} to: {asked}"
        assert messages[2]["imported_from"] == "Jan"
        dated = [datetime.fromisoformat(m["created_at"]) for m in messages[1:]]
        assert dated == [datetime.fromtimestamp(ms // 1000, UTC) for ms in (asked_ms, said_ms)]
    assert seen == set(expected)
