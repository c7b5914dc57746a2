"""Stop during a long prompt evaluation: how soon does it take effect?

A 4,000-token prompt is sent to the bundled model; after a random delay within its
evaluation, Stop is pressed (the cancel event the GUI sets). Measured: the time from
Stop to ``stream()`` returning, for a chat request, a warm-up (``prefill``) and a
request with a deadline (the summary's timeout), and how many tokens were evaluated
after Stop. llama.cpp checks the abort callback between graph nodes, so a stop waits
for one node at most, never for the rest of a 512-token batch.

Also recall's cross-encoder reading a send's 60 candidates (a question sent before its
draft was ranked waits for it): Stop during that reading, under the turn's stop
(``iris_desktop.stop.stopping``), as ``Agent`` runs it.

    .venv/bin/python bench/stop_latency.py [--tries 8] [--tokens 4000] [--rerank-only]

The last line is one parseable summary: ``stop_latency: tries=… median_s=… max_s=…``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from iris_desktop.generation import GenerationRequest
from iris_desktop.paths import app_paths  # noqa: E402
from iris_desktop.runtime.bundled import ensure_bundled_model  # noqa: E402
from iris_desktop.runtime.model import LocalModel  # noqa: E402
from iris_desktop.runtime.reranker import CrossEncoder  # noqa: E402
from iris_desktop.stop import Stopped, stopping  # noqa: E402

#: a send's candidates as recall renders them for the cross-encoder: 60, each a dated
#: "Speaker: text" of about 600 characters (a long message's window)
RERANK_QUESTION = "What did we decide about the walk along the lake?"
RERANK_PASSAGES = [f"Sat, 3 June 2023. User: day {i}: we walked along the lake and talked about "
                   + "the route, the weather and the long way home past the old mill. " * 6
                   for i in range(60)]


def prompt_of(model: LocalModel, tokens: int) -> list[dict]:
    lines, n = [], 0
    while True:
        lines.append(f"line {n}: the quick brown fox jumps over the lazy dog, again and again.")
        n += 1
        messages = [{"role": "user", "content": "\n".join(lines)}]
        if n % 20 == 0 and model.count_prompt(messages) >= tokens:
            return messages


#: the same reading outside a ``stopping`` block: as a send ran it before (the Stop waited)
BEFORE = "rerank, not under the stop (before)"


def rerank_try(reranker: CrossEncoder, delay: float, under_stop: bool = True) -> dict:
    """Stop pressed ``delay`` s into the cross-encoder's reading of 60 candidates."""
    cancel = threading.Event()
    timer = threading.Timer(delay, cancel.set)
    timer.start()
    started = time.perf_counter()
    try:
        with stopping(cancel if under_stop else None):
            reranker.score(RERANK_QUESTION, RERANK_PASSAGES)
    except Stopped:
        pass
    ended = time.perf_counter()
    timer.cancel()
    latency = ended - started - delay if cancel.is_set() else None
    return {"kind": "rerank" if under_stop else BEFORE, "delay": delay, "latency": latency, "evaluated": None,
            "after_stop": None, "whole": ended - started}


def rerank_rows(tries: int, rng: random.Random) -> tuple[list[dict], float]:
    reranker = CrossEncoder.load()
    started = time.perf_counter()
    reranker.score(RERANK_QUESTION, RERANK_PASSAGES)
    full_s = time.perf_counter() - started
    rows = [rerank_try(reranker, rng.uniform(0.1, 0.8) * full_s, under) for under in (True, False)
            for _ in range(tries)]
    reranker.close()
    return rows, full_s


def one_try(model: LocalModel, messages: list[dict], kind: str, delay: float) -> dict:
    model.llm.reset()  # cold: the whole prompt is to be evaluated
    cancel = threading.Event()
    pressed: list[float] = []
    evaluated_at_stop: list[int] = []

    def press() -> None:
        time.sleep(delay)
        evaluated_at_stop.append(model.llm.iris_evaluated)
        pressed.append(time.perf_counter())
        cancel.set()

    if kind != "deadline":
        threading.Thread(target=press, daemon=True).start()
    started = time.perf_counter()
    if kind == "chat":
        generation = model.stream(GenerationRequest(messages, max_tokens=4, cancel=cancel))
        generation.text()
        evaluated = generation.stats.evaluated_tokens
    elif kind == "warm-up":
        evaluated = model.prefill(messages, cancel=cancel).run().evaluated_tokens
    else:  # a deadline, as the summary's timeout sets it
        pressed.append(started + delay)
        evaluated_at_stop.append(-1)
        generation = model.stream(GenerationRequest(messages, max_tokens=4, deadline=time.monotonic() + delay))
        generation.text()
        evaluated = generation.stats.evaluated_tokens
    ended = time.perf_counter()
    if not pressed:  # the request ended before Stop was pressed (the machine sped up): no stop to time
        return {"kind": kind, "delay": delay, "latency": None, "evaluated": evaluated, "after_stop": None,
                "whole": ended - started}
    return {"kind": kind, "delay": delay, "latency": ended - pressed[0],
            "evaluated": evaluated, "after_stop": (evaluated - evaluated_at_stop[0]
                                                   if evaluated_at_stop[0] >= 0 else None),
            "whole": ended - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=8, help="stops per kind")
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--rerank-only", action="store_true",
                        help="only the cross-encoder's reading (no chat model)")
    args = parser.parse_args()
    rng = random.Random(7)
    rerank, rerank_s = rerank_rows(args.tries, rng)
    print(f"the cross-encoder reads 60 candidates in {rerank_s:.2f} s here", file=sys.stderr)
    if args.rerank_only:
        report(rerank, args.tries, ("rerank", BEFORE), f"60 candidates read in {rerank_s:.2f} s",
               f"full_rerank_s={rerank_s:.2f}")
        return
    model = LocalModel.load(ensure_bundled_model(app_paths().models_dir), n_ctx=8192)
    messages = prompt_of(model, args.tokens)
    prompt = model.count_prompt(messages)
    # how long the whole evaluation takes here, so the stops land inside it
    model.llm.reset()
    started = time.perf_counter()
    model.prefill(messages).run()
    full_s = time.perf_counter() - started
    rows = []
    for kind in ("chat", "warm-up", "deadline"):
        for _ in range(args.tries):
            rows.append(one_try(model, messages, kind, rng.uniform(0.1, 0.8) * full_s))
            print(rows[-1], file=sys.stderr, flush=True)
    model.close()
    report(rows + rerank, args.tries, ("chat", "warm-up", "deadline", "rerank", BEFORE),
           f"prompt {prompt:,} tokens; evaluating it whole takes {full_s:.2f} s here; "
           f"60 candidates read by the cross-encoder in {rerank_s:.2f} s",
           f"prompt_tokens={prompt} full_eval_s={full_s:.2f} full_rerank_s={rerank_s:.2f}")


def report(rows: list[dict], tries: int, kinds: tuple[str, ...], heading: str, facts: str) -> None:
    print(f"{heading}; {tries} stops per kind at random points within it\n")
    print("| request | stops | median latency (s) | max latency (s) | tokens evaluated after Stop (max) |")
    print("|---|---:|---:|---:|---:|")
    early = [r for r in rows if r["latency"] is None]
    rows = [r for r in rows if r["latency"] is not None]
    for kind in kinds:
        mine = [r for r in rows if r["kind"] == kind]
        if not mine:
            print(f"| {kind} | 0 | – | – | – |")
            continue
        lat = [r["latency"] for r in mine]
        after = [r["after_stop"] for r in mine if r["after_stop"] is not None]
        print(f"| {kind} | {len(mine)} | {statistics.median(lat):.3f} | {max(lat):.3f} | "
              f"{max(after) if after else '–'} |")
    if early:
        print(f"\n{len(early)} tries ended before their Stop was pressed (the machine ran faster than when "
              "the whole evaluation was timed): left out")
    lat = [r["latency"] for r in rows if r["kind"] != BEFORE] or [float("nan")]
    print(f"\nstop_latency: tries={len(rows)} {facts} "
          f"median_s={statistics.median(lat):.3f} max_s={max(lat):.3f}")


if __name__ == "__main__":
    main()
