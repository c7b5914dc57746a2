"""Server vs local: one conversation through llama.cpp's server and through the in-process
model, with the same context engine.

Replays the first ``--turns`` turns of a chat (a LoCoMo chat from ``../shared/corpus``
when present, else ``tests/fixtures/long-chats/synthetic-friends.json``) with the bundled
model: once on ``llama-server`` (started on 127.0.0.1 by ``tests/support/servers.py``, prompt
caching on) through :class:`~iris_desktop.runtime.remote.RemoteRuntime`, once on
``LocalModel``. Each request generates one token, so what is measured is the prompt:
its size, the tokens evaluated and reused, and the time to first token. The corpus
supplies the assistant replies. Compaction, if a turn needs it, is extractive (this
measures prompt processing, not summarization).

    .venv/bin/python bench/server_vs_local.py [--turns 12] [--chat locomo-26] [--window 4096]

The last line is one parseable summary: ``server_vs_local: turns=… same_prompt=…
exact_server=… exact_local=… reused_server=…% reused_local=…% ttft_server_median=…s
ttft_local_median=…s`` (``same_prompt``: turns whose prompt_tokens agree between the
two; ``exact_*``: turns whose predicted prompt equals the reported one; ``reused_*``:
share of prompt tokens taken from the KV cache over the turns after the first).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from iris_desktop.core.config import (
    CompactionSettings,  # noqa: E402
    ContextParams,  # noqa: E402
)
from iris_desktop.core.planner import Planner  # noqa: E402
from iris_desktop.core.store import Store  # noqa: E402
from iris_desktop.generation import GenerationRequest
from iris_desktop.host import build_compactor  # noqa: E402
from iris_desktop.runtime.bundled import ensure_bundled_model  # noqa: E402
from iris_desktop.runtime.model import LocalModel  # noqa: E402
from iris_desktop.runtime.remote import RemoteRuntime  # noqa: E402

from _corpus import CORPUS, REPO  # noqa: E402  (puts tests/ on the path)
from support.servers import CACHE, start_llama_server  # noqa: E402

SYSTEM = "You are Iris, a helpful assistant."


def chat_messages(name: str) -> list[dict]:
    path = CORPUS / "long-chats" / f"{name}.json"
    if not path.is_file():
        path = REPO / "tests" / "fixtures" / "long-chats" / "synthetic-friends.json"
    print(f"chat: {path.name}", file=sys.stderr)
    return json.loads(path.read_text())["messages"]


def pairs_of(messages: list[dict]) -> list[tuple[dict, dict | None]]:
    """(user message, the assistant reply after it or None), in order."""
    pairs = []
    for i, m in enumerate(messages):
        if m["role"] == "user":
            after = messages[i + 1] if i + 1 < len(messages) else None
            pairs.append((m, after if after and after["role"] == "assistant" else None))
    return pairs


def replay(runtime, pairs, window: int, label: str) -> list[dict]:
    """Iris's turns on ``runtime``: plan, send (one token), record, add the reply."""
    rows = []
    params = ContextParams(window=window, system_prompt=SYSTEM)
    planner = Planner(params, runtime.counter(), runtime=runtime,
                      compaction=CompactionSettings(summarizer="extractive"))
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "bench.db")
        thread = store.create_thread("bench")
        compactor = build_compactor(planner, store)
        for n, (user, reply) in enumerate(pairs, start=1):
            store.add_message(thread, user)
            list(compactor.before_request(thread))
            request = planner.plan(store, thread)
            generation = runtime.stream(GenerationRequest(request.messages, max_tokens=1, temperature=0.0))
            generation.text()
            stats = generation.stats
            store.add_request(thread, {"prompt_tokens": stats.prompt_tokens,
                                       "summary_id": request.summary.id if request.summary else None})
            rows.append({"turn": n, "predicted": request.predicted_prompt_tokens,
                         "prompt": stats.prompt_tokens, "evaluated": stats.evaluated_tokens,
                         "reused": stats.reused_tokens, "ttft": stats.time_to_first_token_s})
            print(f"{label} turn {n}: prompt {stats.prompt_tokens}, evaluated "
                  f"{stats.evaluated_tokens}, ttft {stats.time_to_first_token_s:.2f} s",
                  file=sys.stderr, flush=True)
            if reply:
                store.add_message(thread, reply)
            list(compactor.after_reply(thread))
        store.close()
    return rows


def reused_share(rows: list[dict]) -> float:
    later = rows[1:] or rows
    return 100.0 * sum(r["reused"] for r in later) / max(1, sum(r["prompt"] for r in later))


def report(server: list[dict], local: list[dict]) -> None:
    print(f"{'turn':>4} | {'prompt':>6} {'eval':>5} {'reused':>6} {'ttft s':>6} (server) | "
          f"{'prompt':>6} {'eval':>5} {'reused':>6} {'ttft s':>6} (local) | predicted")
    for s, c in zip(server, local, strict=True):
        print(f"{s['turn']:>4} | {s['prompt']:>6} {s['evaluated']:>5} {s['reused']:>6} "
              f"{s['ttft']:>6.2f}          | {c['prompt']:>6} {c['evaluated']:>5} {c['reused']:>6} "
              f"{c['ttft']:>6.2f}         | {s['predicted']} / {c['predicted']}")
    same = sum(s["prompt"] == c["prompt"] for s, c in zip(server, local, strict=True))
    exact_server = sum(r["predicted"] == r["prompt"] for r in server)
    exact_local = sum(r["predicted"] == r["prompt"] for r in local)
    print(f"server_vs_local: turns={len(server)} same_prompt={same} exact_server={exact_server} "
          f"exact_local={exact_local} reused_server={reused_share(server):.1f}% "
          f"reused_local={reused_share(local):.1f}% "
          f"ttft_server_median={statistics.median(r['ttft'] for r in server):.3f}s "
          f"ttft_local_median={statistics.median(r['ttft'] for r in local):.3f}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--chat", default="locomo-26")
    parser.add_argument("--window", type=int, default=4096)
    args = parser.parse_args()
    pairs = pairs_of(chat_messages(args.chat))[: args.turns]
    model = ensure_bundled_model(CACHE / "models")
    with tempfile.TemporaryDirectory() as logs:
        with start_llama_server(model, Path(logs), args.window) as server, \
                RemoteRuntime.connect(server.base_url) as runtime:
            server_rows = replay(runtime, pairs, args.window, "server")
    with LocalModel.load(model, n_ctx=args.window) as local:
        local_rows = replay(local, pairs, args.window, "local")
    report(server_rows, local_rows)


if __name__ == "__main__":
    main()
