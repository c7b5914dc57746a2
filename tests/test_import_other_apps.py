"""Other apps' chat files (an audit's F6, reproduced first). Before, each fell through to
the OpenAI message-list reader and was refused as "unknown role None; expected one of
system, user, assistant, tool" (or with a list of formats that left out llama.cpp's).
Now the two simple, common ones are imported (ShareGPT's conversations, JSON or JSONL;
SillyTavern's chat .jsonl, a reply's swipes its alternatives), and so are LibreChat's,
text-generation-webui's and BetterChatGPT's files (test_import_local_apps.py) and Google
Takeout's Gemini activity (test_import_gemini.py; it was refused by the app's name,
saying what Iris does import). Each file is written
in its app's shape; the real CLI in-process and the real SQLite store.
"""

from __future__ import annotations

import json
from datetime import datetime

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
#: BetterChatGPT's exports of March and April 2023: the chats alone (its ``isLegacyImport``)
BETTERCHATGPT_2023 = json.dumps([{"title": "New Chat", "messages": [
    {"role": "system", "content": "You are ChatGPT."}, {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "Hello!"}], "config": {"temperature": 1,
    "presence_penalty": 0}, "titleSet": False}])


@pytest.mark.parametrize("name,text,fmt,said", [
    # before: each refused by the app's name, "which Iris cannot import yet"
    ("librechat.json", LIBRECHAT, "a LibreChat export", [("user", "Hi"), ("assistant", "Hello")]),
    ("history.json", TEXTGEN, "a text-generation-webui chat history",
     [("assistant", "How can I help?"), ("user", "Hi"), ("assistant", "Hello!")]),
    ("BetterChatGPT.json", BETTERCHATGPT, "a BetterChatGPT export",
     [("user", "hi"), ("assistant", "yo")]),
    ("MyActivity.json", GEMINI, "a Google Takeout Gemini activity file",
     [("user", "hi"), ("assistant", "Hello")]),
    # before: "message index 0: unknown role None", the OpenAI-list reader's words
    ("export.json", BETTERCHATGPT_2023, "a BetterChatGPT export",
     [("system", "You are ChatGPT."), ("user", "hi"), ("assistant", "Hello!")]),
])
def test_librechat_text_generation_webui_and_betterchatgpt_files_are_imported(capsys, tmp_path, name,
                                                                             text, fmt, said):
    """(Their own tests: test_import_local_apps.py, test_import_gemini.py.)"""
    source = tmp_path / name
    source.write_text(text)
    ids, err = imported(capsys, source)
    assert len(ids) == 1 and err.splitlines()[0] == f"iris-desktop: imported 1 chat from {fmt}"
    assert err.count("\n") == (2 if "Gemini" in fmt else 1)  # (its chats made by time: said)
    assert [(m["role"], m["content"]) for m in exported(capsys, ids[0])] == said


def test_a_broken_openai_list_is_still_refused_in_its_own_words(capsys, tmp_path):
    source = tmp_path / "messages.json"
    source.write_text(json.dumps([{"role": "wizard", "content": "hi"}]))
    code, _, err = run(capsys, "import", source)
    assert code == 2 and one_sentence(err) and "unknown role 'wizard'" in err
    assert "looks like" not in err


def test_a_sillytavern_chat_is_imported_with_its_swipes_as_alternatives(capsys, tmp_path):
    """The header names the chat; the greeting's two swipes are alternatives (the one
    shown, ``swipe_id``, active); a message hidden from the prompt is left out, and said
    (before, without a word)."""
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
    assert len(ids) == 1 and err == ("iris-desktop: imported 1 chat from a SillyTavern chat\n"
                                     "iris-desktop: 1 message SillyTavern hid from the prompt "
                                     "was left out: Iris would send it to the model.\n")
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


def test_messages_sillytavern_hid_from_the_prompt_are_counted_in_the_sentence(capsys, tmp_path):
    """SillyTavern shows a message hidden from the prompt (``is_system``: one the user hid
    with its eye button, a /comment, a narrator's note) but never sends it. Iris has no
    message that is kept but not sent, so it leaves them out; before, without a word (the
    chat looked whole). Each chat's own are counted; one with no text is no loss."""
    lines = [json.loads(line) for line in SILLYTAVERN.splitlines()]
    hid = [{"name": "User", "is_user": True, "is_system": True, "mes": text, "extra": {}}
           for text in ("Forget I said that.", "Ignore this too.", "And this.", "  ")]
    (tmp_path / "chat.jsonl").write_text(
        "\n".join(json.dumps(line) for line in [*lines[:2], *hid, lines[2]]) + "\n")
    ids, err = imported(capsys, tmp_path / "chat.jsonl")
    assert err.splitlines() == [
        "iris-desktop: imported 1 chat from a SillyTavern chat",
        "iris-desktop: 3 messages SillyTavern hid from the prompt were left out: Iris would "
        "send them to the model."]
    assert [m["content"] for m in exported(capsys, ids[0]) if m["iris"]["active"]] == [
        "Greetings, traveller.", "Where am I?"]


def test_sillytaverns_newer_header_names_the_chat_by_its_reply_and_first_date(capsys, tmp_path):
    """SillyTavern's newer versions write a chat's header as ``{"chat_metadata": {…},
    "user_name": "unused", "character_name": "unused"}``, with no ``create_date``. A real
    one, Kepler-187/SillyTavern's data/default-user/chats/文心/文心 - 2026-07-12@14h02m11s121ms
    .jsonl, is in a repository that gives no license: only its shape is kept here (its
    keys and their order, ISO ``send_date``s, ``swipe_info``, ``force_avatar``, a reply
    left empty with only ``extra.reasoning``), the texts are this test's. Before, the chat
    was titled "unused", and a header of ``chat_metadata`` alone was not known at all."""
    greeting = "I am Wenxin, the game's writing assistant. What shall we write?"
    lines = [
        {"chat_metadata": {"integrity": "30749db8-7de0-4c90-9d47-69de1890b0e9",
                           "note_prompt": "", "tainted": True, "lastInContextMessageId": 1},
         "user_name": "unused", "character_name": "unused"},
        {"name": "Wenxin", "is_user": False, "is_system": False,
         "send_date": "2026-07-12T06:02:35.036Z", "mes": greeting, "extra": {},
         "swipes": [greeting], "swipe_id": 0,
         "swipe_info": [{"send_date": "2026-07-12T06:02:35.036Z", "extra": {}}]},
        {"name": "Kepler", "is_user": True, "is_system": False,
         "send_date": "2026-07-12T06:08:31.483Z", "mes": "Write two lines for Xiaoya.",
         "extra": {"isSmallSys": False, "reasoning": ""},
         "force_avatar": "/thumbnail?type=persona&file=user-default.png"},
        {"extra": {"api": "deepseek", "model": "deepseek-v4-pro", "reasoning": "We need to…"},
         "name": "Wenxin", "is_user": False, "send_date": "2026-07-12T06:08:31.917Z",
         "mes": "", "title": "", "swipes": [""], "swipe_id": 0},
        {"name": "Kepler", "is_user": True, "is_system": False,
         "send_date": "2026-07-12T06:11:23.771Z", "mes": "Please try again.", "extra": {}},
        {"extra": {"api": "deepseek"}, "name": "Wenxin", "is_user": False,
         "send_date": "2026-07-12T06:11:24.211Z", "mes": "“Don't go near the mist.”",
         "title": "", "swipes": ["“Don't go near the mist.”"], "swipe_id": 0}]
    source = tmp_path / "Wenxin - 2026-07-12@14h02m11s121ms.jsonl"
    source.write_text("\n".join(json.dumps(line, ensure_ascii=False) for line in lines))
    ids, err = imported(capsys, source)
    assert len(ids) == 1 and err == "iris-desktop: imported 1 chat from a SillyTavern chat\n"
    began = datetime.fromisoformat("2026-07-12T06:02:35+00:00").astimezone()
    assert threads(capsys)[0]["title"] == f"Wenxin ({began:%Y-%m-%d@%Hh%Mm%Ss})"
    messages = exported(capsys, ids[0])
    assert [(m["role"], m["content"]) for m in messages] == [
        ("assistant", greeting), ("user", "Write two lines for Xiaoya."),
        ("user", "Please try again."), ("assistant", "“Don't go near the mist.”")]
    assert datetime.fromisoformat(messages[0]["created_at"]) == began
    # the header alone, as a chat SillyTavern's server makes writes it: known too
    source.write_text("\n".join(json.dumps(line) for line in [{"chat_metadata": {}}, *lines[1:3]]))
    ids, err = imported(capsys, source, "--again")
    assert len(ids) == 1 and err == "iris-desktop: imported 1 chat from a SillyTavern chat\n"


def test_a_sharegpt_system_turn_after_the_first_message_is_kept_where_it_was(capsys, tmp_path):
    """A ShareGPT ``system`` turn after the first message: before, dropped without a word.
    Now kept in its place, as a system message (Iris sends a chat's later system messages
    where they are, and Qwen2.5's chat template, the bundled model's, shows them there); a
    second leading one too. The chat as the Iris before read it is known: importing the file
    again does not copy the chats it imported."""
    chats = [{"id": "s1", "conversations": [
        {"from": "system", "value": "You are terse."},
        {"from": "system", "value": "Answer in English."},
        {"from": "human", "value": "Capital of France?"}, {"from": "gpt", "value": "Paris."},
        {"from": "system", "value": "From now on, answer in French."},
        {"from": "human", "value": "And of Italy?"}, {"from": "gpt", "value": "Rome."}]}]
    source = tmp_path / "sharegpt.json"
    source.write_text(json.dumps(chats))
    then = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Capital of France?"},
            {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "And of Italy?"}, {"role": "assistant", "content": "Rome."}]
    (tmp_path / "then.json").write_text(json.dumps(then))  # (as that Iris stored it)
    imported(capsys, tmp_path / "then.json")
    code, out, err = run(capsys, "import", source)
    assert code == 0 and out == "" and "1 chat was imported before" in err, err
    ids, err = imported(capsys, source, "--again")
    assert err == "iris-desktop: imported 1 chat from a ShareGPT file\n"
    assert [(m["role"], m["content"]) for m in exported(capsys, ids[0])] == [
        ("system", "You are terse."), ("system", "Answer in English."),
        ("user", "Capital of France?"), ("assistant", "Paris."),
        ("system", "From now on, answer in French."),
        ("user", "And of Italy?"), ("assistant", "Rome.")]
