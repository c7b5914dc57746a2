"""What ``core`` asks of a model: the part of the runtime interface the planner, the agent
and the compactor use.

``core`` never imports ``runtime``; the host hands it a runtime, and every runtime
satisfies :class:`iris_desktop.runtime.protocol.Runtime`, of which :class:`ChatModel` is a
subset (``tests/test_protocol.py`` checks it member by member: every parameter named
here is the runtime's, with the same kind and default).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Protocol

from iris_desktop.tokens import Message, TokenCounter


class Usage(Protocol):
    """What one generation cost (``runtime.protocol.GenerationStats``)."""

    prompt_tokens: int
    reused_tokens: int
    evaluated_tokens: int
    completion_tokens: int
    time_to_first_token_s: float
    tokens_per_s: float
    duration_s: float
    #: stop | length | cancelled | error
    finish_reason: str


class Reply(Protocol):
    """A reply being generated: its text pieces, then its ``stats``."""

    stats: Usage | None

    def __iter__(self) -> Iterator[str]: ...

    def close(self) -> None: ...


class Abilities(Protocol):
    exact_counts: bool
    native_tools: bool


class ChatModel(Protocol):
    """A model to count with and to answer (the host gives ``core`` one of these)."""

    capabilities: Abilities
    base_model: bool
    model_name: str

    @property
    def n_ctx(self) -> int: ...

    @property
    def window_source(self) -> str: ...

    def counter(self) -> TokenCounter: ...

    def count_prompt(self, messages: list[Message], tools: list[dict] | None = None) -> int: ...

    def tool_tokens(self, tools: list[dict]) -> int: ...

    def stream(
        self,
        messages: list[Message],
        *,
        max_tokens: int,
        temperature: float = 0.7,
        cancel: threading.Event | None = None,
        json_schema: dict | None = None,
        repeat_penalty: float = 1.0,
        seed: int | None = None,
        tools: list[dict] | None = None,
        deadline: float | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> Reply:
        """The runtime's ``stream``; core passes only these of its options."""
        ...
