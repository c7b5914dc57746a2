"""Retention: after compaction, can the answer to a LoCoMo question still be found?

For each LoCoMo chat: import it, compact it into a 4,096-token window (default
settings: 768-token summary cap, tail ≤ 0.5 × the 3,072-token trigger line), then for
every QA probe whose evidence messages are all summarized, look for the answer in what
the model would see (summary fields + verbatim tail): normalized text match, or
token-F1 ≥ 0.5 against any sentence.

Compared in one table:
- extractive: Iris's deterministic summarizer (eight fields + dated fact ledger), summary
  and tail only, the issue's definition of what the model sees;
- Iris ships (summary + recall): the question is sent as the next message, and the
  request the engine builds is searched: summary, tail, and the summarized messages
  recalled for the question (``context.recall_max_tokens``, default 1024), without the
  question's own words;
- LLM: the bundled model's grammar-constrained eight fields, without the ledger;
- Iris ships: the LLM fields plus the ledger (what Iris really injects);
- truncation: the tail alone;
- bullets-512: a 512-token bullet summary written by the model (Jan's approach).

The LLM-based rows need the model to summarize every chunk (slow on 2 cores), so they run
on the first ``--llm-chats`` chats; the extractive and truncation rows run on all ten.

    .venv/bin/python bench/retention.py [--llm-chats 2] [--window 4096]
"""

from __future__ import annotations

import argparse
import json
import re
import string
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from iris_desktop.core.compaction import CompactionSettings, _transcript_lines  # noqa: E402
from iris_desktop.core.engine import ContextEngine, ContextParams  # noqa: E402
from iris_desktop.core.planner import Planner  # noqa: E402
from iris_desktop.core.store import Store  # noqa: E402
from iris_desktop.core.summary import ConversationSummary  # noqa: E402
from iris_desktop.paths import app_paths  # noqa: E402
from iris_desktop.runtime.model import LocalModel, ensure_bundled_model  # noqa: E402

from _corpus import CORPUS, compact_while_due, complete  # noqa: E402

SYSTEM = "You are Iris, a helpful assistant running locally and offline on the user's computer."
ARTICLES = re.compile(r"\b(a|an|the)\b")
PUNCT = str.maketrans("", "", string.punctuation)


def norm(text: str) -> str:
    return " ".join(ARTICLES.sub(" ", str(text).lower().translate(PUNCT)).split())


def f1(answer: list[str], sentence: list[str]) -> float:
    common = sum((Counter(answer) & Counter(sentence)).values())
    if not common:
        return 0.0
    precision, recall = common / len(sentence), common / len(answer)
    return 2 * precision * recall / (precision + recall)


class View:
    """What the model would see, prepared once for fast matching."""

    def __init__(self, text: str):
        self.text = norm(text)
        self.sentences = [norm(s).split() for s in re.split(r"(?<=[.!?\n])\s+", text) if s.strip()]

    def finds(self, answer) -> bool:
        target = norm(answer)
        if not target:
            return False
        if target in self.text:
            return True
        words = target.split()
        return any(f1(words, s) >= 0.5 for s in self.sentences if s)


def bullets(model, lines: list[str], max_tokens: int = 512) -> str:
    """Jan-style baseline: a bullet summary, folded chunk by chunk, ≤ 512 tokens."""
    counter = model.counter()
    room = model.n_ctx - max_tokens * 2 - 200
    summary, chunk, used = "", [], 0
    chunks = []
    for line in lines:
        size = counter.count_text(line) + 1
        if chunk and used + size > room:
            chunks.append(chunk)
            chunk, used = [], 0
        chunk.append(line)
        used += size
    if chunk:
        chunks.append(chunk)
    for chunk in chunks:
        prompt = [{"role": "system", "content": "Summarize the conversation as short bullet "
                   "points. Keep names, dates and numbers."},
                  {"role": "user", "content": f"Summary so far:\n{summary or '(none)'}\n\n"
                   "Conversation:\n" + "\n".join(chunk)}]
        summary, _ = complete(model, prompt, max_tokens=max_tokens, temperature=0.0,
                              repeat_penalty=1.15)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=4096)
    parser.add_argument("--llm-chats", type=int, default=0)
    parser.add_argument("--chats", type=int, default=10)
    parser.add_argument("--recall", type=int, nargs="*", default=[1024],
                        help="recall budgets to measure (tokens; the default setting is 1024)")
    args = parser.parse_args()

    model = LocalModel.load(ensure_bundled_model(app_paths().models_dir), n_ctx=8192)
    counter = model.counter()
    params = ContextParams(window=args.window, system_prompt=SYSTEM)
    files = sorted((CORPUS / "long-chats").glob("*.json"))[: args.chats]
    totals: dict[str, list[int]] = {}
    tokens: dict[str, list[int]] = {}
    per_chat = []

    by_category: dict[str, Counter] = {}
    CATEGORY = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}

    def tally(name: str, probe: dict, found: bool) -> bool:
        counts = by_category.setdefault(name, Counter())
        counts[(probe["category"], "n")] += 1
        counts[(probe["category"], "hit")] += found
        return found

    def score(name: str, view: View, probes: list[dict], used: int) -> int:
        hits = sum(tally(name, p, view.finds(p["answer"])) for p in probes)
        totals.setdefault(name, [0, 0])
        totals[name][0] += hits
        totals[name][1] += len(probes)
        tokens.setdefault(name, []).append(used)
        return hits

    started = time.perf_counter()
    for index, path in enumerate(files):
        data = json.loads(path.read_text())
        with tempfile.TemporaryDirectory() as tmp:
            store = Store(Path(tmp) / "r.db")
            thread = store.create_thread(path.stem)
            ids = store.add_messages(thread, data["messages"])
            extractive = Planner(params, counter).compactor(store)
            events = compact_while_due(extractive, thread)
            engine = ContextEngine(store, counter, params)
            request = engine.build(thread)
            summary_row = store.latest_summary(thread)
            covered = summary_row.covers_through_id
            tail_text = "\n".join(m["content"] or "" for m in request.messages[1:])
            tail_tokens = request.breakdown.history
            probes = [
                q for q in data["qa"] if "answer" in q and q["evidence"]
                and all(e in data["dia_index"] and ids[data["dia_index"][e]] <= covered
                        for e in q["evidence"])
            ]
            row = {"chat": path.stem, "probes": len(probes), "compactions": len(events)}
            ext = ConversationSummary.from_fields(summary_row.fields)
            row["extractive"] = score("extractive", View(ext.render() + "\n" + tail_text), probes,
                                      summary_row.tokens + tail_tokens)
            row["truncation"] = score("truncation", View(tail_text), probes, tail_tokens)
            for budget in args.recall:
                recaller = ContextEngine(store, counter, replace(params, recall_max_tokens=budget))
                hits, seen = 0, []
                for probe in probes:
                    asked = recaller.build(thread, draft=probe["question"])
                    *earlier, last = asked.messages
                    block = last["content"][: -len(probe["question"])]  # not the question itself
                    text = "\n".join([*(m["content"] or "" for m in earlier), block])
                    name = f"Iris ships (summary + recall {budget})"
                    hits += tally(name, probe, View(text).finds(probe["answer"]))
                    b = asked.breakdown
                    seen.append(b.summary + b.recall + b.history)
                totals.setdefault(name, [0, 0])
                totals[name][0] += hits
                totals[name][1] += len(probes)
                tokens.setdefault(name, []).append(sum(seen) / max(len(seen), 1))
                row[f"recall_{budget}"] = hits
            if index < args.llm_chats:
                llm_thread = store.create_thread("llm")
                store.add_messages(llm_thread, data["messages"])
                # the app gives up after 180 s; here the LLM path is measured to the end
                with_llm = Planner(params, counter, compaction=CompactionSettings(
                    timeout_s=3600)).compactor(store, runtime=model)
                llm_events = compact_while_due(with_llm, llm_thread)
                llm_row = store.latest_summary(llm_thread)
                shipped = ConversationSummary.from_fields(llm_row.fields)
                llm_only = ConversationSummary.from_fields({**llm_row.fields, "facts": []})
                row["llm_path"] = llm_row.path
                row["llm_paths"] = [e.path for e in llm_events]
                row["llm_notes"] = [e.error for e in llm_events]
                if llm_row.path != "extractive":  # only a real LLM summary counts as one
                    row["llm"] = score("LLM", View(llm_only.render() + "\n" + tail_text), probes,
                                       counter.count_text(llm_only.render()) + tail_tokens)
                row["shipped"] = score("Iris ships (LLM + ledger)",
                                       View(shipped.render() + "\n" + tail_text), probes,
                                       llm_row.tokens + tail_tokens)
                archived = [m for m in data["messages"][: covered - ids[0] + 1]]
                text = bullets(model, _transcript_lines(archived))
                row["bullets"] = score("bullets-512", View(text + "\n" + tail_text), probes,
                                       counter.count_text(text) + tail_tokens)
            store.close()
        per_chat.append(row)
        print(json.dumps(row), flush=True)
    model.close()

    print(f"\nwindow {args.window}, summary cap 768, tokens seen = summary + recall + tail; "
          f"counter {counter.name}, "
          f"{time.perf_counter() - started:.0f} s\n")
    print("| method | chats | probes (evidence summarized) | found | retention | "
          "tokens seen (mean) |")
    print("|---|---:|---:|---:|---:|---:|")
    order = ["truncation", "bullets-512", "LLM", "extractive", "Iris ships (LLM + ledger)",
             *(f"Iris ships (summary + recall {b})" for b in args.recall)]
    for name in order:
        if name not in totals:
            continue
        hit, n = totals[name]
        chats = len(tokens[name])
        print(f"| {name} | {chats} | {n:,} | {hit:,} | {hit / max(n, 1):.1%} | "
              f"{sum(tokens[name]) / chats:,.0f} |")
    print("\n| method | " + " | ".join(CATEGORY.values()) + " |")
    print("|---|" + "---:|" * len(CATEGORY))
    for name in order:
        if name not in by_category:
            continue
        counts = by_category[name]
        cells = [f"{counts[(c, 'hit')]}/{counts[(c, 'n')]} ({counts[(c, 'hit')] / max(counts[(c, 'n')], 1):.0%})"
                 for c in CATEGORY]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
