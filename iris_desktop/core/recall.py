"""Recall: earlier messages that a summary replaced, found again for the newest message.

A summary of a few hundred tokens cannot hold everything a long chat said, but the
full history stays in SQLite. Before each request Iris searches the *summarized*
messages (FTS5, bm25) for the words of the user's newest message and shows the best
matches to the model with that message, dated and verbatim, each with the two messages
that follow it: what a question asks is usually in the reply, and the details in the
speaker's next words ("we did a contemporary piece called 'Finding Freedom'"):

    [Recalled from earlier in this chat: messages the summary replaced, dated]
    25 May 2023:
    - Mel: I ran a charity race for mental health last Saturday (the Saturday before 25
      May 2023) …
    - Caroline: That's awesome! …
    [End of recalled messages]

Recall runs when the newest message asks something (a question mark, a question word
first, "remind me…"): a statement is answered from what is in view, and a block costs
its tokens on every turn that has one. It never displaces verbatim history: it uses only
what the history budget leaves free, up to ``context.recall_max_tokens``. It is
deterministic for a given store, so the same turn always gets the same block (and the KV
cache its prefix). The stored messages are never changed; the block exists only in the
request, and the inspector lists which messages it recalled.
"""

from __future__ import annotations

import bisect
import datetime as dt
import re
from dataclasses import dataclass, field

from iris_desktop.core.extractive import (
    SESSION_DATE_RE,
    STOPWORDS,
    _clean,
    aliases_from,
    fmt_date,
    resolve_relative,
    session_date,
)
from iris_desktop.core.store import Store
from iris_desktop.core.tokens import TokenCounter

RECALL_HEADER = "[Recalled from earlier in this chat: messages the summary replaced, dated]"
RECALL_FOOTER = "[End of recalled messages]"
QUESTION_WORDS = {"did", "does", "what", "when", "who", "how", "why", "where", "which", "kind",
                  "type", "has", "have", "tell", "remember", "please", "said", "say"}
WORD_RE = re.compile(r"[A-Za-z0-9]+")
MAX_TERMS = 24
MAX_CHARS = 600  # one recalled message at most (a long agent message is clipped)
FOLLOWING = 2  # messages shown after each hit: the reply, and the hit's speaker again
NAMED_SPEAKER_BOOST = 1.5  # "what did Caroline say…": Caroline's own messages first


QUESTION_START_RE = re.compile(
    r"^\W*(?:what|when|where|who|whom|whose|why|how|which|did|do|does|is|are|was|were|can|"
    r"could|would|will|should|have|has|had)\b", re.IGNORECASE)
RECALL_ASK_RE = re.compile(r"\b(?:remember|recall|remind me|tell me|you said|I said|we talked)\b",
                           re.IGNORECASE)


def asks(text: str) -> bool:
    """Does a message ask something? A question mark, a question word first, or an ask
    to remember ("remind me what…"). Recall runs for these only: a statement is answered
    from what is in view, and every recall block costs its tokens on that turn."""
    text = text or ""
    return "?" in text or bool(QUESTION_START_RE.match(text)) or bool(RECALL_ASK_RE.search(text))


@dataclass
class Recall:
    text: str = ""  # the block put before the newest user message ('' = none)
    ids: list[int] = field(default_factory=list)  # the messages it shows, in order
    terms: list[str] = field(default_factory=list)  # what was searched for
    reason: str = ""  # why there is no block, when there is none


def query_terms(text: str, names: dict[str, list[str]] | None = None) -> list[str]:
    """The searchable words of a message: no stopwords, no question words, no speaker
    names (a name is who speaks, not what is said), crude stems ('painting' → 'paint')."""
    skip = STOPWORDS | QUESTION_WORDS | {n.lower() for found in (names or {}).values() for n in found}
    terms: list[str] = []
    for word in WORD_RE.findall(text or ""):
        lowered = word.lower()
        if len(lowered) < 2 or lowered in skip:
            continue
        stem = _stem(lowered)
        if stem not in terms:
            terms.append(stem)
        if len(terms) >= MAX_TERMS:
            break
    return terms


def _stem(word: str) -> str:
    """A plural, then a verb ending: 'paintings' → 'painting' → 'paint'."""
    for suffixes in (("es", "s"), ("ing", "ed")):
        for suffix in suffixes:
            if word.endswith(suffix) and len(word) - len(suffix) >= 4:
                word = word[: -len(suffix)]
                break
    return word


def fts_query(terms: list[str]) -> str:
    """An FTS5 OR query; words of four letters or more match as prefixes (their stems)."""
    return " OR ".join(f'"{t}"*' if len(t) >= 4 else f'"{t}"' for t in terms)


def _dates(store: Store, thread_id: int, through_id: int) -> tuple[list[int], list[dt.date]]:
    """(ids, dates) of the chat's own date lines up to ``through_id``: each message was
    written under the last one before it. One indexed scan of the thread per request."""
    ids: list[int] = []
    dates: list[dt.date] = []
    for message_id, start in store.bracketed_starts(thread_id, through_id):
        date = session_date(start)
        if date is not None:
            ids.append(message_id)
            dates.append(date)
    return ids, dates


def _date_of(dates: tuple[list[int], list[dt.date]], message_id: int) -> dt.date | None:
    ids, values = dates
    index = bisect.bisect_right(ids, message_id) - 1
    return values[index] if index >= 0 else None


class Recaller:
    """Finds and formats recall for one thread."""

    def __init__(self, store: Store, counter: TokenCounter):
        self.store = store
        self.counter = counter

    def recall(
        self,
        thread_id: int,
        through_id: int,
        query: str,
        budget: int,
        names_text: str = "",
        exclude: frozenset[int] = frozenset(),
    ) -> Recall:
        """The best-matching summarized messages (≤ ``through_id``), each with the messages
        that follow it, as one block of at most ``budget`` tokens (by ``count_text``)."""
        names = aliases_from(names_text)
        terms = query_terms(query, names)
        if budget <= 0 or through_id <= 0:
            return Recall(terms=terms, reason="no room")
        if not asks(query):
            return Recall(terms=terms, reason="the message asks nothing")
        if not terms:
            return Recall(terms=terms, reason="no searchable words")
        hits = self.store.recall_hits(thread_id, through_id, fts_query(terms))
        if not hits:  # before reading the thread's date lines
            return Recall(terms=terms, reason="nothing summarized matches")
        asked = {role for role, found in names.items() for name in found
                 if re.search(rf"\b{re.escape(name)}\b", query or "", re.IGNORECASE)}
        if len(asked) == 1:  # a question about one speaker: that speaker's words first
            hits.sort(key=lambda h: h[2] * (NAMED_SPEAKER_BOOST if h[1] in asked else 1.0))
        dates = _dates(self.store, thread_id, through_id)
        speakers = {"user": names.get("user", ["User"])[0],
                    "assistant": names.get("assistant", ["Assistant"])[0]}

        chosen = self._choose(thread_id, through_id, hits, budget, exclude, dates, speakers)
        if not chosen:
            return Recall(terms=terms, reason="nothing summarized matches")
        return Recall(text=_render(chosen), ids=sorted(chosen), terms=terms)

    def _choose(self, thread_id, through_id, hits, budget, exclude, dates, speakers
                ) -> dict[int, tuple[str, str]]:
        """id → (date heading, line) of the hits and the messages that follow each, in
        rank order while they fit ``budget``."""
        spent = self.counter.count_text(f"{RECALL_HEADER}\n{RECALL_FOOTER}\n\n")
        chosen: dict[int, tuple[str, str]] = {}
        headings: set[str] = set()
        for hit_id, _role, _rank in hits:
            if budget - spent < 16:  # nothing more will fit
                break
            if hit_id in chosen or hit_id in exclude:
                continue
            lines = self._group(thread_id, through_id, hit_id, chosen, exclude, dates, speakers)
            if hit_id not in lines:
                continue
            new_headings = {h for h, _ in lines.values() if h and h not in headings}
            cost = self.counter.count_text("\n".join(
                [*(f"{h}:" for h in sorted(new_headings)), *(line for _, line in lines.values())])) + 1
            if spent + cost > budget:
                continue
            chosen.update(lines)
            headings |= new_headings
            spent += cost
        return chosen

    def _group(self, thread_id, through_id, hit_id, chosen, exclude, dates, speakers
               ) -> dict[int, tuple[str, str]]:
        """A hit and the FOLLOWING messages after it, as dated lines."""
        group = [hit_id]
        current = hit_id
        for _ in range(FOLLOWING):
            current = self._next(thread_id, current, through_id)
            if current is None or current in exclude:
                break
            if current not in chosen:
                group.append(current)
        rows = self.store.messages_by_id(group)
        lines: dict[int, tuple[str, str]] = {}
        for message_id in group:
            row = rows.get(message_id)
            if row is None or not isinstance(row.get("content"), str):
                continue
            date = _date_of(dates, message_id)
            lines[message_id] = (fmt_date(date) if date else "", self._line(row, date, speakers))
        return lines

    def _next(self, thread_id: int, message_id: int, through_id: int) -> int | None:
        row = self.store.conn.execute(
            "SELECT id, role FROM messages WHERE thread_id = ? AND id > ? ORDER BY id LIMIT 1",
            (thread_id, message_id),
        ).fetchone()
        if row is None or row[0] > through_id or row[1] not in ("user", "assistant"):
            return None
        return int(row[0])

    @staticmethod
    def _line(row: dict, date: dt.date | None, speakers: dict[str, str]) -> str:
        text = SESSION_DATE_RE.sub("", row["content"])
        text = " ".join(_clean(text).split())
        if len(text) > MAX_CHARS:
            text = text[: MAX_CHARS - 1].rstrip() + "…"
        text = resolve_relative(text, date)
        return f"- {speakers.get(row['role'], row['role'])}: {text}"


def _render(chosen: dict[int, tuple[str, str]]) -> str:
    """The block, in message order, dated once per session as the ledger is."""
    out = [RECALL_HEADER]
    current_heading = None
    for message_id in sorted(chosen):
        heading, line = chosen[message_id]
        if heading and heading != current_heading:
            out.append(f"{heading}:")
            current_heading = heading
        out.append(line)
    out.append(RECALL_FOOTER)
    return "\n".join(out)


def attach(block: str, content: str) -> str:
    """The newest user message as the model sees it, recall first."""
    return f"{block}\n\n{content}" if block else content
