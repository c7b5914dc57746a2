"""What the engine and the host need from a runtime, written down once.

A *runtime* is a model that counts and generates: the in-process
:class:`~.model.LocalModel`, a model behind an OpenAI-compatible server
(:class:`~.remote.RemoteRuntime`, :class:`~.remote.ExactRemoteRuntime`), and the tests'
scripted fake. Each satisfies :class:`Runtime`, and a test checks every one of them
against it, signature by signature (``tests/test_protocol.py``).

Results carry their own numbers (simonw/llm's ``Response``): :meth:`Runtime.stream`
returns a :class:`Generation`, whose ``stats`` hold the usage and timing once its text
has been read; :meth:`Runtime.prefill` returns a :class:`Prefill` that reports its
progress as it goes and its :class:`PrefillStats` at the end. Nothing is read back from
the runtime afterwards.

What a runtime can do is said by its :class:`Capabilities`, never probed with
``hasattr``: a method a runtime cannot honour (``prefill`` on a server that caches on
its own) raises :class:`Unsupported`, and its flag says so beforehand.

Threads: ``stream``, ``prefill``, the KV state methods and ``close`` run on the thread
that owns the runtime (the GUI's model thread, the CLI's main thread); the counting
methods (``counter``, ``count_prompt``, ``tool_tokens``) are safe from any thread and
raise ``RuntimeError`` once the runtime is closed.

This module imports nothing of Iris but the shared token vocabulary
(:mod:`iris_desktop.tokens`); ``core`` states what it asks of a model in
:mod:`iris_desktop.core.ports`, a subset of this interface (checked by a test).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from iris_desktop.generation import GenerationRequest, GenerationStats
from iris_desktop.stop import Stop
from iris_desktop.tokens import Message, TokenCounter

__all__ = [
    "Capabilities",
    "Generation",
    "KVState",
    "ModelFacts",
    "Prefill",
    "PrefillStats",
    "Runtime",
    "Unsupported",
]


class Unsupported(NotImplementedError):
    """This runtime cannot do that; its :class:`Capabilities` said so."""


@dataclass(frozen=True)
class Capabilities:
    """What a runtime can do beyond counting and streaming."""

    #: ``count_prompt`` is the prompt size the model then reports, to the token
    exact_counts: bool = False
    #: the chat template renders tool definitions itself (``GenerationRequest.tools``)
    native_tools: bool = False
    #: ``prefill`` evaluates a prompt into a cache this process keeps
    prefill: bool = False
    #: ``kv_state`` / ``restore_kv_state`` save and restore that cache
    kv_state: bool = False


@dataclass
class PrefillStats:
    prompt_tokens: int
    reused_tokens: int  # already in the KV cache
    evaluated_tokens: int  # evaluated by this prefill
    stopped: bool  # preempted or cancelled before the end


T = TypeVar("T")
S = TypeVar("S")


class _Result(Generic[T, S]):
    """An iterator over a runtime's work that ends holding its statistics.

    ``run(result)`` makes the generator; it sets ``result.stats`` before it ends, also
    when it is closed early or fails. Nothing runs until the first ``next``.
    """

    def __init__(self, run: Callable[[Any], Iterator[T]]) -> None:
        self.stats: S | None = None
        self._items = run(self)

    def __iter__(self) -> _Result[T, S]:
        return self

    def __next__(self) -> T:
        return next(self._items)

    def close(self) -> None:
        """Stop early (as a cancel); ``stats`` then say what was done."""
        self._items.close()

    def __enter__(self) -> _Result[T, S]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Generation(_Result[str, GenerationStats]):
    """A reply being generated: iterate for its text pieces; once they end (or after
    :meth:`close`), ``stats`` holds its :class:`GenerationStats`. A piece may be ``""``:
    nothing new yet (a server that is silent), yielded so that the caller can save what
    came on its own cadence; it is no token."""

    def text(self) -> str:
        """Read the rest of the reply and return it."""
        return "".join(self)


class Prefill(_Result[tuple[int, int], PrefillStats]):
    """A prompt being evaluated into the KV cache: iterate for ``(evaluated, total)``
    prompt tokens after each batch; once it ends, ``stats`` holds its
    :class:`PrefillStats`."""

    def run(self) -> PrefillStats:
        """Evaluate all of it; returns the stats."""
        for _ in self:
            pass
        assert self.stats is not None
        return self.stats


@dataclass(frozen=True)
class KVState:
    """A copy of the KV cache: the prompt tokens it holds and the runtime's bytes for
    their keys and values."""

    tokens: list[int]
    data: bytes


@dataclass(frozen=True)
class ModelFacts:
    """What the UI and the CLI show of a runtime (the status bar, About, ``--json``)."""

    name: str
    #: the file or served model's name, as requests record it
    file: str
    path: str
    n_ctx: int
    context_length: int | None = None
    base_model: bool = False
    architecture: str = ""
    file_type: str = ""
    size_bytes: int = 0
    chat_format: str = ""
    load_time_s: float | None = None
    #: where the conversation goes: "local", or "server: host:port"
    where: str = "local"
    base_url: str | None = None
    license: str = ""
    #: where a local model runs: "GPU: <name> · 28/29 layers" or "CPU" ("" for a server),
    #: and why, in one sentence (``runtime.gpu.GpuPlan``); ``device_notice`` is that
    #: sentence when it is worth telling (a GPU wanted or found, and not used fully)
    device: str = ""
    device_reason: str = ""
    device_notice: str = ""


class NamedFormat(Protocol):
    """A chat format, as far as the host and the UI need it."""

    name: str


@runtime_checkable
class Runtime(Protocol):
    """The interface of every runtime. See the module docstring for threads."""

    #: what it can do beyond counting and streaming
    capabilities: Capabilities
    #: a base (pretrained-only) model: it continues text rather than following
    #: instructions (the UI marks it, compaction skips the LLM summary)
    base_model: bool
    chat_format: NamedFormat
    #: what tokenization and the chat template depend on (a KV state, a counter's name)
    identity: str
    #: the model's file or served name, as requests record it
    model_name: str
    #: where the conversation goes: "local", or "server: host:port"
    where: str
    #: the server's address (None for a model in this process)
    base_url: str | None
    #: the model runs on this machine (in-process or on a loopback server)
    is_loopback: bool
    #: what the user must be told before a conversation is sent (plain http to another
    #: machine), or None
    warning: str | None
    load_time_s: float

    @property
    def n_ctx(self) -> int:
        """The window the runtime allocated (or the server runs the model with)."""
        ...

    @property
    def window_source(self) -> str:
        """Where ``n_ctx`` came from: "model", "server" or "config"."""
        ...

    @property
    def closed(self) -> bool: ...

    def counter(self) -> TokenCounter:
        """The token counter of this runtime's tokenizer and template (or estimate)."""
        ...

    def count_prompt(self, messages: list[Message], tools: list[dict] | None = None) -> int:
        """The prompt tokens a request for ``messages`` evaluates: exact when
        ``capabilities.exact_counts``, else an estimate."""
        ...

    def tool_tokens(self, tools: list[dict]) -> int:
        """What passing ``tools`` to the template adds to a prompt (0 without native
        tools)."""
        ...

    def render_prompt(self, messages: list[Message]) -> str:
        """The prompt as text, for display (a server shows its request as JSON)."""
        ...

    def stream(self, request: GenerationRequest) -> Generation:
        """Generate the reply ``request`` asks for (``iris_desktop.generation``). A
        trailing assistant message marked ``"prefix": True`` (``tokens.continues_reply``)
        is continued rather than closed (a stopped reply goes on), and ``count_prompt``
        counts it so. Its ``cancel`` (checked between tokens and during prompt
        evaluation), its ``deadline`` (``time.monotonic()``) and closing the Generation
        stop it with ``finish_reason`` "cancelled". Its ``progress(done, total)`` follows
        the prompt's evaluation where the runtime can tell: once before it (``done``: the
        tokens already cached), then after each batch. Raises ``PromptTooLongError`` (at
        the first ``next``) for a prompt that leaves no room."""
        ...

    def prefill(self, messages: list[Message], tools: list[dict] | None = None, *,
                cancel: Stop | None = None) -> Prefill:
        """Evaluate the prompt of ``messages`` into the cache without generating; only
        what differs from the cache is evaluated. ``cancel`` (anything with
        ``is_set()``) stops it between two graph nodes. Raises :class:`Unsupported`
        unless ``capabilities.prefill``."""
        ...

    def kv_state(self) -> KVState | None:
        """A copy of the KV cache (None: empty, or ``capabilities.kv_state`` is False)."""
        ...

    def restore_kv_state(self, state: KVState) -> bool:
        """Replace the KV cache with ``state``; False when it is refused (the cache is
        then empty), or ``capabilities.kv_state`` is False."""
        ...

    def describe(self) -> ModelFacts:
        """Plain facts for the status bar, About and ``--json``."""
        ...

    def close(self) -> None:
        """Free the model (or the connection). Idempotent; a generation on another
        thread stops at its next token."""
        ...
