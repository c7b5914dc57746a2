"""What the start says after a put-back a kill cut off, and what it does for it:

* the window's box has a title that fits what happened (before, a put-back finished was
  shown under "Iris Desktop recovered a damaged database": nothing was damaged), and
  every other start-up box keeps its own;
* an encrypted history a cut-off put-back brings back keeps this process's memory
  private from that start on (before: decided before the put-back was finished, so
  with ``storage.encrypt`` at its default that one start left it dumpable).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

import pytest
from test_putback_kills import ASIDE, killed_at, prepared

from iris_desktop.core.store import Store

from support.helpers import run_cli as run
from support.windows import run_gui_recording


def _start_recording(monkeypatch, data) -> list[tuple[str, ...]]:
    """The real app started on ``data``: its boxes ``(kind, title, text)`` and window."""
    return run_gui_recording(monkeypatch, data, titles=True)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_each_start_up_box_has_a_title_that_fits_what_happened(capsys, tmp_path, qtbot, monkeypatch):
    """A put-back finished, one that could not be (its copy gone), a damaged database
    salvaged, and another app's file refused: each box's title says which."""
    finished = tmp_path / "finished"
    prepared(capsys, finished)
    killed_at("moved iris.db", finished)
    shown = _start_recording(monkeypatch, finished)
    assert [(kind, title) for kind, title, _ in shown] == [
        ("warning", "Iris Desktop finished putting back a database"), ("window", "")]
    assert "put-back of " + ASIDE in shown[0][2] and "finished it" in shown[0][2]

    undone = tmp_path / "undone"
    prepared(capsys, undone)
    killed_at("moved iris.db", undone)
    for copy in undone.glob("iris.db.restoring-*"):
        copy.unlink()
    shown = _start_recording(monkeypatch, undone)
    assert [(kind, title) for kind, title, _ in shown] == [
        ("warning", "Iris Desktop could not finish putting back a database"), ("window", "")]
    assert "back where it was" in shown[0][2]

    damaged = tmp_path / "damaged"
    damaged.mkdir()
    with Store(damaged / "iris.db") as store:
        store.add_message(store.create_thread("kept"), {"role": "user", "content": "kept?"})
        store.checkpoint()
    with open(damaged / "iris.db", "r+b") as fh:
        fh.write(b"\0" * 100)  # a header a power cut zeroed
    shown = _start_recording(monkeypatch, damaged)
    assert [(kind, title) for kind, title, _ in shown] == [
        ("warning", "Iris Desktop recovered a damaged database"), ("window", "")]
    assert "set aside, unchanged" in shown[0][2] and "no row was lost" in shown[0][2]

    other = tmp_path / "other"
    other.mkdir()
    with sqlite3.connect(other / "iris.db") as conn:
        conn.execute("CREATE TABLE recipes(name TEXT)")
    conn.close()
    shown = _start_recording(monkeypatch, other)
    assert [(kind, title) for kind, title, _ in shown] == [("critical", "Iris Desktop cannot start")]
    assert "another app's database" in shown[0][2]


#: a start through the host, as the window's and the CLI's: whether the process may be dumped
_DUMPABLE = ("import ctypes, sys\n"
             "from iris_desktop.host import Host\n"
             "host = Host(sys.argv[1])\n"
             "print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0), host.encrypted)\n"  # PR_GET_DUMPABLE
             "host.close()\n")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_an_encrypted_history_a_cut_off_put_back_brings_back_is_never_dumped(capsys, tmp_path, monkeypatch):
    """Cut off after it set the current history aside: at the next start (storage.encrypt
    at its default) nothing is at the history's place until the put-back is finished, and
    the encrypted history it brings back was held by a dumpable process for that start."""
    from iris_desktop.core.store import cipher

    if not cipher.available():
        pytest.skip(reason="sqlcipher3 is not installed")
    passphrase = "correct horse battery staple"
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", passphrase)
    data = tmp_path / "data"
    prepared(capsys, data, cipher.Key.passphrase(passphrase))
    killed_at("moved iris.db", data, "--set", "storage.encrypt=true")
    assert not (data / "iris.db").exists()
    for start in ("finishing the put-back", "the next"):
        done = subprocess.run([sys.executable, "-c", _DUMPABLE, str(data)], env=dict(os.environ),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["0", "True"], (start, done.stdout)
    code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0 and "put back" in out and err == ""
