"""One bad chat in another app's export no longer refuses the whole export (an audit's F5,
each case reproduced first): a chat that can be mended is (a lone half of a UTF-16
surrogate pair becomes U+FFFD, an emoji written in CESU-8 the emoji, a loop of parents is
cut where the shown branch closes it), one that cannot be read is skipped and named in
the import's one sentence, on the command line and in the window, and nothing of it is
stored; the others are imported. A file of one chat that cannot be read is refused as
before.

The real CLI in-process, the real window offscreen, real files and the real SQLite store.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from test_foreign_import import exported, imported, threads

from iris_desktop.core.conversation import ConversationFormatError
from iris_desktop.core.foreign import load_conversations

from support.helpers import one_sentence
from support.helpers import run_cli as run

EMOJI = "\U0001f389"  # 🎉, past U+FFFF: two UTF-16 halves


def node(key, parent, children, role, text, when=1.7e9):
    message = None if role is None else {
        "id": key, "author": {"role": role}, "create_time": when,
        "content": {"content_type": "text", "parts": [text]}}
    return {"id": key, "parent": parent, "children": children, "message": message}


def chatgpt(title: str, question: str = "Question?", answer: str = "Answer.") -> dict:
    """A ChatGPT export's conversation of one question and its answer under a hidden root."""
    return {"title": title, "create_time": 1.7e9, "current_node": "a", "mapping": {
        "r": node("r", None, ["u"], None, ""), "u": node("u", "r", ["a"], "user", question),
        "a": node("a", "u", [], "assistant", answer)}}


def openwebui(title: str, question: str, answer: str) -> dict:
    return {"id": title, "title": title, "chat": {"history": {"currentId": "a", "messages": {
        "u": {"id": "u", "parentId": None, "childrenIds": ["a"], "role": "user",
              "content": question, "timestamp": 1700000000},
        "a": {"id": "a", "parentId": "u", "childrenIds": [], "role": "assistant",
              "content": answer, "timestamp": 1700000001}}}}}


def unreadable(title: str) -> dict:
    """A conversation whose mapping holds a node that is not an object."""
    chat = chatgpt(title)
    chat["mapping"]["u"] = "not a node"
    return chat


def write(path: Path, value) -> Path:
    path.write_text(json.dumps(value, ensure_ascii=True))
    return path


def contents(capsys, thread: int) -> list[str]:
    return [m["content"] for m in exported(capsys, thread)]


def test_an_unreadable_chat_is_skipped_named_and_the_others_imported(capsys, tmp_path):
    """Before: "import refused, nothing was written: …: chat 3: node 'u' of its 'mapping'
    is not an object" (exit 2), for one chat of four. Now the three others are imported,
    the fourth is named, with why, in the one sentence; no thread holds any of it."""
    source = write(tmp_path / "conversations.json", [
        chatgpt("Soup"), chatgpt("Bread"), unreadable("Trip plans"), chatgpt("Tea")])
    ids, err = imported(capsys, source)
    assert len(ids) == 3
    assert err == ("iris-desktop: imported 3 chats from a ChatGPT export; skipped 1 (“Trip "
                   "plans”: node 'u' of its 'mapping' is not an object)\n")
    assert sorted(t["title"] for t in threads(capsys)) == ["Bread", "Soup", "Tea"]


def test_many_skipped_chats_are_named_three_and_counted(capsys, tmp_path):
    source = write(tmp_path / "conversations.json", [chatgpt("Kept")] + [
        unreadable(f"Broken {i}") for i in range(5)] + [None])
    ids, err = imported(capsys, source)
    assert len(ids) == 1 and one_sentence(err)
    assert err.startswith("iris-desktop: imported 1 chat from a ChatGPT export; skipped 6 "
                          "(“Broken 0”: node 'u' of its 'mapping' is not an object; “Broken 1”:")
    assert err.endswith("; and 3 more)\n")


def test_a_lone_surrogate_half_is_replaced_and_its_chat_imported(capsys, tmp_path):
    """Before: "chat 3 ('Surrogate chat'): message 1: holds \\ud83d, half of a UTF-16
    surrogate pair, which is not text; fix that escape in the file" refused all five
    chats. Now the halves are U+FFFD (a whole pair, escaped, is its emoji), said once."""
    chats = [openwebui(f"chat {i}", f"question {i}", f"answer {i}") for i in range(4)]
    chats.insert(2, openwebui("Surrogate \udfff chat", "bad \ud83d half, whole \ud83c\udf89",
                              "reply \udc00 too"))
    ids, err = imported(capsys, write(tmp_path / "owui.json", chats))
    assert len(ids) == 5
    assert err.splitlines() == [
        "iris-desktop: imported 5 chats from an Open WebUI export",
        "iris-desktop: 2 broken characters (half of an emoji's or other character's UTF-16 "
        "pair) were replaced with \ufffd."]
    mended = next(t for t in threads(capsys) if t["title"].startswith("Surrogate"))
    assert mended["title"] == "Surrogate \ufffd chat"
    assert contents(capsys, mended["id"]) == [f"bad \ufffd half, whole {EMOJI}",
                                              "reply \ufffd too"]


def cesu8(text: str) -> bytes:
    """``text`` in CESU-8: a character past U+FFFF as its two UTF-16 halves, 3 bytes each."""
    pairs = "".join(c if ord(c) < 0x10000 else
                    chr(0xD800 + ((ord(c) - 0x10000) >> 10)) + chr(0xDC00 + ((ord(c) - 0x10000) & 0x3FF))
                    for c in text)
    return pairs.encode("utf-8", "surrogatepass")


def test_an_emoji_in_cesu8_is_read_as_the_emoji(capsys, tmp_path):
    """Before: "not UTF-8 text (byte 515)" refused the whole export (a MySQL utf8mb3 or
    Java dump writes an emoji as two 3-byte halves). Now each pair is its emoji, in a
    file and in the zip archive an export comes in; other bytes are still refused."""
    chats = [openwebui(f"chat {i}", f"question {i}", f"answer {i}") for i in range(3)]
    chats.insert(1, openwebui("Emoji chat", f"party {EMOJI} time", f"yes {EMOJI}"))
    data = cesu8(json.dumps(chats, ensure_ascii=False))
    assert b"\xed\xa0\xbc\xed\xbe\x89" in data
    (tmp_path / "owui.json").write_bytes(data)
    ids, err = imported(capsys, tmp_path / "owui.json")
    assert len(ids) == 4 and err == "iris-desktop: imported 4 chats from an Open WebUI export\n"
    emoji = next(t["id"] for t in threads(capsys) if t["title"] == "Emoji chat")
    assert contents(capsys, emoji) == [f"party {EMOJI} time", f"yes {EMOJI}"]

    claude = [{"uuid": "c", "name": f"Zipped {EMOJI}", "chat_messages": [
        {"uuid": "m", "sender": "human", "text": f"hi {EMOJI}"}]}]
    with zipfile.ZipFile(tmp_path / "export.zip", "w") as archive:
        archive.writestr("conversations.json", cesu8(json.dumps(claude, ensure_ascii=False)))
    ids, err = imported(capsys, tmp_path / "export.zip")
    assert len(ids) == 1 and contents(capsys, ids[0]) == [f"hi {EMOJI}"]

    (tmp_path / "latin1.json").write_bytes(json.dumps(chats, ensure_ascii=False)
                                           .replace("party", "café").encode("latin-1", "replace"))
    code, _, err = run(capsys, "import", tmp_path / "latin1.json")
    assert code == 2 and one_sentence(err) and "not UTF-8 text" in err


def test_a_loop_of_parents_is_cut_where_the_shown_branch_closes_it(capsys, tmp_path):
    """Before: "chat 6: its messages' parents form a loop" refused all six chats. Now the
    loop is cut above the shown branch: its messages are kept, in order, and it is said."""
    looped = {"title": "Looped", "create_time": 1.7e9, "current_node": "b", "mapping": {
        "a": node("a", "b", ["b"], "user", "A question"),
        "b": node("b", "a", ["a"], "assistant", "An answer")}}
    source = write(tmp_path / "conversations.json", [chatgpt(f"chat {i}") for i in range(5)] + [looped])
    ids, err = imported(capsys, source)
    assert len(ids) == 6
    assert err.splitlines()[1:] == [
        "iris-desktop: 1 loop of messages that are each other's parents was cut where the "
        "shown branch closes it."]
    thread = next(t["id"] for t in threads(capsys) if t["title"] == "Looped")
    assert [(m["role"], m["content"]) for m in exported(capsys, thread)] == [
        ("user", "A question"), ("assistant", "An answer")]


def test_a_loop_beside_the_shown_branch_is_left_out_and_counted(capsys, tmp_path):
    """Messages only a loop reaches (not on the shown branch) are left out, counted; a
    message that is its own parent is a root (before: "message 'a' is its own parent")."""
    beside = {"title": "Beside", "current_node": "a", "mapping": {
        "r": node("r", None, ["u"], None, ""), "u": node("u", "r", ["a"], "user", "Q"),
        "a": node("a", "u", [], "assistant", "A"),
        "x": node("x", "y", ["y"], "assistant", "X"), "y": node("y", "x", ["x"], "user", "Y")}}
    own = {"title": "Own parent", "current_node": "a", "mapping": {
        "a": node("a", "a", ["a"], "user", "Alone")}}
    ids, err = imported(capsys, write(tmp_path / "conversations.json", [beside, own]))
    assert len(ids) == 2
    assert err.splitlines()[1:] == [
        "iris-desktop: 1 loop of messages that are each other's parents was cut where the "
        "shown branch closes it; 2 messages only a loop of parents reached were left out."]
    assert [m["content"] for m in exported(capsys, ids[0])] == ["Q", "A"]
    assert [m["content"] for m in exported(capsys, ids[1])] == ["Alone"]


def test_a_file_of_one_unreadable_chat_is_still_refused_in_one_sentence(capsys, tmp_path):
    code, _, err = run(capsys, "import", write(tmp_path / "one.json", [unreadable("Only")]))
    assert code == 2 and one_sentence(err)
    assert err.endswith("one.json: node 'u' of its 'mapping' is not an object\n")
    with pytest.raises(ConversationFormatError, match=r"chat 1: node 'u' of its 'mapping'"):
        load_conversations(write(tmp_path / "two.json", [unreadable("A"), unreadable("B")]))
    assert threads(capsys) == []


def test_the_window_says_which_chats_it_skipped(make_window, qtbot, tmp_path):
    """The window's import message is the same one sentence (File ▸ Import's path)."""
    pytest.importorskip("pytestqt")
    from support.windows import settle

    source = write(tmp_path / "conversations.json", [
        chatgpt("Soup"), unreadable("Trip plans"), chatgpt("Tea")])
    window = make_window()
    shown: list[str] = []
    window.app_state.statusMessage.connect(lambda text, _ms: shown.append(text))
    window.threads_control.import_file(str(source))
    qtbot.waitUntil(lambda: window.threads.list.count() == 2, timeout=20_000)
    settle(qtbot, window)
    qtbot.waitUntil(lambda: any(text.startswith("Imported 2 chats") for text in shown),
                    timeout=10_000)
    said = next(text for text in shown if text.startswith("Imported 2 chats"))
    assert said.startswith("Imported 2 chats from a ChatGPT export; skipped 1 (“Trip plans”: "
                           "node 'u' of its 'mapping' is not an object).")
    assert sorted(t["title"] for t in window.host.store.threads()) == ["Soup", "Tea"]


def test_an_iris_export_or_message_list_is_mended_as_another_apps_file_is(capsys, tmp_path):
    """Before: an OpenAI message list or an Iris export holding a lone surrogate escape
    was refused ("holds \\ud83d, half of a UTF-16 surrogate pair, which is not text; fix
    that escape in the file"), and one in CESU-8 too ("not UTF-8 text"): other apps'
    files were mended, Iris's own were not. Now both are read as other apps' files are,
    and the note says so; a clean file says nothing."""
    export = write(tmp_path / "iris.json", {
        "title": "Half \udfff title", "system_prompt": "be \ud83d brief",
        "messages": [{"role": "user", "content": "bad \ud83d half, whole \ud83c\udf89"},
                     {"role": "assistant", "content": "fine"}]})
    ids, err = imported(capsys, export)
    assert len(ids) == 1
    assert err == ("iris-desktop: 3 broken characters (half of an emoji's or other character's "
                   "UTF-16 pair) were replaced with \ufffd.\n")
    assert contents(capsys, ids[0]) == [f"bad \ufffd half, whole {EMOJI}", "fine"]
    listed = next(t for t in threads(capsys) if t["id"] == ids[0])
    assert listed["title"] == "Half \ufffd title"
    plain = tmp_path / "list.json"
    plain.write_bytes(cesu8(json.dumps([{"role": "user", "content": f"party {EMOJI}"}], ensure_ascii=False)))
    ids, err = imported(capsys, plain)
    assert err == "" and contents(capsys, ids[0]) == [f"party {EMOJI}"]
    again = write(tmp_path / "again.json", [{"role": "user", "content": "clean"}])
    ids, err = imported(capsys, again)
    assert len(ids) == 1 and err == ""
