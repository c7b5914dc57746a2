"""``iris-desktop --self-test``: the bundled model answers a factual question correctly,
the predicted prompt size equals the one llama.cpp reports, recall's shipped embedder and
cross-encoder each put the better of two passages for a question first, one context is built;
exit 0. It says where the model ran (``model.gpu``: "GPU: <name> · 25/25 layers" or "CPU",
and why).

It checks an *installation* (the installers run it), so it always tests the bundled
model, and says so when ``model.path`` names another one. The conversation lives in a
temporary data dir, so the user's database is never touched; the bundled model is
assembled once into the real models folder (or found inside a frozen app) and reused.
A broken model file or a broken chat template fails it: the reply must contain the
answer, not just any text.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import time

QUESTION = "What is the capital of France? Answer in one word."
ANSWER = "paris"

#: the reranker's check: a question and two passages, the one that answers it first here
#: (the self-test hands them over the other way round: the order must come from the scores)
RERANK_QUESTION = "What pet did Mel adopt?"
RERANK_BETTER = "5 May 2023. Mel: We finally adopted a little grey kitten from the shelter yesterday."
RERANK_WORSE = "8 May 2023. Caroline: I painted a sunset over the lake last weekend."


def embed_check(host) -> str:
    """Embed once with each shipped embedding model (all-MiniLM-L6-v2, and
    bge-small-en-v1.5, the default), loaded as recall loads it (``Host.load_embedder``, whatever
    ``context.recall_semantic`` and ``context.recall_embedder`` say): of the two passages of
    the reranker's check, the one that answers the question must be the more similar. The
    user's own choice is loaded again afterwards. Returns what it did, for the self-test's
    line; raises RuntimeError, in one sentence, when an embedder cannot load (recall would
    fall back to the other one) or ranks wrongly."""
    from iris_desktop.runtime.embedder import Embedder
    from iris_desktop.runtime.onnx_embedder import OnnxEmbedder

    done = []
    try:
        for name, kind, model in (("minilm", Embedder, "all-MiniLM-L6-v2"),
                                  ("bge-small", OnnxEmbedder, "bge-small-en-v1.5")):
            embedder = host.load_embedder(host.settings.with_overrides({"context.recall_semantic": "true",
                                                                         "context.recall_embedder": name}))
            if not isinstance(embedder, kind):
                # the loader's own sentence, kept by the host ("the log says why" told an
                # installer's user neither where the log is nor what it says)
                why = host.embedder_errors.get(name, "the log says why")
                raise RuntimeError(f"recall's embedding model {model} did not load: {why}")
            started = time.perf_counter()
            question = embedder.embed_query(RERANK_QUESTION)
            worse, better = (float(x) for x in embedder.embed_many([RERANK_WORSE, RERANK_BETTER]) @ question)
            seconds = time.perf_counter() - started
            if not (math.isfinite(worse) and math.isfinite(better)) or better <= worse:
                raise RuntimeError(f"the embedding model {model} found the passage that answers the question less "
                                   f"similar ({better:.2f} against {worse:.2f}): its model file or onnxruntime/"
                                   "llama.cpp is broken")
            done.append(f"embedder {embedder.identity.split('@')[0]} matched 2 passages in {seconds:.2f} s, "
                        f"the better closer ({better:.2f} > {worse:.2f})")
    finally:
        host.load_embedder()
    return "; ".join(done)


def recall_checks(host) -> tuple[str, str]:
    """:func:`embed_check` and :func:`rerank_check`, both run whatever the first says: the
    RuntimeError raised names every one that failed (a broken reranker was not mentioned
    when an embedder had failed too)."""
    done, problems = [], []
    for check in (embed_check, rerank_check):
        try:
            done.append(check(host))
        except RuntimeError as exc:
            problems.append(str(exc))
    if problems:
        raise RuntimeError("; ".join(problems))
    return done[0], done[1]


def rerank_check(host) -> str:
    """Rerank once with the shipped cross-encoder, loaded as recall loads it
    (``Host.load_reranker``, whatever ``context.recall_rerank`` says): two passages, the
    worse one given first, must come back the better one first with a real score each.
    Returns what it did, for the self-test's line; raises RuntimeError, in one sentence,
    when the reranker cannot load or ranks wrongly."""
    settings = host.settings.with_overrides({"context.recall_rerank": "true"})
    reranker = host.load_reranker(settings)
    if reranker is None:
        raise RuntimeError(host.reranker_problem or "recall is not reranked: the reranker did not load")
    started = time.perf_counter()
    scores = [float(x) for x in reranker.score(RERANK_QUESTION, [RERANK_WORSE, RERANK_BETTER])]
    seconds = time.perf_counter() - started
    if len(scores) != 2 or not all(math.isfinite(x) for x in scores) or scores[1] <= scores[0]:
        raise RuntimeError(f"the reranker put the passage that answers the question last (scores "
                           f"{scores}): its model file or onnxruntime is broken")
    return (f"reranker {reranker.identity.split('@')[0]} scored 2 passages in {seconds:.2f} s, "
            f"the better first ({scores[1]:+.2f} > {scores[0]:+.2f})")


#: languages a reply's code is often in: their Pygments lexers are loaded by name at run
#: time, which a frozen app has only if the bundle collected them
LEXERS = ("python", "javascript", "typescript", "bash", "json", "c", "cpp", "rust", "go",
          "java", "sql", "html", "css", "yaml", "toml", "diff")


def missing_lexers() -> list[str]:
    """The languages of LEXERS that Pygments cannot load here."""
    from pygments.lexers import get_lexer_by_name
    from pygments.util import ClassNotFound

    missing = []
    for name in LEXERS:
        try:
            get_lexer_by_name(name)
        except (ClassNotFound, ImportError):
            missing.append(name)
    return missing


def run_self_test(data_dir=None, overrides=None) -> int:
    from iris_desktop.core.events import ReplySaved, TurnFailed
    from iris_desktop.core.turns import TurnOptions
    from iris_desktop.host import Host, bundled_model_path
    from iris_desktop.paths import app_paths
    from iris_desktop.settings import BUNDLED, load_settings

    started = time.perf_counter()
    try:
        paths = app_paths(data_dir)
        configured = load_settings(paths.config_path, cli=overrides or {})["model.path"]
        model_path = bundled_model_path(paths.models_dir)
        if configured != BUNDLED:
            print(f"iris-desktop self-test: testing the bundled model {model_path.name}; "
                  f"model.path ({configured}) is not used by --self-test", flush=True)
        overrides = {**(overrides or {}), "model.path": str(model_path), "model.n_ctx": "2048",
                     "model.temperature": "0", "model.max_tokens": "16"}
        # the model's 8-bit copy (model.q8_weights) goes where the app keeps it, as the
        # bundled model does, not into the temporary data dir: written once, reused by the app
        os.environ.setdefault("IRIS_WEIGHTS_DIR", str(paths.weights_dir))
        with tempfile.TemporaryDirectory(prefix="iris-self-test-") as tmp, \
                Host(tmp, overrides, env={}, compact=False) as host:
            model = host.load_model()
            loaded = time.perf_counter() - started
            thread = host.create_thread("self-test")
            reply = ""
            planner = host.planner()
            for event in host.send(thread, QUESTION, options=TurnOptions(planner=planner)):
                if isinstance(event, ReplySaved):
                    reply = event.text
                elif isinstance(event, TurnFailed):
                    raise RuntimeError(event.text)
            request = planner.plan(host.store, thread)
            embedded, reranked = recall_checks(host)
            stats = host.store.requests(thread)[-1]
            exact = stats["prompt_tokens"] == stats["predicted_prompt_tokens"]
            answered = ANSWER in reply.lower()
            missing = missing_lexers()
            ok = answered and exact and not missing
            problems = ([] if answered else [f"the reply does not contain {ANSWER.title()!r}"]) + (
                [] if exact else ["the predicted prompt size differs from llama.cpp's"]) + (
                [f"code highlighting lacks {', '.join(missing)}"] if missing else [])
            facts = model.describe()
            print(
                f"iris-desktop self-test {'ok' if ok else 'FAILED'}: {model.model_name} "
                f"({model.chat_format.name} format, n_ctx {model.n_ctx}, weights "
                f"{getattr(model, 'weights', 'as published').split(' (')[0]}) loaded in {loaded:.2f} s "
                f"on {facts.device or 'the CPU'} ({facts.device_reason or 'no plan'}); "
                f"asked {QUESTION!r}, replied {reply.strip()[:60]!r}; prompt "
                f"{stats['prompt_tokens']} tokens, predicted {stats['predicted_prompt_tokens']}; "
                f"{embedded}; {reranked}; next context {request.predicted_prompt_tokens}/{request.breakdown.window} "
                f"tokens; {time.perf_counter() - started:.2f} s"
                + ("" if ok else "; " + "; ".join(problems)),
                flush=True,
            )
            return 0 if ok else 1
    except Exception as exc:
        import logging

        from iris_desktop.host import plain_reason

        logging.getLogger("iris.selftest").error("self-test failed", exc_info=True)
        print(f"iris-desktop self-test FAILED: {plain_reason(exc)}", file=sys.stderr)
        return 1
