"""A start that arrives while ``iris-desktop rekey`` runs: it waits for the rekey's
conversion lock, and only then decided its key, by the file it found then (already the
new one), so the old passphrase's refusal was not seen as a change of key.

Before (an audit of two processes on one data folder): such a start said "the passphrase
does not open the encrypted history …; if it is the right one, the file's first page is
damaged: 'iris-desktop recover' lists copies to put back", 5 starts of 5, where the README
says it is told the history got a new key meanwhile. The start now notes the file's salt
before it waits, so the file the rekey put in place is said as that.

Two real processes: the rekey is the real CLI in a child process, stopped with the
conversion lock held (its work not begun) until a file the test writes lets it go; the
start is the real CLI run here, which lets the rekey go once it finds the lock held (it
is then waiting). A real SQLCipher history; no keyring (IRIS_STORAGE_PASSPHRASE).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sqlcipher3")

from test_rekey import NEW, OLD, PHRASE, REPO  # noqa: E402  (the same history as rekey's tests)
from test_rekey_race import encrypted_history, said_the_key_changed_and_nothing_to_recover  # noqa: E402

from iris_desktop.core.store import cipher  # noqa: E402
from iris_desktop.files import Busy  # noqa: E402

from support.helpers import run_cli as run  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_keyring")

@pytest.fixture
def history(tmp_path, capsys, monkeypatch) -> Path:
    """A data folder whose history, encrypted with OLD, holds one chat with PHRASE."""
    return encrypted_history(tmp_path, capsys, monkeypatch)


#: the child: the real ``rekey`` (OLD → NEW), stopped with the conversion lock held, before
#: its work, until ``marker``.go exists; ``marker`` says it holds the lock
_REKEY = textwrap.dedent("""
    import sys, time
    sys.path[:0] = [{repo!r}]
    from pathlib import Path
    marker, data = sys.argv[1:3]
    import iris_desktop.storage_key as storage_key
    real = storage_key._change_key


    def stopped(*args, **kwargs):  # called with the conversion lock held
        Path(marker).touch()
        deadline = time.monotonic() + 120  # a safety net only: the test says when
        while not Path(marker + ".go").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        return real(*args, **kwargs)


    storage_key._change_key = stopped
    from iris_desktop.cli import main
    sys.exit(main(["--data-dir", data, "rekey", "--to", "passphrase"]))
""")


def start_while_a_rekey_runs(monkeypatch, data: Path, tmp_path: Path, env: dict,
                             start: Callable[[], Any]) -> Any:
    """The child rekey (``env``, with OLD → NEW) holding the lock; ``start()`` run here
    meanwhile, which lets the rekey go the first time it finds the lock held (it waits
    then). Returns what ``start()`` returned."""
    marker = tmp_path / "rekeying"
    child = subprocess.Popen(
        [sys.executable, "-c", _REKEY.format(repo=str(REPO)), str(marker), str(data)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**env, "IRIS_STORAGE_PASSPHRASE": OLD, "IRIS_NEW_STORAGE_PASSPHRASE": NEW})
    waits: list[bool] = []
    real_held = cipher.held

    class Holding:
        def __init__(self, path, word):
            self.inner = real_held(path, word)

        def __enter__(self):
            try:
                return self.inner.__enter__()
            except Busy:
                if not waits:
                    waits.append(True)
                    Path(f"{marker}.go").touch()
                raise

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

    try:
        deadline = time.monotonic() + 120  # a safety net only: the marker says when
        while not marker.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert marker.exists(), child.communicate(timeout=60)
        monkeypatch.setattr(cipher, "held", Holding)
        # the wait outlasts the rekey, however slow this machine is (counted, not timed)
        monkeypatch.setattr(cipher, "CONVERSION_WAIT_S", 300.0)
        result = start()
    finally:
        Path(f"{marker}.go").touch()
        out, err = child.communicate(timeout=120)
    assert waits, "the start never found the rekey's lock held"
    assert child.returncode == 0 and "is now encrypted with the new passphrase" in out, err
    return result


def test_a_start_waiting_for_a_rekey_says_the_key_changed_not_that_the_file_is_damaged(
        capsys, monkeypatch, history, tmp_path):
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", OLD)
    code, _, err = start_while_a_rekey_runs(
        monkeypatch, history, tmp_path, dict(os.environ),
        lambda: run(capsys, "--data-dir", history, "threads", "--no-model"))
    said_the_key_changed_and_nothing_to_recover(capsys, monkeypatch, history, code, err)


def test_a_start_waiting_for_a_rekey_with_the_new_passphrase_opens_the_history(
        capsys, monkeypatch, history, tmp_path):
    """The start that already has the new passphrase opens the new file (not refused)."""
    env = dict(os.environ)
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", NEW)
    code, out, err = start_while_a_rekey_runs(
        monkeypatch, history, tmp_path, env,
        lambda: run(capsys, "--data-dir", history, "export", "1"))
    assert code == 0 and PHRASE in out, err


def test_the_window_s_start_waiting_for_a_rekey_says_the_key_changed(
        monkeypatch, history, tmp_path):
    """The window's start (the passphrase dialog's answer is the old passphrase): the
    Host it makes is refused with the same sentence, which run_gui shows in its box."""
    from iris_desktop.core.store.cipher import KeyChanged
    from iris_desktop.host import Host

    env = {k: v for k, v in os.environ.items() if k != "IRIS_STORAGE_PASSPHRASE"}
    asked: list[str | None] = []

    def ask(path, new, problem):  # the dialog: the user types the passphrase they know
        asked.append(problem)
        return OLD

    def start():
        with pytest.raises(KeyChanged) as caught:
            Host(history, {}, env=env, ask_passphrase=ask)
        return str(caught.value)

    said = start_while_a_rekey_runs(monkeypatch, history, tmp_path, env, start)
    assert asked == [None]  # asked once: not asked again once another file is there
    assert "damaged" not in said and "again with a new key ('iris-desktop rekey')" in said
