"""What the search box and the chat list cost on a long history, side by side with the
plain queries they replaced (session 56).

The search box now picks each chat's best ``HITS_PER_CHAT`` hits over *every* hit (a
window function over the FTS5 matches), then the rest, and makes snippets only for the
rows it shows; before, it took the best 50 hits of any chat (one long chat filled the
list). The chat list (``Store.threads``) now also counts each chat's messages on the
branch shown. Both are measured here against the old query, in one run, interleaved, on
the same database: one chat of ``--messages`` messages (the corpus replayed, every 20th
message a short "Lisbon, day N"), and 50 chats of 40 messages beside it, each naming
Lisbon once in a longer sentence (bm25 ranks every one of the long chat's notes above
them: the case the change is for).

    .venv/bin/python bench/search_cost.py [--messages 100000] [--repeat 7]

The last line is parseable: ``search_cost: search_ms=… old_search_ms=… ratio=…
threads_ms=… old_threads_ms=… threads_ratio=…``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from iris_desktop.core.store import Store

from _corpus import synthetic_thread

OLD_SEARCH = """
    SELECT m.thread_id, t.title, m.id AS message_id,
           snippet(messages_fts, 0, '[', ']', '…', 12) AS snippet
    FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid
    JOIN threads t ON t.id = m.thread_id
    WHERE messages_fts MATCH :fts ORDER BY rank LIMIT 50
"""
OLD_THREADS = """
    SELECT t.*, (SELECT count(*) FROM messages m WHERE m.thread_id = t.id) AS messages,
           (SELECT count(*) FROM messages m INDEXED BY messages_streaming
            WHERE m.status = 'streaming' AND m.thread_id = t.id) AS streaming,
           (SELECT max(s.id) FROM summaries s WHERE s.thread_id = t.id) AS summary_id
    FROM threads t ORDER BY t.updated_at DESC, t.id DESC
"""
QUERIES = ("lisbon", "weekend", "zebra")  # frequent, common, rare


def build(path: Path, messages: int) -> None:
    with Store(path) as store:
        thread = store.create_thread("the long one")
        rows = synthetic_thread(messages)
        for i in range(0, len(rows), 20):  # a trip diary: short notes naming the city
            if isinstance(rows[i].get("content"), str):
                rows[i] = {**rows[i], "content": f"Lisbon, day {i // 20}"}
        for start in range(0, len(rows), 5_000):
            store.add_messages(thread, rows[start:start + 5_000])
        for n in range(50):
            other = store.create_thread(f"chat {n}")
            store.add_messages(other, [{"role": "user" if i % 2 == 0 else "assistant",
                                        "content": f"note {i} of chat {n}: we might move "
                                        "the office to Lisbon next spring, a zebra of an idea"
                                        if i == 7 else f"note {i} of chat {n}: nothing much"}
                                       for i in range(40)])


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "iris.db"
        started = time.perf_counter()
        build(path, args.messages)
        print(f"built {args.messages:,} + 50×40 messages in {time.perf_counter() - started:.1f} s")
        with Store(path) as store:
            times: dict[str, list[float]] = {k: [] for k in ("new", "old", "threads", "old_threads")}
            for _ in range(args.repeat):  # interleaved: noise hits both alike
                for query in QUERIES:
                    times["new"].append(timed(lambda q=query: store.search(q)))
                    times["old"].append(timed(lambda q=query: list(store.db.query(
                        OLD_SEARCH, {"fts": f'"{q}"*'}))))
                times["threads"].append(timed(store.threads))
                times["old_threads"].append(timed(lambda: list(store.db.query(OLD_THREADS))))
            hits = [h for h in store.search("lisbon") if h["message_id"] is not None]
            chats = len({h["thread_id"] for h in hits})
            old_chats = len({h["thread_id"] for h in store.db.query(OLD_SEARCH,
                                                                    {"fts": '"lisbon"*'})})
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"search (median over {len(QUERIES)} queries × {args.repeat}): {med['new']:.1f} ms, "
          f"the old best-50 query {med['old']:.1f} ms")
    print(f"'lisbon' lists {chats} chats in its {len(hits)} rows (the old query: {old_chats})")
    print(f"threads(): {med['threads']:.1f} ms, the old query {med['old_threads']:.1f} ms")
    print(f"search_cost: search_ms={med['new']:.1f} old_search_ms={med['old']:.1f} "
          f"ratio={med['new'] / med['old']:.2f} threads_ms={med['threads']:.1f} "
          f"old_threads_ms={med['old_threads']:.1f} "
          f"threads_ratio={med['threads'] / med['old_threads']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
