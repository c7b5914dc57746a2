"""Other apps' chat files (an audit's F6, reproduced first). Before, each fell through to
the OpenAI message-list reader and was refused as "unknown role None; expected one of
system, user, assistant, tool" (or with a list of formats that left out llama.cpp's).
Now the two simple, common ones are imported (ShareGPT's conversations, JSON or JSONL;
SillyTavern's chat .jsonl, a reply's swipes its alternatives), and the others are refused
by the app's name, saying what Iris does import; nothing is written. Each file is written
in its app's shape; the real CLI in-process and the real SQLite store.
"""

from __future__ import annotations

import json

import pytest
from test_foreign_import import exported, imported, shape, threads

from support.helpers import one_sentence
from support.helpers import run_cli as run

SILLYTAVERN = "\n".join(json.dumps(line) for line in [
    {"user_name": "User", "character_name": "Seraphina", "create_date": "2024-5-1@12h00m00s",
     "chat_metadata": {"note_prompt": ""}},
    {"name": "Seraphina", "is_user": False, "is_system": False, "send_date": "May 1, 2024 12:00pm",
     "mes": "Greetings, traveller.", "extra": {}, "swipe_id": 0,
     "swipes": ["Greetings, traveller.", "Hello there."]},
    {"name": "User", "is_user": True, "is_system": False, "send_date": "May 1, 2024 12:01pm",
     "mes": "Where am I?", "extra": {}}]) + "\n"
SHAREGPT = json.dumps([{"id": "QWJhYvA_0", "conversations": [
    {"from": "human", "value": "Summarize the plot of Hamlet."},
    {"from": "gpt", "value": "A prince avenges his father."}]}])
LIBRECHAT = json.dumps({"conversationId": "c1", "title": "LibreChat chat", "endpoint": "openAI",
                        "recursive": True, "messages": [
    {"messageId": "a", "parentMessageId": "00000000-0000-0000-0000-000000000000",
     "sender": "User", "text": "Hi", "isCreatedByUser": True},
    {"messageId": "b", "parentMessageId": "a", "sender": "GPT-4", "text": "Hello",
     "isCreatedByUser": False}]})
GEMINI = json.dumps([{"header": "Gemini Apps", "title": "Prompted hi",
                      "time": "2025-01-01T00:00:00.000Z", "products": ["Gemini Apps"],
                      "safeHtmlItem": [{"html": "<p>Hello</p>"}]}])
TEXTGEN = json.dumps({"internal": [["<|BEGIN-VISIBLE-CHAT|>", "How can I help?"], ["Hi", "Hello!"]],
                      "visible": [["", "How can I help?"], ["Hi", "Hello!"]],
                      "metadata": {"assistant_0": {"timestamp": "May 1, 2024 12:00"}}})
BETTERCHATGPT = json.dumps({"chats": [{"id": "x", "title": "T", "messages": [
    {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], "config": {}}],
    "folders": {}, "version": 1})


@pytest.mark.parametrize("name,text,app", [
    ("librechat.json", LIBRECHAT, "a LibreChat conversation export"),
    ("MyActivity.json", GEMINI, "Google Takeout's My Activity file for Gemini"),
    ("history.json", TEXTGEN, "a text-generation-webui (oobabooga) chat history"),
    ("BetterChatGPT.json", BETTERCHATGPT, "a BetterChatGPT export"),
])
def test_another_apps_file_is_refused_by_its_name(capsys, tmp_path, name, text, app):
    source = tmp_path / name
    source.write_text(text)
    code, out, err = run(capsys, "import", source)
    assert code == 2 and out == "" and one_sentence(err)
    assert err == (f"iris-desktop: import refused, nothing was written: {source}: this looks "
                   f"like {app}, which Iris cannot import yet; it imports OpenAI message lists "
                   "(JSON or JSONL), its own exports, ChatGPT's and Claude's exports "
                   "(conversations.json, its folder or the .zip), Open WebUI's chat export, LM "
                   "Studio's .conversation.json files, Jan's threads, llama.cpp's web UI "
                   "exports, ShareGPT files and SillyTavern chats\n")
    assert threads(capsys) == []


def test_a_broken_openai_list_is_still_refused_in_its_own_words(capsys, tmp_path):
    source = tmp_path / "messages.json"
    source.write_text(json.dumps([{"role": "wizard", "content": "hi"}]))
    code, _, err = run(capsys, "import", source)
    assert code == 2 and one_sentence(err) and "unknown role 'wizard'" in err
    assert "looks like" not in err


def test_a_sillytavern_chat_is_imported_with_its_swipes_as_alternatives(capsys, tmp_path):
    """The header names the chat; the greeting's two swipes are alternatives (the one
    shown, ``swipe_id``, active); a message hidden from the prompt is left out."""
    hidden = {"name": "System", "is_user": False, "is_system": True, "send_date": "May 1, 2024 12:01pm",
              "mes": "[OOC: the narrator's note]", "extra": {"type": "narrator"}}
    reply = {"name": "Seraphina", "is_user": False, "is_system": False,
             "send_date": "2024-05-01T12:02:00.000Z", "mes": "In the glade.", "extra": {}}
    lines = [json.loads(line) for line in SILLYTAVERN.splitlines()] + [hidden, reply]
    lines[1]["swipe_id"] = 1
    lines[1]["mes"] = "Hello there."
    source = tmp_path / "Seraphina - 2024-5-1@12h00m00s.jsonl"
    source.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    ids, err = imported(capsys, source)
    assert len(ids) == 1 and err == "iris-desktop: imported 1 chat from a SillyTavern chat\n"
    assert threads(capsys)[0]["title"] == "Seraphina (2024-5-1@12h00m00s)"
    assert shape(exported(capsys, ids[0])) == [
        ("assistant", "Greetings, traveller.", None, False),
        ("assistant", "Hello there.", None, True),
        ("user", "Where am I?", 1, True),
        ("assistant", "In the glade.", 2, True)]


def test_sharegpt_conversations_are_imported_one_chat_each(capsys, tmp_path):
    """A list of conversations, and the same as JSONL (one a line, as data sets ship):
    ``human``/``gpt`` turns, a leading ``system`` the chat's system prompt, a tool's turn
    a tool step."""
    chats = json.loads(SHAREGPT) + [{"id": "x1", "conversations": [
        {"from": "system", "value": "You are terse."},
        {"from": "human", "value": "Weather in Oslo?"},
        {"from": "function_call", "value": '{"name": "weather", "arguments": {"city": "Oslo"}}'},
        {"from": "observation", "value": '{"temp": 3}'},
        {"from": "gpt", "value": "3 degrees."}]}]
    (tmp_path / "sharegpt.json").write_text(json.dumps(chats))
    ids, err = imported(capsys, tmp_path / "sharegpt.json")
    assert len(ids) == 2 and err.splitlines() == [
        "iris-desktop: imported 2 chats from a ShareGPT file",
        "iris-desktop: 2 tool steps (web searches, code runs, image generation) were left "
        "out; the replies that used them are kept."]
    assert [(m["role"], m["content"]) for m in exported(capsys, ids[1])] == [
        ("system", "You are terse."), ("user", "Weather in Oslo?"), ("assistant", "3 degrees.")]
    assert exported(capsys, ids[0])[1]["imported_from"] == "ShareGPT"
    (tmp_path / "sharegpt.jsonl").write_text("\n".join(json.dumps(c) for c in chats) + "\n")
    code, out, err = run(capsys, "import", tmp_path / "sharegpt.jsonl", "--again")
    assert code == 0 and len(out.split()) == 2
    assert err.startswith("iris-desktop: imported 2 chats from a ShareGPT file\n")


def test_a_sharegpt_list_of_items_chats_is_imported(capsys, tmp_path):
    """Review: ShareGPT's `items` spelling imported as one object or JSONL, but a JSON list
    of such chats was refused in the OpenAI reader's words ("unknown role None")."""
    source = tmp_path / "sharegpt.json"
    source.write_text(json.dumps([
        {"id": "q1", "items": [{"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"}]},
        {"id": "q2", "items": [{"from": "human", "value": "3+3?"}, {"from": "gpt", "value": "6"}]}],
        indent=2))
    ids, err = imported(capsys, source)
    assert len(ids) == 2 and "imported 2 chats from a ShareGPT file" in err


def test_a_broken_character_in_a_sillytavern_header_is_mended(capsys, tmp_path):
    """Review: half of a UTF-16 pair in the header's date reached the title unmended and
    the import ended with "unexpected error (UnicodeEncodeError …); this is a bug"."""
    header, *lines = SILLYTAVERN.splitlines()
    header = header.replace('"2024-5-1@12h00m00s"', '"2024-5-1 \\ud83d"')
    source = tmp_path / "chat.jsonl"
    source.write_text("\n".join([header, *lines]) + "\n")
    ids, _ = imported(capsys, source)
    assert len(ids) == 1
    assert [t["title"] for t in threads(capsys)] == ["Seraphina (2024-5-1 \ufffd)"]
