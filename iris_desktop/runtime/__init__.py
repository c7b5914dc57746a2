"""The in-process model runtime: GGUF inspection, chat formats, llama.cpp generation.

Importing this package does not import llama_cpp (``model`` imports it lazily).
"""

from .bundled import BUNDLED_MODEL, BundledModelError, ensure_bundled_model
from .chat_format import ChatFormat, ChatMLFormat, GemmaFormat, JinjaFormat, select_chat_format
from .gguf import GGUFError, GGUFInfo, read_gguf_info
from .model import (
    GenerationStats,
    LocalModel,
    ModelError,
    ModelTokenCounter,
    PromptTooLongError,
)

__all__ = [
    "ChatFormat",
    "ChatMLFormat",
    "GemmaFormat",
    "JinjaFormat",
    "select_chat_format",
    "GGUFError",
    "GGUFInfo",
    "read_gguf_info",
    "GenerationStats",
    "LocalModel",
    "ModelError",
    "ModelTokenCounter",
    "PromptTooLongError",
    "BUNDLED_MODEL",
    "BundledModelError",
    "ensure_bundled_model",
]
