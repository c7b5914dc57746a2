"""What an import of another app's chats keeps, counts and says (an audit's findings, each
reproduced first): the documents a reply wrote (Claude's artifacts, ChatGPT's canvas) stay
in the reply; a tool's call and result are one step; ChatGPT's citation markers are no
text; the notes of a second import count only the chats it stored; an import that fails
midway says what it stored; a chat titled by a pasted file is titled by its name; a chat
with two messages of one id is skipped alone.

The real CLI in-process, the real window offscreen, real files and the real SQLite store.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from test_foreign_import import exported, imported, threads

from iris_desktop.core.foreign import load_conversations

from support.helpers import run_cli as run

SENTINEL = "00000000-0000-4000-8000-000000000000"
FIB = "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"


def write(path: Path, value) -> Path:
    path.write_text(json.dumps(value))
    return path


# -- Claude -----------------------------------------------------------------------------------


def claude_message(uuid, sender, content, parent, **extra) -> dict:
    text = "\n\n".join(b["text"] for b in content if b.get("type") == "text")
    return {"uuid": uuid, "sender": sender, "text": text, "content": content,
            "created_at": "2025-03-01T10:00:00Z", "attachments": [], "files": [],
            "parent_message_uuid": parent, **extra}


def artifact(command: str, **given) -> dict:
    return {"type": "tool_use", "name": "artifacts",
            "input": {"id": "fib", "type": "application/vnd.ant.code", "language": "python",
                      "title": "fib.py", "command": command, **given}}


def claude_chat(uuid: str, name: str, messages: list[dict]) -> dict:
    return {"uuid": uuid, "name": name, "created_at": "2025-03-01T10:00:00Z",
            "updated_at": "2025-03-01T10:01:00Z", "chat_messages": messages}


def test_a_claude_artifact_stays_in_its_reply_and_an_update_applies_to_it(capsys, tmp_path):
    """Before: the code a reply wrote with Claude's ``artifacts`` tool was dropped (the
    reply said "Here is the function:" and nothing more) and counted as a "tool step",
    and so was each update of it. Now it is a titled fenced block where it was written;
    an update shows the whole new version; only the real tool (a web search, its call
    and its result) is counted, once."""
    result = {"type": "tool_result", "name": "artifacts", "content": [{"type": "text", "text": "OK"}]}
    chat = claude_chat("c1", "Fibonacci script", [
        claude_message("u1", "human", [{"type": "text", "text": "Write me a fibonacci function."}],
                       SENTINEL),
        claude_message("a1", "assistant", [
            {"type": "text", "text": "Here is the function:"}, artifact("create", content=FIB),
            result, {"type": "text", "text": "It runs in linear time."}], "u1"),
        claude_message("u2", "human", [{"type": "text", "text": "Name it fibonacci, and look up "
                                                                "who named the numbers."}], "a1"),
        claude_message("a2", "assistant", [
            {"type": "tool_use", "name": "web_search", "input": {"query": "fibonacci"}},
            {"type": "tool_result", "name": "web_search", "content": [{"type": "text", "text": "…"}]},
            artifact("update", old_str="def fib(n):", new_str="def fibonacci(n):"), result,
            artifact("update", old_str="not in the code", new_str="# a note"), result,
            {"type": "text", "text": "Renamed. Édouard Lucas named them."}], "u2"),
    ])
    ids, err = imported(capsys, write(tmp_path / "conversations.json", [chat]))
    assert err.splitlines() == [
        "iris-desktop: imported 1 chat from a Claude export",
        "iris-desktop: 1 tool step (web searches, code runs, image generation) was left out; "
        "the replies that used them are kept."]
    messages = exported(capsys, ids[0])
    assert messages[1]["content"] == (
        f"Here is the function:\n\n**fib.py**\n\n```python\n{FIB.rstrip()}\n```\n\n"
        "It runs in linear time.")
    assert messages[3]["content"] == (
        "**fib.py**\n\n```python\n" + FIB.rstrip().replace("def fib(", "def fibonacci(")
        + "\n```\n\n**fib.py, changed part**\n\n```python\n# a note\n```\n\n"
        "Renamed. Édouard Lucas named them.")


def test_updates_copy_a_large_artifact_only_up_to_a_bound(tmp_path, monkeypatch):
    """A chain of small updates to a large artifact would copy the whole of it into every
    reply (a hostile file of 10,000 one-line updates to a 1 MB document: 10 GB). Past a
    bound of text the updates added in one chat (MERGED_CHARS, here made small), each
    update shows its changed part alone; the versions are still followed."""
    from iris_desktop.core import foreign_parts

    monkeypatch.setattr(foreign_parts, "MERGED_CHARS", 10_000)
    body = "".join(f"line {i}\n" for i in range(400))  # 3,690 characters
    replies = [claude_message("a0", "assistant", [artifact("create", content=body)], "u")]
    for i in range(1, 6):
        replies.append(claude_message(f"a{i}", "assistant", [
            artifact("update", old_str=f"line {i}\n", new_str=f"LINE {i}\n")], f"a{i - 1}"))
    chat = claude_chat("c", "Lines", [
        claude_message("u", "human", [{"type": "text", "text": "Number the lines"}], SENTINEL),
        *replies])
    messages = load_conversations(write(tmp_path / "c.json", [chat])).chats[0].messages
    said = [m["content"] for m in messages[1:]]
    assert "LINE 1\nLINE 2\nline 3" in said[2]  # whole: within the bound
    assert said[4] == "**fib.py, changed part**\n\n```python\nLINE 4\n```"  # past it
    assert sum(map(len, said)) < 4 * len(body)


def test_a_chat_whose_first_message_is_a_pasted_file_is_titled_by_the_file_s_name(capsys, tmp_path):
    """Before: a Claude chat with no name whose first message was only a pasted file was
    titled '<file name="report.txt"> Q3 revenue…' (the model's markup). Now the typed
    text titles it, or, with none, the file's name."""
    pasted = claude_message("u", "human", [{"type": "text", "text": ""}], SENTINEL,
                            attachments=[{"file_name": "report.txt", "file_size": 30,
                                          "extracted_content": "Q3 revenue was 4.2M, up 10%."}])
    reply = claude_message("a", "assistant", [{"type": "text", "text": "Revenue grew 10%."}], "u")
    typed = {**pasted, "uuid": "u2", "text": "Summarize this",
             "content": [{"type": "text", "text": "Summarize this"}]}
    source = write(tmp_path / "conversations.json", [
        claude_chat("c1", "", [pasted, reply]),
        claude_chat("c2", "", [typed, {**reply, "uuid": "a2", "parent_message_uuid": "u2"}])])
    imported(capsys, source)
    assert sorted(t["title"] for t in threads(capsys)) == ["Summarize this", "report.txt"]


def test_one_chat_with_two_messages_of_one_id_is_skipped_alone(capsys, tmp_path):
    """Before: a chat whose message id repeats refused the whole file, saying "its
    messages' parents form a loop (message 'd' is its own parent)". Now that chat is
    skipped, said in a note naming the duplicate id, and the others are imported."""
    good = claude_chat("c1", "Good chat", [
        claude_message("u", "human", [{"type": "text", "text": "Hello"}], SENTINEL),
        claude_message("a", "assistant", [{"type": "text", "text": "Hi!"}], "u")])
    twice = claude_chat("c2", "Broken chat", [
        claude_message("d", "human", [{"type": "text", "text": "First"}], SENTINEL),
        claude_message("d", "assistant", [{"type": "text", "text": "Second"}], "d")])
    ids, err = imported(capsys, write(tmp_path / "conversations.json", [twice, good]))
    assert len(ids) == 1 and [t["title"] for t in threads(capsys)] == ["Good chat"]
    assert err.splitlines() == [
        "iris-desktop: imported 1 chat from a Claude export; skipped 1 (\u201cBroken chat\u201d: "
        "two of its messages have the same id ('d'))"]


# -- ChatGPT ----------------------------------------------------------------------------------


def gpt(key, role, parent, kids, content, when, recipient="all", **meta) -> dict:
    return {"id": key, "parent": parent, "children": kids, "message": {
        "id": key, "author": {"role": role, "name": None, "metadata": {}}, "create_time": when,
        "content": content, "status": "finished_successfully", "recipient": recipient,
        "metadata": meta}}


def chain(*nodes: tuple) -> dict:
    """A ChatGPT conversation's mapping of ``nodes`` (key, role, content, recipient, meta)
    in one line under an empty root."""
    keys = ["root", *(n[0] for n in nodes)]
    mapping = {"root": {"id": "root", "parent": None, "children": [keys[1]], "message": None}}
    for i, (key, role, content, recipient, meta) in enumerate(nodes, start=1):
        mapping[key] = gpt(key, role, keys[i - 1], keys[i + 1:i + 2], content, 1.7e9 + i,
                           recipient, **meta)
    return mapping


def text(*parts) -> dict:
    return {"content_type": "text", "parts": list(parts)}


def canvas_call(recipient: str, payload: dict) -> dict:
    return {"content_type": "code", "language": "json", "text": json.dumps(payload)}


ESSAY = "# Why cats purr\n\nCats purr for many reasons.\n\nThey purr when content."
MARK = "\ue200cite\ue202turn0search0\ue201"


def test_a_chatgpt_canvas_document_stays_in_the_reply_and_its_updates_apply(capsys, tmp_path):
    """Before: the essay ChatGPT wrote in a canvas (``canmore.create_textdoc``) was
    dropped, the chat keeping "I've written the essay in the canvas", and each call and
    its result were counted as two "tool steps". Now the document is a titled fenced
    block where it was written, an update (a plain-text pattern, or the whole document)
    shows the new version, and the web search (call and result) is one step."""
    mapping = chain(
        ("u1", "user", text("Write an essay on why cats purr in canvas"), "all", {}),
        ("c1", "assistant", canvas_call("canmore.create_textdoc",
                                        {"name": "why_cats_purr", "type": "document",
                                         "content": ESSAY}), "canmore.create_textdoc", {}),
        ("t1", "tool", text("Successfully created text document 'Why Cats Purr'"), "all", {}),
        ("a1", "assistant", text("I've written the essay in the canvas."), "all", {}),
        ("u2", "user", text("Say they purr when hurt too."), "all", {}),
        ("s2", "assistant", {"content_type": "code", "language": "unknown",
                             "text": "search('cats purr hurt')"}, "web", {}),
        ("r2", "tool", {"content_type": "tether_browsing_display", "result": "…"}, "all", {}),
        ("c2", "assistant", canvas_call("canmore.update_textdoc", {"updates": [
            {"pattern": r"They purr when content\.", "multiple": False,
             "replacement": "They purr when content, and when hurt."}]}),
         "canmore.update_textdoc", {}),
        ("t2", "tool", text("Successfully updated text document"), "all", {}),
        ("a2", "assistant", text(f"Updated: cats purr when hurt too.{MARK}"), "all",
         {"content_references": [{"matched_text": MARK, "items": [
             {"title": "Purring", "url": "https://en.wikipedia.org/wiki/Purr"}]}]}),
        ("u3", "user", text("Make it one line."), "all", {}),
        ("c3", "assistant", canvas_call("canmore.update_textdoc", {"updates": [
            {"pattern": ".*", "multiple": False, "replacement": "Cats purr."}]}),
         "canmore.update_textdoc", {}),
        ("a3", "assistant", text("Done."), "all", {}))
    source = write(tmp_path / "conversations.json",
                   [{"title": "Cat essay", "create_time": 1.7e9, "mapping": mapping,
                     "current_node": "a3"}])
    ids, err = imported(capsys, source)
    assert err.splitlines() == [
        "iris-desktop: imported 1 chat from a ChatGPT export",
        "iris-desktop: 1 tool step (web searches, code runs, image generation) was left out; "
        "the replies that used them are kept."]
    said = [(m["role"], m["content"]) for m in exported(capsys, ids[0])]
    assert said == [
        ("user", "Write an essay on why cats purr in canvas"),
        ("assistant", f"**why_cats_purr**\n\n```\n{ESSAY}\n```"),
        ("assistant", "I've written the essay in the canvas."),
        ("user", "Say they purr when hurt too."),
        ("assistant", "**why_cats_purr**\n\n```\n"
                      + ESSAY.replace("content.", "content, and when hurt.") + "\n```"),
        ("assistant", "Updated: cats purr when hurt too. (https://en.wikipedia.org/wiki/Purr)"),
        ("user", "Make it one line."),
        ("assistant", "**why_cats_purr**\n\n```\nCats purr.\n```"),
        ("assistant", "Done.")]


def test_chatgpt_citation_markers_are_not_kept_as_text(tmp_path):
    """Before: ChatGPT's web-search citations (private-use characters around
    "cite" and "turn0search0") stayed in the reply, shown and sent to the model. Now a
    citation becomes its reference's link text where the export has one, else goes; an
    entity marker becomes its name; the highlight marks go."""
    mark2 = "\ue200cite\ue202turn0search1\ue201"
    mapping = chain(
        ("u", "user", text("Cat breeds and where?"), "all", {}),
        ("a", "assistant", text(f"Siamese, Persian.{MARK} From \ue200entity\ue202"
                                f"[\"country\",\"Thailand\",\"\"]\ue201 {mark2}and "
                                "\ue203Iran\ue204\ue206."), "all",
         {"content_references": [{"matched_text": mark2, "alt": "([Britannica](https://b.com))"}]}))
    chat = load_conversations(write(tmp_path / "c.json", [{"title": "t", "mapping": mapping,
                                                             "current_node": "a"}])).chats[0]
    assert chat.messages[1]["content"] == (
        "Siamese, Persian. From Thailand ([Britannica](https://b.com))and Iran.")


def chatgpt_pair(key: str, question: str, images: int) -> dict:
    """A ChatGPT conversation: ``question`` with ``images`` pictures, and a reply."""
    pictures = [{"content_type": "image_asset_pointer", "asset_pointer": f"file-service://{i}"}
                for i in range(images)]
    mapping = chain((f"{key}u", "user", {"content_type": "multimodal_text",
                                         "parts": [*pictures, question]}, "all", {}),
                    (f"{key}a", "assistant", text(f"About {question}"), "all", {}))
    return {"title": question, "create_time": 1.7e9, "mapping": mapping, "current_node": f"{key}a"}


def test_a_second_import_counts_what_was_left_out_of_the_chats_it_stored_only(capsys, tmp_path):
    """Before: importing a newer export that holds the old chats too said "3 images were
    left out" while the one chat it stored had 1: the notes were tallied over the whole
    file. Now each chat is tallied alone, and the notes add up the stored ones."""
    old = chatgpt_pair("o", "The old one", images=2)
    imported(capsys, write(tmp_path / "first.json", [old]))
    ids, err = imported(capsys, write(tmp_path / "conversations.json",
                                      [old, chatgpt_pair("n", "The new one", images=1)]))
    assert len(ids) == 1 and err.splitlines()[0] == "iris-desktop: imported 1 chat from a ChatGPT export"
    assert err.splitlines()[2:] == ["iris-desktop: 1 image was left out: Iris imports text only."]


# -- an import that fails midway --------------------------------------------------------------


def many_chats(path: Path, count: int) -> Path:
    return write(path, [chatgpt_pair(f"k{i}", f"Question {i}", images=0) for i in range(count)])


def disk_full_at(monkeypatch, failing: int) -> None:
    """The database fails (the disk is full) when the ``failing``-th chat is written; a
    transaction holds at most 3 chats (a clock that advances 0.1 s a look)."""
    from iris_desktop.core import foreign

    ticks = iter(range(10**6))
    monkeypatch.setattr(foreign.time, "monotonic", lambda: next(ticks) * 0.1)
    real, calls = foreign.import_messages, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == failing:
            exc = sqlite3.OperationalError("database or disk is full")
            exc.sqlite_errorname = "SQLITE_FULL"
            raise exc
        return real(*args, **kwargs)

    monkeypatch.setattr(foreign, "import_messages", flaky)


def test_a_cli_import_that_fails_midway_prints_what_it_stored(capsys, tmp_path, monkeypatch):
    """Before: an import that failed at its 700th chat printed only the database's error,
    no id, while 699 chats were stored, and the user could not tell what was there. Now
    the stored chats' ids are printed, and the sentence says how many were stored before
    it failed and that importing the same file again adds only the rest (it does)."""
    source = many_chats(tmp_path / "conversations.json", 12)
    with monkeypatch.context() as patch:
        disk_full_at(patch, 8)
        code, out, err = run(capsys, "import", source)
    stored = [int(line) for line in out.split()]
    assert code != 0 and len(stored) == len(threads(capsys)) and 0 < len(stored) < 8
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"iris-desktop: {len(stored)} chats were stored before the import "
                          "failed: the disk holding ")
    assert err.endswith("is full; nothing more was written; free some space, then try again "
                        "(importing the same file again adds only the rest)\n")
    rest, err = imported(capsys, source)
    assert len(rest) == 12 - len(stored) and len(threads(capsys)) == 12
    assert f"{len(stored)} chats were imported before" in err


def test_a_window_import_that_fails_midway_says_what_it_stored_and_lists_it(
        make_window, qtbot, tmp_path, monkeypatch):
    """Before: the window said "Nothing was imported" while chats were stored, and the
    chat list did not show them until a restart. Now it says how many were stored before
    the import failed, and they are in the list."""
    pytest.importorskip("pytestqt")
    from iris_desktop.ui import import_control

    from support.windows import settle

    source = many_chats(tmp_path / "conversations.json", 12)
    warned: list[str] = []
    monkeypatch.setattr(import_control, "warn", lambda parent, title, text: warned.append(text))
    window = make_window()
    shown: list[str] = []
    window.app_state.statusMessage.connect(lambda text, _ms: shown.append(text))
    disk_full_at(monkeypatch, 8)
    window.threads_control.import_file(str(source))
    qtbot.waitUntil(lambda: bool(warned), timeout=20_000)
    settle(qtbot, window)
    stored = len(window.host.store.threads())
    assert 0 < stored < 8
    qtbot.waitUntil(lambda: window.threads.list.count() == stored, timeout=10_000)
    assert warned[0].startswith(f"{stored} chats were stored before the import failed: the "
                                "disk holding ")
    assert "Nothing was imported" not in warned[0] and "adds only the rest" in warned[0]
    assert shown[-1] == (f"Importing conversations.json failed after storing {stored} chats; "
                         "they are in the chat list.")


# -- chats an earlier Iris imported -----------------------------------------------------------


def stored_by_earlier_iris(chats: dict[str, list[tuple[str, str, object]]]) -> list[int]:
    """Threads as the Iris before documents were kept stored its import of an export
    (``title: [(role, content, source time)]``, the messages as its reader gave them:
    documents and a reply that only wrote one left out, ChatGPT's markers kept)."""
    from iris_desktop.core.conversation import import_messages
    from iris_desktop.core.store import Store, iso_timestamp
    from iris_desktop.paths import app_paths

    path = app_paths().db_path
    path.parent.mkdir(parents=True, exist_ok=True)
    with Store(path) as store:
        return [import_messages(store, [{"role": role, "content": content,
                                         "created_at": iso_timestamp(when)}
                                        for role, content, when in messages], title)
                for title, messages in chats.items()]


def gpt_chat(title: str, current: str, *nodes: tuple) -> dict:
    return {"title": title, "create_time": 1.7e9, "mapping": chain(*nodes), "current_node": current}


def test_chats_an_earlier_iris_imported_are_known_when_a_newer_export_is_imported(capsys, tmp_path):
    """Before: the readers now keep a Claude artifact and a ChatGPT canvas document in the
    reply (a reply that only wrote one is a message of its own) and drop ChatGPT's
    citation markers, so a chat the earlier Iris had imported (without the documents,
    with the markers) was no longer "the same messages": importing a newer export, the
    usual way to pick up new chats, stored every such chat a second time. Now a chat is
    also known by its messages as that Iris read them; a chat that differs is still
    imported, and a chat stored by this Iris is known as before."""
    claude_time, when = "2025-03-01T10:00:00Z", lambda i: 1.7e9 + i
    first = stored_by_earlier_iris({
        "Fibonacci": [("user", "Write fib.", claude_time), ("assistant", "Here it is:", claude_time),
                      ("user", "Start at one.", claude_time)],
        "Cat essay": [("user", "Write an essay on why cats purr in canvas", when(1)),
                      ("assistant", "I've written the essay in the canvas.", when(4))],
        "Cat origins": [("user", "Where do cats come from?", when(1)),
                        ("assistant", f"From the Near East.{MARK}", when(2))]})
    (tmp_path / "claude").mkdir()
    claude = write(tmp_path / "claude" / "conversations.json", [
        claude_chat("c1", "Fibonacci", [
            claude_message("u1", "human", [{"type": "text", "text": "Write fib."}], SENTINEL),
            claude_message("a1", "assistant", [{"type": "text", "text": "Here it is:"},
                                               artifact("create", content=FIB)], "u1"),
            claude_message("u2", "human", [{"type": "text", "text": "Start at one."}], "a1"),
            claude_message("a2", "assistant", [artifact("update", old_str="0, 1", new_str="1, 1")],
                           "u2")]),  # a reply that only updated the artifact
        claude_chat("c2", "Plain", [
            claude_message("u", "human", [{"type": "text", "text": "Hi."}], SENTINEL),
            claude_message("a", "assistant", [{"type": "text", "text": "Hello!"}], "u")])])
    (tmp_path / "gpt").mkdir()
    cited = {"content_references": [{"matched_text": MARK, "items": [{"url": "https://c.org"}]}]}
    chatgpt = write(tmp_path / "gpt" / "conversations.json", [
        gpt_chat("Cat essay", "a1",
                 ("u1", "user", text("Write an essay on why cats purr in canvas"), "all", {}),
                 ("c1", "assistant", canvas_call("canmore.create_textdoc", {
                     "name": "why_cats_purr", "type": "document", "content": ESSAY}),
                  "canmore.create_textdoc", {}),
                 ("t1", "tool", text("Successfully created text document"), "all", {}),
                 ("a1", "assistant", text("I've written the essay in the canvas."), "all", {})),
        gpt_chat("Cat origins", "a", ("u", "user", text("Where do cats come from?"), "all", {}),
                 ("a", "assistant", text(f"From the Near East.{MARK}"), "all", cited)),
        gpt_chat("Cat origins", "a", ("u", "user", text("Where do cats come from?"), "all", {}),
                 ("a", "assistant", text(f"From Egypt.{MARK}"), "all", cited))])  # another chat
    ids, err = imported(capsys, claude)
    assert len(ids) == 1 and err.splitlines()[:2] == [
        "iris-desktop: imported 1 chat from a Claude export",
        f"iris-desktop: 1 chat was imported before (thread {first[0]}) and was not imported "
        "again; --again imports them anyway"]
    more, err = imported(capsys, chatgpt)
    assert len(more) == 1 and err.splitlines()[:2] == [
        "iris-desktop: imported 1 chat from a ChatGPT export",
        f"iris-desktop: 2 chats were imported before (thread {first[1]}, {first[2]}) and were "
        "not imported again; --again imports them anyway"]
    assert [m["content"] for m in exported(capsys, more[0])][1] == "From Egypt. (https://c.org)"
    assert len(threads(capsys)) == 5
    code, out, err = run(capsys, "import", chatgpt)  # once more: each known, either form
    assert code == 0 and out == "" and err.startswith("iris-desktop: 3 chats were imported before")
    assert len(threads(capsys)) == 5
