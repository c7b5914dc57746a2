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
