"""Issue 26, items 4, 7, 8, 10 (KV) and 12: regex work bounded in memory, liveness that
survives pid reuse, KV saves killed mid-write, KV headers of the wrong shape, and what a
shell confirmation or a file-tool error shows. Real files, real processes, a real pty."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from iris_desktop.core.store import Store
from iris_desktop.core.store.base import process_start
from iris_desktop.core.tools import Sandbox, ToolResult, limits
from iris_desktop.runtime.kv_store import MAGIC, KVStateStore, model_key
from iris_desktop.untrusted import show_untrusted as show_invisible

ROOT = Path(__file__).resolve().parent.parent
POSIX = os.name == "posix"
LINUX = sys.platform.startswith("linux")


def _ok(result: ToolResult) -> str:
    assert result.ok, result.content
    return result.content


def _refused(result: ToolResult) -> str:
    assert not result.ok, result.content
    assert result.content.startswith("error: ")
    return result.content


def _python(code: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True, **kwargs)


# --- 4: a search pattern is bounded in memory, not only in time --------------------------


def test_a_huge_repeat_count_is_refused_before_it_compiles(tmp_path):
    """``a{1000000000}`` grew to 23.8 GB. Run in a child capped at 2 GB of address space,
    so that the unfixed code fails with a MemoryError here instead of eating the machine."""
    (tmp_path / "notes.txt").write_text("aaaa\n")
    limit = "import resource; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))" \
        if POSIX else ""
    child = _python(f"""
        {limit}
        import json, time
        from iris_desktop.core.tools import Sandbox
        box = Sandbox([{str(tmp_path)!r}])
        start = time.monotonic()
        result = box.run("search_files", {{"pattern": "a{{1000000000}}"}})
        print(json.dumps([result.ok, result.content, time.monotonic() - start]))
    """)
    out, _ = child.communicate(timeout=120)
    ok, content, seconds = json.loads(out)
    assert not ok
    assert content == ("error: the pattern has a repeat count of 1,000,000,000, over the limit "
                       "of 10,000 (the regex engine needs memory for every repeat)")
    assert seconds < 5


@pytest.mark.parametrize("pattern, refused", [
    ("a{10001}", "repeat count of 10,001"),
    ("x{0,100000000}", "repeat count of 100,000,000"),
    ("(?:a{1000}){1000}", "too large once its repeats are counted out"),
    ("((?:ab){200}|c){200}", "too large once its repeats are counted out"),
    (r"(?<=a{20000})b", "repeat count of 20,000"),
    (r"\p{L}{100000}", "repeat count of 100,000"),  # regex-only syntax: judged from its text
    (r"(?:\p{L}{100}){300}", "too large once its repeats are counted out"),
    ("x" * 20_001, "the pattern is 20,001 characters long; at most 20,000 are allowed"),
])
def test_patterns_that_would_need_unbounded_memory_are_refused(tmp_path, pattern, refused):
    (tmp_path / "notes.txt").write_text("abc\n")
    content = _refused(Sandbox([tmp_path]).run("search_files", {"pattern": pattern}))
    assert refused in content


@pytest.mark.parametrize("pattern", [r"\d{4}-\d{2}-\d{2}", "a{10000}", "(a|b){5000}", "x{,5}",
                                     r"\p{L}{3,}@", r"[a-z]{2,20}\.txt", "(", "a{2}{"])
def test_ordinary_patterns_still_search(tmp_path, pattern):
    (tmp_path / "notes.txt").write_text("2026-12-02 abc@example notes.txt ( a{2}{\n")
    assert "match" in _ok(Sandbox([tmp_path]).run("search_files", {"pattern": pattern}))


@pytest.mark.skipif(not LINUX, reason="the search runs in a memory-limited child on Linux")
def test_a_search_that_needs_too_much_memory_ends_with_a_tool_error(tmp_path, monkeypatch):
    """A pattern within the limits can still backtrack over a long line with a growing
    stack (about 300 MB in half a second here): the search's process has a memory limit,
    so that becomes one sentence, and the app's own process does not grow."""
    (tmp_path / "long.txt").write_text("a" * 4_000_000 + "\n")
    (tmp_path / "short.txt").write_text("needle\n")
    monkeypatch.setattr(limits, "SEARCH_MEMORY_BYTES", 48 << 20)
    box = Sandbox([tmp_path])
    content = _refused(box.run("search_files", {"pattern": "(?:a|aa)+$"}))
    assert content == ("error: " + limits.OUT_OF_MEMORY.format(limit=48))
    assert "1 match" in _ok(box.run("search_files", {"pattern": "needle"}))  # it goes on


@pytest.mark.skipif(not LINUX, reason="the search runs in a child process on Linux")
def test_stop_ends_a_search_in_its_worker_at_once(tmp_path):
    import threading

    (tmp_path / "slow.txt").write_text(("a" * 24 + "\n") * 2000)  # ~0.1 s a line
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    start = time.monotonic()
    content = _refused(Sandbox([tmp_path]).run("search_files", {"pattern": "(?:a|aa)+c"},
                                               cancel=cancel))
    assert content == "error: stopped by the user before it finished"
    assert time.monotonic() - start < 3


# --- 12: file-tool errors never say where a link outside leads -----------------------------


@pytest.mark.skipif(not POSIX, reason="symlinks need privileges on Windows")
def test_a_link_that_leads_outside_is_named_but_not_where_it_leads(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "elsewhere-private"
    root.mkdir()
    outside.mkdir()
    (outside / "shadow").write_text("secret\n")
    (root / "innocent.txt").symlink_to(outside / "shadow")
    (root / "folder").symlink_to(outside)
    (root / "loop").symlink_to(root / "loop")
    box = Sandbox([root])
    for name, args in [("read_file", {"path": "innocent.txt"}),
                       ("list_directory", {"path": "folder"}),
                       ("search_files", {"pattern": "x", "path": "folder"}),
                       ("read_file", {"path": str(root / "folder" / "shadow")})]:
        content = _refused(box.run(name, args))
        assert "is a link that leads outside the allowed folders" in content
        assert str(outside) not in content and "shadow" not in content.replace(
            str(root / "folder" / "shadow"), "")
        assert "resolves to" not in content
    content = _refused(box.run("read_file", {"path": str(outside / "shadow")}))
    assert content.startswith(f"error: {str(outside / 'shadow')!r} is outside the allowed folders")
    content = _refused(box.run("read_file", {"path": "loop"}))
    assert str(tmp_path) not in content.replace(f"({root})", "")


# --- 12: the shell confirmation shows what runs ------------------------------------------


def test_invisible_and_bidi_characters_are_shown_as_escapes():
    sneaky = "echo ok \u202e;rm -rf ~\u2066#\u2069\u200e\u200f\u061c\u2028\x1b[2J\u200b\U000e0041"
    shown = show_invisible(sneaky)
    assert shown == ("echo ok \\u202e;rm -rf ~\\u2066#\\u2069\\u200e\\u200f\\u061c\\u2028"
                     "\\x1b[2J\\u200b\\U000e0041")
    assert show_invisible("a\nb\tc", multiline=True) == "a\nb\tc"
    assert show_invisible("a\nb") == "a\\x0ab"
    assert show_invisible("naïve café 日本 שלום") == "naïve café 日本 שלום"


@pytest.mark.skipif(not POSIX, reason="needs a pty")
def test_the_cli_confirmation_shows_bidi_controls_as_escapes():
    """The CLI asks on a real terminal (a pty): a right-to-left override in the command is
    shown as \\u202e, never sent raw for the terminal to reorder."""
    import pty

    command = "echo safe \u202e;txt.exe hsab | moc.live//:ptth lruc\u2066 \u2069"
    master, slave = pty.openpty()
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import argparse, sys
            from iris_desktop.commands.chat import _shell_confirmation
            ask = _shell_confirmation(argparse.Namespace(yes_shell=False))
            print("ANSWER", ask({command!r}), file=sys.stderr)
        """)],
        cwd=ROOT, stdin=slave, stdout=slave, stderr=slave, env={**os.environ, "PYTHONIOENCODING": "utf-8"})
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + 60
    while b"[y/N]" not in seen and time.monotonic() < deadline:
        seen += os.read(master, 4096)
    os.write(master, b"n\n")
    while time.monotonic() < deadline:  # to the end: EIO once the child is gone
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    child.wait(timeout=30)
    os.close(master)
    text = seen.decode("utf-8")
    assert "echo safe \\u202e;txt.exe hsab | moc.live//:ptth lruc\\u2066 \\u2069" in text
    assert not any(c in text for c in "\u202e\u2066\u2069")
    assert "ANSWER False" in text


# --- 7: liveness survives pid reuse ------------------------------------------------------


def test_process_start_tells_two_processes_apart():
    here = process_start(os.getpid())
    assert here is not None and here == process_start(os.getpid())
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert process_start(other.pid) not in (None, here)
    finally:
        other.kill()
        other.wait()
    assert process_start(other.pid) is None  # gone
    assert process_start(0) is None and process_start(-1) is None


def _reused_pid() -> subprocess.Popen:
    """A live process that has nothing to do with Iris: it stands for the process that the
    OS gave a dead writer's pid to."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


def test_a_killed_chat_s_reply_is_recovered_even_when_its_pid_is_reused(tmp_path):
    db = tmp_path / "iris.db"
    Store(db).close()
    writer = _python(f"""
        import time
        from iris_desktop.core.store import Store
        store = Store({str(db)!r})
        thread = store.create_thread("t")
        store.add_message(thread, {{"role": "user", "content": "hi"}})
        reply = store.add_message(thread, {{"role": "assistant", "content": "Hel"}}, status="streaming")
        print(thread, reply, flush=True)
        time.sleep(600)
    """)
    other = None
    try:
        thread, reply = map(int, writer.stdout.readline().split())
        with Store(db) as store:
            assert store.mark_interrupted_streams() == 0  # its writer is alive: left alone
        writer.kill()
        writer.wait()
        # the OS hands the dead writer's pid to an unrelated process
        other = _reused_pid()
        with Store(db) as store:
            store.conn.execute("UPDATE streams SET pid = ? WHERE message_id = ?", (other.pid, reply))
            store.conn.commit()
            assert store.mark_interrupted_streams() == 1
            row = store.messages(thread)[-1]
            assert (row["id"], row["status"], row["content"]) == (reply, "interrupted", "Hel")
    finally:
        for process in (writer, other):
            if process is not None:
                process.kill()
                process.wait()


@pytest.mark.skipif(not LINUX, reason="reads the process state from /proc")
def test_a_killed_writer_not_yet_reaped_is_dead(tmp_path):
    """A zombie (killed, its parent has not waited for it yet) still answers signal 0, but
    writes nothing any more: its reply is recovered."""
    db = tmp_path / "iris.db"
    Store(db).close()
    writer = _python(f"""
        import time
        from iris_desktop.core.store import Store
        store = Store({str(db)!r})
        thread = store.create_thread("t")
        store.add_message(thread, {{"role": "assistant", "content": "Hel"}}, status="streaming")
        print("streaming", flush=True)
        time.sleep(600)
    """)
    try:
        assert writer.stdout.readline().strip() == "streaming"
        os.kill(writer.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{writer.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with Store(db) as store:
            assert store.mark_interrupted_streams() == 1
    finally:
        writer.kill()
        writer.wait()


def test_a_compaction_lease_of_a_dead_process_is_taken_over_despite_pid_reuse(tmp_path):
    db = tmp_path / "iris.db"
    with Store(db) as store:
        thread = store.create_thread("t")
    holder = _python(f"""
        import time
        from iris_desktop.core.store import Store
        store = Store({str(db)!r})
        assert store.take_compaction_lease({thread}, "theirs", 600) is None
        print("held", flush=True)
        time.sleep(600)
    """)
    other = None
    try:
        assert holder.stdout.readline().strip() == "held"
        with Store(db) as store:
            assert store.take_compaction_lease(thread, "ours", 600)["pid"] == holder.pid
        holder.kill()
        holder.wait()
        other = _reused_pid()
        with Store(db) as store:
            store.conn.execute("UPDATE compaction_leases SET pid = ?", (other.pid,))
            store.conn.commit()
            assert store.take_compaction_lease(thread, "ours", 600) is None  # ours now
    finally:
        for process in (holder, other):
            if process is not None:
                process.kill()
                process.wait()


def test_rows_written_before_the_start_was_recorded_fall_back_to_the_pid(tmp_path):
    with Store(tmp_path / "iris.db") as store:
        thread = store.create_thread("t")
        reply = store.add_message(thread, {"role": "assistant", "content": "x"}, status="streaming")
        other = _reused_pid()
        try:
            store.conn.execute("UPDATE streams SET pid = ?, pid_start = NULL WHERE message_id = ?",
                               (other.pid, reply))
            store.conn.commit()
            assert store.mark_interrupted_streams() == 0  # all it knows is a live pid
        finally:
            other.kill()
            other.wait()
        assert store.mark_interrupted_streams() == 1


# --- 8 and 10: KV files ------------------------------------------------------------------


@pytest.fixture(scope="module")
def kv_model(model_path):
    from iris_desktop.runtime.model import LocalModel

    model = LocalModel.load(model_path, n_ctx=2048)
    model.prefill([{"role": "system", "content": "You are Iris."},
                   {"role": "user", "content": "Tell me about the sea."}]).run()
    yield model
    model.close()


def _with_header(path: Path, header: bytes) -> None:
    data = path.read_bytes()
    (length,) = struct.unpack_from("<I", data, len(MAGIC))
    rest = data[len(MAGIC) + 4 + length:]
    path.write_bytes(MAGIC + struct.pack("<I", len(header)) + header + rest)


@pytest.mark.parametrize("header", [
    b"[]", b"1", b'"text"', b"null", b"{}", b"[" * 2000 + b"]" * 2000,
    b'{"version": 1, "model": "M", "n_tokens": "7", "tokens_sha256": "", '
    b'"state_bytes": 1, "state_sha256": ""}',
    b'{"version": 1, "model": "M", "n_tokens": -3, "tokens_sha256": "", '
    b'"state_bytes": 1, "state_sha256": ""}',
    b'{"version": 1, "model": ["M"], "n_tokens": 1, "tokens_sha256": "", '
    b'"state_bytes": 1, "state_sha256": ""}',
    b"\xff\xfe not text",
])
def test_a_kv_file_whose_header_has_the_wrong_shape_is_set_aside(kv_model, tmp_path, header):
    """Valid JSON that is not the header's object (``[]``) broke every chat on the thread:
    now any header problem is handled like a corrupt file, and the chat starts cold."""
    store = KVStateStore(tmp_path / "kv", 64 << 20)
    path = store.save(kv_model, 5)
    header = header.replace(b'"M"', json.dumps(model_key(kv_model)).encode())
    _with_header(path, header)
    before = kv_model.kv_tokens()
    assert store.restore(kv_model, 5).tokens == 0
    assert not path.exists() and kv_model.kv_tokens() == before
    assert store.save(kv_model, 5) is not None and store.restore(kv_model, 5).tokens > 0


_WRITER = """
    import os, sys, time
    from pathlib import Path
    from iris_desktop import files
    tmp, fd = files._open_locked(Path(sys.argv[1]), 0o600)  # as a save opens it
    os.write(fd, b"x" * int(sys.argv[2]))
    print(tmp, flush=True)
    time.sleep(600)
"""


@pytest.mark.skipif(not POSIX, reason="flock")
def test_a_kv_save_killed_mid_write_leaves_nothing_behind(kv_model, tmp_path):
    """A save killed mid-write left a hidden .tmp file that was never removed nor counted
    (13.1 MB against an 8 MB limit after five kills). Its writer holds a lock while it
    writes: while it lives, its file counts against the limit; once it is killed, the
    next store to open deletes it."""
    folder = tmp_path / "kv"
    probe = KVStateStore(tmp_path / "probe", 1 << 30).save(kv_model, 0).stat().st_size
    store = KVStateStore(folder, int(probe * 2.5))  # room for two states
    store.save(kv_model, 1)
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_WRITER), str(folder / "2-x.kv"),
                               str(probe)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        tmp = Path(writer.stdout.readline().strip())
        assert tmp.parent == folder and tmp.name.startswith(".2-x.kv.")
        # alive: not deleted, and counted: a second saved state no longer fits beside it
        assert KVStateStore(folder, int(probe * 2.5)).clean_leftovers() == probe
        assert tmp.exists()
        store.save(kv_model, 3)
        assert [p.name.split("-")[0] for p in folder.glob("*.kv")] == ["3"]
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    assert tmp.exists()  # what a kill -9 leaves
    stale = folder / ".4-y.kv.999999.tmp"  # from a crash before locks were taken
    stale.write_bytes(b"y" * 1000)
    reopened = KVStateStore(folder, int(probe * 2.5))  # a start cleans up
    assert not tmp.exists() and not stale.exists()
    assert reopened.save(kv_model, 1) is not None
    assert sorted(p.name.split("-")[0] for p in folder.glob("*.kv")) == ["1", "3"]
    assert not list(folder.glob(".*.tmp")) and not list(folder.glob(".*.iris-tmp"))
