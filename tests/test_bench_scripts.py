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


def test_the_retention_matcher_scores_as_locomo_does_and_keeps_the_strict_column():
    """Dates match in any written form, and a multi-hop list is scored item by item
    (LoCoMo's ``f1_multi``); the strict matcher takes the answer as written."""
    sys.path.insert(0, str(BENCH))
    try:
        import retention
    finally:
        sys.path.remove(str(BENCH))
    text = ("- Ana: I took up pottery this spring, and we went camping in June.\n"
            "- Ana: My son fell off his bike at the park last Saturday (the Saturday before 15 "
            "August 2023), but he is fine now.")
    seen = retention.Seen(text)
    multi_hop = {"answer": "pottery, camping, painting, swimming", "category": 1}
    assert seen.finds(multi_hop) == (True, False)  # 2 of 4 items: 0.5 on average
    assert seen.finds(dict(multi_hop, answer="pottery, painting, swimming, chess")) == (False, False)
    assert seen.finds(dict(multi_hop, category=4)) == (False, False)  # a list only in multi-hop
    temporal = {"answer": "Saturday before August 15, 2023.", "category": 2}
    assert seen.finds(temporal) == (True, False)
    assert seen.finds(dict(temporal, answer="The Saturday before 15August, 2023")) == (True, False)
    assert seen.finds(dict(temporal, answer="Saturday before 15 August 2023")) == (True, True)
    assert seen.finds(dict(temporal, answer="Saturday before 16 August 2023")) == (False, False)
    assert retention.one_date_form("on 9th of April, 2023 and Apr 9 2023") == \
        "on 9 April 2023 and 9 April 2023"
