"""Issue #44: an encrypted set-aside database is listed and put back by ``iris-desktop
recover`` whatever the history is now: encryption turned off since, or ``iris.db``
gone. Real SQLCipher files under a real data dir, the real CLI run in-process
(``run_cli``); the key from ``IRIS_STORAGE_PASSPHRASE``, or from an in-memory keyring
plugged into the ``keyring`` package (this machine has none).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import sqlite3
from pathlib import Path

import pytest

pytest.importorskip("sqlcipher3")

from iris_desktop.core.store import Store, recovery  # noqa: E402
from iris_desktop.core.store.cipher import HEADER, Key, file_salt, is_encrypted  # noqa: E402
from iris_desktop.storage_key import KEYRING_SERVICE  # noqa: E402

from conftest import SYNTHETIC_CHAT, load_corpus  # noqa: E402
from support.helpers import one_sentence, run_cli  # noqa: E402
from support.network import memory_keyring

PASSPHRASE = "correct horse battery staple 4711"
TOTAL = len(load_corpus(SYNTHETIC_CHAT))


pytestmark = pytest.mark.usefixtures("no_keyring")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def digests(folder: Path) -> dict[str, str]:
    return {p.name: sha256(p) for p in folder.iterdir() if p.is_file()}


def plain_messages(db: Path) -> int:
    """The messages of a plain database, read by the standard library's sqlite3."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return conn.execute("SELECT count(*) FROM messages").fetchone()[0]


def listed_messages(out: str) -> int:
    listed = re.findall(r"^\s*\d+\s+(?:[\d-]+ [\d:]+\s+)?([\d,]+) messages", out, re.M)
    return sum(int(m.replace(",", "")) for m in listed)


def encrypted_history_set_aside(capsys, monkeypatch, tmp_path, passphrase: str | None = PASSPHRASE
                                ) -> tuple[Path, Path]:
    """Encryption on (``config set``), a chat imported, then a salvage asked for: the
    history set aside, encrypted and whole, as ``iris.db.corrupt-<time>``, and an
    encrypted copy at ``iris.db``. Returns (data dir, the set-aside file)."""
    if passphrase:
        monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", passphrase)
    data = tmp_path / "data"
    assert run_cli(capsys, "--data-dir", data, "config", "set", "storage.encrypt", "true")[0] == 0
    code, _, err = run_cli(capsys, "--data-dir", data, "import", SYNTHETIC_CHAT)
    assert code == 0, err
    code, out, err = run_cli(capsys, "--data-dir", data, "recover", "--salvage", "--yes")
    assert code == 0 and "no row was lost" in out, err
    aside, = recovery.set_aside_files(data / "iris.db")
    assert is_encrypted(aside) is True and is_encrypted(data / "iris.db") is True
    return data, aside


def encryption_off(capsys, data: Path) -> None:
    """``config set storage.encrypt false``, and a start that decrypts the history."""
    assert run_cli(capsys, "--data-dir", data, "config", "set", "storage.encrypt", "false")[0] == 0
    code, out, err = run_cli(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0 and listed_messages(out) == TOTAL, err
    assert (data / "iris.db").read_bytes().startswith(HEADER)


@pytest.mark.parametrize("encrypt, current", [(False, "decrypted"), (False, "missing"),
                                              (True, "missing")])
def test_an_encrypted_set_aside_database_is_listed_and_put_back(capsys, monkeypatch, tmp_path,
                                                                encrypt, current):
    data, aside = encrypted_history_set_aside(capsys, monkeypatch, tmp_path)
    db = data / "iris.db"
    if not encrypt:
        encryption_off(capsys, data)
    kept = db.with_name("elsewhere.db")
    if current == "missing":
        db.rename(kept)
    before = sha256(aside)

    code, out, err = run_cli(capsys, "--data-dir", data, "recover")
    assert code == 0 and err == "", err
    line, = [ln for ln in out.splitlines() if aside.name in ln]
    assert f"{TOTAL:,} messages" in line and "?" not in line, out
    assert "encrypted, opened with IRIS_STORAGE_PASSPHRASE" in line
    listing = json.loads(run_cli(capsys, "--data-dir", data, "recover", "--json")[1])
    entry, = listing["set_aside"]
    assert entry["encrypted"] is True and entry["key"] == "IRIS_STORAGE_PASSPHRASE"
    assert entry["rows"]["messages"] == TOTAL and entry["error"] is None

    code, out, err = run_cli(capsys, "--data-dir", data, "recover", aside.name, "--yes")
    assert code == 0 and err == "", err
    assert sha256(aside) == before and is_encrypted(aside) is True  # the set-aside file stays
    if encrypt:
        assert is_encrypted(db) is True and "encrypted, opened with IRIS_STORAGE_PASSPHRASE" in out
        with Store(db, key=Key.passphrase(PASSPHRASE)) as store:
            assert store.integrity_check() == "ok"
            assert store.conn.execute("SELECT count(*) FROM messages").fetchone()[0] == TOTAL
    else:  # storage.encrypt is off: put back as a plain database, as the user asked
        assert "decrypted" in out and "storage.encrypt is off" in out
        assert db.read_bytes().startswith(HEADER) and plain_messages(db) == TOTAL
    replaced = [p for p in recovery.set_aside_files(db) if ".before-restore-" in p.name]
    if current == "missing":
        assert replaced == [] and kept.exists()
    else:  # the database it replaced is kept, and named
        assert len(replaced) == 1 and replaced[0].name in out
        assert plain_messages(replaced[0]) == TOTAL
    leftovers = [p.name for p in data.iterdir() if ".restoring-" in p.name or
                 p.name.endswith((".converting", ".replaced"))]
    assert leftovers == []

    monkeypatch.delenv("IRIS_STORAGE_PASSPHRASE", raising=False)
    if encrypt:
        monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", PASSPHRASE)
    code, out, err = run_cli(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0 and err == "" and listed_messages(out) == TOTAL, err


def test_without_its_key_an_encrypted_set_aside_database_is_named_and_left_alone(
        capsys, monkeypatch, tmp_path):
    data, aside = encrypted_history_set_aside(capsys, monkeypatch, tmp_path)
    encryption_off(capsys, data)
    for passphrase in (None, "not the passphrase"):
        if passphrase is None:
            monkeypatch.delenv("IRIS_STORAGE_PASSPHRASE")
        else:
            monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", passphrase)
        before = digests(data)
        code, out, err = run_cli(capsys, "--data-dir", data, "recover")
        assert code == 0 and "Traceback" not in err, err
        line, = [ln for ln in out.splitlines() if aside.name in ln]
        assert "encrypted" in line and "IRIS_STORAGE_PASSPHRASE" in line and "?" not in line
        assert ("does not open it" in line) == (passphrase is not None)
        entry, = json.loads(run_cli(capsys, "--data-dir", data, "recover", "--json")[1])["set_aside"]
        assert entry["encrypted"] is True and entry["key"] is None and entry["rows"] is None
        assert "IRIS_STORAGE_PASSPHRASE" in entry["key_problem"]

        code, out, err = run_cli(capsys, "--data-dir", data, "recover", aside.name, "--yes")
        assert code == 1 and one_sentence(err), err
        assert f"{aside.name} is encrypted" in err and "IRIS_STORAGE_PASSPHRASE" in err
        assert "nothing was changed" in err and (passphrase is None or passphrase not in err)
        assert {k: v for k, v in digests(data).items() if k != "iris.db.set-aside-seen"} == {
            k: v for k, v in before.items() if k != "iris.db.set-aside-seen"}


def test_a_damaged_encrypted_set_aside_database_is_listed_but_not_put_back(
        capsys, monkeypatch, tmp_path):
    """The set-aside file the start-up check made of a damaged encrypted history."""
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", PASSPHRASE)
    data = tmp_path / "data"
    code, _, err = run_cli(capsys, "--data-dir", data, "--set", "storage.encrypt=true", "import",
                           SYNTHETIC_CHAT)
    assert code == 0, err
    with open(data / "iris.db", "r+b") as handle:  # one page's ciphertext flipped: its HMAC fails
        handle.seek(4096 * 6 + 200)
        handle.write(b"\xa5" * 64)
    code, out, err = run_cli(capsys, "--data-dir", data, "--set", "storage.encrypt=true",
                             "threads", "--no-model")
    assert code == 0 and "set aside, unchanged" in err, err
    aside, = recovery.set_aside_files(data / "iris.db")
    encryption_off(capsys, data)

    code, out, err = run_cli(capsys, "--data-dir", data, "recover")
    line, = [ln for ln in out.splitlines() if aside.name in ln]
    assert code == 0 and "encrypted, opened with IRIS_STORAGE_PASSPHRASE" in line, out
    current = sha256(data / "iris.db")
    code, out, err = run_cli(capsys, "--data-dir", data, "recover", aside.name, "--yes")
    assert code == 1 and one_sentence(err) and "is damaged" in err, err
    assert "nothing was changed" in err and "not an Iris database" not in err
    assert sha256(data / "iris.db") == current


def test_a_keyring_key_opens_set_aside_databases_after_encryption_is_turned_off(
        capsys, monkeypatch, tmp_path):
    saved = memory_keyring()
    data, aside = encrypted_history_set_aside(capsys, monkeypatch, tmp_path, passphrase=None)
    db = data / "iris.db"
    # the salvaged copy has a salt of its own: its key is kept under it too, so it opens
    assert (KEYRING_SERVICE, f"database {file_salt(db).hex()}") in saved
    assert (KEYRING_SERVICE, f"database {file_salt(aside).hex()}") in saved
    encryption_off(capsys, data)
    db.rename(data / "elsewhere.db")

    code, out, err = run_cli(capsys, "--data-dir", data, "recover")
    line, = [ln for ln in out.splitlines() if aside.name in ln]
    assert code == 0 and f"{TOTAL:,} messages" in line, err
    assert "encrypted, opened with the key kept in the keyring" in line
    code, out, err = run_cli(capsys, "--data-dir", data, "recover", aside.name, "--yes")
    assert code == 0 and "decrypted" in out, err
    assert plain_messages(db) == TOTAL and is_encrypted(aside) is True

    # encryption on again: the set-aside file is put back encrypted, and opens next time
    code, out, err = run_cli(capsys, "--data-dir", data, "--set", "storage.encrypt=true",
                             "recover", aside.name, "--yes")
    assert code == 0 and is_encrypted(db) is True, err
    code, out, err = run_cli(capsys, "--data-dir", data, "--set", "storage.encrypt=true",
                             "threads", "--no-model")
    assert code == 0 and listed_messages(out) == TOTAL, err


def test_a_history_salvaged_with_a_keyring_key_opens_at_the_next_start(capsys, monkeypatch,
                                                                       tmp_path):
    """Salvaged at start (a damaged page), and salvaged before the key was kept under the
    new file's salt: the key kept for the database set aside beside it opens it."""
    saved = memory_keyring()
    monkeypatch.setenv("IRIS_STORAGE_ENCRYPT", "true")
    data = tmp_path / "data"
    assert run_cli(capsys, "--data-dir", data, "import", SYNTHETIC_CHAT)[0] == 0
    assert run_cli(capsys, "--data-dir", data, "threads", "--no-model")[0] == 0  # filed by salt
    db = data / "iris.db"
    with open(db, "r+b") as handle:
        handle.seek(4096 * 6 + 200)
        handle.write(b"\xa5" * 64)
    code, out, err = run_cli(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0 and "set aside, unchanged" in err, err
    code, out, err = run_cli(capsys, "--data-dir", data, "threads", "--no-model")
    # opens with its key; the set-aside original is named until recover lists it (README)
    assert code == 0 and listed_messages(out) > 0, err
    assert err.count("\n") == 1 and "iris-desktop recover" in err and "key" not in err, err

    # a salvage that kept no key for the new file (as Iris did before)
    (key_hex,) = set(saved.values())
    recovery.salvage(db, ["damaged"], Key.raw(bytes.fromhex(key_hex)))
    assert (KEYRING_SERVICE, f"database {file_salt(db).hex()}") not in saved
    code, out, err = run_cli(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0 and listed_messages(out) > 0, err
    assert (KEYRING_SERVICE, f"database {file_salt(db).hex()}") in saved
