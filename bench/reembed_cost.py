"""What re-embedding costs per batch after a change of embedder, as a history grows.

After ``context.recall_embedder`` changes, the GUI gives every message the new model's
vector in the background, 32 messages per job on the DB thread, the count in the status
bar (``Host.reembed_for_recall``). Each job's store work is finding its 32 messages and
the count it shows; this bench times that work at the start and at the end of a 6,000-
and a 100,000-message history, side by side with the way it was done before (every job
scanned all the old vectors to find its messages and counted them twice; the old SQL is
kept below to time it on the same database, schema 12's index included). The vectors
themselves are made by an
embedder that returns zeros at once: embedding costs the same per message whatever the
history's length (all-MiniLM-L6-v2 ~3.4 ms a short message on one thread), and it is the
store's part that grew with the history.

    PYTHONPATH=. .venv/bin/python bench/reembed_cost.py [--sizes 6000 100000] [--repeat 5]

The last line is parseable: ``reembed_cost: before_end_ms=… now_end_ms=… ratio=…`` (the
largest history's last batch, before against now).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from iris_desktop.core.semantic import SemanticIndex
from iris_desktop.core.store import Store

from _corpus import REPO

sys.path.insert(0, str(REPO / "tests"))
from support.fakes import ZeroEmbedder  # noqa: E402  (zero vectors at once: the store's work is timed)

JOB = 32  # messages per GUI job (ui.context_control.REEMBED_BATCH)
OLD, NEW = "old-model@bench", "new-model@bench"

#: how a job found its messages and counted before (the same results, read by scanning)
BEFORE_FETCH = (
    "SELECT m.id, m.role, m.content, m.content_is_json, m.name, m.sent_at FROM messages m "
    "WHERE m.id IN (SELECT o.message_id FROM message_vectors o WHERE o.model != :model) "
    "AND NOT EXISTS (SELECT 1 FROM message_vectors v WHERE v.message_id = m.id AND v.model = :model) "
    "ORDER BY m.id LIMIT :limit")
BEFORE_COUNTS = (
    "SELECT count(*) FROM message_vectors WHERE model = :model",
    "SELECT count(DISTINCT o.message_id) FROM message_vectors o WHERE o.model != :model AND NOT EXISTS "
    "(SELECT 1 FROM message_vectors v WHERE v.message_id = o.message_id AND v.model = :model)")


def before_job(store: Store) -> None:
    """A job's store work as it was: find the messages by a scan, count twice."""
    store.conn.execute(BEFORE_FETCH, {"model": NEW, "limit": JOB}).fetchall()
    for count in BEFORE_COUNTS:
        store.conn.execute(count, {"model": NEW}).fetchone()


def now_job(index: SemanticIndex) -> None:
    """A job's store work now, through the app's own code (the embedder costs nothing)."""
    index.reembed(JOB)
    index.change_progress()


def ms(call) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


def measure(size: int, repeat: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "bench.db")
        thread = store.create_thread(f"{size} messages")
        ids = store.add_messages(thread, [{"role": "user" if n % 2 == 0 else "assistant",
                                           "content": f"message {n}: the garden, the trip, the build"}
                                          for n in range(size)])
        rng = np.random.default_rng(size)
        vectors = rng.standard_normal((size, 384)).astype("<f4")
        store.save_vectors(OLD, [(mid, vec.tobytes()) for mid, vec in zip(ids, vectors)])
        index = SemanticIndex(store, ZeroEmbedder(NEW))
        index.change_progress()  # counted once, when the change is first seen
        out: dict[str, float] = {}
        for where in ("start", "end"):
            if where == "end":  # all done but the messages of the jobs timed here
                index.reembed(size - JOB * repeat - index.change_progress()[0])
            before, now = [], []
            for round_ in range(repeat):  # interleaved, the order alternating
                pair = [("before", lambda: before_job(store)), ("now", lambda: now_job(index))]
                for name, call in pair if round_ % 2 == 0 else pair[::-1]:
                    (before if name == "before" else now).append(ms(call))
            out[f"before_{where}"] = statistics.median(before)
            out[f"now_{where}"] = statistics.median(now)
        store.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[6_000, 100_000])
    parser.add_argument("--repeat", type=int, default=5, help="jobs timed at each point, each way")
    args = parser.parse_args()
    print(f"store work of one {JOB}-message re-embedding job (median of {args.repeat}), ms")
    print(f"{'messages':>9} | {'before: start':>13} | {'now: start':>10} | {'before: end':>11} | "
          f"{'now: end':>8} | {'end, before/now':>15}")
    results = {}
    for size in args.sizes:
        r = results[size] = measure(size, args.repeat)
        print(f"{size:>9,} | {r['before_start']:>13.2f} | {r['now_start']:>10.2f} | "
              f"{r['before_end']:>11.2f} | {r['now_end']:>8.2f} | "
              f"{r['before_end'] / r['now_end']:>14.1f}×")
    last = results[args.sizes[-1]]
    print(f"reembed_cost: messages={args.sizes[-1]} before_end_ms={last['before_end']:.2f} "
          f"now_end_ms={last['now_end']:.2f} ratio={last['before_end'] / last['now_end']:.1f}")


if __name__ == "__main__":
    main()
