"""The real CLI (``iris_desktop.cli.main``) in a process of its own, with a scripted model
that takes as long as the test wants over each reply (a summary too): for tests of what
another process sees while this one waits for its model, as for a real model's minutes.

    python tests/support/slow_cli.py --data-dir D compact 1

Env: ``IRIS_TEST_STARTED``, a file made when the model is first asked (the command holds
its lease on the chat by then, when it compacts); ``IRIS_TEST_GATE``, a file each reply
waits for before its first word (up to 60 s): no timing to guess; ``IRIS_TEST_REPLY``, the
reply's text."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import iris_desktop.host as host_module  # noqa: E402

from support.fakes import ScriptedRuntime  # noqa: E402


def held_reply(_messages) -> str:
    """The reply, once the test opens the gate."""
    if os.environ.get("IRIS_TEST_STARTED"):
        Path(os.environ["IRIS_TEST_STARTED"]).touch()
    gate = Path(os.environ.get("IRIS_TEST_GATE", ""))
    for _ in range(6_000):  # bounded: 60 s
        if gate.is_file():
            break
        time.sleep(0.01)
    return os.environ.get("IRIS_TEST_REPLY", "scripted reply")


def slow_runtime(settings, paths, **_kw):
    return ScriptedRuntime([held_reply] * 8)


if __name__ == "__main__":
    host_module.load_runtime = slow_runtime
    from iris_desktop.cli import main

    sys.exit(main(sys.argv[1:]))
