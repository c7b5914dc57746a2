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

from iris_desktop.core.summary import ConversationSummary, split_date
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
WEEKDAY_ABBREVIATIONS = {"mon": "monday", "tue": "tuesday", "tues": "tuesday", "wed": "wednesday",
                         "thu": "thursday", "thur": "thursday", "thurs": "thursday", "fri": "friday",
                         "sat": "saturday", "sun": "sunday"}
WEEKDAY_WORDS = WEEKDAYS + sorted(WEEKDAY_ABBREVIATIONS, key=len, reverse=True)
NUMBER_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
                "seven": 7, "eight": 8, "nine": 9, "ten": 10, "a couple of": 2}


def _weekday(word: str) -> str:
    """'fri' → 'Friday'; 'week' and 'weekend' stay as they are."""
    word = WEEKDAY_ABBREVIATIONS.get(word, word)
    return word.capitalize() if word in WEEKDAYS else word
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
    """Anchor relative dates to the session's date, so they keep their meaning once the
    message is gone: 'yesterday (7 May 2023)', 'last week (the week before 9 June
    2023)', 'last Friday (the Friday before 27 July 2023)'. An anchored phrase is never
    wrong, where a computed day would be a guess for 'last week' or 'a few days ago'."""
    if today is None:
        return sentence
    anchor = fmt_date(today)

    def sub(pattern: str, value) -> None:
        nonlocal sentence
        sentence = re.sub(pattern, lambda m: f"{m.group(0)} ({value})", sentence, count=1,
                          flags=re.IGNORECASE)

    lowered = sentence.lower()
    if "yesterday" in lowered:
        sub(r"\byesterday\b", fmt_date(today - dt.timedelta(days=1)))
    if "tomorrow" in lowered:
        sub(r"\btomorrow\b", fmt_date(today + dt.timedelta(days=1)))
    if re.search(r"\b(?:today|tonight|this morning|this afternoon)\b", lowered):
        sub(r"\b(?:today|tonight|this morning|this afternoon)\b", anchor)
    day = r"(week(?:end)?|" + "|".join(WEEKDAY_WORDS) + r")"
    match = re.search(r"\b(?:last|this past) " + day + r"\b", lowered)
    if match:
        sub(re.escape(match.group(0)), f"the {_weekday(match.group(1))} before {anchor}")
    match = re.search(r"\bnext " + day + r"\b", lowered)
    if match:
        sub(re.escape(match.group(0)), f"the {_weekday(match.group(1))} after {anchor}")
    match = re.search(r"\bthis (week(?:end)?)\b", lowered)
    if match:
        sub(re.escape(match.group(0)), f"the {match.group(1)} of {anchor}")
    if "last month" in lowered:
        prev = today.replace(day=1) - dt.timedelta(days=1)
        sub(r"\blast month\b", f"{MONTH_NAMES[prev.month - 1]} {prev.year}")
    if "next month" in lowered:
        nxt = (today.replace(day=28) + dt.timedelta(days=4)).replace(day=1)
        sub(r"\bnext month\b", f"{MONTH_NAMES[nxt.month - 1]} {nxt.year}")
    match = re.search(r"\blast (spring|summer|fall|autumn|winter)\b", lowered)
    if match:
        sub(re.escape(match.group(0)), f"the {match.group(1)} of {today.year - 1}")
    if "last year" in lowered:
        sub(r"\blast year\b", str(today.year - 1))
    if "this year" in lowered:
        sub(r"\bthis year\b", str(today.year))
    if "next year" in lowered:
        sub(r"\bnext year\b", str(today.year + 1))
    match = re.search(r"\b(a few|a couple of|\w+) (days?|weeks?|months?|years?) ago\b", lowered)
    if match:
        count = NUMBER_WORDS.get(match.group(1), int(match.group(1)) if match.group(1).isdigit() else None)
        unit = match.group(2).rstrip("s")
        if unit == "day" and count is not None:  # an exact day
            sub(re.escape(match.group(0)), fmt_date(today - dt.timedelta(days=count)))
        elif unit == "year" and count is not None:
            sub(re.escape(match.group(0)), f"{count} years ago from {anchor}, about {today.year - count}")
        else:
            sub(re.escape(match.group(0)), f"before {anchor}")
    return sentence


def _sentences(text: str) -> list[str]:
    text = " ".join(text.split())
    return [s.strip() for s in SENTENCE_RE.split(text) if s.strip()]


FIRST_PERSON_RE = re.compile(r"\b(?:I|my|I'm|I've|I'd|we|our|me)\b")
PHOTO_RE = re.compile(
    r"\[shares? an? (?:photo|image|picture)[^:\]]*:\s*(?:an? (?:photo|photograph|photography|"
    r"picture|image|close up|closeup)(?: of)?\s+)?([^\]]*)\]", re.IGNORECASE)
LEAD_RE = re.compile(
    r"^(?:by the way|btw|anyway|also|plus|and|but|so|oh|well|actually|honestly|guess what|"
    r"since (?:we|I) last (?:spoke|chatted|talked))[,\s]+", re.IGNORECASE)
GREETING_NAME_RE = re.compile(
    r"^(?i:hey|hi|hello|hiya|thanks|thank you|thx|wow|congrats|congratulations|aw+|oh|yes|yeah|"
    r"sure|good to see you|great to hear from you|long time no (?:see|talk))[,!.]?\s+([A-Z][a-z]+)\b")
GENERIC = set(
    "great awesome amazing love loved lovely cool nice good really thanks thank glad happy "
    "wow photo shares shared picture pic pics sounds sound looks look fun time things thing "
    "stuff totally definitely absolutely super pretty lot lots keep keeping wonderful "
    "incredible special sure yeah hey hope hoping glad feel feeling felt".split())
#: words too general to name a theme (they still count as facts' content)
THEME_SKIP = set("made make making last people getting want wanted know knew think thought".split())
WORD_RE = re.compile(r"[A-Za-z][A-Za-z'+\-]*")


def speaker_aliases(messages: list[Message]) -> dict[str, list[str]]:
    """Who 'user' and 'assistant' are, when the chat says so: each side greets the other
    by name ("Hey Mel!", "Thanks, Caroline"). The most used name first, then others used
    at least twice ("Melanie")."""
    votes: dict[str, Counter] = {"user": Counter(), "assistant": Counter()}
    other = {"user": "assistant", "assistant": "user"}
    for message in messages:
        role = message.get("role")
        if role not in other:
            continue
        text = SESSION_DATE_RE.sub("", message_text(message)).strip()
        match = GREETING_NAME_RE.match(text)
        if match and match.group(1).lower() not in STOPWORDS:
            votes[other[role]][match.group(1)] += 1
    aliases: dict[str, list[str]] = {}
    for role, counter in votes.items():
        ranked = counter.most_common()
        if ranked and ranked[0][1] >= 3:
            aliases[role] = [name for name, count in ranked if count >= 2][:3]
    primary = [names[0] for names in aliases.values()]
    if len(set(primary)) < len(primary):
        return {}
    return aliases


def speaker_names(messages: list[Message]) -> dict[str, str]:
    """{role: the name the chat uses most for it}; see ``speaker_aliases``."""
    return {role: names[0] for role, names in speaker_aliases(messages).items()}


def _content_words(sentence: str) -> set[str]:
    return {w for w in (m.lower().strip("'-") for m in WORD_RE.findall(sentence))
            if len(w) > 2 and w not in STOPWORDS and w not in GENERIC}


def _clean(text: str) -> str:
    """Message text as a fact source: photos become short captions."""
    return PHOTO_RE.sub(lambda m: f"(photo: {m.group(1).strip()})", text)


class _Scorer:
    """How much checkable fact a sentence holds, per token: rare content words (what this
    chat mentions seldom is what people later ask about), names, numbers, anchored dates
    and first-person events ("I went…", "my sister…")."""

    def __init__(self, texts: list[str]):
        documents = [_content_words(t) for t in texts if t]
        self.total = max(len(documents), 1)
        self.frequency = Counter(w for d in documents for w in d)

    def idf(self, word: str) -> float:
        import math
        return min(math.log((self.total + 1) / (self.frequency.get(word, 0) + 1)) + 0.5, 5.0)

    def __call__(self, sentence: str) -> float:
        words = _content_words(sentence)
        if len(words) < 2:
            return 0.0
        names = len(NAME_RE.findall(sentence))
        numbers = len(NUMBER_RE.findall(sentence))
        dated = 3.0 if re.search(r"\d{4}\)", sentence) else 0.0
        first_person = min(len(FIRST_PERSON_RE.findall(sentence)), 2)
        return sum(self.idf(w) for w in words) + 1.5 * names + 1.5 * numbers + dated + first_person


class ExtractiveSummarizer:
    """Deterministic summaries from the archived messages (and the previous summary)."""

    path = "extractive"

    def __init__(self, counter: TokenCounter):
        self.counter = counter

    def facts(self, messages: list[Message], scorer: _Scorer | None = None,
              names: dict[str, str] | None = None) -> list[Fact]:
        scorer = scorer or _Scorer([message_text(m) for m in messages])
        names = names if names is not None else speaker_names(messages)
        speaker = {"user": names.get("user", "U"), "assistant": names.get("assistant", "A")}
        today: dt.date | None = None
        facts: list[Fact] = []
        order = 0
        for message in messages:
            role = message.get("role")
            text = message_text(message) if role != "tool" else ""
            date = session_date(text)
            if date is not None:
                today = date
                text = SESSION_DATE_RE.sub("", text)
            if role not in speaker:
                continue
            for sentence in _sentences(_clean(text)):
                sentence = LEAD_RE.sub("", FILLER_RE.sub("", sentence).strip()).strip()
                if not sentence or sentence.endswith("?"):
                    continue
                sentence = sentence[0].upper() + sentence[1:]
                sentence = resolve_relative(sentence, today)
                score = scorer(sentence)
                if score <= 0:
                    continue
                when = f"{fmt_date(today)} " if today else ""
                line = f"{when}{speaker[role]}: {sentence}"
                body = line[len(when):]
                facts.append(Fact(line, score, order, self.counter.count_text(body)))
                order += 1
        return facts

    def summarize(
        self,
        previous: ConversationSummary | None,
        messages: list[Message],
        max_tokens: int,
        turns: tuple[int, int] = (0, 0),
    ) -> ConversationSummary:
        """The eight fields kept short (a few clipped items each), so that most of the cap
        goes to the dated fact ledger, which is what questions about the past need."""
        users = [m for m in messages if m.get("role") == "user" and (m.get("content") or "").strip()]
        assistants = [m for m in messages if m.get("role") == "assistant"
                      and isinstance(m.get("content"), str) and m["content"].strip()]
        paths = _paths(messages)
        previous = previous or ConversationSummary()
        aliases = speaker_aliases(messages) or aliases_from(previous.relationship_dynamics)
        names = {role: found[0] for role, found in aliases.items()}

        requests = [_clip(SESSION_DATE_RE.sub("", message_text(m)), 100) for m in users[-1:]]
        conclusions = [_clip(a["content"], 100) for a in assistants[-1:]]
        decisions = [_clip(s, 100) for m in assistants for s in _sentences(m["content"])
                     if DECISION_WORDS.search(s) and not s.endswith("?")
                     and len(_content_words(s)) >= 3][-1:]
        emotions = [s for m in messages if m.get("role") in ("user", "assistant")
                    for s in _sentences(message_text(m))
                    if EMOTION_WORDS & {w.lower().strip(".,!?") for w in s.split()}]
        themes = _themes(messages, aliases)
        dates = [session_date(message_text(m)) for m in messages]
        dates = [d for d in dates if d]

        narrative = self._narrative(previous, users, assistants, paths, dates, turns, names)
        summary = ConversationSummary(
            summary=narrative,
            accomplishments=_merge(previous.accomplishments, conclusions, 2),
            key_decisions=_merge(previous.key_decisions, decisions, 2),
            relevant_files=_merge(previous.relevant_files, paths, 12),
            active_goals=requests or previous.active_goals,
            emotional_thread=_clip(emotions[-1], 80) if emotions else previous.emotional_thread,
            relationship_dynamics=_dynamics(users, assistants, aliases)
            or previous.relationship_dynamics,
            evolving_themes=_merge(previous.evolving_themes, themes, 6),
            facts=list(previous.facts),
        )
        return self.fill_facts(summary, messages, max_tokens, names)

    def fill_facts(
        self, summary: ConversationSummary, messages: list[Message], max_tokens: int,
        names: dict[str, str] | None = None,
    ) -> ConversationSummary:
        """Choose the densest facts (score per token), old and new together, to fill what
        the other fields leave of the cap; near-duplicates are kept once. The ledger is
        rendered in order, grouped under its dates."""
        scorer = _Scorer([message_text(m) for m in messages] + list(summary.facts))
        if names is None:
            names = speaker_names(messages) or names_from(summary.relationship_dynamics)
        old = []
        for i, text in enumerate(summary.facts):
            date, body = split_date(text)
            old.append(Fact(text, scorer(body.split(": ", 1)[-1]), i - len(summary.facts),
                            self.counter.count_text(body)))
        base = ConversationSummary.from_fields({**summary.as_fields(), "facts": []})
        base = base.fit(self.counter, max_tokens)
        spare = max_tokens - self.counter.count_text(base.render()) - 8  # the facts heading
        candidates = sorted([*old, *self.facts(messages, scorer, names)],
                            key=lambda f: f.score / max(f.tokens, 1), reverse=True)
        chosen: list[Fact] = []
        dates: set[str] = set()
        seen: list[set[str]] = []
        for fact in candidates:
            date, body = split_date(fact.text)
            cost = fact.tokens + 2  # "- " and the newline
            if date not in dates:
                cost += self.counter.count_text(date) + 2
            if fact.score <= 0 or cost > spare:
                continue
            words = _content_words(body)
            if any(len(words & other) >= 0.6 * min(len(words), len(other)) for other in seen):
                continue
            chosen.append(fact)
            seen.append(words)
            dates.add(date)
            spare -= cost
        chosen.sort(key=lambda f: f.order)
        base.facts = [f.text for f in chosen]
        return base.fit(self.counter, max_tokens)

    def _narrative(self, previous, users, assistants, paths, dates, turns, names) -> str:
        parts: list[str] = []
        if previous.summary:
            parts.append(_clip(previous.summary, 300))
        span = f"turns {turns[0]}–{turns[1]}" if turns[1] else "the earlier turns"
        when = ""
        if dates:
            when = f", from {fmt_date(dates[0])} to {fmt_date(dates[-1])}"
        user, assistant = names.get("user", "the user"), names.get("assistant", "the assistant")
        parts.append(f"In {span}{when} {user} wrote {len(users)} messages and {assistant} "
                     f"{len(assistants)} replies.")
        if users:
            last = _clip(SESSION_DATE_RE.sub("", message_text(users[-1])), 100)
            parts.append(f"Most recently {user} said: \"{last}\"")
        if paths:
            parts.append("Files involved: " + ", ".join(paths[:8]) + ".")
        text = " ".join(parts)
        return " ".join(text.split()[:300])


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


def _themes(messages: list[Message], names: dict[str, list[str]] | None = None) -> list[str]:
    skip = THEME_SKIP | {n.lower() for found in (names or {}).values() for n in found}
    words = Counter()
    for message in messages:
        if message.get("role") not in ("user", "assistant"):
            continue
        words.update(w for w in _content_words(_clean(message_text(message)))
                     if w not in skip and len(w) > 3)
    return [w for w, _ in words.most_common(6)]


def _dynamics(users, assistants, names: dict[str, list[str]]) -> str:
    if not users and not assistants:
        return ""
    if names:
        who = " and ".join(
            f"the {role} is {aliases[0]}" + (f" (also {', '.join(aliases[1:])})" if aliases[1:] else "")
            for role, aliases in sorted(names.items(), key=lambda item: item[0] != "user"))
        return f"{who[0].upper()}{who[1:]}; {len(users)} and {len(assistants)} messages archived."
    return (f"{len(users)} user messages and {len(assistants)} assistant replies in the "
            "archived part.")


def aliases_from(dynamics: str) -> dict[str, list[str]]:
    """The speaker names an earlier summary recorded (see ``_dynamics``)."""
    found = re.findall(r"\bthe (user|assistant) is ([A-Z][a-z]+)(?: \(also ([A-Za-z, ]+)\))?",
                       dynamics or "", re.IGNORECASE)
    return {role.lower(): [name, *(a.strip() for a in more.split(",") if a.strip())]
            for role, name, more in found}


def names_from(dynamics: str) -> dict[str, str]:
    return {role: aliases[0] for role, aliases in aliases_from(dynamics).items()}
