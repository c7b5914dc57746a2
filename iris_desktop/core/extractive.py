"""The extractive summarizer (ADR-0079's fallback): deterministic, no model needed.

It keeps concrete facts rather than prose: user requests, file paths (from tool calls and
outputs), dates, names and numbers, and the last assistant conclusions. Relative dates
("yesterday", "last year") are resolved against the date the conversation states at the
start of each session (LoCoMo's ``[1:56 pm on 8 May, 2023]``), so that a fact keeps its
"when" after the message that said it is gone.
"""

from __future__ import annotations

import datetime as dt
import re
from collections import Counter
from dataclasses import dataclass

from iris_desktop.core.summary import ConversationSummary
from iris_desktop.core.tokens import Message, TokenCounter, message_text

PATH_RE = re.compile(
    r"(?<![\w/.])(?:~|\.{1,2})?(?:/[\w.\-@+]+)+/?|(?<![\w/])[\w\-]+(?:/[\w.\-]+)+\.\w{1,6}\b"
    r"|\b[\w\-]+\.(?:py|js|ts|tsx|rs|go|c|h|cpp|java|md|txt|json|toml|yaml|yml|cfg|ini|sh|html|css)\b"
)
SESSION_DATE_RE = re.compile(
    r"^\[(?:[^\]]*?\bon\s+)?(\d{1,2})\s+([A-Za-z]+),?\s+(\d{4})\]\s*"
)
MONTHS = {m: i for i, m in enumerate(
    ["january", "february", "march", "april", "may", "june", "july", "august", "september",
     "october", "november", "december"], start=1)}
MONTH_NAMES = [m.capitalize() for m in MONTHS]
WEEKDAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
NUMBER_RE = re.compile(r"\b\d[\d,.:]*\b")
NAME_RE = re.compile(r"(?<![.!?]\s)(?<!^)\b[A-Z][a-z]+(?:\s+[A-Z][a-z]+)*")
SENTENCE_RE = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(\[])")
FILLER_RE = re.compile(
    r"^(?:(?:hey|hi|hello|wow|oh|ah|yeah|yes|no|sure|thanks|thank you|awesome|great|cool|"
    r"nice|haha|lol|omg|totally|definitely|absolutely|aww|ooh|hmm|well|so)\b[\s,!.]*)+",
    re.IGNORECASE,
)
EMOTION_WORDS = {
    "happy", "sad", "excited", "proud", "worried", "anxious", "stressed", "grateful",
    "thankful", "love", "loved", "scared", "angry", "frustrated", "glad", "thrilled",
    "nervous", "lonely", "hopeful", "inspired", "overwhelmed", "upset", "relieved", "amazing",
}
DECISION_WORDS = re.compile(
    r"\b(?:decided|decide|will|going to|plan(?:ning)? to|chose|choose|agreed|let's|should|"
    r"fix(?:ed)?|change[sd]?)\b", re.IGNORECASE)
STOPWORDS = set(
    "the a an and or but if then so to of in on at for with from by about as is are was were be "
    "been being it its this that these those i you he she we they me him her us them my your "
    "his our their what which who whom how when where why not no yes do does did have has had "
    "can could would should will just really very too also more most much many some any all "
    "there here up out over into than like get got go going know think feel one two im it's "
    "i'm you're that's don't can't".split()
)


@dataclass
class Fact:
    text: str
    score: float
    order: int
    tokens: int


def session_date(text: str) -> dt.date | None:
    match = SESSION_DATE_RE.match(text or "")
    if not match:
        return None
    day, month, year = match.groups()
    month_number = MONTHS.get(month.lower())
    if not month_number:
        return None
    try:
        return dt.date(int(year), month_number, int(day))
    except ValueError:
        return None


def fmt_date(date: dt.date) -> str:
    return f"{date.day} {MONTH_NAMES[date.month - 1]} {date.year}"


def resolve_relative(sentence: str, today: dt.date | None) -> str:
    """Append absolute dates for relative expressions, e.g. 'yesterday (7 May 2023)'."""
    if today is None:
        return sentence

    def sub(pattern: str, value) -> None:
        nonlocal sentence
        sentence = re.sub(pattern, lambda m: f"{m.group(0)} ({value})", sentence, count=1,
                          flags=re.IGNORECASE)

    lowered = sentence.lower()
    if "yesterday" in lowered:
        sub(r"\byesterday\b", fmt_date(today - dt.timedelta(days=1)))
    if "today" in lowered or "tonight" in lowered:
        sub(r"\b(?:today|tonight)\b", fmt_date(today))
    if "last week" in lowered:
        sub(r"\blast week\b", f"the week before {fmt_date(today)}")
    if "last weekend" in lowered:
        sub(r"\blast weekend\b", f"the weekend before {fmt_date(today)}")
    if "last month" in lowered:
        prev = today.replace(day=1) - dt.timedelta(days=1)
        sub(r"\blast month\b", f"{MONTH_NAMES[prev.month - 1]} {prev.year}")
    if "last year" in lowered:
        sub(r"\blast year\b", str(today.year - 1))
    if "this year" in lowered:
        sub(r"\bthis year\b", str(today.year))
    if "next month" in lowered:
        nxt = (today.replace(day=28) + dt.timedelta(days=4)).replace(day=1)
        sub(r"\bnext month\b", f"{MONTH_NAMES[nxt.month - 1]} {nxt.year}")
    match = re.search(r"\b(\w+) (days|weeks|months|years) ago\b", lowered)
    if match:
        sub(re.escape(match.group(0)), f"before {fmt_date(today)}")
    match = re.search(r"\blast (" + "|".join(WEEKDAYS) + r")\b", lowered)
    if match:
        target = WEEKDAYS.index(match.group(1))
        delta = (today.weekday() - target) % 7 or 7
        sub(re.escape(match.group(0)), fmt_date(today - dt.timedelta(days=delta)))
    return sentence


def _sentences(text: str) -> list[str]:
    text = " ".join(text.split())
    return [s.strip() for s in SENTENCE_RE.split(text) if s.strip()]


FIRST_PERSON_RE = re.compile(r"\b(?:I|my|I'm|I've|we|our)\b")


def _score(sentence: str) -> float:
    """How much checkable fact a sentence holds: names, numbers, resolved dates, and
    first-person events ("I went…", "my sister…"), which is what people ask about later."""
    words = sentence.split()
    if len(words) < 3:
        return 0.0
    names = len(NAME_RE.findall(sentence))
    numbers = len(NUMBER_RE.findall(sentence))
    dated = 2.0 if re.search(r"\d{4}\)", sentence) else 0.0
    first_person = len(FIRST_PERSON_RE.findall(sentence))
    return 2.0 * names + 2.0 * numbers + dated + first_person + 0.3 * len(words)


class ExtractiveSummarizer:
    """Deterministic summaries from the archived messages (and the previous summary)."""

    path = "extractive"

    def __init__(self, counter: TokenCounter):
        self.counter = counter

    def facts(self, messages: list[Message], start_turn: int = 0) -> list[Fact]:
        today: dt.date | None = None
        facts: list[Fact] = []
        order = 0
        speaker = {"user": "U", "assistant": "A"}
        for message in messages:
            role = message.get("role")
            text = message_text(message) if role != "tool" else ""
            date = session_date(text)
            if date is not None:
                today = date
                text = SESSION_DATE_RE.sub("", text)
            if role not in speaker:
                continue
            for sentence in _sentences(text):
                sentence = FILLER_RE.sub("", sentence).strip()
                if not sentence:
                    continue
                sentence = resolve_relative(sentence, today)
                score = _score(sentence)
                if score <= 0:
                    continue
                when = f"{fmt_date(today)} " if today else ""
                line = f"{when}{speaker[role]}: {sentence}"
                facts.append(Fact(line, score, order, self.counter.count_text(line)))
                order += 1
        return facts

    def summarize(
        self,
        previous: ConversationSummary | None,
        messages: list[Message],
        max_tokens: int,
        turns: tuple[int, int] = (0, 0),
    ) -> ConversationSummary:
        users = [m for m in messages if m.get("role") == "user" and (m.get("content") or "").strip()]
        assistants = [m for m in messages if m.get("role") == "assistant"
                      and isinstance(m.get("content"), str) and m["content"].strip()]
        paths = _paths(messages)
        previous = previous or ConversationSummary()

        requests = [_clip(SESSION_DATE_RE.sub("", message_text(m)), 160) for m in users[-3:]]
        conclusions = [_clip(a["content"], 200) for a in assistants[-2:]]
        decisions = [_clip(s, 160) for m in assistants for s in _sentences(m["content"])
                     if DECISION_WORDS.search(s) and not s.endswith("?")][-4:]
        emotions = [s for m in messages if m.get("role") in ("user", "assistant")
                    for s in _sentences(message_text(m))
                    if EMOTION_WORDS & {w.lower().strip(".,!?") for w in s.split()}]
        themes = _themes(messages)
        dates = [session_date(message_text(m)) for m in messages]
        dates = [d for d in dates if d]

        narrative = self._narrative(previous, users, assistants, paths, dates, turns)
        summary = ConversationSummary(
            summary=narrative,
            accomplishments=_merge(previous.accomplishments, conclusions, 4),
            key_decisions=_merge(previous.key_decisions, decisions, 4),
            relevant_files=_merge(previous.relevant_files, paths, 12),
            active_goals=requests or previous.active_goals,
            emotional_thread=_clip(emotions[-1], 200) if emotions else previous.emotional_thread,
            relationship_dynamics=previous.relationship_dynamics
            or _dynamics(users, assistants),
            evolving_themes=_merge(previous.evolving_themes, themes, 6),
            facts=list(previous.facts),
        )
        return self.fill_facts(summary, messages, max_tokens)

    def fill_facts(
        self, summary: ConversationSummary, messages: list[Message], max_tokens: int
    ) -> ConversationSummary:
        """Choose the densest facts (score per token), old and new together, to fill what
        the other fields leave of the cap. Old facts come first, then new ones, in order."""
        old = [Fact(text, _score(text.split(": ", 1)[-1]), i - len(summary.facts),
                    self.counter.count_text(text))
               for i, text in enumerate(summary.facts)]
        base = ConversationSummary.from_fields({**summary.as_fields(), "facts": []})
        base = base.fit(self.counter, max_tokens)
        spare = max_tokens - self.counter.count_text(base.render()) - 8  # the facts heading
        candidates = sorted([*old, *self.facts(messages)],
                            key=lambda f: f.score / max(f.tokens, 1), reverse=True)
        chosen: list[Fact] = []
        for fact in candidates:
            cost = fact.tokens + 2  # "- " and the newline
            if fact.score > 0 and cost <= spare:
                chosen.append(fact)
                spare -= cost
        chosen.sort(key=lambda f: f.order)
        base.facts = [f.text for f in chosen]
        return base.fit(self.counter, max_tokens)

    def _narrative(self, previous, users, assistants, paths, dates, turns) -> str:
        parts: list[str] = []
        if previous.summary:
            parts.append(_clip(previous.summary, 600))
        span = f"turns {turns[0]}–{turns[1]}" if turns[1] else "the earlier turns"
        when = ""
        if dates:
            when = f", from {fmt_date(dates[0])} to {fmt_date(dates[-1])}"
        parts.append(
            f"In {span}{when} the user wrote {len(users)} messages and the assistant "
            f"{len(assistants)} replies."
        )
        if users:
            first = _clip(SESSION_DATE_RE.sub("", message_text(users[0])), 220)
            last = _clip(SESSION_DATE_RE.sub("", message_text(users[-1])), 220)
            parts.append(f"The user began with: \"{first}\"")
            if len(users) > 1:
                parts.append(f"Most recently the user said: \"{last}\"")
        if assistants:
            parts.append(f"The assistant's last conclusion: \"{_clip(assistants[-1]['content'], 260)}\"")
        if paths:
            parts.append("Files involved: " + ", ".join(paths[:8]) + ".")
        text = " ".join(parts)
        words = text.split()
        return " ".join(words[:300])


def _clip(text: str, limit: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _merge(old: list[str], new: list[str], limit: int) -> list[str]:
    out: list[str] = []
    for item in [*old, *new]:
        if item and item not in out:
            out.append(item)
    return out[-limit:]


def _paths(messages: list[Message]) -> list[str]:
    """File paths from tool calls, outputs and text, most mentioned first."""
    texts = [message_text(m) for m in messages]
    found: list[str] = []
    for text in texts:
        for match in PATH_RE.findall(text):
            path = match.rstrip(".,:;)")
            if len(path) > 2 and path not in found and not path.startswith("//"):
                found.append(path)
    counts = Counter({path: sum(path in text for text in texts) for path in found})
    return sorted(found, key=lambda p: (-counts[p], found.index(p)))[:20]


def _themes(messages: list[Message]) -> list[str]:
    words = Counter()
    for message in messages:
        if message.get("role") not in ("user", "assistant"):
            continue
        for word in re.findall(r"[A-Za-z][a-z]{3,}", message_text(message)):
            lowered = word.lower()
            if lowered not in STOPWORDS:
                words[lowered] += 1
    return [w for w, _ in words.most_common(6)]


def _dynamics(users, assistants) -> str:
    if not users and not assistants:
        return ""
    return (f"{len(users)} user messages and {len(assistants)} assistant replies in the "
            "archived part.")
