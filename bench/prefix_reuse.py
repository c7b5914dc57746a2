"""KV-cache prefix reuse: Iris's requests against a rolling-window client, same Llama.

Replays a LoCoMo chat from the corpus turn by turn with the bundled model at n_ctx 8192.
Each request generates one token, so what is measured is the prompt: tokens evaluated
and time to first token. The corpus supplies the assistant replies.

- Iris, as the app runs it: the context engine (stable prefix; background compaction
  right after a reply when the next request would be due, extractive path here so the
  benchmark measures prompt processing, not summarization), and the work done while the
  user reads and types: after a compaction the new prefix is warmed up, and the draft's
  request (with its recall block) is prefilled. That work gets ``--idle`` seconds of
  wall time per turn (the user's reading and typing); whatever it has not finished then
  is left to the send, which is what the time to first token measures.
- Iris without idle work: the same requests, nothing evaluated between turns (what the
  send costs when the user fires messages back to back).

Each client has its own copy of the model (its own KV cache), and their turns are
interleaved, so the load of a shared machine weighs on all three alike.
- Rolling window: drops the oldest turn until the prompt fits the same budget, as LM
  Studio's "rolling window" and Ollama's front cut do; its prefix changes every turn
  once the window is full. It reads the GGUF as published, as those clients do; the
  Iris clients load it as the app does (``model.q8_weights``: the exact Q8_0 copy of
  its Q5_0 weights; ``--weights as-published`` for the file itself).

    .venv/bin/python bench/prefix_reuse.py [--turns 100] [--skip 80] [--idle 5]
        [--compare-recall 1024]

With --compare-recall, a fourth client (Iris with idle work at that recall size) runs
interleaved with the others, and the question turns of the two Iris clients with idle
work are compared: recall tokens, tokens evaluated at send, time to first token.

With --skip 80 the first 80 turns are already history when the measured session starts,
so the window is full from the first measured request. That history is left as the app
would leave it (compacted in the background as it grew; each client's cache holding its
last prompt, as a thread that is open or restored from its saved state), not timed.
Every measured turn counts,
compaction turns and question turns (with a recall block) included. The last line is
one parseable summary: ``prefix_reuse: turns=… median_ratio=… p95_ratio=… max_ratio=…``
(Iris with idle work against the rolling client's median).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
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

from _corpus import CORPUS  # noqa: E402

SYSTEM = "You are Iris, a helpful assistant running locally and offline on the user's computer."
RECALL_DEFAULT = lookup("context.recall_max_tokens").default
KV_SHIFT_DEFAULT = lookup("model.kv_shift").default
Q8_WEIGHTS_DEFAULT = lookup("model.q8_weights").default


def turns_of(messages: list[dict]) -> list[tuple[dict, dict | None]]:
    pairs = []
    for i, m in enumerate(messages):
        if m["role"] == "user":
            reply = messages[i + 1] if i + 1 < len(messages) and messages[i + 1]["role"] == "assistant" else None
            pairs.append((m, reply))
    return pairs


def one_token(model: LocalModel, messages: list[dict]):
    generation = model.stream(GenerationRequest(messages, max_tokens=1, temperature=0.0))
    generation.text()
    return generation.stats


class Deadline:
    """A cancel flag that is set once ``seconds`` of wall time have passed."""

    def __init__(self, seconds: float):
        self.at = time.perf_counter() + seconds

    def is_set(self) -> bool:
        return time.perf_counter() >= self.at


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def run_iris(model, pairs, window, skip=0, recall=RECALL_DEFAULT, idle: float | None = None,
             embedder=None, reranker=None):
    """Iris's turns, one measured row at a time; with ``idle`` (seconds), the warm-up
    after a compaction and the draft's prefill run before each send, within that much
    wall time. With ``embedder`` and ``reranker``, recall as the app ships it (the draft's
    ranking, cross-encoder included, is part of the idle work; the new messages' vectors
    are added after each turn, not timed, as the app adds them on its database thread)."""
    counter = model.counter()
    params = ContextParams(window=window, system_prompt=SYSTEM, recall_max_tokens=recall)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "bench.db")
        thread = store.create_thread("bench")
        planner = Planner(params, counter, embedder=embedder, reranker=reranker)

        def index() -> None:
            if embedder is not None:
                while planner.index(store).index_pending(limit=256):
                    pass
        compactor = build_compactor(planner, store)
        previous_prompt = 0
        compacted = False
        warm = None  # the request to warm up after a compaction
        for n, (user, reply) in enumerate(pairs, start=1):
            if n <= skip:  # history that exists before the measured session
                store.add_message(thread, user)
                if reply:
                    store.add_message(thread, reply)
                if n == skip:
                    index()
                    settle_history(compactor, planner, store, thread, model)
                continue
            idle_work = {"warmed": 0, "prefilled": 0, "idle_s": 0.0}
            if idle is not None:  # the user reads the reply, then types this message
                started = time.perf_counter()
                deadline = Deadline(idle)
                if warm is not None:
                    idle_work["warmed"] = model.prefill(warm.messages, cancel=deadline).run().evaluated_tokens
                if not deadline.is_set():
                    draft = planner.plan(store, thread, user["content"])
                    idle_work["prefilled"] = model.prefill(
                        draft.messages, cancel=deadline).run().evaluated_tokens
                idle_work["idle_s"] = time.perf_counter() - started
            store.add_message(thread, user)
            events = list(compactor.before_request(thread))
            compacted = compacted or any(
                isinstance(e, CompactionFinished) and e.event.outcome == "ok" for e in events)
            request = planner.plan(store, thread)
            stats = one_token(model, request.messages)
            store.add_request(thread, {"prompt_tokens": stats.prompt_tokens,
                                       "summary_id": request.summary.id if request.summary else None})
            row = {
                "turn": n, "prompt": stats.prompt_tokens, "evaluated": stats.evaluated_tokens,
                "reused": stats.reused_tokens, "ttft": stats.time_to_first_token_s,
                "new": max(stats.prompt_tokens - previous_prompt, 0), "compacted": compacted,
                "predicted": request.predicted_prompt_tokens,
                "recall": request.breakdown.recall, **idle_work,
            }
            previous_prompt = stats.prompt_tokens
            print(f"iris{'' if idle is None else ' idle'} turn {n}: prompt {stats.prompt_tokens}, "
                  f"evaluated {stats.evaluated_tokens}", file=sys.stderr, flush=True)
            if reply:
                store.add_message(thread, reply)
            index()
            # background compaction after the reply, as the agent does; the app then
            # warms the new prefix up (here: in the next turn's idle time)
            events = list(compactor.after_reply(thread))
            compacted = any(isinstance(e, CompactionFinished) and e.event.outcome == "ok"
                            for e in events)
            warm = planner.plan(store, thread) if compacted else None
            yield row
        store.close()


def settle_history(compactor, planner, store, thread, model) -> None:
    """The chat as the app leaves it before the measured session: compacted in the
    background as it grew (at most one summary per ten turns here), and the thread's
    prefix in the KV cache (open, or restored from its saved state: ``bench/resume.py``
    measures that). Not timed."""
    for _ in range(1 + len(store.messages(thread)) // 20):
        events = list(compactor.after_reply(thread))
        if not any(isinstance(e, CompactionFinished) and e.event.outcome == "ok" for e in events):
            break
    model.prefill(planner.plan(store, thread).messages).run()


def run_rolling(model, pairs, window, skip=0):
    """The rolling-window client's turns, one measured row at a time."""
    counter = model.counter()
    budget = math.floor(window * 0.70)
    system = {"role": "system", "content": SYSTEM}
    history: list[list[dict]] = []
    dropped = 0
    for n, (user, reply) in enumerate(pairs, start=1):
        history.append([user])
        def size() -> int:
            return counter.prompt_overhead() + counter.count_message(system) + sum(
                counter.count_message(m) for turn in history for m in turn)
        while size() > budget and len(history) > 1:
            history.pop(0)  # silently drop the oldest turn
            dropped += 1
        if n <= skip:
            if reply:
                history[-1].append(reply)
            if n == skip:  # its cache holds the prompt it sent last, as Iris's does
                model.prefill([system, *(m for turn in history for m in turn)]).run()
            continue
        messages = [system, *(m for turn in history for m in turn)]
        stats = one_token(model, messages)
        print(f"rolling turn {n}: prompt {stats.prompt_tokens}, evaluated {stats.evaluated_tokens}",
              file=sys.stderr, flush=True)
        if reply:
            history[-1].append(reply)
        yield {"turn": n, "prompt": stats.prompt_tokens, "evaluated": stats.evaluated_tokens,
               "reused": stats.reused_tokens, "ttft": stats.time_to_first_token_s,
               "dropped": dropped}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--skip", type=int, default=80,
                        help="turns that are already history when the measured session starts")
    parser.add_argument("--chat", default="locomo-26")
    parser.add_argument("--window", type=int, default=8192)
    parser.add_argument("--recall", type=int, default=RECALL_DEFAULT,
                        help=f"context.recall_max_tokens for Iris (the shipped default is {RECALL_DEFAULT})")
    parser.add_argument("--idle", type=float, default=5.0,
                        help="seconds the user reads and types between turns (idle work)")
    parser.add_argument("--kv-shift", choices=["on", "off"], default=None,
                        help="model.kv_shift for the Iris clients (default: the shipped setting, "
                             f"{'on' if KV_SHIFT_DEFAULT else 'off'})")
    parser.add_argument("--weights", choices=["q8", "as-published"],
                        default="q8" if Q8_WEIGHTS_DEFAULT else "as-published",
                        help="the Iris clients' weights: q8 (model.q8_weights, the shipped default: "
                             "the exact Q8_0 copy of the model's Q5_0 weights) or the file as "
                             "published (the rolling client always reads it as published)")
    parser.add_argument("--recall-models", action="store_true",
                        help="the Iris clients recall as the app ships it: by meaning too (the "
                             "embedding model) and reranked (the cross-encoder); default: bm25 only, "
                             "as the earlier runs")
    parser.add_argument("--compare-recall", type=int, default=None, metavar="TOKENS",
                        help="also run Iris with idle work at this context.recall_max_tokens, "
                             "side by side, and compare the question turns")
    args = parser.parse_args()
    import json

    messages = json.loads((CORPUS / "long-chats" / f"{args.chat}.json").read_text())["messages"]
    pairs = turns_of(messages)[: args.turns]
    # one model (and KV cache) per client, turns interleaved, so the machine's load
    # (shared with other jobs) weighs on the three clients alike
    path = ensure_bundled_model(app_paths().models_dir)
    compare = args.compare_recall is not None
    kv_shift = KV_SHIFT_DEFAULT if args.kv_shift is None else args.kv_shift == "on"
    # the rolling client (models[2]) is a plain llama.cpp client: it never shifts and
    # reads the file as published; the Iris clients load it as the app does
    # (model.q8_weights: the exact Q8_0 copy of its Q5_0 weights, unless --weights as-published)
    weights_dir = app_paths().weights_dir if args.weights == "q8" else None
    models = [LocalModel.load(path, n_ctx=args.window, kv_shift=kv_shift and i != 2,
                              weights_dir=None if i == 2 else weights_dir)
              for i in range(4 if compare else 3)]
    model = models[0]
    embedder = reranker = None
    if args.recall_models:
        from iris_desktop.runtime.embedder import load_recall_embedder
        from iris_desktop.runtime.reranker import CrossEncoder

        # the embedder recall ships with (context.recall_embedder's default)
        embedder = load_recall_embedder(lookup("context.recall_embedder").default, app_paths().models_dir)
        reranker = CrossEncoder.load()
    recall_models = {"embedder": embedder, "reranker": reranker}
    iris, cold, rolling, other = [], [], [], []
    clients = [run_iris(models[0], pairs, args.window, args.skip, args.recall, idle=args.idle, **recall_models),
               run_iris(models[1], pairs, args.window, args.skip, args.recall, **recall_models),
               run_rolling(models[2], pairs, args.window, args.skip)]
    if compare:
        clients.append(run_iris(models[3], pairs, args.window, args.skip, args.compare_recall,
                                idle=args.idle, **recall_models))
    try:
        for a, c, b, *o in zip(*clients):
            iris.append(a)
            cold.append(c)
            rolling.append(b)
            other.extend(o)
    finally:
        for m in models:
            m.close()
        for part in (embedder, reranker):
            if part is not None:
                part.close()

    full_from = next((r["turn"] for r in rolling if r["dropped"]), None)
    print(f"chat {args.chat}, turns {args.skip + 1}–{len(pairs)} measured (turns 1–{args.skip} "
          f"already history), window {args.window}, model {model.path.name}, idle time "
          f"{args.idle:g} s per turn, model.kv_shift {'on' if kv_shift else 'off'}, Iris's recall "
          f"{'by words, meaning and the reranker (as shipped)' if args.recall_models else 'by words (bm25) only'}"
          f", its weights "
          f"{models[0].weights}; the rolling client's {models[2].weights}")
    print(f"rolling window starts dropping turns at turn {full_from}\n")
    print("| turn | Iris prompt | Iris evaluated at send | Iris TTFT (s) | warmed / prefilled "
          "while idle | Iris without idle work: evaluated, TTFT (s) | rolling evaluated "
          "| rolling TTFT (s) | note |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for a, c, b in zip(iris, cold, rolling):
        notes = [n for n, on in (("first request after a compaction", a["compacted"]),
                                 (f"question: recall {a['recall']} tokens", a["recall"])) if on]
        print(f"| {a['turn']} | {a['prompt']:,} | {a['evaluated']:,} | {a['ttft']:.3f} | "
              f"{a['warmed']:,} / {a['prefilled']:,} | {c['evaluated']:,}, {c['ttft']:.3f} | "
              f"{b['evaluated']:,} | {b['ttft']:.3f} | {'; '.join(notes)} |")

    # every measured turn counts; the rolling client's first request is cold like all
    # of its requests once it drops turns
    roll_median = statistics.median(b["ttft"] for b in rolling)
    print(f"\nrolling client: median time to first token {roll_median:.3f} s over "
          f"{len(rolling)} turns (median evaluated {statistics.median(b['evaluated'] for b in rolling):,.0f})")
    print("\n| client | median TTFT (s) | p95 TTFT (s) | max TTFT (s) | median / p95 / max "
          "vs rolling median |")
    print("|---|---:|---:|---:|---|")
    ratios = {}
    for name, rows in (("Iris, idle work", iris), ("Iris, no idle work", cold),
                       ("rolling window", rolling)):
        ttft = [r["ttft"] for r in rows]
        med, p95, top = statistics.median(ttft), percentile(ttft, 95), max(ttft)
        ratios[name] = (med / roll_median, p95 / roll_median, top / roll_median)
        print(f"| {name} | {med:.3f} | {p95:.3f} | {top:.3f} | "
              + " / ".join(f"{x:.3f}×" for x in ratios[name]) + " |")
    idle_used = [a["idle_s"] for a in iris]
    print(f"\nidle work per turn: median {statistics.median(idle_used):.2f} s, max "
          f"{max(idle_used):.2f} s of the {args.idle:g} s allowed; warm-ups "
          f"{sum(1 for a in iris if a['warmed'])}, prefills {sum(1 for a in iris if a['prefilled'])}")
    over = [a for a in cold[1:] if not a["compacted"] and a["evaluated"] > a["new"] + 2]
    print(f"Iris turns without idle work (outside compaction) that evaluated more than the "
          f"new tokens: {len(over)}")
    comp = [a for a in iris if a["compacted"]]
    print(f"Iris compactions: {len(comp)}; evaluated at the send after each, with idle work: "
          + ", ".join(f"{a['evaluated']:,}" for a in comp) + "; without: "
          + ", ".join(f"{c['evaluated']:,}" for a, c in zip(iris, cold) if a["compacted"]))
    mismatched = [a for a in iris if a["prompt"] != a["predicted"]]
    print(f"Iris predicted == reported prompt tokens on {len(iris) - len(mismatched)}/{len(iris)} turns")
    if compare:
        compare_recall(iris, other, args.recall, args.compare_recall)
    med, p95, top = ratios["Iris, idle work"]
    print(f"\nprefix_reuse: turns={len(iris)} idle_s={args.idle:g} kv_shift={'on' if kv_shift else 'off'} "
          f"weights={args.weights} recall_models={'on' if args.recall_models else 'off'} "
          f"median_ratio={med:.3f} "
          f"p95_ratio={p95:.3f} max_ratio={top:.3f}")


def compare_recall(iris: list[dict], other: list[dict], recall: int, compared: int) -> None:
    """The question turns of two Iris clients (both with idle work) that differ only in
    ``context.recall_max_tokens``, side by side."""
    rows = [(a, o) for a, o in zip(iris, other) if a["recall"] or o["recall"]]
    print(f"\nquestion turns, recall up to {recall:,} against up to {compared:,} tokens "
          "(both with idle work):\n")
    print(f"| turn | recall ({recall:,}) | evaluated at send | TTFT (s) | recall ({compared:,}) "
          "| evaluated at send | TTFT (s) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for a, o in rows:
        print(f"| {a['turn']} | {a['recall']:,} | {a['evaluated']:,} | {a['ttft']:.3f} | "
              f"{o['recall']:,} | {o['evaluated']:,} | {o['ttft']:.3f} |")
    if not rows:
        return
    ttft = statistics.median(a["ttft"] for a, _ in rows)
    ttft_other = statistics.median(o["ttft"] for _, o in rows)
    tokens = sum(a["recall"] for a, _ in rows) / sum(o["recall"] for _, o in rows)
    print(f"\nprefix_reuse_recall: question_turns={len(rows)} recall_ratio={tokens:.3f} "
          f"median_ttft_s={ttft:.3f} median_ttft_compared_s={ttft_other:.3f} "
          f"ttft_ratio={ttft / ttft_other:.3f}")


if __name__ == "__main__":
    main()
