"""Request-build time for threads of 1k, 10k and 100k messages, with cached counts.

The engine reads a thread newest-first and stops when the budget is spent, so the cost
should follow the window, not the history. Goal: 100k/1k ≤ 1.5×.

    .venv/bin/python bench/context_build.py [--repeat N] [--window W] [--encrypt]

``--encrypt``: the same database kept encrypted (SQLCipher 4, a passphrase through its KDF,
as ``storage.encrypt`` with ``IRIS_STORAGE_PASSPHRASE``), to compare with a plain run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from iris_desktop.core.config import ContextParams
from iris_desktop.core.engine import ContextEngine, ensure_counts
from iris_desktop.core.store import Store
from iris_desktop.core.store.cipher import Key
from iris_desktop.tokens import TiktokenCounter

from _corpus import synthetic_thread

SIZES = (1_000, 10_000, 100_000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--window", type=int, default=8192)
    parser.add_argument("--encrypt", action="store_true",
                        help="keep the database encrypted (SQLCipher), as storage.encrypt does")
    args = parser.parse_args()
    counter = TiktokenCounter()
    params = ContextParams(window=args.window, compaction_min_turns=20, system_prompt="You are Iris.")
    with tempfile.TemporaryDirectory() as tmp:
        key = Key.passphrase("bench passphrase") if args.encrypt else None
        store = Store(Path(tmp) / "bench.db", key=key)
        engines, threads, count_s = {}, {}, {}
        for size in SIZES:
            thread = store.create_thread(f"{size} messages")
            store.add_messages(thread, synthetic_thread(size))
            t0 = time.perf_counter()
            ensure_counts(store, counter, store.meta_range(thread, counter.name))
            count_s[size] = time.perf_counter() - t0
            engines[size] = ContextEngine(store, counter, params)
            threads[size] = thread
            engines[size].build(thread)  # warm
        # interleaved, so that machine noise hits every size alike
        times: dict[int, list[float]] = {size: [] for size in SIZES}
        sent: dict[int, int] = {}
        for _ in range(args.repeat):
            for size in SIZES:
                t0 = time.perf_counter()
                request = engines[size].build(threads[size])
                times[size].append(time.perf_counter() - t0)
                sent[size] = len(request.included_ids)
        store.close()
    base_med = statistics.median(times[SIZES[0]])
    base_min = min(times[SIZES[0]])
    print(f"window {args.window}, counter {counter.name}, {args.repeat} interleaved builds per size, "
          f"database {'encrypted (SQLCipher)' if args.encrypt else 'plain'}\n")
    print("| messages | median build (ms) | median ratio vs 1k | fastest (ms) | fastest ratio "
          "| messages sent | first count, uncached (s) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for size in SIZES:
        med, low = statistics.median(times[size]), min(times[size])
        print(f"| {size:,} | {med * 1000:.2f} | {med / base_med:.2f}× | {low * 1000:.2f} | "
              f"{low / base_min:.2f}× | {sent[size]} | {count_s[size]:.1f} |")
    ratio = statistics.median(times[SIZES[-1]]) / base_med
    print(f"\n100k/1k (median) = {ratio:.2f}× (goal ≤ 1.5×): {'met' if ratio <= 1.5 else 'NOT met'}")


if __name__ == "__main__":
    main()
