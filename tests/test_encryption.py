"""Encryption at rest (``storage.encrypt``): a real SQLCipher file under a real data dir,
the CLI run in-process through main(), a crash made real with a child process that
dies between the steps of a conversion, and the desktop app's passphrase dialog answered
with pytest-qt. This machine has no keyring: the passphrase (``IRIS_STORAGE_PASSPHRASE``
or the dialog) is the path tested, and one test plugs an in-memory keyring backend into
the ``keyring`` package for the keyring's path.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("sqlcipher3")

from iris_desktop.core.store import Store, StoreError, open_store, quick_check  # noqa: E402
from iris_desktop.core.store.cipher import HEADER, Key, is_encrypted  # noqa: E402
from iris_desktop.generation import GenerationRequest
from iris_desktop.host import Host  # noqa: E402
from iris_desktop.runtime.kv_store import SEALED, KVStateStore  # noqa: E402
from iris_desktop.runtime.protocol import Capabilities, KVState  # noqa: E402
from iris_desktop.storage_key import find_key  # noqa: E402

from conftest import AGENT_FILES, load_corpus  # noqa: E402
from support.fakes import ScriptedRuntime  # noqa: E402
from support.helpers import one_sentence
from support.helpers import run_cli as run
from support.network import memory_keyring

PASSPHRASE = "correct horse battery staple 4711"
PHRASE = "aubergine-zeppelin-7731"
REPO = Path(__file__).resolve().parent.parent


pytestmark = pytest.mark.usefixtures("no_keyring")


def files_under(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(data).hexdigest()
            for p, data in files_under(folder).items() if "logs" not in p.parts}


def planted_chat(tmp_path: Path) -> Path:
    chat = tmp_path / "planted.jsonl"
    chat.write_text(json.dumps({"role": "user", "content": f"Remember the {PHRASE} plan."}) + "\n"
                    + json.dumps({"role": "assistant", "content": "I will remember it."}) + "\n")
    return chat


@pytest.fixture
def history(capsys, tmp_path):
    """A plain history with a few threads: an agent transcript, a chat with a planted
    phrase. Returns (data dir, {title: thread id})."""
    data = tmp_path / "data"
    threads = {}
    for path, title in ((AGENT_FILES[0], "agent"), (planted_chat(tmp_path), "planted"),
                        (AGENT_FILES[1], "second")):
        code, out, err = run(capsys, "--data-dir", data, "import", path, "--title", title)
        assert code == 0, err
        threads[title] = int(out.strip())
    return data, threads


def encrypt_on(monkeypatch, passphrase: str | None = PASSPHRASE) -> None:
    monkeypatch.setenv("IRIS_STORAGE_ENCRYPT", "true")
    if passphrase is None:
        monkeypatch.delenv("IRIS_STORAGE_PASSPHRASE", raising=False)
    else:
        monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", passphrase)


def export(capsys, data: Path, thread: int) -> list[dict]:
    code, out, err = run(capsys, "--data-dir", data, "export", thread)
    assert code == 0, err
    return json.loads(out)


# -- encrypted at rest ---------------------------------------------------------------------


def test_turning_encryption_on_encrypts_the_history_and_the_cli_works(capsys, monkeypatch, history):
    data, threads = history
    before = {title: export(capsys, data, tid) for title, tid in threads.items()}
    assert PHRASE.encode() in (data / "iris.db").read_bytes()  # plain: readable on disk

    encrypt_on(monkeypatch)
    code, out, err = run(capsys, "--data-dir", data, "threads", "--json", "--no-model")
    assert code == 0, err
    assert {row["title"] for row in json.loads(out)} == set(threads)

    db = data / "iris.db"
    assert not db.read_bytes().startswith(HEADER)
    with pytest.raises(sqlite3.DatabaseError, match="not a database"):
        sqlite3.connect(db).execute("SELECT count(*) FROM sqlite_master").fetchall()
    for path, content in files_under(data).items():  # the db, its -wal, KV states, logs
        assert PHRASE.encode() not in content, path
        assert PASSPHRASE.encode() not in content, path
    assert not [p for p in data.iterdir() if ".converting" in p.name or ".replaced" in p.name]

    assert {title: export(capsys, data, tid) for title, tid in threads.items()} == before
    assert before["agent"]["messages"] == load_corpus(AGENT_FILES[0])
    code, out, err = run(capsys, "--data-dir", data, "context", threads["planted"], "--json",
                         "--no-model", "--show-request")
    assert code == 0, err
    assert PHRASE in out
    # what is written while encrypted is encrypted too (the -wal included)
    code, out, err = run(capsys, "--data-dir", data, "import", planted_chat(data.parent),
                         "--title", "later")
    assert code == 0, err
    for path, content in files_under(data).items():
        assert PHRASE.encode() not in content, path


def test_a_new_history_is_created_encrypted(capsys, monkeypatch, tmp_path):
    encrypt_on(monkeypatch)
    data = tmp_path / "fresh"
    code, out, err = run(capsys, "--data-dir", data, "import", planted_chat(tmp_path))
    assert code == 0, err
    assert is_encrypted(data / "iris.db") is True
    for path, content in files_under(data).items():
        assert PHRASE.encode() not in content, path
    assert PHRASE in json.dumps(export(capsys, data, int(out.strip())))


def test_the_quick_check_at_start_works_on_an_encrypted_file(tmp_path):
    key = Key.passphrase(PASSPHRASE)
    path = tmp_path / "iris.db"
    with Store(path, key=key) as store:
        store.create_thread("checked")
    assert quick_check(path, key=key) == []
    store, recovery = open_store(path, key)
    with store:
        assert recovery is None and store.threads()[0]["title"] == "checked"
        # sqlcipher3's own exceptions come out as the standard library's
        with pytest.raises(sqlite3.OperationalError):
            store.conn.execute("SELECT * FROM no_such_table")


def test_the_file_is_sqlcipher_4_opened_by_its_own_kdf(capsys, monkeypatch, history):
    """Any SQLCipher 4 opens the history with ``PRAGMA key = 'passphrase'`` (Iris derives
    that same key once per process instead of once per connection)."""
    from sqlcipher3 import dbapi2 as sqlcipher

    data, threads = history
    encrypt_on(monkeypatch)
    assert run(capsys, "--data-dir", data, "threads", "--no-model")[0] == 0
    conn = sqlcipher.connect(str(data / "iris.db"))
    try:
        conn.execute("PRAGMA key = '" + PASSPHRASE.replace("'", "''") + "'")
        assert conn.execute("PRAGMA cipher_version").fetchone()[0].startswith("4.")
        assert conn.execute("SELECT count(*) FROM threads").fetchone()[0] == len(threads)
    finally:
        conn.close()


def test_a_damaged_encrypted_history_is_salvaged_into_an_encrypted_one(tmp_path):
    key = Key.passphrase(PASSPHRASE)
    path = tmp_path / "iris.db"
    with Store(path, key=key) as store:
        for n in range(4):
            thread = store.create_thread(f"thread {n}")
            store.add_messages(thread, [{"role": "user", "content": f"{PHRASE} {n} " * 400},
                                        {"role": "assistant", "content": "noted " * 400}])
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    with open(path, "r+b") as handle:  # one page's ciphertext flipped: its HMAC fails
        handle.seek(4096 * 6 + 200)
        handle.write(b"\xa5" * 64)
    assert quick_check(path, key=key) != []
    store, recovery = open_store(path, key)
    with store:
        assert recovery is not None
        assert store.integrity_check() == "ok"
        assert len(store.threads()) == 4
    assert is_encrypted(path) is True
    assert PHRASE.encode() not in path.read_bytes()


def test_a_truncated_encrypted_history_is_salvaged_and_its_key_not_blamed(capsys, monkeypatch,
                                                                         history):
    """Before (an audit): an encrypted history cut short could not be opened ("database
    disk image is malformed", no next step), and `recover --salvage` said no key opened
    it; the same damage to a plain history is set aside and salvaged at start. The key
    is checked on the first page; what lies past the cut is the salvage's."""
    data, threads = history
    encrypt_on(monkeypatch)
    assert run(capsys, "--data-dir", data, "threads", "--no-model")[0] == 0
    db = data / "iris.db"
    size = db.stat().st_size
    os.truncate(db, size * 3 // 4 // 4096 * 4096)
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", "not the passphrase")
    code, _, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code != 0 and "does not open the encrypted history" in err  # a wrong key still is
    encrypt_on(monkeypatch)
    code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0, err
    assert "was damaged" in err and "set aside, unchanged" in err and "Recovered into a new database" in err
    assert "planted" in out  # what could be read is there
    assert is_encrypted(db) is True
    code, out, err = run(capsys, "--data-dir", data, "recover")
    assert code == 0 and ".corrupt-" in out and "no key" not in out + err


def test_one_damaged_page_of_an_encrypted_history_loses_only_its_own_rows(tmp_path):
    """Before, SQLCipher's connection failed every read after the first page that failed
    its check, sound pages too: a salvage of 2,000 messages with one leaf damaged kept
    the 787 before it. Each failed read now opens the file again, so the rows of the other
    pages are kept. A raw key (no KDF), as the keyring's."""
    from iris_desktop.core.store.salvage_read import damaged_reader

    from support.faults import flip_byte, pages_of_messages

    key = Key.raw(bytes(range(32)))
    path = tmp_path / "iris.db"
    with Store(path, key=key) as store:
        thread = store.create_thread("long")
        store.add_messages(thread, [{"role": "user", "content": f"message {i} " * 6}
                                    for i in range(2000)])
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def flipped(target: Path, page: int) -> None:
        flip_byte(target, (page - 1) * 4096 + 1500, 1)

    pages = pages_of_messages(path, flipped, lambda probe: damaged_reader(probe, key))
    assert len(pages) > 10
    flipped(path, pages[len(pages) // 3])  # a leaf a third of the way in
    store, recovery = open_store(path, key)
    with store:
        assert recovery is not None
        kept = [m["id"] for m in store.messages(thread)]
    assert 1_900 < len(kept) < 2_000 and max(kept) == 2_000, len(kept)  # one leaf's rows lost
    assert recovery.lost["messages"] == 2_000 - len(kept)


# -- the wrong key -------------------------------------------------------------------------


def test_a_wrong_passphrase_is_a_clear_error_and_changes_nothing(capsys, monkeypatch, history):
    data, threads = history
    encrypt_on(monkeypatch)
    assert run(capsys, "--data-dir", data, "threads", "--no-model")[0] == 0
    before = digests(data)

    encrypt_on(monkeypatch, "not the passphrase")
    code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 1 and one_sentence(err), err
    assert f"the passphrase does not open the encrypted history at {data / 'iris.db'}" in err
    assert "not the passphrase" not in err
    assert digests(data) == before

    # turning encryption off with the wrong passphrase decrypts nothing either
    monkeypatch.setenv("IRIS_STORAGE_ENCRYPT", "false")
    code, out, err = run(capsys, "--data-dir", data, "export", threads["planted"])
    assert code == 1 and one_sentence(err) and "does not open" in err
    assert digests(data) == before


def test_an_encrypted_history_without_a_key_says_so(capsys, monkeypatch, history):
    data, _ = history
    encrypt_on(monkeypatch)
    assert run(capsys, "--data-dir", data, "threads", "--no-model")[0] == 0
    before = digests(data)
    encrypt_on(monkeypatch, None)
    code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 1 and one_sentence(err), err
    assert "is encrypted" in err and "IRIS_STORAGE_PASSPHRASE" in err
    assert digests(data) == before


def test_no_keyring_and_no_passphrase_leaves_a_plain_history_as_it_was(capsys, monkeypatch, history):
    data, _ = history
    before = digests(data)
    encrypt_on(monkeypatch, None)
    code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 1 and one_sentence(err), err
    assert "no keyring" in err and "IRIS_STORAGE_PASSPHRASE" in err
    assert digests(data) == before


# -- back to plain, and crashes ------------------------------------------------------------


def test_turning_encryption_off_decrypts_the_history(capsys, monkeypatch, history):
    data, threads = history
    before = {title: export(capsys, data, tid) for title, tid in threads.items()}
    encrypt_on(monkeypatch)
    assert run(capsys, "--data-dir", data, "threads", "--no-model")[0] == 0
    assert is_encrypted(data / "iris.db") is True

    monkeypatch.setenv("IRIS_STORAGE_ENCRYPT", "false")
    code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0, err
    assert (data / "iris.db").read_bytes().startswith(HEADER)
    with sqlite3.connect(data / "iris.db") as conn:  # the standard library reads it again
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("SELECT count(*) FROM threads").fetchone()[0] == len(threads)
    monkeypatch.delenv("IRIS_STORAGE_PASSPHRASE")
    assert {title: export(capsys, data, tid) for title, tid in threads.items()} == before


CRASH = textwrap.dedent("""
    import os, sys
    sys.path[:0] = [{tests!r}, {repo!r}]
    from iris_desktop.paths import app_paths
    from iris_desktop.storage_key import prepare

    def step(name):
        if name == {at!r}:
            os._exit(9)  # killed here: no cleanup, no finally

    prepare(app_paths({data!r}), {encrypt!r}, {{"IRIS_STORAGE_PASSPHRASE": {passphrase!r}}},
            None, step)
    os._exit(0)
""")


def crash_at(data: Path, at: str, encrypt: bool) -> int:
    script = CRASH.format(tests=str(REPO / "tests"), repo=str(REPO), at=at, data=str(data),
                          encrypt=encrypt, passphrase=PASSPHRASE)
    return subprocess.run([sys.executable, "-c", script], timeout=120).returncode


SLOW_CONVERSION = textwrap.dedent("""
    import sys, time
    sys.path[:0] = [{tests!r}, {repo!r}]
    from pathlib import Path
    from iris_desktop.paths import app_paths
    from iris_desktop.storage_key import prepare

    def step(name):
        if name == "verified":  # the copy made, the swap to come: a slow disk's fsync
            Path({marker!r}).touch()
            deadline = time.monotonic() + 120
            while not Path({marker!r} + ".go").exists() and time.monotonic() < deadline:
                time.sleep(0.02)  # held until the test has started the other process

    prepare(app_paths({data!r}), True, {{"IRIS_STORAGE_PASSPHRASE": {passphrase!r}}}, None, step)
""")


def test_a_write_by_another_process_during_a_conversion_is_not_lost(capsys, monkeypatch, history,
                                                                     tmp_path):
    """Before, a second process whose setting said nothing opened the plain history while
    the first encrypted it, imported a chat (exit 0), and the swap put the encrypted copy
    over it: the chat was gone. A start now says the conversion is running and writes
    nothing, and holds conversions off while it opens the database; once it is done, the
    import lands in the encrypted history."""
    data, threads = history
    marker = tmp_path / "converting"
    script = SLOW_CONVERSION.format(tests=str(REPO / "tests"), repo=str(REPO), data=str(data),
                                    marker=str(marker), passphrase=PASSPHRASE)
    converting = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() and converting.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert marker.exists()
        monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", PASSPHRASE)  # not IRIS_STORAGE_ENCRYPT
        other = tmp_path / "other.json"
        other.write_text(json.dumps([{"role": "user", "content": "A chat typed meanwhile"}]))
        code, out, err = run(capsys, "--data-dir", data, "import", other,
                             "--title", "written meanwhile")
        assert code == 1 and one_sentence(err) and "another Iris process is converting" in err
    finally:
        Path(f"{marker}.go").touch()
        assert converting.wait(timeout=120) == 0
    assert is_encrypted(data / "iris.db") is True
    code, out, err = run(capsys, "--data-dir", data, "import", other, "--title", "written meanwhile")
    assert code == 0, err
    code, out, err = run(capsys, "--data-dir", data, "threads", "--json", "--no-model")
    assert {row["title"] for row in json.loads(out)} == {*threads, "written meanwhile"}


def complete(db: Path) -> dict[str, int]:
    """The rows of the database at ``db``, opened as what it is (plain or encrypted)."""
    key = Key.passphrase(PASSPHRASE) if is_encrypted(db) else None
    assert quick_check(db, key=key) == []
    with Store(db, key=key) as store:
        assert store.integrity_check() == "ok"
        return {table: store.conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                for table in ("threads", "messages", "thread_paths")}


@pytest.mark.parametrize("encrypt", [True, False], ids=["encrypting", "decrypting"])
@pytest.mark.parametrize("at", ["exported", "verified", "synced", "swapped"])
def test_a_crash_in_the_middle_of_a_conversion_leaves_one_complete_database(
        capsys, monkeypatch, history, at, encrypt):
    data, threads = history
    db = data / "iris.db"
    if not encrypt:  # start from an encrypted history, to be decrypted
        encrypt_on(monkeypatch)
        assert run(capsys, "--data-dir", data, "threads", "--no-model")[0] == 0
    rows = complete(db)
    assert rows["threads"] == len(threads)

    assert crash_at(data, at, encrypt) == 9
    assert complete(db) == rows  # whichever it is now, it is whole
    assert is_encrypted(db) is (encrypt if at == "swapped" else not encrypt)

    # the next start finishes the job and tidies what the crash left
    monkeypatch.setenv("IRIS_STORAGE_ENCRYPT", "true" if encrypt else "false")
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", PASSPHRASE)
    code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0, err
    assert is_encrypted(db) is encrypt
    assert complete(db) == rows
    assert sorted(p.name for p in data.iterdir() if p.name.startswith("iris.db")) == ["iris.db"]


HOLDER = textwrap.dedent("""
    import sys
    sys.path[:0] = [{repo!r}]
    from iris_desktop.core.store import Store

    store = Store({db!r})
    store.create_thread("written by the other one")
    print("ready", flush=True)
    sys.stdin.read()  # holds the database open until told
    store.close()
""")


def test_a_history_another_process_holds_open_is_not_converted(capsys, monkeypatch, history):
    from iris_desktop.paths import app_paths
    from iris_desktop.storage_key import prepare

    data, threads = history
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER.format(repo=str(REPO), db=str(data / "iris.db"))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(StoreError, match="another Iris process has"):
            prepare(app_paths(data), True, {"IRIS_STORAGE_PASSPHRASE": PASSPHRASE})
        assert (data / "iris.db").read_bytes()[:16] == HEADER
    finally:
        holder.communicate("", timeout=60)
    assert holder.returncode == 0
    assert not [p for p in data.iterdir() if ".converting" in p.name or ".replaced" in p.name]
    with Store(data / "iris.db") as store:
        assert len(store.threads()) == len(threads) + 1


# -- the KV states -------------------------------------------------------------------------


class KVScripted(ScriptedRuntime):
    """The scripted runtime with a KV state, as a local model has: its prompt's tokens
    and, standing in for llama.cpp's cache, the prompt's text (so that a plain state
    file would show the conversation)."""

    capabilities = Capabilities(kv_state=True)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.restored: KVState | None = None

    def kv_state(self) -> KVState | None:
        if not self.requests:
            return None
        text = json.dumps(self.requests[-1]).encode()
        return KVState(list(range(1, 33)), text)

    def restore_kv_state(self, state: KVState) -> bool:
        self.restored = state
        return True


def test_kv_states_are_encrypted_while_the_history_is(monkeypatch, tmp_path):
    encrypt_on(monkeypatch)
    data = tmp_path / "data"
    runtime = KVScripted(["I will remember it."])
    overrides = {"context.recall_semantic": "false"}
    with Host(data, overrides, runtime=runtime, compact=False) as host:
        host.load_model()
        events = list(host.send(None, f"Remember the {PHRASE} plan."))
        thread = events[0].thread_id
    states = list((data / "kv-cache").glob("*.kv"))
    assert len(states) == 1 and states[0].read_bytes().startswith(SEALED)
    for path, content in files_under(data).items():
        assert PHRASE.encode() not in content, path
        assert PASSPHRASE.encode() not in content, path

    again = KVScripted([])
    with Host(data, overrides, runtime=again, compact=False) as host:
        host.load_model()
        assert host.open_thread(thread) == 32  # restored: decrypted with the same secret
    assert PHRASE in again.restored.data.decode()

    # turning encryption off: the encrypted states go (they cannot be read any more)
    monkeypatch.setenv("IRIS_STORAGE_ENCRYPT", "false")
    with Host(data, overrides, runtime=KVScripted([]), compact=False):
        pass
    assert not list((data / "kv-cache").glob("*.kv"))


def test_turning_encryption_on_deletes_the_plain_kv_states(monkeypatch, tmp_path):
    data = tmp_path / "data"
    overrides = {"context.recall_semantic": "false"}
    with Host(data, overrides, runtime=KVScripted(["Noted."]), compact=False) as host:
        host.load_model()
        list(host.send(None, f"Remember the {PHRASE} plan."))
    assert any(PHRASE.encode() in p.read_bytes() for p in (data / "kv-cache").glob("*.kv"))
    encrypt_on(monkeypatch)
    with Host(data, overrides, runtime=KVScripted([]), compact=False):
        pass
    for path, content in files_under(data).items():
        assert PHRASE.encode() not in content, path


def test_a_plain_state_left_beside_an_encrypted_history_goes_at_the_next_start(monkeypatch,
                                                                               tmp_path):
    """Before (an audit): a process killed after the switch to encryption, before the
    plain KV states were dropped, left them (the chat's tokens in plain) for good, and no
    later start looked. Now they go before the switch, and any start of an encrypted
    history removes a plain one it finds (a sealed one stays)."""
    data = tmp_path / "data"
    overrides = {"context.recall_semantic": "false"}
    encrypt_on(monkeypatch)
    with Host(data, overrides, runtime=KVScripted(["Noted."]), compact=False) as host:
        host.load_model()
        list(host.send(None, f"Remember the {PHRASE} plan."))
    sealed = list((data / "kv-cache").glob("*.kv"))
    assert sealed and all(p.read_bytes().startswith(SEALED) for p in sealed)
    left = data / "kv-cache" / "9-abc-1.kv"  # what the kill left
    left.write_bytes(b"plain tokens " + PHRASE.encode() * 100)
    with Host(data, overrides, runtime=KVScripted([]), compact=False):
        pass
    assert not left.exists() and all(p.exists() for p in sealed)


def test_plain_copies_set_aside_before_are_said_when_the_history_is_encrypted(
        capsys, monkeypatch, history):
    """Before: `config set storage.encrypt true` said only "is now encrypted" while a
    whole plain copy set aside by a restore stayed beside it, said nowhere (a damaged one
    only in the log), and `recover` listed it as if it were like the rest."""
    import shutil

    data, _ = history
    aside = data / "iris.db.before-restore-20261201T100000"
    shutil.copyfile(data / "iris.db", aside)
    encrypt_on(monkeypatch)
    code, _, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0, err
    assert ("is now encrypted" in err and "1 copy of it set aside earlier is not encrypted "
            "(iris.db.before-restore-20261201T100000): 'iris-desktop recover' lists them") in err
    code, out, err = run(capsys, "--data-dir", data, "recover")
    assert "(not encrypted: delete it once it is no longer needed)" in out


def test_a_state_file_of_the_other_kind_is_never_restored(tmp_path):
    runtime = KVScripted(["x"])
    list(runtime.stream(GenerationRequest([{"role": "user", "content": PHRASE}], max_tokens=5)))
    plain = KVStateStore(tmp_path, 2**20)
    sealed = KVStateStore(tmp_path, 2**20, secret=bytes(range(32)))
    other = KVStateStore(tmp_path, 2**20, secret=bytes(32))
    path = sealed.save(runtime, 1)
    assert PHRASE.encode() not in path.read_bytes()
    assert other.restore(runtime, 1).tokens == 0 and not path.exists()  # wrong key: deleted
    plain.save(runtime, 2)
    assert sealed.restore(runtime, 2).tokens == 0  # plain while encrypted: deleted
    sealed.save(runtime, 3)
    assert sealed.restore(runtime, 3).tokens == 32


# -- the keyring's path --------------------------------------------------------------------


def test_a_keyring_keeps_a_random_key_and_no_passphrase_is_asked(capsys, monkeypatch, history):
    saved = memory_keyring()
    data, threads = history
    encrypt_on(monkeypatch, None)
    assert run(capsys, "--data-dir", data, "threads", "--no-model")[0] == 0
    assert is_encrypted(data / "iris.db") is True
    ((_, name), secret), = saved.items()
    assert len(bytes.fromhex(secret)) == 32
    assert name == f"database {(data / 'iris.db').read_bytes()[:16].hex()}"  # filed by its salt
    for path, content in files_under(data).items():
        assert secret.encode() not in content and bytes.fromhex(secret) not in content, path
    assert PHRASE in json.dumps(export(capsys, data, threads["planted"]))
    moved = data.rename(data.parent / "moved")  # the key follows the file, not its folder
    assert PHRASE in json.dumps(export(capsys, moved, threads["planted"]))
    backup = moved.parent / "backup.db"  # a copy the user made while it was encrypted
    backup.write_bytes((moved / "iris.db").read_bytes())
    monkeypatch.setenv("IRIS_STORAGE_ENCRYPT", "false")  # back to plain, and said so
    code, _, err = run(capsys, "--data-dir", moved, "threads", "--no-model")
    assert code == 0 and "is no longer encrypted: storage.encrypt is off (set by IRIS_STORAGE_ENCRYPT)" in err
    assert is_encrypted(moved / "iris.db") is False
    # before, the key was forgotten here, and the backup could never be opened again
    assert list(saved.values()) == [secret] and find_key(backup) is not None


def test_a_stale_passphrase_variable_and_a_missing_keyring_key_are_named(capsys, monkeypatch,
                                                                        history):
    """Before (an audit): with the keyring holding the key, a leftover IRIS_STORAGE_PASSPHRASE
    was blamed as a wrong passphrase or a damaged first page; with the key gone from the
    keyring, the sentence asked for a passphrase that was never chosen."""
    saved = memory_keyring()
    data, _ = history
    encrypt_on(monkeypatch, None)
    assert run(capsys, "--data-dir", data, "threads", "--no-model")[0] == 0
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", "left from another history")
    code, _, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 1 and one_sentence(err), err
    assert ("IRIS_STORAGE_PASSPHRASE does not open the encrypted history at" in err
            and "but the key kept in this computer's keyring does: unset IRIS_STORAGE_PASSPHRASE"
            in err)
    monkeypatch.delenv("IRIS_STORAGE_PASSPHRASE")
    saved.clear()  # the keyring lost it
    code, _, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 1 and one_sentence(err), err
    assert "no key for it is kept in this computer's keyring" in err


def test_a_start_without_the_setting_keeps_an_encrypted_history_encrypted(capsys, monkeypatch,
                                                                          history):
    """Before, a history encrypted by a run with IRIS_STORAGE_ENCRYPT=true was decrypted,
    silently (exit 0, nothing on stderr), by the next start that lacked the variable (a
    desktop launcher). Left at its default, the setting now follows the file; only a
    storage.encrypt set off decrypts, and the CLI says so."""
    data, threads = history
    encrypt_on(monkeypatch)
    code, _, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0 and "is now encrypted (storage.encrypt is on, set by IRIS_STORAGE_ENCRYPT)" in err
    monkeypatch.delenv("IRIS_STORAGE_ENCRYPT")  # the passphrase still set
    code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0 and err == "" and "planted" in out
    assert is_encrypted(data / "iris.db") is True
    code, out, _ = run(capsys, "--data-dir", data, "config", "get", "storage.encrypt")
    assert code == 0 and out.strip() == "true"  # what the history is
    assert run(capsys, "--data-dir", data, "config", "set", "storage.encrypt", "false")[0] == 0
    code, _, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0 and "is no longer encrypted: storage.encrypt is off (set in" in err
    assert is_encrypted(data / "iris.db") is False


def test_the_window_says_the_history_was_decrypted(capsys, monkeypatch, history, qapp):
    from support.windows import run_gui_recording

    data, _ = history
    encrypt_on(monkeypatch)
    assert run(capsys, "--data-dir", data, "threads", "--no-model")[0] == 0
    monkeypatch.setenv("IRIS_STORAGE_ENCRYPT", "false")
    shown = run_gui_recording(monkeypatch, data)
    assert shown[0][0] == "information" and "is no longer encrypted: storage.encrypt is off" in shown[0][1]
    assert shown[1:] == [("window", "")] and is_encrypted(data / "iris.db") is False
    assert run_gui_recording(monkeypatch, data) == [("window", "")]  # said once


def test_preferences_show_an_encrypted_history_as_encrypted_and_unticking_decrypts_it(
        capsys, monkeypatch, history, qtbot):
    """Before: a history encrypted by a run with IRIS_STORAGE_ENCRYPT showed the box
    unticked (the dialog reloads the file's settings, which say nothing); and unticking
    it wrote nothing (false is the default, so the key was removed), so the history
    stayed encrypted without a word."""
    from support.fakes import ScriptedRuntime

    data, _ = history
    encrypt_on(monkeypatch)
    assert run(capsys, "--data-dir", data, "threads", "--no-model")[0] == 0
    monkeypatch.delenv("IRIS_STORAGE_ENCRYPT")  # the passphrase still in the environment
    from iris_desktop.ui.main_window import main_window

    host = Host(data, {"context.recall_semantic": "false"}, runtime=ScriptedRuntime([]))
    window = main_window(host)
    qtbot.addWidget(window)
    try:
        window.menus.actions["preferences"].trigger()
        dialog = window.menus.settings_dialog
        qtbot.waitUntil(dialog.isVisible, timeout=5_000)
        field = dialog.fields["storage.encrypt"]
        assert field.raw() is True  # what the history is
        dialog.restore_defaults("storage")
        assert field.raw() is True  # Restore defaults never decrypts
        field.editor.box.setChecked(False)
        dialog.accept()
        assert "encrypt = false" in (data / "config.toml").read_text()
        # it says when it applies (it was saved without a word)
        assert window.status_area.current_message() == (
            "Saved; in use when Iris starts again: storage.encrypt")
    finally:
        window.shutdown()
        host.close()
    code, _, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0 and "is no longer encrypted" in err and is_encrypted(data / "iris.db") is False


def test_a_locked_keyring_is_named_not_a_passphrase_never_chosen(capsys, monkeypatch, history):
    """Before, with the keyring's key and the keyring locked at the next start, Iris asked
    for "its passphrase", which the user never chose; "locked" was only in the log."""
    from keyring.errors import KeyringLocked

    saved = memory_keyring()
    data, _ = history
    encrypt_on(monkeypatch, None)
    assert run(capsys, "--data-dir", data, "threads", "--no-model")[0] == 0
    assert saved and is_encrypted(data / "iris.db") is True

    def locked(*_):
        raise KeyringLocked("Failed to unlock the collection!")

    import keyring

    keyring_now = keyring.get_keyring()
    monkeypatch.setattr(keyring_now, "get_password", locked)
    code, _, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 1
    assert "is encrypted and the keyring is locked: if Iris kept this history's key there" in err
    assert "unlock the keyring and start Iris again" in err and is_encrypted(data / "iris.db") is True


def test_a_new_history_with_a_keyring_is_filed_under_its_salt(capsys, monkeypatch, tmp_path):
    saved = memory_keyring()
    encrypt_on(monkeypatch, None)
    data = tmp_path / "fresh"
    code, out, err = run(capsys, "--data-dir", data, "import", planted_chat(tmp_path))
    assert code == 0, err
    assert [name for _, name in saved] == [str((data / "iris.db").resolve())]  # no salt yet
    assert run(capsys, "--data-dir", data, "threads", "--no-model")[0] == 0
    assert [name for _, name in saved] == [f"database {(data / 'iris.db').read_bytes()[:16].hex()}"]


def test_errors_never_show_the_passphrase(tmp_path):
    key = Key.passphrase(PASSPHRASE)
    with Store(tmp_path / "iris.db", key=key):
        pass
    with pytest.raises(StoreError) as caught:
        Store(tmp_path / "iris.db", key=Key.passphrase(PASSPHRASE + "!"))
    assert PASSPHRASE not in str(caught.value) and PASSPHRASE not in repr(key)


# -- the desktop app -----------------------------------------------------------------------


def test_the_desktop_app_asks_the_passphrase_and_opens_the_encrypted_history(
        qtbot, capsys, monkeypatch, history):
    pytest.importorskip("PySide6")
    from PySide6.QtCore import Qt, QTimer
    from PySide6.QtWidgets import QApplication, QDialogButtonBox

    from iris_desktop.ui.main_window import main_window
    from iris_desktop.ui.passphrase_dialog import PassphraseDialog, ask_passphrase

    data, threads = history
    encrypt_on(monkeypatch)
    assert run(capsys, "--data-dir", data, "threads", "--no-model")[0] == 0
    encrypt_on(monkeypatch, None)  # nothing in the environment: the app must ask
    problems: list[str] = []

    def answer() -> None:
        dialog = QApplication.activeModalWidget()
        if not isinstance(dialog, PassphraseDialog):
            QTimer.singleShot(20, answer)
            return
        problems.append(dialog.problem.text())
        ok = dialog.buttons.button(QDialogButtonBox.StandardButton.Ok)
        assert not ok.isEnabled()  # nothing typed yet
        qtbot.keyClicks(dialog.passphrase, "a wrong guess" if len(problems) == 1 else PASSPHRASE)
        qtbot.mouseClick(ok, Qt.MouseButton.LeftButton)
        if len(problems) == 1:
            QTimer.singleShot(20, answer)  # asked again, saying why

    QTimer.singleShot(0, answer)
    host = Host(data, {"context.recall_semantic": "false"}, runtime=ScriptedRuntime([]),
                compact=False, ask_passphrase=ask_passphrase)
    try:
        assert len(problems) == 2 and problems[0] == ""
        assert "the passphrase does not open the encrypted history" in problems[1]
        assert host.encrypted
        window = main_window(host, load=False)
        qtbot.addWidget(window)
        window.show()
        qtbot.waitUntil(lambda: window.threads.list.count() == len(threads), timeout=10_000)
        titles = {window.threads.list.item(i).text() for i in range(window.threads.list.count())}
        assert titles == set(threads)
        window.shutdown()
    finally:
        host.close()
    for path, content in files_under(data).items():
        assert PASSPHRASE.encode() not in content and PHRASE.encode() not in content, path


def test_cancelling_the_passphrase_dialog_opens_nothing(qtbot, capsys, monkeypatch, history):
    pytest.importorskip("PySide6")
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from iris_desktop.ui.passphrase_dialog import PassphraseDialog, ask_passphrase

    data, _ = history
    encrypt_on(monkeypatch)
    assert run(capsys, "--data-dir", data, "threads", "--no-model")[0] == 0
    before = digests(data)
    encrypt_on(monkeypatch, None)

    def cancel() -> None:
        dialog = QApplication.activeModalWidget()
        if not isinstance(dialog, PassphraseDialog):
            QTimer.singleShot(20, cancel)
            return
        dialog.reject()

    QTimer.singleShot(0, cancel)
    with pytest.raises(StoreError, match="no passphrase was given"):
        Host(data, {}, ask_passphrase=ask_passphrase)
    assert digests(data) == before


def test_without_a_keyring_the_desktop_app_asks_for_a_new_passphrase_twice(
        qtbot, capsys, monkeypatch, history):
    pytest.importorskip("PySide6")
    from PySide6.QtCore import Qt, QTimer
    from PySide6.QtWidgets import QApplication, QDialogButtonBox

    from iris_desktop.ui.passphrase_dialog import PassphraseDialog, ask_passphrase

    data, threads = history
    encrypt_on(monkeypatch, None)
    seen: list[bool] = []

    def answer() -> None:
        dialog = QApplication.activeModalWidget()
        if not isinstance(dialog, PassphraseDialog):
            QTimer.singleShot(20, answer)
            return
        ok = dialog.buttons.button(QDialogButtonBox.StandardButton.Ok)
        qtbot.keyClicks(dialog.passphrase, PASSPHRASE)
        qtbot.keyClicks(dialog.again, PASSPHRASE[:-1])
        seen.append(ok.isEnabled())  # the two differ: no OK
        assert "differ" in dialog.problem.text()
        qtbot.keyClicks(dialog.again, PASSPHRASE[-1])
        seen.append(ok.isEnabled())
        qtbot.mouseClick(ok, Qt.MouseButton.LeftButton)

    QTimer.singleShot(0, answer)
    with Host(data, {}, ask_passphrase=ask_passphrase) as host:
        assert host.encrypted and host.storage.converted == "encrypted"
        assert len(host.store.threads()) == len(threads)
    assert seen == [False, True]
    assert is_encrypted(data / "iris.db") is True
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", PASSPHRASE)  # the chosen one opens it
    assert run(capsys, "--data-dir", data, "threads", "--no-model")[0] == 0


@pytest.mark.skipif(sys.platform == "win32", reason="a pseudo-terminal is POSIX")
def test_the_cli_asks_the_passphrase_on_its_terminal(capsys, monkeypatch, history):
    from support.helpers import on_a_terminal

    data, threads = history
    encrypt_on(monkeypatch)
    assert run(capsys, "--data-dir", data, "threads", "--no-model")[0] == 0
    encrypt_on(monkeypatch, None)
    code, seen = on_a_terminal(["--data-dir", data, "threads", "--no-model"],
                               {b"Passphrase of the encrypted history": PASSPHRASE})
    assert code == 0, seen
    text = seen.decode(errors="replace")
    assert PASSPHRASE not in text  # not echoed
    assert all(title in text for title in threads)


@pytest.mark.parametrize("passphrase", ["x'" + "ab" * 32 + "'", "x'" + "00" * 48 + "'",
                                        "X'" + "Cd" * 32 + "'"])
def test_a_passphrase_that_looks_like_a_raw_key_is_still_a_passphrase(capsys, monkeypatch,
                                                                    history, passphrase):
    """SQLCipher reads a key text of the form x'<hex>' as a raw key: given as text, such
    a passphrase made a history that the same passphrase could never open again. Iris
    always gives SQLCipher a raw key derived from the passphrase, so it opens, and what
    SQLCipher's own KDF derives from the passphrase opens it too."""
    data, threads = history
    encrypt_on(monkeypatch, passphrase)
    assert run(capsys, "--data-dir", data, "threads", "--no-model")[0] == 0  # converted
    assert is_encrypted(data / "iris.db")
    for _ in range(2):  # again, from the file's salt
        code, out, err = run(capsys, "--data-dir", data, "export", threads["planted"])
        assert code == 0 and PHRASE in out, err
    import sqlcipher3

    conn = sqlcipher3.connect(str(data / "iris.db"))
    conn.execute("PRAGMA key = '" + passphrase.replace("'", "''") + "'")
    with pytest.raises(sqlcipher3.DatabaseError):  # the text is not the key
        conn.execute("SELECT count(*) FROM threads").fetchone()
    conn.close()
    salt = (data / "iris.db").read_bytes()[:16]
    key = Key.passphrase(passphrase).stretched(salt)
    conn = sqlcipher3.connect(str(data / "iris.db"))
    conn.execute(f"PRAGMA key = \"x'{key.hex()}{salt.hex()}'\"")
    assert conn.execute("SELECT count(*) FROM threads").fetchone()[0] == len(threads)
    conn.close()


def test_turning_encryption_on_leaves_no_plain_work_file_of_a_killed_recovery(capsys, monkeypatch,
                                                                              history):
    """Before: a killed ``recover --salvage`` or ``recover NAME`` left plain copies of the
    history (``iris.db.salvage-<pid>``, ``.restoring-``, ``.repairing-`` and their -wal)
    that ``recover`` did not list and that survived turning encryption on; a plain KV
    ``.tmp`` stayed until a model loaded. Now every open and every ``recover`` removes
    the work files of processes that are gone, and says so."""
    data, _ = history
    dead = 999_999_999  # no such process
    db = data / "iris.db"
    plain = db.read_bytes()
    assert PHRASE.encode() in plain or PHRASE.encode() in (data / "iris.db-wal").read_bytes()
    leftovers = [db.with_name(f"iris.db.salvage-{dead}"), db.with_name(f"iris.db.salvage-{dead}-wal"),
                 db.with_name(f"iris.db.restoring-{dead}"), db.with_name(f"iris.db.repairing-{dead}")]
    for path in leftovers:
        path.write_bytes(PHRASE.encode() * 10)
    (data / "kv-cache").mkdir(exist_ok=True)
    kv_tmp = data / "kv-cache" / f".1-abc.kv.{dead}.tmp"
    kv_tmp.write_bytes(PHRASE.encode())
    code, out, err = run(capsys, "--data-dir", data, "recover")
    assert code == 0 and err.count("a copy of the history left by a recovery") == 4, err
    assert not any(p.exists() for p in leftovers)
    for path in leftovers:
        path.write_bytes(PHRASE.encode() * 10)
    encrypt_on(monkeypatch)
    assert run(capsys, "--data-dir", data, "threads", "--no-model")[0] == 0
    holders = [p for p in data.rglob("*") if p.is_file() and PHRASE.encode() in p.read_bytes()]
    assert holders == [] and is_encrypted(db)


LOCK_HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from iris_desktop.core.store.cipher import conversion_locked
    with conversion_locked(Path(sys.argv[1]), "converting"):  # as a conversion holds it
        print("holding", flush=True)
        time.sleep(60)
""")


def test_two_conversions_at_once_the_second_says_so_and_changes_nothing(capsys, monkeypatch, history):
    """Before: two processes converting at once ("disk I/O error"): the second's clean-up
    deleted the first's copy. A conversion holds a lock; the second waits for nothing
    and says who has it, and neither the file nor the first's work is touched."""
    data, _ = history
    db = data / "iris.db"
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(db)], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        copy = db.with_name("iris.db.converting")
        copy.write_bytes(b"the other process's copy in progress")
        before = digests(data)
        encrypt_on(monkeypatch)
        code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
        assert code == 1 and one_sentence(err), err
        assert "another Iris process is converting" in err
        assert digests(data) == before and copy.exists()
    finally:
        holder.kill()
        holder.wait()
    copy.unlink()
    assert run(capsys, "--data-dir", data, "threads", "--no-model")[0] == 0
    assert is_encrypted(db)


def test_a_conversion_on_a_full_disk_says_the_disk_is_full_and_changes_nothing(capsys, monkeypatch,
                                                                            tmp_path):
    """Before: "cannot rollback - no transaction is active" (the full disk had rolled
    the export back already)."""
    from support.faults import full_disk

    with full_disk(tmp_path, "8m") as disk:
        data = disk.path / "data"
        for path in AGENT_FILES[:2]:
            assert run(capsys, "--data-dir", data, "import", path)[0] == 0
        before = digests(data)
        disk.fill(leave=4096)
        encrypt_on(monkeypatch)
        code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
        assert code == 1 and one_sentence(err), err
        assert "is full" in err and "cannot rollback" not in err
        disk.free()
        after = digests(data)
        assert after.pop("iris.db-wal", None) in (None, hashlib.sha256(b"").hexdigest())
        after.pop("iris.db-shm", None)  # what SQLite's closed connection left: no data
        assert after == before
        assert run(capsys, "--data-dir", data, "threads", "--no-model")[0] == 0
        assert is_encrypted(data / "iris.db")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_an_encrypted_history_is_never_dumped_from_memory(tmp_path):
    """The process holds the history in plain text: a core dump (systemd-coredump keeps
    them on disk) or another process of the user's reading its memory would undo the
    encryption. With storage.encrypt on, the process is not dumpable; off, it is left as
    it was."""
    import subprocess

    script = ("import ctypes, sys\n"
              "from iris_desktop.host import Host\n"
              "host = Host(sys.argv[1], {'storage.encrypt': sys.argv[2]})\n"
              "print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))\n"  # PR_GET_DUMPABLE
              "host.close()\n")
    dumpable = {}
    for encrypt in ("true", "false"):
        done = subprocess.run([sys.executable, "-c", script, str(tmp_path / encrypt), encrypt],
                              env={**os.environ, "IRIS_STORAGE_PASSPHRASE": "correct horse"},
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        dumpable[encrypt] = int(done.stdout.strip())
    assert dumpable == {"true": 0, "false": 1}
