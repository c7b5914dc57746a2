"""Damage and a full disk, injected for real (``tests/support/faults.py``): the history is never
hidden or replaced by less, a salvage tells what it really lost, a flipped byte in one
message leaves its thread readable, and every failure is one sentence with its cause.

Issue 26, items 1-3 and the database parts of 11. The full-disk tests mount a small
tmpfs and are skipped where this machine does not allow it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import sqlite3
from pathlib import Path

import pytest

from iris_desktop.core import store as store_module
from iris_desktop.core.store import recovery

from conftest import AGENT_FILES, SYNTHETIC_CHAT, load_corpus
from support.faults import flip_byte, flip_message_byte, full_disk
from support.helpers import one_sentence
from support.helpers import run_cli as run


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def message_count(db: Path) -> int:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return conn.execute("SELECT count(*) FROM messages").fetchone()[0]


def listed_messages(out: str) -> int:
    """The messages a ``threads`` listing shows, all threads together."""
    listed = re.findall(r"^\s*\d+\s+(?:[\d-]+ [\d:]+\s+)?([\d,]+) messages", out, re.M)
    return sum(int(m.replace(",", "")) for m in listed)


def build(capsys, data: Path, *files: Path) -> int:
    """A data dir holding these conversations (default: the synthetic chat); their messages."""
    files = files or (SYNTHETIC_CHAT,)
    for path in files:
        code, _, err = run(capsys, "--data-dir", data, "import", path)
        assert code == 0, err
    return sum(len(load_corpus(p)) for p in files)


def asides(data: Path) -> list[Path]:
    return recovery.set_aside_files(data / "iris.db")


# -- 1. a full disk never hides the history ------------------------------------------------


def test_two_runs_on_a_full_disk_keep_the_history(capsys, tmp_path):
    """The issue's reproduction: two runs on a full disk (the first leaves a 3-byte
    -shm), then space comes back: every message is there, nothing was set aside."""
    with full_disk(tmp_path) as disk:
        data = disk.path / "data"
        total = build(capsys, data)
        db = data / "iris.db"
        before = sha256(db)
        disk.fill()
        for _ in range(2):
            code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
            assert code == 1 and one_sentence(err), err
            assert "disk" in err and "is full" in err and "free some space" in err
        assert sha256(db) == before and asides(data) == []
        assert not list(data.glob("iris.db.salvage-*"))
        disk.free()
        code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
        assert code == 0 and err == "", err
        assert listed_messages(out) == total


def test_quick_check_does_not_call_a_short_shm_on_a_full_disk_damage(tmp_path):
    with full_disk(tmp_path) as disk:
        db = disk.path / "iris.db"
        with store_module.Store(db) as store:
            store.add_messages(store.create_thread("t"), load_corpus(SYNTHETIC_CHAT)[:20])
        # what a run on the full disk leaves: a -wal of 0 bytes and a -shm of 3
        (disk.path / "iris.db-wal").write_bytes(b"")
        (disk.path / "iris.db-shm").write_bytes(b"\0\0\0")
        disk.fill()
        with pytest.raises(store_module.StoreError, match="is full"):
            recovery.quick_check(db)
        disk.free()
        assert recovery.quick_check(db) == []


def test_a_salvage_that_runs_out_of_space_leaves_the_original_in_place(capsys, tmp_path):
    from support.faults import damage_pages

    with full_disk(tmp_path, "8m") as disk:
        data = disk.path / "data"
        total = build(capsys, data, SYNTHETIC_CHAT, *AGENT_FILES[:2])
        db = data / "iris.db"
        damage_pages(db, "messages", 1)
        damaged = sha256(db)
        disk.fill(leave=8192)
        code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
        assert code == 1 and one_sentence(err), err
        assert "is full" in err and "left as it is, under its own name" in err
        assert sha256(db) == damaged and asides(data) == []
        assert [p.name for p in data.iterdir() if "salvage" in p.name] == []
        disk.free()
        code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
        assert code == 0 and "set aside, unchanged" in err
        assert sha256(asides(data)[0]) == damaged
        assert 0 < listed_messages(out) < total


def test_a_salvage_that_reads_nothing_replaces_nothing(tmp_path):
    db = tmp_path / "iris.db"
    with store_module.Store(db) as store:
        store.add_messages(store.create_thread("t"), load_corpus(SYNTHETIC_CHAT)[:50])
        store.checkpoint()
    size = db.stat().st_size
    with open(db, "r+b") as fh:  # every page but the schema's
        fh.seek(4096)
        fh.write(b"\xa5" * (size - 4096))
    damaged = sha256(db)
    with pytest.raises(store_module.StoreError, match="not one row of it could be read"):
        store_module.open_store(db)
    assert sha256(db) == damaged and recovery.set_aside_files(db) == []


def test_set_aside_databases_are_announced_listed_and_put_back(capsys, tmp_path):
    """The state the bug left: the healthy history set aside, an empty iris.db."""
    data = tmp_path / "data"
    total = build(capsys, data)
    db = data / "iris.db"
    aside = data / "iris.db.corrupt-20260101T000000"
    db.rename(aside)
    db.write_bytes(b"")

    code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0 and out == "no threads yet\n"
    assert one_sentence(err) and aside.name in err and "iris-desktop recover" in err

    code, out, err = run(capsys, "--data-dir", data, "recover")
    assert code == 0 and err == ""
    assert aside.name in out and f"{total:,} messages" in out and "MB" in out
    code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0 and err == ""  # listed: not announced again

    code, out, err = run(capsys, "--data-dir", data, "recover", aside.name)
    assert code == 2 and "--yes" in err and aside.exists()  # nobody to ask
    code, out, err = run(capsys, "--data-dir", data, "recover", aside.name, "--yes")
    assert code == 0, err
    replaced = [p for p in asides(data) if ".before-restore-" in p.name]
    assert len(replaced) == 1 and replaced[0].name in out
    assert aside.exists() and message_count(db) == total
    code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0 and err == "" and listed_messages(out) == total

    code, out, err = run(capsys, "--data-dir", data, "recover", "--json")
    listing = json.loads(out)
    assert {a["name"] for a in listing["set_aside"]} == {aside.name, replaced[0].name}
    assert listing["current_rows"]["messages"] == total


def test_a_damaged_set_aside_file_is_not_put_back(capsys, tmp_path):
    from support.faults import damage_pages

    data = tmp_path / "data"
    build(capsys, data, SYNTHETIC_CHAT, *AGENT_FILES[:2])
    db = data / "iris.db"
    damage_pages(db, "messages", 1)
    assert run(capsys, "--data-dir", data, "threads", "--no-model")[0] == 0
    aside = asides(data)[0]
    current = sha256(db)
    code, out, err = run(capsys, "--data-dir", data, "recover", aside.name, "--yes")
    assert code == 1 and one_sentence(err) and "is damaged" in err and "nothing was changed" in err
    assert sha256(db) == current


# -- 2. a salvage says what it lost --------------------------------------------------------


def _salvaged(capsys, data: Path) -> tuple[str, int]:
    code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0, err
    assert "set aside, unchanged" in err and "'iris-desktop recover'" in err
    return err, listed_messages(out)


def _assert_truthful(err: str, total: int, recovered: int) -> None:
    assert "no row was lost" not in err
    lost = re.search(r"([\d,]+) of ([\d,]+) messages", err)
    if lost:
        assert int(lost[2].replace(",", "")) == total
        assert int(lost[1].replace(",", "")) + recovered == total
    else:
        assert "how many messages were lost cannot be told" in err or re.search(
            r"at least [\d,]+ messages", err), err


def test_salvage_of_a_truncated_database_counts_what_it_lost(capsys, tmp_path):
    data = tmp_path / "data"
    total = build(capsys, data, SYNTHETIC_CHAT, *AGENT_FILES[:2])
    db = data / "iris.db"
    with open(db, "r+b") as fh:
        fh.truncate(db.stat().st_size // 2 // 4096 * 4096)
    err, recovered = _salvaged(capsys, data)
    assert recovered < total
    _assert_truthful(err, total, recovered)
    # the damaged original, set aside, is named on every later command until recover lists it
    (aside,) = asides(data)
    for _ in range(2):
        code, _, err = run(capsys, "--data-dir", data, "threads", "--no-model")
        assert code == 0 and one_sentence(err) and aside.name in err and "iris-desktop recover" in err
    assert run(capsys, "--data-dir", data, "recover")[0] == 0
    assert run(capsys, "--data-dir", data, "threads", "--no-model")[2] == ""


def test_salvage_with_page_2_zeroed_counts_what_it_lost(capsys, tmp_path):
    data = tmp_path / "data"
    total = build(capsys, data, SYNTHETIC_CHAT, *AGENT_FILES[:2])
    db = data / "iris.db"
    # page 2 of a history with incremental vacuum is the pointer map (no rows: below);
    # the page after it is the first of the tables, as page 2 is in an older history
    with sqlite3.connect(db) as conn:
        page = 3 if conn.execute("PRAGMA auto_vacuum").fetchone()[0] else 2
    with open(db, "r+b") as fh:
        fh.seek(4096 * (page - 1))
        fh.write(b"\0" * 4096)
    err, recovered = _salvaged(capsys, data)
    if recovered == total:  # the page held no message: then what it held is named
        assert "no row was lost" not in err
    else:
        _assert_truthful(err, total, recovered)


def test_a_header_a_power_cut_zeroed_is_salvaged_not_taken_for_encrypted(capsys, tmp_path):
    """Before (an audit): a plain history whose first bytes were zeroed was taken for an
    encrypted one: every start asked for a passphrase never chosen, and the salvage
    refused it. Now the header is named as damaged, the file set aside, and every row
    recovered."""
    data = tmp_path / "data"
    total = build(capsys, data, SYNTHETIC_CHAT)
    with open(data / "iris.db", "r+b") as fh:
        fh.write(b"\0" * 100)
    err, recovered = _salvaged(capsys, data)
    assert "its header (the first 100 bytes) is damaged" in err and "passphrase" not in err
    assert recovered == total and "no row was lost" in err


def test_salvage_with_the_pointer_map_zeroed_loses_no_row(capsys, tmp_path):
    """A history with incremental vacuum (a deleted chat's space goes back to the disk)
    has a pointer map at page 2: zeroed, the file is damaged, no row is lost, and the
    salvage says so."""
    data = tmp_path / "data"
    total = build(capsys, data, SYNTHETIC_CHAT)
    db = data / "iris.db"
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
    with open(db, "r+b") as fh:
        fh.seek(4096)
        fh.write(b"\0" * 4096)
    err, recovered = _salvaged(capsys, data)
    assert recovered == total and "no row was lost" in err


def test_salvage_counts_lost_messages_from_an_index(capsys, tmp_path):
    from support.faults import damage_pages

    data = tmp_path / "data"
    total = build(capsys, data, SYNTHETIC_CHAT, *AGENT_FILES[:2])
    damage_pages(data / "iris.db", "messages", 2)
    err, recovered = _salvaged(capsys, data)
    lost = re.search(r"([\d,]+) of ([\d,]+) messages", err)
    assert lost, err
    assert int(lost[2].replace(",", "")) == total and int(lost[1]) + recovered == total


def test_losses_are_worded_as_known_lower_bound_or_unknown():
    base = dict(path=Path("iris.db"), set_aside=Path("iris.db.corrupt-x"), moved=[],
                problems=["*** in database main ***\nPage 2: btreeInitPage() returns error code 11"])
    tables = recovery.SALVAGED_TABLES
    none_lost = recovery.Recovery(**base, recovered=dict.fromkeys(tables, 1),
                                  lost=dict.fromkeys(tables, 0), held=dict.fromkeys(tables, 1))
    assert none_lost.losses() == "; no row was lost"
    assert "(Page 2: btreeInitPage() returns error code 11)" in none_lost.describe()
    mixed = recovery.Recovery(**base, recovered=dict.fromkeys(tables, 0),
                              lost={**dict.fromkeys(tables, 0), "messages": 240, "threads": 3,
                                    "requests": None},
                              held={**dict.fromkeys(tables, 0), "messages": 240, "threads": None,
                                    "requests": None})
    text = mixed.losses()
    assert "243 rows could not be read (at least 3 threads, 240 of 240 messages)" in text
    assert "how many requests were lost cannot be told" in text


# -- 3. one flipped byte in a message ------------------------------------------------------


def _flipped(tmp_path: Path, capsys) -> tuple[Path, int, int, str]:
    """A data dir whose one message has a flipped byte; (data, thread, message, text)."""
    data = tmp_path / "data"
    build(capsys, data)
    db = data / "iris.db"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        mid, thread, text = conn.execute(
            "SELECT id, thread_id, content FROM messages m WHERE length(content) > 50 AND "
            "(SELECT count(*) FROM messages o WHERE o.content = m.content) = 1 "
            "ORDER BY id LIMIT 1 OFFSET 7").fetchone()
    flip_message_byte(db, mid, at=20)
    return data, thread, mid, text


def test_a_flipped_byte_in_a_message_leaves_its_thread_readable(capsys, tmp_path):
    data, thread, mid, text = _flipped(tmp_path, capsys)
    code, out, err = run(capsys, "--data-dir", data, "export", thread)
    assert code == 0, err
    assert f"message {mid} is damaged on disk" in err and "Traceback" not in err
    exported = json.loads(out)["messages"] if isinstance(json.loads(out), dict) else json.loads(out)
    contents = [m.get("content") for m in exported]
    expected = [m.get("content") for m in load_corpus(SYNTHETIC_CHAT)]
    assert len(contents) == len(expected)
    differ = [i for i, (a, b) in enumerate(zip(contents, expected, strict=True)) if a != b]
    assert len(differ) == 1 and "\ufffd" in contents[differ[0]]
    assert contents[differ[0]].replace("\ufffd", "") == text[:20] + text[21:]

    for argv in (["threads", "--no-model"], ["context", thread, "--no-model"],
                 ["export", thread, "--format", "md"]):
        code, out, err = run(capsys, "--data-dir", data, *argv)
        assert code == 0 and "Traceback" not in err, (argv, err)
    assert asides(data) == []  # nothing to salvage: the file is sound, one value is not


def test_random_flips_in_messages_leave_every_thread_readable(capsys, tmp_path):
    """12 seeded random flips, each in a fresh copy, each inside one message's stored text:
    ``export`` and ``threads`` still work, and a flip that made the text invalid is named."""
    import random
    import shutil

    from support.faults import message_text_offset

    rng = random.Random(26)
    base = tmp_path / "base"
    build(capsys, base)
    with contextlib.closing(sqlite3.connect(base / "iris.db")) as conn:
        rows = conn.execute("SELECT id, length(CAST(content AS BLOB)) FROM messages "
                            "WHERE length(content) > 30").fetchall()
    done = named = 0
    while done < 12:
        data = tmp_path / f"flip{done}"
        shutil.copytree(base, data)
        mid, size = rng.choice(rows)
        try:
            offset = message_text_offset(data / "iris.db", mid, rng.randrange(size))
        except AssertionError:  # text not unique in the file: another message
            shutil.rmtree(data)
            continue
        flip_byte(data / "iris.db", offset, rng.randrange(1, 256))
        with contextlib.closing(sqlite3.connect(data / "iris.db")) as conn:
            raw = conn.execute("SELECT CAST(content AS BLOB) FROM messages WHERE id = ?",
                               (mid,)).fetchone()[0]
        invalid = not recovery_utf8(raw)
        code, out, err = run(capsys, "--data-dir", data, "export", "1")
        assert code == 0 and "Traceback" not in err, err
        assert (f"message {mid} is damaged on disk" in err) == invalid, err
        named += invalid
        code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
        assert code == 0 and listed_messages(out) == len(load_corpus(SYNTHETIC_CHAT)), err
        done += 1
    assert named > 0  # some flips did make a text invalid


def recovery_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_damage_is_named_only_where_it_is(tmp_path):
    """A message that really holds U+FFFD is not called damaged."""
    db = tmp_path / "iris.db"
    with store_module.Store(db) as store:
        thread = store.create_thread("t")
        store.add_message(thread, {"role": "user", "content": "a real \ufffd, typed"})
        assert store.messages(thread)[0]["content"] == "a real \ufffd, typed"
        assert store.damaged == {}


def test_a_damaged_role_is_read_from_its_index(tmp_path):
    db = tmp_path / "iris.db"
    with store_module.Store(db) as store:
        thread = store.create_thread("t")
        ids = store.add_messages(thread, [{"role": "user", "content": "question one two"},
                                          {"role": "assistant", "content": "the answer, unique"}])
        store.checkpoint()
    data = db.read_bytes()
    at = data.find(b"the answer, unique")
    role = data.rfind(b"assistant", 0, at)
    assert 0 < role < at
    flip_byte(db, role + 2)
    with store_module.Store(db) as store:
        rows = store.messages(thread)
        assert [r["role"] for r in rows] == ["user", "assistant"]
        assert list(store.damaged) == [ids[1]]


def test_restart_is_suggested_only_when_the_check_finds_the_damage(tmp_path):
    from support.faults import damage_pages

    db = tmp_path / "data" / "iris.db"
    with store_module.Store(db) as store:
        thread = store.create_thread("t")
        store.add_messages(thread, load_corpus(SYNTHETIC_CHAT))
        store.checkpoint()
    healthy = tmp_path / "healthy.db"
    healthy.write_bytes(db.read_bytes())
    damage_pages(db, "messages", 1)
    with contextlib.closing(sqlite3.connect(db)) as conn:
        with pytest.raises(sqlite3.DatabaseError) as caught:
            conn.execute("SELECT count(*), max(length(content)) FROM messages NOT INDEXED").fetchone()
    exc = caught.value
    assert "start Iris again" in recovery.explain(exc, db)
    told = recovery.explain(exc, healthy)  # the same error, where the check sees nothing
    assert "start Iris again" not in told and "iris-desktop recover --salvage" in told


def test_recover_salvage_copies_a_database_on_request(capsys, tmp_path):
    data = tmp_path / "data"
    total = build(capsys, data)
    code, out, err = run(capsys, "--data-dir", data, "recover", "--salvage", "--yes")
    assert code == 0, err
    assert "no row was lost" in out and len(asides(data)) == 1
    assert "was copied row by row, as asked" in out and "damaged" not in out
    assert message_count(data / "iris.db") == total


# -- 11. errors that name the real cause ---------------------------------------------------


def test_a_full_disk_during_import_says_so_and_imports_nothing(capsys, tmp_path):
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"messages": [
        {"role": "user" if i % 2 == 0 else "assistant",
         "content": f"message {i}: " + "lorem ipsum dolor sit amet " * 40} for i in range(3000)]}))
    with full_disk(tmp_path) as disk:
        data = disk.path / "data"
        total = build(capsys, data)
        disk.fill(leave=256 * 1024)
        code, out, err = run(capsys, "--data-dir", data, "import", big)
        assert code == 1 and one_sentence(err), err
        assert "is full" in err and "rollback" not in err
        disk.free()
        code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
        assert code == 0 and err == "" and listed_messages(out) == total
        assert len(re.findall(r"^\s*\d+\s+(?:[\d-]+ [\d:]+\s+)?[\d,]+ messages", out, re.M)) == 1


@pytest.mark.parametrize("offset", [3, 18, 19, 21])
def test_a_flipped_header_byte_is_damage_and_every_row_is_recovered(capsys, tmp_path, offset):
    """Byte 3, in 'SQLite format 3': before, a plain history one byte off was taken for an
    encrypted one ("set IRIS_STORAGE_PASSPHRASE"), and recover --salvage refused it."""
    data = tmp_path / "data"
    total = build(capsys, data)
    flip_byte(data / "iris.db", offset)
    code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0, err
    said = "first 16 bytes no longer read 'SQLite format 3'" if offset < 16 else rf"bytes? {offset}\b"
    assert "header" in err and re.search(said, err) and "read-only" not in err
    assert "no row was lost" in err and listed_messages(out) == total


def test_a_schema_record_that_is_not_text_is_damage_and_every_row_is_recovered(capsys, tmp_path):
    """A flipped byte in an index's schema record: SQLite's own message then quotes bytes
    that are not UTF-8, which Python could not decode (a traceback, found by the damaged-
    database fuzz). It is damage like any other: set aside, every row recovered."""
    data = tmp_path / "data"
    total = build(capsys, data)
    conn = sqlite3.connect(data / "iris.db")
    conn.execute("PRAGMA writable_schema = ON")
    broken = "CAST(X'6d7669e9' AS TEXT)"  # 'mvi' and a lone 0xE9
    assert conn.execute(f"UPDATE sqlite_master SET name = {broken}, sql = 'CREATE INDEX ' || {broken} || "
                        "' ON message_vectors(model, message_id' WHERE name = 'message_vectors_model'").rowcount == 1
    conn.commit()
    conn.close()
    assert recovery.quick_check(data / "iris.db") == ["the database's schema is damaged (its text is not readable)"]
    code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0, err
    assert "schema is damaged" in err and "no row was lost" in err and listed_messages(out) == total


def test_a_header_still_older_than_its_wal_is_not_damage(tmp_path):
    """A new database's file header says schema format 0 until the -wal is checkpointed."""
    db = tmp_path / "iris.db"
    with store_module.Store(db) as store:
        store.add_message(store.create_thread("t"), {"role": "user", "content": "hi"})
        assert recovery.header_problems(db) == [] and recovery.quick_check(db) == []
        second, found = store_module.open_store(db)
        second.close()
        assert found is None and recovery.set_aside_files(db) == []


def test_explain_names_a_damaged_header(tmp_path):
    db = tmp_path / "iris.db"
    with store_module.Store(db) as store:
        store.create_thread("t")
        store.checkpoint()
    flip_byte(db, 18)
    with contextlib.closing(sqlite3.connect(db)) as conn:
        with pytest.raises(sqlite3.DatabaseError) as caught:
            conn.execute("INSERT INTO threads(title, created_at, updated_at) VALUES ('x', 0, 0)")
    told = recovery.explain(caught.value, db)
    assert "header" in told and "byte 18" in told and "writable" not in told


def test_gui_tells_of_a_set_aside_database_once(qtbot, tmp_path, monkeypatch, capsys):
    from support.windows import run_gui_recording

    data = tmp_path / "data"
    build(capsys, data)
    aside = data / "iris.db.corrupt-20260101T000000"
    (data / "iris.db").rename(aside)
    shown = run_gui_recording(monkeypatch, data)
    assert [kind for kind, _ in shown] == ["warning", "window"]
    assert aside.name in shown[0][1] and "iris-desktop recover" in shown[0][1]
    assert run_gui_recording(monkeypatch, data) == [("window", "")]  # told once
    code, _, err = run(capsys, "--data-dir", data, "threads", "--no-model")  # the CLI still names it
    assert code == 0 and aside.name in err and "iris-desktop recover" in err


def test_a_salvage_keeps_the_unsent_drafts(capsys, tmp_path):
    """Drafts are what the user typed and has not sent: a salvage copies them with the
    chats (it left them behind in the database set aside)."""
    from iris_desktop.core.store import Store

    data = tmp_path / "data"
    build(capsys, data)
    with Store(data / "iris.db") as store:
        thread = store.threads()[0]["id"]
        store.save_draft(thread, "half a question about the trip", [("plan.md", "Day 1: Porto")])
        store.save_draft(None, "the first words of a new chat")
    code, out, err = run(capsys, "--data-dir", data, "recover", "--salvage", "--yes")
    assert code == 0 and "no row was lost" in out and "2 drafts" in out, err
    with Store(data / "iris.db") as store:
        assert store.draft_with_files(thread) == ("half a question about the trip",
                                                  [("plan.md", "Day 1: Porto")])
        assert store.draft(None) == "the first words of a new chat"


def test_a_salvage_of_a_history_with_only_a_new_chats_draft_or_no_drafts_table(capsys, tmp_path):
    """The draft of a chat not begun has no chat: a salvage with no chat copied tried to
    make it one titled NULL and failed whole. A database from before drafts were kept
    (schema 13) has no drafts to lose."""
    import sqlite3

    from iris_desktop.core.store import Store

    data = tmp_path / "data"
    with Store(data / "iris.db") as store:
        store.save_draft(None, "the first words of a new chat")
    code, out, err = run(capsys, "--data-dir", data, "recover", "--salvage", "--yes")
    assert code == 0 and "no row was lost" in out, err
    with Store(data / "iris.db") as store:
        assert store.draft(None) == "the first words of a new chat" and store.threads() == []
    build(capsys, data)
    with contextlib.closing(sqlite3.connect(data / "iris.db")) as conn:
        conn.execute("DROP TABLE drafts")
        conn.commit()
    code, out, err = run(capsys, "--data-dir", data, "recover", "--salvage", "--yes")
    assert code == 0 and "no row was lost" in out and "0 drafts" in out, err


def test_recover_works_on_an_encrypted_history(capsys, tmp_path, monkeypatch):
    from iris_desktop.core.store import cipher

    if not cipher.available():
        pytest.skip(reason="sqlcipher3 is not installed")
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", "correct horse battery staple")
    data = tmp_path / "data"
    total = len(load_corpus(SYNTHETIC_CHAT))
    code, _, err = run(capsys, "--data-dir", data, "--set", "storage.encrypt=true", "import",
                       SYNTHETIC_CHAT)
    assert code == 0, err
    assert cipher.is_encrypted(data / "iris.db") is True
    code, out, err = run(capsys, "--data-dir", data, "recover", "--salvage", "--yes")
    assert code == 0 and "no row was lost" in out, err
    aside = asides(data)[0]
    assert cipher.is_encrypted(aside) is True and cipher.is_encrypted(data / "iris.db") is True
    code, out, err = run(capsys, "--data-dir", data, "recover")
    assert code == 0 and f"{total:,} messages" in out and "cannot be opened" not in out, err
    code, out, err = run(capsys, "--data-dir", data, "recover", aside.name, "--yes")
    assert code == 0, err
    code, out, err = run(capsys, "--data-dir", data, "--set", "storage.encrypt=true",
                         "threads", "--no-model")
    assert code == 0 and listed_messages(out) == total, err


def holding_open(db: Path):
    """A second process (as a window would) with ``db`` open until its stdin closes."""
    import subprocess
    import sys

    holder = subprocess.Popen(
        [sys.executable, "-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
         "c.execute('PRAGMA journal_mode = WAL'); c.execute('SELECT count(*) FROM messages'"
         ").fetchone(); print('ready', flush=True); sys.stdin.read()", str(db)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "ready"
    return holder


def test_recover_refuses_while_another_process_has_the_database_open(capsys, tmp_path):
    data = tmp_path / "data"
    build(capsys, data)
    aside = data / "iris.db.corrupt-20260101T000000"
    aside.write_bytes((data / "iris.db").read_bytes())
    holder = holding_open(data / "iris.db")
    try:
        before = sha256(data / "iris.db")
        for argv in (["recover", "--salvage", "--yes"], ["recover", aside.name, "--yes"]):
            code, out, err = run(capsys, "--data-dir", data, *argv)
            assert code == 1 and one_sentence(err) and "has" in err and "open" in err, err
            assert "nothing was changed" in err
        assert sha256(data / "iris.db") == before and len(asides(data)) == 1
    finally:
        holder.communicate("")
    code, out, err = run(capsys, "--data-dir", data, "recover", aside.name, "--yes")
    assert code == 0, err


def test_a_put_back_is_refused_when_the_history_was_opened_during_its_copy(capsys, tmp_path,
                                                                            monkeypatch):
    """A review: "in use" was checked only before the copy (minutes on a large history);
    a window started meanwhile had the history open when it was set aside and the copy
    renamed in under it. It is checked again once the put-back holds the lock (a start
    waits for it), before anything moves: refused, the copy removed, nothing changed."""
    data = tmp_path / "data"
    build(capsys, data)
    aside = data / "iris.db.corrupt-20260101T000000"
    aside.write_bytes((data / "iris.db").read_bytes())
    holders = []
    swap = recovery._put_in

    def opened_during_the_copy(path, file, work):
        holders.append(holding_open(path))
        return swap(path, file, work)

    monkeypatch.setattr(recovery, "_put_in", opened_during_the_copy)
    before = sha256(data / "iris.db")
    try:
        code, out, err = run(capsys, "--data-dir", data, "recover", aside.name, "--yes")
        assert code == 1 and one_sentence(err) and "has" in err and "open" in err, err
        assert "nothing was changed" in err and len(holders) == 1
        assert sha256(data / "iris.db") == before and len(asides(data)) == 1
        assert not list(data.glob("iris.db.restoring-*")) and not (data / "iris.db.put-back").exists()
    finally:
        for holder in holders:
            holder.communicate("")
    monkeypatch.setattr(recovery, "_put_in", swap)
    code, out, err = run(capsys, "--data-dir", data, "recover", aside.name, "--yes")
    assert code == 0, err


def test_a_chat_cut_by_a_damaged_page_stays_one_chat_on_its_path(tmp_path):
    """Before, the message after the rows a damaged page took lost its parent and became
    a root: the window's path started there, and every message above the gap (the chat's
    beginning) was off the path, shown nowhere. It now hangs below the nearest earlier
    message left, so the chat reads on across the gap."""
    from iris_desktop.core.store import Store, open_store

    from support.faults import pages_of_messages

    path = tmp_path / "iris.db"
    with Store(path) as store:
        thread = store.create_thread("long")
        store.add_messages(thread, [{"role": "user" if i % 2 == 0 else "assistant",
                                     "content": f"message {i} " * 6} for i in range(2000)])
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def zeroed(target: Path, page: int) -> None:  # a leaf's cell pointers: its rows unreadable
        with open(target, "r+b") as handle:
            handle.seek((page - 1) * 4096)
            handle.write(b"\x0d" + b"\xff" * 40)

    pages = pages_of_messages(path, zeroed, lambda probe: sqlite3.connect(
        f"{probe.as_uri()}?mode=ro&immutable=1", uri=True))
    assert len(pages) > 10
    zeroed(path, pages[len(pages) // 3])
    store, recovery = open_store(path)
    with store:
        assert recovery is not None and 0 < recovery.lost["messages"] < 100
        on_path = [m["id"] for m in store.messages(thread)]
        assert on_path[0] == 1 and on_path[-1] == 2000
        assert len(on_path) == 2000 - recovery.lost["messages"]  # every row kept is shown


def test_a_set_aside_cut_off_before_the_database_moved_gives_its_wal_back(capsys, tmp_path):
    """An audit: `recover` killed after it had moved the history's -wal aside, before the
    database: the chats committed only in that WAL were lost in silence at the next start
    (the orphan WAL listed nowhere). The next start gives the WAL back first."""
    import subprocess
    import sys as _sys
    import time as _time

    from iris_desktop.paths import app_paths

    data = tmp_path / "data"
    build(capsys, data)
    db = app_paths(data).db_path
    writer = (f"import os, sys; sys.path[:0] = {_sys.path!r}\n"
              "from iris_desktop.core.store import Store\n"
              f"s = Store({str(db)!r}); t = s.create_thread('in the WAL only')\n"
              "s.add_message(t, {'role': 'user', 'content': 'committed, never checkpointed'})\n"
              "os._exit(0)  # killed: no checkpoint at close\n")
    subprocess.run([_sys.executable, "-c", writer], check=True)
    wal = db.with_name(db.name + "-wal")
    assert wal.exists() and wal.stat().st_size > 0
    stamp = _time.strftime("%Y%m%dT%H%M%S", _time.localtime(_time.time() + 2))
    for suffix in ("-wal", "-shm"):  # moved first, then the kill: the database stayed
        side = db.with_name(db.name + suffix)
        if side.exists():
            side.rename(db.with_name(f"{db.name}.before-restore-{stamp}{suffix}"))
    code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0, err
    assert "in the WAL only" in out
    assert not list(data.glob("iris.db.before-restore-*"))
