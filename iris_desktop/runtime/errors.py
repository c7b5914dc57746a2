"""The runtime's exceptions, in one place: what its callers catch, and what one runtime
module raises for another (the server runtime refuses a prompt too long with the local
model's :class:`PromptTooLongError`), so that no runtime module imports another only
for an exception class."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["GpuFailed", "ModelError", "PromptTooLongError", "ServerError"]


class ModelError(Exception):
    """A model file cannot be used. The message names the path and the reason."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


class PromptTooLongError(ValueError):
    """The prompt does not fit the context window (nothing was evaluated)."""

    def __init__(self, prompt_tokens: int, n_ctx: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx
        super().__init__(
            f"the prompt is {prompt_tokens} tokens but the context window is {n_ctx} "
            f"(at least one token must be left to generate)"
        )


class ServerError(RuntimeError):
    """The server cannot be used, or a request to it failed. The message names the
    server (``host:port``) and says why; it never contains the API key."""


class GpuFailed(RuntimeError):
    """The GPU a model runs on failed while it computed (llama.cpp's decode failed there: its
    memory, a lost device), in one sentence that names the GPU and llama.cpp's error and says
    what Iris did: the GPU is off for the rest of this run (:class:`.gpu.GpuChecks`), and the
    next start checks it again. What the reply had said before stays (the caller keeps it)."""

    def __init__(self, device: str, error: str, during: str = "the reply") -> None:
        self.device = device
        self.error = error
        super().__init__(f"{device}, the GPU it runs on, failed during {during} ({error}); Iris runs "
                         "the model on the CPU until it restarts, and checks the GPU again then")
