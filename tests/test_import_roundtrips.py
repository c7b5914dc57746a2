"""Other apps' chats, imported, exported and imported again, through the real CLI: each
file in ``tests/fixtures/foreign`` (SOURCES.md there) round-trips with nothing changed (the
titles, the messages' order, roles and dates, the branches and the one shown, pasted files,
system prompts, and the tokens ``context --json`` counts), and what the app knew of a
reply or a chat's time is kept: a reply cut off in ChatGPT or LM Studio stays a stopped
reply (Continue), and an LM Studio chat is dated by the conversation's times."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from iris_desktop.core.store import Store
from iris_desktop.paths import app_paths

from conftest import FIXTURES
from support.helpers import run_cli as run

FOREIGN = FIXTURES / "foreign"
CHATGPT_TREE = FOREIGN / "chatgpt" / "librechat-chatgpt-tree.json"
LM_STUDIO_FILE = FOREIGN / "lmstudio" / "1746009600000.conversation.json"
EVERY_FILE = [FOREIGN / "chatgpt" / "librechat-chatgpt-tree.json",
              FOREIGN / "chatgpt" / "librechat-chatgpt-modern-export.json",
              FOREIGN / "chatgpt" / "chatgpt-exporter-image-generation.json",
              FOREIGN / "claude" / "conversations.json",
              FOREIGN / "openwebui" / "librechat-openwebui-export.json",
              FOREIGN / "openwebui" / "mobileapp-openwebui-chats.json",
              LM_STUDIO_FILE, FOREIGN / "jan" / "threads"]


def cli(capsys, data: Path, *argv) -> str:
    code, out, err = run(capsys, "--data-dir", data, *argv)
    assert code == 0, err
    return out


def imported(capsys, data: Path, source: Path) -> list[int]:
    return [int(line) for line in cli(capsys, data, "import", source).split()]


def exported(capsys, data: Path, thread: int, fmt: str = "json") -> str:
    return cli(capsys, data, "export", thread, "--format", fmt)


def counted(capsys, data: Path, thread: int) -> tuple:
    """What ``context --json`` says of the request: the token counts and each message's."""
    said = json.loads(cli(capsys, data, "context", thread, "--json", "--no-model"))
    return (said["system_tokens"], said["history_tokens"], said["predicted_prompt_tokens"],
            [(m["role"], m["turn"], m["tokens"], m["state"]) for m in said["messages"]])


def without_ids(doc: dict) -> dict:
    """An export with its messages' ids as their places (another history numbers them
    otherwise)."""
    messages = doc["messages"]
    place = {m["iris"]["id"]: i for i, m in enumerate(messages) if "iris" in m}
    for message in messages:
        if "iris" in message:
            node = message["iris"]
            message["iris"] = {**node, "id": place[node["id"]],
                               "parent_id": place.get(node["parent_id"])}
    return doc


def listed(capsys, data: Path) -> list[dict]:
    return json.loads(cli(capsys, data, "threads", "--json", "--no-model"))


@pytest.mark.parametrize("source", EVERY_FILE, ids=lambda p: p.name)
def test_every_other_apps_file_round_trips_through_an_iris_export_unchanged(capsys, tmp_path, source):
    first, second = tmp_path / "first", tmp_path / "second"
    ids = imported(capsys, first, source)
    for thread in ids:
        export = exported(capsys, first, thread)
        path = tmp_path / f"{thread}.json"
        path.write_text(export, encoding="utf-8")
        [again] = imported(capsys, second, path)
        assert without_ids(json.loads(exported(capsys, second, again))) == \
            without_ids(json.loads(export))
        assert exported(capsys, second, again, "md") == exported(capsys, first, thread, "md")
        assert counted(capsys, second, again) == counted(capsys, first, thread)
    def rows(data: Path) -> list[dict]:
        """The list's rows, with each chat's times (an export carries them, to the
        millisecond: an undated chat keeps the place its first import gave it)."""
        keys = ("title", "messages", "branch_messages", "tokens")
        return [{**{k: t[k] for k in keys}, "times": (t["created_at"], t["updated_at"])}
                for t in listed(capsys, data)]

    got, want = rows(second), rows(first)
    assert [{**r, "times": None} for r in got] == [{**r, "times": None} for r in want]
    for row, expected in zip(got, want, strict=True):  # (the export writes milliseconds)
        assert all(abs(a - b) < 0.002 for a, b in zip(row["times"], expected["times"])), (row, expected)
    # and the original file, imported where its export went, is known as imported before
    code, out, err = run(capsys, "--data-dir", second, "import", source)
    assert code == 0 and out == "" and "imported before" in err


def test_a_reply_cut_off_in_chatgpt_is_imported_as_stopped_and_can_be_continued(capsys, tmp_path):
    """Before: the story the user stopped in ChatGPT (``"status": "in_progress"``,
    ``finish_details`` "interrupted") came in as a finished reply: no Continue, and no
    "(stopped)" in the Markdown export. The same export with that branch shown."""
    conversation = json.loads(CHATGPT_TREE.read_text())
    conversation = conversation[0] if isinstance(conversation, list) else conversation
    cut = next(k for k, n in conversation["mapping"].items()
               if (n.get("message") or {}).get("status") == "in_progress")
    conversation["current_node"] = cut
    source = tmp_path / "conversations.json"
    source.write_text(json.dumps([conversation]), encoding="utf-8")
    data = tmp_path / "data"
    [thread] = imported(capsys, data, source)
    messages = json.loads(exported(capsys, data, thread))["messages"]
    stopped = [m["content"][:20] for m in messages if m.get("status") == "interrupted"]
    assert stopped == ["Sure! Here's a short"]  # that reply only
    assert "## Assistant (stopped)" in exported(capsys, data, thread, "md")
    with Store(app_paths(data).db_path) as store:
        assert store.stopped_reply(thread) == store.head(thread)  # Continue is offered



def test_a_chatgpt_reply_that_ended_on_its_own_is_finished_whatever_its_status(capsys, tmp_path):
    """A reply whose ``finish_details`` say it stopped on its own ("stop") is a finished
    one, even with a leftover ``"status": "in_progress"`` (a review: the status alone
    marked it stopped)."""
    conversation = json.loads(CHATGPT_TREE.read_text())
    conversation = conversation[0] if isinstance(conversation, list) else conversation
    cut = next(k for k, n in conversation["mapping"].items()
               if (n.get("message") or {}).get("status") == "in_progress")
    conversation["mapping"][cut]["message"]["metadata"]["finish_details"] = {"type": "stop"}
    conversation["current_node"] = cut
    source = tmp_path / "conversations.json"
    source.write_text(json.dumps([conversation]), encoding="utf-8")
    [thread] = imported(capsys, tmp_path / "data", source)
    messages = json.loads(exported(capsys, tmp_path / "data", thread))["messages"]
    assert not [m for m in messages if m.get("status") == "interrupted"]

def lm_studio(tmp_path: Path, **changes) -> Path:
    conversation = json.loads(LM_STUDIO_FILE.read_text())
    conversation.update(changes)
    path = tmp_path / LM_STUDIO_FILE.name
    path.write_text(json.dumps(conversation), encoding="utf-8")
    return path


def test_a_reply_the_user_stopped_in_lm_studio_is_imported_as_stopped(capsys, tmp_path):
    conversation = json.loads(LM_STUDIO_FILE.read_text())
    info = json.loads(json.dumps(conversation["messages"][1]["versions"][0]["steps"][0]["genInfo"]))
    info["stats"]["stopReason"] = "userStopped"  # the Stop button, as the SDK names it
    last = conversation["messages"][-1]["versions"][-1]  # the last reply's last block
    [block for block in last["steps"] if block["type"] == "contentBlock"][-1]["genInfo"] = info
    data = tmp_path / "data"
    [thread] = imported(capsys, data, lm_studio(tmp_path, messages=conversation["messages"]))
    messages = json.loads(exported(capsys, data, thread))["messages"]
    assert [m["role"] for m in messages if m.get("status") == "interrupted"] == ["assistant"]
    assert messages[-1].get("status") == "interrupted"
    with Store(app_paths(data).db_path) as store:
        assert store.stopped_reply(thread) == store.head(thread)
    # the file as LM Studio wrote it: every reply ended on its own
    [plain] = imported(capsys, tmp_path / "plain", LM_STUDIO_FILE)
    assert "interrupted" not in exported(capsys, tmp_path / "plain", plain)


def test_an_lm_studio_chat_is_dated_by_the_conversation_not_by_the_import(capsys, tmp_path):
    """Before: LM Studio keeps no time per message, and its ``createdAt`` (and when the
    user and the model last wrote) was not read: a chat of 2025 came in undated, listed
    above every chat as the newest, at each import."""
    data = tmp_path / "data"
    code, out, err = run(capsys, "--data-dir", data, "import", FOREIGN / "claude" / "conversations.json")
    assert code == 0, err  # chats of 2025-04 and 2025-06
    [thread] = imported(capsys, data, LM_STUDIO_FILE)  # createdAt: 2025-04-30 10:40 UTC
    row = next(t for t in listed(capsys, data) if t["id"] == thread)
    assert row["created_at"] == row["updated_at"] == 1746009600.0
    assert [t["title"] for t in listed(capsys, data)].index("Borrow checker basics") == 1
    messages = json.loads(exported(capsys, data, thread))["messages"]
    assert messages[1]["created_at"] == "2025-04-30T10:40:00+00:00"  # its first question
    # when the user and the model last wrote, where the file says: the shown branch's last
    later = tmp_path / "later"
    [thread] = imported(capsys, later, lm_studio(tmp_path, userLastMessagedAt=1746010000000,
                                                  assistantLastMessagedAt=1746010030000))
    row = listed(capsys, later)[0]
    assert (row["created_at"], row["updated_at"]) == (1746009600.0, 1746010030.0)
    shown = [m for m in json.loads(exported(capsys, later, thread))["messages"]
             if m["iris"]["active"] and m["role"] != "system"]
    assert [m.get("created_at", "")[11:19] for m in shown] == ["10:40:00", "", "10:46:40", "10:47:10"]
