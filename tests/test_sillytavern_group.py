"""A SillyTavern group chat: several characters answer the user. Before, every
character's reply was imported as the one assistant's, unmarked: who said what was lost,
and the chat was titled by the first character alone. Now each reply of a group chat
starts with its character's name, ``**Alice:** ``, the import's sentence says so, and
the chat is titled by its characters; a chat with one character is imported exactly as
before. Each file is written in SillyTavern's shape (its ``public/scripts/group-chats.js``
saves a group chat as its messages alone, the first SillyTavern's own "Group chat
created" notice, ``is_group`` on it; its versions of 2025 and later write a header
first, its names "unused"); the real CLI in-process and the real SQLite store."""

from __future__ import annotations

import json

from test_foreign_import import exported, imported, shape, threads

from iris_desktop.core.foreign import load_conversations

from support.helpers import run_cli as run

NOTICE = {"name": "SillyTavern System", "force_avatar": "img/five.png", "is_user": False,
          "is_system": True, "is_group": True, "send_date": "May 1, 2024 12:00pm",
          "mes": "Group chat created. Say 'Hi' to lovely people!",
          "extra": {"type": "group", "isSmallSys": True}}


def said(name: str, text: str, minute: int, **more) -> dict:
    user = name == "Ana"
    line = {"name": name, "is_user": user, "is_system": False,
            "send_date": f"May 1, 2024 12:{minute:02d}pm", "mes": text, "extra": {}}
    if not user:
        line.update(original_avatar=f"{name}.png", force_avatar=f"/thumbnail?file={name}.png")
    line.update(more)
    return line


GROUP = [NOTICE,
         said("Seraphina", "Greetings, traveller.", 1),
         said("Kael", "*nods* Welcome to the glade.", 1),
         said("Ana", "Where am I?", 2),
         said("Seraphina", "In the forest.", 3, swipe_id=1,
              swipes=["In the glade.", "In the forest."]),
         said("Kael", "Safe, for now.", 4),
         said("Mira", "<think>be brief</think>Hello!", 5)]
SENTENCE = "iris-desktop: 3 characters' replies start with their names (“**Name:**”): Iris has one assistant.\n"


def write(path, lines) -> None:
    path.write_text("\n".join(json.dumps(line) for line in lines))


def test_each_reply_of_a_group_chat_is_marked_with_its_character(capsys, tmp_path):
    source = tmp_path / "2024-5-1@12h00m00s.jsonl"
    write(source, GROUP)
    ids, err = imported(capsys, source)
    # (SillyTavern's "Group chat created" notice is no message: not counted as hidden)
    assert len(ids) == 1 and err == "iris-desktop: imported 1 chat from a SillyTavern chat\n" + SENTENCE
    assert threads(capsys)[0]["title"] == "Seraphina, Kael and Mira (2024-05-01@12h00m00s)"
    assert shape(exported(capsys, ids[0])) == [
        ("assistant", "**Seraphina:** Greetings, traveller.", None, True),
        ("assistant", "**Kael:** *nods* Welcome to the glade.", 0, True),
        ("user", "Where am I?", 1, True),
        ("assistant", "**Seraphina:** In the glade.", 2, False),  # a swipe: its name too
        ("assistant", "**Seraphina:** In the forest.", 2, True),
        ("assistant", "**Kael:** Safe, for now.", 4, True),
        ("assistant", "**Mira:** Hello!", 5, True)]
    code, out, err = run(capsys, "import", source)  # the same file again: known
    assert code == 0 and "1 chat was imported before" in err


def test_a_group_chat_imported_unmarked_before_is_known(capsys, tmp_path):
    """The Iris before this stored a group chat unmarked: the chat read now is known by
    its messages as they were then (``before``), so importing it again adds no copy."""
    source = tmp_path / "group.jsonl"
    write(source, GROUP)
    chat = load_conversations(source).chats[0]
    assert [m["content"] for m in chat.before if m.get("iris", {}).get("active", True)][:3] == [
        "Greetings, traveller.", "*nods* Welcome to the glade.", "Where am I?"]
    assert [m["content"] for m in chat.messages][:2] == [
        "**Seraphina:** Greetings, traveller.", "**Kael:** *nods* Welcome to the glade."]


def test_a_newer_group_chat_with_a_header_is_marked_too(capsys, tmp_path):
    header = {"chat_metadata": {"integrity": "x"}, "user_name": "unused", "character_name": "unused"}
    source = tmp_path / "group.jsonl"
    write(source, [header, *GROUP[1:4]])
    ids, err = imported(capsys, source)
    assert err == ("iris-desktop: imported 1 chat from a SillyTavern chat\niris-desktop: 2 "
                   "characters' replies start with their names (“**Name:**”): Iris has one assistant.\n")
    assert threads(capsys)[0]["title"] == "Seraphina and Kael (2024-05-01@12h01m00s)"
    assert [m["content"] for m in exported(capsys, ids[0])] == [
        "**Seraphina:** Greetings, traveller.", "**Kael:** *nods* Welcome to the glade.",
        "Where am I?"]


def test_a_chat_with_one_character_is_imported_as_before(capsys, tmp_path):
    """No name is added, nothing more is said; the narrator (``/sys``) is no character."""
    header = {"user_name": "Ana", "character_name": "Seraphina", "create_date": "2024-5-1@12h00m00s",
              "chat_metadata": {}}
    narrator = said("System", "The sun sets.", 3, extra={"type": "narrator"})
    source = tmp_path / "Seraphina - 2024-5-1@12h00m00s.jsonl"
    write(source, [header, GROUP[1], GROUP[3], narrator, said("Seraphina", "Rest here.", 4)])
    ids, err = imported(capsys, source)
    assert err == "iris-desktop: imported 1 chat from a SillyTavern chat\n"
    assert threads(capsys)[0]["title"] == "Seraphina (2024-5-1@12h00m00s)"
    assert [m["content"] for m in exported(capsys, ids[0])] == [
        "Greetings, traveller.", "Where am I?", "The sun sets.", "Rest here."]
    assert load_conversations(source).chats[0].before is None
