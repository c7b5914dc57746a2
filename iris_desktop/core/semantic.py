"""Semantic recall: message vectors in SQLite, searched by brute force with numpy.

Each user or assistant message with text gets one unit-length vector from the embedding
model (:mod:`iris_desktop.runtime.embedder`), stored in the ``messages`` database (the
store's schema 7, read and written through :mod:`iris_desktop.core.store.vectors`):

    message_vectors(message_id → messages(id) ON DELETE CASCADE, model, vector BLOB)

``model`` is the embedder's ``identity`` (model name and file hash). A vector written by
another model is *stale*: the message is pending again until the current model embeds it,
and the stale vector stays beside the new one. Vectors are float32, little-endian, 384 × 4
bytes each.

**A change of embedder.** Given the ``previous`` embedder too, a search of a thread whose
messages the current model has not all embedded yet searches the previous model's vectors
instead (with the previous model's vector of the question), so recall by meaning keeps
working while the new vectors are made in the background; once the current model's
vectors reach further, it takes over. :meth:`SemanticIndex.finish_change` drops the old
vectors when no message needs them any more.

:meth:`SemanticIndex.index_pending` embeds what is pending in small batches, oldest
first, and runs in the background after each message; :meth:`SemanticIndex.search` ranks
a thread's messages by cosine similarity to a question (a paraphrase that shares no word
with it still ranks: "what pets does she have?" → "I adopted a kitten"). A message not
embedded yet is simply not in this ranking; the lexical one still finds it.

**The floor.** Everything here works above a per-thread *floor*: the newest message id
such that every eligible message up to it has a current vector and none is still being
written. Messages are append-only and only a streaming reply's text changes, so the floor
only rises, and each search or pending scan reads only what lies above it: the id index
of ``messages`` keeps that cheap on a 100k-message thread, where checking every message
for its vector takes ~140 ms. Each thread's matrix cache holds exactly the vectors up to
its floor and grows by appending what the floor passes. A vector removed behind the floor
(another model's indexer replacing it) is not noticed until a new :class:`SemanticIndex`.

No Qt and no llama.cpp here: the embedder is any object with the :class:`TextEmbedder`
shape.
"""

from __future__ import annotations

import logging
import re
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from iris_desktop.core.records import said_from_row
from iris_desktop.core.store import Store
from iris_desktop.core.store.errors import keep_cache

log = logging.getLogger("iris.semantic")

__all__ = ["SemanticIndex", "TextEmbedder", "strip_names"]

#: messages embedded per transaction: ~70 ms of embedding, so a cancel is heard quickly
#: and the write lock is held only for the insert
BATCH = 8
#: threads whose matrices stay in memory (a 100k-message thread's is 154 MB)
MAX_CACHED_THREADS = 2
_BLOCK_ROWS = 4096  # vectors read, and kept, together (6 MB)


class TextEmbedder(Protocol):
    """What :class:`SemanticIndex` needs of an embedder (runtime.embedder.Embedder)."""

    identity: str
    dimensions: int

    def embed(self, text: str) -> np.ndarray: ...

    def embed_query(self, text: str) -> np.ndarray: ...

    def embed_many(self, texts: Sequence[str]) -> np.ndarray: ...


def strip_names(text: str, names: Iterable[str]) -> str:
    """``text`` without the words of ``names`` (whole words, any case, with a possessive
    's): who speaks is not what is said, and a name in the question pulls every message
    that mentions it up the ranking (recall@5 on the long-chat probes: 0.17 → 0.55
    without them)."""
    words = sorted({w for name in names for w in re.findall(r"\w+", name) if len(w) > 1},
                   key=len, reverse=True)
    if not words:
        return " ".join(text.split())
    pattern = re.compile(r"\b(?:" + "|".join(map(re.escape, words)) + r")(?:['’]s)?\b", re.IGNORECASE)
    return " ".join(pattern.sub(" ", text).split())


@dataclass
class _Matrix:
    """One thread's current vectors up to ``floor``, ascending by id, in blocks of about
    :data:`_BLOCK_ROWS` rows: growing never copies the whole matrix (154 MB for 100k
    messages), and a cold load peaks at the matrix plus one block."""

    model: str
    floor: int = 0
    ids: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    blocks: list[np.ndarray] = field(default_factory=list)

    def append(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Add rows whose ids are above every cached one (a small last block absorbs them)."""
        if not len(ids):
            return
        self.ids = np.concatenate([self.ids, ids])
        if self.blocks and len(self.blocks[-1]) < _BLOCK_ROWS:
            vectors = np.concatenate([self.blocks.pop(), vectors])
        self.blocks.append(vectors)

    def scores(self, query: np.ndarray, rows: int) -> np.ndarray:
        """Dot products of the first ``rows`` rows with ``query`` (cosines: all unit length)."""
        out = np.empty(rows, dtype=np.float32)
        start = 0
        for block in self.blocks:
            if start >= rows:
                break
            part = block[: rows - start]
            # einsum, not ``part @ query``: a BLAS matrix-vector product pays a thread
            # hand-off per call (8 ms per 4,096-row block on two busy cores: 200 ms for
            # 100k messages, against 7 ms here), and a build without BLAS has no fast one
            out[start:start + len(part)] = np.einsum("ij,j->i", part, query)
            start += len(part)
        return out

    def scores_at(self, query: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Dot products of the rows numbered ``rows`` (ascending) with ``query``: a
        search among a few messages reads only theirs."""
        out = np.empty(len(rows), dtype=np.float32)
        start = 0
        for block in self.blocks:
            lo, hi = np.searchsorted(rows, [start, start + len(block)])
            if hi > lo:
                out[lo:hi] = np.einsum("ij,j->i", block[rows[lo:hi] - start], query)
            start += len(block)
        return out


class SemanticIndex:
    """The vectors of one Store's messages: what is pending, embedding it, searching.

    Reads and writes through its Store and so, like the Store, is used by one thread at
    a time: a background indexer has its own Store and SemanticIndex (the embedder may be
    shared; it locks). Never changes ``messages``.
    """

    def __init__(self, store: Store, embedder: TextEmbedder, max_cached_threads: int = MAX_CACHED_THREADS,
                 previous: TextEmbedder | None = None):
        self.store = store
        self.embedder = embedder
        #: the embedder the stored vectors came from before this one (a change of model)
        self.previous = previous
        self.max_cached_threads = max_cached_threads
        #: (thread id or None for all threads, model) → floor
        self._floors: dict[tuple[int | None, str], int] = {}
        self._matrices: OrderedDict[int, _Matrix] = OrderedDict()
        self._last_query: tuple[tuple[str, str], np.ndarray] | None = None
        #: a change of model: [messages with the current model's vector, messages waiting],
        #: counted once (a count reads every vector) and kept by :meth:`reembed`; None: count
        self._progress: list[int] | None = None
        #: the last message :meth:`reembed` gave the current model's vector (it goes on after it)
        self._reembed_floor = 0

    # -- a change of embedder -------------------------------------------------------------

    def change_progress(self) -> tuple[int, int]:
        """(messages with the current model's vector, messages with only an older model's):
        how far re-embedding after a change of model has come. Counted once, then kept by
        :meth:`reembed` as it goes (messages embedded or deleted meanwhile by others are
        not in the kept count, so it is counted again when re-embedding ends)."""
        if self._progress is None:
            self._progress = list(self.store.vector_counts(self.embedder.identity))
        current, waiting = self._progress
        return current, waiting

    def finish_change(self) -> int:
        """Drop the older models' vectors once every message that had one has the current
        model's too; returns how many were dropped (0 while some message still needs its
        old vector, or when there are none)."""
        self._progress = None  # the decision reads an exact count
        if self.change_progress()[1]:
            self._reembed_floor = 0  # some were missed (written behind the floor): go round again
            return 0
        return self.store.drop_other_vectors(self.embedder.identity)

    # -- what is pending ------------------------------------------------------------------

    def pending(self, thread_id: int | None = None, limit: int = 64) -> list[int]:
        """Ids of user and assistant messages with final text and no vector from the
        current model, oldest first (of one thread, or of all); at most ``limit``."""
        return [int(row["id"]) for row in self._pending_rows(thread_id, limit)]

    def index_pending(self, limit: int = 64, cancel: threading.Event | None = None,
                      thread_id: int | None = None, through_id: int | None = None) -> int:
        """Embed up to ``limit`` pending messages (at most ``through_id``: a summary's
        last), :data:`BATCH` at a time, committing each batch; stop before the next batch
        once ``cancel`` is set. Returns how many were embedded. A message with no visible
        text gets the zero vector, which marks it done and never matches. Safe beside a
        send: the write lock is taken only for each batch's insert, never while embedding."""
        return self._embed_batches(lambda step: self._pending_rows(thread_id, step, through_id),
                                   limit, cancel, self._counted)

    def reembed(self, limit: int | None = None, cancel: threading.Event | None = None) -> int:
        """Give up to ``limit`` (None: all) messages that have another model's vector and
        none from the current model theirs, :data:`BATCH` at a time, oldest first (after
        a change of model); stop before the next batch once ``cancel`` is set. Returns how
        many were embedded. Each batch reads on from the last one's end, so a batch costs
        the same at the start of a long history and at its end."""
        model = self.embedder.identity
        current, waiting = self.change_progress()  # counted once per change, then kept
        ended = False

        def fetch(step: int) -> list[dict[str, Any]]:
            nonlocal ended
            rows = self.store.messages_with_other_vectors_only(model, step, self._reembed_floor)
            ended = not rows
            return rows

        def saved(ids: list[int]) -> None:
            self._reembed_floor = max(self._reembed_floor, *ids)

        done = self._embed_batches(fetch, limit, cancel, saved)
        self._progress = None if ended else [current + done, max(waiting - done, 0)]
        return done

    def _counted(self, ids: list[int]) -> None:
        """A batch of new vectors outside :meth:`reembed` (new messages, or a thread's
        pending ones during a change of model) kept in the change's count, by key."""
        if self._progress is not None:
            others = self.store.count_with_other_vectors(self.embedder.identity, ids)
            self._progress = [self._progress[0] + len(ids), max(self._progress[1] - others, 0)]

    def _embed_batches(self, fetch: Callable[[int], list[dict[str, Any]]], limit: int | None,
                       cancel: threading.Event | None,
                       saved: Callable[[list[int]], None] | None = None) -> int:
        """Embed and save the messages ``fetch(n)`` gives, up to :data:`BATCH` at a time,
        until it gives none, ``limit`` (None: no limit) are done or ``cancel`` is set;
        ``saved`` is told each batch's ids once they are stored."""
        done = 0
        while (limit is None or done < limit) and not (cancel is not None and cancel.is_set()):
            rows = fetch(BATCH if limit is None else min(BATCH, limit - done))
            if not rows:
                break
            ids = [int(row["id"]) for row in rows]
            if not self._save(ids, self.embedder.embed_many([said_from_row(row).text for row in rows])):
                break  # a full disk: recall goes on without them (by their words)
            if saved is not None:
                saved(ids)
            done += len(rows)
        return done

    def _pending_rows(self, thread_id: int | None, limit: int,
                      through_id: int | None = None) -> list[dict[str, Any]]:
        floor = self._advance(thread_id, self.embedder.identity)
        return self.store.messages_without_vector(thread_id, floor, self.embedder.identity, limit,
                                                  through_id)

    def _save(self, ids: list[int], vectors: np.ndarray) -> bool:
        """Store one batch (replacing stale vectors); False when a full disk (or a database
        that cannot be written) left it unsaved (``keep_cache``: logged, and said by the
        CLI). A message deleted meanwhile (its thread was) is skipped rather than failing
        the foreign key."""
        rows = [(mid, np.asarray(vec, dtype="<f4").tobytes()) for mid, vec in zip(ids, vectors)]
        return keep_cache(self.store, "recall vectors",
                          lambda: self.store.save_vectors(self.embedder.identity, rows))

    def _advance(self, thread_id: int | None, model: str) -> int:
        """Raise and return the floor of ``thread_id`` (None: all threads) for ``model``.
        The newest id is read first, then the oldest streaming message, then the
        oldest pending one: a message that finishes or gets its vector in between is
        then never passed over (a message's status only goes from streaming to final)."""
        key = (thread_id, model)
        floor = self._floors.get(key, 0)
        newest = self.store.newest_message_id(thread_id)
        if newest is None or newest <= floor:
            return floor
        streaming = self.store.first_streaming_id(thread_id, floor)
        first_pending = self.store.first_without_vector(thread_id, floor, newest, model)
        floor = min([newest, *(i - 1 for i in (streaming, first_pending) if i is not None)])
        self._floors[key] = floor
        return floor

    # -- search ---------------------------------------------------------------------------

    def search(self, thread_id: int, through_id: int, query: str, limit: int,
               names: Sequence[str] = (), among: Collection[int] | None = None) -> list[int]:
        """Ids of ``thread_id``'s embedded messages with id ≤ ``through_id`` (and in
        ``among``, when given), most similar to ``query`` first (ties: older first), at
        most ``limit``, only those with a positive cosine similarity. ``names`` (the
        chat's participants) are taken out of the query first. Deterministic for a given
        store. Never writes."""
        text = strip_names(query, names)
        if limit <= 0 or through_id <= 0 or not re.search(r"\w", text) or (among is not None and not among):
            return []
        embedder = self._searched(thread_id, through_id)
        matrix = self._matrix(thread_id, embedder)
        n = int(np.searchsorted(matrix.ids, through_id, side="right"))
        if n == 0:
            return []
        if among is None:
            ids, scores = matrix.ids[:n], matrix.scores(self._query_vector(text, embedder), n)
        else:
            wanted = np.unique(np.fromiter(among, dtype=np.int64))
            rows = np.searchsorted(matrix.ids[:n], wanted)
            inside = rows < n
            rows, wanted = rows[inside], wanted[inside]
            rows = rows[matrix.ids[rows] == wanted]  # not embedded (yet): left out
            ids, scores = matrix.ids[rows], matrix.scores_at(self._query_vector(text, embedder), rows)
        top = np.flatnonzero(scores > 0)
        if len(top) > limit:
            top = top[np.argpartition(-scores[top], limit - 1)[:limit]]
        top = top[np.lexsort((top, -scores[top]))]  # best first; rows ascend by id
        return [int(i) for i in ids[top]]

    def _searched(self, thread_id: int, through_id: int) -> TextEmbedder:
        """The model whose vectors a search of the thread up to ``through_id`` reads: the
        current one, unless its vectors stop short of ``through_id`` and the previous
        model's reach further (a change of model still under way)."""
        floor = self._advance(thread_id, self.embedder.identity)
        if self.previous is None or floor >= through_id:
            return self.embedder
        return self.previous if self._advance(thread_id, self.previous.identity) > floor else self.embedder

    def _query_vector(self, text: str, embedder: TextEmbedder) -> np.ndarray:
        """The query's vector from ``embedder`` (as a question: a model may want an
        instruction before it); the last one is kept, as recall asks twice for one
        question that names a date (all messages, then those written then)."""
        if self._last_query is None or self._last_query[0] != (text, embedder.identity):
            self._last_query = ((text, embedder.identity), embedder.embed_query(text))
        return self._last_query[1]

    def recall_search(self, thread_id: int, through_id: int, query: str, limit: int,
                      among: Collection[int] | None = None) -> list[int]:
        """:meth:`search` with the thread's speakers as ``names``: the shape of
        ``core.recall.SemanticSearch``, to hand to a ``Recaller``. The semantic ranking
        only improves recall, so a failure (a closed model, a busy database) is logged and
        gives no ranking, and recall goes on lexically instead of failing the request."""
        try:
            return self.search(thread_id, through_id, query, limit, self.store.thread_speakers(thread_id),
                               among)
        except (RuntimeError, ValueError, sqlite3.Error) as exc:
            log.warning("semantic search in thread %d failed (%s); recall is lexical only", thread_id, exc)
            return []

    def _matrix(self, thread_id: int, embedder: TextEmbedder) -> _Matrix:
        """The thread's cached matrix of ``embedder``'s vectors, brought up to its floor:
        only the vectors between the old floor and the new one are read. Another model
        starts a new matrix; the least recently searched thread beyond
        ``max_cached_threads`` is dropped."""
        model = embedder.identity
        matrix = self._matrices.pop(thread_id, None)
        if matrix is None or matrix.model != model:
            matrix = _Matrix(model)
        floor = self._advance(thread_id, model)
        if floor > matrix.floor:
            self._load(matrix, thread_id, floor, embedder.dimensions)
        self._matrices[thread_id] = matrix
        while len(self._matrices) > self.max_cached_threads:
            self._matrices.popitem(last=False)
        return matrix

    def _load(self, matrix: _Matrix, thread_id: int, floor: int, dimensions: int) -> None:
        """Append the thread's vectors of ``matrix.model`` above ``matrix.floor`` up to
        ``floor``, a block at a time. A BLOB of the wrong length (a damaged row) is left out."""
        size = 4 * dimensions
        blocks = self.store.iter_vectors(thread_id, matrix.floor, floor, matrix.model, _BLOCK_ROWS)
        for block in blocks:
            rows = [row for row in block if len(row[1]) == size]
            ids = np.fromiter((row[0] for row in rows), dtype=np.int64, count=len(rows))
            vectors = np.frombuffer(b"".join(row[1] for row in rows), dtype="<f4")
            matrix.append(ids, vectors.reshape(len(rows), dimensions))
        matrix.floor = floor
