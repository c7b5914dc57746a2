"""Semantic recall's index: vectors in the real SQLite file, made by the real embedding
model (all-MiniLM-L6-v2, ~5 ms a message), searched by meaning within one thread."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import pytest

from iris_desktop.core.recall import SemanticSearch
from iris_desktop.core.semantic import BATCH, SemanticIndex, strip_names
from iris_desktop.core.store import Store
from iris_desktop.runtime.embedder import Embedder, ensure_embedding_model

from conftest import MODEL_CACHE, SYNTHETIC_CHAT, load_corpus

MISO = "I adopted a kitten yesterday! Her name is Miso."
PETS = "What pets does Rosa have?"


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    with Embedder.load(ensure_embedding_model(MODEL_CACHE / "models")) as loaded:
        yield loaded


class Renamed:
    """The real model under another identity (a model upgrade, as the index sees it);
    ``after_batch`` runs after each batch, to cancel or delete part-way through."""

    def __init__(self, inner: Embedder, identity: str, after_batch=None):
        self.inner, self.identity, self.dimensions = inner, identity, inner.dimensions
        self.after_batch = after_batch

    def embed(self, text: str) -> np.ndarray:
        return self.inner.embed(text)

    def embed_query(self, text: str) -> np.ndarray:
        return self.inner.embed_query(text)

    def embed_many(self, texts: Sequence[str]) -> np.ndarray:
        rows = self.inner.embed_many(texts)
        if self.after_batch:
            self.after_batch()
        return rows


def friends_chat(store: Store, count: int = 110) -> tuple[int, list[int]]:
    """A thread with the first ``count`` messages of the Rosa/Tomas chat; Miso is #50."""
    thread = store.create_thread("friends")
    messages = load_corpus(SYNTHETIC_CHAT)[:count]
    assert count <= 50 or messages[50]["content"] == MISO
    return thread, store.add_messages(thread, messages)


def vector_models(store: Store) -> dict[int, str]:
    return dict(store.conn.execute("SELECT message_id, model FROM message_vectors").fetchall())


@pytest.fixture
def indexed(fresh_store, embedder):
    """The friends chat, fully embedded."""
    index = SemanticIndex(fresh_store, embedder)
    thread, ids = friends_chat(fresh_store)
    assert index.index_pending(limit=1000) == len(ids)
    return index, thread, ids


# -- finding by meaning -----------------------------------------------------------------


def test_a_paraphrase_is_found_among_a_hundred_other_messages(indexed):
    index, thread, ids = indexed
    found = index.search(thread, ids[-1], PETS, 5, names=["Rosa", "Tomas"])
    assert found[0] == ids[50]  # shares no word with the question but "Rosa"
    assert len(found) == 5 and len(set(found)) == 5


def test_the_participants_names_are_taken_out_of_the_query(indexed):
    index, thread, ids = indexed
    assert strip_names(PETS, ["Rosa", "Tomas"]) == "What pets does have?"
    assert strip_names("rosa's cat and ROSA, not Rosalind", ["Rosa Diaz"]) == "cat and , not Rosalind"
    assert strip_names("  spaced   out  ", []) == "spaced out"
    with_names = index.search(thread, ids[-1], PETS, 20, names=["Rosa"])
    assert with_names == index.search(thread, ids[-1], "What pets does have?", 20)
    assert with_names != index.search(thread, ids[-1], PETS, 20)
    assert index.search(thread, ids[-1], "Rosa? Tomas!", 5, names=["Rosa", "Tomas"]) == []


def test_recall_search_fits_the_recaller_and_uses_the_threads_speakers(indexed):
    index, thread, ids = indexed
    search: SemanticSearch = index.recall_search
    assert search(thread, ids[-1], PETS, 10) == index.search(thread, ids[-1], PETS, 10, ["Rosa", "Tomas"])


def test_only_the_thread_and_messages_through_through_id_are_searched(indexed, fresh_store):
    index, thread, ids = indexed
    other, other_ids = friends_chat(fresh_store)
    index.index_pending(limit=1000)
    assert set(index.search(thread, ids[-1], PETS, 200)) <= set(ids)
    assert set(index.search(other, other_ids[-1], PETS, 200)) <= set(other_ids)
    before_miso = index.search(thread, ids[50] - 1, PETS, 200)
    assert before_miso and max(before_miso) < ids[50]
    assert index.search(thread, ids[50], PETS, 1) == [ids[50]]
    assert index.search(thread, 0, PETS, 5) == [] and index.search(thread, ids[-1], PETS, 0) == []


def test_among_limits_the_search_to_the_given_messages_in_the_same_order(indexed, monkeypatch):
    index, thread, ids = indexed
    embeds = []
    monkeypatch.setattr(index.embedder, "embed", lambda text, inner=index.embedder.embed: (
        embeds.append(text), inner(text))[1])
    everything = index.search(thread, ids[-1], PETS, 1000, ["Rosa", "Tomas"])
    some = set(ids[40:60]) - {ids[50]}
    assert index.recall_search(thread, ids[-1], PETS, 5, among=some) == \
        [i for i in everything if i in some][:5]
    assert index.recall_search(thread, ids[-1], PETS, 5, among=[ids[50]]) == [ids[50]]
    assert index.recall_search(thread, ids[-1], PETS, 5, among=[]) == []
    unknown = [0, ids[-1] + 5, ids[-1] + 6]  # no such message: nothing, and nothing twice
    assert index.recall_search(thread, ids[-1], PETS, 50, among=[*unknown, ids[50], ids[51]]) \
        == [i for i in everything if i in (ids[50], ids[51])]
    assert len(embeds) == 1  # one question: its vector is made once


def test_results_are_best_first_with_a_positive_similarity(indexed, embedder):
    index, thread, ids = indexed
    found = index.search(thread, ids[-1], PETS, 1000, ["Rosa"])
    rows = index.store.messages_by_id(found)
    query = embedder.embed("What pets does have?")
    scores = [float(embedder.embed(rows[i]["content"]) @ query) for i in found]
    assert 0 < len(found) <= len(ids)
    assert all(s > 0 for s in scores)
    assert scores == sorted(scores, reverse=True)


# -- what is pending, and indexing it ---------------------------------------------------


def test_pending_is_final_chat_text_without_a_vector_oldest_first(fresh_store, embedder):
    index = SemanticIndex(fresh_store, embedder)
    thread = fresh_store.create_thread("mixed")
    user, blank, tool, reply = fresh_store.add_messages(thread, [
        {"role": "user", "content": "Can you check the logs?"},
        {"role": "assistant", "content": "   "},
        {"role": "tool", "content": "log line", "tool_call_id": "c1", "name": "read_file"},
        {"role": "assistant", "content": "The logs look clean."},
    ])
    streaming = fresh_store.add_message(thread, {"role": "assistant", "content": "Still typ"}, status="streaming")
    assert index.pending(thread) == [user, reply]
    assert index.pending(thread, limit=1) == [user]
    assert index.index_pending() == 2
    assert index.pending() == []
    fresh_store.update_streaming(streaming, "Still typing, done now.", status="complete")
    assert index.pending() == [streaming]  # the floor waited below the streaming reply
    assert index.index_pending() == 1
    assert set(vector_models(fresh_store)) == {user, reply, streaming}


def test_index_pending_works_in_batches_and_stops_on_cancel(fresh_store, embedder):
    cancel = threading.Event()
    index = SemanticIndex(fresh_store, Renamed(embedder, embedder.identity, after_batch=cancel.set))
    thread, ids = friends_chat(fresh_store, count=30)
    assert index.index_pending(limit=100, cancel=cancel) == BATCH  # one batch, committed
    assert index.pending(thread, limit=100) == ids[BATCH:]
    assert index.index_pending(limit=100, cancel=cancel) == 0  # already cancelled
    assert SemanticIndex(fresh_store, embedder).index_pending(limit=5) == 5  # a limit is a limit
    assert len(vector_models(fresh_store)) == BATCH + 5


def test_a_new_model_makes_the_old_vectors_stale_and_embeds_again(indexed, embedder):
    index, thread, ids = indexed
    upgraded = SemanticIndex(index.store, Renamed(embedder, "next-model@sha256:0123456789abcdef"))
    assert upgraded.pending(thread, limit=1000) == ids  # no message has the new model's vector
    assert upgraded.search(thread, ids[-1], PETS, 5) == []  # nor are the old vectors searched
    assert upgraded.index_pending(limit=1000) == len(ids)
    # the old vectors stay beside the new ones until finish_change drops them
    models = index.store.conn.execute("SELECT model, count(*) FROM message_vectors GROUP BY model").fetchall()
    assert dict(models) == {embedder.identity: len(ids), "next-model@sha256:0123456789abcdef": len(ids)}
    assert upgraded.search(thread, ids[-1], PETS, 1, ["Rosa"]) == [ids[50]]
    assert upgraded.finish_change() == len(ids)
    assert set(vector_models(index.store).values()) == {"next-model@sha256:0123456789abcdef"}
    # and back: a fresh index of the first model sees its vectors as stale in turn
    assert SemanticIndex(index.store, embedder).pending(thread, limit=1000) == ids


def test_during_a_change_of_model_the_old_vectors_are_searched_until_the_new_ones_are_complete(indexed, embedder):
    """Recall by meaning keeps working while a new embedder re-embeds the history: the old
    model's vectors (and its vector of the question) are searched until the new model's
    reach as far, and the old ones are dropped only once no message needs them."""
    index, thread, ids = indexed
    new = Renamed(embedder, "next-model@sha256:0123456789abcdef")
    asked = []
    old = Renamed(embedder, embedder.identity)
    old.embed_query = lambda text: asked.append(("old", text)) or embedder.embed_query(text)
    new.embed_query = lambda text: asked.append(("new", text)) or embedder.embed_query(text)
    changing = SemanticIndex(index.store, new, previous=old)
    assert changing.change_progress() == (0, len(ids))
    assert changing.search(thread, ids[-1], PETS, 1, ["Rosa"]) == [ids[50]]  # from the old vectors
    assert asked[-1][0] == "old"
    assert changing.index_pending(limit=40) == 40  # part-way: Miso (#50) not re-embedded yet
    assert changing.change_progress() == (40, len(ids) - 40)
    assert changing.finish_change() == 0  # nothing dropped while a message still needs its old vector
    assert changing.search(thread, ids[-1], PETS, 1, ["Rosa"]) == [ids[50]]
    assert asked[-1][0] == "old"
    # a search that ends where the new vectors already reach reads the new ones
    assert changing.search(thread, ids[30], PETS, 3, ["Rosa"])
    assert asked[-1][0] == "new"
    changing.index_pending(limit=1000)
    assert changing.change_progress() == (len(ids), 0)
    assert changing.search(thread, ids[-1], PETS, 1, ["Rosa"]) == [ids[50]]
    assert asked[-1][0] == "new"
    assert changing.finish_change() == len(ids)
    assert changing.change_progress() == (len(ids), 0)
    assert set(vector_models(index.store).values()) == {"next-model@sha256:0123456789abcdef"}


def test_deleting_a_thread_deletes_its_vectors(indexed, fresh_store):
    index, thread, ids = indexed
    other, other_ids = friends_chat(fresh_store, count=10)
    index.index_pending()
    fresh_store.delete_thread(thread)
    assert set(vector_models(fresh_store)) == set(other_ids)


def test_a_message_deleted_while_it_was_embedded_is_skipped(fresh_store, embedder):
    thread = fresh_store.create_thread("short-lived")
    fresh_store.add_messages(thread, [{"role": "user", "content": "Delete me soon."}])
    index = SemanticIndex(fresh_store, Renamed(embedder, embedder.identity,
                                               after_batch=lambda: fresh_store.delete_thread(thread)))
    assert index.index_pending() == 1
    assert vector_models(fresh_store) == {}


# -- the matrix cache -------------------------------------------------------------------


def test_a_new_vector_extends_the_cached_matrix_without_reading_it_again(indexed, monkeypatch):
    index, thread, ids = indexed
    loads: list[tuple[int, int]] = []
    real_load = index._load
    monkeypatch.setattr(index, "_load", lambda matrix, t, floor, dims: (loads.append((matrix.floor, floor)),
                                                                        real_load(matrix, t, floor, dims)))
    index.search(thread, ids[-1], PETS, 5)
    index.search(thread, ids[-1], "Where did they move?", 5)
    assert loads == [(0, ids[-1])]  # read once, then searched from memory
    new = index.store.add_message(thread, {"role": "user", "name": "Rosa", "content": "We got a second cat!"})
    assert new not in index.search(thread, new, PETS, 200, ["Rosa"])  # not embedded yet: lexical's job
    index.index_pending()
    assert new in index.search(thread, new, "Does she have more than one pet?", 3, ["Rosa"])
    assert loads == [(0, ids[-1]), (ids[-1], new)]  # only the new vector was read
    assert list(index._matrices[thread].ids) == [*ids, new]


def test_a_background_indexer_and_a_search_share_the_embedder(tmp_path, embedder):
    path = tmp_path / "shared.db"
    with Store(path) as front, Store(path) as back:
        thread, ids = friends_chat(front)
        searcher = SemanticIndex(front, embedder)
        indexer = SemanticIndex(back, embedder)
        worker = threading.Thread(target=indexer.index_pending, kwargs={"limit": 1000})
        worker.start()
        while worker.is_alive():
            searcher.search(thread, ids[-1], PETS, 5, ["Rosa"])
        worker.join()
        assert searcher.search(thread, ids[-1], PETS, 1, ["Rosa"]) == [ids[50]]


def test_a_damaged_vector_is_left_out(indexed):
    index, thread, ids = indexed
    index.store.conn.execute("UPDATE message_vectors SET vector = x'00' WHERE message_id = ?", (ids[50],))
    fresh = SemanticIndex(index.store, index.embedder)
    assert ids[50] not in fresh.search(thread, ids[-1], PETS, 200)
    assert len(fresh.search(thread, ids[-1], PETS, 200)) < len(ids)


# -- with the Recaller ------------------------------------------------------------------


def test_the_recaller_finds_a_paraphrase_that_shares_no_searchable_word(indexed):
    from iris_desktop.core.recall import Recaller
    from iris_desktop.tokens import HeuristicCounter

    index, thread, ids = indexed
    question = "Does she have any animals at home?"
    lexical = Recaller(index.store, HeuristicCounter()).recall(thread, ids[-1], question, 400)
    semantic = Recaller(index.store, HeuristicCounter(), semantic=index.recall_search).recall(
        thread, ids[-1], question, 400)
    assert ids[50] not in lexical.ids
    assert semantic.semantic and ids[50] in semantic.ids and "Her name is Miso." in semantic.text


def test_recall_goes_on_lexically_when_the_model_is_gone(indexed, caplog):
    index, thread, ids = indexed
    closed = Embedder.load(index.embedder.path)
    closed.close()
    assert SemanticIndex(index.store, closed).recall_search(thread, ids[-1], PETS, 5) == []
    assert "recall is lexical only" in caplog.text
