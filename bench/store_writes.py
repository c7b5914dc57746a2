"""What a long chat costs to write and to delete on a real SQLite file: N messages stored
in one transaction (as an import does), then the chat deleted, with the file's size
before and after. Run it against an older commit with ``bench/versus.py --same-script``
to see what a change to the store's writes costs (the ids never given again, schema 16;
the space given back, incremental vacuum).

    .venv/bin/python bench/store_writes.py [--messages 20000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from iris_desktop.core.store import Store


def one(folder: Path, n: int) -> tuple[float, float, int, int]:
    """(seconds to store, seconds to delete, bytes before the delete, bytes after)."""
    path = folder / "iris.db"
    with Store(path) as store:
        thread = store.create_thread("long")
        messages = [{"role": "user" if i % 2 == 0 else "assistant",
                     "content": f"message {i}: " + "words of a long chat " * 12} for i in range(n)]
        started = time.perf_counter()
        store.add_messages(thread, messages)
        stored = time.perf_counter() - started
        store.checkpoint()
        before = path.stat().st_size
        started = time.perf_counter()
        store.delete_thread(thread)
        deleted = time.perf_counter() - started
    return stored, deleted, before, path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    runs = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as folder:
            runs.append(one(Path(folder), args.messages))
    stored = statistics.median(r[0] for r in runs)
    deleted = statistics.median(r[1] for r in runs)
    print(f"messages: {args.messages}")
    print(f"store: {stored:.3f} s ({args.messages / stored:,.0f} messages/s)")
    print(f"delete: {deleted:.3f} s")
    print(f"file before delete: {runs[-1][2] / 1e6:.1f} MB; after: {runs[-1][3] / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
