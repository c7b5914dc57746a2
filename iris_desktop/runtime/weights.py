"""An exact 8-bit copy of a model's 5-bit weights, which llama.cpp reads faster on CPUs.

Many GGUF files are mostly Q5_0, whatever their name says: the bundled "Q4_K_M"
Qwen2.5-Coder-0.5B holds 133 Q5_0 matrices of 170, because its 896-wide rows do not
divide into Q4_K's 256-element blocks and the quantizer falls back. On a CPU, llama.cpp
multiplies Q8_0 matrices faster than Q5_0 ones (no fifth bit to unpack): prompts are
read ~25% faster on the bundled model here, generation is unchanged
(``bench/throughput.py``).

Nothing is approximated. A Q5_0 block is an fp16 scale ``d`` and 32 integers in
-16..15 (four low bits in ``qs``, the fifth in ``qh``); a Q8_0 block is an fp16 scale
and 32 int8. The copy keeps ``d`` and writes the same 32 integers as int8, so every
weight has exactly the value it had. Every other tensor and every key/value is copied
byte for byte.

:func:`q8_copy` keeps the copy in a folder of the app's (``AppPaths.weights_dir``),
one per source file, with a sidecar naming the source's size and mtime; a changed source
is copied again. The copy costs disk and memory: Q5_0 tensors grow from 22 to 34 bytes
per 32 weights (the bundled model: 491 MB → 637 MB); a copy that would not leave
:data:`MEMORY_HEADROOM` of the computer's memory free is not made.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from iris_desktop.files import atomic_output, atomic_write, clean_leftovers, free_bytes

from .cpu import system_memory_bytes
from .gguf import GGML_TYPE_SIZES, GGUFError, GGUFInfo, TensorInfo, read_gguf_info

log = logging.getLogger("iris.runtime.weights")

__all__ = ["WeightsError", "q5_0_as_q8_0", "q8_copy", "rewritable_bytes", "REWRITE_VERSION"]

Q5_0, Q8_0 = 6, 8
#: a change to what is written rewrites every copy (the sidecar records it)
REWRITE_VERSION = 1
#: what memory must keep free beside the copy (the OS, the app, the KV cache)
MEMORY_HEADROOM = 2**31
#: Q5_0 blocks converted at a time (~22 MB in, ~34 MB out)
_CHUNK_BLOCKS = 1 << 20
_Q5_BYTES = GGML_TYPE_SIZES[Q5_0][1]
_Q8_BYTES = GGML_TYPE_SIZES[Q8_0][1]


class WeightsError(Exception):
    """The copy could not be made (the source is loaded as it is)."""


class Cancelled(Exception):
    """``cancel`` was set while the copy was being written (nothing is left behind)."""


def q5_0_as_q8_0(blocks: np.ndarray) -> np.ndarray:
    """Q5_0 blocks (``(n, 22)`` uint8) as Q8_0 blocks (``(n, 34)`` uint8) of the same
    values: ggml's ``dequantize_row_q5_0`` gives weight ``j`` (0..15) as
    ``((qs[j] & 15) | bit j of qh << 4) - 16`` and weight ``j + 16`` as
    ``((qs[j] >> 4) | bit j + 12 of qh) - 16``, times ``d``."""
    blocks = blocks.reshape(-1, _Q5_BYTES)
    qh = blocks[:, 2:6].copy().view("<u4").astype(np.uint32)  # (n, 1)
    qs = blocks[:, 6:22].astype(np.int16)
    j = np.arange(16, dtype=np.uint32)
    high_lo = (((qh >> j) << 4) & 0x10).astype(np.int16)
    high_hi = ((qh >> (j + 12)) & 0x10).astype(np.int16)
    out = np.empty((blocks.shape[0], _Q8_BYTES), dtype=np.uint8)
    out[:, 0:2] = blocks[:, 0:2]  # d, the fp16 scale, as it is
    out[:, 2:18] = (((qs & 0x0F) | high_lo) - 16).astype(np.int8).view(np.uint8)
    out[:, 18:34] = (((qs >> 4) | high_hi) - 16).astype(np.int8).view(np.uint8)
    return out


def rewritable_bytes(info: GGUFInfo) -> int:
    """Bytes of Q5_0 weights in the file (0: nothing to gain from a copy)."""
    return sum(t.nbytes or 0 for t in info.tensors if t.ggml_type == Q5_0)


def _new_type(t: TensorInfo) -> int:
    return Q8_0 if t.ggml_type == Q5_0 else t.ggml_type


def _new_nbytes(t: TensorInfo) -> int:
    return t.n_elements // 32 * _Q8_BYTES if t.ggml_type == Q5_0 else t.nbytes or 0


def _pad(n: int, alignment: int) -> int:
    return -n % alignment


def _tensor_infos(info: GGUFInfo) -> tuple[bytes, list[int], int]:
    """The copy's tensor infos (new types and offsets), each tensor's new offset, and
    the size of its tensor data (each tensor padded to the alignment)."""
    out = bytearray()
    offsets, offset = [], 0
    for t in info.tensors:
        raw = t.name.encode("utf-8")
        out += struct.pack("<Q", len(raw)) + raw + struct.pack("<I", len(t.dims))
        out += struct.pack(f"<{len(t.dims)}Q", *t.dims) + struct.pack("<IQ", _new_type(t), offset)
        offsets.append(offset)
        size = _new_nbytes(t)
        offset += size + _pad(size, info.alignment)
    return bytes(out), offsets, offset


def _header(info: GGUFInfo, metadata: bytes) -> tuple[bytes, list[int]]:
    """The copy's header (``metadata``: the source's magic, counts and key/values as they
    are; the tensor infos; padding) and each tensor's new offset."""
    infos, offsets, _ = _tensor_infos(info)
    head = metadata + infos
    return head + bytes(_pad(len(head), info.alignment)), offsets


def expected_size(info: GGUFInfo) -> int:
    """The copy's length in bytes."""
    infos, _, data = _tensor_infos(info)
    head = info.metadata_end + len(infos)
    return head + _pad(head, info.alignment) + data


def _check(info: GGUFInfo) -> None:
    """Every tensor of a known type, within the file, and every Q5_0 one whole blocks
    (a hostile header must not make the copy read or write out of bounds)."""
    data = info.size_bytes - info.header_size
    for t in info.tensors:
        if t.nbytes is None:
            raise WeightsError(f"tensor {t.name!r} has a type this copy does not know ({t.ggml_type})")
        if t.offset + t.nbytes > data:
            raise WeightsError(f"tensor {t.name!r} runs past the end of the file")
        if t.ggml_type == Q5_0 and t.n_elements % 32:
            raise WeightsError(f"tensor {t.name!r} is not whole Q5_0 blocks")


def _key(source: Path) -> str:
    return hashlib.sha256(str(source.resolve()).encode("utf-8")).hexdigest()[:12]


def copy_path(source: Path, folder: Path) -> Path:
    """Where :func:`q8_copy` keeps ``source``'s copy."""
    return folder / f"{source.stem}.{_key(source)}.q8_0.gguf"


def _sidecar(copy: Path) -> Path:
    return copy.with_name(copy.name + ".json")


def _record(source: Path, info: GGUFInfo) -> dict:
    st = source.stat()
    return {"source": str(source.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "version": REWRITE_VERSION, "copy_size": expected_size(info)}


def _is_current(copy: Path, record: dict) -> bool:
    try:
        stamp = json.loads(_sidecar(copy).read_text(encoding="utf-8"))
        return stamp == record and copy.stat().st_size == record["copy_size"]
    except (OSError, ValueError):
        return False


def q8_copy(source: str | os.PathLike[str], folder: str | os.PathLike[str], *,
            info: GGUFInfo | None = None,
            progress: Callable[[float], object] | None = None,
            cancel: threading.Event | None = None) -> Path:
    """The file llama.cpp should load for ``source``: its Q8_0 copy in ``folder``
    (written now if it is missing or older than the source), or ``source`` itself when
    it holds no Q5_0 weights. ``progress(fraction)`` follows a copy being written;
    setting ``cancel`` stops it (:class:`Cancelled`, nothing left behind). Raises
    :class:`WeightsError` when the copy cannot be made (no room, an unwritable folder,
    a header it cannot follow): the caller loads ``source`` as it is."""
    source, folder = Path(source), Path(folder)
    if info is None:  # ``info``: the source's header, when the caller has read it already
        try:
            info = read_gguf_info(source)
        except GGUFError as exc:
            raise WeightsError(exc.reason) from None
    if not rewritable_bytes(info):
        return source
    _check(info)
    copy = copy_path(source, folder)
    record = _record(source, info)
    if _is_current(copy, record):
        return copy
    total = system_memory_bytes()
    if total and record["copy_size"] + MEMORY_HEADROOM > total:
        raise WeightsError(f"the copy ({record['copy_size'] / 1e6:,.0f} MB) would not leave this "
                           f"computer's memory ({total / 1e6:,.0f} MB) room for the rest")
    try:
        if not folder.is_dir():
            folder.mkdir(parents=True, mode=0o700)  # private, as every folder Iris makes
            if os.name == "posix":
                os.chmod(folder, 0o700)  # mkdir's mode is reduced by the umask
        _prune(folder)
        free = free_bytes(folder)
        if free is not None and free < record["copy_size"] + (64 << 20):
            raise WeightsError(f"the copy needs {record['copy_size'] / 1e6:,.0f} MB in {folder}, "
                               f"{free / 1e6:,.0f} MB are free")
        t0 = time.perf_counter()
        _write(source, info, copy, progress, cancel)
        atomic_write(_sidecar(copy), json.dumps(record))
    except OSError as exc:
        raise WeightsError(f"cannot write the copy in {folder} ({exc.strerror or exc})") from None
    log.info("%s: Q5_0 weights copied as Q8_0 to %s (%.0f MB) in %.1f s", source, copy,
             record["copy_size"] / 1e6, time.perf_counter() - t0)
    return copy


def discard(source: str | os.PathLike[str], folder: str | os.PathLike[str]) -> None:
    """Remove ``source``'s copy (one llama.cpp could not load), so the next load writes it again."""
    copy = copy_path(Path(source), Path(folder))
    for path in (_sidecar(copy), copy):
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("%s: cannot remove (%s)", path, exc)


def _write(source: Path, info: GGUFInfo, copy: Path, progress, cancel) -> None:
    """Write the copy with the atomic writer (fsynced, moved into place whole, 0600)."""
    total = rewritable_bytes(info) or 1
    done = 0
    with atomic_output(copy) as out, open(source, "rb") as src:
        head = src.read(info.metadata_end)
        header, offsets = _header(info, head)
        out.write(header)
        for t, offset in zip(info.tensors, offsets):
            if out.tell() != len(header) + offset:  # the layout _header promised
                raise WeightsError(f"tensor {t.name!r} would land at the wrong offset")
            src.seek(info.header_size + t.offset)
            if t.ggml_type == Q5_0:
                blocks = t.n_elements // 32
                for first in range(0, blocks, _CHUNK_BLOCKS):
                    if cancel is not None and cancel.is_set():
                        raise Cancelled()
                    n = min(_CHUNK_BLOCKS, blocks - first)
                    raw = np.frombuffer(src.read(n * _Q5_BYTES), dtype=np.uint8)
                    if raw.size != n * _Q5_BYTES:
                        raise WeightsError(f"the source ends inside tensor {t.name!r}")
                    out.write(q5_0_as_q8_0(raw).tobytes())
                    done += raw.size
                    if progress is not None:
                        progress(min(done / total, 1.0))
            else:
                _copy_bytes(src, out, t.nbytes or 0, t.name)
            size = _new_nbytes(t)
            out.write(bytes(_pad(size, info.alignment)))


def _copy_bytes(src, out, n: int, name: str) -> None:
    while n > 0:
        block = src.read(min(n, 16 << 20))
        if not block:
            raise WeightsError(f"the source ends inside tensor {name!r}")
        out.write(block)
        n -= len(block)


def _prune(folder: Path) -> None:
    """Remove copies whose source is gone (a deleted or moved model) and partial files
    an interrupted copy left (older than a minute)."""
    now = time.time()
    for stamp in folder.glob("*.q8_0.gguf.json"):
        try:
            if not Path(json.loads(stamp.read_text(encoding="utf-8"))["source"]).exists():
                stamp.with_name(stamp.name[: -len(".json")]).unlink(missing_ok=True)
                stamp.unlink(missing_ok=True)
        except (OSError, ValueError, KeyError, TypeError):
            continue
    clean_leftovers(folder)  # the atomic writer's, left by a killed copy
    for partial in folder.glob(".*.partial"):  # an older Iris's
        try:
            if partial.stat().st_mtime < now - 60:
                partial.unlink()
        except OSError:
            continue
