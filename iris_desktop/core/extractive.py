"""The extractive summarizer (ADR-0079's fallback): deterministic, no model needed.

It keeps concrete facts rather than prose: user requests, file paths (from tool calls and
outputs), dates, names and numbers, and the last assistant conclusions. Its core is the
dated fact ledger: the sentences that hold the most checkable content per token (rare
words, names, numbers, dates, first-person events), each kept with who said it and when,
relative dates anchored to the day it was written. Who and when come from each
message's record (:mod:`.records`: its ``name`` and ``sent_at``), never from the text's
layout, so any chat works, in any format.

The chat's first facts come first: the names, numbers and requests of its earliest turns
(found by their shape — digits, capitalized words inside a sentence, the user's own
sentences — in any script) open the ledger of its first summary, are carried along the
chain, and are the last thing a summary loses when it must be shortened.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from iris_desktop.core.records import Said, fmt_date, resolve_relative
from iris_desktop.core.summary import ConversationSummary, split_date
from iris_desktop.stop import Stopped, active_stop, stop_reason
from iris_desktop.tokens import TokenCounter

PATH_RE = re.compile(
    r"(?<![\w/.<])(?:~|\.{1,2})?(?:/[\w.\-@+]+)+/?|(?<![\w/])[\w\-]+(?:/[\w.\-]+)+\.\w{1,6}\b"
    r"|\b[\w\-]+\.(?:py|js|ts|tsx|rs|go|c|h|cpp|java|md|txt|json|toml|yaml|yml|cfg|ini|sh|html|css)\b"
)
NUMBER_RE = re.compile(r"\b\d[\d,.:]*\b")
#: capitalized words inside a sentence (not its first word): names, places, titles
NAME_RE = re.compile(r"(?<![.!?]\s)(?<!^)\b[A-Z][a-z]+(?:\s+[A-Z][a-z]+)*")
#: a title's or a Latin abbreviation's full stop ends no sentence ("Dr. Hale", "e.g. this"):
#: a ledger line was cut to "User: Well, my doctor Dr."
_NOT_AFTER = "".join(rf"(?<!\b{re.escape(a)})" for a in (
    "Dr.", "Mr.", "Mrs.", "Ms.", "Prof.", "St.", "Jr.", "Sr.", "Mt.", "vs.", "e.g.", "i.e.",
    "etc.", "approx."))
SENTENCE_RE = re.compile(rf"(?<=[.!?]){_NOT_AFTER}\s+(?=[A-Z\"'(\[])")
#: interjections before a sentence ("Wow, ", "No! ", "Thanks. "): only where punctuation
#: says they are one (an audit: "No pets are allowed…" became "Pets are allowed…", "Great
#: Wall of China…" "Wall of China…", "Nice is where…" "Is where…")
FILLER_RE = re.compile(
    r"^(?:(?:hey|hi|hello|wow|oh|ah|yeah|yes|no|sure|thanks|thank you|awesome|great|cool|"
    r"nice|haha|lol|omg|totally|definitely|absolutely|aww|ooh|hmm|well|so)\s*[,!.]+\s*)+",
    re.IGNORECASE,
)
#: words that lead into a sentence without adding to it; "so", "well" and "plus" only with
#: a comma ("Well water…", "So many…" are the sentence)
LEAD_RE = re.compile(
    r"^(?:(?:by the way|btw|anyway|also|and|but|oh|actually|honestly|guess what)[,\s]+"
    r"|(?:so|well|plus)\s*,\s*)", re.IGNORECASE)
FIRST_PERSON_RE = re.compile(r"\b(?:I|my|I'm|I've|I'd|we|our|me)\b")
DATED_RE = re.compile(r"\d{4}\)")
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
GENERIC = set(
    "great awesome amazing love loved lovely cool nice good really thanks thank glad happy "
    "wow sounds sound looks look fun time things thing stuff totally definitely absolutely "
    "super pretty lot lots keep keeping wonderful incredible special sure yeah hey hope "
    "hoping feel feeling felt".split())
#: words too general to name a theme (they still count as facts' content)
THEME_SKIP = set("made make making last people getting want wanted know knew think thought".split())
WORD_RE = re.compile(r"[A-Za-z][A-Za-z'+\-]*")
#: weights of what makes a sentence worth keeping, besides its rare words
NAME_WEIGHT = 1.5
NUMBER_WEIGHT = 1.5
DATED_WEIGHT = 3.0
MAX_IDF = 5.0
#: a fact whose content words mostly repeat a kept fact's is a near-duplicate
DUPLICATE_OVERLAP = 0.6
#: the ledger heading ("Facts (dated):") and the rendering's newlines
LEDGER_OVERHEAD_TOKENS = 8
#: the chat's first facts come from its first this many turns (a turn opens with a user
#: message) ...
FIRST_TURNS = 3
#: ... take at most this many tokens of a summary, and at most half of a small one ...
FIRST_FACTS_TOKENS = 64
#: ... and one of them at most this many characters (a long request keeps its start)
FIRST_FACT_CHARS = 240
#: a sentence ends at one of these, then space (or at once, for the full-width ones)
#: the question marks people type: ASCII, full-width (Chinese, Japanese), Arabic, Greek,
#: Armenian, Ethiopic (a question typed with "？" or "؟" was taken for a statement)
QUESTION_MARKS = ("?", "？", "؟", "\u037e", "՞", "፧")
FIRST_SENTENCE_RE = re.compile(rf"(?<=[.!?…;]){_NOT_AFTER}\s+|(?<=[。！？；؟।])\s*|\s*\n\s*")
#: a word is a run of letters, in any script
LETTERS_RE = re.compile(r"[^\W\d_]+")
DIGITS_RE = re.compile(r"\d+(?:[.,:/]\d+)*")
#: a user's sentence this long (in words) is a request or a statement of theirs
REQUEST_WORDS = 5


@dataclass
class Fact:
    text: str  # "<date> <speaker>: <sentence>", or "<speaker>: <sentence>" without a date
    score: float
    order: int
    tokens: int


def _sentences(text: str) -> list[str]:
    text = " ".join(text.split())
    return [s.strip() for s in SENTENCE_RE.split(text) if s.strip()]


def _content_words(sentence: str) -> set[str]:
    return {w for w in (m.lower().strip("'-") for m in WORD_RE.findall(sentence))
            if len(w) > 2 and w not in STOPWORDS and w not in GENERIC}


class _Scorer:
    """How much checkable fact a sentence holds: rare content words (what this chat
    mentions seldom is what people later ask about), names, numbers, anchored dates and
    first-person events ("I went…", "my sister…")."""

    def __init__(self, texts: list[str]):
        documents = [_content_words(t) for t in texts if t]
        self.total = max(len(documents), 1)
        self.frequency = Counter(w for d in documents for w in d)

    def idf(self, word: str) -> float:
        return min(math.log((self.total + 1) / (self.frequency.get(word, 0) + 1)) + 0.5, MAX_IDF)

    def __call__(self, sentence: str) -> float:
        words = _content_words(sentence)
        if len(words) < 2:
            return 0.0
        names = len(NAME_RE.findall(sentence))
        numbers = len(NUMBER_RE.findall(sentence))
        dated = DATED_WEIGHT if DATED_RE.search(sentence) else 0.0
        first_person = min(len(FIRST_PERSON_RE.findall(sentence)), 2)
        return (sum(self.idf(w) for w in words) + NAME_WEIGHT * names + NUMBER_WEIGHT * numbers
                + dated + first_person)


class ExtractiveSummarizer:
    """Deterministic summaries from the archived messages (and the previous summary)."""

    path = "extractive"

    def __init__(self, counter: TokenCounter):
        self.counter = counter

    def facts(self, said: Sequence[Said], scorer: _Scorer | None = None) -> list[Fact]:
        """Every sentence worth keeping, as a ledger line: '<date> <speaker>: <sentence>'."""
        scorer = scorer or _Scorer([s.text for s in said])
        facts: list[Fact] = []
        stop = active_stop()  # a close during a long chat's first summary
        for n, message in enumerate(said):
            if stop is not None and n % 256 == 0 and stop.is_set():
                raise Stopped(stop_reason(stop))
            if message.role not in ("user", "assistant"):
                continue
            for sentence in _sentences(message.text):
                sentence = LEAD_RE.sub("", FILLER_RE.sub("", sentence).strip()).strip()
                if not sentence or sentence.endswith(QUESTION_MARKS):
                    continue  # questions hold no facts
                sentence = resolve_relative(sentence[0].upper() + sentence[1:], message.date)
                score = scorer(sentence)
                if score <= 0:
                    continue
                body = f"{message.speaker}: {sentence}"
                when = f"{fmt_date(message.date)} " if message.date else ""
                facts.append(Fact(when + body, score, len(facts), self.counter.count_text(body)))
        return facts

    def first_facts(self, said: Sequence[Said], budget: int) -> list[Fact]:
        """The chat's first facts, for a summary whose ``said`` opens the chat: from its
        first FIRST_TURNS turns, the sentences that hold names or numbers, and the user's
        own longer sentences (what they asked for and told), in the order they were said,
        as many as ``budget`` tokens hold. Shapes only, no word lists, so any language and
        any layout works."""
        chosen: list[Fact] = []
        dates: set[str] = set()
        opened = 0
        # calling someone in the chat by name ("Thanks, Ana!") says nothing new
        speakers = {s.speaker for s in said if s.named}
        for message in said:
            if message.role == "user":
                opened += 1
                if opened > FIRST_TURNS:
                    break
            if message.role not in ("user", "assistant") or not message.text.strip():
                continue
            for sentence in _first_sentences(message.text):
                if not _substantial(sentence):
                    continue
                weight = _shape(sentence, speakers) + (
                    1 if message.role == "user" and _substantial(sentence, REQUEST_WORDS) else 0)
                if not weight:
                    continue
                sentence = resolve_relative(_clip_words(sentence, FIRST_FACT_CHARS), message.date)
                body = f"{message.speaker}: {sentence}"
                when = fmt_date(message.date) if message.date else ""
                fact = Fact(f"{when} {body}" if when else body, float(weight), len(chosen),
                            self.counter.count_text(body))
                cost = fact.tokens + 2 + (self.counter.count_text(when) + 2
                                          if when not in dates else 0)
                if cost > budget or any(fact.text == other.text for other in chosen):
                    continue  # a later, shorter one may still fit
                chosen.append(fact)
                dates.add(when)
                budget -= cost
        return chosen

    def summarize(
        self,
        previous: ConversationSummary | None,
        said: Sequence[Said],
        max_tokens: int,
        turns: tuple[int, int] = (0, 0),
    ) -> ConversationSummary:
        """The eight fields kept short (a few clipped items each), so that most of the cap
        goes to the dated fact ledger, which is what questions about the past need. The
        first summary of a chat (no ``previous``) opens its ledger with the chat's first
        facts; a chained one carries them."""
        opening = previous is None
        users = [s for s in said if s.role == "user" and s.text.strip()]
        assistants = [s for s in said if s.role == "assistant" and s.text.strip()]
        paths = paths_in(said)
        previous = previous or ConversationSummary()
        decisions = [_clip(sentence, 100) for s in assistants for sentence in _sentences(s.text)
                     if DECISION_WORDS.search(sentence) and not sentence.endswith(QUESTION_MARKS)
                     and len(_content_words(sentence)) >= 3][-1:]
        emotions = [sentence for s in [*users, *assistants] for sentence in _sentences(s.text)
                    if EMOTION_WORDS & {w.lower().strip(".,!?") for w in sentence.split()}]
        summary = ConversationSummary(
            summary=_narrative(previous, users, assistants, paths, said, turns),
            accomplishments=_merge(previous.accomplishments,
                                   [_clip(a.text, 100) for a in assistants[-1:]], 2),
            key_decisions=_merge(previous.key_decisions, decisions, 2),
            relevant_files=merge_files(paths, previous.relevant_files, limit=12),
            active_goals=[_clip(u.text, 100) for u in users[-1:]] or previous.active_goals,
            emotional_thread=_clip(emotions[-1], 80) if emotions else previous.emotional_thread,
            relationship_dynamics=_dynamics(users, assistants) or previous.relationship_dynamics,
            evolving_themes=_merge(previous.evolving_themes, _themes(said), 6),
            facts=list(previous.facts),
            first_facts=previous.first_facts,
        )
        return self.fill_facts(summary, said, max_tokens, opening=opening)

    def fill_facts(self, summary: ConversationSummary, said: Sequence[Said], max_tokens: int,
                   opening: bool = False) -> ConversationSummary:
        """The chat's first facts first (those the chain carries, or, when ``said`` opens
        the chat, its earliest turns' names, numbers and requests: at most
        FIRST_FACTS_TOKENS, or half of a small cap); the other fields fitted into what
        they leave; then the densest facts (score per token), old and new together, fill
        the rest. Near-duplicates are kept once, across the chain. The ledger is rendered
        in order, grouped under its dates."""
        scorer = _Scorer([s.text for s in said] + list(summary.facts))
        carried = max(0, min(summary.first_facts, len(summary.facts)))
        if carried:
            first = [Fact(text, 0.0, i - len(summary.facts) - carried,
                          self.counter.count_text(split_date(text)[1]))
                     for i, text in enumerate(summary.facts[:carried])]
        elif opening:
            first = self.first_facts(said, min(FIRST_FACTS_TOKENS, max_tokens // 2))
        else:
            first = []
        old = []
        for i, text in enumerate(summary.facts[carried:], start=carried):
            _, body = split_date(text)
            old.append(Fact(text, scorer(body.split(": ", 1)[-1]), i - len(summary.facts),
                            self.counter.count_text(body)))
        reserved = self._ledger_cost(first)
        base = ConversationSummary.from_fields(
            {**summary.as_fields(), "facts": [], "first_facts": 0})
        base = base.fit(self.counter, max_tokens - reserved)
        spare = (max_tokens - self.counter.count_text(base.render()) - LEDGER_OVERHEAD_TOKENS
                 - reserved)
        chosen = self._choose([*old, *self.facts(said, scorer)], spare, first)
        base.facts = [f.text for f in first] + [f.text for f in sorted(chosen, key=lambda f: f.order)]
        base.first_facts = len(first)
        return base.fit(self.counter, max_tokens)

    def _ledger_cost(self, facts: Sequence[Fact]) -> int:
        """What ``facts`` add to the ledger: each line, and each date's heading once."""
        dates = {split_date(f.text)[0] for f in facts}
        return (sum(f.tokens + 2 for f in facts)
                + sum(self.counter.count_text(d) + 2 for d in dates if d))

    def _choose(self, candidates: list[Fact], spare: int, kept: Sequence[Fact] = ()
                ) -> list[Fact]:
        """The densest facts that fit ``spare`` tokens, near-duplicates once (also of the
        facts ``kept`` already)."""
        chosen: list[Fact] = []
        dates: set[str] = {split_date(f.text)[0] for f in kept}
        seen: list[set[str]] = [_content_words(split_date(f.text)[1]) for f in kept]
        texts = {f.text for f in kept}
        for fact in sorted(candidates, key=lambda f: f.score / max(f.tokens, 1), reverse=True):
            date, body = split_date(fact.text)
            cost = fact.tokens + 2  # "- " and the newline
            if date not in dates:
                cost += self.counter.count_text(date) + 2
            if fact.score <= 0 or cost > spare or fact.text in texts:
                continue
            words = _content_words(body)
            if any(len(words & other) >= DUPLICATE_OVERLAP * min(len(words), len(other))
                   for other in seen):
                continue
            chosen.append(fact)
            seen.append(words)
            dates.add(date)
            spare -= cost
        return chosen


def _narrative(previous: ConversationSummary, users: list[Said], assistants: list[Said],
               paths: list[str], said: Sequence[Said], turns: tuple[int, int]) -> str:
    parts: list[str] = []
    if previous.summary:
        parts.append(_clip(previous.summary, 300))
    span = ("the earlier turns" if not turns[1] else f"turn {turns[1]}" if turns[0] == turns[1]
            else f"turns {turns[0]}–{turns[1]}")
    dates = [s.date for s in said if s.date]
    when = f", from {fmt_date(min(dates))} to {fmt_date(max(dates))}" if dates else ""
    user = users[0].speaker if users and users[0].named else "the user"
    assistant = assistants[0].speaker if assistants and assistants[0].named else "the assistant"
    messages = f"{len(users)} message{'' if len(users) == 1 else 's'}"
    replies = f"{len(assistants)} {'reply' if len(assistants) == 1 else 'replies'}"
    parts.append(f"In {span}{when} {user} wrote {messages} and {assistant} {replies}.")
    if users:
        parts.append(f"Most recently {user} said: \"{_clip(users[-1].text, 100)}\"")
    if paths:
        parts.append("Files involved: " + ", ".join(paths[:8]) + ".")
    return " ".join(" ".join(parts).split()[:300])


def _clip(text: str, limit: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _first_sentences(text: str) -> list[str]:
    """``text`` in sentences, for any script: after . ! ? … ; and a space, after the
    full-width and other scripts' marks, and at line breaks."""
    return [" ".join(s.split()) for s in FIRST_SENTENCE_RE.split(text) if s and s.strip()]


def _shape(sentence: str, speakers: set[str] = frozenset()) -> int:
    """How many names and numbers ``sentence`` holds, by their shape: runs of digits (any
    script's), and words of two letters or more that start with a capital (or are all
    capitals) anywhere but at the sentence's start; the chat's own speakers' names (from
    the records) are not counted."""
    words = LETTERS_RE.findall(sentence)
    names = sum(1 for w in words[1:] if len(w) > 1 and w[0].isupper() and w not in speakers)
    return names + len(DIGITS_RE.findall(sentence))


def _substantial(sentence: str, words_needed: int = 3) -> bool:
    """More than a hello: ``words_needed`` words or more, or (a script written without
    spaces) one run of six letters and digits or more."""
    if len(LETTERS_RE.findall(sentence)) >= words_needed:
        return True
    return len(sentence.split()) == 1 and len(re.findall(r"\w", sentence)) >= 6


def _clip_words(text: str, limit: int) -> str:
    """``text`` whole, or its start up to the last whole word within ``limit`` characters,
    with "…" (a script without spaces is cut at a character)."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    if " " in cut:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip(" ,;:") + "…"


def _merge(old: list[str], new: list[str], limit: int) -> list[str]:
    out: list[str] = []
    for item in [*old, *new]:
        if item and item not in out:
            out.append(item)
    return out[-limit:]


def merge_files(*lists: list[str], limit: int) -> list[str]:
    """The files of ``lists`` in their order, each once, the first ``limit``: give the
    newest, in priority order, first. (Merged as the other fields are, oldest first and
    the last kept, the files the agent acted on, first of the new ones, were the ones
    cut: a pydicom fix's summary listed only the files of its demonstration text.)"""
    out: list[str] = []
    for item in (i for items in lists for i in items):
        if item and item not in out:
            out.append(item)
    return out[:limit]


def paths_in(said: Sequence[Said]) -> list[str]:
    """File paths from tool calls, outputs and text: those the agent named in its calls
    (what it viewed or ran, even when only in a call's arguments) first, then the most
    mentioned. A markup closing tag ("</form>") is not a path."""
    texts = [" ".join((s.text, *s.calls)) for s in said]
    found: list[str] = []
    called: set[str] = set()  # what the agent acted on comes before what was mentioned
    for message in said:
        for part, is_call in ((message.text, False), *((c, True) for c in message.calls)):
            for path in _paths(part):
                if path not in found:
                    found.append(path)
                if is_call:
                    called.add(path)
    counts = Counter({path: sum(path in text for text in texts) for path in found})
    return sorted(found, key=lambda p: (p not in called, -counts[p], found.index(p)))[:20]


def _paths(text: str) -> Iterator[str]:
    for match in PATH_RE.findall(text):
        path = match.rstrip(".,:;)")
        if len(path) > 2 and not path.startswith("//"):
            yield path


def _themes(said: Sequence[Said]) -> list[str]:
    skip = THEME_SKIP | {s.speaker.lower() for s in said if s.named}
    words = Counter()
    for message in said:
        if message.role in ("user", "assistant"):
            words.update(w for w in _content_words(message.text) if w not in skip and len(w) > 3)
    return [w for w, _ in words.most_common(6)]


def _dynamics(users: list[Said], assistants: list[Said]) -> str:
    """Who talks, as the messages name them, and how much."""
    if not users and not assistants:
        return ""
    speakers = sorted({(s.role, s.speaker) for s in [*users, *assistants] if s.named})
    who = ", ".join(f"{name} ({role})" for role, name in speakers)
    counts = f"{len(users)} user messages and {len(assistants)} assistant replies archived"
    return f"Speakers: {who}; {counts}." if who else f"{counts[0].upper()}{counts[1:]}."
