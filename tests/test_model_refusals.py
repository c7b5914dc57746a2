"""Files ``LocalModel.load`` refuses before llama.cpp sees them, with the sentence the user
reads: here a valid GGUF that is no chat model (the library's rule,
``library.not_a_chat_model``), whichever way it is chosen (``--model``, Open GGUF…)."""

from __future__ import annotations

from pathlib import Path

import pytest

from iris_desktop.runtime.errors import ModelError
from iris_desktop.runtime.model import LocalModel

from conftest import MODEL_CACHE
from support.gguf_fixtures import tiny_metadata, write_gguf


@pytest.fixture(scope="module")
def minilm() -> Path:
    """all-MiniLM-L6-v2's GGUF (which llama.cpp loads: the case users met), converted
    from its pinned package once per machine, as the recall tests use it."""
    from iris_desktop.runtime.embedder import ensure_embedding_model

    return ensure_embedding_model(MODEL_CACHE / "models")


def embedding_gguf(path: Path) -> Path:
    return write_gguf(path, tiny_metadata(arch="bert", template=None, **{"bert.pooling_type": 1}))


@pytest.mark.parametrize("kind", ["tiny", "minilm"])
def test_an_embedding_model_is_refused_as_the_chat_model(tmp_path, kind, minilm):
    """Before: it loaded, was saved as the chat model, and every send failed with "an
    internal error in Iris (AssertionError: Memory is not initialized)"."""
    path = embedding_gguf(tmp_path / "embed.gguf") if kind == "tiny" else minilm
    weights = tmp_path / "weights"
    with pytest.raises(ModelError) as refused:
        LocalModel.load(path, weights_dir=weights)
    assert str(refused.value) == f"{path}: not a chat model: an embedding model; it cannot write replies"
    assert not weights.exists()  # refused before the 8-bit copy is written


def test_a_lora_adapter_is_refused_with_its_type(tmp_path):
    path = write_gguf(tmp_path / "adapter.gguf", tiny_metadata(**{"general.type": "adapter"}))
    with pytest.raises(ModelError, match="not a chat model: general.type is 'adapter'"):
        LocalModel.load(path)


def test_the_cli_refuses_an_embedding_model_in_one_sentence_and_keeps_no_thread(tmp_path, capsys,
                                                                              minilm):
    """Before: ``chat --new --model all-MiniLM….gguf hi`` left a new thread with an empty
    failed reply each time, exit 1."""
    from iris_desktop.cli import main

    data = str(tmp_path / "home")
    path = minilm
    assert main(["--data-dir", data, "chat", "--new", "--model", str(path), "hi"]) == 1
    err = capsys.readouterr().err
    assert "cannot load the model" in err and "not a chat model: an embedding model" in err
    assert "Memory is not initialized" not in err
    assert main(["--data-dir", data, "threads"]) == 0
    assert "no threads yet" in capsys.readouterr().out
    # with an n_ctx over its 512 trained tokens, still the real cause (not the window)
    assert main(["--data-dir", data, "--set", "model.n_ctx=4096", "chat", "--new", "--model",
                 str(path), "hi"]) == 1
    err = capsys.readouterr().err
    assert "not a chat model: an embedding model" in err and "trained" not in err, err


def test_open_gguf_refuses_an_embedding_model_and_saves_nothing(make_window, qtbot, model_path,
                                                                minilm):
    window = make_window(None, overrides={"model.path": str(model_path)})
    path = minilm
    window.models.use_file(str(path))
    qtbot.waitUntil(lambda: window.models.job is None, timeout=60_000)
    assert window.model_state == "ready" and window.models.info["path"] == str(model_path)
    assert "not a chat model: an embedding model" in window.models.box.informativeText()
    assert window.host.settings["model.path"] == str(model_path)
    config = window.host.paths.config_path
    assert not config.exists() or str(path) not in config.read_text()
    window.models.box.done(0)
