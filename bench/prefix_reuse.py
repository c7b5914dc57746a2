"""KV-cache prefix reuse: Iris's requests against a rolling-window client, same Llama.

Replays a LoCoMo chat from the corpus turn by turn with the bundled model at n_ctx 8192.
Each request generates one token, so what is measured is the prompt: tokens evaluated
and time to first token. The corpus supplies the assistant replies.

- Iris: the context engine (stable prefix; compaction when due, extractive path here so
  the benchmark measures prompt processing, not summarization).
- Rolling window: drops the oldest turn until the prompt fits the same budget, as LM
  Studio's "rolling window" and Ollama's front cut do; its prefix changes every turn
  once the window is full.

    .venv/bin/python bench/prefix_reuse.py [--turns 100] [--skip 80] [--chat locomo-26]

With --skip 80 the first 80 turns are already history when the measured session starts,
so the window is full from the first measured request.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from iris_desktop.core.engine import ContextParams  # noqa: E402
from iris_desktop.core.events import CompactionFinished  # noqa: E402
from iris_desktop.core.planner import Planner  # noqa: E402
from iris_desktop.core.store import Store  # noqa: E402
from iris_desktop.paths import app_paths  # noqa: E402
from iris_desktop.runtime.model import LocalModel, ensure_bundled_model  # noqa: E402

from _corpus import CORPUS  # noqa: E402

SYSTEM = "You are Iris, a helpful assistant running locally and offline on the user's computer."


def turns_of(messages: list[dict]) -> list[tuple[dict, dict | None]]:
    pairs = []
    for i, m in enumerate(messages):
        if m["role"] == "user":
            reply = messages[i + 1] if i + 1 < len(messages) and messages[i + 1]["role"] == "assistant" else None
            pairs.append((m, reply))
    return pairs


def one_token(model: LocalModel, messages: list[dict]):
    for _ in model.stream(messages, max_tokens=1, temperature=0.0):
        pass
    return model.last_stats


def run_iris(model, pairs, window, skip=0, recall=1024) -> list[dict]:
    rows = []
    counter = model.counter()
    params = ContextParams(window=window, system_prompt=SYSTEM, recall_max_tokens=recall)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "bench.db")
        thread = store.create_thread("bench")
        planner = Planner(params, counter)
        compactor = planner.compactor(store)
        previous_prompt = 0
        for n, (user, reply) in enumerate(pairs, start=1):
            store.add_message(thread, user)
            if n <= skip:  # history that exists before the measured session
                if reply:
                    store.add_message(thread, reply)
                continue
            events = list(compactor.before_request(thread))
            compacted = any(isinstance(e, CompactionFinished) and e.event.outcome == "ok"
                            for e in events)
            request = planner.plan(store, thread)
            stats = one_token(model, request.messages)
            store.add_request(thread, {"prompt_tokens": stats.prompt_tokens,
                                       "summary_id": request.summary.id if request.summary else None})
            rows.append({
                "turn": n, "prompt": stats.prompt_tokens, "evaluated": stats.evaluated_tokens,
                "reused": stats.reused_tokens, "ttft": stats.time_to_first_token_s,
                "new": max(stats.prompt_tokens - previous_prompt, 0), "compacted": compacted,
                "predicted": request.predicted_prompt_tokens,
                "recall": request.breakdown.recall,
            })
            previous_prompt = stats.prompt_tokens
            print(f"iris turn {n}: prompt {stats.prompt_tokens}, evaluated {stats.evaluated_tokens}",
                  file=sys.stderr, flush=True)
            if reply:
                store.add_message(thread, reply)
        store.close()
    return rows


def run_rolling(model, pairs, window, skip=0) -> list[dict]:
    rows = []
    counter = model.counter()
    budget = math.floor(window * 0.70)
    system = {"role": "system", "content": SYSTEM}
    history: list[list[dict]] = []
    dropped = 0
    for n, (user, reply) in enumerate(pairs, start=1):
        history.append([user])
        def size() -> int:
            return counter.prompt_overhead() + counter.count_message(system) + sum(
                counter.count_message(m) for turn in history for m in turn)
        while size() > budget and len(history) > 1:
            history.pop(0)  # silently drop the oldest turn
            dropped += 1
        if n <= skip:
            if reply:
                history[-1].append(reply)
            continue
        messages = [system, *(m for turn in history for m in turn)]
        stats = one_token(model, messages)
        rows.append({"turn": n, "prompt": stats.prompt_tokens, "evaluated": stats.evaluated_tokens,
                     "reused": stats.reused_tokens, "ttft": stats.time_to_first_token_s,
                     "dropped": dropped})
        print(f"rolling turn {n}: prompt {stats.prompt_tokens}, evaluated {stats.evaluated_tokens}",
              file=sys.stderr, flush=True)
        if reply:
            history[-1].append(reply)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--skip", type=int, default=80,
                        help="turns that are already history when the measured session starts")
    parser.add_argument("--chat", default="locomo-26")
    parser.add_argument("--window", type=int, default=8192)
    parser.add_argument("--recall", type=int, default=1024,
                        help="context.recall_max_tokens for Iris (the shipped default is 1024)")
    args = parser.parse_args()
    import json

    messages = json.loads((CORPUS / "long-chats" / f"{args.chat}.json").read_text())["messages"]
    pairs = turns_of(messages)[: args.turns]
    model = LocalModel.load(ensure_bundled_model(app_paths().models_dir), n_ctx=args.window)
    try:
        iris = run_iris(model, pairs, args.window, args.skip, args.recall)
        model.llm.reset()
        rolling = run_rolling(model, pairs, args.window, args.skip)
    finally:
        model.close()

    full_from = next((r["turn"] for r in rolling if r["dropped"]), None)
    print(f"chat {args.chat}, turns {args.skip + 1}–{len(pairs)} measured (turns 1–{args.skip} "
          f"already history), window {args.window}, model {model.path.name}")
    print(f"rolling window starts dropping turns at turn {full_from}\n")
    print("| turn | Iris prompt | Iris evaluated | Iris TTFT (s) | rolling prompt | rolling evaluated "
          "| rolling TTFT (s) | note |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    step = max(1, len(iris) // 24)
    for a, b in zip(iris, rolling):
        if (a["turn"] - args.skip) % step and not a["compacted"] and a["turn"] != len(pairs):
            continue
        note = "Iris compacted" if a["compacted"] else ""
        print(f"| {a['turn']} | {a['prompt']:,} | {a['evaluated']:,} | {a['ttft']:.3f} | "
              f"{b['prompt']:,} | {b['evaluated']:,} | {b['ttft']:.3f} | {note} |")

    # the first measured request is cold for both clients
    steady = [(a, b) for a, b in zip(iris[1:], rolling[1:])
              if full_from and a["turn"] >= full_from and not a["compacted"]]
    if steady:
        iris_ttft = statistics.median(a["ttft"] for a, _ in steady)
        roll_ttft = statistics.median(b["ttft"] for _, b in steady)
        iris_eval = statistics.median(a["evaluated"] for a, _ in steady)
        roll_eval = statistics.median(b["evaluated"] for _, b in steady)
        print(f"\nonce the window is full ({len(steady)} turns, compaction turns excluded):")
        print(f"  median evaluated tokens: Iris {iris_eval:,.0f}, rolling {roll_eval:,.0f} "
              f"({iris_eval / roll_eval:.3f}×)")
        print(f"  median time to first token: Iris {iris_ttft:.3f} s, rolling {roll_ttft:.3f} s "
              f"({iris_ttft / roll_ttft:.3f}×; goal ≤ 0.1×)")
    over = [a for a in iris[1:] if not a["compacted"] and a["evaluated"] > a["new"] + 2]
    print(f"\nIris turns (outside compaction) that evaluated more than the new tokens: {len(over)}")
    recalled = [a["recall"] for a in iris if a["recall"]]
    if recalled:  # the previous message loses its block, so evaluation restarts there
        print(f"Iris requests with recall: {len(recalled)}/{len(iris)}, median block "
              f"{statistics.median(recalled):,.0f} tokens (re-evaluated each turn, with the "
              "previous message and reply)")
    comp = [a for a in iris if a["compacted"]]
    print(f"Iris compactions: {len(comp)}; evaluated on those turns: "
          + ", ".join(f"{a['evaluated']:,}" for a in comp))
    mismatched = [a for a in iris if a["prompt"] != a["predicted"]]
    print(f"Iris predicted == reported prompt tokens on {len(iris) - len(mismatched)}/{len(iris)} turns")


if __name__ == "__main__":
    main()
