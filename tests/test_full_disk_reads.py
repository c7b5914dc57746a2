"""Commands that only read keep working on a full disk (session 62's audit): token counts
and recall vectors are caches; a write of them that the full disk refuses is left out
(logged, one note on stderr for the CLI), and the command goes on with what it computed,
so that a user can still list the chats and see a chat's context to decide what to delete.
The window plans its meter and indexes for recall with the same engine and Host: it keeps
working too. And the sentences of a full disk met by `recover --salvage`, `rekey` and
`delete` name the step that helps and the room it needs. Real SQLite files on a real, small
file system filled to the last byte (support.faults.full_disk)."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from iris_desktop.core.engine import ContextRequest
from iris_desktop.core.store.errors import unsaved_caches
from iris_desktop.host import Host
from iris_desktop.paths import app_paths

from conftest import SYNTHETIC_CHAT, load_corpus
from support.fakes import ScriptedRuntime
from support.faults import full_disk
from support.helpers import one_sentence
from support.helpers import run_cli as run

#: room for the -shm a first reader makes (32 KiB) and one 4 KiB block: not for a -wal frame
#: (4 KiB + 24 bytes), so no transaction can commit
ROOM_TO_READ = 36 * 1024


def cached_counts(db: Path) -> int:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return conn.execute("SELECT count(*) FROM token_counts").fetchone()[0]


def test_threads_lists_the_chats_on_a_full_disk_and_says_the_counts_were_not_kept(capsys, tmp_path):
    """Before: `threads --no-model` (and `threads`, `context 1`) failed with "the disk
    holding … is full" because the listing caches the token counts it makes."""
    with full_disk(tmp_path) as disk:
        data = disk.path / "data"
        code, _, err = run(capsys, "--data-dir", data, "import", SYNTHETIC_CHAT)
        assert code == 0, err
        db = data / "iris.db"
        assert cached_counts(db) == 0
        disk.fill(leave=ROOM_TO_READ)
        code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
        assert code == 0, err
        assert f"{len(load_corpus(SYNTHETIC_CHAT))} messages" in out
        assert one_sentence(err), err
        assert "is full" in err and "token counts" in err and "not saved" in err
        disk.free()  # (the log took the block left)
        disk.fill(leave=ROOM_TO_READ)
        code, out, err = run(capsys, "--data-dir", data, "context", "1", "--no-model")
        assert code == 0 and "budget" in out, err
        assert "Traceback" not in err and "nothing more was written" not in err
        assert one_sentence(err) and "token counts" in err and "not saved" in err, err
        disk.free()
        assert cached_counts(db) == 0  # nothing was written meanwhile
        code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
        assert code == 0 and err == ""  # room again: the counts are kept, no note
        assert cached_counts(db) > 0


def test_the_window_plans_and_indexes_for_recall_on_a_full_disk(tmp_path):
    """The window's meter plans on the DB thread with the engine, and the DB thread indexes
    for recall after each turn (``Host.index_for_recall``): on a full disk both go on,
    without caching (before: the plan and the indexing raised "database or disk is full")."""
    from iris_desktop.core.config import ContextParams
    from iris_desktop.core.planner import Planner
    from iris_desktop.host import build_compactor
    from iris_desktop.tokens import HeuristicCounter

    with full_disk(tmp_path, "16m") as disk:
        with Host(disk.path / "data", {}, runtime=ScriptedRuntime([]), compact=False) as host:
            host.load_model()
            assert host.load_embedder() is not None
            store = host.store
            thread = store.create_thread("friends")
            store.add_messages(thread, load_corpus(SYNTHETIC_CHAT)[:80])
            planner = Planner(ContextParams(window=2048, compaction_min_turns=10), HeuristicCounter())
            assert build_compactor(planner, store).compact(thread, "manual", force=True).outcome == "ok"
            pending = host.pending_for_recall(thread)
            assert pending > 0
            # no count cached, and an empty -wal: every write needs room the disk lacks
            store.conn.execute("DELETE FROM token_counts")
            store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            disk.fill()
            planned = host.planner().plan_or_error(store, thread, "what did we say?")
            assert isinstance(planned, ContextRequest) and planned.breakdown.history > 0
            assert host.index_for_recall(thread) == 0  # embedded, not kept: recall goes on by words
            assert host.pending_for_recall(thread) == pending
            assert set(unsaved_caches(store)) == {"token counts", "recall vectors"}
            disk.free()
            assert host.index_for_recall(thread) == pending  # room again: kept


def test_the_cli_says_once_that_recall_vectors_were_not_kept(capsys, tmp_path):
    """What `chat` and `context` say when the vectors they embedded found no room: one
    line naming the full disk, instead of "embedded N summarized messages"."""
    from iris_desktop.commands.common import _index_for_recall
    from iris_desktop.core.config import ContextParams
    from iris_desktop.core.planner import Planner
    from iris_desktop.host import build_compactor
    from iris_desktop.tokens import HeuristicCounter

    with full_disk(tmp_path, "16m") as disk:
        with Host(disk.path / "data", {}, runtime=ScriptedRuntime([]), compact=False) as host:
            host.load_model()
            thread = host.store.create_thread("friends")
            host.store.add_messages(thread, load_corpus(SYNTHETIC_CHAT)[:80])
            planner = Planner(ContextParams(window=2048, compaction_min_turns=10), HeuristicCounter())
            assert build_compactor(planner, host.store).compact(thread, "manual", force=True).outcome == "ok"
            host.store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            capsys.readouterr()
            disk.fill()
            _index_for_recall(host, thread)
            err = capsys.readouterr().err.splitlines()
            assert len(err) == 2 and "embedding thread" in err[0], err
            assert "is full" in err[1] and "recall vectors" in err[1] and "by their words" in err[1]
            assert "embedded 0" not in err[1]
            disk.free()


# -- the next step a full disk's sentence names ---------------------------------------------


def test_recover_salvage_on_a_full_disk_says_to_run_it_again_not_that_the_file_is_damaged(
        capsys, tmp_path):
    """Before: "… is damaged (salvage asked for …) and copying … failed (the disk is full);
    …; free some space, then start Iris again": the file was not known to be damaged, and
    a start does not salvage a healthy file."""
    from conftest import AGENT_FILES

    with full_disk(tmp_path, "8m") as disk:
        data = disk.path / "data"
        for path in (SYNTHETIC_CHAT, *AGENT_FILES[:2]):
            code, _, err = run(capsys, "--data-dir", data, "import", path)
            assert code == 0, err
        disk.fill(leave=64 * 1024)
        code, out, err = run(capsys, "--data-dir", data, "recover", "--salvage", "--yes")
        assert code == 1 and one_sentence(err), err
        assert "is damaged" not in err and "start Iris again" not in err
        assert "the disk is full" in err and " MB" in err and "nothing was lost" in err
        assert err.rstrip().endswith("free some space, then run 'iris-desktop recover --salvage' again")
        disk.free()
        code, out, err = run(capsys, "--data-dir", data, "recover", "--salvage", "--yes")
        assert code == 0 and "no row was lost" in out, err


def test_rekey_on_a_full_disk_says_to_run_rekey_again(capsys, monkeypatch, tmp_path, no_keyring):
    """Before: "… converting it needs room for a second copy of the history; it was not
    changed; free some space, then start Iris again": a start does not rekey."""
    import pytest

    pytest.importorskip("sqlcipher3")
    from conftest import AGENT_FILES

    with full_disk(tmp_path, "8m") as disk:
        data = disk.path / "data"
        for path in (SYNTHETIC_CHAT, *AGENT_FILES[:2]):
            code, _, err = run(capsys, "--data-dir", data, "import", path)
            assert code == 0, err
        monkeypatch.setenv("IRIS_STORAGE_ENCRYPT", "true")
        monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", "old passphrase 4711")
        code, _, err = run(capsys, "--data-dir", data, "threads", "--no-model")
        assert code == 0, err
        monkeypatch.setenv("IRIS_NEW_STORAGE_PASSPHRASE", "new passphrase 2026")
        disk.fill(leave=256 * 1024)
        code, out, err = run(capsys, "--data-dir", data, "rekey")
        assert code == 1 and one_sentence(err), err
        assert "is full" in err and "second copy of the history (about " in err
        assert err.rstrip().endswith("free some space, then run 'iris-desktop rekey' again")
        disk.free()
        code, out, err = run(capsys, "--data-dir", data, "rekey")
        assert code == 0, err


def history_with_a_large_index(capsys, tmp_path: Path, data: Path) -> None:
    """Thread 1: 2,000 messages of varied words (a large full-text index); thread 2: the
    synthetic chat. The log is kept off the small disk: its own full-disk failure at exit
    is not what these tests are about."""
    import json
    import random

    rng = random.Random(7)
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"messages": [
        {"role": "user" if i % 2 == 0 else "assistant",
         "content": " ".join(f"w{rng.randrange(40000)}" for _ in range(50))} for i in range(2000)]}))
    (tmp_path / "logs").mkdir()
    data.mkdir()
    (data / "logs").symlink_to(tmp_path / "logs")
    for path in (big, SYNTHETIC_CHAT):
        code, _, err = run(capsys, "--data-dir", data, "import", path)
        assert code == 0, err


def thread_ids(db: Path) -> list[int]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return [r[0] for r in conn.execute("SELECT id FROM threads ORDER BY id")]


def test_a_delete_the_full_disk_refuses_names_the_room_it_needs(capsys, tmp_path):
    """Before: "the disk holding … is full; nothing more was written; free some space, then
    try again": not how much (about the history's size: the chat's pages are overwritten
    and the full-text index of every chat is rewritten, in the -wal first)."""
    with full_disk(tmp_path, "16m") as disk:
        data = disk.path / "data"
        history_with_a_large_index(capsys, tmp_path, data)
        disk.fill(leave=300_000)
        code, out, err = run(capsys, "--data-dir", data, "delete", "2", "--yes")
        assert code == 1 and one_sentence(err), err
        assert "is full" in err and "about the history's size (" in err and " MB) or more" in err
        assert "nothing was deleted" in err
        assert err.rstrip().endswith("free some space, then run 'iris-desktop delete 2' again")
        disk.free()
        assert thread_ids(data / "iris.db") == [1, 2]
        code, out, err = run(capsys, "--data-dir", data, "delete", "2", "--yes")
        assert code == 0 and err == "", err
        assert thread_ids(data / "iris.db") == [1]


def test_a_delete_whose_checkpoint_the_full_disk_refuses_says_the_chat_is_deleted(capsys, tmp_path):
    """Before: the delete was committed (the chat gone), then the checkpoint that overwrites
    its old pages in the file found no room, and the command said "nothing more was written;
    free some space, then try again" with exit 1. Now: deleted, and a warning that its old
    pages stay in the file until a later command, with room, overwrites them."""
    phrase = load_corpus(SYNTHETIC_CHAT)[0]["content"][:24].encode()
    with full_disk(tmp_path, "16m") as disk:
        data = disk.path / "data"
        history_with_a_large_index(capsys, tmp_path, data)
        assert any(phrase in path.read_bytes() for path in data.glob("iris.db*"))
        kv = app_paths(data).kv_cache_dir
        kv.mkdir(parents=True, exist_ok=True)
        (kv / "2-saved.kv").write_bytes(b"the chat's tokens")  # a KV state of chat 2
        (kv / "1-saved.kv").write_bytes(b"another chat's tokens")
        disk.fill(leave=1_500_000)
        code, out, err = run(capsys, "--data-dir", data, "delete", "2", "--yes")
        assert code == 0 and out.startswith("deleted thread 2"), err
        assert one_sentence(err) and "warning" in err and "old pages stay in iris.db" in err, err
        # its KV states go with it (before: kept, the deleted chat's tokens in them)
        assert sorted(p.name for p in kv.glob("*.kv")) == ["1-saved.kv"]
        disk.free()
        assert thread_ids(data / "iris.db") == [1]
        code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
        assert code == 0 and err == "", err
        for path in data.glob("iris.db*"):  # the next command overwrote them
            assert phrase not in path.read_bytes(), path.name
