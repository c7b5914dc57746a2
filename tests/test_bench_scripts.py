"""Every benchmark script still imports and parses its arguments (the benchmarks
themselves run for minutes against the corpus; they are run by hand, see
docs/benchmarks.md)."""

from __future__ import annotations

import re
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


def test_prefix_reuse_compares_the_question_turns_of_two_recall_sizes(capsys):
    sys.path.insert(0, str(BENCH))
    try:
        import prefix_reuse
    finally:
        sys.path.remove(str(BENCH))
    row = {"turn": 1, "recall": 0, "evaluated": 40, "ttft": 0.5}
    iris = [row, dict(row, turn=2, recall=1500, evaluated=1600, ttft=12.0)]
    other = [row, dict(row, turn=2, recall=1000, evaluated=1100, ttft=8.0)]
    prefix_reuse.compare_recall(iris, other, 1536, 1024)
    out = capsys.readouterr().out
    assert "| 2 | 1,500 | 1,600 | 12.000 | 1,000 | 1,100 | 8.000 |" in out
    assert "| 1 |" not in out  # a turn that asks nothing has no block in either
    assert out.rstrip().endswith(
        "prefix_reuse_recall: question_turns=1 recall_ratio=1.500 median_ttft_s=12.000 "
        "median_ttft_compared_s=8.000 ttft_ratio=1.500")


def test_longmemeval_counts_evidence_by_the_ids_the_request_shows(capsys):
    """On small LongMemEval-shaped chats (tests/fixtures/longmemeval, made by
    make_synthetic_longmemeval.py): import, compact, plan the question; an evidence message
    counts when the recall block or the verbatim history shows it, never through the
    summary; a question without evidence is skipped and listed."""
    sys.path.insert(0, str(BENCH))
    try:
        import longmemeval
    finally:
        sys.path.remove(str(BENCH))
    from iris_desktop.tokens import HeuristicCounter

    fixtures = sorted((BENCH.parent / "tests" / "fixtures" / "longmemeval").glob("*.json"))
    paths = longmemeval.choose(fixtures, 2, None)
    assert [longmemeval.question_type(p) for p in paths] == ["single-session-user", "multi-session"]
    assert len(longmemeval.choose(fixtures, 0, ["temporal-reasoning"])) == 1

    rows = [longmemeval.one_file(p, HeuristicCounter(), window=2048) for p in fixtures]
    scored = {r["type"]: r for r in rows if "skipped" not in r}
    for row in scored.values():
        assert row["paths"] == ["extractive"]
        assert row["summarized"] == row["evidence"] == row["recalled"] == row["found"]
        assert row["evidence_all"] and row["answer"] and 0 < row["recall_tokens"] < row["request_tokens"]
        assert row["ceiling_all"]  # a perfect ranking finds what this one found
    assert scored["multi-session"]["evidence"] == 2
    longmemeval.report(rows, "fixtures")
    out = capsys.readouterr().out
    assert "| multi-session | 1 | 100% | 100% | 100% |" in out
    assert "skipped: synthetic-no-evidence" in out
    assert out.rstrip().splitlines()[-1].startswith(
        "longmemeval: evidence_all=1.000 evidence_any=1.000 answer=1.000 n=2 recall_tokens_median=")

    # without recall the summarized evidence is not in the request: the summary does not count
    off = [longmemeval.one_file(p, HeuristicCounter(), window=2048, recall=0) for p in paths]
    assert [(r["found"], r["evidence_any"], r["recall_tokens"]) for r in off] == [(0, False, 0)] * 2
    assert not any(r["ceiling_all"] for r in off)  # no block: no ranking can show them
    table = longmemeval.summarize(off)
    assert table["overall"]["n"] == 2 and table["overall"]["evidence_all"] == 0.0


def test_throughput_runs_iris_and_llama_cpp_side_by_side_and_ends_with_its_ratios(model_path):
    """bench/throughput.py in a tiny configuration: Iris and two low-level contexts that
    differ only in the generation thread count, which changes no number llama.cpp computes
    (each row of a product is one thread's work): the agreement check must say so; and one
    on the exact Q8_0 copy of the weights (``q8w``), which changes no value either."""
    done = subprocess.run(
        [sys.executable, str(BENCH / "throughput.py"), "--reps", "1", "--sizes", "64", "--tg", "4",
         "--configs", "t1,tg2.tb1,t1.q8w", "--model", str(model_path)],
        capture_output=True, text=True, timeout=600, cwd=BENCH.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.rstrip().splitlines()
    assert any(line.startswith("| Iris | the app's runtime") for line in lines)
    assert any(line.startswith("| t1 | threads 1/1, FA off") for line in lines)
    assert "| tg2.tb1 | 1/1 | 0.000 | yes |" in lines
    assert any(line.startswith("| t1.q8w | threads 1/1, FA off, batch 512/512, KV f16, Q5_0 weights as Q8_0")
               for line in lines)
    assert any(line.startswith("| t1.q8w | 1/1 |") and line.endswith("| yes |") for line in lines)
    last = re.fullmatch(r"throughput: pp_ratio=(\d+\.\d+) tg_ratio=\d+\.\d+ pp64_ratio=(\d+\.\d+) "
                        r"pp_ratio_fastest=(\d+\.\d+) tg_ratio_fastest=\d+\.\d+ "
                        r"pp_best=(\S+) tg_best=\S+ iris_pp64=\d+\.\d iris_tg=\d+\.\d reps=1 "
                        r"llama_bench=(yes|no) load_before=\S+ load_after=\S+", lines[-1])
    assert last, lines[-1]
    # rates, not asserted: on a machine busy with other work they can round to 0.0
    assert last.group(1) == last.group(2)  # one size: the lowest ratio is its ratio
    # one repetition: its fastest is its median
    assert last.group(3) == last.group(1)
    assert any(line.startswith("fastest repetitions (the least disturbed): pp64 ") for line in lines)
    assert last.group(4) in {"t1", "tg2.tb1", "t1.q8w"} or last.group(4).startswith("llama-bench")


def test_versus_pairs_each_figure_with_its_twin_and_skips_what_did_not_change(capsys):
    """bench/versus.py: lines that read the same but for their numbers are paired; a
    number equal on both sides (a size, a count) is not reported; medians over rounds."""
    sys.path.insert(0, str(BENCH))
    try:
        import versus
    finally:
        sys.path.remove(str(BENCH))
    table = "| messages | median build (ms) |\n|---:|---:|\n| 1,000 | {a} |\n| 100,000 | {b} |\nok\n"
    old = [versus.figures(table.format(a=a, b=b)) for a, b in ((2.0, 4.0), (2.2, 4.4), (9.0, 4.2))]
    new = [versus.figures(table.format(a=a, b=b)) for a, b in ((1.0, 4.0), (1.1, 4.4), (1.2, 4.2))]
    versus.report({"old": old, "new": new}, {"old": [10.0, 12.0, 11.0], "new": [5.0, 6.0, 7.0]},
                  "OLD", "NEW", ["bench/x.py"])
    out = capsys.readouterr().out
    assert "| 1,000 | 2.0 |\n    old → new: 2.2 → 1.1 (0.50×)" in out  # medians: 2.2 and 1.1
    assert "| 100,000 |" not in out  # 4.0, 4.4, 4.2 on both sides: nothing to say
    assert "whole run: 11.0 s → 6.0 s (0.55×)" in out
