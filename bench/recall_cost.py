"""What recall costs as a thread grows: 1k, 10k and 100k summarized messages.

Recall is the one part of a request that searches the whole summarized history: bm25
over FTS5, plus (``context.recall_semantic``) a scan of every summarized message's
vector with the query's embedding, fused. Goal (the memory issue): ≤ 50 ms on a
100k-message thread, off the GUI thread.

The threads replay the corpus (``bench/_corpus.py``), all but the newest 20 messages
summarized, each dated so that every thread spans 2022–2025 (the question that names
May 2023 searches the messages written then too: about 2% of each thread). The query is
embedded by the real shipped model (``--embedder``: as ``context.recall_embedder`` ships,
bge-small-en-v1.5; or all-MiniLM-L6-v2). The
stored vectors are random unit vectors of its size, written straight into
``message_vectors``: scanning costs the same whatever the numbers are, and embedding
100k messages for real would take most of an hour on two cores (the app embeds in the
background, a batch at a time, never in front of a send). The sizes are measured in
turn, interleaved, so that machine noise hits them alike. "First search" is the first
recall after a thread is opened, which reads its vectors into memory; in the app that
happens while the question is typed (the draft's request is planned, recall included).

    .venv/bin/python bench/recall_cost.py [--repeat 5] [--compare-budget 1024] [--encrypt]

``--encrypt``: the same database kept encrypted (SQLCipher 4, a passphrase through its KDF,
as ``storage.encrypt`` with ``IRIS_STORAGE_PASSPHRASE``), to compare with a plain run.

The last line is parseable: ``recall_cost: lexical_100k_ms=… hybrid_100k_ms=…
hybrid_cold_100k_ms=… ratio_100k_1k=… bound_ms=50``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from iris_desktop.core.recall import Recaller
from iris_desktop.core.semantic import SemanticIndex
from iris_desktop.core.store import Store
from iris_desktop.core.store.cipher import Key
from iris_desktop.runtime.embedder import Embedder, load_recall_embedder
from iris_desktop.settings import lookup
from iris_desktop.tokens import TiktokenCounter

from _corpus import REPO, synthetic_thread

sys.path.insert(0, str(REPO / "tests"))
from support.servers import CACHE  # noqa: E402  (the tests' model cache)

SIZES = (1_000, 10_000, 100_000)
TAIL = 20
BOUND_MS = 50.0
BUDGET = lookup("context.recall_max_tokens").default  # the shipped default
#: questions of the kinds people ask about an old part of a chat, in no corpus's words
QUESTIONS = (
    "What did we decide about the failing test?",
    "When did she say she would move to the new city?",
    "Which file had the bug in the parser?",
    "What pets does he have?",
    "How did the interview go last week?",
    "What was the error message when the build broke?",
    "Where did they go on holiday?",
    "Why did the deployment fail?",
    "What did she cook for the party in May 2023?",  # a named date: the records are read
)


def dated(messages: list[dict]) -> list[dict]:
    """The messages spread evenly over four years, as ``created_at``."""
    step = dt.timedelta(days=4 * 365) / len(messages)
    start = dt.datetime(2022, 1, 1, 9, 0)
    return [dict(m, created_at=(start + i * step).isoformat(timespec="seconds"))
            for i, m in enumerate(messages)]


def add_random_vectors(store: Store, thread: int, embedder: Embedder, seed: int) -> int:
    """A unit vector of the embedder's size for every message of ``thread``."""
    ids = [int(row["id"]) for row in store.messages(thread)]
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((len(ids), embedder.dimensions)).astype("<f4")
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    store.save_vectors(embedder.identity, [(mid, vec.tobytes()) for mid, vec in zip(ids, vectors)])
    return ids[-TAIL - 1]


def timed(recall, thread: int, through: int, question: str, budget: int = BUDGET) -> float:
    started = time.perf_counter()
    recall(thread, through, question, budget)
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="rounds over the questions")
    parser.add_argument("--compare-budget", type=int, default=None, metavar="TOKENS",
                        help="also time hybrid recall with this budget, interleaved, and "
                             "compare (the block is chosen and rendered within the budget)")
    parser.add_argument("--encrypt", action="store_true",
                        help="keep the database encrypted (SQLCipher), as storage.encrypt does")
    choice = lookup("context.recall_embedder")
    parser.add_argument("--embedder", choices=choice.choices, default=choice.default,
                        help="the query's embedding model (default: as it ships)")
    args = parser.parse_args()
    embedder = load_recall_embedder(args.embedder, CACHE / "models")
    counter = TiktokenCounter()
    with tempfile.TemporaryDirectory() as tmp:
        key = Key.passphrase("bench passphrase") if args.encrypt else None
        store = Store(Path(tmp) / "bench.db", key=key)
        # one index per thread, as in the app, where the open thread's vectors stay in
        # memory (an index keeps the two most recently searched threads)
        indexes = {size: SemanticIndex(store, embedder) for size in SIZES}
        threads: dict[int, tuple[int, int]] = {}
        for n, size in enumerate(SIZES):
            thread = store.create_thread(f"{size} messages")
            store.add_messages(thread, dated(synthetic_thread(size)))
            threads[size] = (thread, add_random_vectors(store, thread, embedder, n))
        lexical = Recaller(store, counter)
        hybrid = {size: Recaller(store, counter, indexes[size].recall_search) for size in SIZES}
        # cold: the first search of a thread reads its vectors into memory
        cold = {size: timed(hybrid[size].recall, *threads[size], QUESTIONS[0]) for size in SIZES}
        times: dict[tuple[str, int], list[float]] = {}
        for round_ in range(args.repeat):
            for question in QUESTIONS:
                for size in SIZES:
                    runs = [("lexical", lexical.recall, BUDGET), ("hybrid", hybrid[size].recall, BUDGET)]
                    if args.compare_budget is not None:
                        # every other round first, so that what the first call leaves warm
                        # (the question's vector, SQLite's pages) favours neither budget
                        compared = ("compared", hybrid[size].recall, args.compare_budget)
                        runs.insert(1 if round_ % 2 else 2, compared)
                    for name, recall, budget in runs:
                        times.setdefault((name, size), []).append(
                            timed(recall, *threads[size], question, budget))
        store.close()
    embedder.close()

    med = {key: statistics.median(values) for key, values in times.items()}
    p95 = {key: sorted(values)[int(0.95 * (len(values) - 1))] for key, values in times.items()}
    print(f"embedder {args.embedder}; recall of ≤ {BUDGET} tokens, {len(QUESTIONS)} questions × {args.repeat} rounds, "
          f"the newest {TAIL} messages unsummarized; bound {BOUND_MS:.0f} ms; database "
          f"{'encrypted (SQLCipher)' if args.encrypt else 'plain'}\n")
    print("| summarized messages | lexical median (ms) | hybrid median (ms) | hybrid p95 (ms) "
          "| hybrid, first search (ms) | hybrid vs 1k | hybrid vs bound |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for size in SIZES:
        h = med[("hybrid", size)]
        print(f"| {size:,} | {med[('lexical', size)]:.1f} | {h:.1f} | {p95[('hybrid', size)]:.1f} | "
              f"{cold[size]:.0f} | {h / med[('hybrid', SIZES[0])]:.2f}× | {h / BOUND_MS:.2f}× |")
    if args.compare_budget is not None:
        print(f"\nhybrid recall, ≤ {BUDGET} against ≤ {args.compare_budget} tokens, interleaved:\n")
        print(f"| summarized messages | median, {BUDGET} (ms) | p95 (ms) | median, "
              f"{args.compare_budget} (ms) | p95 (ms) | median ratio |")
        print("|---:|---:|---:|---:|---:|---:|")
        for size in SIZES:
            h, c = med[("hybrid", size)], med[("compared", size)]
            print(f"| {size:,} | {h:.1f} | {p95[('hybrid', size)]:.1f} | {c:.1f} | "
                  f"{p95[('compared', size)]:.1f} | {h / c:.2f}× |")
    big = SIZES[-1]
    print(f"\nrecall_cost: lexical_100k_ms={med[('lexical', big)]:.1f} "
          f"hybrid_100k_ms={med[('hybrid', big)]:.1f} hybrid_cold_100k_ms={cold[big]:.0f} "
          f"ratio_100k_1k={med[('hybrid', big)] / med[('hybrid', SIZES[0])]:.2f} bound_ms={BOUND_MS:.0f}")


if __name__ == "__main__":
    main()
