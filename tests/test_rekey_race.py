"""A start racing ``iris-desktop rekey``: the start decides its key without the conversion
lock (a passphrase may be asked for minutes), so a rekey can switch the file between that
decision and the start's opening, or in the middle of the decision. The start then says
that another process gave the history a new key while it started, and to start again;
the next start, with the new passphrase, opens it.

Before (a review's finding): the start tried the old key on the new file and said "the
passphrase does not open the encrypted history …; if it is the right one, the file's first
page is damaged: 'iris-desktop recover' lists copies to put back": a false alarm about
damage, after which the user might put an older copy back over a sound history.

Two real processes: the start is the real CLI in a child process, stopped at its step
(its key decided; or about to check it) until a file the test writes lets it go; the
rekey is the real CLI run here meanwhile. A real SQLCipher history under a real data
folder; no keyring (the passphrase comes from IRIS_STORAGE_PASSPHRASE, as in scripts).
"""

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

from test_rekey import NEW, OLD, PHRASE, REPO  # noqa: E402  (the same history as rekey's tests)

from iris_desktop.core.store.cipher import is_encrypted  # noqa: E402

from support.helpers import one_sentence  # noqa: E402
from support.helpers import run_cli as run  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_keyring")

#: the child: a start (``threads``) of the real CLI, stopped at ``step`` until the file
#: ``marker``.go exists; ``marker`` says it got there
_START = textwrap.dedent("""
    import sys, time
    sys.path[:0] = [{repo!r}]
    from pathlib import Path
    step, marker, data = sys.argv[1:4]


    def stopped(real, after):
        done = []

        def wait(*args, **kwargs):
            if done:  # the first call only
                return real(*args, **kwargs)
            done.append(True)
            result = real(*args, **kwargs) if after else None
            Path(marker).touch()
            deadline = time.monotonic() + 120  # a safety net only: the test says when
            while not Path(marker + ".go").exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            return result if after else real(*args, **kwargs)
        return wait


    if step == "decided":  # its key decided, the history not yet opened
        import iris_desktop.host_storage as host_storage
        host_storage.prepare = stopped(host_storage.prepare, after=True)
    else:  # "deciding": the passphrase read, about to be checked against the file
        import iris_desktop.storage_key as storage_key
        storage_key.check_key = stopped(storage_key.check_key, after=False)
    from iris_desktop.cli import main
    sys.exit(main(["--data-dir", data, "threads", "--no-model"]))
""")


@pytest.fixture
def data(tmp_path, capsys, monkeypatch) -> Path:
    return encrypted_history(tmp_path, capsys, monkeypatch)


def encrypted_history(tmp_path, capsys, monkeypatch) -> Path:
    """A history encrypted with OLD holding one chat with PHRASE; IRIS_STORAGE_PASSPHRASE
    is OLD (the child's too)."""
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"role": "user", "content": f"Remember {PHRASE}."}) + "\n"
                    + json.dumps({"role": "assistant", "content": "Noted."}) + "\n")
    folder = tmp_path / "data"
    monkeypatch.delenv("IRIS_NEW_STORAGE_PASSPHRASE", raising=False)
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", OLD)
    monkeypatch.setenv("IRIS_STORAGE_ENCRYPT", "true")
    code, _, err = run(capsys, "--data-dir", folder, "import", chat)
    assert code == 0, err
    monkeypatch.delenv("IRIS_STORAGE_ENCRYPT")  # unset: the setting follows the history
    assert is_encrypted(folder / "iris.db") is True
    return folder


def digests(data: Path) -> dict[str, str]:
    """The history's files (the database, its -wal and -shm, anything set aside), by name."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in data.iterdir() if p.is_file() and p.name.startswith("iris.db")}


def start_beside_a_rekey(capsys, monkeypatch, data: Path, tmp_path: Path, step: str
                         ) -> tuple[int, str]:
    """The child start stopped at ``step``; the real ``rekey`` (OLD → NEW) run meanwhile;
    the start let go. Returns its exit code and stderr."""
    marker = tmp_path / f"at-{step}"
    child = subprocess.Popen(
        [sys.executable, "-c", _START.format(repo=str(REPO)), step, str(marker), str(data)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120  # a safety net only: the marker says when
        while not marker.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert marker.exists(), child.communicate(timeout=60)
        monkeypatch.setenv("IRIS_NEW_STORAGE_PASSPHRASE", NEW)
        code, out, err = run(capsys, "--data-dir", data, "rekey", "--to", "passphrase")
        assert code == 0 and "is now encrypted with the new passphrase" in out, err
        monkeypatch.delenv("IRIS_NEW_STORAGE_PASSPHRASE")
        rekeyed = digests(data)
    finally:
        Path(f"{marker}.go").touch()
        _, err = child.communicate(timeout=120)
    assert digests(data) == rekeyed  # the start wrote nothing, set nothing aside
    return child.returncode, err


@pytest.mark.parametrize("step", ["decided", "deciding"])
def test_a_start_beside_a_rekey_says_the_key_changed_not_that_the_file_is_damaged(
        capsys, monkeypatch, data, tmp_path, step):
    code, err = start_beside_a_rekey(capsys, monkeypatch, data, tmp_path, step)
    said_the_key_changed_and_nothing_to_recover(capsys, monkeypatch, data, code, err)


def said_the_key_changed_and_nothing_to_recover(capsys, monkeypatch, data: Path, code: int,
                                                 err: str) -> None:
    """A start beside a rekey was refused saying the key changed (not a damaged file), and
    the next start with the new passphrase opens the history, nothing set aside."""
    assert code == 1 and one_sentence(err), err
    assert "damaged" not in err and "recover" not in err, err  # before: "first page is damaged"
    assert (f"another Iris process encrypted {data / 'iris.db'} again with a new key "
            "('iris-desktop rekey')") in err, err
    assert "start Iris again (with the new passphrase, if it was given one)" in err, err
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", NEW)
    code, out, err = run(capsys, "--data-dir", data, "export", "1")
    assert code == 0 and PHRASE in out, err
    assert [name for name in digests(data) if "corrupt" in name] == []


def test_a_start_after_a_rekey_with_the_old_passphrase_is_still_told_it_does_not_open(
        capsys, monkeypatch, data):
    """Not a race: the file was rekeyed before the start looked at it, so the old
    passphrase is simply not the key (the sentence as before)."""
    monkeypatch.setenv("IRIS_NEW_STORAGE_PASSPHRASE", NEW)
    code, _, err = run(capsys, "--data-dir", data, "rekey", "--to", "passphrase")
    assert code == 0, err
    code, _, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 1 and "does not open the encrypted history" in err, err
    assert "another Iris process" not in err


def test_a_rekey_that_ends_while_the_passphrase_is_asked_is_not_taken_for_a_later_change(
        capsys, monkeypatch, data):
    """A review: the start read the file's salt before asking, so when a rekey ended while
    the user typed (the new passphrase, which opens it), the key kept the old file's salt,
    and any later refusal on that file would have been called another rekey. The key now
    remembers the file it opened."""
    from iris_desktop.core.store.cipher import file_salt
    from iris_desktop.paths import app_paths
    from iris_desktop.storage_key import prepare

    before = file_salt(data / "iris.db")

    def ask(path, new, problem):  # the user types while another process rekeys
        monkeypatch.setenv("IRIS_NEW_STORAGE_PASSPHRASE", NEW)
        code, _, err = run(capsys, "--data-dir", data, "rekey", "--to", "passphrase")
        assert code == 0, err
        return NEW

    prepared = prepare(app_paths(data), None, env={}, ask=ask)  # (the rekey's IRIS_… is not read)
    assert file_salt(data / "iris.db") != before
    assert prepared.key.seen == file_salt(data / "iris.db")
