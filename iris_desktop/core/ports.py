"""What ``core`` asks of a model: the part of the runtime interface the planner, the agent
and the compactor use.

``core`` never imports ``runtime``; the host hands it a runtime, and every runtime
satisfies :class:`iris_desktop.runtime.protocol.Runtime`, of which :class:`ChatModel` is a
subset (``tests/test_protocol.py`` checks it member by member: every parameter named
here is the runtime's, with the same kind and default). A reply is asked for with one
``iris_desktop.generation.GenerationRequest``, and costs a ``GenerationStats``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from iris_desktop.generation import GenerationRequest, GenerationStats
from iris_desktop.tokens import Message, TokenCounter


class Reply(Protocol):
    """A reply being generated: its text pieces, then its ``stats``."""

    stats: GenerationStats | None

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

    def stream(self, request: GenerationRequest) -> Reply:
        """The runtime's ``stream``: the reply ``request`` asks for."""
        ...


class Reranker(Protocol):
    """What recall asks of a cross-encoder (``runtime.reranker.CrossEncoder``): one
    relevance score per passage for a query, read together, higher = more relevant.
    It may raise (a closed or broken model); recall then keeps its own order."""

    #: names the model and its file's hash
    identity: str
    #: the most tokens of a question it reads (it cuts a longer one at its end). Optional
    #: with :meth:`query_tokens`: without them recall keeps a long message's question
    #: within 48 of the chat model's tokens (``core.recall.RERANK_QUERY_TOKENS``)
    max_query_tokens: int

    def query_tokens(self, text: str) -> int: ...

    def score(self, query: str, passages: Sequence[str]) -> Sequence[float]: ...
