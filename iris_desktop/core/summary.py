"""ConversationSummary: the eight fields of seed 1, plus Iris's dated fact ledger.

The summary is injected into the system prompt, so its rendering is what the model sees
and what the budget counts. ``facts`` is Iris's addition to the seed: short, dated,
deterministic lines (who, what, when) that survive chaining better than prose. Its first
``first_facts`` lines are the chat's first facts (the names, numbers and requests of its
earliest turns): chosen before anything else, carried along the chain, and the last thing
:meth:`ConversationSummary.fit` removes when a summary must be shortened.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from iris_desktop.tokens import TokenCounter

TEXT_FIELDS = ("summary", "emotional_thread", "relationship_dynamics")
LIST_FIELDS = ("accomplishments", "key_decisions", "relevant_files", "active_goals",
               "evolving_themes")
FIELDS = ("summary", "accomplishments", "key_decisions", "relevant_files", "active_goals",
          "emotional_thread", "relationship_dynamics", "evolving_themes")
LABELS = {
    "summary": "Summary",
    "accomplishments": "Accomplishments",
    "key_decisions": "Key decisions",
    "relevant_files": "Relevant files",
    "active_goals": "Active goals",
    "emotional_thread": "Emotional thread",
    "relationship_dynamics": "Relationship dynamics",
    "evolving_themes": "Evolving themes",
    "facts": "Facts (dated)",
}

#: what each field holds (the seed's meanings), for the summarizer's instructions
FIELD_MEANINGS = {
    "summary": "a narrative of the whole conversation so far, in order: who said or did "
               "what, when, and what came of it",
    "accomplishments": "what has been done or completed (tasks finished, problems solved, "
                       "things the user achieved or told about)",
    "key_decisions": "decisions made, and why",
    "relevant_files": "file paths that were read, searched, created or changed",
    "active_goals": "what the user is working toward or asked for and is still open",
    "emotional_thread": "how the user has been feeling, and how that changed",
    "relationship_dynamics": "who the people in the conversation are (their names) and how "
                             "they relate to each other and to the assistant",
    "evolving_themes": "topics that keep coming back",
}
#: a list item the schema allows: long enough for a path or a short fact
LIST_ITEM_CHARS = 120
#: a list item costs about this many tokens when a cap is shared out
LIST_ITEM_TOKENS = 24
#: bounds on the items per list, whatever the cap
MIN_LIST_ITEMS, MAX_LIST_ITEMS = 2, 12


def json_schema(max_tokens: int = 768) -> dict[str, Any]:
    """What the grammar-constrained generation must produce (llama.cpp JSON-schema form).
    Lists are bounded from the token cap (half of it shared by the five lists), so a
    small model that repeats itself still stops, and a large cap allows long lists.
    Long ``maxLength`` bounds are avoided because llama.cpp expands them into huge
    grammars."""
    items = max(MIN_LIST_ITEMS, min(MAX_LIST_ITEMS,
                                    max_tokens // 2 // (len(LIST_FIELDS) * LIST_ITEM_TOKENS)))
    return {
        "type": "object",
        "properties": {
            name: ({"type": "string"} if name in TEXT_FIELDS else
                   {"type": "array", "maxItems": items,
                    "items": {"type": "string", "maxLength": LIST_ITEM_CHARS}})
            for name in FIELDS
        },
        "required": list(FIELDS),
    }


JSON_SCHEMA: dict[str, Any] = json_schema()


#: one character written over and over (a small model's loop: "uuuuuuuu…"); not a digit
#: (an amount or an id of many zeros is a fact)
CHARACTER_LOOP_RE = re.compile(r"([^\s\d])\1{15,}")
DATE_PREFIX_RE = re.compile(r"^(\d{1,2} [A-Z][a-z]+ \d{4}) (.+)$", re.DOTALL)


def split_date(fact: str) -> tuple[str, str]:
    """('4 March 2024', 'Rosa: …') for a dated ledger line; ('', line) otherwise."""
    match = DATE_PREFIX_RE.match(fact)
    return (match.group(1), match.group(2)) if match else ("", fact)


class SummaryInvalid(ValueError):
    """Generated output that cannot be used as a summary."""


@dataclass
class ConversationSummary:
    summary: str = ""
    accomplishments: list[str] = field(default_factory=list)
    key_decisions: list[str] = field(default_factory=list)
    relevant_files: list[str] = field(default_factory=list)
    active_goals: list[str] = field(default_factory=list)
    emotional_thread: str = ""
    relationship_dynamics: str = ""
    evolving_themes: list[str] = field(default_factory=list)
    facts: list[str] = field(default_factory=list)
    #: how many of the first ``facts`` are the chat's first facts (kept first, cut last)
    first_facts: int = 0

    def as_fields(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_fields(cls, data: dict[str, Any]) -> ConversationSummary:
        known = {k: data[k] for k in (*FIELDS, "facts", "first_facts") if k in data}
        return cls(**known)

    @classmethod
    def parse(cls, text: str, cut: bool = False) -> ConversationSummary:
        """Parse model output; raises SummaryInvalid for unusable structure or content.
        ``cut``: the reply stopped at its token cap. Its JSON is then closed where it was
        cut (the last value kept as far as it got), and the fields it never reached are
        empty; the usability check still decides whether that is a summary."""
        try:
            # strict=False: a small model writes a raw tab or newline inside a string now
            # and then; the fields are flattened below, and other control characters
            # dropped, so nothing of it reaches the prompt
            data = json.loads(text, strict=False)
        except json.JSONDecodeError as exc:
            closed = close_cut_json(text) if cut else None
            if closed is None:
                why = " (cut off at the token cap)" if cut else ""
                raise SummaryInvalid(f"not JSON ({exc.msg} at {exc.pos}){why}") from None
            try:
                data = json.loads(closed, strict=False)
            except json.JSONDecodeError as again:
                raise SummaryInvalid(
                    f"not JSON ({again.msg} at {again.pos}), cut off at the token cap") from None
            if isinstance(data, dict):
                for name in FIELDS:
                    data.setdefault(name, "" if name in TEXT_FIELDS else [])
        if not isinstance(data, dict):
            raise SummaryInvalid("not a JSON object")
        missing = [f for f in FIELDS if f not in data]
        if missing:
            raise SummaryInvalid("missing fields: " + ", ".join(missing))
        clean: dict[str, Any] = {}
        for name in TEXT_FIELDS:
            if not isinstance(data[name], str):
                raise SummaryInvalid(f"{name} is not text")
            clean[name] = _flat(data[name])
        for name in LIST_FIELDS:
            value = data[name]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise SummaryInvalid(f"{name} is not a list of text")
            clean[name] = _dedupe(_flat(v) for v in value)
        summary = cls(**clean)
        summary.check_usable()
        return summary

    def check_usable(self) -> None:
        """Empty or degenerate output (a small model's loop) is not a summary."""
        words = self.summary.split()
        if len(words) < 20:
            raise SummaryInvalid(f"the narrative has {len(words)} words; at least 20 are needed")
        distinct = len({w.lower() for w in words})
        if distinct < max(8, len(words) // 5):
            raise SummaryInvalid("the narrative repeats itself")
        if CHARACTER_LOOP_RE.search(self.summary):
            raise SummaryInvalid("the narrative repeats one character")

    def render(self) -> str:
        """The text injected into the system prompt."""
        lines: list[str] = []
        for name in (*FIELDS, "facts"):
            value = getattr(self, name)
            if not value:
                continue
            if isinstance(value, str):
                lines.append(f"{LABELS[name]}: {value}")
            elif name == "facts":  # grouped under their dates, each date said once
                lines.append(f"{LABELS[name]}:")
                current = None
                for item in value:
                    date, body = split_date(item)
                    if date and date != current:
                        lines.append(f"{date}:")
                    current = date or current
                    lines.append(f"- {body}")
            else:
                lines.append(f"{LABELS[name]}:")
                lines.extend(f"- {item}" for item in value)
        return "\n".join(lines)

    def fit(self, counter: TokenCounter, max_tokens: int) -> ConversationSummary:
        """A copy whose rendering is at most ``max_tokens``. Drops the oldest facts first
        (never the chat's first facts), then list items from the end and the short text
        fields, then trims the narrative; the chat's first facts go last, the latest of
        them first, so the very first facts of the chat are what a summary keeps longest."""
        fitted = ConversationSummary.from_fields(json.loads(json.dumps(self.as_fields())))
        fitted.first_facts = max(0, min(fitted.first_facts, len(fitted.facts)))

        def size() -> int:
            return counter.count_text(fitted.render())

        order = ("facts", "evolving_themes", "relationship_dynamics", "emotional_thread",
                 "key_decisions", "accomplishments", "active_goals", "relevant_files")
        while size() > max_tokens:
            for name in order:
                value = getattr(fitted, name)
                if name == "facts":
                    if len(value) > max(fitted.first_facts, 1):
                        value.pop(fitted.first_facts)  # the oldest fact after the first ones
                        break
                    continue
                if isinstance(value, list) and len(value) > 1:
                    value.pop(-1)
                    break
                if isinstance(value, str) and value and name != "summary":
                    setattr(fitted, name, "")
                    break
            else:
                words = fitted.summary.split()
                if len(words) > 20:
                    fitted.summary = " ".join(words[: int(len(words) * 0.85)]) + " …"
                    continue
                for name in order:
                    value = getattr(fitted, name)
                    if name == "facts" and value and len(value) > fitted.first_facts:
                        value.pop()  # a last fact that is not one of the first
                        break
                    if name != "facts" and isinstance(value, list) and value:
                        setattr(fitted, name, [])
                        break
                else:
                    if not fitted.first_facts:
                        # a short narrative still over the cap (long words: numbers,
                        # paths, names): cut to what fits, which may be nothing
                        _cut_to(fitted, counter, max_tokens)
                        break
                    fitted.facts.pop(fitted.first_facts - 1)  # the latest first fact
                    fitted.first_facts -= 1
        return fitted


def _cut_to(summary: ConversationSummary, counter: TokenCounter, max_tokens: int) -> None:
    """Cut ``summary``'s narrative to its longest start (ended with " …") with which its
    rendering is at most ``max_tokens``; to "" when even that is too long."""
    text = summary.summary

    def cut(n: int) -> str:
        return text[:n].rstrip() + " …" if n else ""

    def fits(n: int) -> bool:
        summary.summary = cut(n)
        return counter.count_text(summary.render()) <= max_tokens

    low, high = 0, len(text)  # fits(low) is taken as true: "" is the last resort
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    summary.summary = cut(low)


def close_cut_json(text: str) -> str | None:
    """JSON text that stopped mid-way (a reply cut at its token cap), closed: a string
    value being written is ended where it stopped, a key without its value is dropped,
    and the open arrays and objects are closed. None when there is nothing to close."""
    stack: list[str] = []
    in_str = escaped = is_value = expect_key = False
    safe: tuple[int, tuple[str, ...]] | None = None  # a clean end, and what is open there
    for i, char in enumerate(text):
        if in_str:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_str = False
                if is_value:
                    safe = (i + 1, tuple(stack))
            continue
        if char == '"':
            in_str, is_value = True, not (stack and stack[-1] == "{" and expect_key)
        elif char in "{[":
            stack.append(char)
            expect_key = char == "{"
            safe = (i + 1, tuple(stack))
        elif char in "}]":
            if not stack or "{[".index(stack[-1]) != "}]".index(char):
                return None
            stack.pop()
            expect_key = False
            safe = (i + 1, tuple(stack))
        elif char == ":":
            expect_key = False
        elif char == ",":
            expect_key = bool(stack) and stack[-1] == "{"
    closers = {"{": "}", "[": "]"}
    if in_str and is_value and stack:
        body = text[:-1] if escaped else text
        body = re.sub(r"\\u[0-9a-fA-F]{0,3}$", "", body)  # a cut \uXXXX escape
        return body + '"' + "".join(closers[c] for c in reversed(stack))
    if safe is None or not safe[1]:
        return None
    end, open_ = safe
    return text[:end] + "".join(closers[c] for c in reversed(open_))


def _dedupe(items) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    for item in items:
        key = item.lower()
        if item and key not in seen:
            seen.add(key)
            out.append(item)
    return out


def _flat(text: str) -> str:
    """One line: whitespace runs become one space, other control characters go."""
    return "".join(c for c in " ".join(text.split()) if c >= " " and c != "\x7f")
