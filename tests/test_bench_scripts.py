"""Every benchmark script still imports and parses its arguments (the benchmarks
themselves run for minutes against the corpus; they are run by hand, see
docs/benchmarks.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if not p.name.startswith("_"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_bench_script_starts(script):
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True,
                          text=True, timeout=300, cwd=BENCH.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
