"""The real CLI (``iris_desktop.cli.main``) in a process of its own, with a scripted runtime
in place of the model: for tests of two processes writing one data folder at once.

    python tests/support/scripted_cli.py --data-dir D chat --thread 1 "question"

Env: ``IRIS_TEST_REPLY``, the reply's text; ``IRIS_TEST_GATE``, a file the turn waits for
between storing the question and planning its request (up to 60 s), where the model would
be tokenizing, ranking recall or summarizing: a test holds a turn open there, as long as
it needs, with no timing to guess; ``IRIS_TEST_LOADED``, a file made when the model loads."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import iris_desktop.host as host_module  # noqa: E402
from iris_desktop.core.planner import Planner  # noqa: E402

from support.fakes import ScriptedRuntime  # noqa: E402


def scripted_runtime(settings, paths, **_kw):
    if os.environ.get("IRIS_TEST_LOADED"):  # the test learns that a model was loaded
        Path(os.environ["IRIS_TEST_LOADED"]).touch()
    return ScriptedRuntime([os.environ.get("IRIS_TEST_REPLY", "scripted reply")] * 8)


def gated_plan(plan):
    def wait_then_plan(self, *args, **kwargs):
        gate = Path(os.environ["IRIS_TEST_GATE"])
        for _ in range(6_000):  # bounded: 60 s
            if gate.exists():
                break
            time.sleep(0.01)
        return plan(self, *args, **kwargs)
    return wait_then_plan


if __name__ == "__main__":
    host_module.load_runtime = scripted_runtime
    if os.environ.get("IRIS_TEST_GATE"):
        Planner.plan = gated_plan(Planner.plan)
    from iris_desktop.cli import main

    sys.exit(main(sys.argv[1:]))
