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


#: how a GPU's first failure in use ends: off for this run only (:class:`GpuFailed`)
AGAIN_NEXT_RUN = "Iris runs the model on the CPU until it restarts, and checks the GPU again then"


class GpuFailed(RuntimeError):
    """The GPU a model runs on failed while it computed (llama.cpp's decode failed there: its
    memory, a lost device), in one sentence that names the GPU and llama.cpp's error and says
    what Iris did: the GPU is off for the rest of this run (:class:`.gpu.GpuChecks`), and the
    next start checks it again; or, ``runs`` above 1 (it failed in use in that many runs in
    a row), it is off until its driver changes, and ``again`` says how to check it again
    (the command that forgets its record, :meth:`.gpu.GpuChecks.again`). What the reply had
    said before stays (the caller keeps it)."""

    def __init__(self, device: str, error: str, during: str = "the reply", *, runs: int = 1,
                 again: str = "") -> None:
        self.device = device
        self.error = error
        self.runs = runs
        if runs > 1:
            super().__init__(f"{device}, the GPU it runs on, failed during {during} ({error}), in {runs} runs of "
                             "Iris in a row; Iris runs the model on the CPU until the GPU's driver changes"
                             + (f" ({again})" if again else ""))
        else:
            super().__init__(f"{device}, the GPU it runs on, failed during {during} ({error}); "
                             + AGAIN_NEXT_RUN)
