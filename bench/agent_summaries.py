"""Model-written summaries of agent transcripts: how often the LLM path is taken and
passes the usability check, how long a compaction takes, and whether the files the agent
explored survive the chain of summaries.

Each SWE-agent transcript of the corpus is imported and compacted while compaction is
due, at the shipped settings (window 8192, summary cap 768, ``context.summarizer``
auto, timeout ``--timeout``), with the bundled model writing the summary. For each
transcript: the compactions, their path (``llm``, ``chunked``: the model in several
calls, ``extractive``: the fallback) and why a fallback happened, seconds per
compaction, and the share of the files named in the archived messages' tool calls that
the final summary still names.

    .venv/bin/python bench/agent_summaries.py [--transcripts 21] [--timeout 180]

The last line is one parseable summary:
``agent_summaries: compactions=… llm_share=… median_s=… max_s=… files_kept=…``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from iris_desktop.core.config import (
    CompactionSettings,  # noqa: E402
    ContextParams,  # noqa: E402
)
from iris_desktop.core.extractive import paths_in  # noqa: E402
from iris_desktop.core.planner import Planner  # noqa: E402
from iris_desktop.core.records import said_from_row  # noqa: E402
from iris_desktop.core.store import Store  # noqa: E402
from iris_desktop.core.summary import ConversationSummary  # noqa: E402
from iris_desktop.host import build_compactor  # noqa: E402
from iris_desktop.paths import app_paths  # noqa: E402
from iris_desktop.runtime.bundled import ensure_bundled_model  # noqa: E402
from iris_desktop.runtime.model import LocalModel  # noqa: E402

from _corpus import CORPUS, compact_while_due  # noqa: E402

MODEL_PATHS = ("llm", "chunked")


def tool_call_files(rows: list[dict]) -> set[str]:
    """Files the agent named in its tool calls (what it explored)."""
    calls = [said_from_row(r) for r in rows if r.get("role") == "assistant" and r.get("tool_calls")]
    return set(paths_in([replace(s, text=" ".join(s.calls)) for s in calls]))


def one_transcript(path: Path, model: LocalModel, timeout: float, window: int = 8192) -> dict:
    messages = json.loads(path.read_text())["messages"]
    params = ContextParams(window=window)
    settings = CompactionSettings(timeout_s=timeout)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "a.db")
        thread = store.create_thread(path.stem)
        ids = store.add_messages(thread, messages)
        planner = Planner(params, model.counter(), compaction=settings)
        started = time.perf_counter()
        events = compact_while_due(build_compactor(planner, store, runtime=model), thread)
        seconds = time.perf_counter() - started
        summary = store.latest_summary(thread)
        kept = explored = 0
        if summary is not None:
            covered = [i for i in ids if i <= summary.covers_through_id]
            rows = list(store.messages_by_id(covered).values())
            files = tool_call_files(rows)
            text = ConversationSummary.from_fields(summary.fields).render()
            explored, kept = len(files), sum(1 for f in files if f in text)
        store.close()
    return {"transcript": path.stem, "messages": len(messages),
            "compactions": [{"path": e.path, "outcome": e.outcome, "seconds": e.duration_s,
                             "turns": e.turns_archived, "note": e.error} for e in events],
            "seconds": round(seconds, 1), "files_explored": explored, "files_kept": kept}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transcripts", type=int, default=21, help="the N longest")
    parser.add_argument("--window", type=int, default=8192,
                        help="context.window (a smaller one makes more transcripts compact)")
    parser.add_argument("--timeout", type=float, default=180.0,
                        help="context.summary_timeout_s (the shipped default is 180)")
    args = parser.parse_args()
    model = LocalModel.load(ensure_bundled_model(app_paths().models_dir), n_ctx=8192)
    rows = []
    started = time.perf_counter()
    # the longest first: the short ones never fill the window, so no compaction is due
    paths = sorted((CORPUS / "agent-transcripts").glob("*.json"), key=lambda p: -p.stat().st_size)
    for path in paths[: args.transcripts]:
        rows.append(one_transcript(path, model, args.timeout, args.window))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    model.close()

    print(f"{len(rows)} agent transcripts, window {args.window}, summary cap 768, timeout "
          f"{args.timeout:g} s, model {model.path.name}; {time.perf_counter() - started:.0f} s\n")
    print("| transcript | messages | compactions (path: seconds) | files kept / explored |")
    print("|---|---:|---|---:|")
    for r in rows:
        done = ", ".join(f"{c['path'] or c['outcome']}: {c['seconds']:.0f}" for c in r["compactions"])
        print(f"| {r['transcript']} | {r['messages']} | {done or '–'} | "
              f"{r['files_kept']} / {r['files_explored']} |")
    events = [c for r in rows for c in r["compactions"] if c["outcome"] == "ok"]
    model_path = [c for c in events if c["path"] in MODEL_PATHS]
    seconds = [c["seconds"] for c in events]
    explored = sum(r["files_explored"] for r in rows)
    kept = sum(r["files_kept"] for r in rows)
    notes = sorted({c["note"] for c in events if c["note"]})
    share = len(model_path) / len(events) if events else float("nan")
    print(f"\ncompactions: {len(events)}; written by the model and passing the check: "
          f"{len(model_path)} ({share:.0%})")
    if seconds:
        print(f"seconds per compaction: median {statistics.median(seconds):.1f}, max {max(seconds):.1f}")
    for note in notes[:10]:
        print(f"fallback: {note}")
    print(f"files named in archived tool calls and still in the final summary: {kept} of {explored}")
    print(f"\nagent_summaries: compactions={len(events)} llm_share={share:.3f} "
          f"median_s={statistics.median(seconds) if seconds else float('nan'):.1f} "
          f"max_s={max(seconds) if seconds else float('nan'):.1f} "
          f"files_kept={kept / explored if explored else float('nan'):.3f}")


if __name__ == "__main__":
    main()
