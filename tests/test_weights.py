"""The exact 8-bit copy of a model's 5-bit weights (runtime/weights.py, model.q8_weights,
issue 29): the same values, so the same logits; written once, again when the source
changes, never half; the file loaded as it is when the copy cannot be made or loaded."""

from __future__ import annotations

import os
import struct
import threading
from pathlib import Path

import numpy as np
import pytest

from iris_desktop.generation import GenerationRequest
from iris_desktop.host import load_runtime
from iris_desktop.paths import app_paths
from iris_desktop.runtime import weights
from iris_desktop.runtime.gguf import read_gguf_info
from iris_desktop.runtime.model import LocalModel, ModelError
from iris_desktop.settings import load_settings

from support.gguf_fixtures import _gguf_string, _gguf_value, tiny_metadata

Q5_0, Q8_0, F32 = 6, 8, 0


def dequantize_q5_0(raw: np.ndarray) -> np.ndarray:
    """ggml's dequantize_row_q5_0, written out element by element (the reference)."""
    out = []
    for block in raw.reshape(-1, 22):
        d = float(block[0:2].view("<f2")[0])
        qh = int(block[2:6].view("<u4")[0])
        qs = block[6:22]
        lo = [((int(qs[j]) & 0x0F) | (((qh >> j) << 4) & 0x10)) - 16 for j in range(16)]
        hi = [((int(qs[j]) >> 4) | ((qh >> (j + 12)) & 0x10)) - 16 for j in range(16)]
        out.extend(x * d for x in lo + hi)
    return np.array(out, dtype=np.float32)


def dequantize_q8_0(raw: np.ndarray) -> np.ndarray:
    blocks = raw.reshape(-1, 34)
    d = blocks[:, 0:2].copy().view("<f2").astype(np.float32)
    return (blocks[:, 2:].view(np.int8).astype(np.float32) * d).reshape(-1)


def q5_0_blocks(n: int, seed: int = 0) -> np.ndarray:
    """``n`` Q5_0 blocks of random bits with finite scales (negative ones too)."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(n, 22), dtype=np.uint8)
    scales = rng.uniform(-0.1, 0.1, size=n).astype("<f2")
    scales[0] = 0.0
    blocks[:, 0:2] = scales.view(np.uint8).reshape(n, 2)
    return blocks


def write_q5_gguf(path: Path, tensors: list[tuple[str, tuple[int, ...], int, bytes]]) -> Path:
    """A GGUF v3 with these (name, dims, type, data) tensors, 32-byte aligned."""
    metadata = tiny_metadata()
    kv = b"".join(_gguf_string(k) + struct.pack("<I", t) + b
                  for k, (t, b) in ((k, _gguf_value(v)) for k, v in metadata.items()))
    infos, data = b"", b""
    for name, dims, ttype, blob in tensors:
        infos += _gguf_string(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        infos += struct.pack("<IQ", ttype, len(data))
        data += blob + bytes(-len(blob) % 32)
    header = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata)) + kv + infos
    header += bytes(-len(header) % 32)
    path.write_bytes(header + data)
    return path


@pytest.fixture
def small(tmp_path) -> Path:
    """Two Q5_0 matrices (64×32 and 32×96) around an F32 vector."""
    return write_q5_gguf(tmp_path / "small.gguf", [
        ("blk.0.attn_q.weight", (64, 32), Q5_0, q5_0_blocks(64, 1).tobytes()),
        ("blk.0.attn_norm.weight", (64,), F32, np.arange(64, dtype="<f4").tobytes()),
        ("blk.0.ffn_up.weight", (32, 96), Q5_0, q5_0_blocks(96, 2).tobytes()),
    ])


def tensor_bytes(path: Path, name: str) -> np.ndarray:
    info = read_gguf_info(path)
    t = next(t for t in info.tensors if t.name == name)
    with open(path, "rb") as fh:
        fh.seek(info.header_size + t.offset)
        return np.frombuffer(fh.read(t.nbytes), dtype=np.uint8)


def test_every_q5_0_value_is_the_same_in_q8_0():
    blocks = q5_0_blocks(300)
    converted = weights.q5_0_as_q8_0(blocks)
    assert converted.shape == (300, 34)
    np.testing.assert_array_equal(dequantize_q8_0(converted), dequantize_q5_0(blocks))
    # all 32 five-bit codes of a block, the extremes -16 and 15 included
    codes = np.arange(32) - 16
    assert set(converted[:, 2:].view(np.int8).reshape(-1)) == set(codes)


def test_the_copy_has_the_same_metadata_and_values_and_is_written_once(small, tmp_path):
    folder = tmp_path / "weights"
    copy = weights.q8_copy(small, folder)
    assert copy.parent == folder and copy != small
    src, out = read_gguf_info(small), read_gguf_info(copy)
    assert out.metadata == src.metadata and out.chat_template == src.chat_template
    assert [(t.name, t.dims) for t in out.tensors] == [(t.name, t.dims) for t in src.tensors]
    assert [t.ggml_type for t in out.tensors] == [Q8_0, F32, Q8_0]
    assert out.size_bytes == weights.expected_size(src)
    for name in ("blk.0.attn_q.weight", "blk.0.ffn_up.weight"):
        np.testing.assert_array_equal(dequantize_q8_0(tensor_bytes(copy, name)),
                                      dequantize_q5_0(tensor_bytes(small, name)))
    assert tensor_bytes(copy, "blk.0.attn_norm.weight").tobytes() == \
        tensor_bytes(small, "blk.0.attn_norm.weight").tobytes()
    if os.name == "posix":  # private, as the app's other files
        assert [oct(p.stat().st_mode & 0o777) for p in (folder, copy, Path(str(copy) + ".json"))] == \
            [oct(0o700), oct(0o600), oct(0o600)]

    written = copy.stat().st_mtime_ns
    assert weights.q8_copy(small, folder) == copy
    assert copy.stat().st_mtime_ns == written  # current: not written again

    os.utime(small, ns=(written + 10**9, written + 10**9))  # the source changed
    calls = []
    assert weights.q8_copy(small, folder, progress=calls.append) == copy
    assert calls and calls[-1] == 1.0  # written again, with progress
    assert sorted(p.name for p in folder.iterdir()) == [copy.name, copy.name + ".json"]


def test_a_file_without_q5_0_weights_is_loaded_as_it_is(tmp_path):
    plain = write_q5_gguf(tmp_path / "plain.gguf", [("w", (32,), F32, bytes(128))])
    assert weights.q8_copy(plain, tmp_path / "weights") == plain
    assert not (tmp_path / "weights").exists()


def test_a_cancelled_copy_leaves_nothing(small, tmp_path):
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(weights.Cancelled):
        weights.q8_copy(small, tmp_path / "weights", cancel=cancel)
    assert list((tmp_path / "weights").iterdir()) == []


def test_a_copy_without_room_or_a_hostile_header_is_refused(small, tmp_path, monkeypatch):
    monkeypatch.setattr(weights, "free_bytes", lambda _folder: 1000)
    with pytest.raises(weights.WeightsError, match="MB are free"):
        weights.q8_copy(small, tmp_path / "weights")
    monkeypatch.undo()

    # a computer whose memory the copy would fill: the file is loaded as it is
    monkeypatch.setattr(weights, "system_memory_bytes", lambda: weights.MEMORY_HEADROOM + 1000)
    with pytest.raises(weights.WeightsError, match="memory"):
        weights.q8_copy(small, tmp_path / "weights")
    monkeypatch.undo()

    # a Q5_0 tensor that is not whole blocks
    odd = write_q5_gguf(tmp_path / "odd.gguf", [("w", (40,), Q5_0, bytes(44))])
    with pytest.raises(weights.WeightsError, match="whole Q5_0 blocks"):
        weights.q8_copy(odd, tmp_path / "weights")
    # a truncated file
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(small.read_bytes()[:-600])
    with pytest.raises(weights.WeightsError, match="truncated"):
        weights.q8_copy(cut, tmp_path / "weights")
    assert not list((tmp_path / "weights").glob("*.gguf"))


def test_a_copy_of_a_removed_model_is_removed(small, tmp_path):
    folder = tmp_path / "weights"
    copy = weights.q8_copy(small, folder)
    other = write_q5_gguf(tmp_path / "other.gguf", [("w", (32,), Q5_0, q5_0_blocks(1).tobytes())])
    small.unlink()
    weights.q8_copy(other, folder)
    assert not copy.exists() and not Path(str(copy) + ".json").exists()


# -- the real bundled model ---------------------------------------------------------------

PROMPT = [{"role": "user", "content": "Name three rivers of Europe and one fact about each."}]


def test_the_bundled_model_reads_prompts_from_the_copy_with_identical_logits(model_path, tmp_path):
    folder = Path(os.environ["IRIS_WEIGHTS_DIR"])  # shared by the tests, written once
    plain = LocalModel.load(model_path, n_ctx=2048)
    fast = LocalModel.load(model_path, n_ctx=2048, weights_dir=folder)
    try:
        assert plain.weights == "as published"
        assert fast.weights.startswith("Q5_0 read as Q8_0")
        assert fast.path == plain.path == model_path  # what the user chose, not the copy
        assert fast.identity != plain.identity  # a KV state of the other weights is read again
        logits = []
        for model in (plain, fast):
            llm = model.llm
            tokens = model.prompt_tokens(PROMPT)
            llm.reset()
            llm.eval(tokens)
            logits.append(np.array(llm.scores[len(tokens) - 1]))
        # the same values in the same order of operations: identical here (x86, AVX-512);
        # a CPU whose two kernels sum in another order may differ in the last bits
        np.testing.assert_allclose(logits[0], logits[1], rtol=0, atol=1e-3)
        assert logits[0].argmax() == logits[1].argmax()
        replies = [m.stream(GenerationRequest(PROMPT, max_tokens=24, temperature=0.0)) for m in (plain, fast)]
        texts = [g.text() for g in replies]
        assert texts[0] == texts[1]
        assert replies[0].stats.evaluated_tokens == replies[1].stats.evaluated_tokens
    finally:
        plain.close()
        fast.close()


def test_the_app_loads_the_copy_by_default_and_the_file_when_told(model_path):
    on = load_runtime(load_settings(None, env={}, cli={"model.path": str(model_path)}), app_paths())
    off = load_runtime(load_settings(None, env={"IRIS_MODEL_Q8_WEIGHTS": "false"},
                                     cli={"model.path": str(model_path)}), app_paths())
    try:
        assert on.weights.startswith("Q5_0 read as Q8_0")
        assert str(app_paths().weights_dir) in on.weights
        assert off.weights == "as published"
    finally:
        on.close()
        off.close()


def test_a_copy_llama_cpp_cannot_load_is_replaced_by_the_file(model_path, tmp_path):
    folder = tmp_path / "weights"
    copy = weights.q8_copy(model_path, folder)
    # damage the copy where no size check sees it: the first tensor info's type
    info = read_gguf_info(copy)
    raw = bytearray(copy.read_bytes()[:info.header_size])
    name = info.tensors[0].name.encode()
    at = raw.index(name, info.metadata_end) + len(name) + 4 + 8 * len(info.tensors[0].dims)
    with open(copy, "r+b") as fh:
        fh.seek(at)
        fh.write(struct.pack("<I", 250))  # no such ggml type
    stages = []
    model = LocalModel.load(model_path, n_ctx=512, weights_dir=folder, stage=stages.append)
    try:
        assert stages == []  # the copy was there (current by its record): nothing written
        assert model.weights == "as published (the 8-bit copy did not load)"
        assert model.stream(GenerationRequest(PROMPT, max_tokens=4, temperature=0.0)).text()
    finally:
        model.close()
    assert not copy.exists()  # the next load writes it again


def test_a_load_cancelled_while_copying_leaves_no_copy(model_path, tmp_path):
    cancel = threading.Event()
    seen = []

    def progress(fraction):
        seen.append(fraction)
        cancel.set()

    stages = []
    with pytest.raises(ModelError, match="cancelled"):
        LocalModel.load(model_path, n_ctx=512, weights_dir=tmp_path / "weights",
                        progress=progress, cancel=cancel, stage=stages.append)
    assert seen and seen[0] < 0.8
    assert stages == ["copying"]  # said before the first progress; no "loading" after a cancel
    assert not list((tmp_path / "weights").glob("*.gguf")) and \
        not list((tmp_path / "weights").glob(".*.partial"))


def test_the_cli_says_it_prepares_the_model_on_its_first_load(capsys, monkeypatch, tmp_path, base_model_path):
    """A first chat writes the copy (seconds on a laptop): stderr says why it waits, once."""
    from iris_desktop.cli import main

    monkeypatch.setenv("IRIS_WEIGHTS_DIR", str(tmp_path / "weights"))  # no copy there yet
    argv = ["--data-dir", str(tmp_path / "data"), "--set", f"model.path={base_model_path}",
            "--set", "model.max_tokens=4", "chat", "--new", "hello"]
    said = []
    for _ in range(2):
        code = main(argv)
        _, err = capsys.readouterr()
        assert code == 0, err
        said.append(err.count("preparing the model for this computer (once)"))
    assert said == [1, 0]
    assert list((tmp_path / "weights").glob("*.q8_0.gguf"))
    # a command that loads the model only to count (context) says it too
    monkeypatch.setenv("IRIS_WEIGHTS_DIR", str(tmp_path / "weights2"))
    code = main([*argv[:4], "context", "1"])
    _, err = capsys.readouterr()
    assert code == 0 and err.count("preparing the model for this computer (once)") == 1, err
