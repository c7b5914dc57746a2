"""Continue on a reply imported cut off (LibreChat's ``unfinished: true``, its abort's
``finish_reason: "incomplete"``): the window offers it, and it goes on with that very
text with the model here, as a new alternative beside the imported reply (which stays
as it was). What it fixed: the continued reply, most of it written in LibreChat, was
headed "Iris" and exported as Iris's own ("## Assistant"); it now says it came from
LibreChat and was continued in Iris ("LibreChat, continued in Iris").

Real parts: LibreChat's own export file (tests/fixtures/local-apps), imported by the
CLI into a real data folder; the real window (offscreen) with a scripted model, whose
requests show what the model was asked to go on with; and the CLI with the real bundled
model."""

from __future__ import annotations

import json

from iris_desktop.core.store import Store, row_to_message
from iris_desktop.paths import app_paths

from conftest import FIXTURES
from support.fakes import ScriptedRuntime
from support.helpers import run_cli
from support.windows import settle

LIBRECHAT = FIXTURES / "local-apps" / "librechat" / "librechat-opts-nonr-branches.json"
CONTINUED = "LibreChat, continued in Iris"


def imported(capsys, data_dir) -> tuple[int, dict]:
    """The LibreChat chat imported: (thread, its last reply's stored row)."""
    code, out, err = run_cli(capsys, "--data-dir", data_dir, "import", LIBRECHAT)
    assert code == 0, err
    thread = int(out)
    with Store(app_paths(data_dir).db_path) as store:
        head = store.messages_by_id([store.head(thread)])[store.head(thread)]
        assert store.stopped_reply(thread) == head["id"]  # offered Continue
    message = row_to_message(dict(head))
    assert message["role"] == "assistant" and message["imported_from"] == "LibreChat"
    assert head["status"] == "interrupted" and len(head["content"]) > 100
    return thread, head


def replies(data_dir, thread: int) -> list[dict]:
    with Store(app_paths(data_dir).db_path) as store:
        return [row_to_message(dict(r)) | {"id": r["id"], "parent_id": r["parent_id"]}
                for r in store.all_messages(thread) if r["role"] == "assistant"]


def test_continue_in_the_window_goes_on_with_the_imported_text_and_says_where_it_began(
        capsys, make_window, qtbot, data_dir):
    thread, head = imported(capsys, data_dir)
    runtime = ScriptedRuntime(["and so it ended."])
    window = make_window(runtime)
    window.open_thread(thread)
    settle(qtbot, window)
    qtbot.waitUntil(lambda: bool(window.view.transcript.entries()), timeout=5_000)
    last = window.view.transcript.entries()[-1]
    assert (last.message_id, last.speaker, last.status) == (head["id"], "LibreChat", "interrupted")
    assert last.can_continue  # the card offers Continue
    window.turns.continue_reply(head["id"])
    qtbot.waitUntil(lambda: not window.app_state.generating
                    and window.view.transcript.entries()[-1].message_id != head["id"], timeout=20_000)
    settle(qtbot, window)
    # the model was asked to go on with the imported text: the request ends with it, as a
    # prefix to continue (not a finished turn to answer after)
    assert runtime.requests[-1][-1] == {"role": "assistant", "content": head["content"], "prefix": True}
    new = window.view.transcript.entries()[-1]
    assert new.text == head["content"] + "and so it ended." and new.speaker == CONTINUED
    assert new.branch == (2, 2)  # beside the imported reply
    stored = {r["id"]: r for r in replies(data_dir, thread)}
    old = stored[head["id"]]
    assert old["content"] == head["content"] and old["imported_from"] == "LibreChat"  # untouched
    assert stored[new.message_id]["imported_from"] == CONTINUED  # before: none ("Iris")
    assert stored[new.message_id]["parent_id"] == head["parent_id"]


def test_continue_with_the_bundled_model_through_the_cli(capsys, data_dir):
    thread, head = imported(capsys, data_dir)
    code, out, err = run_cli(capsys, "--data-dir", data_dir, "--set", "model.max_tokens=6",
                             "chat", "--thread", thread, "--continue")
    assert code == 0, err
    after = replies(data_dir, thread)
    new = after[-1]
    assert new["id"] != head["id"] and new["parent_id"] == head["parent_id"]
    assert new["content"].startswith(head["content"]) and len(new["content"]) > len(head["content"])
    assert out.startswith(head["content"][:40])  # the reply shown whole, the old text first
    assert new["imported_from"] == CONTINUED
    code, markdown, err = run_cli(capsys, "--data-dir", data_dir, "export", thread, "--format", "md")
    assert code == 0, err
    assert f"— imported from {CONTINUED}\n\n" in markdown  # before: "## Assistant (cut off)"
    code, text, _ = run_cli(capsys, "--data-dir", data_dir, "export", thread)
    kept = [m for m in json.loads(text)["messages"] if m.get("iris", {}).get("id") == head["id"]]
    assert kept[0]["imported_from"] == "LibreChat" and kept[0]["status"] == "interrupted"
    # continued once more: still the one note, not "…, continued in Iris, continued in Iris"
    code, _, err = run_cli(capsys, "--data-dir", data_dir, "--set", "model.max_tokens=4",
                           "chat", "--thread", thread, "--continue")
    assert code == 0, err
    assert replies(data_dir, thread)[-1]["imported_from"] == CONTINUED


def test_a_continued_reply_keeps_the_speaker_an_imported_group_chat_named(tmp_path):
    """An imported reply that names its speaker (a character) keeps the name when it is
    continued: the card is still headed by it, and the export says where it began."""
    from iris_desktop.core.conversation import markdown_export
    from iris_desktop.host import Host

    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps({"title": "Tavern", "messages": [
        {"role": "user", "content": "Tell me of the castle."},
        {"role": "assistant", "content": "The castle stood", "name": "Megumin",
         "imported_from": "SillyTavern", "status": "interrupted"}]}))
    data = tmp_path / "data"
    runtime = ScriptedRuntime([" on a hill."])
    with Host(data, {"context.recall_semantic": "false"}, runtime=runtime, compact=False) as host:
        from iris_desktop.core.foreign import import_conversations, load_conversations

        host.load_model()
        [thread] = import_conversations(host.store, load_conversations(chat)).ids
        events = list(host.continue_reply(thread))
        assert type(events[-1]).__name__ == "TurnDone", events
        reply = replies(data, thread)[-1]
        assert reply["content"] == "The castle stood on a hill."
        assert (reply["name"], reply["imported_from"]) == ("Megumin", "SillyTavern, continued in Iris")
        assert "## Assistant — imported from SillyTavern, continued in Iris\n\nThe castle stood on a hill." \
            in markdown_export(host.store, thread)
