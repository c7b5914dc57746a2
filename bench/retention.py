"""Retention: after compaction, can the answer to a LoCoMo question still be found?

For each LoCoMo chat, converted as an exporter would write it (speaker ``name``s and
``created_at`` timestamps from the session lines; ``_corpus.locomo_messages``): import
it, compact it into a 4,096-token window at the shipped defaults (768-token summary cap,
recall up to 1,536 tokens), then, for every QA probe whose evidence messages are all
summarized, look for the answer in what the model would see: normalized text match, or
token-F1 ≥ 0.5 against any sentence. Two matchers, side by side:
- LoCoMo's scoring (the headline): a date matches in any written form ("15 August 2023",
  "August 15, 2023", "15th of August, 2023"), and a multi-hop answer that lists items
  ("pottery, camping, painting") is scored item by item, each item's best score
  averaged, as LoCoMo's own evaluation scores that category (``f1_multi`` in
  snap-research/locomo ``task_eval/evaluation.py``);
- strict: the whole answer as written, against one sentence (the matcher of the earlier
  runs, kept as a column so the two can be compared).

Rows, measured side by side in one run:
- truncation: the verbatim tail alone;
- names-and-numbers extract: the archived sentences ranked by names and numbers per
  token, cut to the same cap, plus the tail (the baseline the summary must beat);
- summary + tail: what the summary alone keeps (extractive summarizer);
- summary + recall + tail: the request Iris builds for the question (what ships): the
  summary, the tail and the summarized messages recalled for it (bm25 fused with the
  semantic index when the embedding model is present), without the question's words;
- ceilings, what the matcher can credit at all: the evidence messages alone, rendered as
  recall renders them (dated, each with the two messages after it), and what ships with
  those added whatever they cost (a perfect ranking and an unbounded block). A row above
  its ceiling cannot come from better retrieval, only from what the text says;
- paraphrased: the same, for questions rewritten to share no content word with their
  evidence (``bench/paraphrases.json``, checked by ``make_paraphrases_check.py``);
- evidence: the probes whose every evidence message the request shows (in the recall
  block or the verbatim history), as ``bench/longmemeval.py``'s ``evidence_all``;
- with ``--llm-chats N``: the same rows with the default model writing the summary, and
  the share of compactions that took the LLM path and passed the usability check.

    .venv/bin/python bench/retention.py [--chats 10] [--llm-chats 0] [--window 4096]
                                        [--vector-cache /tmp/vectors.db]

``--vector-cache FILE`` keeps the embedder's vectors between runs (``_vector_cache.py``:
the same vectors, so the same scores, without embedding every chat again).
``--rerank`` / ``--no-rerank`` turn recall's cross-encoder on or off (default: as
``context.recall_rerank`` ships); ``--rerank-cache FILE`` keeps its scores between runs
(:class:`CachedReranker`, keyed by the whole call: a score depends on the passages read
beside it), ``--rerank-threads`` sets its threads. The reranker's own time per question is
reported when no cache is used. ``--recall-cutoff X`` sets recall's relative cutoff
(``RECALL_CUTOFF``; both benches). The recall block's tokens in each probe's request are
reported as a median (with p25 and p75), and in the last line with ``evidence_all``.

The last line is one parseable summary.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import math
import re
import sqlite3
import statistics
import string
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from iris_desktop.core.config import (
    CompactionSettings,  # noqa: E402
    ContextParams,  # noqa: E402
)
from iris_desktop.core.planner import Planner  # noqa: E402
from iris_desktop.core.recall import Recaller, query_terms  # noqa: E402
from iris_desktop.core.records import DATE_FORMS, MONTH_NAMES, day_of, month_number  # noqa: E402
from iris_desktop.core.store import Store  # noqa: E402
from iris_desktop.core.summary import ConversationSummary  # noqa: E402
from iris_desktop.host import build_compactor  # noqa: E402
from iris_desktop.paths import app_paths  # noqa: E402
from iris_desktop.runtime.bundled import ensure_bundled_model  # noqa: E402
from iris_desktop.runtime.model import LocalModel  # noqa: E402
from iris_desktop.settings import lookup  # noqa: E402

from _corpus import CORPUS, REPO, compact_while_due, locomo_messages  # noqa: E402

SYSTEM = "You are Iris, a helpful assistant running locally and offline on the user's computer."
ARTICLES = re.compile(r"\b(a|an|the)\b")
PUNCT = str.maketrans("", "", string.punctuation)
CATEGORY = {1: "multi-hop", 2: "temporal", 4: "single-hop", 3: "open-domain"}
NAME_OR_NUMBER = re.compile(r"(?<!^)\b[A-Z][a-z]+|\b\d[\d,.:]*\b")
SUMMARY_CAP = 768


#: a day glued to its month ("23January, 2022", as a few LoCoMo answers are written)
GLUED_MONTH = re.compile(r"(?<=\d)(?=(?:" + "|".join(m[:3] for m in MONTH_NAMES) + r"))", re.IGNORECASE)
MULTI_HOP = 1  # LoCoMo's category number


def norm(text: str) -> str:
    return " ".join(ARTICLES.sub(" ", str(text).lower().translate(PUNCT)).split())


def one_date_form(text: str) -> str:
    """Full dates in one form: "August 15, 2023", "15th of August, 2023" → "15 August 2023"."""
    text = GLUED_MONTH.sub(" ", str(text))
    for form in DATE_FORMS[:2]:  # day month year, month day year
        text = form.sub(lambda m: f"{int(m['day'])} {MONTH_NAMES[month_number(m['month']) - 1]} "
                                  f"{m['year']}", text)
    return text


def f1(answer: list[str], sentence: list[str]) -> float:
    common = sum((Counter(answer) & Counter(sentence)).values())
    if not common:
        return 0.0
    precision, recall = common / len(sentence), common / len(answer)
    return 2 * precision * recall / (precision + recall)


class View:
    """What the model would see, prepared once for fast matching."""

    def __init__(self, text: str, dates: bool = True):
        self.dates = dates
        text = one_date_form(text) if dates else text
        self.text = norm(text)
        self.sentences = [norm(s).split() for s in re.split(r"(?<=[.!?\n])\s+", text) if s.strip()]

    def score(self, answer) -> float:
        """1 if the answer is in the text, else its best token-F1 against one sentence."""
        target = norm(one_date_form(answer) if self.dates else answer)
        if not target:
            return 0.0
        if target in self.text:
            return 1.0
        words = target.split()
        return max((f1(words, s) for s in self.sentences if s), default=0.0)

    def finds(self, answer, category: int | None = None) -> bool:
        """Found at a score of 0.5; with ``dates`` (LoCoMo's scoring), a multi-hop answer
        is split at its commas and its items' scores averaged."""
        items = [answer]
        if self.dates and category == MULTI_HOP:
            items = [item for item in str(answer).split(",") if norm(item)] or items
        return sum(self.score(item) for item in items) / len(items) >= 0.5


def names_and_numbers(messages: list[dict], counter, cap: int) -> str:
    """The baseline: archived sentences ranked by names and numbers per token, densest
    first, until the cap."""
    sentences = []
    for message in messages:
        for sentence in re.split(r"(?<=[.!?])\s+", " ".join((message.get("content") or "").split())):
            hits = len(NAME_OR_NUMBER.findall(sentence))
            if hits and sentence:
                tokens = counter.count_text(sentence) + 1
                sentences.append((hits / tokens, tokens, sentence))
    chosen, spent = [], 0
    for _, tokens, sentence in sorted(sentences, key=lambda s: -s[0]):
        if spent + tokens <= cap:
            chosen.append(sentence)
            spent += tokens
    return "\n".join(chosen)


class Seen:
    """A text under both matchers."""

    def __init__(self, text: str):
        self.locomo, self.strict = View(text), View(text, dates=False)

    def finds(self, probe: dict) -> tuple[bool, bool]:
        return (self.locomo.finds(probe["answer"], probe["category"]),
                self.strict.finds(probe["answer"]))


class Tally:
    """Found / probes per row, and per category, under both matchers."""

    def __init__(self):
        self.rows: dict[str, Counter] = {}
        #: label → [probes, probes whose every evidence message the request shows]
        self.evidence: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        #: label → the recall block's tokens in each probe's request (0: no block)
        self.block_tokens: dict[str, list[int]] = defaultdict(list)

    def add(self, row: str, probe: dict, seen: Seen) -> None:
        found, strict = seen.finds(probe)
        counts = self.rows.setdefault(row, Counter())
        for key in ("n", probe["category"]):
            counts[key, "n"] += 1
            counts[key, "hit"] += found
            counts[key, "strict"] += strict

    def rate(self, row: str, category: int | None = None, strict: bool = False) -> float:
        c = self.rows.get(row, Counter())
        key = "n" if category is None else category
        n = c[key, "n"]
        return c[key, "strict" if strict else "hit"] / n if n else math.nan


class CachedReranker:
    """``reranker``'s scores looked up first in ``path``, one call at a time: the same scores
    as the model gives, without reading every pair again on each run (benches only).
    ``seconds`` lists the model's own time per call that missed.

    The key is the whole call (the model and how it batches, the question, every passage
    in order), not one (question, passage) pair: the shipped model is INT8 with dynamic
    quantization, so each batch's activations are scaled by that batch's own range, and a
    passage's score moves with the passages read beside it (about 0.1–0.3 logit; -7.39
    alone, -7.46 and -7.23 beside other passages). A cache by pair hands a changed
    candidate list scores the model gave in other batches; by call, a run that reads the
    same candidates gets exactly what the model gave for them, and any other list is read
    by the model."""

    def __init__(self, reranker, path: Path | None = None):
        self.reranker = reranker
        self.identity = reranker.identity
        from iris_desktop.runtime import reranker as module

        #: what else decides a score: the model's batch size and the longest passage it reads
        self.model = (f"{reranker.identity}|batch={getattr(module, '_BATCH', '?')}"
                      f"|max_tokens={getattr(reranker, 'max_tokens', '?')}"
                      f"|max_passage_tokens={getattr(reranker, 'max_passage_tokens', '?')}"
                      f"|query_tokens={getattr(module, '_QUERY_TOKENS', '?')}")
        self.conn = sqlite3.connect(str(path) if path else ":memory:")  # a run asks twice per question
        self.conn.execute("CREATE TABLE IF NOT EXISTS calls (model TEXT, key BLOB, scores TEXT, "
                          "PRIMARY KEY (model, key))")
        self.seconds: list[float] = []

    @staticmethod
    def _key(query: str, passages) -> bytes:
        digest = hashlib.sha256(query.encode())
        for passage in passages:
            digest.update(b"\0" + passage.encode())
        return digest.digest()

    @property
    def max_query_tokens(self) -> int:
        return self.reranker.max_query_tokens

    def query_tokens(self, text: str) -> int:
        return self.reranker.query_tokens(text)

    def score(self, query: str, passages) -> list[float]:
        passages = list(passages)
        key = self._key(query, passages)
        found = self.conn.execute("SELECT scores FROM calls WHERE model = ? AND key = ?",
                                  (self.model, key)).fetchone()
        if found is not None:
            return json.loads(found[0])
        started = time.perf_counter()
        scores = [float(s) for s in self.reranker.score(query, passages)]
        self.seconds.append(time.perf_counter() - started)
        with self.conn:
            self.conn.execute("INSERT OR REPLACE INTO calls VALUES (?, ?, ?)",
                              (self.model, key, json.dumps(scores)))
        return scores

    def timing(self) -> str:
        """The model's time per call (a question, or one part of it), when it ran."""
        if not self.seconds:
            return "reranker: every score from the cache"
        s = sorted(self.seconds)
        return (f"reranker: {len(s)} calls, median {statistics.median(s):.2f} s, "
                f"p90 {s[int(0.9 * (len(s) - 1))]:.2f} s, max {s[-1]:.2f} s")


def load_reranker(args):
    """The shipped cross-encoder for a bench run, or None (``--no-rerank``)."""
    from iris_desktop.core import recall

    if args.recall_cutoff is not None:  # measured for issue 45 item 3 (docs/benchmarks.md)
        recall.RECALL_CUTOFF = args.recall_cutoff
    print(f"recall cutoff {getattr(recall, 'RECALL_CUTOFF', 'none (this engine has no cutoff)')}", flush=True)
    if not args.rerank:
        return None
    from iris_desktop.runtime.reranker import CrossEncoder

    if args.rerank_candidates:  # measured for issue 45 (docs/benchmarks.md)
        recall.RERANK_CANDIDATES = args.rerank_candidates
    print(f"reranking {recall.RERANK_CANDIDATES} candidates on {args.rerank_threads} threads", flush=True)

    return CachedReranker(CrossEncoder.load(n_threads=args.rerank_threads), args.rerank_cache)


def load_embedder(args, models_dir: Path):
    """The embedder recall uses in a bench run, as the host loads it (``--embedder``, as
    ``context.recall_embedder`` names it: bge-small-en-v1.5 as shipped, or
    all-MiniLM-L6-v2), its vectors kept between runs with ``--vector-cache``; None with
    ``--no-semantic``."""
    if args.no_semantic:
        return None
    from iris_desktop.runtime.embedder import load_recall_embedder

    embedder = load_recall_embedder(args.embedder, models_dir)
    print(f"embedder {embedder.identity}", flush=True)
    if args.vector_cache:
        from _vector_cache import CachedEmbedder

        embedder = CachedEmbedder(embedder, args.vector_cache)
    return embedder


def add_rerank_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-semantic", action="store_true")
    embedder = lookup("context.recall_embedder")
    parser.add_argument("--embedder", choices=embedder.choices, default=embedder.default,
                        help="recall's embedding model, as context.recall_embedder names it (default: as it "
                             "ships; bge-small = bge-small-en-v1.5, minilm = all-MiniLM-L6-v2)")
    parser.add_argument("--vector-cache", type=Path, default=None,
                        help="keep the embedder's vectors in this file between runs (same vectors, faster)")
    parser.add_argument("--rerank", action=argparse.BooleanOptionalAction,
                        default=lookup("context.recall_rerank").default,
                        help="recall's cross-encoder (default: as context.recall_rerank ships)")
    parser.add_argument("--rerank-cache", type=Path, default=None,
                        help="keep the reranker's scores in this file between runs (same scores, faster)")
    parser.add_argument("--rerank-threads", type=int, default=1)
    parser.add_argument("--rerank-candidates", type=int, default=None,
                        help="candidates the reranker reads (default: recall's RERANK_CANDIDATES)")
    parser.add_argument("--recall-cutoff", type=float, default=None,
                        help="recall's relative cutoff: a hit weaker than this share of the best is "
                             "left out (default: recall's RECALL_CUTOFF; 0: none)")


def asked_text(planner: Planner, store: Store, thread: int, question: str) -> str:
    """The request Iris builds for the question, without the question's own words."""
    request = planner.plan(store, thread, question, cache=False)
    *earlier, last = request.messages
    block = last["content"][: -len(question)]
    return "\n".join([*(m["content"] or "" for m in earlier), block])


def one_chat(path: Path, args, counter, embedder, model, paraphrases, tally: Tally, reranker=None) -> dict:
    data = json.loads(path.read_text())
    messages = locomo_messages(data)
    params = ContextParams(window=args.window, system_prompt=SYSTEM,
                           recall_max_tokens=args.recall)
    row: dict = {"chat": path.stem}
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "r.db")
        for label, runtime in (("extractive", None), ("llm", model)):
            if label == "llm" and model is None:
                continue
            thread = store.create_thread(label)
            ids = store.add_messages(thread, messages)
            settings = CompactionSettings(summary_max_tokens=SUMMARY_CAP, timeout_s=args.timeout,
                                          max_parts=args.summary_max_parts)
            planner = Planner(params, counter, compaction=settings)
            started = time.perf_counter()
            events = compact_while_due(build_compactor(planner, store, runtime=runtime), thread)
            row[f"{label}_seconds"] = round(time.perf_counter() - started, 1)
            row[f"{label}_paths"] = [e.path for e in events]
            if label == "llm":
                row["llm_notes"] = [e.error for e in events if e.error]
            # the questions are asked the day after the chat ends ("last year" means the
            # year before that), not on the day the bench runs
            asked_on = (day_of(store.messages(thread)[-1].get("sent_at")) or dt.date.today()) + dt.timedelta(days=1)
            planner = Planner(params, counter, compaction=settings, embedder=embedder,
                              today=lambda asked_on=asked_on: asked_on, reranker=reranker)
            if embedder is not None:
                index = planner.index(store)
                while index.index_pending(limit=256):
                    pass
            score_thread(store, thread, ids, data, messages, planner, counter, paraphrases,
                         tally, label, row)
        store.close()
    return row


def score_thread(store, thread, ids, data, messages, planner, counter, paraphrases, tally,
                 label, row) -> None:
    summary_row = store.latest_summary(thread)
    covered = summary_row.covers_through_id
    tail = planner.plan(store, thread, recall=False, cache=False)  # no recall for a last question
    tail_text = "\n".join(m["content"] or "" for m in tail.messages[1:])
    summary = ConversationSummary.from_fields(summary_row.fields).render()
    probes = [dict(q, index=i) for i, q in enumerate(data["qa"])
              if "answer" in q and q["evidence"] and q["category"] in CATEGORY
              and all(e in data["dia_index"] and ids[data["dia_index"][e]] <= covered
                      for e in q["evidence"])]
    row[f"{label}_probes"] = len(probes)
    views = {"summary + tail": Seen(summary + "\n" + tail_text)}
    if label == "extractive":
        archived = messages[: covered - ids[0] + 1]
        views["truncation"] = Seen(tail_text)
        views["names-and-numbers extract"] = Seen(
            names_and_numbers(archived, counter, SUMMARY_CAP) + "\n" + tail_text)
    recaller = Recaller(store, counter)
    for probe in probes:
        for name, view in views.items():
            tally.add(f"{label}: {name}", probe, view)
        shipped = asked_text(planner, store, thread, probe["question"])
        tally.add(f"{label}: summary + recall + tail", probe, Seen(shipped))
        request = planner.plan(store, thread, probe["question"], cache=False)  # the same ranking, kept
        shown = {*request.recall.ids, *request.included_ids, *request.kept_ids, *request.pinned_ids}
        counts = tally.evidence[label]
        counts[0] += 1
        counts[1] += all(ids[data["dia_index"][e]] in shown for e in probe["evidence"])
        tally.block_tokens[label].append(request.breakdown.recall)
        evidence = recaller.block_for(thread, covered,
                                      [ids[data["dia_index"][e]] for e in probe["evidence"]],
                                      query_terms(probe["question"], store.thread_speakers(thread)))
        tally.add(f"{label}: ceiling: the evidence alone", probe, Seen(evidence))
        tally.add(f"{label}: ceiling: summary + recall + tail + the evidence", probe,
                  Seen(shipped + "\n" + evidence))
    for entry in paraphrases:
        if entry["chat"] != row["chat"]:
            continue
        probe = data["qa"][entry["index"]]
        if not all(ids[data["dia_index"][e]] <= covered for e in probe["evidence"]):
            continue
        tally.add(f"{label}: paraphrased, with recall", probe,
                  Seen(asked_text(planner, store, thread, entry["paraphrase"])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=4096)
    parser.add_argument("--chats", type=int, default=10)
    parser.add_argument("--llm-chats", type=int, default=0,
                        help="also compact this many chats with the model writing the summary")
    parser.add_argument("--recall", type=int, default=lookup("context.recall_max_tokens").default,
                        help="context.recall_max_tokens (default: the shipped default)")
    parser.add_argument("--timeout", type=float, default=180,
                        help="context.summary_timeout_s for the LLM rows, per summary call "
                             "(the shipped default is 180)")
    parser.add_argument("--summary-max-parts", type=int,
                        default=lookup("context.summary_max_parts").default,
                        help="context.summary_max_parts for the LLM rows: how many parts of "
                             "old turns the model reads at once (0 = all; the shipped default "
                             "is %(default)s)")
    add_rerank_options(parser)
    args = parser.parse_args()

    models_dir = app_paths().models_dir
    model = LocalModel.load(ensure_bundled_model(models_dir), n_ctx=8192)
    counter = model.counter()
    embedder = load_embedder(args, models_dir)
    reranker = load_reranker(args)
    paraphrases = json.loads((REPO / "bench" / "paraphrases.json").read_text())
    tally = Tally()
    rows = []
    started = time.perf_counter()
    for index, path in enumerate(sorted((CORPUS / "long-chats").glob("*.json"))[: args.chats]):
        llm = model if index < args.llm_chats else None
        rows.append(one_chat(path, args, counter, embedder, llm, paraphrases, tally, reranker))
        print(json.dumps(rows[-1]), flush=True)
    model.close()
    report(args, rows, tally, counter.name, time.perf_counter() - started, embedder is not None, reranker)


def report(args, rows, tally: Tally, counter: str, seconds: float, semantic: bool, reranker=None) -> None:
    parts = f"at most {args.summary_max_parts} part(s)" if args.summary_max_parts else "every part"
    print(f"\nwindow {args.window}, summary cap {SUMMARY_CAP}, recall {args.recall}, "
          f"summary timeout {args.timeout:g} s per call, "
          f"the model reads {parts} of old turns at once, "
          f"semantic recall {'on' if semantic else 'off'}, reranking {'on' if reranker else 'off'}; "
          f"counter {counter}; {seconds:.0f} s\n")
    if reranker is not None:
        print(reranker.timing() + "\n")
    print("LoCoMo's scoring (dates in any form, multi-hop lists item by item); strict: the "
          "whole answer as written, against one sentence\n")
    print("| row | probes | found | retention | multi-hop | temporal | single-hop | strict | "
          "strict multi-hop |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, counts in tally.rows.items():
        cells = " | ".join(f"{tally.rate(name, c):.0%}" for c in (1, 2, 4))
        print(f"| {name} | {counts['n', 'n']:,} | {counts['n', 'hit']:,} | {tally.rate(name):.1%} "
              f"| {cells} | {tally.rate(name, strict=True):.1%} | {tally.rate(name, 1, strict=True):.0%} |")
    llm = [r for r in rows if "llm_paths" in r]
    if llm:
        paths = [p for r in llm for p in r["llm_paths"]]
        ok = sum(p in ("llm", "chunked") for p in paths)
        seconds = [r["llm_seconds"] / max(len(r["llm_paths"]), 1) for r in llm]
        print(f"\nLLM summaries: {ok}/{len(paths)} compactions took the LLM path and passed the "
              f"check ({ok / max(len(paths), 1):.0%}); {sum(seconds) / len(seconds):.0f} s per "
              "compaction on average")
    for label, (n, every) in tally.evidence.items():
        print(f"\n{label}: every evidence message in the request for {every:,} of {n:,} probes ({every / n:.1%})")
    for label, tokens in tally.block_tokens.items():
        shown = sorted(t for t in tokens if t)
        print(f"{label}: recall block tokens, median {statistics.median(tokens):,.0f} over the {len(tokens):,} "
              f"probes (p25 {quantile(tokens, 0.25):,.0f}, p75 {quantile(tokens, 0.75):,.0f}); "
              f"{len(shown):,} with a block, median {statistics.median(shown) if shown else 0:,.0f}")
    baseline = tally.rate("extractive: names-and-numbers extract")
    shipped = tally.rate("extractive: summary + recall + tail")
    ceiling = "extractive: ceiling: summary + recall + tail + the evidence"
    print(f"\nretention: summary_tail={tally.rate('extractive: summary + tail'):.3f} "
          f"extract_baseline={baseline:.3f} "
          f"ratio={tally.rate('extractive: summary + tail') / baseline:.2f} "
          f"with_recall={shipped:.3f} multi_hop={tally.rate('extractive: summary + recall + tail', 1):.3f} "
          f"paraphrased={tally.rate('extractive: paraphrased, with recall'):.3f} "
          f"ceiling={tally.rate(ceiling):.3f} ceiling_multi_hop={tally.rate(ceiling, 1):.3f} "
          f"strict_with_recall={tally.rate('extractive: summary + recall + tail', strict=True):.3f} "
          f"strict_multi_hop={tally.rate('extractive: summary + recall + tail', 1, strict=True):.3f} "
          f"strict_ceiling={tally.rate(ceiling, strict=True):.3f} "
          f"evidence_all={tally.evidence['extractive'][1] / max(tally.evidence['extractive'][0], 1):.3f} "
          f"recall_tokens_median={statistics.median(tally.block_tokens['extractive'] or [0]):.0f}")


def quantile(values: list[int], q: float) -> float:
    """The q-quantile of ``values`` (nearest rank), 0 for none."""
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0


if __name__ == "__main__":
    main()
