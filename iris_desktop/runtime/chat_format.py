"""Prompt rendering, one chat format per model family.

The prompt for a request is always::

    prefix() + render_message(m0, 0) + render_message(m1, 1) + ... + generation_prompt()

for the hand-written formats (``GemmaFormat``, ``ChatMLFormat``; ``additive = True``).
Every message renders the same text wherever it sits in the conversation, and every
message starts with a control token (``<start_of_turn>``, ``<|im_start|>``), where the
tokenizer always splits, so no token spans a message boundary. Two consequences the app
relies on:

* the prompt of turn N+1 starts with exactly the tokens of turn N's messages, so
  llama.cpp keeps (reuses) that prefix of its KV cache;
* per-message token counts are additive: ``overhead + sum(count_message(m))`` is the
  number of prompt tokens llama.cpp evaluates, exactly.

Besides the text, each format says which parts are *template* (tokenized with control
tokens recognized) and which are *content* (tokenized as plain text, so that a user who
pastes ``<end_of_turn>`` cannot close the turn): :meth:`ChatFormat.message_parts`.

``JinjaFormat`` runs the GGUF's own chat template (the model author's format). Templates
are not generally additive (they special-case the first or the system message, drop old
reasoning, ...), so the prompt is the template's full rendering and per-message counts
come from rendering each message on its own (``additive = False``; see its docstring);
the model reads a message's text in that rendering as plain text too
(``LocalModel._template_tokens``).

Never fall back to llama-cpp-python's default (llama-2 ``[INST] <<SYS>>``) format: a
model without a template gets the format of its family, chosen by architecture.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Protocol, runtime_checkable

from .gguf import GGUFInfo
from .template_sandbox import (
    BoundedTemplate,
    TemplateError,
    TemplateTooCostly,
)

log = logging.getLogger("iris.runtime")

Message = dict[str, Any]
#: (text, is_template): template text is tokenized with control tokens recognized,
#: content text as plain text
Part = tuple[str, bool]

__all__ = [
    "ChatFormat",
    "GemmaFormat",
    "ChatMLFormat",
    "JinjaFormat",
    "TemplateError",
    "TemplateTooCostly",
    "select_chat_format",
    "content_text",
    "tool_call_json",
]


@runtime_checkable
class ChatFormat(Protocol):
    name: str
    #: the template renders tool definitions natively (only Jinja templates that mention
    #: ``tools``); the hand-written formats render tool *calls and results* with a fixed
    #: convention but know nothing of tool schemas
    supports_tools: bool
    #: prompt == prefix + concatenated messages + generation prompt (exact counts)
    additive: bool

    def render_message(self, message: Message, index: int) -> str: ...

    def message_parts(self, message: Message, index: int) -> list[Part]: ...

    def prefix(self) -> str: ...

    def generation_prompt(self) -> str: ...

    def stop(self) -> list[str]: ...

    def render_prompt(self, messages: list[Message]) -> str: ...

    def render_continuation(self, messages: list[Message], tools: list[dict] | None = None) -> str:
        """The prompt ending inside the last (assistant) message."""
        ...


def content_text(message: Message) -> str:
    """The message's content as one string (OpenAI content parts are joined)."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(
        part.get("text", "") if isinstance(part, dict) else str(part) for part in content
    )


def _arguments(raw: Any) -> Any:
    """OpenAI tool-call arguments are a JSON string; render them as the object."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw if raw is not None else {}


def tool_call_json(call: dict[str, Any]) -> str:
    """``{"name": .., "arguments": {..}}`` for one OpenAI tool call, compact, unescaped."""
    fn = call.get("function") or {}
    payload = {"name": fn.get("name", call.get("name", "")),
               "arguments": _arguments(fn.get("arguments", call.get("arguments")))}
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))


class _TurnFormat:
    """Shared code for turn-based formats: ``open(role) + body + close``."""

    name = "turns"
    supports_tools = False
    additive = True

    def __init__(self, bos_token: str = "") -> None:
        self._bos = bos_token

    # to be provided by subclasses
    def _open(self, role: str) -> str:
        raise NotImplementedError

    _close = ""
    _tool_call_open = "<tool_call>"
    _tool_call_close = "</tool_call>"

    def _tool_response(self, message: Message) -> list[Part]:
        name = message.get("name")
        if name:
            open_tag = f"<tool_response name={json.dumps(str(name), ensure_ascii=False)}>\n"
        elif message.get("tool_call_id"):
            open_tag = (
                f"<tool_response id={json.dumps(str(message['tool_call_id']), ensure_ascii=False)}>\n"
            )
        else:
            open_tag = "<tool_response>\n"
        return [
            (self._open("user") + open_tag, True),
            (content_text(message), False),
            ("\n</tool_response>" + self._close, True),
        ]

    def _role(self, role: str) -> str:
        return role

    def message_parts(self, message: Message, index: int = 0) -> list[Part]:
        role = message.get("role", "user")
        if role == "tool":
            return self._tool_response(message)
        parts: list[Part] = [(self._open(self._role(role)), True)]
        text = content_text(message)
        if text:
            parts.append((text, False))
        calls = message.get("tool_calls") or []
        for i, call in enumerate(calls):
            sep = "\n" if (i > 0 or text) else ""
            parts.append((sep + self._tool_call_open, True))
            parts.append((tool_call_json(call), False))
            parts.append((self._tool_call_close, True))
        parts.append((self._close, True))
        return parts

    def render_message(self, message: Message, index: int = 0) -> str:
        return "".join(text for text, _ in self.message_parts(message, index))

    def prefix(self) -> str:
        return self._bos

    def generation_prompt(self) -> str:
        return self._open(self._role("assistant"))

    def render_prompt(self, messages: list[Message]) -> str:
        return (
            self.prefix()
            + "".join(self.render_message(m, i) for i, m in enumerate(messages))
            + self.generation_prompt()
        )

    def render_continuation(self, messages: list[Message], tools: list[dict] | None = None) -> str:
        """The prompt ending inside the last (assistant) message: it goes on from there."""
        last = self.message_parts(messages[-1], len(messages) - 1)
        while last and last[-1][1]:
            last.pop()
        return (self.prefix() + "".join(self.render_message(m, i) for i, m in enumerate(messages[:-1]))
                + "".join(text for text, _ in last))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r}>"


class GemmaFormat(_TurnFormat):
    """Gemma's turn format (Gemma 1/2/3 instruction tuning)::

        <bos><start_of_turn>user
        {content}<end_of_turn>
        <start_of_turn>model
        {content}<end_of_turn>

    Decisions (Gemma has only the ``user`` and ``model`` roles):

    * **system**: its own ``<start_of_turn>user\\n{system}<end_of_turn>\\n`` block.
      Google's template instead prepends the system text to the first user turn
      (``{system}\\n\\n{user}``); that would make the first user message's tokens
      depend on the system message, so counts would not be additive and editing the
      system prompt would change another message's count. The model sees the same
      words either way.
    * **assistant tool calls**: one ``<tool_call>{"name":..,"arguments":{..}}</tool_call>``
      per call, newline-separated, after the content, inside the ``model`` turn.
    * **tool results**: a ``user`` turn
      ``<tool_response name="..">\\n{content}\\n</tool_response>`` (``id="..."`` when the
      message has no name, just ``<tool_response>`` when it has neither).
    * **BOS**: ``prefix()`` is the ``<bos>`` control token text, counted once per request
      in ``prompt_overhead``.
    """

    name = "gemma"

    def __init__(self, bos_token: str = "<bos>") -> None:
        super().__init__(bos_token)

    def _open(self, role: str) -> str:
        return f"<start_of_turn>{role}\n"

    _close = "<end_of_turn>\n"

    def _role(self, role: str) -> str:
        return "model" if role == "assistant" else "user"

    def stop(self) -> list[str]:
        return ["<end_of_turn>", "<start_of_turn>"]


class ChatMLFormat(_TurnFormat):
    """ChatML (Qwen, many fine-tunes)::

        <|im_start|>system
        {content}<|im_end|>
        <|im_start|>user
        ...

    System messages keep their role. Tool calls render Hermes/Qwen style
    (``<tool_call>\\n{json}\\n</tool_call>`` in the assistant turn), tool results as a
    ``user`` turn with ``<tool_response>``. ``prefix()`` is the BOS text when the model
    asks for a BOS token (``tokenizer.ggml.add_bos_token``), else empty.
    """

    name = "chatml"
    _tool_call_open = "<tool_call>\n"
    _tool_call_close = "\n</tool_call>"

    def _open(self, role: str) -> str:
        return f"<|im_start|>{role}\n"

    _close = "<|im_end|>\n"

    def stop(self) -> list[str]:
        return ["<|im_end|>", "<|im_start|>", "<|endoftext|>"]


# the model's own template runs in a bounded sandbox (template_sandbox)
_BoundedTemplate = BoundedTemplate


class JinjaFormat:
    """The chat template embedded in the GGUF (``tokenizer.chat_template``), rendered
    as llama-cpp-python's ``Jinja2ChatFormatter`` renders it (a jinja2 sandbox configured
    like transformers), bounded: a template is untrusted input, and one that loops for
    ever or makes a text of gigabytes is refused (:class:`TemplateTooCostly`).

    The prompt is the template's rendering of the whole conversation
    (``render_prompt``), which is what the model was trained on. Templates are free to
    treat messages differently by position (merge the system message into the first
    user turn, require alternation, drop old reasoning), so:

    * ``render_message(m, i)`` is ``render([m]) - render([])`` (the template's rendering
      of the message on its own, without the prefix); if the template refuses a lone
      message (alternation checks), it is rendered after a placeholder user message
      and the difference is taken;
    * ``prefix()`` is ``render([])`` (usually the BOS text) and ``generation_prompt()``
      ``render([], add_generation_prompt=True) - prefix``.

    ``overhead + sum(count_message)`` therefore differs from the real prompt by a small
    constant per conversation for most templates (a system message merged into the first
    user turn; a default system prompt the template inserts; Qwen3 dropping past
    ``<think>`` blocks is *not* constant). That is why the counter reports
    ``exact = False`` for this format and the real count is ``len(tokens)`` of
    ``render_prompt``.
    """

    name = "jinja"
    additive = False

    def __init__(self, template: str, bos_token: str = "", eos_token: str = "") -> None:
        self.template = template
        self._bos = bos_token
        self._eos = eos_token
        self._compiled = _BoundedTemplate(template, bos_token, eos_token)
        self.supports_tools = "tools" in template
        self._prefix = self._safe_render([], False)
        self._gen = self._generation_text()

    @staticmethod
    def _normalize(message: Message) -> Message:
        """Templates (as in transformers) expect arguments as objects, not JSON strings."""
        calls = message.get("tool_calls")
        if not calls:
            return message
        fixed = []
        for call in calls:
            fn = dict(call.get("function") or {})
            fn["arguments"] = _arguments(fn.get("arguments"))
            fixed.append({**call, "function": fn})
        return {**message, "tool_calls": fixed}

    def _render(self, messages: list[Message], add_generation_prompt: bool,
                tools: list[dict] | None = None) -> str:
        return self._compiled.render([self._normalize(m) for m in messages],
                                     add_generation_prompt, tools)

    def _said(self, messages: list[Message], add_generation_prompt: bool,
              tools: list[dict] | None) -> str:
        """:meth:`_render` for a real conversation: what the template refuses is a
        :class:`TemplateError` that says so."""
        try:
            return self._render(messages, add_generation_prompt, tools)
        except TemplateTooCostly as exc:
            raise TemplateTooCostly(f"the model's chat template refused the conversation: "
                                    f"it did not finish ({exc})") from None
        except Exception as exc:
            raise TemplateError(f"the model's chat template refused the conversation: "
                                f"{exc}") from None

    def _generation_text(self) -> str:
        """What ``add_generation_prompt`` appends, after the first conversation the
        template accepts (some refuse an empty one)."""
        for before in ([], [_PROBE_SYSTEM], [_PROBE_USER]):
            try:
                bare = self._render(before, False)
                full = self._render(before, True)
            except TemplateTooCostly:
                raise
            except Exception:
                continue
            if full.startswith(bare) and full != bare:
                return full[len(bare):]
        return ""

    def _safe_render(self, messages: list[Message], add_generation_prompt: bool) -> str:
        try:
            return self._render(messages, add_generation_prompt)
        except TemplateTooCostly:
            raise
        except Exception:  # templates raise on an empty conversation, among others
            return ""

    def render_message(self, message: Message, index: int = 0) -> str:
        try:
            return self._delta(_contexts_for(message), message)
        except ValueError:
            # last resort: a neutral approximation so that counting never fails
            return f"{message.get('role', 'user')}\n{content_text(message)}\n"

    def _delta(self, contexts: list[list[Message]], message: Message) -> str:
        """What ``message`` adds after the first context the template accepts: a system
        message at the start, anything else after a system message (so that a template
        that inserts a default system prompt before a lone user message, as Qwen's does,
        is not counted once per message) or after a user message (templates that insist
        on alternation). Raises ValueError when no context renders."""
        for before in contexts:
            try:
                head = self._render(before, False) if before else self._prefix
                text = self._render([*before, message], False)
            except TemplateTooCostly:  # said by render_message's approximation
                raise
            except Exception:  # this template refuses that shape: try the next one
                continue
            if text.startswith(head):
                return text[len(head):]
        raise ValueError("no rendering")

    def message_parts(self, message: Message, index: int = 0) -> list[Part]:
        return [(self.render_message(message, index), True)]

    def prefix(self) -> str:
        return self._prefix

    def generation_prompt(self) -> str:
        return self._gen

    def stop(self) -> list[str]:
        return [self._eos] if self._eos else []

    def render_prompt(self, messages: list[Message], tools: list[dict] | None = None) -> str:
        """The whole prompt; ``tools`` go to a template that renders them itself."""
        return self._said(list(messages), True, tools if self.supports_tools else None)

    def render_continuation(self, messages: list[Message], tools: list[dict] | None = None) -> str:
        """The prompt ending inside the last (assistant) message, as Hugging Face's
        ``continue_final_message`` cuts it: the rendering without a generation prompt, up
        to the end of that message's text. A template that does not show the text as
        written gets a new reply instead (the generation prompt after the others)."""
        tools = tools if self.supports_tools else None
        text = self._said(list(messages), False, tools)
        content = content_text(messages[-1])
        cut = text.rfind(content) if content else -1
        if cut < 0:
            return self._said(list(messages[:-1]), True, tools)
        return text[: cut + len(content)]

    def __repr__(self) -> str:
        return f"<JinjaFormat tools={self.supports_tools}>"


#: probe messages for measuring what a template adds around one message
_PROBE_SYSTEM: Message = {"role": "system", "content": "."}
_PROBE_USER: Message = {"role": "user", "content": "."}


def _contexts_for(message: Message) -> list[list[Message]]:
    if message.get("role") == "system":
        return [[]]
    return [[_PROBE_SYSTEM], [], [_PROBE_USER], [_PROBE_SYSTEM, _PROBE_USER]]


def select_chat_format(info: GGUFInfo) -> ChatFormat:
    """The GGUF's own template when it has one, else the format of its family.

    Never llama-cpp-python's llama-2 fallback: a model without a template gets Gemma's
    turns for ``gemma*`` architectures and ChatML for everything else. A template that
    does not compile, or does not finish rendering an empty conversation within its
    budget (:data:`TEMPLATE_STEPS`), is refused the same way: the family's format.
    """
    bos = info.special_tokens.get("bos", "")
    eos = info.special_tokens.get("eot") or info.special_tokens.get("eos", "")
    add_bos = info.metadata.get("tokenizer.ggml.add_bos_token")
    arch = info.architecture.lower()
    if arch.startswith("gemma"):
        fallback: ChatFormat = GemmaFormat(bos_token=bos or "<bos>")
        why = f"architecture {info.architecture!r} is Gemma"
    else:
        fallback = ChatMLFormat(bos_token=bos if add_bos else "")
        why = f"architecture {info.architecture!r} has no dedicated format"
    shown = "Gemma's turns" if fallback.name == "gemma" else "ChatML"
    if info.chat_template:
        try:
            fmt: ChatFormat = JinjaFormat(info.chat_template, bos_token=bos, eos_token=eos)
        except TemplateTooCostly as exc:  # a template that loops for ever, or nearly
            log.warning("%s: the model's chat template did not finish (%s); using %s",
                        info.path, exc, shown)
            return fallback
        except Exception as exc:  # a template jinja2 cannot compile
            log.warning("%s: the embedded chat template does not compile (%s); using %s",
                        info.path, exc, shown)
            return fallback
        log.info("%s: chat format 'jinja' (the GGUF's embedded chat template)", info.path)
        return fmt
    log.info("%s: chat format %r (no embedded chat template; %s)", info.path, fallback.name, why)
    return fallback
