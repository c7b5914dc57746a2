"""A small, dependency-free GGUF header reader.

It reads what the app needs to decide *whether and how* to load a model — the
architecture, quantization, trained context length, embedded chat template and the
other small metadata values — without loading the model and without reading the
tensor data. Huge arrays (the tokenizer's 262k tokens, scores and merges) are skipped,
never materialized.

It also catches the files that would otherwise make llama.cpp fail with an opaque
error (or crash): a missing file, a directory, a file that is not GGUF, an unsupported
version, and a truncated download (the header describes tensor data past the end of
the file).

Format reference: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
(little-endian; v2 and v3 use 64-bit counts and string lengths; v1 is not supported by
llama.cpp anymore and is rejected here too).
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from iris_desktop.files import _READ_FLAGS, file_kind

__all__ = [
    "FILE_TYPES",
    "GGML_TYPE_SIZES",
    "GGUFError",
    "GGUFInfo",
    "TensorInfo",
    "read_gguf_info",
]

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
#: the longest context a model's metadata may claim (16 Mi tokens: the longest published
#: models train on 10 M; servers are held to the same bound). llama.cpp sizes buffers by
#: it: 2^32 - 1 failed inside llama-cpp-python ("a bug in Iris"), 2^31 - 1 took 9 GB of
#: memory to say hi
MAX_CONTEXT_LENGTH = 1 << 24

#: arrays with at most this many elements are kept in ``GGUFInfo.metadata``
MAX_ARRAY_IN_METADATA = 64
#: strings longer than this are left out of ``GGUFInfo.metadata`` (the chat template
#: has its own field)
MAX_STRING_IN_METADATA = 1024
#: no string or array in a GGUF header is longer (the largest, a vocabulary's scores or
#: a chat template, are megabytes): a length past it is a damaged header, not a file cut
#: short ("truncated … needs byte 7818421948897766972" sent users after a bad download)
MAX_HEADER_ITEM = 1 << 30
#: how deep arrays of arrays may nest in the metadata (llama.cpp refuses nested arrays;
#: 2,000 levels in a 24 KB file ran Python out of stack)
MAX_ARRAY_DEPTH = 8

# GGUF metadata value types
_UINT8, _INT8, _UINT16, _INT16, _UINT32, _INT32, _FLOAT32, _BOOL = range(8)
_STRING, _ARRAY, _UINT64, _INT64, _FLOAT64 = 8, 9, 10, 11, 12

_SCALAR_FORMATS: dict[int, str] = {
    _UINT8: "<B",
    _INT8: "<b",
    _UINT16: "<H",
    _INT16: "<h",
    _UINT32: "<I",
    _INT32: "<i",
    _FLOAT32: "<f",
    _BOOL: "<?",
    _UINT64: "<Q",
    _INT64: "<q",
    _FLOAT64: "<d",
}
_SCALAR_SIZES = {t: struct.calcsize(f) for t, f in _SCALAR_FORMATS.items()}

#: llama_ftype (``general.file_type``) -> the usual quantization name
FILE_TYPES: dict[int, str] = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
    36: "TQ1_0",
    37: "TQ2_0",
    38: "MXFP4_MOE",
    39: "NVFP4",
    40: "Q1_0",
    41: "Q2_0",
}

_QK_K = 256
#: ggml tensor type -> (elements per block, bytes per block); from gguf-py's
#: GGML_QUANT_SIZES. Unknown types only disable the exact size check.
GGML_TYPE_SIZES: dict[int, tuple[int, int]] = {
    0: (1, 4),  # F32
    1: (1, 2),  # F16
    2: (32, 2 + 16),  # Q4_0
    3: (32, 2 + 2 + 16),  # Q4_1
    6: (32, 2 + 4 + 16),  # Q5_0
    7: (32, 2 + 2 + 4 + 16),  # Q5_1
    8: (32, 2 + 32),  # Q8_0
    9: (32, 2 + 2 + 32),  # Q8_1
    10: (256, 2 + 2 + _QK_K // 16 + _QK_K // 4),  # Q2_K
    11: (256, 2 + _QK_K // 4 + _QK_K // 8 + 12),  # Q3_K
    12: (256, 2 + 2 + _QK_K // 2 + 12),  # Q4_K
    13: (256, 2 + 2 + _QK_K // 2 + _QK_K // 8 + 12),  # Q5_K
    14: (256, 2 + _QK_K // 2 + _QK_K // 4 + _QK_K // 16),  # Q6_K
    15: (256, 4 + _QK_K + _QK_K // 8),  # Q8_K
    16: (256, 2 + _QK_K // 4),  # IQ2_XXS
    17: (256, 2 + _QK_K // 4 + _QK_K // 32),  # IQ2_XS
    18: (256, 2 + _QK_K // 4 + _QK_K // 8),  # IQ3_XXS
    19: (256, 2 + _QK_K // 8 + _QK_K // 16),  # IQ1_S
    20: (32, 2 + 16),  # IQ4_NL
    21: (256, 2 + _QK_K // 4 + _QK_K // 8 + _QK_K // 32 + 4),  # IQ3_S
    22: (256, 2 + _QK_K // 4 + _QK_K // 16),  # IQ2_S
    23: (256, 2 + 2 + _QK_K // 2 + _QK_K // 64),  # IQ4_XS
    24: (1, 1),  # I8
    25: (1, 2),  # I16
    26: (1, 4),  # I32
    27: (1, 8),  # I64
    28: (1, 8),  # F64
    29: (256, _QK_K // 8 + _QK_K // 16 + _QK_K // 32),  # IQ1_M
    30: (1, 2),  # BF16
    34: (256, 2 + 4 * 13),  # TQ1_0
    35: (256, 2 + 64),  # TQ2_0
    39: (32, 1 + 16),  # MXFP4
    40: (64, 4 + 32),  # NVFP4
    41: (128, 2 + 16),  # Q1_0
    42: (64, 2 + 16),  # Q2_0
}


class GGUFError(Exception):
    """The file cannot be used as a GGUF model. The message names the path and why."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the header describes it."""

    name: str
    #: the shape as stored, innermost first
    dims: tuple[int, ...]
    ggml_type: int
    #: where its data starts, from the (aligned) start of the tensor data
    offset: int

    @property
    def n_elements(self) -> int:
        return math.prod(self.dims)

    @property
    def nbytes(self) -> int | None:
        """Its data's size, None for a type this reader does not know."""
        sizes = GGML_TYPE_SIZES.get(self.ggml_type)
        if sizes is None:
            return None
        block, nbytes = sizes
        return (self.n_elements + block - 1) // block * nbytes


@dataclass(frozen=True)
class GGUFInfo:
    path: Path
    size_bytes: int
    architecture: str
    name: str | None
    #: quantization name mapped from ``general.file_type`` ("Q4_K_M"), None if absent
    file_type: str | None
    #: ``<arch>.context_length`` (the trained context), None if absent
    context_length: int | None
    #: ``tokenizer.chat_template`` (Jinja), None if the model has none
    chat_template: str | None
    #: small metadata values (scalars, short strings, arrays of at most
    #: ``MAX_ARRAY_IN_METADATA`` elements); big arrays and long strings are left out
    metadata: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    version: int = 3
    tensor_count: int = 0
    #: ``<arch>.attention.sliding_window`` (0 when the model has no SWA layers)
    sliding_window: int = 0
    #: bytes before the (aligned) tensor data: magic, metadata and tensor infos. The
    #: header holds the whole tokenizer and template, so hashing it identifies the
    #: tokenization cheaply.
    header_size: int = 0
    #: the file length the header implies (a lower bound when a tensor type is unknown)
    expected_size: int = 0
    #: text of the special tokens named in the metadata: {"bos": "<bos>", "eos": ...}
    special_tokens: dict[str, str] = field(default_factory=dict, repr=False, compare=False)
    #: elements of all tensors in this file, summed (for a split model: this part's only)
    tensor_elements: int = 0
    #: bytes of tensor data the header describes (a lower bound when a tensor type is
    #: unknown); ``expected_size - header_size``
    tensor_data_size: int = 0
    #: elements of ``output.weight`` when its shape is exactly ``token_embd.weight``'s,
    #: else 0. Such a matrix is either a separate output layer (Llama 3) or a copy of
    #: tied embeddings that the converter wrote out (Qwen2.5 0.5B's official GGUF), so
    #: it may or may not count as parameters of the original model.
    output_copy_elements: int = 0
    #: every tensor's info, in the header's order
    tensors: tuple[TensorInfo, ...] = field(default=(), repr=False, compare=False)
    #: where the metadata ends and the tensor infos begin (bytes 24 up to here are the
    #: key/values, copied as they are by :mod:`.weights`)
    metadata_end: int = 0
    #: ``general.alignment`` (the tensor data's alignment)
    alignment: int = DEFAULT_ALIGNMENT

    def arch_key(self, suffix: str) -> Any:
        """``metadata[f"{architecture}.{suffix}"]`` or None."""
        return self.metadata.get(f"{self.architecture}.{suffix}")


def per_layer(value: Any, layers: int) -> list[int] | None:
    """A per-layer hyperparameter (``head_count``, ``feed_forward_length``) as one int a
    layer: GGUF stores one int for all, or an array with one per layer; None for anything
    else (missing, a bool, an array of another length or with other values)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [value] * layers
    if isinstance(value, list) and len(value) == layers and all(isinstance(v, int) for v in value):
        return list(value)
    return None


class _Reader:
    """Bounds-checked little-endian reads over a memory map (or bytes)."""

    def __init__(self, path: Path, buf: Any, size: int) -> None:
        self.path = path
        self.buf = buf
        self.size = size
        self.pos = 0

    def _need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            if n > MAX_HEADER_ITEM:
                raise self.corrupt(what, self.pos + n)
            raise GGUFError(
                self.path,
                f"truncated: the header ends early while reading {what} "
                f"(needs byte {self.pos + n}, the file ends at byte {self.size})",
            )

    def corrupt(self, what: str, end: int) -> GGUFError:
        """A header whose ``what`` would end at byte ``end``, far past anything a header
        holds: its bytes are damaged (a full-size file), not missing."""
        return GGUFError(
            self.path,
            f"corrupt: the header is damaged (the length of {what} runs to byte {end:,}, "
            f"far past the end of the file at byte {self.size:,})",
        )

    def scalar(self, vtype: int, what: str) -> Any:
        fmt = _SCALAR_FORMATS[vtype]
        n = _SCALAR_SIZES[vtype]
        self._need(n, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return value

    def u32(self, what: str) -> int:
        return self.scalar(_UINT32, what)

    def u64(self, what: str) -> int:
        return self.scalar(_UINT64, what)

    def string(self, what: str) -> str:
        n = self.u64(f"the length of {what}")
        self._need(n, what)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def skip_string(self, what: str) -> None:
        n = self.u64(f"the length of {what}")
        self._need(n, what)
        self.pos += n

    def value(self, vtype: int, key: str, keep: bool, depth: int = 0) -> Any:
        """Read (keep=True) or skip (keep=False, returns None) one metadata value;
        ``depth``: how many arrays hold it."""
        if vtype in _SCALAR_FORMATS:
            return self.scalar(vtype, f"the value of {key!r}")
        if vtype == _STRING:
            if keep:
                return self.string(f"the value of {key!r}")
            self.skip_string(f"the value of {key!r}")
            return None
        if vtype == _ARRAY:
            etype = self.u32(f"the element type of {key!r}")
            count = self.u64(f"the length of {key!r}")
            keep = keep and count <= MAX_ARRAY_IN_METADATA
            if etype in _SCALAR_FORMATS:
                n = _SCALAR_SIZES[etype] * count
                if not keep:
                    self._need(n, f"the array {key!r}")
                    self.pos += n
                    return None
                return [self.scalar(etype, f"the array {key!r}") for _ in range(count)]
            if etype == _STRING:
                if keep:
                    return [self.string(f"an element of {key!r}") for _ in range(count)]
                # skip a string array: one length read per element (262k for gemma's
                # vocabulary; ~0.1 s over a memory map)
                unpack = struct.Struct("<Q").unpack_from
                buf, pos, size = self.buf, self.pos, self.size
                for _ in range(count):
                    if pos + 8 > size:
                        if pos > size:  # an element ran past the end: said below
                            break
                        self.pos = pos
                        self._need(8, f"an element of {key!r}")
                    (n,) = unpack(buf, pos)
                    pos += 8 + n
                if pos > size:
                    if pos - self.pos > MAX_HEADER_ITEM:
                        raise self.corrupt(f"the array {key!r}", pos)
                    self.pos = size
                    raise GGUFError(
                        self.path,
                        f"truncated: the array {key!r} runs past the end of the file "
                        f"(byte {size})",
                    )
                self.pos = pos
                return None
            if etype == _ARRAY:
                if depth + 1 >= MAX_ARRAY_DEPTH:
                    raise GGUFError(self.path, f"corrupt header: arrays nested more than "
                                               f"{MAX_ARRAY_DEPTH} deep in {key!r}")
                result = []
                for _ in range(count):
                    result.append(self.value(_ARRAY, key, keep, depth + 1))
                return result if keep else None
            raise GGUFError(self.path, f"unknown array element type {etype} for key {key!r}")
        raise GGUFError(self.path, f"unknown metadata value type {vtype} for key {key!r}")


def _keep_in_metadata(key: str) -> bool:
    # the tokenizer tables are huge and useless here; everything else is small enough
    return not key.startswith(("tokenizer.ggml.tokens", "tokenizer.ggml.scores",
                                "tokenizer.ggml.token_type", "tokenizer.ggml.merges"))


def read_gguf_info(path: str | os.PathLike[str]) -> GGUFInfo:
    """Read and validate a GGUF file's header. Raises :class:`GGUFError`."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise GGUFError(p, "file not found") from None
    except OSError as exc:
        raise GGUFError(p, f"cannot access the file ({exc.strerror or exc})") from None
    _refuse_kind(p, st.st_mode)  # a named pipe would wait for a writer for ever
    size = st.st_size
    try:
        with open_regular_file(p) as fh:
            magic = fh.read(4)
            if magic != GGUF_MAGIC:
                if not magic:
                    raise GGUFError(p, "not a GGUF file (the file is empty)")
                raise GGUFError(p, f"not a GGUF file (a model file starts with 'GGUF'; this one "
                                   f"with {_shown_start(magic)})")
            if size < 24:
                raise GGUFError(p, f"truncated: only {size} bytes, the GGUF header alone needs 24")
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                return _parse(p, mm, size)
    except GGUFError:
        raise
    except OSError as exc:
        raise GGUFError(p, f"cannot read the file ({exc.strerror or exc})") from None


def _refuse_kind(p: Path, mode: int) -> None:
    kind = file_kind(mode)
    if kind:
        shown = "a directory" if kind == "a folder" else kind
        raise GGUFError(p, f"is {shown}, not a GGUF file")


def open_regular_file(path: str | os.PathLike[str]) -> IO[bytes]:
    """``path`` opened for reading in binary, when it is a regular file. The open does
    not block (a named pipe swapped in after a check cannot wait for a writer) and the
    open file is checked again; raises :class:`GGUFError` for anything else, OSError
    when it cannot be opened."""
    p = Path(path)
    fd = os.open(p, _READ_FLAGS)
    try:
        _refuse_kind(p, os.fstat(fd).st_mode)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _parse(p: Path, buf: Any, size: int) -> GGUFInfo:
    r = _Reader(p, buf, size)
    r.pos = 4
    version = r.u32("the version")
    if version not in (2, 3):
        if version == 1:
            raise GGUFError(p, "GGUF version 1 is not supported (re-convert the model)")
        swapped = struct.unpack("<I", struct.pack(">I", version))[0]
        if swapped in (2, 3):
            raise GGUFError(p, "big-endian GGUF files are not supported")
        raise GGUFError(p, f"unsupported GGUF version {version}")
    tensor_count = r.u64("the tensor count")
    kv_count = r.u64("the metadata count")
    # every tensor info needs at least 8+4+8+4+8 bytes and every kv at least 8+4+1
    if tensor_count * 32 > size or kv_count * 13 > size:
        raise GGUFError(
            p,
            f"truncated or corrupt: header says {tensor_count} tensors and {kv_count} "
            f"metadata entries but the file ends at byte {size}",
        )

    metadata: dict[str, Any] = {}
    chat_template: str | None = None
    tokens_at: int | None = None
    for _ in range(kv_count):
        key = r.string("a metadata key")
        vtype = r.u32(f"the type of {key!r}")
        keep = _keep_in_metadata(key)
        if key == "tokenizer.ggml.tokens" and vtype == _ARRAY:
            tokens_at = r.pos
        value = r.value(vtype, key, keep)
        if key == "tokenizer.chat_template" and isinstance(value, str):
            chat_template = value
            continue
        if value is None:
            continue
        if isinstance(value, str) and len(value) > MAX_STRING_IN_METADATA:
            continue
        metadata[key] = value

    # tensor infos: name, n_dims, dims, type, offset
    metadata_end = r.pos
    tensors = tuple(_tensor_info(p, r, i) for i in range(tensor_count))
    data_end = 0
    exact = True
    shapes = {t.name: t.dims for t in tensors if t.name in ("token_embd.weight", "output.weight")}
    for t in tensors:
        nbytes = t.nbytes
        exact = exact and nbytes is not None
        data_end = max(data_end, t.offset + (nbytes or 0))

    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0:
        alignment = DEFAULT_ALIGNMENT
    data_start = (r.pos + alignment - 1) // alignment * alignment
    needed = data_start + data_end
    if tensor_count and needed > size:
        raise GGUFError(
            p,
            f"truncated: header says {tensor_count} tensors "
            f"{'needing' if exact else 'needing at least'} {needed} bytes "
            f"but the file ends at byte {size}",
        )

    special_tokens = _special_tokens(r, tokens_at, metadata) if tokens_at else {}

    arch = metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise GGUFError(p, "not a model: general.architecture is missing")
    ftype = metadata.get("general.file_type")
    file_type = FILE_TYPES.get(ftype, f"ftype {ftype}") if isinstance(ftype, int) else None
    ctx = metadata.get(f"{arch}.context_length")
    if isinstance(ctx, int) and not 0 < ctx <= MAX_CONTEXT_LENGTH:  # buffers are sized by it
        raise GGUFError(p, f"its metadata claims a context of {ctx:,} tokens, which no model "
                           "has; the file is damaged or not a usable model")
    swa = metadata.get(f"{arch}.attention.sliding_window")
    name = metadata.get("general.name")
    return GGUFInfo(
        path=p,
        size_bytes=size,
        architecture=arch,
        name=name if isinstance(name, str) else None,
        file_type=file_type,
        context_length=int(ctx) if isinstance(ctx, int) else None,
        chat_template=chat_template,
        metadata=metadata,
        version=version,
        tensor_count=tensor_count,
        sliding_window=int(swa) if isinstance(swa, int) else 0,
        header_size=data_start,
        expected_size=needed,
        special_tokens=special_tokens,
        tensor_elements=sum(t.n_elements for t in tensors),
        tensor_data_size=data_end,
        output_copy_elements=_output_copy_elements(shapes),
        tensors=tensors,
        metadata_end=metadata_end,
        alignment=alignment,
    )


def _tensor_info(p: Path, r: _Reader, i: int) -> TensorInfo:
    name = r.string(f"the name of tensor {i}")
    n_dims = r.u32(f"the dimensions of tensor {name!r}")
    if n_dims > 8:
        raise GGUFError(p, f"corrupt: tensor {name!r} has {n_dims} dimensions")
    dims = tuple(r.u64(f"the shape of tensor {name!r}") for _ in range(n_dims))
    ttype = r.u32(f"the type of tensor {name!r}")
    offset = r.u64(f"the offset of tensor {name!r}")
    return TensorInfo(name, dims, ttype, offset)


def _output_copy_elements(shapes: dict[str, tuple[int, ...]]) -> int:
    out = shapes.get("output.weight")
    return math.prod(out) if out is not None and out == shapes.get("token_embd.weight") else 0


_SPECIAL_IDS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "eot": "tokenizer.ggml.eot_token_id",
    "eom": "tokenizer.ggml.eom_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
    "sep": "tokenizer.ggml.seperator_token_id",
    "pad": "tokenizer.ggml.padding_token_id",
}


def _special_tokens(r: _Reader, tokens_at: int, metadata: dict[str, Any]) -> dict[str, str]:
    """Look up the text of the special tokens (bos, eos, ...) in the vocabulary array."""
    wanted = {
        name: metadata[key]
        for name, key in _SPECIAL_IDS.items()
        if isinstance(metadata.get(key), int) and metadata[key] >= 0
    }
    if not wanted:
        return {}
    saved = r.pos
    try:
        r.pos = tokens_at
        etype = r.u32("the vocabulary")
        count = r.u64("the vocabulary")
        if etype != _STRING:
            return {}
        by_id = {}
        last = max(wanted.values())
        for i in range(min(count, last + 1)):
            if i in wanted.values():
                by_id[i] = r.string("a vocabulary entry")
            else:
                r.skip_string("a vocabulary entry")
        return {name: by_id[i] for name, i in wanted.items() if i in by_id}
    finally:
        r.pos = saved


def _shown_start(data: bytes) -> str:
    """A file's first bytes as a person reads them: text in quotes ('[{"r'), else hex."""
    text = data.decode("ascii", "replace")
    if text.isprintable() and "\ufffd" not in text:
        return repr(text)
    return "bytes " + " ".join(f"{b:02x}" for b in data)
