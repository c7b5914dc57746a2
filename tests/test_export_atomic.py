"""``export -o FILE`` replaces FILE atomically: a write that fails half way (a full disk,
made real here with the kernel's file-size limit, RLIMIT_FSIZE) or a kill -9 leaves the
earlier export whole, and no temporary file behind. Before: the file was truncated and
written in place, so the earlier export was lost (4 of 4 tries)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
POSIX = os.name == "posix"

_LIMITED = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), int(sys.argv[1])))
from iris_desktop.cli import main
sys.exit(main(sys.argv[2:]))
"""


def iris(*args: str, limit: int | None = None, **options) -> subprocess.CompletedProcess:
    command = ([sys.executable, "-c", _LIMITED, str(limit)] if limit else
               [sys.executable, "-m", "iris_desktop"])
    return subprocess.run([*command, *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120, **options)


@pytest.fixture
def big_chat(tmp_path):
    data = tmp_path / "home"
    source = tmp_path / "chat.json"
    source.write_text(json.dumps([{"role": "user" if i % 2 == 0 else "assistant",
                                   "content": f"message {i} " + "lorem ipsum " * 40}
                                  for i in range(2_000)]))
    done = iris("--data-dir", str(data), "import", str(source))
    assert done.returncode == 0, done.stderr
    return data


@pytest.mark.skipif(not POSIX, reason="RLIMIT_FSIZE")
def test_a_full_disk_during_export_leaves_the_earlier_export_whole(big_chat, tmp_path):
    target = tmp_path / "out" / "chat.json"
    target.parent.mkdir()
    target.write_text("the earlier export\n")
    done = iris("--data-dir", str(big_chat), "export", "1", "-o", str(target), limit=200_000)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"iris-desktop: cannot write {target}") and done.stderr.count("\n") == 1
    assert target.read_text() == "the earlier export\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["chat.json"]  # no leftover
    done = iris("--data-dir", str(big_chat), "export", "1", "-o", str(target))
    assert done.returncode == 0 and len(json.loads(target.read_text())["messages"]) == 2_000


@pytest.mark.skipif(not POSIX, reason="kill -9")
def test_an_export_killed_mid_write_leaves_the_earlier_export_whole(big_chat, tmp_path):
    target = tmp_path / "chat.md"
    for delay in (0.2, 0.5, 0.8, 1.2):
        target.write_text("the earlier export\n")
        child = subprocess.Popen([sys.executable, "-m", "iris_desktop", "--data-dir", str(big_chat),
                                  "export", "1", "--format", "md", "-o", str(target)], cwd=REPO,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        child.wait()
        text = target.read_text()
        assert text == "the earlier export\n" or (text.startswith("# ") and "message 1999" in text)


#: the real CLI, stopped in its export's last step (the temporary file written, not yet
#: renamed over the target): ``kill`` kills it there (SIGKILL), ``hold`` prints the
#: temporary file's name and waits, still writing, until its stdin closes
_STOPPED = """
import os, signal, sys
sys.path[:0] = {paths!r}
real_replace = os.replace


def replace(src, dst, *args, **kwargs):
    if str(src).endswith(".iris-tmp"):
        if sys.argv[1] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        print(src, flush=True)
        sys.stdin.read()
    real_replace(src, dst, *args, **kwargs)


os.replace = replace
from iris_desktop.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.skipif(not POSIX, reason="kill -9")
def test_the_next_export_removes_what_a_killed_export_left_and_no_live_ones(big_chat, tmp_path):
    """Before (the README said so): each killed ``export -o`` left its hidden
    ``.NAME.<pid>-….iris-tmp`` beside the target for good. The next export to that folder
    removes those of processes that are gone; one a live export is writing stays."""
    folder = tmp_path / "exports"
    folder.mkdir()
    target, other = folder / "chat.md", folder / "other.md"
    stopped = [sys.executable, "-c", _STOPPED.format(paths=sys.path)]
    export = ["--data-dir", str(big_chat), "export", "1", "--format", "md", "-o"]
    killed = subprocess.run([*stopped, "kill", *export, str(target)], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    left = list(folder.glob(".chat.md.*.iris-tmp"))
    assert len(left) == 1 and not target.exists()  # what a kill -9 leaves
    live = subprocess.Popen([*stopped, "hold", *export, str(other)], cwd=REPO, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        writing = Path(live.stdout.readline().strip())
        assert writing.parent == folder and writing.exists()
        done = iris(*export, str(target))
        assert done.returncode == 0 and done.stderr == (
            f"iris-desktop: exported thread 1 to {target} (Markdown, the branch shown)\n"), done.stderr
        assert not left[0].exists() and writing.exists()  # the live export's stays
        assert "message 1999" in target.read_text()
    finally:
        live.communicate("", timeout=120)
    assert live.returncode == 0 and "message 1999" in other.read_text()
    assert sorted(p.name for p in folder.iterdir()) == ["chat.md", "other.md"]
