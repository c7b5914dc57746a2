"""An encrypted history for the rekey tests: made as a user makes it
(:func:`encrypt_history`), and a real second process holding it open (a window, a chat),
until the test tells it to let go: ``holder.communicate("")``."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

HOLDER = textwrap.dedent("""
    import sys
    sys.path[:0] = [{repo!r}]
    from iris_desktop.core.store import Store
    from iris_desktop.core.store.cipher import Key

    store = Store({db!r}, key=Key.passphrase({passphrase!r}))
    store.threads()
    print("ready", flush=True)
    sys.stdin.read()  # holds the history open until told
    store.close()
""")


def hold_encrypted(db: Path, passphrase: str) -> subprocess.Popen:
    """The process, started (it prints "ready" once the history is open)."""
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER.format(repo=str(REPO), db=str(db), passphrase=passphrase)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def encrypt_history(capsys, monkeypatch, data: Path, passphrase: str | None) -> None:
    """``data``'s history encrypted as a user does (storage.encrypt on for one start, with
    ``passphrase``, else the keyring's key); the setting unset after it (it follows the
    history), the passphrase left set."""
    from iris_desktop.core.store.cipher import is_encrypted

    from support.helpers import run_cli

    monkeypatch.setenv("IRIS_STORAGE_ENCRYPT", "true")
    if passphrase:
        monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", passphrase)
    code, _, err = run_cli(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0, err
    assert is_encrypted(data / "iris.db") is True
    monkeypatch.delenv("IRIS_STORAGE_ENCRYPT")
