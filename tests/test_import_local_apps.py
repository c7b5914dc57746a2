"""Three local apps' chat files, imported (``core/foreign_local.py``): LibreChat's
conversation export (its tree kept as branches, the one LibreChat shows active),
text-generation-webui's (oobabooga's) chat history (its versions as alternatives) and
BetterChatGPT's export. Before, each was refused by the app's name ("which Iris cannot
import yet"). Each is imported through the real CLI in-process into a real SQLite store
and read back with ``export``; a broken file of each is refused in one sentence, nothing
written. The files are in ``tests/fixtures/local-apps`` (where each comes from:
SOURCES.md there: LibreChat's are its own test files, the other two are written as the
apps' own code writes them)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from test_foreign_import import exported, imported, shape, threads

from support.helpers import one_sentence
from support.helpers import run_cli as run

LOCAL = Path(__file__).parent / "fixtures" / "local-apps"
REFUSED = "iris-desktop: import refused, nothing was written: "


def local(year: int, month: int, day: int, hour: int, minute: int) -> str:
    """A wall-clock time of this computer (text-generation-webui's ``timestamp``) as the
    export dates it, in UTC."""
    return datetime(year, month, day, hour, minute).astimezone(UTC).isoformat()


def refused(capsys, source: Path) -> str:
    code, out, err = run(capsys, "import", source)
    assert code == 2 and out == "" and one_sentence(err), err
    assert err.startswith(f"{REFUSED}{source}")
    assert threads(capsys) == []
    return err


# -- LibreChat ------------------------------------------------------------------------------


def test_librechats_branched_export_keeps_every_branch_and_shows_librechats(capsys):
    """LibreChat's api/server/utils/import/__data__/librechat-tree.json: exported with
    branches and ``recursive`` (each message's replies nested under ``children``, all under
    ``messages`` as LibreChat wrote it in 2024): two questions after the first reply, a
    regenerated reply. LibreChat shows the last of each message's replies: that branch is
    active; its ``promptPrefix`` is the chat's system prompt."""
    ids, err = imported(capsys, LOCAL / "librechat" / "librechat-tree.json")
    assert len(ids) == 1 and err == "iris-desktop: imported 1 chat from a LibreChat export\n"
    messages = exported(capsys, ids[0])
    assert [(role, text[:26], parent, active) for role, text, parent, active in shape(messages)] == [
        ("system", "You are an expert software", None, True),
        ("user", "How do I use source venv/b", 0, True),
        ("assistant", "It looks like you're tryin", 1, True),
        ("user", "thanks", 2, False),
        ("assistant", "You're welcome! If you hav", 3, False),
        ("assistant", "You're welcome! If you hav", 3, False),  # (regenerated)
        ("user", "does coding make you happy", 5, False),
        ("assistant", "As a software engineer, co", 6, False),
        ("user", "lol", 2, True),
        ("assistant", "It looks like you might ha", 8, True)]
    assert messages[4]["content"].endswith("Good luck with your project!")
    assert messages[5]["content"].endswith("Happy coding!")
    assert [m.get("created_at") for m in messages[1:4]] == [
        "2024-05-01T16:35:11+00:00", "2024-05-01T16:35:12+00:00", None]
    assert {m.get("imported_from") for m in messages if m["role"] == "assistant"} == {"LibreChat"}
    assert threads(capsys)[0]["title"] == "Troubleshooting Python Virtual Environment Activation Issue"


def test_librechats_flat_export_with_an_edited_first_question(capsys):
    """LibreChat's librechat-opts-nonr-branches.json: branches without ``recursive``, one
    list, each message naming its ``parentMessageId``; the first question was edited (two
    roots), its first answer regenerated. The newest (last) question's branch is active;
    replies the user stopped (``finish_reason`` "incomplete", LibreChat's abort) or an
    error cut short (``unfinished``) are stopped replies, as Iris marks its own."""
    ids, err = imported(capsys, LOCAL / "librechat" / "librechat-opts-nonr-branches.json")
    assert len(ids) == 1 and err == "iris-desktop: imported 1 chat from a LibreChat export\n"
    messages = exported(capsys, ids[0])
    assert [(role, text[:20], parent, active) for role, text, parent, active in shape(messages)] == [
        ("user", "tell me a long story", None, False),
        ("assistant", "Of course! Settle in", 0, False),
        ("assistant", "Sure, I can craft a ", 0, False),
        ("user", "tell me a long long ", None, True),
        ("assistant", "Of course! Here’s a ", 3, True)]
    assert [m.get("status") for m in messages] == [None, "interrupted", "interrupted", None,
                                                   "interrupted"]
    assert [m["created_at"] for m in messages] == [
        "2024-05-28T18:08:55+00:00", "2024-05-28T18:08:55+00:00", "2024-05-28T18:09:27+00:00",
        "2024-05-28T18:14:07+00:00", "2024-05-28T18:14:08+00:00"]
    assert threads(capsys)[0]["title"] == "Original"


def test_librechats_agent_messages_read_their_text_parts(capsys, tmp_path):
    """A reply of LibreChat's agents keeps its text in ``content`` parts (LibreChat's
    ``ContentTypes``: ``text``, ``think``, ``tool_call``, ``image_file``); a reply of its
    other endpoints puts its reasoning in front of its text (``:::thinking … :::``, as its
    OpenAI client writes it); a message's ``files``; a failed reply (``error``); a cut
    one (``finish_reason`` "length"). The shape is LibreChat's (its export's keys), the
    texts this test's."""
    source = tmp_path / "LibreChat.json"
    source.write_text(json.dumps({
        "conversationId": "c1", "endpoint": "agents", "title": "Weather", "exportAt": "x",
        "branches": False, "recursive": False, "messages": [
            {"messageId": "u1", "parentMessageId": "00000000-0000-0000-0000-000000000000",
             "isCreatedByUser": True, "sender": "User", "text": "Weather in Oslo?",
             "files": [{"file_id": "f", "type": "image/png", "width": 10, "height": 10},
                       {"file_id": "g", "type": "application/pdf"}],
             "createdAt": "2025-03-01T10:00:00.000Z"},
            {"messageId": "a1", "parentMessageId": "u1", "isCreatedByUser": False,
             "sender": "Agent", "text": "", "content": [
                 {"type": "think", "think": "Look it up."},
                 {"type": "tool_call", "tool_call": {"id": "t", "name": "web_search"}},
                 {"type": "text", "text": "It is 3 °C and raining."},
                 {"type": "image_file", "image_file": {"file_id": "i"}}],
             "createdAt": "2025-03-01T10:00:05.000Z"},
            {"messageId": "u2", "parentMessageId": "a1", "isCreatedByUser": True,
             "sender": "User", "text": "And tomorrow?"},
            {"messageId": "a2", "parentMessageId": "u2", "isCreatedByUser": False,
             "sender": "GPT-4o", "text": ":::thinking\nCheck the forecast.\n:::\nSunny, 8 °C.",
             "finish_reason": "length"},
            {"messageId": "u3", "parentMessageId": "a2", "isCreatedByUser": True,
             "sender": "User", "text": "Thanks"},
            {"messageId": "a3", "parentMessageId": "u3", "isCreatedByUser": False,
             "sender": "GPT-4o", "error": True,
             "text": "An error occurred while processing the request: 429 Rate limit"}]}))
    ids, err = imported(capsys, source)
    assert err == ("iris-desktop: imported 1 chat from a LibreChat export\n"
                   "iris-desktop: 2 images and 1 other file were left out: Iris imports text "
                   "only.\n"
                   "iris-desktop: 1 tool step (web searches, code runs, image generation) was "
                   "left out; the replies that used them are kept.\n")
    messages = exported(capsys, ids[0])
    assert [(m["role"], m["content"]) for m in messages] == [
        ("user", "Weather in Oslo?"), ("assistant", "It is 3 °C and raining."),
        ("user", "And tomorrow?"), ("assistant", "Sunny, 8 °C."), ("user", "Thanks"),
        ("assistant", "An error occurred while processing the request: 429 Rate limit")]
    assert messages[3].get("finish_reason") == "length" and messages[5].get("status") == "error"
    assert messages[1]["created_at"] == "2025-03-01T10:00:05+00:00"


@pytest.mark.parametrize("value,why", [
    ({"conversationId": "c", "title": "T", "messages": "none"}, "its 'messages' is not a list"),
    ({"conversationId": "c", "title": "T", "messagesTree": [{"messageId": "a", "children": [7]}]},
     "message 2 is not an object"),
])
def test_a_broken_librechat_export_is_refused_in_one_sentence(capsys, tmp_path, value, why):
    source = tmp_path / "librechat.json"
    source.write_text(json.dumps(value))
    assert refused(capsys, source) == f"{REFUSED}{source}: {why}\n"


# -- text-generation-webui --------------------------------------------------------------------


def test_text_generation_webuis_history_keeps_versions_dates_and_the_real_text(capsys):
    """A history as text-generation-webui writes it (logs/chat/<character>/<id>.json):
    the character's greeting (asked by ``<|BEGIN-VISIBLE-CHAT|>``), ``internal`` read (the
    model's text; ``visible`` is HTML-escaped: "&amp;", "&#x27;"), a regenerated reply's
    ``versions`` as alternatives (``current_version_index`` active), each message dated by
    its ``metadata`` timestamp (this computer's time), each version by its own (the
    reply's is the newest version's: the app rewrites it), a reply's ``<think>`` dropped, an
    attached text file attached as Iris attaches one (it was counted, "1 other file was left
    out: Iris imports text only", of a text file whose text the export holds). (Its
    history of early 2023, ``data`` and ``data_visible``:
    test_import_real_files.py.)"""
    ids, err = imported(capsys, LOCAL / "textgen" / "20250105-14-30-12.json")
    assert len(ids) == 1 and err == "iris-desktop: imported 1 chat from a text-generation-webui chat history\n"
    messages = exported(capsys, ids[0])
    assert messages[4]["attachments"] == {"text_chars": 47, "files": [{"name": "notes.txt", "bytes": 38}]}
    assert messages[4]["content"].endswith(
        '\n\n<file name="notes.txt">\nbank (closes 4 pm)\npost office\nbakery\n\n</file>')
    assert shape(messages) == [
        ("assistant", "How can I help you today?", None, True),
        ("user", "What's 2 & 3 <together>?", 0, True),
        ("assistant", "5.", 1, False),
        ("assistant", "2 & 3 together make 5.", 1, True),
        ("user", messages[4]["content"], 3, True),
        ("assistant", "Post office, then bakery, then the bank (it closes at 4 pm).", 4, True),
        ("user", "Und auf Deutsch? 🙂", 5, True),
        ("assistant", "Post, dann Bäckerei, dann die Bank.", 6, True)]
    assert [m["created_at"] for m in messages] == [
        local(2025, 1, 5, 14, 30), local(2025, 1, 5, 14, 31), local(2025, 1, 5, 14, 32),
        local(2025, 1, 5, 14, 32), local(2025, 1, 5, 14, 35), local(2025, 1, 5, 14, 35),
        local(2025, 1, 5, 14, 40), local(2025, 1, 5, 14, 40)]
    assert messages[0]["imported_from"] == "text-generation-webui"
    assert threads(capsys)[0]["title"] == "What's 2 & 3 <together>?"


def test_each_version_of_a_regenerated_reply_is_dated_by_its_own_timestamp(capsys, tmp_path):
    """text-generation-webui rewrites a reply's ``timestamp`` as each generation of it
    starts (``update_message_metadata`` in ``chatbot_wrapper``), regenerations too, so it
    is the newest version's; each version keeps its own. Before, the first version was
    dated by the reply's: "Red." (14:50) showed 15:10, the time "Green." was written."""
    rows = [["<|BEGIN-VISIBLE-CHAT|>", "Hi!"], ["Name a colour.", "Green."]]
    source = tmp_path / "20250105-14-30-00.json"
    source.write_text(json.dumps({"internal": rows, "visible": rows, "metadata": {
        "assistant_0": {"timestamp": "Jan 05, 2025 14:30"},
        "user_1": {"timestamp": "Jan 05, 2025 14:31"},
        "assistant_1": {"timestamp": "Jan 05, 2025 15:10", "model_name": "m", "versions": [
            {"content": "Red.", "visible_content": "Red.", "timestamp": "Jan 05, 2025 14:50"},
            {"content": "Blue.", "visible_content": "Blue.", "timestamp": "Jan 05, 2025 14:50"},
            {"content": "Green.", "visible_content": "Green.",
             "timestamp": "Jan 05, 2025 15:10"}], "current_version_index": 2}}}, indent=4))
    ids, _ = imported(capsys, source)
    messages = exported(capsys, ids[0])
    assert [(m["content"], m["created_at"], m["iris"]["active"]) for m in messages] == [
        ("Hi!", local(2025, 1, 5, 14, 30), True),
        ("Name a colour.", local(2025, 1, 5, 14, 31), True),
        ("Red.", local(2025, 1, 5, 14, 50), False),
        ("Blue.", local(2025, 1, 5, 14, 50), False),
        ("Green.", local(2025, 1, 5, 15, 10), True)]


@pytest.mark.parametrize("value,why", [
    ({"internal": "hi", "visible": []}, "its 'internal' is not a list of [question, reply] rows"),
    ({"internal": [["<|BEGIN-VISIBLE-CHAT|>", "Hi"], ["only a question"]], "visible": []},
     "row 2 of 'internal' is not a [question, reply] pair of texts"),
])
def test_a_broken_text_generation_webui_history_is_refused_in_one_sentence(capsys, tmp_path, value,
                                                                             why):
    source = tmp_path / "history.json"
    source.write_text(json.dumps(value))
    assert refused(capsys, source) == f"{REFUSED}{source}: {why}\n"


# -- BetterChatGPT --------------------------------------------------------------------------


def test_betterchatgpts_export_imports_its_chats(capsys):
    """BetterChatGPT's Export (``{chats, folders, version: 1}``, one line): a chat with its
    default system message, titled as BetterChatGPT titled it; a chat holding only the
    system message is skipped, said."""
    ids, err = imported(capsys, LOCAL / "betterchatgpt" / "2025-01-05.json")
    assert len(ids) == 1 and err == ("iris-desktop: imported 1 chat from a BetterChatGPT export\n"
                                     "iris-desktop: 1 chat with no text message was skipped.\n")
    messages = exported(capsys, ids[0])
    assert [(m["role"], m["content"][:30]) for m in messages] == [
        ("system", "You are ChatGPT, a large langu"),
        ("user", "What should I pack for a week "), ("assistant", "Layers: a waterproof shell, a "),
        ("user", "And for the hot springs?"), ("assistant", "A swimsuit, a quick-dry towel ")]
    assert messages[2]["imported_from"] == "BetterChatGPT"
    assert threads(capsys)[0]["title"] == "Packing list for Iceland"


def test_betterchatgpts_2023_export_and_its_newer_content_parts(capsys, tmp_path):
    """Its exports of March and April 2023 are the chats alone (its ``isLegacyImport``);
    its newer versions keep a message's ``content`` as parts (``text``, ``image_url``)."""
    source = tmp_path / "export.json"
    source.write_text(json.dumps([
        {"title": "New Chat", "messages": [
            {"role": "system", "content": "You are ChatGPT."}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Hello!"}],
         "config": {"temperature": 1, "presence_penalty": 0}, "titleSet": False},
        {"id": "b", "title": "Picture", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                         {"type": "image_url", "image_url": {"url": "data:,"}}]},
            {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]}],
         "config": {"model": "gpt-4o"}, "titleSet": True}]))
    ids, err = imported(capsys, source)
    assert err == ("iris-desktop: imported 2 chats from a BetterChatGPT export\n"
                   "iris-desktop: 1 image was left out: Iris imports text only.\n")
    listed = {t["title"]: t["id"] for t in threads(capsys)}  # (imported from the last)
    assert sorted(ids) == sorted(listed.values())
    assert [(m["role"], m["content"]) for m in exported(capsys, listed["New Chat"])] == [
        ("system", "You are ChatGPT."), ("user", "hi"), ("assistant", "Hello!")]
    assert [(m["role"], m["content"]) for m in exported(capsys, listed["Picture"])] == [
        ("user", "What is this?"), ("assistant", "A cat.")]


def betterchatgpt_export(titles: list[str], legacy: bool = False) -> str:
    """BetterChatGPT's export of chats ``titles``, newest first as it keeps them (its
    ``useAddChat`` puts a new chat in front: ``updatedChats.unshift``); ``legacy``: its
    export of 2023, the chats alone."""
    chats = [{"id": f"id{n}", "title": title, "messages": [
        {"role": "user", "content": f"q {title}"}, {"role": "assistant", "content": f"a {title}"}],
        "config": {}, "titleSet": True} for n, title in enumerate(titles)]
    return json.dumps(chats if legacy else {"chats": chats, "folders": {}, "version": 1})


TITLES = ["Newest", "Middle", "Oldest"]  # as BetterChatGPT lists them, top first


@pytest.mark.parametrize("legacy", [False, True], ids=["export", "export-of-2023"])
def test_betterchatgpts_chats_are_listed_as_betterchatgpt_listed_them(capsys, tmp_path, legacy):
    """The export has no dates: Iris lists the chat imported last on top, so the chats are
    imported from the file's last; before, the list showed them upside down."""
    source = tmp_path / "BetterChatGPT.json"
    source.write_text(betterchatgpt_export(TITLES, legacy))
    ids, _ = imported(capsys, source)
    assert len(ids) == 3
    assert [t["title"] for t in threads(capsys)] == TITLES
    assert [exported(capsys, t["id"])[0]["content"] for t in threads(capsys)] == [
        f"q {title}" for title in TITLES]


def test_the_window_opens_betterchatgpts_newest_chat_after_its_import(request, tmp_path):
    """File ▸ Import… opens the chat it lists first: BetterChatGPT's first (its newest)."""
    pytest.importorskip("pytestqt")
    from iris_desktop.ui.threads import THREAD_ROLE, TITLE_ROLE

    from support.windows import settle

    qtbot, window = request.getfixturevalue("qtbot"), request.getfixturevalue("make_window")()
    source = tmp_path / "BetterChatGPT.json"
    source.write_text(betterchatgpt_export(TITLES))
    window.threads_control.import_file(str(source))
    qtbot.waitUntil(lambda: window.threads.list.count() == 3, timeout=20_000)
    settle(qtbot, window)
    qtbot.waitUntil(lambda: window.app_state.thread_id is not None, timeout=20_000)
    assert [window.threads.list.item(i).data(TITLE_ROLE) for i in range(3)] == TITLES
    assert window.threads.list.item(0).data(THREAD_ROLE) == window.app_state.thread_id


def test_a_broken_betterchatgpt_export_is_refused_in_one_sentence(capsys, tmp_path):
    source = tmp_path / "BetterChatGPT.json"
    source.write_text(json.dumps({"chats": [{"title": "T", "messages": [
        {"role": "wizard", "content": "hi"}], "config": {}}], "folders": {}, "version": 1}))
    assert refused(capsys, source) == (f"{REFUSED}{source}: message 1's role 'wizard' is not "
                                       "one Iris knows (system, user, assistant)\n")
