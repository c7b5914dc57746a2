"""A reply cut off at its token cap keeps that mark through an export and an import, as a
stopped reply does: the JSON export says ``"finish_reason": "length"`` (OpenAI's word), the
Markdown export "(cut off)", and the imported copy offers Continue (``chat --continue``,
the window's). Other apps' replies that reached their length limit (ChatGPT's
``finish_details`` "max_tokens", LM Studio's ``maxPredictedTokensReached``) come in the same.

Before (a newcomer audit): a reply cut off at ``model.max_tokens`` is stored complete, its
cut-off state only its request's finish reason, which no export carried; the copy said
"thread 20's last reply is complete (not stopped or cut off); there is nothing to
continue", and the Markdown export did not mark it. Through the real CLI, on the real
bundled model where a reply is written."""

from __future__ import annotations

import json
from pathlib import Path

from iris_desktop.core.store import Store
from iris_desktop.core.views import load_transcript
from iris_desktop.paths import app_paths

from conftest import FIXTURES
from support.helpers import run_cli as run

FOREIGN = FIXTURES / "foreign"
CHATGPT_TREE = FOREIGN / "chatgpt" / "librechat-chatgpt-tree.json"
LM_STUDIO_FILE = FOREIGN / "lmstudio" / "1746009600000.conversation.json"


def cli(capsys, *argv) -> str:
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    return out


def offers_continue(data: Path, thread: int) -> bool:
    """What the window and ``chat --continue`` ask: the head is a reply to go on with (the
    window's transcript then marks it "cut off" and its card and menu offer Continue)."""
    with Store(app_paths(data).db_path) as store:
        head = store.head(thread)
        last = [e for e in load_transcript(store, thread) if e.kind == "message"][-1]
        return store.stopped_reply(thread) == head and last.can_continue


def test_a_reply_cut_off_at_max_tokens_is_cut_off_in_its_exports_and_its_imported_copy(
        capsys, tmp_path, model_path):
    data = tmp_path / "data"
    base = ["--data-dir", data, "--set", f"model.path={model_path}", "--set", "model.n_ctx=2048",
            "--set", "model.temperature=0", "--set", "model.max_tokens=8"]
    said = json.loads(cli(capsys, *base, "chat", "--json",
                          "Explain in two sentences what a Python tuple is."))
    assert said["finish_reason"] == "length"
    export = cli(capsys, "--data-dir", data, "export", 1)
    reply = json.loads(export)["messages"][-1]
    assert reply["role"] == "assistant" and reply["finish_reason"] == "length"
    assert "status" not in reply  # not a stopped reply: one cut off
    markdown = cli(capsys, "--data-dir", data, "export", 1, "--format", "md")
    assert "## Assistant (cut off)" in markdown and "## User\n" in markdown
    path = tmp_path / "t1.json"
    path.write_text(export, encoding="utf-8")
    copy = int(cli(capsys, "--data-dir", data, "import", "--again", path))
    assert copy != 1
    # the copy exports as the original did, byte for byte, in both formats
    assert cli(capsys, "--data-dir", data, "export", copy) == export
    assert cli(capsys, "--data-dir", data, "export", copy, "--format", "md") == markdown
    assert offers_continue(data, 1) and offers_continue(data, copy)
    code, out, err = run(capsys, *base, "chat", "--thread", copy, "--continue", "--json")
    assert code == 0, err  # old: "… last reply is complete (not stopped or cut off)", exit 2
    continued = json.loads(out)
    assert continued["reply"].startswith(reply["content"])
    assert len(continued["reply"]) > len(reply["content"])
    # the continued reply is a new alternative; what it says of its own end is its own
    again = json.loads(cli(capsys, "--data-dir", data, "export", copy))["messages"]
    active = [m for m in again if m["iris"]["active"]]
    assert active[-1]["content"] == continued["reply"]
    assert (active[-1].get("finish_reason") == "length") == (continued["finish_reason"] == "length")


def test_a_file_that_says_a_reply_was_cut_off_imports_it_cut_off(capsys, tmp_path):
    """An OpenAI-messages file (an Iris export, or one written by hand) with
    ``"finish_reason": "length"`` on its last reply; "stop" is a finished reply."""
    messages = [{"role": "user", "content": "Count to ten."},
                {"role": "assistant", "content": "One, two, three", "finish_reason": "length"}]
    cut, whole = tmp_path / "cut.json", tmp_path / "whole.json"
    cut.write_text(json.dumps({"title": "Counting", "messages": messages}), encoding="utf-8")
    messages[-1]["finish_reason"] = "stop"
    whole.write_text(json.dumps({"title": "Counting", "messages": messages}), encoding="utf-8")
    for source, marked in ((cut, True), (whole, False)):
        data = tmp_path / source.stem
        [thread] = [int(n) for n in cli(capsys, "--data-dir", data, "import", source).split()]
        assert offers_continue(data, thread) == marked
        markdown = cli(capsys, "--data-dir", data, "export", thread, "--format", "md")
        assert ("## Assistant (cut off)" in markdown) == marked


def test_a_chatgpt_reply_that_reached_max_tokens_is_imported_cut_off(capsys, tmp_path):
    conversation = json.loads(CHATGPT_TREE.read_text())
    conversation = conversation[0] if isinstance(conversation, list) else conversation
    shown = conversation["mapping"][conversation["current_node"]]["message"]
    assert shown["metadata"]["finish_details"]["type"] == "stop"  # the file as it was written
    data = tmp_path / "data"
    [plain] = [int(n) for n in cli(capsys, "--data-dir", data, "import", CHATGPT_TREE).split()]
    assert "finish_reason" not in cli(capsys, "--data-dir", data, "export", plain)
    shown["metadata"]["finish_details"] = {"type": "max_tokens"}  # as ChatGPT says a cap
    source = tmp_path / "conversations.json"
    source.write_text(json.dumps([conversation]), encoding="utf-8")
    [thread] = [int(n) for n in cli(capsys, "--data-dir", data, "import", "--again", source).split()]
    messages = json.loads(cli(capsys, "--data-dir", data, "export", thread))["messages"]
    marked = [m for m in messages if m.get("finish_reason") == "length"]
    assert len(marked) == 1 and marked[0]["iris"]["active"] and "status" not in marked[0]
    assert offers_continue(data, thread)
    assert "## Assistant (cut off)" in cli(capsys, "--data-dir", data, "export", thread, "--format", "md")


def test_an_lm_studio_reply_that_reached_its_max_tokens_is_imported_cut_off(capsys, tmp_path):
    conversation = json.loads(LM_STUDIO_FILE.read_text())
    info = json.loads(json.dumps(conversation["messages"][1]["versions"][0]["steps"][0]["genInfo"]))
    assert info["stats"]["stopReason"] == "eosFound"  # the file's replies: each ended
    info["stats"]["stopReason"] = "maxPredictedTokensReached"  # the SDK's name for the cap
    last = conversation["messages"][-1]["versions"][-1]  # the last reply's last block
    [block for block in last["steps"] if block["type"] == "contentBlock"][-1]["genInfo"] = info
    source = tmp_path / LM_STUDIO_FILE.name
    source.write_text(json.dumps(conversation), encoding="utf-8")
    data = tmp_path / "data"
    [thread] = [int(n) for n in cli(capsys, "--data-dir", data, "import", source).split()]
    messages = json.loads(cli(capsys, "--data-dir", data, "export", thread))["messages"]
    assert [m["role"] for m in messages if m.get("finish_reason") == "length"] == ["assistant"]
    assert messages[-1].get("finish_reason") == "length" and "status" not in messages[-1]
    assert offers_continue(data, thread)
