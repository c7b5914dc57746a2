"""Findings of an audit of encrypted storage (``storage.encrypt``): a write another
process committed during a conversion, a damaged plain history called encrypted, a
keyring's history asking for a passphrase never chosen, and the note of a one-run
override. Real SQLCipher files under a real data dir, the CLI run in-process through
main(), another process made real with a child process held by a gate, and the
keyring's path with an in-memory keyring (or keyring's own "fail" backend, as on an SSH
session without D-Bus).
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("sqlcipher3")

from iris_desktop.core.store import Store, StoreError  # noqa: E402
from iris_desktop.core.store.cipher import HEADER, Key, file_salt, is_encrypted  # noqa: E402
from iris_desktop.paths import app_paths  # noqa: E402
from iris_desktop.storage_key import prepare  # noqa: E402

from support.helpers import one_sentence
from support.helpers import run_cli as run  # noqa: E402
from support.network import memory_keyring  # noqa: E402

PASSPHRASE = "correct horse battery staple 4711"
PHRASE = "aubergine-zeppelin-7731"
REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.usefixtures("no_keyring")


@pytest.fixture
def history(capsys, tmp_path) -> Path:
    """A plain history with two chats, one with a planted phrase; its data dir."""
    data = tmp_path / "data"
    for n in range(2):
        chat = tmp_path / f"chat{n}.json"
        chat.write_text(json.dumps([{"role": "user", "content": f"Remember the {PHRASE} plan {n}."},
                                    {"role": "assistant", "content": "I will remember it."}]))
        code, _, err = run(capsys, "--data-dir", data, "import", chat, "--title", f"chat {n}")
        assert code == 0, err
    return data


def titles(db: Path, key: Key | None) -> set[str]:
    with Store(db, key=key) as store:
        return {thread["title"] for thread in store.threads()}


# -- 1. a write committed by another process during a conversion ---------------------------

WRITER = textwrap.dedent("""
    import sys
    sys.path[:0] = [{repo!r}]
    from iris_desktop.core.store import Store

    store = Store({db!r})  # opened (and read) before the conversion starts: a window left open
    store.threads()
    print("open", flush=True)
    sys.stdin.readline()  # the gate: the conversion's export is done
    store.create_thread("written during the conversion")
    store.close()  # closed before the converting process: it then closes last
    print("written", flush=True)
""")


def test_a_write_another_process_commits_during_a_conversion_is_never_lost(history):
    """Before (the audit's data loss): a process that had the plain history open
    committed a chat after the export, while the copy was verified, and closed; the
    converting process then closed last, its -wal went, the check for another process
    passed, and the swap dropped the chat without a word. Now the conversion takes the
    database under SQLite's exclusive lock before the export and keeps it until the swap:
    a history another process holds open is not converted (said in a sentence), and the
    other process's write lands in the history."""
    db = history / "iris.db"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER.format(repo=str(REPO), db=str(db))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    steps: list[str] = []

    def step(name: str) -> None:
        steps.append(name)
        if name == "exported":  # the other process writes now, and closes
            writer.stdin.write("go\n")
            writer.stdin.flush()
            assert writer.stdout.readline().strip() == "written"

    try:
        assert writer.stdout.readline().strip() == "open"
        refused = None
        try:
            prepare(app_paths(history), True, {"IRIS_STORAGE_PASSPHRASE": PASSPHRASE}, None, step)
        except StoreError as exc:
            refused = str(exc)
        if "exported" not in steps:  # refused before the export: the writer goes on now
            writer.stdin.write("go\n")
            writer.stdin.flush()
            assert writer.stdout.readline().strip() == "written"
    finally:
        writer.communicate("", timeout=60)
    assert writer.returncode == 0
    key = Key.passphrase(PASSPHRASE) if is_encrypted(db) else None
    assert "written during the conversion" in titles(db, key)  # before: gone
    assert refused is not None and f"another Iris process has {db} open" in refused
    assert is_encrypted(db) is False and steps == []
    assert sorted(p.name for p in history.iterdir() if p.name.startswith("iris.db")) == ["iris.db"]


def test_a_conversion_alone_still_converts_and_leaves_no_wal(capsys, monkeypatch, history):
    """The exclusive lock held through the swap: with no other process, the conversion
    goes through, and the connection that held it closed last (no -wal, no -shm)."""
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", PASSPHRASE)
    code, _, err = run(capsys, "--data-dir", history, "--set", "storage.encrypt=true", "threads",
                       "--no-model")
    assert code == 0 and "is now encrypted" in err
    db = history / "iris.db"
    assert is_encrypted(db) is True
    assert titles(db, Key.passphrase(PASSPHRASE)) == {"chat 0", "chat 1"}


# -- 2. a damaged plain history is not called encrypted ------------------------------------


def zero_first(db: Path, size: int) -> None:
    with open(db, "r+b") as handle:
        handle.write(b"\0" * size)


@pytest.mark.parametrize("damage", ["first page zeroed", "header zeroed", "cut to 8 bytes",
                                    "cut to 300 bytes"])
def test_a_damaged_plain_history_is_not_called_encrypted(capsys, history, damage):
    """Before: a plain history whose first page a power cut zeroed, or cut below 16 bytes,
    was "encrypted": every command asked for a passphrase that never existed, and
    'recover --salvage' refused it as encrypted. An encrypted file starts with 16 random
    bytes and holds at least one page (512 bytes): such a file is a damaged plain one."""
    db = history / "iris.db"
    if damage == "first page zeroed":
        zero_first(db, 4096)
    elif damage == "header zeroed":
        zero_first(db, 100)
    else:
        with open(db, "r+b") as handle:
            handle.truncate(8 if damage == "cut to 8 bytes" else 300)
    assert is_encrypted(db) is False
    code, _, err = run(capsys, "--data-dir", history, "threads", "--no-model")
    if damage == "header zeroed":  # the rows are all there: set aside and salvaged
        assert code == 0 and "no row was lost" in err, err
    else:
        assert code == 1 and one_sentence(err), err
    assert "encrypted" not in err and "passphrase" not in err
    code, out, err = run(capsys, "--data-dir", history, "recover", "--salvage", "--yes")
    assert "is encrypted" not in out + err and "passphrase" not in out + err


def test_an_encrypted_history_is_still_encrypted(capsys, monkeypatch, history):
    """The rule for damaged plain files leaves every real encrypted file encrypted: its
    first 16 bytes are a random salt, and it has at least one page."""
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", PASSPHRASE)
    assert run(capsys, "--data-dir", history, "--set", "storage.encrypt=true", "threads",
               "--no-model")[0] == 0
    db = history / "iris.db"
    assert is_encrypted(db) is True and not db.read_bytes().startswith(HEADER)
    assert len(set(db.read_bytes()[:16])) > 1


# -- 3. a history encrypted with the keyring's key, where that keyring is not --------------


def keyring_history(capsys, monkeypatch, history) -> tuple[dict, str]:
    """``history`` encrypted with a random key kept in an in-memory keyring; (the
    keyring, what the switch said)."""
    saved = memory_keyring()
    monkeypatch.delenv("IRIS_STORAGE_PASSPHRASE", raising=False)
    code, _, err = run(capsys, "--data-dir", history, "config", "set", "storage.encrypt", "true")
    assert code == 0, err
    code, _, err = run(capsys, "--data-dir", history, "threads", "--no-model")
    assert code == 0 and "is now encrypted" in err, err
    assert is_encrypted(history / "iris.db") is True and saved
    return saved, err


def test_encrypting_with_the_keyring_says_the_data_folder_alone_opens_nowhere_else(
        capsys, monkeypatch, history):
    """Before, nothing said that the key of a history encrypted with the keyring's key is
    not in the data folder: a copy of it (a backup, a move to another computer) could not
    be opened. It is said once, at the switch; what the key is (no secret) is recorded
    beside the history, private to the user, for the questions of later starts."""
    _, said = keyring_history(capsys, monkeypatch, history)
    assert ("Its key is kept in this computer's keyring, not in the data folder: a copy of the "
            "data folder alone cannot be opened on another computer or user account.") in said
    assert run(capsys, "--data-dir", history, "threads", "--no-model")[2] == ""  # once
    marker = history / ".iris.db.key-kind"
    assert marker.read_text() == f"keyring {file_salt(history / 'iris.db').hex()}\n"
    assert stat.S_IMODE(marker.stat().st_mode) == 0o600


def never_asked(path, new, problem):
    raise AssertionError(f"a passphrase was asked for ({path}, {new}, {problem})")


def test_a_keyring_history_where_the_keyring_cannot_be_reached_asks_no_passphrase(
        capsys, monkeypatch, history):
    """Before: opened where the keyring cannot be reached (keyring's fail backend: an SSH
    session without D-Bus), a history encrypted with the keyring's key asked for "the
    passphrase it was encrypted with", though none was ever chosen. Now the sentence
    names the keyring, and neither the CLI nor the desktop app asks for a passphrase."""
    import keyring
    from keyring.backends.fail import Keyring as Fail

    keyring_history(capsys, monkeypatch, history)
    keyring.set_keyring(Fail())
    code, _, err = run(capsys, "--data-dir", history, "threads", "--no-model")
    assert code == 1 and one_sentence(err), err
    assert ("is encrypted and its key is in your desktop keyring, which cannot be reached from "
            "this session") in err
    assert "run Iris in your desktop session" in err and "enter the passphrase" not in err
    with pytest.raises(StoreError, match="cannot be reached from this session"):
        prepare(app_paths(history), None, {}, never_asked)
    assert is_encrypted(history / "iris.db") is True


def test_a_keyring_history_on_another_account_names_that_keyring(capsys, monkeypatch, history):
    """Before: on another computer or user account (a keyring without its key), Iris asked
    for a passphrase never chosen; now it says where the key is, and asks nothing."""
    saved, _ = keyring_history(capsys, monkeypatch, history)
    saved.clear()  # another account's keyring
    code, _, err = run(capsys, "--data-dir", history, "threads", "--no-model")
    assert code == 1 and one_sentence(err), err
    assert "no key for it is kept in this computer's keyring, and no passphrase was ever" in err
    assert "a copy of the data folder alone cannot be opened elsewhere" in err
    with pytest.raises(StoreError, match="no passphrase was ever chosen for it"):
        prepare(app_paths(history), None, {}, never_asked)


def test_a_passphrase_history_without_its_passphrase_asks_for_its_passphrase(
        capsys, monkeypatch, history):
    """Before: a history encrypted with a passphrase, on a computer without a keyring,
    was said to lack a keyring "to keep its key in", as if the keyring were the problem.
    Now Iris knows it was a passphrase, and asks for it."""
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", PASSPHRASE)
    assert run(capsys, "--data-dir", history, "--set", "storage.encrypt=true", "threads",
               "--no-model")[0] == 0
    monkeypatch.delenv("IRIS_STORAGE_PASSPHRASE")
    code, _, err = run(capsys, "--data-dir", history, "threads", "--no-model")
    assert code == 1 and one_sentence(err), err
    assert ("is encrypted and it was encrypted with a passphrase: enter it, or set "
            "IRIS_STORAGE_PASSPHRASE") in err
    assert (history / ".iris.db.key-kind").read_text().startswith("passphrase ")
    asked = []
    found = prepare(app_paths(history), None, {},
                    lambda path, new, problem: asked.append(problem) or PASSPHRASE)
    assert found.key == Key.passphrase(PASSPHRASE) and asked == [None]


def test_a_history_encrypted_by_an_older_iris_says_if_a_passphrase_and_records_it(
        capsys, monkeypatch, history):
    """A history encrypted before the record existed keeps the old question, worded
    "if it was encrypted with a passphrase" (before: "enter the passphrase it was
    encrypted with", which a keyring's history never had); its next opening records it."""
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", PASSPHRASE)
    assert run(capsys, "--data-dir", history, "--set", "storage.encrypt=true", "threads",
               "--no-model")[0] == 0
    marker = history / ".iris.db.key-kind"
    marker.unlink(missing_ok=True)  # as an older Iris left it
    monkeypatch.delenv("IRIS_STORAGE_PASSPHRASE")
    code, _, err = run(capsys, "--data-dir", history, "threads", "--no-model")
    assert code == 1 and one_sentence(err), err
    assert "if it was encrypted with a passphrase, enter it, or set IRIS_STORAGE_PASSPHRASE" in err
    assert "if Iris kept its key in your desktop keyring, run Iris in your desktop session" in err
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", PASSPHRASE)
    assert run(capsys, "--data-dir", history, "threads", "--no-model")[0] == 0
    assert marker.read_text().startswith("passphrase ")
    # decrypted: no record left of a key it no longer has
    assert run(capsys, "--data-dir", history, "--set", "storage.encrypt=false", "threads",
               "--no-model")[0] == 0
    assert not marker.exists() and is_encrypted(history / "iris.db") is False


def test_a_record_of_another_file_is_not_believed(capsys, monkeypatch, history):
    """A review: the record beside the history was not tied to the file: a database put
    back from a copy encrypted with a passphrase, beside a record saying "keyring", was
    refused without asking for its passphrase. The record names the file's salt, and one
    of another file is not believed: the passphrase is asked for."""
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", PASSPHRASE)
    assert run(capsys, "--data-dir", history, "--set", "storage.encrypt=true", "threads",
               "--no-model")[0] == 0
    monkeypatch.delenv("IRIS_STORAGE_PASSPHRASE")
    (history / ".iris.db.key-kind").write_text("keyring " + "00" * 16 + "\n")
    asked = []
    found = prepare(app_paths(history), None, {},
                    lambda path, new, problem: asked.append(problem) or PASSPHRASE)
    assert found.key == Key.passphrase(PASSPHRASE) and asked == [None]


def test_a_converted_history_still_gives_a_deleted_chats_space_back(capsys, monkeypatch,
                                                                     history):
    """A review: sqlcipher_export made the converted copy with auto_vacuum off, so after
    encrypting (or decrypting) a delete left its pages in the file again. The copy is
    made incremental, both ways."""
    import sqlite3

    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", PASSPHRASE)
    assert run(capsys, "--data-dir", history, "--set", "storage.encrypt=true", "threads",
               "--no-model")[0] == 0
    with Store(history / "iris.db", key=Key.passphrase(PASSPHRASE)) as store:
        assert store.conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
    assert run(capsys, "--data-dir", history, "--set", "storage.encrypt=false", "threads",
               "--no-model")[0] == 0
    with sqlite3.connect(history / "iris.db") as conn:
        assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2


# -- 4. the note of a one-run override -----------------------------------------------------


@pytest.mark.parametrize("override", ["cli", "env"])
def test_a_one_run_override_says_the_next_start_converts_back(capsys, monkeypatch, history,
                                                               override):
    """Before: with ``encrypt = true`` in config.toml, ``--set storage.encrypt=false`` (or
    IRIS_STORAGE_ENCRYPT=off) decrypted and said "To encrypt it again: iris-desktop config
    set storage.encrypt true", which the file already said; the next plain start encrypted
    it again without that having been said. Now the note says so, and how to keep it."""
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", PASSPHRASE)
    config = history / "config.toml"
    assert run(capsys, "--data-dir", history, "config", "set", "storage.encrypt", "true")[0] == 0
    assert run(capsys, "--data-dir", history, "threads", "--no-model")[0] == 0
    if override == "env":
        monkeypatch.setenv("IRIS_STORAGE_ENCRYPT", "off")
        argv = ["--data-dir", history]
    else:
        argv = ["--data-dir", history, "--set", "storage.encrypt=false"]
    code, _, err = run(capsys, *argv, "threads", "--no-model")
    assert code == 0 and one_sentence(err), err
    assert "To encrypt it again" not in err
    assert (f"is no longer encrypted: storage.encrypt is off "
            f"({'set on the command line' if override == 'cli' else 'set by IRIS_STORAGE_ENCRYPT'})."
            f" {config} still sets it on, so the next start without that override encrypts it "
            "again; to keep it decrypted: iris-desktop config set storage.encrypt false.") in err
    monkeypatch.delenv("IRIS_STORAGE_ENCRYPT", raising=False)
    code, _, err = run(capsys, "--data-dir", history, "threads", "--no-model")  # as it said
    assert code == 0 and "is now encrypted" in err and is_encrypted(history / "iris.db") is True


def test_an_override_that_encrypts_against_the_file_says_the_next_start_decrypts(
        capsys, monkeypatch, history):
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", PASSPHRASE)
    config = history / "config.toml"
    assert run(capsys, "--data-dir", history, "config", "set", "storage.encrypt", "false")[0] == 0
    code, _, err = run(capsys, "--data-dir", history, "--set", "storage.encrypt=true", "threads",
                       "--no-model")
    assert code == 0 and one_sentence(err), err
    assert (f"is now encrypted (storage.encrypt is on, set on the command line). {config} still "
            "sets it off, so the next start without that override decrypts it again; to keep it "
            "encrypted: iris-desktop config set storage.encrypt true.") in err
    # no override, nothing in the file: the note is as it was
    assert run(capsys, "--data-dir", history, "config", "reset", "storage.encrypt")[0] == 0
    code, _, err = run(capsys, "--data-dir", history, "--set", "storage.encrypt=false", "threads",
                       "--no-model")
    assert code == 0 and "To encrypt it again: iris-desktop config set storage.encrypt true." in err
