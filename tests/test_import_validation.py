"""Imports that other tools write, or that are hostile, and special files (issue #44,
items 4, 10 and 11): what import accepts is what every later read can trust.

- OpenAI content parts (``"content": [{"type": "text", …}]``) become the message's text;
  a part that is not text is refused in one sentence; a thread an older Iris stored with
  parts reads as text, so ``context`` and ``chat`` work on it.
- A branched export's tool result must answer a call on its own branch; an
  ``attachments`` record must be one Iris could have written.
- A device (``/dev/zero``), a named pipe or anything else that is not a regular file is
  refused by its type, never read, and never more than the limit + 1 bytes are read.

The real CLI (in-process, or as a subprocess with a timeout and a memory limit where
the fault was a hang or memory exhausted), real files, a real FIFO, the real SQLite
store and the bundled model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from iris_desktop.core.attachments import (
    MAX_ATTACHMENT_BYTES,
    AttachmentError,
    read_attachment,
)
from iris_desktop.core.conversation import ConversationFormatError, read_text_file
from iris_desktop.core.store import Store
from iris_desktop.core.views import load_transcript

from support.helpers import one_sentence
from support.helpers import run_cli as run

REPO = Path(__file__).resolve().parents[1]
#: a command that hangs on a special file shows as this timeout, not as a stuck suite
DEADLINE_S = 60
#: the address space a subprocess gets: /dev/zero read to the end fails fast, not the box
MEMORY_LIMIT = 1 << 30
POSIX = os.name == "posix"


def iris(data: Path, *args: str, limit_memory: bool = True) -> subprocess.CompletedProcess:
    """``iris-desktop --data-dir DATA ARGS`` as a subprocess (the stack as deep as the
    user's) with a deadline and, on POSIX, a memory limit unless it loads a model."""
    def limit():
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    return subprocess.run([sys.executable, "-m", "iris_desktop", "--data-dir", str(data),
                           *map(str, args)], capture_output=True, text=True, timeout=DEADLINE_S,
                          cwd=REPO, preexec_fn=limit if POSIX and limit_memory else None)


def nested(depth: int) -> list:
    """Lists ``depth`` levels deep, built without recursion."""
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def write_json(path: Path, value) -> Path:
    path.write_text(json.dumps(value), encoding="utf-8")
    return path


def threads(capsys, data: Path) -> list:
    code, out, err = run(capsys, "--data-dir", data, "threads", "--json", "--no-model")
    assert code == 0, err
    return json.loads(out)


def model_args(model_path: Path) -> list[str]:
    return ["--set", f"model.path={model_path}", "--set", "model.n_ctx=4096",
            "--set", "context.window=4096", "--set", "context.recall_semantic=false"]


# -- 1. OpenAI content parts ------------------------------------------------------------------


PARTS_CHAT = [
    {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
    {"role": "user", "content": [{"type": "text", "text": "What is a walrus?"},
                                 {"type": "input_text", "text": "Answer in one line."}]},
    {"role": "assistant", "content": [{"type": "output_text", "text": "A large marine mammal."}]},
    {"role": "user", "content": [{"type": "text", "text": "And a narwhal?"}]},
]
PARTS_TEXT = ["Be brief.", "What is a walrus?\nAnswer in one line.", "A large marine mammal.",
              "And a narwhal?"]


def test_content_parts_import_as_text_and_context_plans_the_thread(capsys, tmp_path, model_path):
    """Before: the import succeeded and every ``context`` (and ``chat``, ``compact``) on
    the thread failed with "TypeError: can only concatenate str (not "list") to str"."""
    data = tmp_path / "data"
    source = write_json(tmp_path / "parts.json", PARTS_CHAT)
    code, out, err = run(capsys, "--data-dir", data, "import", source)
    assert code == 0, err
    thread = out.strip()
    code, out, err = run(capsys, "--data-dir", data, *model_args(model_path), "context", thread,
                         "--json", "--show-request")
    assert code == 0 and not err.strip(), err
    context = json.loads(out)
    assert context["counter"].startswith("model:")  # counted as the chat template renders it
    assert [m["content"] for m in context["request"]] == PARTS_TEXT
    code, out, err = run(capsys, "--data-dir", data, "export", thread)
    assert [m["content"] for m in json.loads(out)["messages"]] == PARTS_TEXT  # stored as the text


def old_iris_thread(data: Path, messages: list[dict]) -> int:
    """A thread as an Iris before this change stored an import: content parts kept as
    a list (``content_is_json``), other keys as they came."""
    store = Store(data / "iris.db")
    try:
        with store.transaction():
            thread = store.create_thread("Stored by an older Iris")
            store.add_messages(thread, messages)
        assert store.messages(thread)[0]["content_is_json"] == 1
        return thread
    finally:
        store.close()


def test_a_thread_an_older_iris_stored_with_content_parts_reads_as_text(capsys, tmp_path,
                                                                         model_path):
    data = tmp_path / "data"
    assert run(capsys, "--data-dir", data, "threads", "--no-model")[0] == 0  # the database
    picture = {"role": "user", "content": [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}
    thread = old_iris_thread(data, [*PARTS_CHAT[:3], picture])
    code, out, err = run(capsys, "--data-dir", data, *model_args(model_path), "context", thread,
                         "--json", "--show-request")
    assert code == 0 and not err.strip(), err
    request = [m["content"] for m in json.loads(out)["request"]]
    assert request[1:3] == PARTS_TEXT[1:3]
    assert request[-1] == "What is in this picture?\n[an image part left out: Iris reads text only]"
    code, out, err = run(capsys, "--data-dir", data, "export", thread)
    assert all(isinstance(m["content"], str) for m in json.loads(out)["messages"]), out


def test_an_older_iris_s_system_message_stored_as_parts_reaches_the_model_as_text(capsys, tmp_path):
    """The chat's leading system message is read by the engine itself (it is pinned):
    stored as a list by an older Iris, it reached the model as raw JSON text."""
    data = tmp_path / "data"
    assert run(capsys, "--data-dir", data, "threads", "--no-model")[0] == 0
    thread = old_iris_thread(data, [
        {"role": "system", "content": [{"type": "text", "text": "Answer like a pirate."}]},
        {"role": "user", "content": "Hello"}])
    code, out, err = run(capsys, "--data-dir", data, "context", thread, "--json", "--show-request",
                         "--no-model")
    assert code == 0, err
    system = json.loads(out)["request"][0]["content"]
    assert system.startswith("Answer like a pirate.") and '"type"' not in system


HOSTILE_PARTS = {
    "an image": ([{"type": "text", "text": "Look:"},
                  {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}],
                 "message index 2 holds an image part (part 2, 'image_url'); Iris reads text only"),
    "audio": ([{"type": "input_audio", "input_audio": {"data": "UklGR", "format": "wav"}}],
              "message index 2 holds an audio part (part 1, 'input_audio'); Iris reads text only"),
    "a file": ([{"type": "file", "file": {"file_id": "file-1"}}],
               "message index 2 holds a file part (part 1, 'file')"),
    "an unknown type": ([{"type": "tool_use", "id": "x"}],
                        "content part 1 is of type 'tool_use', which Iris cannot read"),
    "a bare string": (["hello"], "content part 1 is not a content part"),
    "a text part without text": ([{"type": "text", "text": 5}],
                                 "content part 1 ('text') has no 'text' string"),
    "nested lists": (nested(50), "content part 1 is not a content part"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_PARTS))
def test_content_parts_that_are_not_text_are_refused_naming_the_message(capsys, tmp_path, case):
    content, words = HOSTILE_PARTS[case]
    source = write_json(tmp_path / "chat.json", [*PARTS_CHAT[:2], {"role": "user", "content": content}])
    code, _, err = run(capsys, "--data-dir", tmp_path / "data", "import", source)
    assert code == 2 and one_sentence(err) and "nothing was written" in err, err
    assert words in err, err
    assert threads(capsys, tmp_path / "data") == []


def test_values_nested_980_levels_deep_are_refused(capsys, tmp_path, model_path):
    """Content 980 levels deep imported and every later read failed (the TypeError), and
    so did any other value that deep ("RecursionError … while decoding a JSON array"): now
    both are refused at import, and a thread an older Iris stored so still plans (the
    value is left out of what is read). The CLI runs as a subprocess: at the user's stack
    depth, as the user met it."""
    data = tmp_path / "data"
    deep = "[" * 980 + "]" * 980
    (tmp_path / "content.json").write_text('[{"role": "user", "content": ' + deep + "}]")
    done = iris(data, "import", tmp_path / "content.json")
    assert done.returncode == 2 and one_sentence(done.stderr), done.stderr
    assert "message index 0: content part 1 is not a content part" in done.stderr
    (tmp_path / "meta.json").write_text('[{"role": "user", "content": "hi", "meta": ' + deep + "}]")
    done = iris(data, "import", tmp_path / "meta.json")
    assert done.returncode == 2 and one_sentence(done.stderr), done.stderr
    assert "message index 0: nested more than 64 levels deep" in done.stderr
    assert threads(capsys, data) == []
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(limit + 2000)  # only to write the row as an older Iris could
    try:
        thread = old_iris_thread(data, [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": "Hello.", "meta": nested(980)}])
    finally:
        sys.setrecursionlimit(limit)
    done = iris(data, *model_args(model_path), "context", thread, "--json", "--show-request",
                limit_memory=False)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
    assert [m["content"] for m in json.loads(done.stdout)["request"]][-2:] == ["hi", "Hello."]


# -- 2. what a branched export and an attachments record may hold --------------------------


def node(message_id: int, parent: int | None, active: bool) -> dict:
    return {"iris": {"id": message_id, "parent_id": parent, "active": active}}


def call(call_id: str) -> dict:
    return {"id": call_id, "type": "function",
            "function": {"name": "list_dir", "arguments": "{\"path\": \".\"}"}}


def branched(result_parent: int) -> dict:
    """A branched export: reply 2 called c1 (answered by 3), its sibling 5 made no call;
    message 6, a result for c1, sits below ``result_parent`` (2 or 5), on the active
    branch."""
    active = {1, result_parent, 6}
    return {"format": "iris-branches", "title": "Files", "messages": [
        {"role": "user", "content": "Which files are here?", **node(1, None, 1 in active)},
        {"role": "assistant", "content": None, "tool_calls": [call("c1")],
         **node(2, 1, 2 in active)},
        {"role": "tool", "tool_call_id": "c1", "name": "list_dir", "content": "a.txt",
         **node(3, 2, False)},
        {"role": "assistant", "content": "One file: a.txt.", **node(4, 3, False)},
        {"role": "assistant", "content": "Let me look.", **node(5, 1, 5 in active)},
        {"role": "tool", "tool_call_id": "c1", "name": "list_dir", "content": "b.txt",
         **node(6, result_parent, True)},
    ]}


def test_a_tool_result_whose_call_is_on_another_branch_is_refused(capsys, tmp_path):
    data = tmp_path / "data"
    source = write_json(tmp_path / "other-branch.json", branched(result_parent=5))
    code, _, err = run(capsys, "--data-dir", data, "import", source)
    assert code == 2 and one_sentence(err) and "nothing was written" in err, err
    assert "messages[5]: tool result 'c1' answers a call made on another branch" in err
    assert threads(capsys, data) == []
    # below its call, on its own branch, the same result is a tree that imports and exports
    source = write_json(tmp_path / "same-branch.json", branched(result_parent=2))
    code, out, err = run(capsys, "--data-dir", data, "import", source)
    assert code == 0, err
    code, out, err = run(capsys, "--data-dir", data, "export", out.strip())
    exported = json.loads(out)
    assert {exported.pop(key) for key in ("created_at", "updated_at")}  # the chat's own times
    assert exported == json.loads(source.read_text())


def iris_attachments(files=None, text_chars=5) -> dict:
    return {"text_chars": text_chars,
            "files": files if files is not None else [{"name": "a.csv", "bytes": 9, "tokens": 6}]}


ATTACHED = 'Count\n\n<file name="a.csv">\nlemon,3\n\n</file>'
HOSTILE_RECORDS = {
    "a list": ([{"name": "a.csv"}], "it is a list, not an object"),
    "an extra key": ({**iris_attachments(), "script": "x"},
                     "it must hold exactly 'text_chars' and 'files'"),
    "text_chars as text": (iris_attachments(text_chars="5"), "'text_chars' must be a whole number"),
    "text_chars past the text": (iris_attachments(text_chars=10**9),
                                 "'text_chars' must be a whole number from 0 to"),
    "files an object": (iris_attachments(files={"name": "a.csv"}), "'files' must be a list"),
    "no files": (iris_attachments(files=[]), "'files' must be a list of 1 to 1,000 files"),
    "too many files": (iris_attachments(files=[{"name": "a", "bytes": 0}] * 1001),
                       "'files' must be a list of 1 to 1,000 files"),
    "a file that is a number": (iris_attachments(files=[7]), "file 1 is a number, not an object"),
    "tokens as a list": (iris_attachments(files=[{"name": "a.csv", "bytes": 9, "tokens": [1]}]),
                         "file 1's 'tokens' must be a whole number"),
    "negative bytes": (iris_attachments(files=[{"name": "a.csv", "bytes": -1}]),
                       "file 1's 'bytes' must be a whole number"),
    "a bool for bytes": (iris_attachments(files=[{"name": "a.csv", "bytes": True}]),
                         "file 1's 'bytes' must be a whole number"),
    "more bytes than a file may have": (
        iris_attachments(files=[{"name": "a.csv", "bytes": MAX_ATTACHMENT_BYTES + 1}]),
        "file 1's 'bytes' must be a whole number from 0 to 8,388,608"),
    "more bytes than the text": (iris_attachments(files=[{"name": "a.csv", "bytes": 5000}]),
                                 "its files add up to 5,000 bytes, more than the message's text"),
    "a name of 10,000 characters": (iris_attachments(files=[{"name": "n" * 10_000, "bytes": 9}]),
                                    "file 1's name must be text of 1 to 255 characters"),
    "a name that is a path": (iris_attachments(files=[{"name": "../../etc/passwd", "bytes": 9}]),
                              "file 1's name holds a '/' or a NUL"),
    "an empty name": (iris_attachments(files=[{"name": " ", "bytes": 9}]),
                      "file 1's name must be text"),
    "no name": (iris_attachments(files=[{"bytes": 9}]), "file 1 must hold 'name', 'bytes'"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_RECORDS))
def test_a_hostile_attachments_record_is_refused_in_one_sentence(capsys, tmp_path, case):
    record, words = HOSTILE_RECORDS[case]
    source = write_json(tmp_path / "chat.json",
                        [{"role": "user", "content": ATTACHED, "attachments": record}])
    code, _, err = run(capsys, "--data-dir", tmp_path / "data", "import", source)
    assert code == 2 and one_sentence(err) and "nothing was written" in err, err
    assert "message index 0: its 'attachments' is not a record of attached files" in err, err
    assert words in err, err
    assert threads(capsys, tmp_path / "data") == []


def test_an_iris_record_imports_and_a_hostile_one_stored_before_still_opens_its_chat(
        capsys, tmp_path):
    """What Iris writes imports and shows its chip. A hostile record an older Iris let in
    made the app open the chat empty, the error only in the log: the transcript is read
    whatever the record holds."""
    data = tmp_path / "data"
    source = write_json(tmp_path / "chat.json",
                        [{"role": "user", "content": ATTACHED, "attachments": iris_attachments()}])
    code, out, err = run(capsys, "--data-dir", data, "import", source)
    assert code == 0, err
    store = Store(data / "iris.db")
    try:
        (entry,) = load_transcript(store, int(out))
        assert entry.text == "Count" and entry.attachments == [("a.csv", 6)]
        with store.transaction():
            thread = store.create_thread("Hostile")
            store.add_messages(thread, [
                {"role": "user", "content": ATTACHED, "attachments": {
                    "text_chars": "all", "files": [
                        {"name": ["x"], "tokens": [1], "bytes": "many"},
                        {"name": "n" * 10_000, "tokens": 10**30},
                        "not a file"]}},
                {"role": "assistant", "content": "Three lemons."}])
        entries = load_transcript(store, thread)
    finally:
        store.close()
    assert [e.text for e in entries] == [ATTACHED, "Three lemons."]
    assert entries[0].attachments == [("file", 0), ("n" * 255, 10**30)]


# -- 3. special files: refused by their type, never read; never past the limit ----------------


needs_posix = pytest.mark.skipif(not POSIX, reason="devices and named pipes of POSIX")


@needs_posix
@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_import_of_a_device_is_refused_by_its_type(tmp_path, device):
    """Before: read until memory ran out."""
    done = iris(tmp_path / "data", "import", device)
    assert done.returncode == 2 and one_sentence(done.stderr), done.stderr
    assert f"{device} is a character device, not a regular file; give a file" in done.stderr
    assert "nothing was written" in done.stderr


@needs_posix
def test_import_chat_file_and_attach_of_a_fifo_never_block(tmp_path):
    """Before: opening the pipe waited for a writer forever."""
    fifo = tmp_path / "chat.json"
    os.mkfifo(fifo)
    data = tmp_path / "data"
    for args, words in (
            (["import", str(fifo)], "import refused, nothing was written: "),
            (["chat", "--new", "--file", str(fifo)], "--file: "),
            (["chat", "--new", "--attach", str(fifo), "hello"], "--attach: ")):
        done = iris(data, *args)
        assert done.returncode == 2 and one_sentence(done.stderr), done.stderr
        assert words in done.stderr and "is a named pipe (FIFO), not a regular file" in done.stderr
    assert fifo.is_fifo()


@needs_posix
def test_attaching_a_device_is_refused_before_anything_is_sent(tmp_path):
    done = iris(tmp_path / "data", "chat", "--new", "--attach", "/dev/zero", "hello")
    assert done.returncode == 2 and one_sentence(done.stderr), done.stderr
    assert "--attach: zero is a character device, not a regular file; attach a file" in done.stderr
    assert "nothing was sent or stored" in done.stderr


@needs_posix
def test_special_files_are_refused_by_the_readers_themselves(tmp_path):
    """In-process, only what cannot hang or fill memory when read (the named pipe and
    /dev/zero are the subprocess tests above): /dev/null (it read as an empty file) and
    a socket."""
    import socket

    sock_path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(sock_path))
        for path, kind in ((Path("/dev/null"), "a character device"), (sock_path, "a socket")):
            with pytest.raises(AttachmentError, match=f"{kind}, not a regular file; attach a file"):
                read_attachment(path)
            with pytest.raises(ConversationFormatError, match=f"{kind}, not a regular file; give"):
                read_text_file(path, 1000)


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="Linux's /proc")
def test_a_file_larger_than_its_size_says_is_read_only_to_the_limit(tmp_path):
    """A regular file whose size changes while it is read (``/proc`` files say 0 bytes
    and hold more) is read to the limit + 1 byte and refused, not read to its end."""
    assert os.stat("/proc/self/status").st_size == 0
    with pytest.raises(AttachmentError, match="status grew past the 100 bytes a file may have"):
        read_attachment("/proc/self/status", limit=100)
    with pytest.raises(ConversationFormatError, match="grew past the limit of 100 bytes"):
        read_text_file(Path("/proc/self/status"), 100)
    assert read_attachment("/proc/self/status").text.startswith("Name:")
