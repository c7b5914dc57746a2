"""``recover`` and the conversion lock: a process that finds another holding the lock
says what that one is really doing, and ``recover --salvage`` holds the lock too.

The holder is a real second process (the real CLI), stopped inside its real work (a
start finishing a put-back a kill cut off, ``recover NAME``, an encryption, ``recover
--salvage``) until the test lets it go through a pipe; the test then runs the real
``recover --salvage``, ``recover NAME`` and a plain start (``threads``) beside it.

Before: every refusal said "another Iris process is converting <path> now (encrypting
or decrypting it)", also beside a put-back (or its finish at a start); and ``recover
--salvage`` took no lock at all: beside a put-back being finished it set the history
aside and swapped its copy in under the other's moves (and a start beside a salvage
opened the history the salvage was about to move away).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from iris_desktop.core.store import Store, cipher, putback
from iris_desktop.paths import app_paths

from support.helpers import one_sentence
from support.helpers import run_cli as run

pytestmark = pytest.mark.usefixtures("no_keyring")

#: the set-aside database the commands put back (already listed: not announced)
ASIDE = "iris.db.corrupt-20260101T000000"
PASSPHRASE = "correct horse battery staple 4711"

#: the child: the real CLI, stopped at a step of its work (its lock held) until a line
#: arrives on its stdin; "holding" on its stdout says it got there
_HOLDER = """
import sys
sys.path[:0] = {paths!r}
kind, data, aside = sys.argv[1:4]


def stopped(real):
    def wait(*args, **kwargs):
        print("holding", flush=True)
        sys.stdin.readline()
        return real(*args, **kwargs)
    return wait


from iris_desktop.core.store import cipher, putback, recovery

argv = ["--data-dir", data, "threads", "--no-model"]  # a start
if kind == "finishing-put-back":  # a start finishing a put-back cut off
    putback._roll_forward = stopped(putback._roll_forward)
elif kind == "putting-back":  # recover NAME, its journal not yet written
    putback.begin = stopped(putback.begin)
    argv = ["--data-dir", data, "recover", aside, "--yes"]
elif kind == "converting":  # a start encrypting the history, its copy made
    cipher._verify = stopped(cipher._verify)
    argv = ["--data-dir", data, "--set", "storage.encrypt=true", "threads", "--no-model"]
elif kind == "salvaging":  # recover --salvage, about to copy the rows
    recovery._copy_all = stopped(recovery._copy_all)
    argv = ["--data-dir", data, "recover", "--salvage", "--yes"]
elif kind == "older":  # an older Iris (or a holder killed): the lock, no word of its own
    from pathlib import Path
    from iris_desktop.files import exclusive_lock
    db = Path(data) / "iris.db"
    with exclusive_lock(cipher._conversion_lock(db)):
        cipher._conversion_lock(db).with_name(".iris.db.lock-holder").write_text("salvaging 999999999")
        stopped(lambda: None)()
    sys.exit(0)
from iris_desktop.cli import main
sys.exit(main(argv))
"""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def history_files(data: Path) -> dict[str, str]:
    """The history's files (the database, its -wal and -shm, the set-aside ones, work
    copies, a journal, the lock's), by name: their contents."""
    return {p.name: sha256(p) for p in data.iterdir() if p.is_file() and "iris.db" in p.name}


def _chat(path: Path, title: str) -> None:
    with Store(path) as store:
        store.add_message(store.create_thread(title), {"role": "user", "content": f"{title}?"})


@pytest.fixture
def data(capsys, tmp_path) -> Path:
    """A data folder: a history holding "current", a set-aside one holding "put back"
    (listed once, so no command announces it)."""
    folder = tmp_path / "data"
    db = app_paths(folder).ensure().db_path
    _chat(db, "current")
    _chat(db.with_name(ASIDE), "put back")
    code, out, err = run(capsys, "--data-dir", folder, "recover")
    assert code == 0 and ASIDE in out, err
    return folder


def cut_off_put_back(data: Path) -> None:
    """A put-back of ASIDE cut off after its journal (the real journal writer): its
    checked copy beside the history, nothing moved yet."""
    db = data / "iris.db"
    work = db.with_name("iris.db.restoring-4000000")
    shutil.copyfile(db.with_name(ASIDE), work)
    putback.begin(db, db.with_name(ASIDE), work, db.with_name("iris.db.before-restore-20260102T000000"))


@contextmanager
def holder(kind: str, data: Path) -> Iterator[subprocess.Popen]:
    """The child of :data:`_HOLDER`, stopped with the lock held; let go at the end."""
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLDER.format(paths=sys.path), kind, str(data), ASIDE],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        while line and line.strip() != "holding":
            line = child.stdout.readline()
        assert line.strip() == "holding", child.stderr.read()
        yield child
    finally:
        if child.poll() is None:
            child.stdin.write("go\n")
            child.stdin.flush()
        child.wait(timeout=300)


@pytest.fixture(autouse=True)
def short_wait(monkeypatch):
    """A start waits a moment for another process's opening (5 s): a second is enough here."""
    monkeypatch.setattr(cipher, "CONVERSION_WAIT_S", 1.0)


def refused_beside(capsys, data: Path, doing: str) -> None:
    """``threads``, ``recover --salvage`` and ``recover ASIDE`` beside the holder: each
    says the holder is ``doing`` (one sentence, exit 1), and no file of the history
    changed (all three run, and are compared at once)."""
    before = history_files(data)
    said = [run(capsys, "--data-dir", data, *argv)[::2] for argv in (
        ["threads", "--no-model"], ["recover", "--salvage", "--yes"], ["recover", ASIDE, "--yes"])]
    assert said == [
        (1, f"iris-desktop: another Iris process is {doing}; start Iris again when it is done; "
            "nothing was changed\n"),
        (1, f"iris-desktop: another Iris process is {doing}; try again when it is done; nothing "
            "was changed\n"),
        (1, f"iris-desktop: could not put {ASIDE} back (another Iris process is {doing}; run "
            f"'iris-desktop recover {ASIDE}' again when it is done); nothing was changed\n")]
    assert history_files(data) == before


def titles(capsys, data: Path, *extra: str) -> set[str]:
    code, out, err = run(capsys, "--data-dir", data, *extra, "threads", "--no-model")
    assert code == 0, err
    return {t for t in ("current", "put back") if t in out}


def test_beside_a_start_finishing_a_put_back_each_says_putting_back(capsys, data):
    """Before: "another Iris process is converting …" (a start waiting), and ``recover
    --salvage`` salvaged the history while the put-back's files were being moved."""
    db = data / "iris.db"
    cut_off_put_back(data)
    with holder("finishing-put-back", data) as child:
        refused_beside(capsys, data, f"putting a set-aside database back in place of {db} now "
                                     "(finishing a put-back that was cut off)")
    assert child.returncode == 0, child.stderr.read()
    assert titles(capsys, data) == {"put back"}  # the put-back finished, nothing else moved


def test_beside_recover_name_each_says_putting_back(capsys, data):
    db = data / "iris.db"
    with holder("putting-back", data) as child:
        refused_beside(capsys, data, f"putting a set-aside database back in place of {db} now "
                                     "('iris-desktop recover NAME')")
    assert child.returncode == 0, child.stderr.read()
    assert titles(capsys, data) == {"put back"}


def test_beside_a_conversion_each_still_says_converting(capsys, data, monkeypatch):
    """The sentence that was right stays: a start beside an encryption says converting."""
    db = data / "iris.db"
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", PASSPHRASE)  # the child's, and the check's
    with holder("converting", data) as child:
        refused_beside(capsys, data, f"converting {db} now (encrypting or decrypting it)")
    assert child.returncode == 0, child.stderr.read()
    assert cipher.is_encrypted(db) is True
    assert titles(capsys, data, "--set", "storage.encrypt=true") == {"current"}


def test_beside_a_salvage_each_says_salvaging(capsys, data):
    """Before: the salvage held no lock: a start opened the history it was about to set
    aside (exit 0), and a second salvage or a put-back swapped files under it."""
    db = data / "iris.db"
    with holder("salvaging", data) as child:
        refused_beside(capsys, data, f"salvaging {db} now (copying what can be read of it into "
                                     "a new database)")
    assert child.returncode == 0, child.stderr.read()
    assert len([p for p in data.iterdir() if p.name.startswith("iris.db.corrupt-")
                and not p.name.endswith(("-wal", "-shm"))]) == 2  # ASIDE, and the salvaged one
    assert titles(capsys, data) == {"current"}


def test_a_holder_whose_word_cannot_be_told_is_said_as_changing(capsys, data):
    """An older Iris holding the lock writes no word; the one left is of a process that
    is gone: neither is believed."""
    db = data / "iris.db"
    with holder("older", data):
        before = history_files(data)
        code, out, err = run(capsys, "--data-dir", data, "threads", "--no-model")
        assert code == 1 and one_sentence(err), err
        assert err == (f"iris-desktop: another Iris process is changing {db} now (converting it, "
                       "putting a database back in its place or salvaging it); start Iris again "
                       "when it is done; nothing was changed\n")
        code, out, err = run(capsys, "--data-dir", data, "recover", "--salvage", "--yes")
        assert code == 1 and f"another Iris process is changing {db} now" in err, err
        assert history_files(data) == before


_OPEN = """
import sys
sys.path[:0] = {paths!r}
from iris_desktop.host import Host
host = Host({data!r})
host.store.threads()
print("open", flush=True)
sys.stdin.readline()
"""


def test_a_salvage_beside_a_start_that_has_the_history_open_is_refused_as_before(capsys, data):
    """The salvage takes the lock, which a start lets go once it has opened the history:
    the history open elsewhere is still what refuses it."""
    db = data / "iris.db"
    child = subprocess.Popen([sys.executable, "-c", _OPEN.format(paths=sys.path, data=str(data))],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "open", child.stderr.read()
        before = history_files(data)
        code, out, err = run(capsys, "--data-dir", data, "recover", "--salvage", "--yes")
        assert (code, err) == (1, f"iris-desktop: another Iris process (the app, or a chat) has "
                                  f"{db} open; close it, then try again; nothing was changed\n")
        assert history_files(data) == before
    finally:
        child.stdin.write("go\n")
        child.stdin.flush()
        child.wait(timeout=120)
    code, out, err = run(capsys, "--data-dir", data, "recover", "--salvage", "--yes")
    assert code == 0, err
    assert not (data / ".iris.db.lock-holder").exists()  # said only while held
