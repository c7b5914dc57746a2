"""``iris-desktop --self-test``: the bundled model answers, one context is built, exit 0.

Used by the installers' smoke tests. The conversation lives in a temporary data dir, so
the user's database is never touched; the bundled model is written once into the real
models folder (or found inside a frozen app) and reused.
"""

from __future__ import annotations

import sys
import tempfile
import time


def run_self_test(data_dir=None, overrides=None) -> int:
    from iris_desktop.core.events import ReplySaved, TurnFailed
    from iris_desktop.core.session import Session, bundled_model_path
    from iris_desktop.paths import app_paths

    started = time.perf_counter()
    try:
        model_path = bundled_model_path(app_paths(data_dir).models_dir)
        overrides = {**(overrides or {}), "model.path": str(model_path), "model.n_ctx": "2048",
                     "model.temperature": "0", "model.max_tokens": "16"}
        with tempfile.TemporaryDirectory(prefix="iris-self-test-") as tmp, \
                Session(tmp, overrides, env={}) as session:
            model = session.load_model()
            loaded = time.perf_counter() - started
            thread = session.store.create_thread("self-test")
            reply = ""
            planner = session.planner()
            for event in planner.agent(session.store).send(thread, "The capital of France is"):
                if isinstance(event, ReplySaved):
                    reply = event.text
                elif isinstance(event, TurnFailed):
                    raise RuntimeError(event.text)
            request = planner.plan(session.store, thread)
            stats = session.store.requests(thread)[-1]
            exact = stats["prompt_tokens"] == stats["predicted_prompt_tokens"]
            ok = bool(reply.strip()) and exact
            print(
                f"iris-desktop self-test {'ok' if ok else 'FAILED'}: {model.path.name} "
                f"({model.chat_format.name} format, n_ctx {model.n_ctx}) loaded in {loaded:.2f} s; "
                f"reply {reply.strip()[:40]!r}; prompt {stats['prompt_tokens']} tokens, "
                f"predicted {stats['predicted_prompt_tokens']}; next context "
                f"{request.predicted_prompt_tokens}/{request.breakdown.window} tokens; "
                f"{time.perf_counter() - started:.2f} s",
                flush=True,
            )
            return 0 if ok else 1
    except Exception as exc:
        print(f"iris-desktop self-test FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
