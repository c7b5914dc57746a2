"""What reading LibreChat's "recursive" export costs: its iterative reader against
``json.loads`` on the same text, and an indented export over the import's limit read
without its indentation against the same export written compact.

LibreChat nests each reply inside the message before it (two JSON levels a message), and
indents each level. ``json.loads`` gives up past about 1,000 levels; Iris then reads the
text with ``core.big_json._deep`` (no recursion). A file over the import's limit is read
without its lines' indentation where that fits (``core.foreign_text.squeezed``).

    .venv/bin/python bench/deep_import.py [--messages 450] [--long 5000] [--indented 2000]

Side by side in one run: (1) a chat of ``--messages`` (450: 900 levels, which
``json.loads`` still reads) parsed by both, the ratio printed; (2) a chat of ``--long``
messages, compact, imported through ``core.foreign.load_conversations`` (the whole
import's reading: parse, convert, mend); (3) the chat of ``--indented`` messages written
with 2-space indentation and read under a limit below its size (squeezed) against its
compact text read plainly. Prints one line: ``deep_import: …``."""
import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from test_import_deep_nesting import recursive_export  # noqa: E402

from iris_desktop.core import big_json, foreign  # noqa: E402
from iris_desktop.core.foreign_text import read_text  # noqa: E402


def best(run, times: int = 5) -> float:
    """The fastest of ``times`` runs, in seconds (the machine's noise is slower, not faster)."""
    took = []
    for _ in range(times):
        start = time.perf_counter()
        run()
        took.append(time.perf_counter() - start)
    return min(took)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=450)
    parser.add_argument("--long", type=int, default=5000)
    parser.add_argument("--indented", type=int, default=2000)
    args = parser.parse_args()

    text = recursive_export(args.messages)
    assert big_json._deep(text) == json.loads(text)
    loads_s = best(lambda: json.loads(text))
    deep_s = best(lambda: big_json._deep(text))
    print(f"{args.messages:,} messages ({len(text) / 1e6:.2f} MB, {2 * args.messages} levels): "
          f"json.loads {loads_s * 1e3:.1f} ms, the iterative reader {deep_s * 1e3:.1f} ms "
          f"({deep_s / loads_s:.1f}×)")

    with tempfile.TemporaryDirectory() as folder:
        long = Path(folder) / "long.json"
        long.write_text(recursive_export(args.long), encoding="utf-8")
        start = time.perf_counter()
        loaded = foreign.load_conversations(long)
        long_s = time.perf_counter() - start
        count = len(loaded.chats[0].messages)
        print(f"{args.long:,} messages compact ({long.stat().st_size / 1e6:.1f} MB, "
              f"{2 * args.long:,} levels): read and converted in {long_s:.2f} s ({count:,} messages)")

        compact = Path(folder) / "compact.json"
        indented = Path(folder) / "indented.json"
        compact.write_text(recursive_export(args.indented), encoding="utf-8")
        indented.write_text(recursive_export(args.indented, indent=2), encoding="utf-8")
        size = indented.stat().st_size
        limit = compact.stat().st_size * 2
        plain_s = best(lambda: read_text(compact, limit), 3)
        squeezed_s = best(lambda: read_text(indented, limit), 3)
        assert "".join(read_text(indented, limit).split()) == "".join(read_text(compact, limit).split())
        print(f"{args.indented:,} messages indented ({size / 1e6:.0f} MB, over a limit of "
              f"{limit / 1e6:.1f} MB): read without its indentation in {squeezed_s:.2f} s; the "
              f"compact file ({compact.stat().st_size / 1e6:.1f} MB) in {plain_s * 1e3:.1f} ms "
              f"({squeezed_s / plain_s:.0f}×, {size / squeezed_s / 1e6:.0f} MB/s of file)")
    print(f"deep_import: messages={args.messages} loads_ms={loads_s * 1e3:.1f} deep_ms={deep_s * 1e3:.1f} "
          f"deep_ratio={deep_s / loads_s:.2f} long={args.long} long_s={long_s:.2f} "
          f"indented={args.indented} indented_mb={size / 1e6:.0f} squeeze_s={squeezed_s:.2f} "
          f"plain_ms={plain_s * 1e3:.1f}")


if __name__ == "__main__":
    main()
