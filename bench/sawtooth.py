"""The sawtooth: prompt tokens per request over a long chat, with compactions marked.

Replays a LoCoMo chat as a live session on the bundled model with an 8,192 window: each
user message is sent (one generated token; the corpus supplies the reply), compaction
runs before a request when due and right after a reply when the next request would be
(background compaction). Prints the series and saves docs/img/sawtooth.png.

    .venv/bin/python bench/sawtooth.py [--chat locomo-26] [--llm]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from iris_desktop.core.config import ContextParams  # noqa: E402
from iris_desktop.core.events import CompactionFinished  # noqa: E402
from iris_desktop.core.planner import Planner  # noqa: E402
from iris_desktop.core.store import Store  # noqa: E402
from iris_desktop.generation import GenerationRequest
from iris_desktop.host import build_compactor  # noqa: E402
from iris_desktop.paths import app_paths  # noqa: E402
from iris_desktop.runtime.bundled import ensure_bundled_model  # noqa: E402
from iris_desktop.runtime.model import LocalModel  # noqa: E402
from iris_desktop.settings import lookup  # noqa: E402

from _corpus import CORPUS, REPO  # noqa: E402

SYSTEM = "You are Iris, a helpful assistant running locally and offline on the user's computer."
RECALL_DEFAULT = lookup("context.recall_max_tokens").default


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chat", default="locomo-26")
    parser.add_argument("--window", type=int, default=8192)
    parser.add_argument("--llm", action="store_true", help="LLM summaries (slow); default extractive")
    parser.add_argument("--recall", type=int, default=RECALL_DEFAULT,
                        help=f"context.recall_max_tokens for Iris (the shipped default is {RECALL_DEFAULT})")
    parser.add_argument("--plot", default=str(REPO / "docs" / "img" / "sawtooth.png"))
    args = parser.parse_args()

    data = json.loads((CORPUS / "long-chats" / f"{args.chat}.json").read_text())
    model = LocalModel.load(ensure_bundled_model(app_paths().models_dir), n_ctx=args.window)
    counter = model.counter()
    params = ContextParams(window=args.window, system_prompt=SYSTEM, recall_max_tokens=args.recall)
    series: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "s.db")
        thread = store.create_thread(args.chat)
        planner = Planner(params, counter)
        compactor = build_compactor(planner, store, runtime=model if args.llm else None)
        messages = data["messages"]
        for i, message in enumerate(messages):
            store.add_message(thread, message)
            if message["role"] != "user":
                continue
            before = [e.event for e in compactor.before_request(thread)
                      if isinstance(e, CompactionFinished)]
            request = planner.plan(store, thread)
            generation = model.stream(GenerationRequest(request.messages, max_tokens=1, temperature=0.0))
            generation.text()
            stats = generation.stats
            store.add_request(thread, {
                "prompt_tokens": stats.prompt_tokens,
                "predicted_prompt_tokens": request.predicted_prompt_tokens,
                "summary_id": request.summary.id if request.summary else None,
            })
            reply = messages[i + 1] if i + 1 < len(messages) and messages[i + 1]["role"] == "assistant" else None
            after = []
            if reply is not None:
                store.add_message(thread, reply)
                after = [e.event for e in compactor.after_reply(thread)
                         if isinstance(e, CompactionFinished)]
                messages = messages  # the reply is consumed here, skip it in the loop
            series.append({
                "request": len(series) + 1, "prompt_tokens": stats.prompt_tokens,
                "predicted": request.predicted_prompt_tokens, "evaluated": stats.evaluated_tokens,
                "compaction_before": [e.trigger for e in before],
                "compaction_after": [e.trigger for e in after],
                "outcomes": [e.outcome for e in before + after],
            })
        events = store.compaction_events(thread)
        store.close()
    model.close()

    threshold = int(args.window * 0.75)
    budget = int(args.window * 0.70)
    print(f"chat {args.chat}: {len(series)} requests, window {args.window}, threshold {threshold}, "
          f"summaries {'LLM' if args.llm else 'extractive'}\n")
    print("| request | prompt tokens | evaluated | compaction |")
    print("|---:|---:|---:|---|")
    for row in series:
        marks = [f"before ({t})" for t in row["compaction_before"]] + [
            f"after ({t})" for t in row["compaction_after"]]
        if marks or row["request"] % 10 == 0:
            print(f"| {row['request']} | {row['prompt_tokens']:,} | {row['evaluated']:,} | "
                  f"{', '.join(marks)} |")
    prompts = [r["prompt_tokens"] for r in series]
    ok = [e for e in events if e["outcome"] == "ok"]
    print(f"\ncompactions: {len(ok)} ok, {len(events) - len(ok)} failed; triggers: "
          + ", ".join(f"{t} {sum(e['trigger'] == t for e in events)}"
                      for t in sorted({e['trigger'] for e in events})))
    print(f"prompt tokens: max {max(prompts):,}, median {statistics.median(prompts):,.0f}, "
          f"never above the threshold: {max(prompts) < threshold}")
    if ok:
        drops = [e["tokens_before"] - e["tokens_after"] for e in ok]
        print(f"tooth height (tokens removed per compaction): median {statistics.median(drops):,.0f}")
    exact = sum(r["prompt_tokens"] == r["predicted"] for r in series)
    print(f"predicted == reported prompt tokens on {exact}/{len(series)} requests")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4), dpi=110)
    ax.plot([r["request"] for r in series], prompts, lw=1.4, label="prompt tokens (reported)")
    for row in series:
        if row["compaction_before"] or row["compaction_after"]:
            ax.axvline(row["request"], color="tab:orange", lw=0.6, alpha=0.5)
    ax.axhline(threshold, color="tab:red", ls="--", lw=1, label=f"compaction threshold ({threshold:,})")
    ax.axhline(budget, color="tab:gray", ls=":", lw=1, label=f"history budget line ({budget:,})")
    ax.set_xlabel("request")
    ax.set_ylabel("tokens")
    ax.set_title(f"Iris on {args.chat}, {args.window:,}-token window (orange: compactions)")
    ax.set_ylim(0, args.window)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.plot)
    print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
