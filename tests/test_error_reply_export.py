"""A reply that failed (the model or the server failed while it was written) round-trips
through an export: the JSON export marks it ``"status": "error"``, the Markdown export
"(failed)", and ``import --again`` gives a reply that can be continued, as in Iris.

Before (README "A failed reply exports as finished"): the export did not mark it, so the
copy imported again looked finished: no "failed" badge, no Continue in the window, and
``chat --continue`` said there was nothing to continue. A stopped reply and one cut off at
its token cap were marked already.

Real parts: the real CLI in-process (``run_cli``), a real OpenAI-compatible server on
loopback that breaks off mid-reply (a malformed HTTP chunk, so the agent saves the text
that came as a failed reply), the real SQLite file, and the transcript the window builds
(:func:`~iris_desktop.core.views.load_transcript`, where its Continue comes from).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from iris_desktop.core.store import Store
from iris_desktop.core.views import load_transcript

from support.helpers import run_cli
from support.misbehaving_server import MisbehavingServer

#: what the server streams before it breaks off
SAID = "Hello there"


def server(mode: str, **options) -> MisbehavingServer:
    """A server with a model name of its own (no calibration of another test counts)."""
    return MisbehavingServer(mode, model=f"failing-{uuid.uuid4().hex[:8]}", **options)


def iris(capsys, data: Path, *argv, base_url: str | None = None) -> tuple[int, str, str]:
    remote = ["--set", "model.backend=openai", "--set", f"model.base_url={base_url}"] if base_url else []
    return run_cli(capsys, "--data-dir", data, *remote, *argv)


def failed_chat(capsys, data: Path) -> None:
    """Thread 1: a question, and a reply the server broke off after SAID (stored failed)."""
    with server("bad_chunk", tokens=["Hello", " there"]) as s:
        code, _, err = iris(capsys, data, "chat", "--new", "hi", base_url=s.base_url)
    assert code == 1 and "malformed HTTP chunk" in err, err
    with Store(data / "iris.db") as store:
        row = store.messages(1)[-1]
    assert (row["role"], row["content"], row["status"]) == ("assistant", SAID, "error")


def test_a_failed_reply_is_marked_in_both_exports(capsys, tmp_path):
    data = tmp_path / "data"
    failed_chat(capsys, data)
    code, out, err = iris(capsys, data, "export", "1")
    assert code == 0, err
    question, reply = json.loads(out)["messages"]
    assert reply["status"] == "error" and reply["content"] == SAID  # before: no mark
    assert "status" not in question
    code, out, err = iris(capsys, data, "export", "1", "--format", "md")
    assert code == 0, err
    assert "## Assistant (failed)\n\nHello there\n" in out
    assert "## User\n\nhi\n" in out  # only the failed reply is marked


def test_a_failed_reply_imported_again_can_be_continued(capsys, tmp_path):
    data = tmp_path / "data"
    failed_chat(capsys, data)
    exported = tmp_path / "chat.json"
    code, _, err = iris(capsys, data, "export", "1", "-o", exported)
    assert code == 0, err
    code, out, err = iris(capsys, data, "import", "--again", exported)
    assert code == 0 and out.split() == ["2"], (out, err)

    with Store(data / "iris.db") as store:
        reply = store.messages(2)[-1]
        assert (reply["content"], reply["status"]) == (SAID, "error")  # before: "complete"
        assert store.stopped_reply(2) == reply["id"]
        shown = load_transcript(store, 2)[-1]  # what the window draws: "failed", Continue
        assert (shown.message_id, shown.status, shown.can_continue) == (reply["id"], "error", True)
    code, again, err = iris(capsys, data, "export", "2")
    assert code == 0, err
    assert json.loads(again)["messages"] == json.loads(exported.read_text())["messages"]

    # Continue goes on with it, as with the reply in the chat it came from
    with server("normal", tokens=[", and", " welcome."]) as s:
        code, out, err = iris(capsys, data, "chat", "--thread", "2", "--continue",
                              base_url=s.base_url)
    assert code == 0, err  # before: "thread 2's last reply is complete …; nothing to continue"
    assert out.strip() == f"{SAID}, and welcome."
    with Store(data / "iris.db") as store:
        continued = store.messages(2)[-1]
    assert (continued["content"], continued["status"]) == (f"{SAID}, and welcome.", "complete")


def test_only_a_reply_is_taken_as_stopped_or_failed_and_continue_says_why_not(capsys, tmp_path):
    """An audit: a file marking the user's message "interrupted" stored it so ("## User
    (stopped)" in the Markdown), and `--continue` said "last reply is complete" where the
    chat ended with the user's message, or with a failed reply that wrote nothing."""
    data = tmp_path / "data"
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({"title": "odd", "messages": [
        {"role": "user", "content": "Stopped?", "status": "interrupted"},
        {"role": "assistant", "content": "", "status": "error"},
        {"role": "user", "content": "Still there?", "status": "error"}]}))
    code, _, err = run_cli(capsys, "--data-dir", data, "import", odd)
    assert code == 0, err
    with Store(data / "iris.db") as store:
        assert [row["status"] for row in store.messages(1)] == ["complete", "error", "complete"]
    code, out, err = run_cli(capsys, "--data-dir", data, "export", "1", "--format", "md")
    assert code == 0 and "## User (stopped)" not in out and "## User (failed)" not in out
    code, _, err = run_cli(capsys, "--data-dir", data, "chat", "--thread", "1", "--continue")
    assert code == 2 and err == ("iris-desktop: thread 1 ends with a message, not a reply; there is nothing "
                                 "to continue (send a message with 'iris-desktop chat --thread 1 …')\n")

    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"title": "empty", "messages": [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "", "status": "error"}]}))
    assert run_cli(capsys, "--data-dir", data, "import", empty)[0] == 0
    code, _, err = run_cli(capsys, "--data-dir", data, "chat", "--thread", "2", "--continue")
    assert code == 2 and err == ("iris-desktop: thread 2's last reply is empty; there is nothing to continue: "
                                 "'iris-desktop chat --thread 2 --regenerate' writes it again\n")


def test_continue_says_why_on_an_empty_thread_and_after_tool_calls(capsys, tmp_path):
    """A review: an empty chat was said to end "with a message", and a stopped reply that
    asked for tools was said to be "complete"."""
    data = tmp_path / "data"
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps({"title": "tools", "messages": [
        {"role": "user", "content": "List the files."},
        {"role": "assistant", "content": "Looking.", "status": "interrupted", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "list_files", "arguments": "{}"}}]}]}))
    assert run_cli(capsys, "--data-dir", data, "import", tools)[0] == 0
    code, _, err = run_cli(capsys, "--data-dir", data, "chat", "--thread", "1", "--continue")
    assert code == 2 and err == ("iris-desktop: thread 1's last reply asked for tools, which a reply cannot go "
                                 "on from; there is nothing to continue: 'iris-desktop chat --thread 1 "
                                 "--regenerate' writes it again\n")
    with Store(data / "iris.db") as store:
        empty = store.create_thread("empty")
    code, _, err = run_cli(capsys, "--data-dir", data, "chat", "--thread", str(empty), "--continue")
    assert code == 2 and err == f"iris-desktop: thread {empty} has no messages yet; there is nothing to continue\n"
