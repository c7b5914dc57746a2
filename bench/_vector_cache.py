"""An embedder that remembers: the benches' vectors kept by text between runs.

Embedding the summarized messages is nearly all of a memory bench's time (~45 s of a
LongMemEval file's ~47 s on two cores), and it is the same work on every run while only
the ranking changes. ``CachedEmbedder`` wraps the shipped embedder with the same
``identity``: a text seen before (any run, any file) gets its stored vector back, bit for
bit what the model gave then, so a run with the cache scores exactly as one without.
The cache is a SQLite file keyed by the model's identity and the text's sha256; delete it
to start over. Benches only: the app never caches across stores.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import numpy as np


class CachedEmbedder:
    """``embedder``'s vectors, looked up first in ``path``. Same identity and dimensions."""

    def __init__(self, embedder, path: Path):
        self.embedder = embedder
        self.identity = embedder.identity
        self.dimensions = embedder.dimensions
        self.conn = sqlite3.connect(str(path))
        self.conn.execute("CREATE TABLE IF NOT EXISTS vectors (model TEXT, key BLOB, vector BLOB, "
                          "PRIMARY KEY (model, key))")
        self.hits = self.misses = 0

    def _key(self, text: str) -> bytes:
        return hashlib.sha256(text.encode("utf-8")).digest()

    def embed(self, text: str) -> np.ndarray:
        return self.embed_many([text])[0]

    def embed_query(self, text: str) -> np.ndarray:
        """A question's vector, from the model itself (few, and a model may read a question
        differently from a passage)."""
        return self.embedder.embed_query(text)

    def embed_many(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        missing = []
        for row, text in enumerate(texts):
            found = self.conn.execute("SELECT vector FROM vectors WHERE model = ? AND key = ?",
                                      (self.identity, self._key(text))).fetchone()
            if found is None:
                missing.append(row)
            else:
                out[row] = np.frombuffer(found[0], dtype="<f4")
        self.hits += len(texts) - len(missing)
        self.misses += len(missing)
        if missing:
            vectors = self.embedder.embed_many([texts[row] for row in missing])
            with self.conn:
                for row, vector in zip(missing, vectors):
                    out[row] = vector
                    self.conn.execute("INSERT OR REPLACE INTO vectors VALUES (?, ?, ?)",
                                      (self.identity, self._key(texts[row]),
                                       np.asarray(vector, dtype="<f4").tobytes()))
        return out

    def close(self) -> None:
        self.conn.close()
        self.embedder.close()
