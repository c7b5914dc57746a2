"""Resuming a thread: its saved KV state against a cold start, same model, same run.

A long LoCoMo chat is imported and compacted into the window as the app would, then:

1. the thread is opened and its request evaluated (the cache now holds its prefix);
2. the user switches to another thread, which fills the live KV cache with that thread's
   prompt, so the first thread's state exists only on disk (``runtime.kv_store``);
3. the user comes back and sends a new message: **restored** is the time from entering
   the thread (reading and loading its state file) to the first token;
4. **cold** is the same request with nothing restored (the live cache holds the other
   thread): the whole prompt is evaluated;
5. **after a restart**: the model is closed and loaded again (a new process would do the
   same), the state file restored, and the same request sent (load time excluded).

Tokens evaluated are counted, not just timed. The last line is one parseable summary:
``resume: restored_s=… cold_s=… ratio=…``.

    .venv/bin/python bench/resume.py [--chat locomo-26] [--turns 120] [--window 8192]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from iris_desktop.core.config import ContextParams  # noqa: E402
from iris_desktop.core.planner import Planner  # noqa: E402
from iris_desktop.core.store import Store  # noqa: E402
from iris_desktop.generation import GenerationRequest
from iris_desktop.host import build_compactor  # noqa: E402
from iris_desktop.paths import app_paths  # noqa: E402
from iris_desktop.runtime.bundled import ensure_bundled_model  # noqa: E402
from iris_desktop.runtime.kv_store import KVStateStore, ThreadCache  # noqa: E402
from iris_desktop.runtime.model import LocalModel  # noqa: E402

from _corpus import CORPUS, compact_while_due, locomo_messages  # noqa: E402

SYSTEM = "You are Iris, a helpful assistant running locally and offline on the user's computer."
QUESTION = {"role": "user", "content": "Thanks! Could you sum up in one sentence what we just discussed?"}


def first_token(model: LocalModel, messages: list[dict]):
    generation = model.stream(GenerationRequest(messages, max_tokens=1, temperature=0.0))
    generation.text()
    return generation.stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chat", default="locomo-26")
    parser.add_argument("--other", default="locomo-30", help="the thread switched to")
    parser.add_argument("--turns", type=int, default=240, help="messages of history per thread")
    parser.add_argument("--window", type=int, default=8192)
    parser.add_argument("--kv-cache-mb", type=int, default=1024)
    args = parser.parse_args()
    model_path = ensure_bundled_model(app_paths().models_dir)
    model = LocalModel.load(model_path, n_ctx=args.window)
    counter = model.counter()
    params = ContextParams(window=args.window, system_prompt=SYSTEM)
    planner = Planner(params, counter)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "resume.db")
        threads = {}
        for name in (args.chat, args.other):
            data = json.loads((CORPUS / "long-chats" / f"{name}.json").read_text())
            thread = store.create_thread(name)
            store.add_messages(thread, locomo_messages(data)[: args.turns])
            compact_while_due(build_compactor(planner, store), thread)
            threads[name] = thread
        a, b = threads[args.chat], threads[args.other]
        kv = KVStateStore(Path(tmp) / "kv-cache", args.kv_cache_mb * 2**20)
        cache = ThreadCache(kv, model)

        cache.enter(a)  # 1. the thread is open, its prompt evaluated
        first_token(model, planner.plan(store, a).messages)
        cache.enter(b)  # 2. another thread: A's state is saved, the live cache is B's
        first_token(model, planner.plan(store, b).messages)
        saved = kv.path_for(model, a)
        state_mb = saved.stat().st_size / 1e6 if saved.is_file() else 0.0

        store.add_message(a, QUESTION)  # 3. back to A with a new message
        request = planner.plan(store, a)
        started = time.perf_counter()
        restored_tokens = cache.enter(a)
        restore_s = time.perf_counter() - started
        restored = first_token(model, request.messages)
        restored_s = restore_s + restored.time_to_first_token_s

        cache.enter(b)  # 4. cold: the live cache holds B, nothing restored for A
        first_token(model, planner.plan(store, b).messages)
        cache.thread_id = None  # forget B without saving over A's file
        kv.forget(a)
        cold = first_token(model, request.messages)

        # 5. after a restart: save A as it is now, load the model again, restore
        cache = ThreadCache(kv, model)
        cache.thread_id = a
        cache.leave()
        model.close()
        model = LocalModel.load(model_path, n_ctx=args.window)
        cache = ThreadCache(kv, model)
        started = time.perf_counter()
        restarted_tokens = cache.enter(a)
        restart_restore_s = time.perf_counter() - started
        restarted = first_token(model, request.messages)
        restarted_s = restart_restore_s + restarted.time_to_first_token_s
        model.close()
        store.close()

    print(f"chat {args.chat} ({args.turns} messages, compacted into window {args.window}), "
          f"model {model_path.name}; state file {state_mb:.1f} MB\n")
    print("| start | tokens restored | tokens evaluated | restore (s) | time to first token (s) | vs cold |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, tokens, stats, extra, total in (
            ("restored from the saved state", restored_tokens, restored, restore_s, restored_s),
            ("after a restart, restored", restarted_tokens, restarted, restart_restore_s, restarted_s),
            ("cold (whole prompt)", 0, cold, 0.0, cold.time_to_first_token_s)):
        print(f"| {name} | {tokens:,} | {stats.evaluated_tokens:,} of {stats.prompt_tokens:,} | "
              f"{extra:.3f} | {total:.3f} | {total / cold.time_to_first_token_s:.3f}× |")
    print(f"\nresume: restored_s={restored_s:.3f} cold_s={cold.time_to_first_token_s:.3f} "
          f"ratio={restored_s / cold.time_to_first_token_s:.3f} restart_ratio="
          f"{restarted_s / cold.time_to_first_token_s:.3f} evaluated={restored.evaluated_tokens} "
          f"prompt={restored.prompt_tokens}")


if __name__ == "__main__":
    main()
