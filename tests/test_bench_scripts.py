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
                        r"llama_bench=(yes|no) load_before=\S+ load_after=\S+ gpu=(yes|no)( \S+)*", lines[-1])
    assert last, lines[-1]
    # the GPU column: where llama.cpp lists no GPU (a CPU-only build), left out in one line
    throughput = _throughput()
    from iris_desktop.runtime.devices import list_devices

    if not throughput.gpu_devices(list_devices()):
        assert throughput.NO_GPU in lines and last.group(6) == "no"
        assert not any(line.startswith("| Iris GPU") for line in lines)
    # rates, not asserted: on a machine busy with other work they can round to 0.0
    assert last.group(1) == last.group(2)  # one size: the lowest ratio is its ratio
    # one repetition: its fastest is its median
    assert last.group(3) == last.group(1)
    assert any(line.startswith("fastest repetitions (the least disturbed): pp64 ") for line in lines)
    assert last.group(4) in {"t1", "tg2.tb1", "t1.q8w"} or last.group(4).startswith("llama-bench")


def _throughput():
    sys.path.insert(0, str(BENCH))
    try:
        import throughput
    finally:
        sys.path.remove(str(BENCH))
    return throughput


def _fake_devices(monkeypatch, throughput, *gpus):
    from iris_desktop.runtime.gpu import Device

    cpu = Device("CPU", "AMD EPYC", "cpu", "CPU", 16 * 2**30, 16 * 2**30, index=0)
    monkeypatch.setattr(throughput, "list_devices", lambda: [cpu, *gpus])


def test_throughput_gpu_column_is_planned_from_the_device_listing(model_path, monkeypatch, tmp_path):
    """The GPU column (issue 46): with no GPU listed it is left out, in one line; with a
    (faked) GPU the app's own plan (model.gpu=auto, or --gpu-layers N) names the device
    and the layer split; lavapipe counts only when GGML_VK_VISIBLE_DEVICES asks for it,
    and is labelled a CPU-type Vulkan device. The GGUF header only: nothing is loaded."""
    from iris_desktop.runtime.gpu import Device

    monkeypatch.setenv("IRIS_HOME", str(tmp_path))  # no first-use record of this machine's
    throughput = _throughput()
    settings = throughput.iris_settings(model_path, "auto")
    assert settings["model.gpu"] == "auto" and throughput.iris_settings(model_path)["model.gpu"] == "off"

    _fake_devices(monkeypatch, throughput)
    assert throughput.plan_gpu_column(model_path, settings, "auto", env={}) == (None, throughput.NO_GPU)

    rtx = Device("Vulkan0", "NVIDIA GeForce RTX 4070", "gpu", "Vulkan", 11 * 2**30, 12 * 2**30, index=1)
    _fake_devices(monkeypatch, throughput, rtx)
    plan, line = throughput.plan_gpu_column(model_path, settings, "auto", env={})
    assert plan is not None and plan.device == rtx and plan.layers == plan.total_layers
    every = f"{plan.total_layers}/{plan.total_layers} layers"
    assert throughput.gpu_label(plan) == f"Iris GPU (Vulkan0: NVIDIA GeForce RTX 4070 · {every})"
    assert line == f"GPU column: model.gpu=auto: (Vulkan0: NVIDIA GeForce RTX 4070 · {every})"
    plan, line = throughput.plan_gpu_column(model_path, settings, 5, env={})
    assert plan.layers == 5 and f"· 5/{plan.total_layers} layers)" in line

    llvmpipe = Device("Vulkan0", "llvmpipe (LLVM 15.0.6, 256 bits)", "igpu", "Vulkan", 15 * 2**30, 16 * 2**30,
                      index=1)
    _fake_devices(monkeypatch, throughput, llvmpipe)
    assert throughput.plan_gpu_column(model_path, settings, 99, env={}) == (None, throughput.NO_GPU)
    asked = {"GGML_VK_VISIBLE_DEVICES": "0"}
    plan, line = throughput.plan_gpu_column(model_path, settings, "auto", env=asked)
    assert plan is None and line.startswith("GPU column: model.gpu=auto plans the CPU (") and "llvmpipe" in line
    plan, line = throughput.plan_gpu_column(model_path, settings, 99, env=asked)
    assert plan is not None and plan.device == llvmpipe
    assert "[llvmpipe: a CPU-type Vulkan device, not a GPU speed]" in throughput.gpu_label(plan)
    assert "llvmpipe: a CPU-type Vulkan device, not a GPU speed" in line


def test_throughput_report_puts_the_gpu_column_beside_the_cpu_one(capsys):
    """report(): the GPU column's row, its GPU ÷ CPU ratios and the summary's gpu= fields;
    without one, the sentence that says it was not measured and gpu=no."""
    import argparse

    throughput = _throughput()

    def column(name, pp, tg):
        return throughput.Column(name, pp={64: [pp]}, tg=[tg])

    args = argparse.Namespace(reps=1, tg=4, gpu_layers=None)
    flags = [throughput.Flags.parse("t1")]
    throughput.report(column("Iris", 100.0, 10.0), [column("t1", 100.0, 10.0)], flags, None, [64], args, [4],
                      "0", "0", 1.0)
    out = capsys.readouterr().out.splitlines()
    assert throughput.NO_GPU in out and out[-1].endswith(" gpu=no")
    assert not any(line.startswith("| Iris GPU") for line in out)

    name = "Iris GPU (Vulkan0: NVIDIA GeForce RTX 4070 · 25/25 layers)"
    throughput.report(column("Iris", 100.0, 10.0), [column("t1", 100.0, 10.0)], flags, None, [64], args, [4],
                      "0", "0", 1.0, gpu=column(name, 400.0, 30.0), gpu_line=f"GPU column: model.gpu=auto: {name}")
    out = capsys.readouterr().out.splitlines()
    assert f"| {name} | the app's runtime, default settings, model.gpu=auto | 400.0 (400.0–400.0) | " \
           "30.0 (30.0–30.0) |" in out
    assert f"GPU ÷ CPU (Iris, medians), {name}: pp64 4.00×, tg 3.00×" in out
    assert out[-1].endswith(" gpu=yes gpu_pp64_ratio=4.000 gpu_tg_ratio=3.000")
    assert out[-1].startswith("throughput: pp_ratio=1.000 tg_ratio=1.000 ")  # the GPU is not a CPU config


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
