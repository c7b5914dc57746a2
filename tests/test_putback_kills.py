"""``iris-desktop recover NAME`` killed (SIGKILL, a real process) at each step of its
put-back: the next start (the CLI, or the window) finds what was cut off, finishes it
and says so once, in one sentence; nothing of either history is lost.

Before (the README's "not there yet"): killed after it set the current history aside
and before it renamed the checked copy in, the next start opened an empty history, and
nothing said the put-back was cut off.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from iris_desktop.core.store import Store, recovery
from iris_desktop.paths import app_paths

from support.helpers import one_sentence
from support.helpers import run_cli as run

#: the file put back: a set-aside history holding one chat of its own
ASIDE = "iris.db.corrupt-20260101T000000"

#: the child: the real CLI, killed with SIGKILL at ``step`` of the put-back
_KILLED = """
import os, signal, sys
from pathlib import Path
sys.path[:0] = {paths!r}
step, data, name = sys.argv[1:4]
extra = sys.argv[4:]


def die():
    os.kill(os.getpid(), signal.SIGKILL)


from iris_desktop.core.store import recovery

real_replace = os.replace


def replace(src, dst, *args, **kwargs):
    real_replace(src, dst, *args, **kwargs)
    moved = os.path.basename(str(src))
    if step == "moved " + moved or (step == "renamed" and ".restoring-" in moved):
        die()


os.replace = replace
real_check = recovery.quick_check


def check(path, *args, **kwargs):
    if step == "copied" and ".restoring-" in Path(path).name:
        die()
    return real_check(path, *args, **kwargs)


recovery.quick_check = check
if step == "journal":
    from iris_desktop.core.store import putback

    real_begin = putback.begin

    def begin(*args):
        real_begin(*args)
        die()

    putback.begin = begin
from iris_desktop.cli import main
sys.exit(main(["--data-dir", data, *extra, "recover", name, "--yes"]))
"""


def titles(out: str) -> set[str]:
    """The chats a ``threads`` listing names."""
    return {t for t in ("put back", "current", "in the WAL only") if t in out}


def _history(path: Path, title: str, key=None) -> None:
    with Store(path, key=key) as store:
        store.add_message(store.create_thread(title), {"role": "user", "content": f"{title}?"})


def prepared(capsys, data: Path, key=None) -> Path:
    """A data folder whose history holds "current", and "in the WAL only" committed in
    its -wal alone (its writer died before a checkpoint: -wal and -shm beside it), with
    a set-aside database (already listed) holding "put back"."""
    db = app_paths(data).ensure().db_path
    _history(db.with_name(ASIDE), "put back", key)
    _history(db, "current", key)
    extra = ["--set", "storage.encrypt=true"] if key is not None else []
    code, out, err = run(capsys, "--data-dir", data, *extra, "recover")  # shown: not announced
    assert code == 0 and ASIDE in out, err
    secret = f"key = Key.passphrase({key.secret.decode()!r})\n" if key is not None else "key = None\n"
    writer = (f"import os, sys; sys.path[:0] = {sys.path!r}\n"
              "from iris_desktop.core.store import Store\n"
              "from iris_desktop.core.store.cipher import Key\n" + secret +
              f"s = Store({str(db)!r}, key=key); t = s.create_thread('in the WAL only')\n"
              "s.add_message(t, {'role': 'user', 'content': 'committed, never checkpointed'})\n"
              "os._exit(0)  # killed: no checkpoint at close\n")
    subprocess.run([sys.executable, "-c", writer], check=True, timeout=120)
    assert db.with_name("iris.db-wal").stat().st_size > 0 and db.with_name("iris.db-shm").exists()
    return db


def killed_at(step: str, data: Path, *extra: str) -> None:
    child = subprocess.run(
        [sys.executable, "-c", _KILLED.format(paths=sys.path), step, str(data), ASIDE, *extra],
        capture_output=True, text=True, timeout=300)
    assert child.returncode == -signal.SIGKILL, (child.returncode, child.stderr)


def before_restore(data: Path) -> list[Path]:
    return [p for p in recovery.set_aside_files(data / "iris.db") if ".before-restore-" in p.name]


def put_back_again(capsys, data: Path, name: str, *extra: str) -> set[str]:
    """Put ``name`` back (the history it replaced): the chats it holds."""
    code, out, err = run(capsys, "--data-dir", data, *extra, "recover", name, "--yes")
    assert code == 0, err
    code, out, err = run(capsys, "--data-dir", data, *extra, "threads", "--no-model")
    assert code == 0, err
    return titles(out)


#: each step a kill may cut: the copy made and not yet checked, the journal written and
#: nothing moved, the history's -wal moved, its -shm moved, the history itself moved
#: (the README's case), the copy renamed in and the journal not yet removed
STEPS = ["copied", "journal", "moved iris.db-wal", "moved iris.db-shm", "moved iris.db",
         "renamed"]


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
@pytest.mark.parametrize("step", STEPS)
def test_a_put_back_killed_at_each_step_is_finished_and_said_once(capsys, tmp_path, step):
    data = tmp_path / "data"
    prepared(capsys, data)
    killed_at(step, data)
    code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0, err
    if step == "copied":  # nothing had moved: the history as it was, the copy gone
        assert titles(out) == {"current", "in the WAL only"} and err == ""
        assert not list(data.glob("iris.db.restoring-*")) and before_restore(data) == []
        return
    assert titles(out) == {"put back"}  # the put-back the user asked for, finished
    assert one_sentence(err) and "put-back of " + ASIDE in err and "cut off" in err, err
    replaced = before_restore(data)
    assert len(replaced) == 1 and replaced[0].name in err and "finished it" in err
    assert not list(data.glob("iris.db.put-back*")) and not list(data.glob("iris.db.restoring-*"))
    code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0 and err == "" and titles(out) == {"put back"}  # said once
    # the history it replaced, its WAL's chat included, is whole: it goes back too
    assert put_back_again(capsys, data, replaced[0].name) == {"current", "in the WAL only"}


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_recover_itself_finishes_a_put_back_cut_off_and_says_so(capsys, tmp_path):
    data = tmp_path / "data"
    prepared(capsys, data)
    killed_at("moved iris.db", data)
    code, out, err = run(capsys, "--data-dir", data, "recover")
    assert code == 0 and "put-back of " + ASIDE in err and err.count("\n") == 1, err
    assert "the current database: 1 thread" in out  # not "none": the copy is in place


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_the_window_finishes_a_put_back_cut_off_and_says_so_once(capsys, tmp_path, qtbot,
                                                                 monkeypatch):
    from support.windows import run_gui_recording

    data = tmp_path / "data"
    prepared(capsys, data)
    killed_at("moved iris.db", data)
    shown = run_gui_recording(monkeypatch, data)
    assert [kind for kind, _ in shown] == ["warning", "window"]
    assert "put-back of " + ASIDE in shown[0][1] and "finished it" in shown[0][1]
    assert run_gui_recording(monkeypatch, data) == [("window", "")]  # said once
    code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0 and err == "" and titles(out) == {"put back"}


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_an_encrypted_put_back_cut_off_is_finished_before_the_key_is_decided(
        capsys, tmp_path, monkeypatch):
    """The start decides the key from the file at the history's place: an encrypted copy
    still beside it (the history set aside) must be in place first, or the start takes
    the history for a new plain one and cannot open the copy."""
    from iris_desktop.core.store import cipher

    if not cipher.available():
        pytest.skip(reason="sqlcipher3 is not installed")
    passphrase = "correct horse battery staple"
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", passphrase)
    data = tmp_path / "data"
    key = cipher.Key.passphrase(passphrase)
    prepared(capsys, data, key)
    killed_at("moved iris.db", data, "--set", "storage.encrypt=true")
    assert not (data / "iris.db").exists()
    code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")  # the default
    assert code == 0 and titles(out) == {"put back"}, err
    assert one_sentence(err) and "put-back of " + ASIDE in err
    assert cipher.is_encrypted(data / "iris.db") is True


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_a_put_back_whose_copy_vanished_gives_the_history_back(capsys, tmp_path):
    """Cut off after the history was set aside, and the copy removed since (an older Iris
    took it for a leftover): the history set aside goes back, and that is said."""
    data = tmp_path / "data"
    prepared(capsys, data)
    killed_at("moved iris.db", data)
    for copy in data.glob("iris.db.restoring-*"):
        copy.unlink()
    code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0 and titles(out) == {"current", "in the WAL only"}, err
    assert one_sentence(err) and "is gone" in err and "back where it was" in err
    assert before_restore(data) == []


#: a start (the CLI's ``threads``) finishing a put-back cut off, paused after its first
#: move (the history's -shm set aside, the history not yet) until told to go on
_PAUSED = """
import sys
sys.path[:0] = {paths!r}
from iris_desktop.core.store import putback

real_move, moves = putback.move_file, []


def move(source, target):
    real_move(source, target)
    moves.append(source)
    if len(moves) == 1:
        print("moved", flush=True)
        sys.stdin.readline()


putback.move_file = move
from iris_desktop.cli import main
sys.exit(main(["--data-dir", sys.argv[1], "threads", "--no-model"]))
"""


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_recover_run_while_a_start_finishes_a_put_back_leaves_its_files_alone(capsys, tmp_path):
    """A review: ``recover`` in a second process, while a start (holding the lock) was
    half-way through finishing a put-back, moved the set-aside -wal and -shm back beside
    the history just before the start moved that history aside and renamed the copy in:
    the history put back read the old WAL's chats, and the set-aside lost its WAL-only
    chat. Now nothing beside the history moves while another process holds the lock."""
    data = tmp_path / "data"
    prepared(capsys, data)
    killed_at("moved iris.db-wal", data)
    start = subprocess.Popen([sys.executable, "-c", _PAUSED.format(paths=sys.path), str(data)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        assert start.stdout.readline().strip() == "moved"
        code, out, err = run(capsys, "--data-dir", data, "recover")
        assert code == 0, err
        assert not (data / "iris.db-wal").exists() and not (data / "iris.db-shm").exists()
    finally:
        out, err = start.communicate("\n", timeout=300)
    assert start.returncode == 0, err
    assert titles(out) == {"put back"} and one_sentence(err) and "finished it" in err, (out, err)
    replaced = before_restore(data)
    assert len(replaced) == 1
    assert put_back_again(capsys, data, replaced[0].name) == {"current", "in the WAL only"}


#: a set-aside's name as a put-back gives it
_ASIDE = "iris.db.before-restore-20260101T000000"


@pytest.mark.parametrize("journal", [
    {"state": "begun", "file": ASIDE, "work": "..", "aside": _ASIDE},
    {"state": "begun", "file": ASIDE, "work": "iris.db", "aside": _ASIDE},
    {"state": "begun", "file": ASIDE, "work": "iris.db.restoring-1", "aside": "iris.db"},
    {"state": "begun", "file": "..", "work": "iris.db.restoring-1", "aside": _ASIDE},
    {"state": "finished", "file": ASIDE, "work": "iris.db.restoring-1", "aside": "iris.db"},
    {"state": "done", "file": ASIDE, "work": "iris.db.restoring-1", "aside": _ASIDE},
    "not a journal {",
], ids=["work ..", "work the history", "aside the history", "file ..", "finished as the history",
        "no such state", "not JSON"])
def test_a_journal_no_put_back_wrote_is_removed_and_the_start_goes_on(capsys, tmp_path, journal):
    """A review: a hand-written or damaged journal ("work": "..") set the history aside
    and then failed at every start ("…finishing it failed (Device or resource busy)…
    free some space or make the folder writable") until it was deleted by hand; one
    naming the history itself as the set-aside was said as a put-back finished. Now a
    journal whose names are not the ones a put-back gives is removed (one logged line),
    and the start goes on with the history as it was."""
    data = tmp_path / "data"
    prepared(capsys, data)
    text = json.dumps(journal) if isinstance(journal, dict) else journal
    (data / "iris.db.put-back").write_text(text, encoding="utf-8")
    for _ in range(2):
        code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
        assert code == 0 and err == "" and titles(out) == {"current", "in the WAL only"}, err
    assert not (data / "iris.db.put-back").exists() and before_restore(data) == []


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
@pytest.mark.parametrize("step", ["journal", "moved iris.db-wal", "moved iris.db-shm"])
def test_a_copy_removed_before_the_history_moved_is_not_said_finished(capsys, tmp_path, step):
    """A review: cut off before the history itself moved, and the copy removed since (an
    older Iris took it for a leftover), the start said "Iris finished it: X is the
    history now": false, the history was the old one. It now says what happened: the
    history was never moved, or its -wal and -shm went back beside it."""
    data = tmp_path / "data"
    prepared(capsys, data)
    killed_at(step, data)
    for copy in data.glob("iris.db.restoring-*"):
        copy.unlink()
    code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0 and titles(out) == {"current", "in the WAL only"}, err
    assert one_sentence(err) and "is gone" in err and "is the history now" not in err, err
    assert ("was never moved" if step == "journal" else "back where it was") in err
    assert not list(data.glob("iris.db.before-restore-*"))
    code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0 and err == "" and titles(out) == {"current", "in the WAL only"}


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_a_put_back_into_an_empty_folder_cut_off_after_its_rename_is_said_finished(capsys, tmp_path):
    """No history before it, so no set-aside: the journal's record of the copy tells that
    the history now at its place is the copy."""
    data = tmp_path / "data"
    db = app_paths(data).ensure().db_path
    _history(db.with_name(ASIDE), "put back")
    code, out, err = run(capsys, "--data-dir", data, "recover")
    assert code == 0 and not db.exists(), err
    killed_at("renamed", data)
    code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    assert code == 0 and titles(out) == {"put back"}, err
    assert one_sentence(err) and "finished it" in err and "there was no history before it" in err


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_a_copy_removed_and_another_history_made_since_is_said_as_it_is(capsys, tmp_path):
    """Cut off after the history was set aside, the copy removed and a new history made
    since (an older Iris): neither "finished" (the history is not the copy) nor "back
    where it was"; the start says where the history it was to replace is."""
    data = tmp_path / "data"
    prepared(capsys, data)
    killed_at("moved iris.db", data)
    for copy in data.glob("iris.db.restoring-*"):
        copy.unlink()
    _history(data / "iris.db", "made since")
    code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
    replaced = before_restore(data)
    assert code == 0 and "made since" in out and titles(out) == set(), err
    assert len(replaced) == 1 and one_sentence(err) and "is the history now" not in err, err
    assert "iris.db is another file" in err and f"set aside as {replaced[0].name}" in err
    assert put_back_again(capsys, data, replaced[0].name) == {"current", "in the WAL only"}
