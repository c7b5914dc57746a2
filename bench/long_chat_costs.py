"""What deleting a chat, switching a branch and searching a very common word cost on a long
history (session 63's long-chat audit), counted and timed on one database.

The history: one chat of ``--messages`` messages with a reply regenerated near its start
(the branch switch goes back there and returns), 50 chats of 1,000 messages beside it,
and a chat of ``--victim`` messages that is deleted at the end. Counted: SQLite's virtual
machine steps (a progress handler every 1,000) and SQL statements (a trace callback), so
two commits compare without the machine's speed in the figures; timed too.

    .venv/bin/python bench/long_chat_costs.py [--messages 50000] [--victim 5000]
    .venv/bin/python bench/versus.py --old 3479ddc --same-script --rounds 1 -- bench/long_chat_costs.py

The last line is parseable: ``long_chat_costs: delete_ms=… delete_ksteps=… switch_ms=…
switch_statements=… search_ms=… search_ksteps=…``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from iris_desktop.core.store import Store

QUERIES = ("a", "the", "I love")
WORDS = ("I love the garden and a walk by the sea", "the weather is a bit grey today",
         "we might go to Lisbon in the spring", "a cup of tea and the news")


def lines(n: int, tag: str) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant",
             "content": f"{tag} {i}: {WORDS[i % len(WORDS)]}"} for i in range(n)]


def counted(store: Store, action) -> tuple[float, int, int]:
    """(milliseconds, thousands of VM steps, SQL statements) ``action`` took."""
    steps, statements = [0], [0]

    def tick() -> int:
        steps[0] += 1
        return 0

    def traced(_sql: str) -> None:
        statements[0] += 1

    store.conn.set_progress_handler(tick, 1000)
    store.conn.set_trace_callback(traced)
    started = time.perf_counter()
    try:
        action()
    finally:
        elapsed = (time.perf_counter() - started) * 1000
        store.conn.set_progress_handler(None, 0)
        store.conn.set_trace_callback(None)
    return elapsed, steps[0], statements[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=50_000, help="the long chat's messages")
    parser.add_argument("--victim", type=int, default=5_000, help="the deleted chat's messages")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "iris.db") as store:
        started = time.perf_counter()
        long = store.create_thread("long")
        rows = lines(args.messages, "long")
        ids = store.add_messages(long, rows[:4])
        again = store.add_message(long, {"role": "assistant", "content": "another reply"},
                                  parent_id=ids[2])
        store.switch_branch(long, again, -1)  # the first reply's branch goes on
        for start in range(4, len(rows), 5_000):
            store.add_messages(long, rows[start:start + 5_000])
        for n in range(50):
            store.add_messages(store.create_thread(f"chat {n}"), lines(1_000, f"chat {n}"))
        victim = store.create_thread("victim")
        store.add_messages(victim, lines(args.victim, "victim"))
        total = args.messages + 1 + 50_000 + args.victim
        print(f"built {total:,} messages in {time.perf_counter() - started:.1f} s")

        away = counted(store, lambda: store.switch_branch(long, ids[3], 1))
        back = counted(store, lambda: store.switch_branch(long, again, -1))
        print(f"switch to the reply regenerated at message 4 of {args.messages:,}: "
              f"{away[0]:.0f} ms, {away[2]:,} statements; back: {back[0]:.0f} ms, {back[2]:,} statements")
        searched = []
        for query in QUERIES:
            ms, ksteps, _ = counted(store, lambda q=query: store.search(q))
            searched.append((ms, ksteps))
            print(f"search {query!r}: {ms:.0f} ms, {ksteps:,} thousand VM steps")
        gone = counted(store, lambda: store.delete_thread(victim))
        print(f"delete a chat of {args.victim:,} messages beside {total - args.victim:,}: "
              f"{gone[0]:.0f} ms, {gone[1]:,} thousand VM steps")
    print(f"long_chat_costs: delete_ms={gone[0]:.0f} delete_ksteps={gone[1]} "
          f"switch_ms={(away[0] + back[0]) / 2:.0f} switch_statements={(away[2] + back[2]) // 2} "
          f"search_ms={statistics.median(ms for ms, _ in searched):.0f} "
          f"search_ksteps={statistics.median(k for _, k in searched):.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
