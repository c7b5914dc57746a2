"""A real second process holding an encrypted history open (a window, a chat), until the
test tells it to let go: ``holder.communicate("")``."""

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
