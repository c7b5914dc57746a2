"""Replies that loop: the bundled model's replies to everyday requests under sampling
settings, side by side in one run.

A 0.5B model sampled at temperature 0.7 without a repetition penalty often repeats one
sentence or list item until ``model.max_tokens`` ("They tried to find the dragon, but
they couldn't find it. They tried to find the dragon, but…"). Each setting answers the
same ten requests with the same seeds; a reply *loops* when some run of 8 words occurs
3 times or more in it, and *hits the limit* when it ends at ``--max-tokens``. "Shipped"
is ``model.repeat_penalty`` with ``model.dry_multiplier`` (llama.cpp's DRY sampler).

    .venv/bin/python bench/loops.py [--max-tokens 512] [--seeds 3]

The last line is one parseable summary.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from iris_desktop.generation import GenerationRequest  # noqa: E402
from iris_desktop.paths import app_paths  # noqa: E402
from iris_desktop.runtime.bundled import ensure_bundled_model  # noqa: E402
from iris_desktop.runtime.model import LocalModel  # noqa: E402
from iris_desktop.settings import lookup  # noqa: E402

SYSTEM = "You are Iris, a helpful assistant running locally and offline on the user's computer."
REQUESTS = [
    "Write a short story about a dragon who is afraid of the dark.",
    "List 15 ideas for a child's birthday party.",
    "Explain how a CPU cache works.",
    "Write a poem about autumn in the city.",
    "Give me a packing list for a week of hiking in Norway.",
    "What are the pros and cons of electric cars?",
    "Write a Python function that reads a CSV file and prints the average of each column, "
    "and explain it.",
    "Summarize the plot of Hamlet.",
    "Write a cover letter for a barista job.",
    "How do I make bread at home without a bread machine?",
]


def shipped() -> dict:
    return {name: lookup(f"model.{name}").default
            for name in ("top_k", "top_p", "min_p", "repeat_penalty", "dry_multiplier")}


SETTINGS = {
    "no penalty (before)": {**shipped(), "repeat_penalty": 1.0, "dry_multiplier": 0.0},
    "repeat penalty 1.1, no DRY": {**shipped(), "repeat_penalty": 1.1, "dry_multiplier": 0.0},
    "shipped": shipped(),
}


def loops(text: str, n: int = 8, times: int = 3) -> bool:
    words = text.split()
    runs = Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
    return max(runs.values(), default=0) >= times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    model = LocalModel.load(ensure_bundled_model(app_paths().models_dir), n_ctx=4096)
    temperature = lookup("model.temperature").default
    rows = {}
    for name, sampling in SETTINGS.items():
        looped = limit = tokens = n = 0
        started = time.perf_counter()
        for request in REQUESTS:
            for seed in range(args.seeds):
                messages = [{"role": "system", "content": SYSTEM},
                            {"role": "user", "content": request}]
                generation = model.stream(GenerationRequest(
                    messages, max_tokens=args.max_tokens, temperature=temperature, seed=seed,
                    **sampling))
                text = generation.text()
                n += 1
                looped += loops(text)
                limit += generation.stats.finish_reason == "length"
                tokens += generation.stats.completion_tokens
        rows[name] = dict(replies=n, looped=looped, hit_limit=limit,
                          mean_tokens=round(tokens / n), seconds=round(time.perf_counter() - started))
        print(f"{name}: {sampling}\n  {looped} of {n} replies loop, {limit} hit the "
              f"{args.max_tokens}-token limit, {tokens / n:.0f} tokens a reply "
              f"({rows[name]['seconds']} s)", flush=True)
    before, now = rows["no penalty (before)"], rows["shipped"]
    print("loops: " + json.dumps({"before": before, "shipped": now,
                                  "loop_ratio": round(now["looped"] / max(1, before["looped"]), 2)}))


if __name__ == "__main__":
    main()
