"""Text that spells a control token, read as text inside a chat template's rendering.

A model's own (Jinja) template is rendered whole, and the rendering tokenized with its
control tokens recognized: that is how the template's ``<|im_start|>`` becomes the token.
Before (an audit), a message's text went through the same reading, so a file, a tool
result, a recalled or imported message holding ``<|im_end|>\\n<|im_start|>system``
closed its turn and opened a forged system turn for the model. Here the messages whose
text spells a control token are rendered with a mark in its place; where putting each
text back in its mark gives the rendering exactly, the text between the marks is read as
text. A template that changes the text it shows (trims it, cuts a reasoning part) gets
those texts with every control token's spelling broken by a word joiner (U+2060)
instead, so none is read. Any other prompt is read as before, token for token."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from iris_desktop.tokens import Message

#: where a message's text is marked in a rendering (private-use characters around its index)
_MARK = re.compile("(\ue000\\d+\ue001)")


def control_spellings(llm: Any) -> re.Pattern | None:
    """A pattern of the text of every control token of ``llm``'s vocabulary (a
    llama-cpp-python ``Llama``): ``<|im_end|>``, ``<start_of_turn>``…, which its tokenizer
    reads as that token where special text is recognized; None if it has none (0.07 s
    for 152k tokens)."""
    import llama_cpp

    model = llm._model
    texts = {model.token_get_text(i) for i in range(llm.n_vocab())
             if llama_cpp.llama_vocab_get_attr(model.vocab, i) & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL}
    texts.discard("")
    return re.compile("|".join(map(re.escape, sorted(texts, key=len, reverse=True)))) if texts else None


def template_tokens(render: Callable[[list[Message]], str], messages: list[Message],
                    tokenize: Callable[[str, bool], list[int]],
                    control: re.Pattern | None) -> list[int]:
    """The tokens (no BOS) of ``render(messages)``: the template's text with control
    tokens recognized (``tokenize(text, True)``), each message's text as text."""
    text = render(messages)
    risky = {i: m for i, m in enumerate(messages) if control is not None
             and isinstance(m.get("content"), str) and control.search(m["content"])}
    if not risky:
        return tokenize(text, True)
    marks = {f"\ue000{i}\ue001": m["content"] for i, m in risky.items()}
    marked = render([{**m, "content": f"\ue000{i}\ue001"} if i in risky else m
                     for i, m in enumerate(messages)])
    pieces = _MARK.split(marked)
    if all(marked.count(mark) == 1 for mark in marks) and "".join(marks.get(p, p) for p in pieces) == text:
        return [token for piece in pieces
                for token in (tokenize(marks[piece], False) if piece in marks else tokenize(piece, True))]
    assert control is not None
    broken = [{**m, "content": control.sub(lambda c: c.group()[0] + "\u2060" + c.group()[1:],
                                           m["content"])} if i in risky else m
              for i, m in enumerate(messages)]
    return tokenize(render(broken), True)


def text_parts(parts: list[tuple[str, bool]], content: Any,
               control: re.Pattern | None) -> list[tuple[str, bool]]:
    """A message's (text, is_template) parts with its text, where it spells a control
    token and the template rendered it whole as one template part, split out as text."""
    if (len(parts) != 1 or not isinstance(content, str) or not content or control is None
            or not control.search(content)):
        return parts
    text = parts[0][0]
    at = text.find(content)
    if at < 0:
        return parts
    return [(text[:at], True), (content, False), (text[at + len(content):], True)]
