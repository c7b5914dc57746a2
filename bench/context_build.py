"""Request-build time for threads of 1k, 10k and 100k messages, with cached counts.

The engine reads a thread newest-first and stops when the budget is spent, so the cost
should follow the window, not the history. Goal: 100k/1k ≤ 1.5×.

    .venv/bin/python bench/context_build.py [--repeat N] [--window W]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from iris_desktop.core.engine import ContextEngine, ContextParams, ensure_counts
from iris_desktop.core.store import Store
from iris_desktop.core.tokens import TiktokenCounter

from _corpus import synthetic_thread

SIZES = (1_000, 10_000, 100_000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--window", type=int, default=8192)
    args = parser.parse_args()
    counter = TiktokenCounter()
    params = ContextParams(window=args.window, compaction_min_turns=20, system_prompt="You are Iris.")
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "bench.db")
        rows = []
        for size in SIZES:
            thread = store.create_thread(f"{size} messages")
            store.add_messages(thread, synthetic_thread(size))
            t0 = time.perf_counter()
            ensure_counts(store, counter, store.meta_range(thread, counter.name))
            count_s = time.perf_counter() - t0
            engine = ContextEngine(store, counter, params)
            engine.build(thread)  # warm
            times = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                request = engine.build(thread)
                times.append(time.perf_counter() - t0)
            rows.append((size, statistics.median(times), len(request.included_ids), count_s))
        store.close()
    base = rows[0][1]
    print(f"window {args.window}, counter {counter.name}, median of {args.repeat} builds\n")
    print("| messages | build (ms) | ratio vs 1k | messages sent | first count, uncached (s) |")
    print("|---:|---:|---:|---:|---:|")
    for size, median, sent, count_s in rows:
        print(f"| {size:,} | {median * 1000:.2f} | {median / base:.2f}× | {sent} | {count_s:.1f} |")
    ratio = rows[-1][1] / base
    print(f"\n100k/1k = {ratio:.2f}× (goal ≤ 1.5×): {'met' if ratio <= 1.5 else 'NOT met'}")


if __name__ == "__main__":
    main()
