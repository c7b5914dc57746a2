"""Hostile places and inputs: each ends in one clear sentence and a documented exit code,
never a traceback, and a damaged database is never written.

Permissions: tests may run as root, for whom mode bits restrict nothing. Where a test
needs a file or folder that cannot be written, :func:`unwritable` makes it so for real:
``chattr +i`` (the immutable flag, which binds root too) when running as root, ``chmod``
otherwise; it skips when neither can restrict this user. One test also forces the path
past the up-front check (``os.access`` patched to say yes) to show that SQLite's own
error is explained too.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from iris_desktop.core import store as store_module

from conftest import AGENT_FILES, SYNTHETIC_CHAT, load_corpus
from support.fakes import ScriptedRuntime
from support.faults import damage_pages
from support.helpers import one_sentence
from support.helpers import run_cli as run
from support.windows import run_gui_recording

POSIX = pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX only")
IS_ROOT = os.name == "posix" and os.geteuid() == 0


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@contextlib.contextmanager
def unwritable(path: Path):
    """Make ``path`` unwritable for this user, for real (see the module docstring)."""
    if IS_ROOT:
        if shutil.which("chattr") is None or subprocess.run(
                ["chattr", "+i", str(path)], capture_output=True).returncode != 0:
            pytest.skip(reason="running as root without a working chattr: nothing can be made unwritable")
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        return
    mode = stat.S_IMODE(path.stat().st_mode)
    os.chmod(path, mode & ~0o222)
    try:
        yield
    finally:
        os.chmod(path, mode)


class Runtime(ScriptedRuntime):
    """ScriptedRuntime as host.load_runtime returns it (the host closes its model)."""

    def close(self) -> None:
        pass


@pytest.fixture
def scripted(monkeypatch):
    """``chat`` answers with a ScriptedRuntime instead of loading a GGUF."""
    runtimes: list[Runtime] = []

    def install(*replies: str, n_ctx: int = 8192) -> Runtime:
        runtime = Runtime(list(replies), n_ctx=n_ctx)
        runtimes.append(runtime)
        monkeypatch.setattr("iris_desktop.host.load_runtime", lambda *a, **k: runtimes[-1])
        return runtime

    return install


# -- 4. a damaged database is set aside, salvaged, never written -----------------------------


def build_db(capsys, data: Path) -> int:
    """A data dir holding the synthetic chat and two agent transcripts; their messages."""
    files = [SYNTHETIC_CHAT, *AGENT_FILES[:2]]
    for path in files:
        assert run(capsys, "--data-dir", data, "import", path)[0] == 0
    return sum(len(load_corpus(p)) for p in files)


def test_damaged_database_is_set_aside_untouched_and_salvaged(capsys, tmp_path):
    data = tmp_path / "data"
    total = build_db(capsys, data)
    db = data / "iris.db"
    damage_pages(db, "messages", 2)
    damaged = sha256(db)

    code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0, err
    assert err.count("was damaged") == 1 and "set aside, unchanged" in err
    asides = sorted(data.glob("iris.db.corrupt-*"))
    assert [p.name for p in asides if not p.name.endswith(("-wal", "-shm"))] == [asides[0].name]
    assert sha256(asides[0]) == damaged  # never written, not even checkpointed

    with store_module.Store(db) as store:
        assert store.integrity_check() == "ok"
        recovered = store.conn.execute("SELECT count(*) FROM messages").fetchone()[0]
        last = store.conn.execute("SELECT id, content FROM messages ORDER BY id DESC").fetchone()
        word = max(last[1].split(), key=len)
        assert last[0] in {hit["message_id"] for hit in store.search(word, limit=500)}
    lost = int(re.search(r"; ([\d,]+) rows could not be read", err)[1].replace(",", ""))
    assert 0 < recovered < total and recovered + lost == total

    # later commands use the new file; the set-aside copy stays as it was
    code, out, err = run(capsys, "--data-dir", data, "import", AGENT_FILES[2])
    # the damaged original is named on every command until recover lists it (README)
    assert code == 0 and err.count("\n") == 1 and asides[0].name in err and "iris-desktop recover" in err
    assert sha256(asides[0]) == damaged


def test_salvage_reads_and_moves_the_wal_and_keeps_orphaned_messages(tmp_path):
    """A crash leaves the newest row in the -wal; the threads table's only page is lost."""
    live = tmp_path / "live" / "iris.db"
    store = store_module.Store(live)
    thread = store.create_thread("friends")
    store.add_messages(thread, load_corpus(SYNTHETIC_CHAT))
    store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.add_request(thread, {"model": "written after the checkpoint"})
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    for suffix in ("", "-wal", "-shm"):  # the files as a kill -9 would leave them
        shutil.copy(f"{live}{suffix}", crashed / f"iris.db{suffix}")
    store.close()
    db = crashed / "iris.db"
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'threads'"
                            ).fetchone()[0]
    with open(db, "r+b") as fh:  # the threads table's only page
        fh.seek((root - 1) * 4096)
        fh.write(b"\xa5" * 4096)

    store, recovery = store_module.open_store(db)
    with store:
        assert [p.name[-4:] for p in recovery.moved[:2]] == ["-wal", "-shm"]
        assert recovery.recovered["messages"] == len(load_corpus(SYNTHETIC_CHAT))
        assert store.thread(thread)["title"] == f"Recovered chat {thread}"
        assert store.requests(thread)[0]["model"] == "written after the checkpoint"
        assert store.conn.execute("PRAGMA foreign_key_check").fetchall() == []


def test_not_a_database_keeps_its_clear_error_and_is_untouched(capsys, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "iris.db").write_bytes(b"this is not a database" * 100)
    before = sha256(data / "iris.db")
    code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 1 and one_sentence(err) and "is not an Iris database" in err
    assert sha256(data / "iris.db") == before and not list(data.glob("*corrupt*"))


def test_quick_check_stops_at_its_time_budget(tmp_path, caplog):
    db = tmp_path / "iris.db"
    with store_module.Store(db) as store:
        thread = store.create_thread("t")
        store.add_messages(thread, load_corpus(SYNTHETIC_CHAT))
    assert store_module.quick_check(db) == []
    assert store_module.quick_check(db, budget_s=0) == []  # stopped, not failed
    assert "quick check stopped" in caplog.text


def test_gui_reports_a_recovery_before_the_main_window(qtbot, tmp_path, monkeypatch, capsys):
    data = tmp_path / "data"
    build_db(capsys, data)
    damage_pages(data / "iris.db", "messages", 1)
    shown = run_gui_recording(monkeypatch, data)
    assert [kind for kind, _ in shown] == ["warning", "window"]
    assert "set aside, unchanged" in shown[0][1]


# -- 5. places Iris cannot write: one sentence that says what to do --------------------------


def test_data_dir_that_is_a_file(capsys, tmp_path):
    (tmp_path / "afile").write_text("x")
    code, _, err = run(capsys, "--data-dir", tmp_path / "afile", "threads", "--no-model")
    assert code == 1 and one_sentence(err) and "is not a folder" in err
    code, _, err = run(capsys, "--data-dir", tmp_path / "afile", "config", "set",
                       "context.window", "4096")
    assert code == 1 and one_sentence(err) and "is not a folder" in err


@POSIX
def test_data_dir_without_write_permission(capsys, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    with unwritable(data):
        code, _, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 1 and one_sentence(err) and "make it writable" in err


@POSIX
@pytest.mark.parametrize("name", ["iris.db", "iris.db-shm"])
def test_read_only_database_or_leftover_shm(capsys, tmp_path, name):
    data = tmp_path / "data"
    assert run(capsys, "--data-dir", data, "import", AGENT_FILES[0])[0] == 0
    keep = sqlite3.connect(data / "iris.db")  # holds the -wal and -shm open, as a crash would
    keep.execute("SELECT count(*) FROM messages").fetchone()
    try:
        with unwritable(data / name):
            code, _, err = run(capsys, "--data-dir", data, "import", AGENT_FILES[1])
    finally:
        keep.close()
    assert code == 1 and one_sentence(err) and f"{name} is read-only" in err


@POSIX
def test_read_only_database_past_the_up_front_check(capsys, tmp_path, monkeypatch):
    """os.access patched to say yes: SQLite's own read-only error is explained too."""
    data = tmp_path / "data"
    assert run(capsys, "--data-dir", data, "import", AGENT_FILES[0])[0] == 0
    monkeypatch.setattr(store_module.os, "access", lambda *a, **k: True)
    with unwritable(data / "iris.db"):
        code, _, err = run(capsys, "--data-dir", data, "import", AGENT_FILES[1])
    assert code == 1 and one_sentence(err) and "cannot be written" in err


def test_another_process_holding_the_write_lock(capsys, tmp_path, monkeypatch):
    data = tmp_path / "data"
    assert run(capsys, "--data-dir", data, "import", AGENT_FILES[0])[0] == 0
    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_S", 0.2)
    writer = sqlite3.connect(data / "iris.db", isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    try:
        code, out, err = run(capsys, "--data-dir", data, "export", "1")
        assert code == 0, err  # reading needs no write lock
        code, _, err = run(capsys, "--data-dir", data, "import", AGENT_FILES[1])
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    assert code == 1 and one_sentence(err)
    assert f"another Iris process is writing to {data / 'iris.db'}; close it or wait" in err


def test_a_request_never_includes_another_processs_unfinished_reply(tmp_path):
    """A reply another process is still streaming is not history yet: ``context`` in a
    second process leaves it out, and counts it once it is complete."""
    from iris_desktop.core.store import Store

    data = tmp_path / "data"
    store = Store(data / "iris.db")
    thread = store.create_thread("t")
    store.add_message(thread, {"role": "user", "content": "Tell me about the harbour."})
    reply = store.add_message(thread, {"role": "assistant", "content": "The harbour was bu"},
                              status="streaming")  # the other process is mid-reply
    command = [sys.executable, "-m", "iris_desktop", "--data-dir", str(data), "context",
               str(thread), "--json", "--no-model", "--show-request"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert "harbour was bu" not in json.dumps(json.loads(done.stdout)["request"])
        assert store.messages(thread)[-1]["status"] == "streaming"  # left alone: its writer lives
        store.update_streaming(reply, "The harbour was built in 1850.", status="complete")
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert "built in 1850" in json.dumps(json.loads(done.stdout)["request"])
    finally:
        store.close()


# -- 7. imports that are not conversations: exit 2, nothing written -------------------------


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


HOSTILE_IMPORTS = {
    "deep nesting": lambda d: _write(d / "deep.json", "[" * 100_000),
    "deep JSONL line": lambda d: _write(d / "deep.jsonl", '{"role": "user", "content": "x"}\n'
                                        + '{"a":' * 5000 + "1" + "}" * 5000 + "\n"),
    "a 5,000-digit number": lambda d: _write(
        d / "num.json", '[{"role": "user", "content": "x", "n": ' + "9" * 5000 + "}]"),
    "a folder": lambda d: (d / "folder").mkdir() or d / "folder",
    "a missing file": lambda d: d / "missing.json",
}


@pytest.mark.parametrize("case", sorted(HOSTILE_IMPORTS))
def test_hostile_import_is_a_clear_error(capsys, tmp_path, case):
    source = HOSTILE_IMPORTS[case](tmp_path)
    code, _, err = run(capsys, "import", source)
    assert code == 2 and one_sentence(err) and "nothing was written" in err
    assert json.loads(run(capsys, "threads", "--json", "--no-model")[1]) == []


@pytest.mark.parametrize("text", ['[{"role": "user", "content": "a\\ud800"}]',
                                  '{"title": "\\udc00", "messages": [{"role": "user", "content": "hi"}]}'])
def test_a_lone_surrogate_is_mended_and_said(capsys, tmp_path, text):
    """It was refused whole ("fix that escape in the file"); an Iris export or message list
    is now mended as another app's file is (test_import_skipped_chats.py)."""
    code, out, err = run(capsys, "import", _write(tmp_path / "sur.json", text))
    assert code == 0 and out.strip().isdigit()
    assert err == ("iris-desktop: 1 broken character (half of an emoji's or other character's "
                   "UTF-16 pair) was replaced with \ufffd.\n")


def test_unreadable_import_is_a_clear_error(capsys, tmp_path, monkeypatch):
    """Root reads any file (and Windows has no mode bits for it), so there opening it is
    made to fail as a permission error would."""
    source = _write(tmp_path / "chat.json", '[{"role": "user", "content": "hi"}]')
    if IS_ROOT or os.name != "posix":
        real_open = os.open  # how import opens a file (non-blocking, after checking its type)

        def refuse(path, *args, **kwargs):
            if Path(path) == source:
                raise PermissionError(13, "Permission denied", str(path))
            return real_open(path, *args, **kwargs)
        monkeypatch.setattr(os, "open", refuse)
    else:
        os.chmod(source, 0)
    code, _, err = run(capsys, "import", source)
    assert code == 2 and one_sentence(err) and "cannot read it (Permission denied)" in err


# -- 8. chat reads its message from an argument, stdin or a file ----------------------------


def test_chat_takes_the_message_from_stdin_or_a_file(capsys, tmp_path, monkeypatch, scripted):
    import io

    big = "a long question " * 20_000 + "?"  # 320 KB: beyond a comfortable argv
    scripted("from stdin", "from a file", n_ctx=262_144)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(big.encode())))
    code, out, err = run(capsys, "chat", "-")
    assert code == 0, err
    (tmp_path / "q.txt").write_text("héllo from a file\n", encoding="utf-8")
    code, out, err = run(capsys, "chat", "--thread", "1", "--file", tmp_path / "q.txt")
    assert code == 0, err
    exported = json.loads(run(capsys, "export", "1")[1])["messages"]
    assert [m["content"] for m in exported if m["role"] == "user"] == [big, "héllo from a file"]


@pytest.mark.parametrize("argv,fragment", [
    (["chat"], "exactly one of them"),
    (["chat", "--file", "x.txt", "hello"], "exactly one of them"),
    (["chat", "--file", "missing.txt"], "cannot read it"),
])
def test_chat_message_source_errors(capsys, argv, fragment, scripted):
    scripted("unused")
    code, _, err = run(capsys, *argv)
    assert code == 2 and one_sentence(err) and fragment in err


# -- 9. counting costs what the answer needs ------------------------------------------------


@pytest.fixture
def counted(monkeypatch):
    """The lengths of every text the heuristic counter is asked to count."""
    from iris_desktop.tokens import HeuristicCounter

    lengths: list[int] = []
    real = HeuristicCounter.count_text
    monkeypatch.setattr(HeuristicCounter, "count_text",
                        lambda self, text: lengths.append(len(text)) or real(self, text))
    return lengths


def test_a_message_larger_than_any_window_is_refused_before_it_is_counted(
        capsys, tmp_path, counted, scripted):
    huge = "word " * (2 * 1024 * 1024)  # 10 MiB
    source = tmp_path / "huge.json"
    source.write_text(json.dumps([{"role": "user", "content": huge}]))
    code, out, _ = run(capsys, "import", source)
    thread = out.strip()
    code, _, err = run(capsys, "--set", "context.window=8192", "context", thread, "--no-model")
    assert code == 3 and max(counted, default=0) < 1024 * 1024  # not tokenized to know it
    assert one_sentence(err) and "at least 40,960 tokens" in err
    code, _, err = run(capsys, "--set", "context.window=8192", "context", "--no-model",
                       thread, "--draft", huge)
    assert code == 3 and "at least 40,960 tokens" in err
    scripted("unused")
    code, _, err = run(capsys, "chat", "--file", source)
    assert code == 3 and "nothing was sent or stored" in err
    assert len(json.loads(run(capsys, "threads", "--json", "--no-model")[1])) == 1
    assert max(counted, default=0) < 1024 * 1024  # the huge text was never tokenized


def test_threads_counts_a_bounded_amount_and_says_what_is_left(capsys, tmp_path, counted):
    source = tmp_path / "many.jsonl"
    source.write_text("".join(json.dumps({"role": "user", "content": f"message number {i}"})
                              + "\n" for i in range(30_000)))
    assert run(capsys, "import", source)[0] == 0
    code, out, _ = run(capsys, "threads", "--no-model")
    assert code == 0 and "messages not counted yet)" in out

    from iris_desktop.commands.common import LISTING_COUNT_CHARS

    assert sum(counted) <= LISTING_COUNT_CHARS
    row = json.loads(run(capsys, "threads", "--json", "--no-model")[1])[0]
    assert row["tokens"] > 0 and 0 < row["uncounted_messages"] < 30_000


# -- 10. stored text is shown, never obeyed by the terminal -------------------------------


HOSTILE_TITLE = "\x1b]0;pwned\x07\x1b[2J\x9b31mred\x7f"


def test_control_characters_in_stored_text_are_shown_as_escapes(capsys, tmp_path, scripted,
                                                                  monkeypatch):
    source = _write(tmp_path / "c.json", json.dumps([{"role": "user", "content": "hi"}]))
    assert run(capsys, "import", source, "--title", HOSTILE_TITLE)[0] == 0
    code, out, _ = run(capsys, "threads", "--no-model")
    assert "\\x1b]0;pwned\\x07\\x1b[2J\\x9b31mred\\x7f" in out
    code, out, _ = run(capsys, "threads", "--json", "--no-model")
    assert json.loads(out)[0]["title"] == HOSTILE_TITLE  # JSON: exact, and escaped
    assert not any(0x7F <= ord(c) < 0xA0 or (ord(c) < 0x20 and c != "\n") for c in out)

    scripted("clear\x1b[2J the screen")
    code, out, _ = run(capsys, "chat", "--thread", "1", "do it")
    assert code == 0 and "clear\\x1b[2J the screen" in out and "\x1b" not in out
    exported = json.loads(run(capsys, "export", "1")[1])["messages"]
    assert exported[-1]["content"] == "clear\x1b[2J the screen"  # stored exactly

    code, out, _ = run(capsys, "export", "1", "--format", "md")
    assert "\x1b]0;pwned" in out  # a pipe or a file gets the exact text
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    code, out, _ = run(capsys, "export", "1", "--format", "md")
    assert "\x1b" not in out and "\\x1b]0;pwned" in out


# -- 11. the settings file -----------------------------------------------------------------


def test_config_set_edits_the_file_in_place_keeping_comments(capsys, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    original = ("# my Iris settings\n[context]\n# a small window for my laptop\n"
                "window = 4096  # tokens\n\n[model]\nn_ctx = 4096\n")
    (data / "config.toml").write_text(original)
    assert run(capsys, "--data-dir", data, "config", "set", "context.token_budget_ratio",
               "0.8")[0] == 0
    assert run(capsys, "--data-dir", data, "config", "set", "model.n_ctx", "8192")[0] == 0
    text = (data / "config.toml").read_text()
    assert text == original.replace("n_ctx = 4096", "n_ctx = 8192").replace(
        "window = 4096  # tokens\n", "window = 4096  # tokens\ntoken_budget_ratio = 0.8\n")
    assert run(capsys, "--data-dir", data, "config", "reset", "context.token_budget_ratio")[0] == 0
    assert (data / "config.toml").read_text() == original.replace("n_ctx = 4096", "n_ctx = 8192")


@pytest.mark.parametrize("action", [["set", "context.window", "2048"],
                                    ["reset", "context.window"]])
def test_a_settings_file_that_is_not_utf8_is_a_clear_error(capsys, tmp_path, action):
    data = tmp_path / "data"
    data.mkdir()
    (data / "config.toml").write_bytes(b"[context]\nwindow = 4096 # caf\xe9\n")
    code, _, err = run(capsys, "--data-dir", data, "config", *action)
    assert code == 2 and one_sentence(err) and "is not UTF-8 text" in err
    assert (data / "config.toml").read_bytes() == b"[context]\nwindow = 4096 # caf\xe9\n"


def test_each_warning_is_printed_once(tmp_path):
    """A real process: in-process, pytest's log capture would hide a second copy."""
    env = {**os.environ, "IRIS_CONTEXT_WINDOW": "lots", "IRIS_HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "iris_desktop", "threads", "--no-model"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0 and result.stderr.count("IRIS_CONTEXT_WINDOW") == 1


# -- 12. everything Iris writes is private ---------------------------------------------------


@pytest.fixture
def umask_022():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@POSIX
def test_config_set_and_export_are_private(capsys, tmp_path, umask_022):
    data = tmp_path / "new" / "data"
    assert run(capsys, "--data-dir", data, "config", "set", "context.window", "4096")[0] == 0
    assert (mode(tmp_path / "new"), mode(data), mode(data / "config.toml")) == (0o700, 0o700, 0o600)
    assert run(capsys, "--data-dir", data, "import", AGENT_FILES[0])[0] == 0
    assert run(capsys, "--data-dir", data, "export", "1", "-o", tmp_path / "out.json")[0] == 0
    assert mode(tmp_path / "out.json") == 0o600
    assert mode(data / "logs") == 0o700


@POSIX
def test_log_files_are_private_and_stay_private_when_rotated(tmp_path, umask_022):
    import logging

    from iris_desktop.ui.app import setup_logging

    log_path = tmp_path / "new" / "logs" / "iris.log"
    handler = setup_logging(log_path)
    try:
        logging.getLogger("iris.test").warning("hello")
        handler.doRollover()
        logging.getLogger("iris.test").warning("again")
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    assert (mode(log_path.parent), mode(log_path), mode(log_path.with_name("iris.log.1"))) == (
        0o700, 0o600, 0o600)


@POSIX
def test_the_bundled_model_and_its_folders_are_private(tmp_path, monkeypatch, umask_022):
    """What --self-test does first: assemble the bundled model into <data>/models (here a
    one-part stand-in, through the same ensure_bundled_model)."""
    from iris_desktop.runtime import bundled
    from iris_desktop.runtime.library import remember_recent

    payload = b"GGUF" + bytes(4096)
    package = tmp_path / "site" / "iris_test_part"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "data" / "part01.bin").write_bytes(payload)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    digest = hashlib.sha256(payload).hexdigest()
    part = bundled.BundledPart("iris-test-part", "1", "iris_test_part", "data/part01.bin",
                               len(payload), digest)
    model = bundled.BUNDLED_MODEL.__class__(**{
        **bundled.BUNDLED_MODEL.__dict__, "file_name": "m.gguf", "parts": (part,),
        "size": len(payload), "sha256": digest})
    data = tmp_path / "data"
    target = bundled.ensure_bundled_model(data / "models", model)
    remember_recent(data / "recent-models.json", target)
    assert (mode(data), mode(data / "models"), mode(target)) == (0o700, 0o700, 0o600)
    assert mode(data / "recent-models.json") == 0o600


# -- 16. ADR-0079's variables are refused with the key to use ------------------------------


@pytest.mark.parametrize("name,instead", [
    ("IRIS_COMPACTION_THRESHOLD", "IRIS_CONTEXT_COMPACTION_MIN_TURNS"),
    ("IRIS_COMPACTION_RATIO", "IRIS_CONTEXT_COMPACTION_THRESHOLD"),
    ("IRIS_COMPACTION_TOKEN_BUDGET", "IRIS_CONTEXT_TOKEN_BUDGET_RATIO"),
    ("IRIS_COMPACTION_KEEP_RECENT", "IRIS_CONTEXT_KEEP_RECENT_RATIO"),
])
def test_adr_0079_variables_name_the_key_to_use(capsys, monkeypatch, name, instead):
    monkeypatch.setenv(name, "5")
    code, out, err = run(capsys, "config", "list", "--json")
    assert code == 0 and err.count(name) == 1 and f"use {instead}" in err
    assert all(row["source"] == "default" for row in json.loads(out))


@pytest.mark.parametrize("schema,version", [
    ("CREATE TABLE moz_places(id INTEGER PRIMARY KEY, url TEXT)", 0),
    ("CREATE TABLE messages(id INTEGER PRIMARY KEY, body TEXT)", 0),
    ("CREATE TABLE moz_places(id INTEGER PRIMARY KEY, url TEXT)", 70),
])
def test_another_apps_database_in_the_history_s_place_is_named_and_left_as_it_is(
        capsys, tmp_path, schema, version):
    """Before (an audit): a browser's database at iris.db got Iris's 19 tables beside its
    own and its user_version set (exit 0, "no threads yet"); one with its own `messages`
    table was refused as a folder or disk problem, one with user_version 70 as "newer
    than this Iris", and each was switched to WAL for good, refused or not."""
    data = tmp_path / "home"
    data.mkdir()
    db = data / "iris.db"
    with sqlite3.connect(db) as conn:
        conn.execute(schema)
        conn.execute(f"PRAGMA user_version = {version}")
    before = db.read_bytes()
    code, out, err = run(capsys, "--data-dir", str(data), "threads")
    assert code == 1 and "is not an Iris history: it holds other tables" in err, err
    assert "Traceback" not in err
    assert db.read_bytes() == before  # not a byte changed: no tables, no WAL switch
    assert not (data / "iris.db-wal").exists()


def test_a_small_chat_is_counted_at_the_first_listing_beside_a_long_one(capsys, tmp_path, counted):
    """Before (an audit, 100,000 messages): the long chat, newest, took every listing's
    share of counting, and a two-message chat read "≈0 tokens (+2 messages not counted
    yet)" for hundreds of listings. Now the chats with the least to count go first."""
    small = tmp_path / "small.json"
    small.write_text(json.dumps([{"role": "user", "content": "Hello there, how are you?"},
                                 {"role": "assistant", "content": "Fine, thanks."}]))
    assert run(capsys, "import", small)[0] == 0
    source = tmp_path / "many.jsonl"
    source.write_text("".join(json.dumps({"role": "user", "content": f"message number {i}"})
                              + "\n" for i in range(30_000)))
    assert run(capsys, "import", source)[0] == 0  # newer: listed first
    rows = json.loads(run(capsys, "threads", "--json", "--no-model")[1])
    by_size = {row["messages"]: row for row in rows}
    assert by_size[2]["uncounted_messages"] == 0 and by_size[2]["tokens"] > 0
    assert 0 < by_size[30_000]["uncounted_messages"] < 30_000  # it goes on, bounded
