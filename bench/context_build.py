"""Request-build time for threads of 1k, 10k and 100k messages, with cached counts.

The engine reads a thread newest-first and stops when the budget is spent, so the cost
should follow the window, not the history. Goal: 100k/1k ≤ 1.5×.

    .venv/bin/python bench/context_build.py [--repeat N] [--window W] [--encrypt] [--sizes 1000,10000,100000]

``--encrypt``: a second database with the same threads kept encrypted (SQLCipher 4, a
passphrase through its KDF, as ``storage.encrypt`` with ``IRIS_STORAGE_PASSPHRASE``), its
builds interleaved with the plain one's, and the encrypted/plain ratio per size printed.
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
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)),
                        help="thread sizes, comma-separated; the first is the ratios' base")
    args = parser.parse_args()
    sizes = tuple(int(x) for x in args.sizes.split(","))
    counter = TiktokenCounter()
    params = ContextParams(window=args.window, compaction_min_turns=20, system_prompt="You are Iris.")
    variants = ("plain", "encrypted") if args.encrypt else ("plain",)
    with tempfile.TemporaryDirectory() as tmp:
        stores, engines, threads, count_s = {}, {}, {}, {}
        for variant in variants:
            key = Key.passphrase("bench passphrase") if variant == "encrypted" else None
            store = stores[variant] = Store(Path(tmp) / f"{variant}.db", key=key)
            for size in sizes:
                thread = store.create_thread(f"{size} messages")
                store.add_messages(thread, synthetic_thread(size))
                t0 = time.perf_counter()
                ensure_counts(store, counter, store.meta_range(thread, counter.name))
                count_s[variant, size] = time.perf_counter() - t0
                engines[variant, size] = ContextEngine(store, counter, params)
                threads[variant, size] = thread
                engines[variant, size].build(thread)  # warm
        # interleaved, so that machine noise hits every size (and both databases) alike
        times: dict[tuple[str, int], list[float]] = {k: [] for k in engines}
        sent: dict[tuple[str, int], int] = {}
        for _ in range(args.repeat):
            for k in engines:
                t0 = time.perf_counter()
                request = engines[k].build(threads[k])
                times[k].append(time.perf_counter() - t0)
                sent[k] = len(request.included_ids)
        for store in stores.values():
            store.close()
    print(f"window {args.window}, counter {counter.name}, {args.repeat} interleaved builds per size, "
          f"database {' and '.join(variants)}\n")
    for variant in variants:
        base_med = statistics.median(times[variant, sizes[0]])
        base_min = min(times[variant, sizes[0]])
        print(f"{variant}:\n")
        print("| messages | median build (ms) | median ratio vs 1k | fastest (ms) | fastest ratio "
              "| messages sent | first count, uncached (s) |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for size in sizes:
            med, low = statistics.median(times[variant, size]), min(times[variant, size])
            print(f"| {size:,} | {med * 1000:.2f} | {med / base_med:.2f}× | {low * 1000:.2f} | "
                  f"{low / base_min:.2f}× | {sent[variant, size]} | {count_s[variant, size]:.1f} |")
        print()
    if args.encrypt:
        print("| messages | encrypted / plain, median build |")
        print("|---:|---:|")
        for size in sizes:
            cost = statistics.median(times["encrypted", size]) / statistics.median(times["plain", size])
            print(f"| {size:,} | {cost:.2f}× |")
        print()
    ratio = statistics.median(times["plain", sizes[-1]]) / statistics.median(times["plain", sizes[0]])
    line = (f"{sizes[-1]:,}/{sizes[0]:,} (median) = {ratio:.2f}× (goal for 100k/1k ≤ 1.5×): "
            f"{'met' if ratio <= 1.5 else 'NOT met'}")
    if args.encrypt:
        cost = statistics.median(times["encrypted", sizes[-1]]) / statistics.median(times["plain", sizes[-1]])
        line += f"; encrypted/plain at {sizes[-1]:,} = {cost:.2f}×"
    print(line)


if __name__ == "__main__":
    main()
