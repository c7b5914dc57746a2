"""The chat models Iris suggests (:data:`RECOMMENDED`), described from local data,
whether a model fits this computer's memory (:func:`fits_in_memory`), and whether a
downloaded file is a model to chat with at all (:func:`not_for_chat`)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..gguf import GGUFError, GGUFInfo, read_gguf_info
from ..library import DEFAULT_N_CTX, kv_cache_bytes, not_a_chat_model
from .client import quantization_of

#: what the computer's memory must keep free beside a model (the OS, the app, Qt)
MEMORY_HEADROOM = 2**30


@dataclass(frozen=True)
class Recommended:
    """A chat model Iris suggests, described from local data (nothing is contacted to
    show it): what the hub's file and the model's config say, so that the memory a model
    needs at a chosen ``n_ctx`` is the library's estimate (weights + KV cache)."""

    title: str
    repo: str
    file: str
    parameters: str
    #: the file's size as published (the hub's tree gives the exact one when asked)
    size_bytes: int
    context_length: int
    license: str
    architecture: str
    block_count: int
    head_count: int
    head_count_kv: int
    embedding_length: int
    note: str = ""

    @property
    def quantization(self) -> str | None:
        return quantization_of(self.file)

    def kv_cache_bytes(self, n_ctx: int) -> int:
        a = self.architecture
        info = GGUFInfo(path=Path(self.file), size_bytes=self.size_bytes, architecture=a, name=self.title,
                        file_type=self.quantization, context_length=self.context_length, chat_template=None,
                        metadata={f"{a}.block_count": self.block_count, f"{a}.attention.head_count": self.head_count,
                                  f"{a}.attention.head_count_kv": self.head_count_kv,
                                  f"{a}.embedding_length": self.embedding_length})
        return kv_cache_bytes(info, self._ctx(n_ctx)) or 0

    def _ctx(self, n_ctx: int) -> int:
        return n_ctx if n_ctx > 0 else self.context_length  # 0: the trained context, as the library

    def memory_estimate_bytes(self, n_ctx: int = DEFAULT_N_CTX, size_bytes: int | None = None) -> int:
        """Weights (the file) plus the KV cache at ``n_ctx``, as the library estimates an
        opened model (llama.cpp's compute buffers come on top)."""
        return (size_bytes or self.size_bytes) + self.kv_cache_bytes(n_ctx)

    def as_json(self, n_ctx: int = DEFAULT_N_CTX) -> dict[str, Any]:
        data = asdict(self)
        data.update(quantization=self.quantization, n_ctx=self._ctx(n_ctx),
                    memory_estimate_bytes=self.memory_estimate_bytes(n_ctx))
        return data


_QWEN2 = "qwen2"
#: small to larger; every file is a single-part Q4_K_M GGUF with a chat template
RECOMMENDED: tuple[Recommended, ...] = (
    Recommended("Llama 3.2 1B Instruct", "bartowski/Llama-3.2-1B-Instruct-GGUF",
                "Llama-3.2-1B-Instruct-Q4_K_M.gguf", "1.2B", 807_694_464, 131_072,
                "Llama 3.2 Community", "llama", 16, 32, 8, 2048,
                "the smallest: fast on any computer, simple chats"),
    Recommended("Qwen2.5 1.5B Instruct", "Qwen/Qwen2.5-1.5B-Instruct-GGUF",
                "qwen2.5-1.5b-instruct-q4_k_m.gguf", "1.5B", 1_117_320_736, 32_768,
                "Apache-2.0", _QWEN2, 28, 12, 2, 1536,
                "a good first step up from the bundled model"),
    Recommended("Llama 3.2 3B Instruct", "bartowski/Llama-3.2-3B-Instruct-GGUF",
                "Llama-3.2-3B-Instruct-Q4_K_M.gguf", "3.2B", 2_019_377_696, 131_072,
                "Llama 3.2 Community", "llama", 28, 24, 8, 3072,
                "good English chat and summaries"),
    Recommended("Qwen2.5 3B Instruct", "Qwen/Qwen2.5-3B-Instruct-GGUF",
                "qwen2.5-3b-instruct-q4_k_m.gguf", "3.1B", 2_104_932_768, 32_768,
                "Qwen Research (non-commercial)", _QWEN2, 36, 16, 2, 2048,
                "clearly better at chat; 8 GB of memory is enough"),
    Recommended("Phi-3.5 mini instruct", "bartowski/Phi-3.5-mini-instruct-GGUF",
                "Phi-3.5-mini-instruct-Q4_K_M.gguf", "3.8B", 2_393_232_672, 131_072,
                "MIT", "phi3", 32, 32, 32, 3072,
                "strong reasoning for its size; a large KV cache per token"),
    Recommended("Qwen2.5 7B Instruct", "bartowski/Qwen2.5-7B-Instruct-GGUF",
                "Qwen2.5-7B-Instruct-Q4_K_M.gguf", "7.6B", 4_683_073_504, 32_768,
                "Apache-2.0", _QWEN2, 28, 28, 4, 3584,
                "the best here; needs 16 GB of memory to be comfortable"),
)


def fits_in_memory(estimate: int | None, total: int | None) -> bool | None:
    """Whether a model needing ``estimate`` bytes leaves the computer's ``total`` enough
    room (:data:`MEMORY_HEADROOM`); None when either is unknown."""
    if not estimate or not total:
        return None
    return estimate + MEMORY_HEADROOM <= total


#: the hub's pipeline tags of models one chats with (another tag: say it in the search)
CHAT_PIPELINES = frozenset({"text-generation", "text2text-generation", "image-text-to-text",
                            "conversational", "any-to-any"})


def not_for_chat(path: str | os.PathLike[str]) -> str | None:
    """Why the downloaded GGUF at ``path`` is no model to chat with ("an embedding
    model"), as the model library sees it (it leaves such a file out); None when it is
    one, or when its header cannot be read (the download already checked it)."""
    try:
        return not_a_chat_model(read_gguf_info(path))
    except (GGUFError, OSError):
        return None


def not_for_chat_words(why: str) -> str:
    """The end of "Downloaded, but …" for a file :func:`not_for_chat` refuses."""
    return (f"it is not a chat model ({why}): Iris cannot chat with it, and the model library "
            "leaves it out")
