"""The runtimes: the in-process model (GGUF inspection, chat formats, llama.cpp
generation) and a model behind a server, both with the interface written down in
:mod:`.protocol`.

Importing this package does not import llama_cpp (``model`` imports it lazily).
"""

from .bundled import BUNDLED_MODEL, BundledModelError, ensure_bundled_model
from .chat_format import ChatFormat, ChatMLFormat, GemmaFormat, JinjaFormat, select_chat_format
from .gguf import GGUFError, GGUFInfo, read_gguf_info
from .model import (
    LocalModel,
    ModelError,
    ModelTokenCounter,
    PromptTooLongError,
)
from .protocol import (
    Capabilities,
    Generation,
    GenerationStats,
    KVState,
    ModelFacts,
    Prefill,
    PrefillStats,
    Runtime,
    Unsupported,
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
    "Capabilities",
    "Generation",
    "GenerationStats",
    "KVState",
    "ModelFacts",
    "Prefill",
    "PrefillStats",
    "Runtime",
    "Unsupported",
    "LocalModel",
    "ModelError",
    "ModelTokenCounter",
    "PromptTooLongError",
    "BUNDLED_MODEL",
    "BundledModelError",
    "ensure_bundled_model",
]
