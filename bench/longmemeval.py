"""LongMemEval: after compaction, is the evidence for the question in the request Iris builds?

The second dev set beside ``bench/retention.py`` (LoCoMo; issue 28). Each file of
``../shared/corpus/longmemeval-dev/`` is one LongMemEval_S haystack: a long user↔assistant
history (~450 messages, ~120k tokens, dated by ``created_at``) with one question. For
each file the bench does what ``bench/retention.py`` does for a LoCoMo chat, with the same
settings for "what ships": import the messages into a fresh Store (``Store.add_messages``,
timestamps kept), compact into a 4,096-token window at the shipped defaults (768-token
summary cap, recall up to ``context.recall_max_tokens``; the extractive summarizer, or
with ``--llm`` the bundled model writing the summary), embed the summarized messages
(semantic recall on unless ``--no-semantic``), then plan the request for the question as
the draft (``Planner.plan``, the path of ``context --json --draft QUESTION``).

The question is asked on its ``question_date`` (the planner's clock for the draft): a
relative date in it ("in the last 3 months") means a time before that day, as recall
reads a question's relative dates against the day it is asked.

What "in the request" means, per evidence message (``qa[0].evidence``, indices into
``messages``, mapped to the ids the import gave them): its id is among the messages the
request shows verbatim, that is ``recall.ids`` (the recall block: each hit with the
messages after it) plus ``included_ids`` (the verbatim history tail) plus ``kept_ids``
and ``pinned_ids``. The summary does not count by id (it is a digest, not the message).
A recalled message longer than recall's clip (600 characters; 300 for a question that
counts) counts although it is shown clipped; the ``clipped`` column counts those
evidence messages.

- ``evidence_all``: share of questions whose every evidence message is in the request;
- ``evidence_any``: share with at least one;
- ``answer``: share whose answer string is findable in the request without the
  question's own words, by retention.py's matcher (normalized text match, or token-F1 ≥
  0.5 against one sentence, dates in any written form). LongMemEval answers are free-form
  (a preference question's "answer" is a rubric), so this under-counts; evidence first;
- ``recall_tokens`` (the recall segment, counted exactly) and ``request_tokens`` (the
  predicted prompt), as medians.

Each row also lists ``evidence_ranks``, where each evidence message stands in recall's
ranking (None: not ranked at all): a miss ranked low was not retrieved, one ranked high
was cut by the block's room. ``ceiling_all`` is ``evidence_all`` for the same request
planned again with the evidence messages first in recall's ranking and the rest in its
order (what a perfect reranker would give, in the same block): the share a better
ranking could reach; what stays below it is room. And, for issue 28's item 3, whether
the answer is findable in the summary + verbatim tail (``summary_answer``) against a
names-and-numbers extract of the same archived messages at the same cap + the tail
(``extract_answer``; the baseline of ``bench/retention.py``, one matcher for both).

A file whose question has no evidence indices (its answer sessions are not in the
haystack) is skipped and listed. ``--files N`` takes N files round-robin over the types
(a quick subset that covers each); ``--vector-cache FILE`` keeps the embedder's vectors
between runs (``_vector_cache.py``: the same vectors, so the same scores, without the
embedding that is nearly all of a run's time).

    .venv/bin/python bench/longmemeval.py [--files 42] [--types t1,t2] [--llm] [--json]
                                          [--vector-cache /tmp/vectors.db]

The last line is one parseable summary.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from retention import (  # noqa: E402
    SUMMARY_CAP,
    SYSTEM,
    View,
    add_rerank_options,
    asked_text,
    load_embedder,
    load_reranker,
    names_and_numbers,
)

from iris_desktop.core.config import CompactionSettings, ContextParams  # noqa: E402
from iris_desktop.core.planner import Planner  # noqa: E402
from iris_desktop.core.recall import COUNTING_HIT_CHARS, MAX_CHARS, Recaller  # noqa: E402
from iris_desktop.core.store import Store  # noqa: E402
from iris_desktop.core.summary import ConversationSummary  # noqa: E402
from iris_desktop.host import build_compactor  # noqa: E402
from iris_desktop.settings import lookup  # noqa: E402

from _corpus import CORPUS, compact_while_due  # noqa: E402

DEV_SET = CORPUS / "longmemeval-dev"
WINDOW = 4096  # bench/retention.py's window for "what ships"
TYPES = ["single-session-user", "single-session-assistant", "single-session-preference",
         "multi-session", "temporal-reasoning", "knowledge-update"]


def question_type(path: Path) -> str:
    return json.loads(path.read_text())["qa"][0]["question_type"]


def choose(paths: list[Path], files: int | None, types: list[str] | None) -> list[Path]:
    """The files of ``types``, then ``files`` of them taken round-robin over the types
    (sorted by name within a type), so a subset covers every type."""
    by_type: dict[str, list[Path]] = defaultdict(list)
    for path in sorted(paths):
        by_type[question_type(path)].append(path)
    order = [t for t in [*TYPES, *sorted(set(by_type) - set(TYPES))]
             if t in by_type and (not types or t in types)]
    chosen: list[Path] = []
    for rank in range(max((len(by_type[t]) for t in order), default=0)):
        chosen += [by_type[t][rank] for t in order if rank < len(by_type[t])]
    return chosen[:files] if files else chosen


def question_day(text: str) -> dt.date | None:
    """LongMemEval's ``question_date`` ("2023/05/30 (Tue) 10:18") as a day: the day the
    question is asked, what its "last week" means (the planner's clock for the draft)."""
    try:
        return dt.datetime.strptime(text[:10], "%Y/%m/%d").date()
    except (TypeError, ValueError):
        return None


@contextlib.contextmanager
def evidence_first(evidence: list[int]):
    """Recall's rankings with ``evidence`` first, then the rest in their order: what a
    perfect reranker would give (the ceiling column; this bench's process only)."""
    rank = Recaller.rank

    def ranked_first(self, thread_id, through_id, query, today=None):
        ranking = rank(self, thread_id, through_id, query, today)
        if not ranking.ranked:
            return ranking
        first = [i for i in evidence if i <= through_id]
        perfect = {"ranked": [*first, *(i for i in ranking.ranked if i not in first)]}
        if hasattr(ranking, "strength"):  # as strong as the best: recall's cutoff keeps them
            perfect["strength"] = {**ranking.strength, **dict.fromkeys(first, 1.0)}
        return dataclasses.replace(ranking, **perfect)

    Recaller.rank = ranked_first
    try:
        yield
    finally:
        Recaller.rank = rank


def one_file(path: Path, counter, embedder=None, runtime=None, window: int = WINDOW,
             recall: int | None = None, timeout: float = 180, reranker=None,
             max_parts: int | None = None) -> dict:
    """Import, compact, plan the question; the row of one file."""
    data = json.loads(path.read_text())
    qa = data["qa"][0]
    row: dict = {"file": path.stem, "type": qa["question_type"], "messages": len(data["messages"]),
                 "question_date": qa["question_date"], "summarizer": "llm" if runtime else "extractive"}
    if not qa.get("evidence"):
        return {**row, "skipped": "no evidence indices (the answer sessions are not in the haystack)"}
    if recall is None:
        recall = lookup("context.recall_max_tokens").default
    params = ContextParams(window=window, system_prompt=SYSTEM, recall_max_tokens=recall)
    settings = CompactionSettings(summary_max_tokens=SUMMARY_CAP, timeout_s=timeout,
                                  max_parts=lookup("context.summary_max_parts").default
                                  if max_parts is None else max_parts)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "lme.db")
        try:
            thread = store.create_thread(path.stem)
            ids = store.add_messages(thread, data["messages"])
            started = time.perf_counter()
            events = compact_while_due(build_compactor(Planner(params, counter, compaction=settings),
                                                       store, runtime=runtime), thread)
            row["compact_s"] = round(time.perf_counter() - started, 1)
            row["paths"] = [e.path for e in events]
            asked_on = question_day(qa["question_date"])
            planner = Planner(params, counter, compaction=settings, embedder=embedder,
                              today=lambda: asked_on, reranker=reranker)
            if embedder is not None:
                index = planner.index(store)
                while index.index_pending(limit=256):
                    pass
            started = time.perf_counter()
            request = planner.plan(store, thread, qa["question"], cache=False)
            row["plan_s"] = round(time.perf_counter() - started, 2)
            summary = store.latest_summary(thread)
            covered = summary.covers_through_id if summary else 0
            ranking = Recaller(store, counter, planner.semantic_for(store), reranker).rank(
                thread, covered, qa["question"], asked_on)
            ranked = ranking.ranked
            shown = {*request.recall.ids, *request.included_ids, *request.kept_ids, *request.pinned_ids}
            evidence = [ids[i] for i in qa["evidence"]]
            found = [i for i in evidence if i in shown]
            clip = COUNTING_HIT_CHARS if ranking.counting else MAX_CHARS  # what recall clipped hits to
            row.update(
                evidence=len(evidence), found=len(found),
                evidence_all=len(found) == len(evidence), evidence_any=bool(found),
                summarized=sum(i <= covered for i in evidence),
                recalled=sum(i in request.recall.ids for i in evidence),
                clipped=sum(i in request.recall.ids and len(" ".join(
                    data["messages"][qa["evidence"][k]]["content"].split())) > clip
                    for k, i in enumerate(evidence)),
                answer=View(asked_text(planner, store, thread, qa["question"])).finds(qa["answer"]),
                recall_tokens=request.breakdown.recall,
                request_tokens=request.predicted_prompt_tokens,
                recall_reason=request.recall.reason,
                # where each evidence message stands in recall's ranking (None: not ranked):
                # a miss ranked low was not retrieved; one ranked high was cut by the room
                evidence_ranks=[ranked.index(i) + 1 if i in ranked else None for i in evidence],
                reranked=ranking.reranked,
            )
            with evidence_first(evidence):  # a fresh planner: its own cache of rankings
                perfect = Planner(params, counter, compaction=settings, embedder=embedder,
                                  today=lambda: asked_on, reranker=reranker).plan(
                    store, thread, qa["question"], cache=False)
            ideal = {*perfect.recall.ids, *perfect.included_ids, *perfect.kept_ids, *perfect.pinned_ids}
            row["ceiling_all"] = all(i in ideal for i in evidence)
            if summary is not None:  # item 3: what the summary keeps, against an extract of its size
                tail = planner.plan(store, thread, recall=False, cache=False)
                tail_text = "\n".join(m["content"] or "" for m in tail.messages[1:])
                archived = [m for i, m in zip(ids, data["messages"]) if i <= covered]
                rendered = ConversationSummary.from_fields(summary.fields).render()
                row["summary_answer"] = View(rendered + "\n" + tail_text).finds(qa["answer"])
                row["extract_answer"] = View(names_and_numbers(archived, counter, SUMMARY_CAP) + "\n"
                                             + tail_text).finds(qa["answer"])
        finally:
            store.close()
    return row


def share(rows: list[dict], key: str) -> float:
    return sum(bool(r.get(key)) for r in rows) / len(rows) if rows else float("nan")


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows) if rows else float("nan")


def summarize(rows: list[dict]) -> dict:
    """Per question type and overall: n, the three shares, the two medians."""
    scored = [r for r in rows if "skipped" not in r]
    groups = {t: [r for r in scored if r["type"] == t] for t in dict.fromkeys(r["type"] for r in scored)}
    groups = {t: groups[t] for t in [*TYPES, *groups] if t in groups}
    out = {}
    for name, group in [*groups.items(), ("overall", scored)]:
        out[name] = {"n": len(group), "evidence_all": share(group, "evidence_all"),
                     "evidence_any": share(group, "evidence_any"), "answer": share(group, "answer"),
                     "ceiling_all": share(group, "ceiling_all"),
                     "recall_tokens_median": median(group, "recall_tokens"),
                     "request_tokens_median": median(group, "request_tokens"),
                     "clipped": sum(r["clipped"] for r in group),
                     "summary_answer": share(group, "summary_answer"),
                     "extract_answer": share(group, "extract_answer")}
    return out


def summary_line(table: dict) -> str:
    o = table["overall"]
    return (f"longmemeval: evidence_all={o['evidence_all']:.3f} evidence_any={o['evidence_any']:.3f} "
            f"answer={o['answer']:.3f} n={o['n']} recall_tokens_median={o['recall_tokens_median']:.0f} "
            f"summary_tail={o['summary_answer']:.3f} extract_tail={o['extract_answer']:.3f} "
            f"ceiling_all={o['ceiling_all']:.3f}")


def report(rows: list[dict], header: str, as_json: bool = False) -> None:
    table = summarize(rows)
    skipped = [f"{r['file']} ({r['skipped']})" for r in rows if "skipped" in r]
    if as_json:
        print(json.dumps({"header": header, "table": table, "skipped": skipped, "rows": rows}))
    else:
        print(f"\n{header}\n")
        print("| question type | n | evidence_all | evidence_any | answer | recall tokens (median) | "
              "request tokens (median) | evidence clipped | answer: summary + tail | answer: extract + tail "
              "| evidence_all, perfect ranking |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for name, t in table.items():
            label = f"**{name}**" if name == "overall" else name
            print(f"| {label} | {t['n']} | {t['evidence_all']:.0%} | {t['evidence_any']:.0%} | {t['answer']:.0%} "
                  f"| {t['recall_tokens_median']:,.0f} | {t['request_tokens_median']:,.0f} | {t['clipped']} "
                  f"| {t['summary_answer']:.0%} | {t['extract_answer']:.0%} | {t['ceiling_all']:.0%} |")
        if skipped:
            print("\nskipped: " + "; ".join(skipped))
    print(summary_line(table))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=0, help="this many files, spread over the types (0: all)")
    parser.add_argument("--types", default="", help="comma-separated question types (default: all)")
    parser.add_argument("--llm", action="store_true", help="the bundled model writes the summary")
    parser.add_argument("--json", action="store_true", help="the table and rows as one JSON object")
    parser.add_argument("--window", type=int, default=WINDOW)
    parser.add_argument("--recall", type=int, default=lookup("context.recall_max_tokens").default,
                        help="context.recall_max_tokens (default: the shipped default)")
    parser.add_argument("--timeout", type=float, default=180, help="context.summary_timeout_s, per summary call")
    parser.add_argument("--summary-max-parts", type=int,
                        default=lookup("context.summary_max_parts").default,
                        help="context.summary_max_parts with --llm: how many parts of old turns "
                             "the model reads at once (0 = all; the shipped default is %(default)s)")
    add_rerank_options(parser)
    parser.add_argument("--corpus", type=Path, default=DEV_SET, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    from iris_desktop.paths import app_paths
    from iris_desktop.runtime.bundled import ensure_bundled_model
    from iris_desktop.runtime.model import LocalModel

    paths = choose(list(args.corpus.glob("*.json")), args.files,
                   [t.strip() for t in args.types.split(",") if t.strip()])
    if not paths:
        sys.exit(f"no LongMemEval files in {args.corpus}")
    models_dir = app_paths().models_dir
    model = LocalModel.load(ensure_bundled_model(models_dir), n_ctx=8192)
    counter = model.counter()
    embedder = load_embedder(args, models_dir)
    reranker = load_reranker(args)
    started = time.perf_counter()
    rows = []
    for path in paths:
        rows.append(one_file(path, counter, embedder, model if args.llm else None, args.window,
                             args.recall, args.timeout, reranker, args.summary_max_parts))
        if not args.json:
            print(json.dumps(rows[-1]), flush=True)
    model.close()
    header = (f"window {args.window}, summary cap {SUMMARY_CAP}, recall {args.recall}, summarizer "
              f"{'llm' if args.llm else 'extractive'}"
              + (" (the model reads "
                 + (f"at most {args.summary_max_parts} part(s)" if args.summary_max_parts
                    else "every part") + " of old turns at once)" if args.llm else "")
              + f", semantic recall {'on' if embedder else 'off'}, "
              f"reranking {'on' if reranker else 'off'}; "
              f"counter {counter.name}; {len(paths)} files; {time.perf_counter() - started:.0f} s")
    if reranker is not None:
        header += f"; {reranker.timing()}"
    report(rows, header, args.json)


if __name__ == "__main__":
    main()
