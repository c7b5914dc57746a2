"""``iris-desktop rekey``: the encrypted history encrypted again with a new key. Before, a
history encrypted with the keyring's key could never leave that computer (its key stays in
the keyring; README "A keyring's key stays in the keyring"), and a passphrase could not be
changed. A real SQLCipher file under a real data folder, the CLI run in-process, a real
second process holding the history open, and an in-memory keyring plugged into the
``keyring`` package (this machine has none)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("sqlcipher3")

from iris_desktop.core.store import StoreError  # noqa: E402
from iris_desktop.core.store.cipher import is_encrypted  # noqa: E402
from iris_desktop.paths import app_paths  # noqa: E402
from iris_desktop.storage_key import change_key, find_key  # noqa: E402

from support.helpers import run_cli as run  # noqa: E402
from support.holders import encrypt_history, hold_encrypted
from support.network import memory_keyring  # noqa: E402

OLD = "correct horse battery staple 4711"
NEW = "a new passphrase for the laptop 2026"
PHRASE = "quince-harbour-5520"
REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.usefixtures("no_keyring")


@pytest.fixture
def data(tmp_path, capsys, monkeypatch) -> Path:
    """A history with one chat holding PHRASE (plain: each test encrypts it its way)."""
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"role": "user", "content": f"Remember {PHRASE}."}) + "\n"
                    + json.dumps({"role": "assistant", "content": "Noted."}) + "\n")
    folder = tmp_path / "data"
    code, _, err = run(capsys, "--data-dir", folder, "import", chat)
    assert code == 0, err
    for name in ("IRIS_STORAGE_ENCRYPT", "IRIS_STORAGE_PASSPHRASE", "IRIS_NEW_STORAGE_PASSPHRASE"):
        monkeypatch.delenv(name, raising=False)
    return folder


encrypt = encrypt_history  # (the passphrase left set)


def exported(capsys, data: Path) -> str:
    code, out, err = run(capsys, "--data-dir", data, "export", "1")
    assert code == 0, err
    return out


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_keyring_key_becomes_a_passphrase_and_the_folder_opens_on_another_computer(
        capsys, monkeypatch, data, tmp_path):
    kept = memory_keyring()
    encrypt(capsys, monkeypatch, data, None)
    backup = tmp_path / "backup.db"  # a copy the user made while the keyring's key held it
    backup.write_bytes((data / "iris.db").read_bytes())
    monkeypatch.setenv("IRIS_NEW_STORAGE_PASSPHRASE", NEW)
    code, out, err = run(capsys, "--data-dir", data, "rekey")
    assert code == 0, err
    assert "is now encrypted with the new passphrase" in out and NEW not in out + err
    assert find_key(backup) is not None  # the old key stays for copies made before

    kept.clear()  # another computer: no key in its keyring
    monkeypatch.delenv("IRIS_NEW_STORAGE_PASSPHRASE")
    code, _, err = run(capsys, "--data-dir", data, "export", "1")
    assert code != 0 and "it was encrypted with a passphrase" in err  # asked for, not the keyring
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", NEW)
    assert PHRASE in exported(capsys, data)
    assert is_encrypted(data / "iris.db") is True


def test_a_passphrase_is_changed_and_the_old_one_opens_it_no_more(capsys, monkeypatch, data):
    encrypt(capsys, monkeypatch, data, OLD)
    monkeypatch.setenv("IRIS_NEW_STORAGE_PASSPHRASE", NEW)
    code, out, err = run(capsys, "--data-dir", data, "rekey", "--to", "passphrase")
    assert code == 0, err
    assert "set IRIS_STORAGE_PASSPHRASE to it" in out
    code, _, err = run(capsys, "--data-dir", data, "export", "1")  # the old one still set
    assert code != 0 and "IRIS_STORAGE_PASSPHRASE" in err and "does not open" in err
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", NEW)
    assert PHRASE in exported(capsys, data)


def test_a_passphrase_becomes_a_keyring_key(capsys, monkeypatch, data):
    encrypt(capsys, monkeypatch, data, OLD)
    kept = memory_keyring()
    code, out, err = run(capsys, "--data-dir", data, "rekey", "--to", "keyring")
    assert code == 0, err
    assert "new key kept in this computer's keyring" in out
    salt = (data / "iris.db").read_bytes()[:16].hex()
    assert list(kept) == [("iris-desktop-storage", f"database {salt}")]  # filed by its new salt
    monkeypatch.delenv("IRIS_STORAGE_PASSPHRASE")
    assert PHRASE in exported(capsys, data)  # no passphrase asked


def test_a_rekey_stopped_after_the_switch_still_opens_with_the_new_key(capsys, monkeypatch, data):
    """The new keyring key is kept before the file is switched: stopped after the switch
    and before the key is filed under the new file's salt, the next start finds it."""
    kept = memory_keyring()
    encrypt(capsys, monkeypatch, data, OLD)

    def stop(name: str) -> None:
        if name == "swapped":
            raise KeyboardInterrupt  # as if killed here

    with pytest.raises(KeyboardInterrupt):
        change_key(app_paths(data), "keyring", env={"IRIS_STORAGE_PASSPHRASE": OLD}, step=stop)
    assert [user for _, user in kept] == [str((data / "iris.db").resolve())]
    monkeypatch.delenv("IRIS_STORAGE_PASSPHRASE")
    assert PHRASE in exported(capsys, data)
    salt = (data / "iris.db").read_bytes()[:16].hex()
    assert [user for _, user in kept] == [f"database {salt}"]  # filed under its salt now


@pytest.mark.parametrize("case", ["plain", "same passphrase", "no new passphrase",
                                  "wrong current passphrase", "no keyring"])
def test_a_rekey_that_cannot_be_done_says_why_and_changes_nothing(capsys, monkeypatch, data, case):
    if case != "plain":
        encrypt(capsys, monkeypatch, data, OLD)
    before = digest(data / "iris.db")
    args, why = ["rekey"], ""
    if case == "plain":
        monkeypatch.setenv("IRIS_NEW_STORAGE_PASSPHRASE", NEW)
        why = "is not encrypted, so it has no key to change"
    elif case == "same passphrase":
        monkeypatch.setenv("IRIS_NEW_STORAGE_PASSPHRASE", OLD)
        why = "that passphrase is the one the history"
    elif case == "no new passphrase":
        why = "no new passphrase: set IRIS_NEW_STORAGE_PASSPHRASE"
    elif case == "wrong current passphrase":
        monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", "not it")
        monkeypatch.setenv("IRIS_NEW_STORAGE_PASSPHRASE", NEW)
        why = "does not open"
    else:
        args, why = ["rekey", "--to", "keyring"], "no keyring can be reached"
    code, out, err = run(capsys, "--data-dir", data, *args)
    assert code == 1 and why in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and out == ""
    assert digest(data / "iris.db") == before


def test_a_history_another_process_has_open_is_not_rekeyed(capsys, monkeypatch, data):
    encrypt(capsys, monkeypatch, data, OLD)
    before = digest(data / "iris.db")
    holder = hold_encrypted(data / "iris.db", OLD)
    try:
        assert holder.stdout.readline().strip() == "ready"
        monkeypatch.setenv("IRIS_NEW_STORAGE_PASSPHRASE", NEW)
        code, _, err = run(capsys, "--data-dir", data, "rekey")
        assert code == 1 and "another Iris process (the app, or a chat) has" in err, err
        assert digest(data / "iris.db") == before
    finally:
        holder.communicate("", timeout=60)
    assert holder.returncode == 0
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", OLD)
    assert PHRASE in exported(capsys, data)


def test_the_library_refuses_without_a_way_to_ask(data, capsys, monkeypatch):
    encrypt(capsys, monkeypatch, data, OLD)
    with pytest.raises(StoreError, match="no new passphrase"):
        change_key(app_paths(data), "passphrase", env={"IRIS_STORAGE_PASSPHRASE": OLD})


SLOW_REKEY = textwrap.dedent("""
    import sys, time
    sys.path[:0] = [{repo!r}]
    from pathlib import Path
    from iris_desktop.paths import app_paths
    from iris_desktop.storage_key import change_key

    def step(name):
        if name == "verified":  # the copy made, the switch to come: held until told
            Path({marker!r}).touch()
            deadline = time.monotonic() + 120
            while not Path({marker!r} + ".go").exists() and time.monotonic() < deadline:
                time.sleep(0.02)

    change_key(app_paths({data!r}), "passphrase", {{"IRIS_STORAGE_PASSPHRASE": {old!r},
               "IRIS_NEW_STORAGE_PASSPHRASE": {new!r}}}, None, step)
""")


def test_a_start_beside_a_rekey_says_what_the_other_process_does(capsys, monkeypatch, data,
                                                                 tmp_path):
    encrypt(capsys, monkeypatch, data, OLD)
    marker = tmp_path / "verified"
    child = subprocess.Popen([sys.executable, "-c", SLOW_REKEY.format(
        repo=str(REPO), data=str(data), marker=str(marker), old=OLD, new=NEW)])
    try:
        deadline = time.monotonic() + 120  # a safety net only: the marker says when
        while not marker.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists()
        monkeypatch.setattr("iris_desktop.core.store.cipher.CONVERSION_WAIT_S", 0.5)
        code, _, err = run(capsys, "--data-dir", data, "threads", "--no-model")
        assert code == 1, err
        assert ("another Iris process is encrypting " in err
                and "again with a new key now ('iris-desktop rekey')" in err), err
        monkeypatch.setenv("IRIS_NEW_STORAGE_PASSPHRASE", "a third one")
        code, _, err = run(capsys, "--data-dir", data, "rekey")  # a second rekey at once
        assert code == 1 and "again with a new key now" in err, err
        assert "run 'iris-desktop rekey' again when it is done; nothing was changed" in err
    finally:
        Path(str(marker) + ".go").touch()
        assert child.wait(timeout=120) == 0
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", NEW)  # the first rekey's passphrase
    assert PHRASE in exported(capsys, data)


def test_rekey_asks_both_passphrases_on_its_terminal(capsys, monkeypatch, data):
    """A real terminal (a pty): the current passphrase, then the new one twice, unechoed."""
    from support.helpers import on_a_terminal

    encrypt(capsys, monkeypatch, data, OLD)
    monkeypatch.delenv("IRIS_STORAGE_PASSPHRASE")
    code, seen = on_a_terminal(["--data-dir", data, "rekey"], {
        b"Current passphrase of the encrypted history at": OLD, b"New passphrase for": NEW,
        b"The same passphrase again": NEW})
    assert code == 0, seen
    assert b"is now encrypted with the new passphrase" in seen
    assert OLD.encode() not in seen and NEW.encode() not in seen  # never echoed
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", NEW)
    assert PHRASE in exported(capsys, data)


def test_a_rekey_to_the_keyring_that_fails_before_the_switch_leaves_no_key_behind(
        capsys, monkeypatch, data):
    """Found in review: the new key, kept by path before the switch, stayed when the
    conversion failed before it; every later start then said the keyring's key did not
    open the history (its first page "damaged")."""
    kept = memory_keyring()
    encrypt(capsys, monkeypatch, data, OLD)
    before = digest(data / "iris.db")

    def fail(name: str) -> None:
        if name == "verified":
            raise StoreError("the disk is full (a test)")

    with pytest.raises(StoreError, match="a test"):
        change_key(app_paths(data), "keyring", env={"IRIS_STORAGE_PASSPHRASE": OLD}, step=fail)
    assert kept == {} and digest(data / "iris.db") == before
    code, out, err = run(capsys, "--data-dir", data, "export", "1")
    assert code == 0 and PHRASE in out and err == "", err
