"""How long a large export's import holds up the window: the worst pause another thread
(the window's, stood in for by a ticker asking for a turn every millisecond) sees while
``core.foreign.load_conversations`` reads a ChatGPT-shaped export of ``--mb`` megabytes,
then while ``import_conversations`` stores it (a real SQLite file), and the time each takes.

    .venv/bin/python bench/import_pause.py --mb 50
    .venv/bin/python bench/versus.py --old cc4381a --same-script -- bench/import_pause.py --mb 50

Prints one line: ``import_pause: mb=… read_s=… read_worst_ms=… store_s=… store_worst_ms=…``."""
import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests/fixtures/foreign/chatgpt/librechat-chatgpt-modern-export.json"


def export(folder: Path, megabytes: int) -> Path:
    """The fixture's real conversations repeated, each title numbered, to ``megabytes``."""
    source = json.loads(FIXTURE.read_text())
    parts, size, n = [], 0, 0
    while size < megabytes << 20:
        for chat in source:
            chat = dict(chat, title=f"{chat.get('title')} {n}")
            n += 1
            text = json.dumps(chat)
            parts.append(text)
            size += len(text)
    path = folder / "conversations.json"
    path.write_text("[" + ",".join(parts) + "]")
    return path


class Ticker:
    """A thread asking for a turn every millisecond; the gaps it saw, with their end."""

    def __init__(self) -> None:
        self.gaps: list[tuple[float, float]] = []
        self.stop = False
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def run(self) -> None:
        last = time.perf_counter()
        while not self.stop:
            time.sleep(0.001)
            now = time.perf_counter()
            self.gaps.append((now - last, now))
            last = now

    def worst_ms(self, start: float, end: float) -> float:
        return 1000 * max([gap for gap, at in self.gaps if start < at <= end + 0.5] or [0.0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=50, help="the export's size in MB (default 50)")
    args = parser.parse_args()
    sys.path.insert(0, str(Path.cwd()))
    from iris_desktop.core.foreign import import_conversations, load_conversations
    from iris_desktop.core.store import Store

    with tempfile.TemporaryDirectory() as folder:
        path = export(Path(folder), args.mb)
        store = Store(Path(folder) / "iris.db")
        ticker = Ticker()
        time.sleep(0.1)
        t0 = time.perf_counter()
        loaded = load_conversations(path)
        t1 = time.perf_counter()
        import_conversations(store, loaded)
        t2 = time.perf_counter()
        time.sleep(0.2)
        ticker.stop = True
        ticker.thread.join()
        store.close()
    print(f"import_pause: mb={args.mb} chats={len(loaded.chats)} read_s={t1 - t0:.2f} "
          f"read_worst_ms={ticker.worst_ms(t0, t1):.0f} store_s={t2 - t1:.2f} "
          f"store_worst_ms={ticker.worst_ms(t1, t2):.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
