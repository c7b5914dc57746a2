"""Importing other apps' histories (``core/foreign.py``) through the real CLI and the GUI's
File ▸ Import: ChatGPT's conversations.json, Open WebUI's export, LM Studio's conversation
files and Jan's threads, each from the files in ``tests/fixtures/foreign`` (where they come
from: SOURCES.md there). Each chat becomes a thread with its message tree as branches, the
branch the app showed active; what Iris leaves out is said in one sentence each; a shape
Iris does not know is refused in one sentence and nothing is written."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from iris_desktop.core.conversation import ConversationFormatError
from iris_desktop.core.foreign import CHATGPT, JAN, LM_STUDIO, OPEN_WEBUI, load_conversations

from conftest import AGENT_FILES, FIXTURES
from support.helpers import one_sentence
from support.helpers import run_cli as run

FOREIGN = FIXTURES / "foreign"
CHATGPT_TREE = FOREIGN / "chatgpt" / "librechat-chatgpt-tree.json"
CHATGPT_MODERN = FOREIGN / "chatgpt" / "librechat-chatgpt-modern-export.json"
CLAUDE = FOREIGN / "claude" / "conversations.json"
CHATGPT_TOOLS = FOREIGN / "chatgpt" / "chatgpt-exporter-image-generation.json"
OPEN_WEBUI_LIBRECHAT = FOREIGN / "openwebui" / "librechat-openwebui-export.json"
OPEN_WEBUI_APP = FOREIGN / "openwebui" / "mobileapp-openwebui-chats.json"
LM_STUDIO_FILE = FOREIGN / "lmstudio" / "1746009600000.conversation.json"
JAN_THREADS = FOREIGN / "jan" / "threads"


def imported(capsys, source: Path, *extra: str) -> tuple[list[int], str]:
    """Import through the CLI: (the new threads' ids, what it said on stderr)."""
    code, out, err = run(capsys, "import", source, *extra)
    assert code == 0, err
    return [int(line) for line in out.split()], err


def exported(capsys, thread: int) -> list[dict]:
    """The thread's full export, as a list of messages (every branch)."""
    code, out, err = run(capsys, "export", thread)
    assert code == 0, err
    doc = json.loads(out)
    return doc["messages"] if isinstance(doc, dict) else doc


def threads(capsys) -> list[dict]:
    return json.loads(run(capsys, "threads", "--json", "--no-model")[1])


def context_messages(capsys, thread: int) -> list[dict]:
    """What the engine would send next (the active branch), via ``context --json``."""
    code, out, err = run(capsys, "context", thread, "--json", "--no-model")
    assert code == 0, err
    return json.loads(out)["messages"]


def shape(messages: list[dict]) -> list[tuple]:
    """(role, content, parent's index or None, active) for a branched export."""
    index = {m["iris"]["id"]: i for i, m in enumerate(messages)}
    return [(m["role"], m["content"], index.get(m["iris"]["parent_id"]), m["iris"]["active"])
            for m in messages]


# -- ChatGPT --------------------------------------------------------------------------------


def test_chatgpt_tree_becomes_branches_with_the_current_node_active(capsys):
    ids, err = imported(capsys, CHATGPT_TREE)
    assert len(ids) == 1
    assert err == "iris-desktop: imported 1 chat from a ChatGPT export\n"
    assert threads(capsys)[0]["title"] == "Assist user with summary"
    messages = exported(capsys, ids[0])
    story = "Sure! Here's a short story for you:\n\n---\n\nOnce upon a time, in a small village " \
            "nestled between rolling"
    joke = "Sure, here's one for you:\n\nWhy don't scientists trust atoms?\n\nBecause they " \
           "make up everything!"
    # the hidden system node is skipped; "hi there" is the root; two branches fork after
    # the first reply, the second of them forks again at the last reply (regenerated)
    assert shape(messages) == [
        ("user", "hi there", None, True),
        ("assistant", "Hello! How can I assist you today?", 0, True),
        ("user", "so cool bro", 1, False),
        ("assistant", "Thanks! What brings you here today?", 2, False),
        ("user", "tell me a story", 3, False),
        ("assistant", story, 4, False),  # cut off in ChatGPT ("in_progress"): kept as it is
        ("user", "hi again", 1, True),
        ("assistant", "Hey! Welcome back. What's on your mind?", 6, True),
        ("user", "tell me a joke", 7, True),
        ("assistant", joke, 8, False),
        ("assistant", joke, 8, True),  # current_node
    ]
    assert messages[0]["created_at"].startswith("2024-05-01")  # create_time kept
    sent = context_messages(capsys, ids[0])
    assert len(sent) == 6 and [m["role"] for m in sent] == ["user", "assistant"] * 3
    # delete counts what it removes, every branch, as `threads` does (it said 6 of 11)
    assert threads(capsys)[0]["messages"] == 11
    code, _, err = run(capsys, "delete", ids[0])
    assert code == 2 and "(11 messages) without --yes" in err


def test_chatgpt_export_of_several_chats_skips_the_empty_one(capsys):
    ids, err = imported(capsys, CHATGPT_MODERN)
    assert len(ids) == 2
    assert err.splitlines() == ["iris-desktop: imported 2 chats from a ChatGPT export",
                                "iris-desktop: 1 chat with no text message was skipped."]
    rows = {t["id"]: t for t in threads(capsys)}
    assert rows[ids[0]]["title"] == "Deploying the staging cluster" and rows[ids[0]]["messages"] == 4
    assert rows[ids[1]]["title"] == "Weeknight pasta" and rows[ids[1]]["messages"] == 2
    first = exported(capsys, ids[0])  # one branch: a plain list, the hidden context node gone
    assert [m["content"] for m in first] == [
        "How do I roll back the deploy?", "Run `helm rollback staging`.",
        "And if that fails?", "Restore from the last known-good chart."]
    assert all("iris" not in m for m in first)
    assert len(context_messages(capsys, ids[1])) == 2


def test_chatgpt_images_and_tool_steps_are_left_out_with_a_note(capsys):
    """A chatgpt-exporter capture (one conversation object, not a list): images, tool
    messages, code sent to a tool, reasoning recaps and hidden nodes leave only the text
    the user typed (its replies were empty in the capture). A call and the result that
    answers it are one step (they were counted as two: 6)."""
    ids, err = imported(capsys, CHATGPT_TOOLS)
    assert err.splitlines() == [
        "iris-desktop: imported 1 chat from a ChatGPT export",
        "iris-desktop: 1 image was left out: Iris imports text only.",
        "iris-desktop: 5 tool steps (web searches, code runs, image generation) were left "
        "out; the replies that used them are kept."]
    assert [(m["role"], m["content"]) for m in exported(capsys, ids[0])] == [
        ("user", f"question {n}") for n in range(1, 5)]
    assert len(context_messages(capsys, ids[0])) == 4


# -- Open WebUI -----------------------------------------------------------------------------


def test_open_webui_export_of_three_chats(capsys):
    ids, err = imported(capsys, OPEN_WEBUI_LIBRECHAT)
    assert len(ids) == 3
    assert err.splitlines() == [
        "iris-desktop: imported 3 chats from an Open WebUI export",
        "iris-desktop: 1 tool step (web searches, code runs, image generation) was left "
        "out; the replies that used them are kept."]
    assert [t["title"] for t in sorted(threads(capsys), key=lambda t: t["id"])] == [
        "Chat with reasoning", "Chat with tool call", "Simple linear chat"]
    # the reasoning and the tool call shown as <details> are not part of the reply
    assert [m["content"] for m in exported(capsys, ids[0])] == ["What is 15 * 17?", "255"]
    assert [m["content"] for m in exported(capsys, ids[1])] == [
        "What's the weather in Paris?", "The weather in Paris is 18C with rain."]
    assert exported(capsys, ids[2])[1]["created_at"].startswith("2023-11-14")
    for thread in ids:
        assert len(context_messages(capsys, thread)) == 2


def test_open_webui_history_tree_and_system_prompt(capsys):
    ids, err = imported(capsys, OPEN_WEBUI_APP)
    assert len(ids) == 2 and err.startswith("iris-desktop: imported 2 chats from an Open WebUI")
    robot = exported(capsys, ids[0])
    assert [m["role"] for m in robot] == ["system", "user", "assistant"]
    assert robot[0]["content"] == "You talk like a robot from Star Wars."  # chat.params.system
    code, out, _ = run(capsys, "context", ids[0], "--json", "--no-model")
    assert code == 0 and json.loads(out)["messages"][0]["role"] == "system"
    tree = exported(capsys, ids[1])
    assert shape(tree) == [
        ("user", "test demande1", None, True),
        ("assistant", "test reponse1", 0, True),
        ("user", "test demande2", 1, True),
        ("assistant", "test reponse2", 2, False),
        ("user", "test demande3", 3, False),
        ("assistant", "test reponse3", 2, True),  # history.currentId
    ]
    assert [m["role"] for m in context_messages(capsys, ids[1])] == [
        "user", "assistant", "user", "assistant"]


# -- LM Studio ------------------------------------------------------------------------------


def test_lm_studio_versions_become_branches(capsys):
    ids, err = imported(capsys, LM_STUDIO_FILE)
    assert err.splitlines() == [
        "iris-desktop: imported 1 chat from an LM Studio conversation",
        "iris-desktop: 1 image was left out: Iris imports text only.",
        "iris-desktop: 1 tool step (web searches, code runs, image generation) was left "
        "out; the replies that used them are kept."]
    assert threads(capsys)[0]["title"] == "Borrow checker basics"
    tree = shape(exported(capsys, ids[0]))
    assert [(role, parent, active) for role, _, parent, active in tree] == [
        ("system", None, True),      # systemPrompt
        ("user", 0, True),
        ("assistant", 1, False),     # the first version of the reply
        ("assistant", 1, True),      # currentlySelected: 1
        ("user", 3, False),          # the question before it was edited
        ("user", 3, True),           # the edited question (its picture left out)
        ("assistant", 5, True),
    ]
    assert tree[3][1].startswith("It checks at compile time")  # no thinking block
    assert tree[6][1].startswith("Let me check the compiler's wording.\n\n```rust")
    assert len(context_messages(capsys, ids[0])) == 5


# -- Jan ------------------------------------------------------------------------------------


def test_jan_threads_folder_imports_every_thread(capsys):
    ids, err = imported(capsys, JAN_THREADS)
    assert len(ids) == 2
    assert err.splitlines() == ["iris-desktop: imported 2 chats from a Jan threads folder",
                                "iris-desktop: 1 image was left out: Iris imports text only."]
    documented, seeded = (exported(capsys, thread) for thread in ids)  # oldest first
    assert [(m["role"], m["content"]) for m in documented] == [
        ("system", "Explain things simply."),
        ("user", "How does AI work? Explain it in simple terms."),
        ("assistant", "AI learns patterns from many examples, then uses those patterns to "
                      "make a good guess about new inputs."),
        ("user", "Hello, what is in this picture?"),
        ("assistant", "I cannot see an image here; could you describe it?"),  # no <think>
    ]
    assert [(m["role"], m["content"]) for m in seeded] == [("user", "hey")]
    assert seeded[0]["created_at"].startswith("2024-08-1")  # "created" in milliseconds
    sent = context_messages(capsys, ids[0])
    assert len(sent) == 5 and sent[0]["role"] == "system"  # the thread's own system prompt
    assert len(context_messages(capsys, ids[1])) == 1


@pytest.mark.parametrize("name", ["thread.json", "messages.jsonl", ""])
def test_jan_thread_from_either_file_or_its_folder(capsys, name):
    folder = JAN_THREADS / "jan_1699016383"
    ids, err = imported(capsys, folder / name if name else folder)
    assert len(ids) == 1 and err.startswith("iris-desktop: imported 1 chat from a Jan thread\n")
    assert threads(capsys)[0]["title"] == "How does AI work?"
    assert len(exported(capsys, ids[0])) == 5


# -- the loader on its own, refusals, the transaction -----------------------------------------


def test_loader_names_the_formats():
    assert load_conversations(CHATGPT_TREE).format == CHATGPT
    assert load_conversations(OPEN_WEBUI_APP).format == OPEN_WEBUI
    assert load_conversations(LM_STUDIO_FILE).format == LM_STUDIO
    assert load_conversations(JAN_THREADS / "jan_1723493088").format == JAN
    fmt, chats = load_conversations(AGENT_FILES[0])  # a (format, chats) pair
    assert fmt == "OpenAI message list" and len(chats) == 1


def test_native_files_import_as_before(capsys):
    code, out, err = run(capsys, "import", AGENT_FILES[0])
    assert code == 0 and err == "" and out.strip().isdigit()


@pytest.mark.parametrize("content,fragment", [
    ('{"conversations": [{"name": "x"}]}', "not a conversation Iris knows"),
    ('{"object": "list", "data": []}', "not a conversation Iris knows"),
    ('[{"title": "t", "mapping": [1, 2]}]', "its 'mapping' must be an object"),
    ('[{"title": "t", "mapping": {"a": {"parent": null, "children": [], '
     '"message": {"author": {"role": "system"}, "content": {"parts": ["x"]}}}}}]',
     "holds no chat with a text message"),
    ('{"name": "x", "messages": [{"versions": []}]}', "message 1 has no versions"),
    ('[{"chat": {"history": {"messages": {"a": 5}}}}]', "message 'a' is not an object"),
])
def test_unknown_or_broken_shapes_are_refused_in_one_sentence(capsys, tmp_path, content, fragment):
    source = tmp_path / "export.json"
    source.write_text(content)
    code, out, err = run(capsys, "import", source)
    assert code == 2 and one_sentence(err) and fragment in err and "nothing was written" in err
    assert out == "" and threads(capsys) == []


def test_a_folder_without_threads_is_refused(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    code, _, err = run(capsys, "import", tmp_path / "empty")
    assert code == 2 and one_sentence(err) and "is a folder; give a file" in err


def test_a_loop_in_one_chat_is_cut_and_every_chat_imported(capsys, tmp_path):
    """A loop in the last chat's tree no longer refuses the whole file: the loop is cut
    where the shown branch closes it, said in one note, and all three chats are written."""
    chats = json.loads(CHATGPT_MODERN.read_text())
    looped = json.loads(json.dumps(chats[2]))
    looped["title"] = "Loop"
    looped["mapping"]["user-3"]["parent"] = "assistant-3"
    source = tmp_path / "conversations.json"
    source.write_text(json.dumps([chats[0], chats[2], looped]))
    code, _, err = run(capsys, "import", source)
    assert code == 0, err
    assert "1 loop of messages that are each other's parents was cut where the shown branch closes it" in err
    assert len(threads(capsys)) == 3


def test_title_names_one_chat_and_prefixes_several(capsys):
    imported(capsys, CHATGPT_TREE, "--title", "Old ChatGPT")
    imported(capsys, CHATGPT_MODERN, "--title", "Archive")
    assert sorted(t["title"] for t in threads(capsys)) == [
        "Archive: Deploying the staging cluster", "Archive: Weeknight pasta", "Old ChatGPT"]


def test_unreadable_parts_raise_only_the_format_error(tmp_path):
    """Wrong value kinds deep in a file that looks like an export are one sentence, not a
    crash."""
    source = tmp_path / "conversations.json"
    source.write_text('[{"title": 5, "mapping": {"a": {"parent": 7, "children": "x", '
                      '"message": {"author": "me", "content": {"parts": [null, 3, "hi"]}}}}}]')
    with pytest.raises(ConversationFormatError, match="holds no chat with a text message"):
        load_conversations(source)


# -- the GUI ----------------------------------------------------------------------------------


def test_gui_file_import_uses_the_same_loader(qtbot, tmp_path, monkeypatch):
    pytest.importorskip("pytestqt")
    from iris_desktop.core import foreign
    from iris_desktop.host import Host
    from iris_desktop.ui import thread_control
    from iris_desktop.ui.main_window import main_window

    from support.fakes import ScriptedRuntime

    loaded: list[str] = []
    real = foreign.load_conversations
    monkeypatch.setattr(foreign, "load_conversations",
                        lambda path, progress=None: loaded.append(str(path)) or real(path, progress))
    monkeypatch.setattr(thread_control.QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a, **k: (str(OPEN_WEBUI_LIBRECHAT), "")))
    host = Host(tmp_path / "data", runtime=ScriptedRuntime([]), compact=False)
    window = main_window(host)
    qtbot.addWidget(window)
    try:
        qtbot.waitUntil(lambda: window.model_state == "ready", timeout=10_000)
        shown: list[str] = []
        window.app_state.statusMessage.connect(lambda text, _ms: shown.append(text))
        window.menus.actions["import"].trigger()  # File ▸ Import conversation…
        qtbot.waitUntil(lambda: window.threads.list.count() == 3 and window.thread_id is not None
                        and len(window.view.transcript.entries()) == 2, timeout=10_000)
        assert loaded == [str(OPEN_WEBUI_LIBRECHAT)]
        assert any(text.startswith("Imported 3 chats from an Open WebUI export.")
                   and "1 tool step" in text for text in shown)
        # the same file again: nothing added, said by title (the app shows no ids), one opened
        ids = sorted(t["id"] for t in host.store.threads())
        window.open_thread(ids[-1])
        window.menus.actions["import"].trigger()
        qtbot.waitUntil(lambda: any("were imported before (“" in text for text in shown), timeout=10_000)
        assert window.threads.list.count() == 3 and len(loaded) == 2
        listed_first = host.store.newest_thread_id(ids)  # (the file's first chat, before)
        qtbot.waitUntil(lambda: window.thread_id == listed_first, timeout=10_000)
    finally:
        window.shutdown()
        host.close()


# -- hostile and unlucky files (an audit's findings, each reproduced first) --------------------


def owu(*messages, **chat) -> list[dict]:
    """An Open WebUI export of one chat whose history is ``messages`` in a line."""
    history = {}
    for i, (role, content) in enumerate(messages):
        history[f"m{i}"] = {"id": f"m{i}", "parentId": f"m{i - 1}" if i else None,
                            "childrenIds": [f"m{i + 1}"] if i + 1 < len(messages) else [],
                            "role": role, "content": content, **chat.pop(f"m{i}", {})}
    return [{"title": "t", "chat": {"history": {"currentId": f"m{len(messages) - 1}",
                                                "messages": history}, **chat}}]


def test_thousands_of_unclosed_reasoning_tags_import_in_one_pass(tmp_path):
    """``<think>`` × 200,000 (1.4 MB) hung the import (a backtracking regex: 48 s at 40,000);
    an unclosed block is kept as text, a closed one cut, Open WebUI's ``<details>`` too."""
    source = tmp_path / "owu.json"
    source.write_text(json.dumps(owu(("user", "hi"), ("assistant", "<think>" * 200_000))))
    assert load_conversations(source).chats[0].messages[1]["content"] == "<think>" * 200_000
    details = '<details type="reasoning">' * 40_000 + "<details " * 40_000
    source.write_text(json.dumps(owu(("user", "hi"), ("assistant", details + " Answer."))))
    assert load_conversations(source).chats[0].messages[1]["content"] == details + " Answer."
    source.write_text(json.dumps(owu(("user", "hi"), (
        "assistant", '<think>plan</think>\n<details type="tool_calls" done="true">call</details> '
                     '<details><summary>kept</summary>x</details> Done. <think>unclosed'))))
    loaded = load_conversations(source)
    assert loaded.chats[0].messages[1]["content"] == \
        "<details><summary>kept</summary>x</details> Done. <think>unclosed"
    assert any("1 tool step" in note for note in loaded.notes)


def test_a_byte_order_mark_is_read_and_utf16_too(capsys, tmp_path):
    source = tmp_path / "bom.json"
    source.write_bytes(b"\xef\xbb\xbf" + CHATGPT_TREE.read_bytes())
    assert load_conversations(source).format == CHATGPT
    source.write_bytes(b"\xef\xbb\xbf" + b'[{"role": "user", "content": "hi"}]')
    assert load_conversations(source).chats[0].messages == [{"role": "user", "content": "hi"}]
    source.write_bytes('[{"role": "user", "content": "hi 🌿"}]'.encode("utf-16"))  # PowerShell's ">"
    assert load_conversations(source).chats[0].messages == [{"role": "user", "content": "hi 🌿"}]
    source.write_bytes(b"\xff\xfe" + '[{"role": "user"'.encode("utf-16-le") + b"\x00")
    code, _, err = run(capsys, "import", source)
    assert code == 2 and one_sentence(err) and "not UTF-16 text, though it starts as UTF-16 does" in err


def test_a_syntax_error_in_a_pretty_printed_file_is_placed_where_it_is(tmp_path):
    pretty = json.dumps(json.loads(LM_STUDIO_FILE.read_text()), indent=2).splitlines()
    source = tmp_path / "broken.json"
    source.write_text("\n".join(pretty[:3] + [pretty[3].rstrip(",")] + pretty[4:]))
    with pytest.raises(ConversationFormatError, match=r"invalid JSON at line 5, column \d+: "
                                                      r"Expecting ',' delimiter"):
        load_conversations(source)
    source.write_text("\n".join(pretty[:40]))
    with pytest.raises(ConversationFormatError, match=r"the file ends early \(line 40\)"):
        load_conversations(source)


def test_an_unreadable_folder_is_named(monkeypatch, tmp_path):
    """Path.is_file raises for a folder one may not look into (tests run as root, where
    chmod 000 does not bite: the refusal is simulated where the OS would raise it)."""
    threads_dir = tmp_path / "threads"
    for name in ("a", "locked"):
        (threads_dir / name).mkdir(parents=True)
    real = Path.is_file

    def is_file(self):
        if self.parent.name == "locked":
            raise PermissionError(13, "Permission denied")
        return real(self)

    monkeypatch.setattr(Path, "is_file", is_file)
    with pytest.raises(ConversationFormatError, match=r"locked: cannot read it \(Permission denied\)"):
        load_conversations(threads_dir)
    with pytest.raises(ConversationFormatError, match=r"locked: cannot read it \(Permission denied\)"):
        load_conversations(threads_dir / "locked")


def test_broken_trees_and_stray_items_are_named(tmp_path):
    """A file that is not what it looks like is refused by name; a chat whose message is
    its own parent is read with that message as a root; a stray item beside good chats is
    skipped and named, the good ones imported."""
    source = tmp_path / "export.json"
    source.write_text(json.dumps(owu(("user", "hi")) + [{"title": "x", "mapping": 5, "current_node": "a"}]))
    with pytest.raises(ConversationFormatError, match="chat 1: it is an Open WebUI chat, not a ChatGPT conversation"):
        load_conversations(source)
    source.write_text(json.dumps([{"title": "T", "current_node": "a", "mapping": {"a": {
        "parent": "a", "children": [], "message": {"author": {"role": "user"},
                                                   "content": {"content_type": "text", "parts": ["hi"]}}}}}]))
    assert [[m["content"] for m in chat.messages] for chat in load_conversations(source).chats] == [["hi"]]
    source.write_text(json.dumps(json.loads(CHATGPT_TREE.read_text()) + [None]))
    loaded = load_conversations(source)
    assert len(loaded.chats) == 1
    assert loaded.report()[0].endswith("; skipped 1 (chat 2: a conversation must be a JSON object)")


def test_stray_metadata_duplicate_ids_and_system_only_chats(tmp_path):
    """Attachment metadata of an odd kind does not refuse the file; an older export whose
    message ids repeat keeps every message in its order; a chat that is only a system
    prompt is skipped and counted, as an empty one is; "an Open WebUI export"."""
    source = tmp_path / "owu.json"
    chats = owu(("user", "hi"), ("assistant", "hello"), m0={"files": True})
    chats += [{"title": "old", "chat": {"messages": [
        {"id": "x", "role": "user", "content": "one"}, {"id": "x", "role": "assistant", "content": "two"},
        {"id": "x", "role": "user", "content": "three"}]}}]
    chats += [{"title": "New Chat", "chat": {"params": {"system": "You are a pirate."},
                                             "history": {"currentId": None, "messages": {}}}}]
    source.write_text(json.dumps(chats))
    loaded = load_conversations(source)
    assert [[m["content"] for m in chat.messages] for chat in loaded.chats] == [
        ["hi", "hello"], ["one", "two", "three"]]
    assert loaded.report() == ["imported 2 chats from an Open WebUI export",
                               "1 chat with no text message was skipped."]


def test_a_chatgpt_export_is_known_past_its_first_64_kib(tmp_path):
    chats = json.loads(CHATGPT_TREE.read_text())
    chats[0]["title"] = "T" * 70_000
    source = tmp_path / "conversations.json"
    source.write_text(json.dumps(chats))
    assert load_conversations(source).format == CHATGPT


def test_jan_one_line_messages_and_an_unreadable_thread_json(capsys, tmp_path):
    """A messages.jsonl of one line is a Jan thread (it read as an Iris message); a
    thread.json that cannot be read is said, not silently dropped with the title and
    instructions it held; a number too long to read is named as such."""
    folder = tmp_path / "jan_1"
    folder.mkdir()
    first = (JAN_THREADS / "jan_1699016383" / "messages.jsonl").read_text().splitlines()[0]
    (folder / "messages.jsonl").write_text(first + "\n")
    (folder / "thread.json").write_text('{"object": "thread", "title": "My title"')  # cut short
    loaded = load_conversations(folder / "messages.jsonl")
    assert loaded.format == JAN and [m["role"] for m in loaded.chats[0].messages] == ["user"]
    assert loaded.notes == [f"{folder / 'thread.json'}: not valid JSON: the thread's title and "
                            "instructions were left out."]
    ids, err = imported(capsys, folder)
    assert len(ids) == 1 and "the thread's title and instructions were left out" in err
    (folder / "messages.jsonl").write_text(first + "\n" + '{"role": "user", "n": ' + "9" * 5000 + "}\n")
    with pytest.raises(ConversationFormatError, match="line 2: a number has more than"):
        load_conversations(folder)


@pytest.mark.skipif(os.name == "nt", reason="symlinks need privileges on Windows")
def test_jan_links_that_lead_out_of_the_folder_are_not_followed(tmp_path):
    """Before: a Jan threads folder with a link to another folder (or a thread's
    messages.jsonl linked to a file elsewhere) imported whatever the link led to. Links
    inside the folder are followed; links out of it are named in a note, not read."""
    threads_dir = tmp_path / "threads"
    shutil.copytree(JAN_THREADS, threads_dir)
    private = tmp_path / "elsewhere"
    shutil.copytree(JAN_THREADS / "jan_1699016383", private)
    (private / "messages.jsonl").write_text(
        '{"role": "user", "content": [{"type": "text", "text": {"value": "my secret"}}]}\n')
    (threads_dir / "jan_9999999999").symlink_to(private, target_is_directory=True)
    inner = threads_dir / "jan_1699016383"
    (threads_dir / "jan_1700000000").symlink_to(inner, target_is_directory=True)  # inside
    loaded = load_conversations(threads_dir)
    texts = [m["content"] for chat in loaded.chats for m in chat.messages]
    assert "my secret" not in " ".join(texts) and len(loaded.chats) == 3  # 2 + the inside link
    assert loaded.notes[0] == "1 link to places outside threads was not followed: jan_9999999999."
    (inner / "messages.jsonl").unlink()
    (inner / "messages.jsonl").symlink_to(private / "messages.jsonl")
    with pytest.raises(ConversationFormatError) as refused:  # its only messages are elsewhere
        load_conversations(inner)
    assert str(refused.value) == (f"{inner}: the Jan thread holds no chat with a text message (1 "
                                  "link to places outside jan_1699016383 was not followed: "
                                  "messages.jsonl)")


def test_a_reply_and_a_second_message_after_the_same_one_both_stay_reachable(capsys, tmp_path):
    """ChatGPT's tree put a reply and a second user message after the same question: the
    second branch was stored but no switch could reach it (Iris's alternatives are of one
    role). It becomes an alternative of the question holding both texts; first messages
    of different roles keep the active one's and say how many were left out."""
    def node(key, role, text, parent, children):
        return {"id": key, "parent": parent, "children": children, "message": {
            "id": key, "author": {"role": role}, "content": {"content_type": "text", "parts": [text]}}}

    source = tmp_path / "conversations.json"
    source.write_text(json.dumps([{"title": "mixed", "current_node": "a", "mapping": {
        "u": node("u", "user", "question", None, ["a", "u2"]),
        "a": node("a", "assistant", "answer", "u", []),
        "u2": node("u2", "user", "more", "u", ["a2"]),
        "a2": node("a2", "assistant", "second answer", "u2", [])}}]))
    ids, err = imported(capsys, source)
    assert err == "iris-desktop: imported 1 chat from a ChatGPT export\n"
    assert shape(exported(capsys, ids[0])) == [
        ("user", "question", None, True), ("assistant", "answer", 0, True),
        ("user", "question\n\nmore", None, False), ("assistant", "second answer", 2, False)]
    first = context_messages(capsys, ids[0])[0]["id"]
    code, out, _ = run(capsys, "switch", ids[0], first, "next")
    assert code == 0 and "question more" in out and "second answer" in out

    source.write_text(json.dumps([{"title": "roots", "chat": {"history": {
        "currentId": "b", "messages": {
            "a": {"id": "a", "parentId": None, "childrenIds": [], "role": "assistant", "content": "Hello"},
            "b": {"id": "b", "parentId": None, "childrenIds": [], "role": "user", "content": "hi"}}}}}]))
    loaded = load_conversations(source)
    assert [m["content"] for m in loaded.chats[0].messages] == ["hi"]
    assert loaded.notes == ["1 message on branches that start with a different role than the active one "
                            "was left out: Iris shows alternatives of one role side by side."]


def test_an_imported_title_is_one_line_of_at_most_200_characters(capsys, tmp_path):
    chats = json.loads(CHATGPT_TREE.read_text())
    chats[0]["title"] = "Long\n\ttitle " + "x" * 60_000
    source = tmp_path / "conversations.json"
    source.write_text(json.dumps(chats))
    imported(capsys, source)
    title = threads(capsys)[0]["title"]
    assert len(title) == 200 and title.startswith("Long title xxx") and title.endswith("…")


def test_the_same_export_imported_again_is_said_not_stored_twice(capsys, tmp_path):
    """Importing a newer ChatGPT export that holds the old chats too made a second copy of
    every one of them; a chat whose messages a thread already holds is said and skipped
    (the new ones are imported), and --again imports it anyway."""
    first, _ = imported(capsys, CHATGPT_MODERN)
    chats = json.loads(CHATGPT_MODERN.read_text())
    newer = json.loads(json.dumps(chats[2]))
    newer["title"] = "Another dinner"
    newer["mapping"]["user-3"]["message"]["content"]["parts"] = ["Something with lentils?"]
    source = tmp_path / "conversations.json"
    source.write_text(json.dumps([*chats, newer]))
    again, err = imported(capsys, source)
    assert len(again) == 1 and err.splitlines() == [
        "iris-desktop: imported 1 chat from a ChatGPT export",
        f"iris-desktop: 2 chats were imported before (thread {first[0]}, {first[1]}) and were not "
        "imported again; --again imports them anyway",
        "iris-desktop: 1 chat with no text message was skipped."]
    assert len(threads(capsys)) == 3
    code, out, err = run(capsys, "import", CHATGPT_MODERN)
    assert code == 0 and out == "" and "2 chats were imported before" in err
    assert len(err.splitlines()) == 1  # nothing stored: nothing was left out of it either
    forced, _ = imported(capsys, CHATGPT_MODERN, "--again")
    assert len(forced) == 2 and len(threads(capsys)) == 5


def test_the_same_words_at_other_times_are_another_chat_not_one_imported_before(tmp_path):
    """Before, a chat of "test" / "Hello! How can I assist you today?" from 2023 was
    skipped as "imported before" when the history held the same two lines from 2025 (a
    common first chat in ChatGPT): it was lost to the import. The times, where both say,
    are part of what makes two chats the same."""
    from iris_desktop.core.foreign import OPENAI, Chat, Loaded, import_conversations
    from iris_desktop.core.store import Store

    def chat(year: int, dated: bool = True) -> Chat:
        lines = [("user", "test"), ("assistant", "Hello! How can I assist you today?")]
        return Chat(None, [{"role": role, "content": text,
                            **({"created_at": f"{year}-03-0{i + 1}T10:00:00+00:00"} if dated else {})}
                           for i, (role, text) in enumerate(lines)])

    with Store(tmp_path / "iris.db") as store:
        first = import_conversations(store, Loaded(OPENAI, [chat(2025)]))
        assert len(first.ids) == 1
        other = import_conversations(store, Loaded(OPENAI, [chat(2023)]))
        assert len(other.ids) == 1 and other.known == []
        again = import_conversations(store, Loaded(OPENAI, [chat(2025), chat(2023), chat(0, False)]))
        assert again.ids == [] and again.known[:2] == [first.ids[0], other.ids[0]]
        assert again.known[2] in (first.ids[0], other.ids[0])  # no times: either is the same
        assert len(store.threads()) == 2


def test_an_import_writes_in_short_transactions_and_a_killed_one_is_finished_by_running_it_again(
        tmp_path, monkeypatch):
    """Before, a whole export was one transaction: a 279 MB one held the write lock for
    25 s, and a reply the window was writing meanwhile failed. Now a transaction holds at
    most about CHUNK_S of work (counted here with a clock that advances 0.1 s a look);
    an import killed part way keeps the chats stored so far, and the same import again
    adds only the rest."""
    from iris_desktop.core import foreign
    from iris_desktop.core.foreign import OPENAI, Chat, Loaded, import_conversations
    from iris_desktop.core.store import Store

    ticks = iter(range(10**6))
    monkeypatch.setattr(foreign.time, "monotonic", lambda: next(ticks) * 0.1)
    chats = [Chat(f"chat {i}", [{"role": "user", "content": f"question {i}"},
                                {"role": "assistant", "content": f"answer {i}"}]) for i in range(20)]
    with Store(tmp_path / "iris.db") as store:
        begun = []
        transaction = store.transaction
        monkeypatch.setattr(store, "transaction", lambda: begun.append(1) or transaction())
        stored = foreign.import_messages
        calls = []

        def killed_at_13(store_, messages, title, system_prompt=None):
            calls.append(title)
            if len(calls) == 13:
                raise KeyboardInterrupt  # Ctrl-C, or the process killed
            return stored(store_, messages, title, system_prompt)

        monkeypatch.setattr(foreign, "import_messages", killed_at_13)
        with pytest.raises(KeyboardInterrupt):
            import_conversations(store, Loaded(OPENAI, chats))
        kept = sorted(t["title"] for t in store.threads())
        assert 0 < len(kept) <= 12 and len(begun) > 1  # whole chunks kept, the killed one not
        monkeypatch.setattr(foreign, "import_messages", stored)
        begun.clear()
        rest = import_conversations(store, Loaded(OPENAI, chats))
        assert len(rest.known) == len(kept) and len(rest.ids) == 20 - len(kept)
        assert sorted(t["title"] for t in store.threads()) == sorted(c.title for c in chats)
        assert len(begun) >= 20 // 3  # never more than about CHUNK_S of chats at once


def test_a_long_chain_of_second_messages_is_untangled_in_one_pass(tmp_path):
    """Each question followed by its reply and by the next question: every second question
    becomes an alternative holding the texts above it. One pass, parents first (it was a
    pass per merge: 2,000 of them took 70 s), and the text merges may add is bounded, the
    rest left out and counted."""
    from iris_desktop.core import foreign_tree

    def node(key, role, parent, children):
        return {"id": key, "parent": parent, "children": children, "message": {
            "id": key, "author": {"role": role}, "content": {"content_type": "text", "parts": [key * 20]}}}

    n = 3_000
    mapping = {}
    for i in range(n):
        mapping[f"u{i}"] = node(f"u{i}", "user", f"u{i - 1}" if i else None,
                                [f"a{i}", *([f"u{i + 1}"] if i + 1 < n else [])])
        mapping[f"a{i}"] = node(f"a{i}", "assistant", f"u{i}", [])
    source = tmp_path / "conversations.json"
    source.write_text(json.dumps([{"title": "comb", "current_node": "a0", "mapping": mapping}]))
    loaded = load_conversations(source)
    messages = loaded.chats[0].messages
    assert messages[2]["content"] == f"{'u0' * 20}\n\n{'u1' * 20}"  # the second question, merged
    assert sum(len(m["content"]) for m in messages) < foreign_tree.MERGED_CHARS + 2 * n * 120
    left_out = int(loaded.notes[0].split()[0].replace(",", ""))  # "N messages on branches…"
    assert len(messages) < 2 * n and len(messages) + left_out == 2 * n  # every one kept or counted


# -- Claude, and the zip archives exports are downloaded as -----------------------------------


def test_a_claude_export_imports_with_its_branches_pasted_files_and_dates(capsys):
    """Before: "message index 0: unknown role None". Now each conversation is a thread:
    the edited message's branch active (current_leaf_message_uuid), a pasted file
    (Claude keeps its text as extracted_content) as an attachment the model reads,
    thinking left out, tool steps and an image counted, every message's date kept."""
    ids, err = imported(capsys, CLAUDE)
    assert len(ids) == 2 and err.splitlines() == [
        "iris-desktop: imported 2 chats from a Claude export",
        "iris-desktop: 1 image was left out: Iris imports text only.",
        "iris-desktop: 1 tool step (web searches, code runs, image generation) was left out; the "
        "replies that used them are kept.",
        "iris-desktop: 1 chat with no text message was skipped."]
    listed = {t["id"]: t["title"] for t in threads(capsys)}
    assert [listed[i] for i in ids] == ["Trip to Lisbon in May", "Weather lookup"]
    trip = exported(capsys, ids[0])
    assert len(trip) == 6 and all(m["created_at"].startswith("2025-04-02T08:") for m in trip)
    pasted = trip[2]
    assert '<file name="pasted.txt">\nHotel 120 EUR/night' in pasted["content"]
    assert pasted["attachments"]["files"][0]["name"] == "pasted.txt"
    sent = [m["id"] for m in context_messages(capsys, ids[0]) if m["role"] != "system"]
    by_id = {m["iris"]["id"]: m["content"] for m in trip}
    assert [by_id[i] for i in sent[-2:]] == [
        "Actually we land on 15 May, redo it for two days.",
        "Two days from 15 May: Alfama and the tile museum, then Belém and the Time Out Market."]
    assert len(sent) == 4  # the edited branch only
    assert not any("They like food and azulejos" in m["content"] for m in trip)  # thinking
    weather = exported(capsys, ids[1])
    assert weather[1]["content"] == "Let me check.\n\nYes: showers are forecast, around 17 °C."


def zipped(tmp_path: Path, source: Path, inside: str = "conversations.json", **others: str) -> Path:
    import zipfile

    archive = tmp_path / "data-2025-06-12-10-00-00.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in others.items():
            zf.writestr(name.replace("__", "/").replace("_json", ".json"), text)
        zf.write(source, inside)
    return archive


@pytest.mark.parametrize("source", [CLAUDE, CHATGPT_MODERN], ids=["claude", "chatgpt"])
def test_the_zip_an_export_is_downloaded_as_and_its_folder_import_as_its_conversations(
        capsys, tmp_path, source):
    """Before: "not UTF-8 text (byte 12)" for the zip ChatGPT and Claude send, and a
    sentence about Jan's folders for the folder it unzips to."""
    archive = zipped(tmp_path, source, users_json='[{"uuid": "u"}]', chat_html="<html></html>")
    ids, err = imported(capsys, archive)
    direct, _ = imported(capsys, source, "--again")
    assert len(ids) == len(direct) > 0 and "imported before" not in err
    def said(thread: int) -> list[tuple]:
        return [(m["role"], m["content"], m.get("created_at")) for m in exported(capsys, thread)]

    assert [said(a) for a in ids] == [said(b) for b in direct]
    folder = tmp_path / "unzipped"
    folder.mkdir()
    (folder / "conversations.json").write_bytes(source.read_bytes())
    code, out, err = run(capsys, "import", folder)
    assert code == 0 and out == "" and f"{len(ids)} chat" in err and "imported before" in err


def test_a_zip_without_conversations_or_damaged_is_one_sentence_and_nothing_is_written(
        capsys, tmp_path):
    archive = zipped(tmp_path, CLAUDE, inside="notes/readme.json")
    code, out, err = run(capsys, "import", archive)
    assert code != 0 and out == ""
    assert err.strip() == (f"iris-desktop: import refused, nothing was written: {archive}: a zip "
                           "archive with no conversations.json (nor conversations-000.json…) in "
                           "it; unzip it and import the chat file it holds")
    damaged = tmp_path / "damaged.zip"
    damaged.write_bytes(zipped(tmp_path, CLAUDE).read_bytes()[:200])
    code, out, err = run(capsys, "import", damaged)
    assert code != 0 and "a zip archive Iris cannot read" in err and "Traceback" not in err
    outside = zipped(tmp_path, CLAUDE, inside="../../conversations.json")  # a hostile name
    ids, _ = imported(capsys, outside)
    assert len(ids) == 2 and not (tmp_path.parent / "conversations.json").exists()
    assert len(threads(capsys)) == 2


def test_a_zip_bomb_is_refused_before_it_is_unpacked(capsys, tmp_path):
    """Before (an audit): 500 MB of spaces packed into a 500 kB zip took a gigabyte of
    memory before it was refused. A member packed over 200 times tighter than its text is
    refused from its header; one that does not begin as JSON after 64 KiB is refused there."""
    import resource
    import zipfile

    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("conversations.json", " " * 50_000_000 + "[]")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code, out, err = run(capsys, "import", bomb)
    assert code != 0 and out == ""
    assert "over 200 times its packed size, which no chat export is (a zip bomb?)" in err
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 40_000  # KiB
    stored = tmp_path / "stored.zip"  # not compressed: no ratio to tell, the start does
    with zipfile.ZipFile(stored, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("conversations.json", " " * 200_000 + "[]")
    code, out, err = run(capsys, "import", stored)
    assert code != 0 and "does not begin like a chat export" in err
    assert threads(capsys) == []


def test_imported_chats_take_their_place_in_the_list_by_when_they_were_last_written(tmp_path):
    """Before, every imported chat was dated by the import: a file listing a 2025 chat
    before a 2021 one put the 2021 chat on top of the list. A chat whose messages give
    dates is listed by its last one; one without dates by the import, as before."""
    from iris_desktop.core.foreign import OPENAI, Chat, Loaded, import_conversations
    from iris_desktop.core.store import Store

    def chat(title: str, year: int | None) -> Chat:
        when = {"created_at": f"{year}-05-01T10:00:00+00:00"} if year else {}
        return Chat(title, [{"role": "user", "content": f"{title}?", **when},
                            {"role": "assistant", "content": f"{title}.", **when}])

    with Store(tmp_path / "iris.db") as store:
        store.create_thread("typed today")
        import_conversations(store, Loaded(OPENAI, [chat("from 2025", 2025), chat("from 2021", 2021),
                                                    chat("undated", None)]))
        listed = [t["title"] for t in store.threads()]
        assert listed == ["undated", "typed today", "from 2025", "from 2021"]
        dated = {t["title"]: t for t in store.threads()}["from 2021"]
        assert dated["created_at"] == dated["updated_at"] == 1619863200.0


def test_a_thread_changed_or_deleted_after_it_was_counted_is_no_twin_and_no_crash(tmp_path):
    """Another process may write to or delete a thread between an import's chunks: the
    comparison of a thread whose rows no longer match its count raised ValueError (zip
    strict) in the middle of the import."""
    from iris_desktop.core.import_twins import StoredThreads
    from iris_desktop.core.store import Store

    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    with Store(tmp_path / "iris.db") as store:
        kept, gone = store.create_thread("kept"), store.create_thread("gone")
        store.add_messages(kept, messages)
        store.add_messages(gone, messages)
        threads = StoredThreads(store, again=False)
        threads.catch_up([])
        store.delete_thread(gone)
        store.add_messages(kept, [{"role": "user", "content": "and more"}])
        assert threads.holding(messages) is None


def test_a_time_far_in_the_future_is_left_out_not_kept(capsys, tmp_path):
    """Before (an audit): a create_time of 99999999999999 was read as milliseconds, the
    year 5138, and the chat sorted above every other for good. A time over a day ahead is
    left out like an unreadable one (the message is kept, dated by the import)."""
    chats = json.loads(CHATGPT_MODERN.read_text())
    for node in chats[0]["mapping"].values():
        if node.get("message"):
            node["message"]["create_time"] = 99999999999999
    chats[0]["create_time"] = chats[0]["update_time"] = 99999999999999
    source = tmp_path / "conversations.json"
    source.write_text(json.dumps(chats[:1]))
    ids, _ = imported(capsys, source)
    assert len(ids) == 1
    for message in exported(capsys, ids[0]):
        assert message.get("created_at", "0")[:4] < "2100", message


def test_an_iris_or_openai_file_with_a_time_in_the_future_does_not_date_its_chat(capsys, tmp_path):
    """A review: the native formats kept a chat dated in the year 5138 at the top of the
    list for good (only other apps' exports were fixed). The message keeps the time it
    gives (an export gives it back); the chat is dated by the others, or by the import."""
    import time

    source = tmp_path / "future.jsonl"
    source.write_text(json.dumps({"role": "user", "content": "hello", "created_at": 99999999999})
                      + "\n" + json.dumps({"role": "assistant", "content": "hi",
                                           "created_at": "5138-01-01T00:00:00+00:00"}) + "\n")
    ids, _ = imported(capsys, source)
    [thread] = [t for t in json.loads(run(capsys, "threads", "--no-model", "--json")[1])
                if t["id"] == ids[0]]
    assert thread["updated_at"] < time.time() + 86_400
    assert exported(capsys, ids[0])[1]["created_at"].startswith("5138")
