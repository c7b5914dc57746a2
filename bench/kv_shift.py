"""KV shifting after a compaction (``model.kv_shift``): what it saves, what it changes.

Replays chats from both dev sets (LoCoMo two-person chats in ``long-chats/`` and
LongMemEval user↔assistant histories in ``longmemeval-dev/``) through the real context
engine at the shipped defaults (extractive summaries, so the benchmark measures the
cache, not summarization). At each compaction, two copies of the bundled model answer
the next message greedily:

- **shift:** its cache holds the request before the compaction plus the reply, as the
  app's would; ``kv_shift`` keeps the verbatim tail's cells and moves them;
- **exact:** the same request evaluated after the compaction as the shipped default
  does (everything after the longest common prefix, i.e. the new summary and the tail).

Reported per dev set: the tokens each evaluated for that first request, whether the two
greedy replies are identical, how many of their first tokens agree, and the word overlap
of the two replies (F1 of their words). The last line is parseable:
``kv_shift: points=… identical=… agree_median=… overlap_median=… evaluated_ratio=…``.

    .venv/bin/python bench/kv_shift.py [--files 2] [--points 3] [--tokens 48] [--window 4096]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from iris_desktop.core.config import ContextParams  # noqa: E402
from iris_desktop.core.engine import ConversationTooLargeException  # noqa: E402
from iris_desktop.core.events import CompactionFinished  # noqa: E402
from iris_desktop.core.planner import Planner  # noqa: E402
from iris_desktop.core.store import Store  # noqa: E402
from iris_desktop.generation import GenerationRequest
from iris_desktop.host import build_compactor  # noqa: E402
from iris_desktop.paths import app_paths  # noqa: E402
from iris_desktop.runtime.bundled import ensure_bundled_model  # noqa: E402
from iris_desktop.runtime.model import LocalModel  # noqa: E402

from _corpus import CORPUS, locomo_messages  # noqa: E402

SYSTEM = "You are Iris, a helpful assistant running locally and offline on the user's computer."
SETS = {"LoCoMo (long-chats)": ("long-chats", "locomo-*.json"),
        "LongMemEval (longmemeval-dev)": ("longmemeval-dev", "longmemeval-s-*.json")}


def chat_messages(path: Path) -> list[dict]:
    data = json.loads(path.read_text())
    if "speakers" in data and "dia_index" in data and path.name.startswith("locomo"):
        return locomo_messages(data)
    return [{k: v for k, v in m.items() if k in ("role", "content", "created_at", "name")}
            for m in data["messages"] if m["role"] in ("user", "assistant")]


def words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def overlap(a: str, b: str) -> float:
    """F1 of the two texts' words (1.0: the same words)."""
    wa, wb = words(a), words(b)
    if not wa and not wb:
        return 1.0
    common = sum(min(wa.count(w), wb.count(w)) for w in set(wa))
    if not common:
        return 0.0
    p, r = common / len(wa), common / len(wb)
    return 2 * p * r / (p + r)


def greedy(model: LocalModel, messages: list[dict], tokens: int) -> tuple[str, list[int], object]:
    generation = model.stream(GenerationRequest(messages, max_tokens=tokens, temperature=0.0))
    text = generation.text()
    return text, model.tokenize(text, special=False), generation.stats


def points_of(path: Path, shift: LocalModel, exact: LocalModel, window: int, points: int,
              tokens: int):
    """Replay one chat; at each of its first ``points`` compactions, one row."""
    messages = chat_messages(path)
    counter = shift.counter()
    params = ContextParams(window=window, system_prompt=SYSTEM)
    found = 0
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "bench.db")
        thread = store.create_thread(path.stem)
        planner = Planner(params, counter)
        compactor = build_compactor(planner, store)
        previous = None  # the last request and the reply to it: what the cache holds
        for i, message in enumerate(messages):
            store.add_message(thread, message)
            if message["role"] == "user":
                try:
                    previous = planner.plan(store, thread).messages
                except ConversationTooLargeException:
                    # the app refuses a message too large for the window (LongMemEval has
                    # 2,400-token pastes at 4,096): nothing is sent, the cache is unchanged
                    previous = None
                continue
            if previous is None:
                continue
            cached = [*previous, {"role": "assistant", "content": message["content"]}]
            events = list(compactor.after_reply(thread))
            if not any(isinstance(e, CompactionFinished) and e.event.outcome == "ok" for e in events):
                continue
            nxt = next((m for m in messages[i + 1:] if m["role"] == "user"), None)
            if nxt is None:
                break
            try:
                request = planner.plan(store, thread, nxt["content"])
            except ConversationTooLargeException:
                continue  # the next message is one the app would refuse: no point here
            for model in (shift, exact):  # each cache as the app leaves it after the reply
                model.llm.reset()
                model.prefill(cached).run()
            text_s, toks_s, stats_s = greedy(shift, request.messages, tokens)
            text_e, toks_e, stats_e = greedy(exact, request.messages, tokens)
            agree = 0
            for a, b in zip(toks_s, toks_e):
                if a != b:
                    break
                agree += 1
            found += 1
            print(f"{path.stem} compaction {found}: evaluated {stats_s.evaluated_tokens} (shift) vs "
                  f"{stats_e.evaluated_tokens} (exact); agree {agree} tokens; "
                  f"{'identical' if text_s == text_e else 'differs'}", file=sys.stderr, flush=True)
            yield {"file": path.stem, "prompt": stats_e.prompt_tokens,
                   "evaluated_shift": stats_s.evaluated_tokens, "evaluated_exact": stats_e.evaluated_tokens,
                   "identical": text_s == text_e, "agree": agree,
                   "length": min(len(toks_s), len(toks_e)), "overlap": overlap(text_s, text_e)}
            if found >= points:
                break
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2, help="chats per dev set")
    parser.add_argument("--points", type=int, default=3, help="compactions per chat")
    parser.add_argument("--tokens", type=int, default=48, help="tokens generated per reply")
    parser.add_argument("--window", type=int, default=4096)
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    args = parser.parse_args()

    path = ensure_bundled_model(app_paths().models_dir)
    shift = LocalModel.load(path, n_ctx=args.window, kv_shift=True)
    exact = LocalModel.load(path, n_ctx=args.window)
    rows: dict[str, list[dict]] = {}
    try:
        for name, (folder, pattern) in SETS.items():
            files = sorted((args.corpus / folder).glob(pattern))[: args.files]
            rows[name] = [r for f in files
                          for r in points_of(f, shift, exact, args.window, args.points, args.tokens)]
    finally:
        shift.close()
        exact.close()

    print(f"window {args.window}, greedy replies of up to {args.tokens} tokens, model {path.name}\n")
    print("| dev set | compactions | evaluated, shift (median) | evaluated, exact (median) | "
          "identical replies | first tokens agreeing (median) | word overlap (median) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    everything = [r for rs in rows.values() for r in rs]
    for name, rs in [*rows.items(), ("both", everything)]:
        if not rs:
            print(f"| {name} | 0 | | | | | |")
            continue
        print(f"| {name} | {len(rs)} | {statistics.median(r['evaluated_shift'] for r in rs):,.0f} | "
              f"{statistics.median(r['evaluated_exact'] for r in rs):,.0f} | "
              f"{sum(r['identical'] for r in rs)} of {len(rs)} | "
              f"{statistics.median(r['agree'] for r in rs):.0f} of {args.tokens} | "
              f"{statistics.median(r['overlap'] for r in rs):.2f} |")
    if not everything:
        print("kv_shift: points=0")
        return
    ratio = sum(r["evaluated_shift"] for r in everything) / max(1, sum(r["evaluated_exact"] for r in everything))
    print(f"\nkv_shift: points={len(everything)} identical={sum(r['identical'] for r in everything)} "
          f"agree_median={statistics.median(r['agree'] for r in everything):.0f} "
          f"overlap_median={statistics.median(r['overlap'] for r in everything):.2f} "
          f"evaluated_ratio={ratio:.3f}")


if __name__ == "__main__":
    main()
