"""One generation request and what it cost: the values every runtime's ``stream`` takes
and gives back, written down once.

``core`` asks for a reply with a :class:`GenerationRequest` (``core.ports.ChatModel``),
``runtime`` answers it (``runtime.protocol.Runtime``): the local model, a server and the
tests' scripted fake all take this one object, so no ``stream(...)`` keyword signature is
written twice. The :class:`Generation`'s ``stats`` are :class:`GenerationStats`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from iris_desktop.stop import Stop
from iris_desktop.tokens import Message


@dataclass(frozen=True)
class GenerationRequest:
    """A reply to ``messages``, at most ``max_tokens`` long.

    - sampling: ``temperature`` (0: greedy), ``top_k``, ``top_p``, ``min_p``,
      ``repeat_penalty``, ``dry_multiplier``, ``seed`` (None: the runtime's own);
    - shape: ``tools`` (OpenAI definitions, for a template or a server that takes them),
      ``json_schema`` or an OpenAI ``response_format`` (the output constrained to it),
      ``stop`` (strings that end the reply);
    - when it ends early: ``cancel`` (checked between tokens and while the prompt is
      read), ``deadline`` (a ``time.monotonic()`` value); either ends it with
      ``finish_reason`` "cancelled";
    - ``progress(done, total)``: how far the prompt has been read, where the runtime can
      tell.

    A trailing assistant message marked ``"prefix": True`` is continued, not closed.
    """

    messages: list[Message]
    max_tokens: int
    temperature: float = 0.7
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    #: llama.cpp's DRY sampler against repeated passages (0: off)
    dry_multiplier: float = 0.0
    seed: int | None = None
    tools: list[dict] | None = None
    json_schema: dict | None = None
    response_format: dict | None = None
    stop: list[str] | None = None
    cancel: Stop | None = field(default=None, compare=False)
    deadline: float | None = None
    progress: Callable[[int, int], None] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")

    def but(self, **changes: Any) -> GenerationRequest:
        """This request with ``changes`` (``dataclasses.replace``)."""
        return replace(self, **changes)


@dataclass
class GenerationStats:
    """What one generation cost, as the runtime measured it."""

    #: tokens of the whole prompt (what llama.cpp's ``prompt_tokens`` would report)
    prompt_tokens: int
    #: prompt tokens kept from the previous request's KV cache (not evaluated again)
    reused_tokens: int
    #: prompt tokens evaluated for this request (``prompt_tokens - reused_tokens``;
    #: counted where they are evaluated, not predicted)
    evaluated_tokens: int
    #: generated tokens, end-of-turn token excluded
    completion_tokens: int
    #: from the call to the first generated token (prompt evaluation + one sample)
    time_to_first_token_s: float
    #: decode speed after the first token: (completion_tokens - 1) / time between the
    #: first and the last token; 0.0 with fewer than two tokens
    tokens_per_s: float
    duration_s: float
    #: "stop" (end of turn, stop string, grammar complete) | "length" (max_tokens or the
    #: context is full) | "cancelled" | "error"
    finish_reason: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
