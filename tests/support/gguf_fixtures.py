"""Tiny but valid GGUF files, and the folders where other apps keep theirs (shared by
the model library's tests and the CLI's)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from pathlib import Path

CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"



def _gguf_string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _gguf_value(value) -> tuple[int, bytes]:
    """(GGUF value type, encoding): bool, uint32, float32, string, array."""
    if isinstance(value, bool):
        return 7, struct.pack("<?", value)
    if isinstance(value, int):
        return 4, struct.pack("<I", value)
    if isinstance(value, float):
        return 6, struct.pack("<f", value)
    if isinstance(value, str):
        return 8, _gguf_string(value)
    element_type = _gguf_value(value[0])[0]
    return 9, struct.pack("<IQ", element_type, len(value)) + b"".join(_gguf_value(v)[1] for v in value)


def write_gguf(path: Path, metadata: dict, tensors=(("token_embd.weight", (64, 16)),)) -> Path:
    """A valid GGUF v3: the metadata, then F32 tensors of zeros (32-byte aligned)."""
    kv = b"".join(_gguf_string(k) + struct.pack("<I", t) + b
                  for k, (t, b) in ((k, _gguf_value(v)) for k, v in metadata.items()))
    infos, data = b"", b""
    for name, dims in tensors:
        infos += _gguf_string(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        infos += struct.pack("<IQ", 0, len(data))
        data += bytes(4 * math.prod(dims))
        data += bytes(-len(data) % 32)
    header = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata)) + kv + infos
    header += bytes(-len(header) % 32)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + data)
    return path


def tiny_metadata(name: str | None = "Tiny Chat", *, arch: str = "llama", finetune: str | None = "Instruct",
                  template: str | None = CHATML, file_type: int = 7, **extra) -> dict:
    """4 layers, 8 heads of 32 (embedding 256), 2 KV heads, trained context 4096."""
    metadata = {"general.architecture": arch, "general.type": "model", "general.name": name,
                "general.file_type": file_type, f"{arch}.context_length": 4096,
                f"{arch}.block_count": 4, f"{arch}.embedding_length": 256,
                f"{arch}.attention.head_count": 8, f"{arch}.attention.head_count_kv": 2}
    if name is None:
        del metadata["general.name"]
    if finetune is not None:
        metadata["general.finetune"] = finetune
    if template is not None:
        metadata["tokenizer.chat_template"] = template
    metadata.update(extra)
    return metadata


def tiny_model(path: Path, name: str | None = "Tiny Chat", **kw) -> Path:
    return write_gguf(path, tiny_metadata(name, **kw))


def ollama_model(models: Path, name: tuple[str, str, str, str], gguf_meta: dict) -> Path:
    """``manifests/<host>/<namespace>/<model>/<tag>`` pointing at a GGUF blob."""
    blob_tmp = write_gguf(models / "blobs" / "incoming", gguf_meta)
    digest = hashlib.sha256(blob_tmp.read_bytes()).hexdigest()
    blob = blob_tmp.rename(models / "blobs" / f"sha256-{digest}")
    manifest = {"schemaVersion": 2, "config": {"digest": "sha256:" + "0" * 64},
                "layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}",
                            "size": blob.stat().st_size},
                           {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "1" * 64}]}
    path = models.joinpath("manifests", *name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return blob


def hf_model(hub: Path, repo: str, file_name: str, revisions=("abc123",)) -> Path:
    """``models--org--repo/snapshots/<rev>/<file>`` symlinked to ``blobs/<sha>``."""
    folder = hub / ("models--" + repo.replace("/", "--"))
    blob = tiny_model(folder / "blobs" / "incoming", "HF Tiny")
    blob = blob.rename(folder / "blobs" / hashlib.sha256(blob.read_bytes()).hexdigest())
    for rev in revisions:
        link = folder / "snapshots" / rev / file_name
        link.parent.mkdir(parents=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return blob
