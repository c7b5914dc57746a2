"""Kill -9 a real `iris-desktop chat` mid-reply, then check that nothing was lost
(tests/test_crash.py, 20 rounds); and a writer process caught mid-reply, for the tests of
liveness (:func:`streaming_writer`).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

PROMPT = "Write a very long story about a lighthouse keeper and her cat."
REPO = Path(__file__).resolve().parents[2]


def streaming_writer(db: Path) -> tuple[subprocess.Popen, int, int]:
    """A real process that stores a user message and the start of a reply ("Hel", still
    streaming) in ``db``, then waits to be killed: (the process, the thread, the reply)."""
    code = f"""
import time
from iris_desktop.core.store import Store
store = Store({str(db)!r})
thread = store.create_thread("t")
store.add_message(thread, {{"role": "user", "content": "hi"}})
reply = store.add_message(thread, {{"role": "assistant", "content": "Hel"}}, status="streaming")
print(thread, reply, flush=True)
time.sleep(600)
"""
    writer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        thread, reply = map(int, writer.stdout.readline().split())
    except ValueError:
        writer.kill()
        writer.wait()
        raise
    return writer, thread, reply


def crash_once(data_dir: Path, model_path: Path, timeout_s: float = 120.0) -> dict:
    """Start a chat, SIGKILL it once partial text is on disk, return what the DB holds."""
    db = data_dir / "iris.db"
    env = {**os.environ, "IRIS_HOME": str(data_dir)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "iris_desktop", "--set", f"model.path={model_path}",
         "--set", "model.max_tokens=4000", "--set", "model.n_ctx=8192", "chat", "--new", PROMPT],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + timeout_s
    partial = ""
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"chat exited ({proc.returncode}) before it could be killed")
            if db.exists():
                try:
                    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
                        row = conn.execute(
                            "SELECT content FROM messages WHERE role = 'assistant' "
                            "AND status = 'streaming' ORDER BY id DESC LIMIT 1").fetchone()
                except sqlite3.OperationalError:
                    row = None
                if row and row[0]:
                    partial = row[0]
                    break
            time.sleep(0.05)
        else:
            raise AssertionError("no partial reply was saved in time")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    from iris_desktop.core.store import Store

    store = Store(db)
    try:
        recovered = len(store.mark_interrupted_streams())
        rows = list(store.db.query("SELECT role, content, status FROM messages ORDER BY id"))
        return {
            "integrity": store.integrity_check(),
            "recovered": recovered,
            "rows": rows,
            "partial_seen": partial,
            "killed_by": -proc.returncode,
        }
    finally:
        store.close()


def check(result: dict) -> None:
    assert result["killed_by"] == signal.SIGKILL
    assert result["integrity"] == "ok"
    user, reply = result["rows"][-2], result["rows"][-1]
    assert user["role"] == "user" and user["content"] == PROMPT and user["status"] == "complete"
    assert reply["role"] == "assistant" and reply["status"] == "interrupted"
    # what was on disk before the kill is still there (at most one save interval lost)
    assert reply["content"].startswith(result["partial_seen"]) and reply["content"]
