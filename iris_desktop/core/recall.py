"""Recall: earlier messages that a summary replaced, found again for the newest message.

A summary of a few hundred tokens cannot hold everything a long chat said, but the
full history stays in SQLite. When the newest user message asks something, Iris
searches the *summarized* messages for it and shows the best matches to the model with
that message, verbatim, each with the messages that follow it (what a question asks is
usually in the reply, and the details in the speaker's next words):

    [Recalled from earlier in this chat]
    4 March 2024:
    - Rosa: We finally moved to Tallinn last week (the week before 4 March 2024) …
    - Tomas: Oh wow, good for you.
    [End of recall]

Who and when come from each message's record (its ``name`` and ``sent_at``, see
:mod:`.records`), never from the text's layout. Two rankings are fused by reciprocal
rank fusion: lexical (FTS5 bm25 over the words of the question) and, when an embedder
is available, semantic (the vectors of :mod:`.semantic`), which finds a paraphrase that
shares no word with the question ("what pets does she have?" → "we got another cat").
A question that names one speaker, or a date ("on 9 April", "in May 2023", or relative
to the day it is asked: "last week", "three days ago"), ranks up
the messages that speaker wrote, or that were written then (or within a week after); a
date also adds a third ranking, of the messages written then, so that one the whole
chat's rankings miss is still found. "Did I…" ranks up the user's messages and "did
you…" the assistant's. A question about several things ("…the thermostat or the mesh
network?", "the order of 'A', 'B' and 'C'") is also ranked per part, among the whole
question's candidates, and the rankings are merged in turns; only the sentences that ask
are split ("Sounds special, those beach trips! Any other summer traditions?" asks one
thing).

With a reranker (``context.recall_rerank``, a cross-encoder that reads the question with
each candidate), the fused ranking's first :data:`RERANK_CANDIDATES` are read as the block
would show them (date, speaker, a long message's window around the question's words),
and the cross-encoder's order is fused with the first (not put in its place: alone it
buries the user's own statements under the assistant's explanations); each part of a
question is reranked with that part. A reranker that is missing or fails leaves the order
as it was.

The block is dense: a long hit is clipped around the question's words, a message shown
after it to its start, so the same tokens hold more hits. A question about one side's own
words ("what did I say about…") shows each hit with one message after it, the other
side's reply only to its first lines: the answer is in that side's messages.

Recall never displaces verbatim history: it uses only what the history budget leaves
free, up to ``context.recall_max_tokens``. Each hit of a reranked ranking carries its
strength (its fused score over the best one's); :data:`RECALL_CUTOFF` would end the block
where the hits fall that far below the best, but measured it cost answers at every value
tried, so it is 0 and room ends the block. It is deterministic for a given store, so the
same turn always gets the same block (and the KV cache its prefix). The stored messages
are never changed; the block exists only in the request.
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from iris_desktop.core.clip import (  # noqa: F401 - importable from recall, as before
    SENTENCE_END_RE,
    _clip,
    _pieces,
    _term_pattern,
    clip_around,
    clip_start,
    holds,
)
from iris_desktop.core.extractive import QUESTION_MARKS, STOPWORDS
from iris_desktop.core.ports import Reranker
from iris_desktop.core.records import (
    Period,
    Said,
    day_of,
    fmt_date,
    periods_in,
    resolve_relative,
    said_from_row,
)
from iris_desktop.core.store import Store
from iris_desktop.stop import Stopped, active_stop
from iris_desktop.tokens import TokenCounter

log = logging.getLogger("iris.recall")

#: the block's framing, 14 tokens with the bundled model's tokenizer (it was 22: "…: messages
#: the summary replaced, dated]" and "[End of recalled messages]"; the dates are the block's headings)
RECALL_HEADER = "[Recalled from earlier in this chat]"
RECALL_FOOTER = "[End of recall]"
QUESTION_WORDS = {"did", "does", "what", "when", "who", "how", "why", "where", "which", "kind",
                  "type", "has", "have", "tell", "remember", "please", "said", "say"}
WORD_RE = re.compile(r"[A-Za-z0-9]+")
#: a word, and a sentence's end, in any script (CJK sentences end without a space after)
ANY_WORD_RE = re.compile(r"[^\W_]+")
ANY_SENTENCE_END_RE = re.compile(r"(?<=[.!?\u037e\u055e\u1367])\s+|(?<=[。！？؟])\s*")
#: where a message's sentences end, for finding the ones that ask: not after an initial
#: ("C. S. Lewis")
ASKING_SPLIT_RE = re.compile(r"(?<=[.!?])(?<!\b[A-Z]\.)\s+")
MAX_TERMS = 24
MAX_CHARS = 600  # one recalled hit at most (a long message is clipped around what matches)
#: a message shown after a hit at most, from its start (a reply answers first). Shorter
#: followers (240 or 300 characters, hits at 400) fit more hits in long assistant chats
#: but lost 4–6 answers on the two-person dev set (bench/retention.py), so both stay at 600
FOLLOWER_CHARS = 600
FOLLOWING = 2  # messages shown after each hit: the reply, and the hit's speaker again
#: when the question asks about one side's own words ("what did I say…", "did you
#: recommend…", see :func:`asked_role`), each hit is shown alone, without the messages
#: after it: the answer is in that side's messages, and the block fits more of them.
#: bench/longmemeval.py, every evidence message at windows 4,096 / 8,192: the other
#: side's reply to its first 200 characters 85% / 93%, no follower 90% / 95%, with no
#: evidence message lost and the same answers found (the two full followers, earlier: 66%
#: at 4,096); bench/retention.py unchanged (1 of its 2,386 questions asks about a side's
#: own words: its questions name who they ask about)
LEXICAL_HITS = 60  # bm25 candidates considered
#: reciprocal rank fusion (Cormack et al. 2009) with a small constant, so the top ranks of
#: each list count, and both lists weigh the same. Measured on the long-chat probes and the
#: paraphrased questions of bench/retention.py: k=30 or 60 let common words drown meaning,
#: and bm25 at half the weight of meaning lost exact words (51.7% found against 53.9%).
RRF_K = 10
#: a question naming one speaker ranks that speaker's own messages up by this factor
NAMED_SPEAKER_BOOST = 1.5
#: "did I…" ranks the user's messages up by this factor, "did you…" the assistant's
#: (bench/longmemeval.py, every evidence message: 1.0 → 76%, 1.5 → 80%, 2–10 → 83%; the
#: two-person dev set's questions name who they ask about, so it does not apply there)
ASKED_ROLE_BOOST = 2.0
#: a question naming a date ("in May 2023") ranks messages written then up by this factor
NAMED_DATE_BOOST = 1.5
#: below this much room nothing more fits (a date heading and a short line)
MIN_ROOM_TOKENS = 16
#: how long a search waits for the same search under way on another thread before it
#: searches itself (a cross-encoder call takes 1–2.5 s on a laptop's CPU)
RANK_WAIT_S = 30.0
#: parts of one question searched on their own ("the thermostat or the mesh network?")
MAX_PARTS = 3
#: a question that counts or totals ("how many festivals did I go to?") gathers mentions
#: from many places, each answered in the mention itself: each hit is shown alone, clipped
#: around the question's words to COUNTING_HIT_CHARS, so the block holds about twice the
#: hits (bench/longmemeval.py, every evidence message: 82.9% → 85.4%, the same at 200;
#: bench/retention.py 967 → 969 of 1,484, its 38 such questions; at 450 no gain)
COUNTING_RE = re.compile(r"\bhow (?:many|much)\b", re.IGNORECASE)
COUNTING_HIT_CHARS = 300

#: the fused ranking's first candidates that the cross-encoder reads (``context.recall_rerank``);
#: 30 gave the same on both dev sets' questions but 6 fewer of the two-person chats' paraphrased
#: ones (123 of 198 against 129), for half the time (docs/benchmarks.md, issue 45)
RERANK_CANDIDATES = 60
#: the longest question given to a cross-encoder that does not count its own tokens
#: (``Reranker.query_tokens``), in the chat model's: the shipped one reads 64 WordPiece
#: tokens, about 1.04× the chat model's on the dev sets' messages (1.19× at p99)
RERANK_QUERY_TOKENS = 48
#: a relative cutoff: after the first hit, a hit whose strength (its fused score over the
#: best one's, :attr:`Ranking.strength`) is below this is left out of the block, whatever
#: room is left, so that the block ends where the evidence does rather than where the room
#: does. 0: none, so the room decides. Measured for issue 45 (docs/benchmarks.md, "Smaller
#: recall blocks"): the user↔assistant dev set keeps every evidence message up to 0.4 (its
#: median block at the 8,192-token window 1,512 → 1,145 tokens), but the two-person chats
#: lose answers at every cutoff tried (0.15 and up: an answer or an evidence message ranked
#: near the end of the 60 the cross-encoder reads),
#: so none ships; the reranked order's fused scores fall too gently for a cutoff that is
#: free on both dev sets
RECALL_CUTOFF = 0.0

QUESTION_START_RE = re.compile(
    r"^\W*(?:what|when|where|who|whom|whose|why|how|which|did|do|does|is|are|was|were|can|"
    r"could|would|will|should|have|has|had)\b", re.IGNORECASE)
#: a phrase in quotes (not an apostrophe: "year's", "'90s"), and where a question's parts join
QUOTED_RE = re.compile(r"(?<!\w)[\"“‘'](?P<phrase>[^\"“”‘’']{3,}?)[\"”’'](?!\w)")
PART_SPLIT_RE = re.compile(r",(?!\s*\d)|[;:]|\b(?:or|versus|vs)\b\.?", re.IGNORECASE)
FIRST_PERSON_RE = re.compile(r"\b(?:I|I'm|I've|I'd|me|my|mine|myself)\b", re.IGNORECASE)
SECOND_PERSON_RE = re.compile(r"\b(?:you|you've|you'd|your|yours|yourself)\b", re.IGNORECASE)
#: the asking itself ("can you…", "remind me…"), which is not who the question is about
REQUEST_RE = re.compile(r"\b(?:can|could|would|will) you (?:please )?(?:remind|tell|help|give|"
                        r"show|suggest|recommend|list)(?: me)?\b|\b(?:remind|tell|give|show|help) me\b|"
                        r"\bdo you (?:think|remember|recall|know)\b|\byou (?:remember|recall)\b",
                        re.IGNORECASE)
RECALL_ASK_RE = re.compile(r"\b(?:remember|recall|remind me|tell me|you said|I said|we talked)\b",
                           re.IGNORECASE)

class SemanticSearch(Protocol):
    """(thread id, through id, question, limit, among) → message ids, best first: by
    meaning, among the given ids only when ``among`` is not None."""

    def __call__(self, thread_id: int, through_id: int, query: str, limit: int,
                 among: Collection[int] | None = None) -> list[int]: ...


def asks(text: str) -> bool:
    """Does a message ask something? A question mark, a question word first, or an ask
    to remember ("remind me what…"). Recall runs for these only: a statement is answered
    from what is in view, and every recall block costs its tokens on that turn."""
    text = text or ""
    return (any(mark in text for mark in QUESTION_MARKS) or bool(QUESTION_START_RE.match(text))
            or bool(RECALL_ASK_RE.search(text)))


@dataclass
class Recall:
    text: str = ""  # the block put before the newest user message ('' = none)
    ids: list[int] = field(default_factory=list)  # the messages it shows, in order
    terms: list[str] = field(default_factory=list)  # what was searched for
    reason: str = ""  # why there is no block, when there is none
    semantic: bool = False  # a semantic ranking was fused in
    reranked: bool = False  # the cross-encoder reordered the candidates
    #: why a reranker that was there did not reorder them ('' when it did, or none was there)
    rerank_reason: str = ""


def asked_role(question: str) -> str | None:
    """Whose messages a question asks about, from its grammatical person: "what did I
    buy?", "my", "me" ask about the user's own words; "what did you recommend?" about the
    assistant's. A request's own "can you" or "remind me" says nothing either way; a
    question with both, or neither (a third person, a name), names no role."""
    text = REQUEST_RE.sub(" ", question or "")
    first, second = bool(FIRST_PERSON_RE.search(text)), bool(SECOND_PERSON_RE.search(text))
    return "user" if first and not second else "assistant" if second and not first else None


def query_terms(text: str, names: Sequence[str] = ()) -> list[str]:
    """The searchable words of a message: no stopwords, no question words, no speaker
    names (a name is who speaks, not what is said), crude stems ('painting' → 'paint').
    At most :data:`MAX_TERMS`: a longer message that asks gives its asking sentences'
    words first, then its other words in order (a long message often asks at its end,
    after more words than the cap)."""
    skip = STOPWORDS | QUESTION_WORDS | {n.lower() for name in names for n in name.split()}
    # twice the cap: enough to fill it after the asking sentences' words, read once
    terms = _terms(text or "", skip, 2 * MAX_TERMS)
    if len(terms) > MAX_TERMS:
        asking = _asking(text)
        if asking != text:
            first = _terms(asking, skip, MAX_TERMS)
            terms = [*first, *(t for t in terms if t not in first)]
    return terms[:MAX_TERMS]


def _terms(text: str, skip: Collection[str], limit: int) -> list[str]:
    """The first ``limit`` distinct stems of ``text``'s words not in ``skip``."""
    terms: list[str] = []
    for match in WORD_RE.finditer(text):
        lowered = match.group().lower()
        if len(lowered) < 2 or lowered in skip:
            continue
        stem = _stem(lowered)
        if stem not in terms:
            terms.append(stem)
            if len(terms) >= limit:
                break
    return terms


def rerank_query(query: str, count: Callable[[str], int], limit: int) -> str:
    """What the cross-encoder reads as the question: ``query`` itself when it fits the
    ``limit`` of tokens it reads (``count`` gives a text's tokens), else the sentences
    that ask (all of it when none does). The model cuts a longer question at its end,
    which for a long message that asks last left only its preamble; and it was trained on
    short search queries: with 60 tokens of a message's lead-in before "What pet did Mel
    adopt?" it scored the answer −10.2, the question alone +5.6 (tests/test_reranker.py)."""
    # a token covers at least one character, so a text of at most ``limit`` characters
    # fits without counting; one of more than 32 a token is long without counting (a paste)
    if len(query) <= limit or (len(query) <= 32 * limit and count(query) <= limit):
        return query
    return _asking(query)


def question_parts(text: str, names: Sequence[str] = ()) -> list[str]:
    """The parts of a question that asks about several things, each to be searched on its
    own: two or more quoted phrases ("the order of 'A', 'B' and 'C'"), or else the
    question split where clauses or alternatives join (a comma not inside a date, a
    semicolon or colon, "or"; never inside quotes; "and" mostly joins one thing's words,
    "black and white"). A quoted phrase counts with one searchable word, another part
    with two; fewer than two parts is no split. "Which did I set up first, the smart
    thermostat or the mesh network?" → "Which did I set up first", "the smart
    thermostat", "the mesh network". Only the sentences that ask are split: a message
    that remarks, tells and then asks ("Sounds special, those beach trips! Do you have any
    other summer traditions?") asks one thing, and its remark, its news or a caption
    after it are not parts of it (each part costs the reranker a call)."""
    text = _asking(text or "")
    quoted = [m for m in QUOTED_RE.finditer(text) if query_terms(m["phrase"], names)]
    if len(quoted) >= 2:
        return [m["phrase"] for m in quoted]
    inside = [m.span() for m in QUOTED_RE.finditer(text)]
    parts, start = [], 0
    for cut in PART_SPLIT_RE.finditer(text):
        if not any(a <= cut.start() < b for a, b in inside):
            parts.append(text[start:cut.start()])
            start = cut.end()
    parts = [p for p in (" ".join(p.split()) for p in [*parts, text[start:]])
             if len(query_terms(p, names)) >= 2]
    return parts if len(parts) >= 2 else []


def _asking(text: str) -> str:
    """The sentences of ``text`` that ask (end in a question mark), or all of it when none
    does ("Tell me the order of 'A', 'B' and 'C'.")."""
    asking = [s for s in ASKING_SPLIT_RE.split(text) if _is_question(s)]
    return " ".join(asking) if asking else text


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


def fuse(rankings: Sequence[Sequence[int]], k: int = RRF_K) -> dict[int, float]:
    """Reciprocal rank fusion: id → Σ 1 / (k + rank) over the rankings."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + 1 / (k + rank)
    return scores


@dataclass
class Ranking:
    """One question's search: what was searched for, and the hits, best first."""

    thread_id: int = 0
    through_id: int = 0
    terms: list[str] = field(default_factory=list)
    ranked: list[int] = field(default_factory=list)
    semantic: bool = False  # a semantic ranking was fused in
    reason: str = ""  # why there are no hits, when there are none
    role: str | None = None  # whose words the question asks about ("did I…": user)
    counting: bool = False  # the question counts or totals ("how many…"): hits shown alone
    reranked: bool = False  # the cross-encoder reordered the candidates
    rerank_s: float = 0.0  # the cross-encoder's time for this question
    #: why a reranker that was there did not reorder them ('' when it did, or none was there)
    rerank_reason: str = ""
    #: each hit's score over the best score of the ranking that placed it (1.0: the best);
    #: a hit weaker than :data:`RECALL_CUTOFF` is left out of the block
    strength: dict[int, float] = field(default_factory=dict)
    #: for a question about the user's own words ("what did I…") in a chat whose user side
    #: carries one name (an imported two-person chat), that name: the block says who "I" is
    asker: str | None = None


#: ``Ranking.rerank_reason`` of a ranking whose rerank the user's Stop ended: never kept
RERANK_STOPPED = "stopped before the reranker finished"


class RankingCache:
    """The rankings of the last few questions asked on one store, so that the question
    searched for its draft's prefill gets the same hits when it is sent. Storing the
    question changes bm25's statistics (one more document holds its words), which can
    reorder near ties, change the block, and waste the prefilled KV cache. A search asked
    for while the same one runs on another thread waits for it rather than running twice
    (the cross-encoder would take a core from the model reading the prompt). What a ranking
    covers, the summarized messages up to ``through_id``, never changes; a vector the
    background indexer adds later to one of them is used from the next question on."""

    def __init__(self, size: int = 16):
        self.size = size
        self._items: OrderedDict[tuple, Ranking] = OrderedDict()
        #: the searches under way, so that a second thread asking the same waits for the first
        self._running: dict[tuple, threading.Event] = {}
        self._lock = threading.Lock()

    def holds(self, thread_id: int, summary_id: int, through_id: int, query: str) -> bool:
        """Is a ranking of ``query`` over these summarized messages kept (any day, any
        models)? What a send asks before it plans: whether it will wait for a search."""
        with self._lock:
            return any(key[:4] == (thread_id, summary_id, through_id, query) for key in self._items)

    def rank(self, recaller: Recaller, thread_id: int, summary_id: int, through_id: int,
             query: str, today: dt.date | None = None) -> Ranking:
        key = (thread_id, summary_id, through_id, query, recaller.semantic is not None,
               getattr(recaller.reranker, "identity", None), today)
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit
            running = self._running.get(key)
            if running is None:
                running = self._running[key] = threading.Event()
                mine = True
            else:
                mine = False
        if not mine:  # another thread ranks it now (a send, and the meter beside it): wait,
            _wait_unless_stopped(running, RANK_WAIT_S)  # not past the user's Stop
            with self._lock:
                hit = self._items.get(key)
            if hit is not None:
                return hit
        try:
            ranking = recaller.rank(thread_id, through_id, query, today)
            with self._lock:
                if ranking.rerank_reason != RERANK_STOPPED:  # asked again, it is reranked
                    self._items[key] = ranking
                while len(self._items) > self.size:
                    self._items.popitem(last=False)
        finally:
            if mine:
                with self._lock:
                    self._running.pop(key, None)
                running.set()
        return ranking


def _wait_unless_stopped(done: threading.Event, limit_s: float) -> None:
    """Wait for ``done`` at most ``limit_s``, or until the stop this runs under is set
    (``iris_desktop.stop.stopping``): the caller then ranks itself, and its reranker stops
    at once."""
    stop = active_stop()
    if stop is None:
        done.wait(limit_s)
        return
    until = time.monotonic() + limit_s
    while not done.wait(min(0.02, max(until - time.monotonic(), 0))):
        if stop.is_set() or time.monotonic() >= until:
            return


class Recaller:
    """Finds and formats recall for one thread. ``semantic`` (optional) ranks messages
    by meaning; without it recall is lexical only. ``reranker`` (optional) reorders the
    fused ranking's first :data:`RERANK_CANDIDATES` by reading each with the question."""

    def __init__(self, store: Store, counter: TokenCounter, semantic: SemanticSearch | None = None,
                 reranker: Reranker | None = None):
        self.store = store
        self.counter = counter
        self.semantic = semantic
        self.reranker = reranker
        self._rerank_s = 0.0
        self._reranked = False
        self._rerank_reason = ""

    def recall(self, thread_id: int, through_id: int, query: str, budget: int,
               exclude: frozenset[int] = frozenset(), today: dt.date | None = None) -> Recall:
        """The best-matching summarized messages (≤ ``through_id``), each with the messages
        that follow it, as one block of at most ``budget`` tokens (by ``count_text``)."""
        if budget <= 0:
            return Recall(terms=query_terms(query, self.store.thread_speakers(thread_id)),
                          reason="no room")
        return self.block(self.rank(thread_id, through_id, query, today), budget, exclude)

    def rank(self, thread_id: int, through_id: int, query: str,
             today: dt.date | None = None) -> Ranking:
        """The summarized messages (≤ ``through_id``) that match ``query``, best first:
        the search, done once, that :meth:`block` fills budgets from. ``today``, the day
        the question is asked, is what its relative dates mean ("what did I say last
        week?"); without it only the dates it names count."""
        names = self.store.thread_speakers(thread_id)
        terms = query_terms(query, names)
        if through_id <= 0:
            return Ranking(terms=terms, reason="no room")
        if not asks(query):
            return Ranking(terms=terms, reason="the message asks nothing")
        self._rerank_s, self._reranked, self._rerank_reason = 0.0, False, ""
        self._strength: dict[int, float] = {}
        ranked, semantic, role, asker = self._rank(thread_id, through_id, query, terms, names, today)
        reason = "" if ranked else (
            "nothing summarized matches" if terms or semantic else "no searchable words")
        # the cutoff reads strengths of the reranked order only (where it was measured);
        # without the cross-encoder the block is filled by room, as it was before
        return Ranking(thread_id, through_id, terms, ranked, semantic, reason, role,
                       bool(COUNTING_RE.search(query)), self._reranked, round(self._rerank_s, 3),
                       self._rerank_reason if not self._reranked
                       or self._rerank_reason == RERANK_STOPPED else "",
                       self._strength if self._reranked else {}, asker)

    def block(self, ranking: Ranking, budget: int,
              exclude: frozenset[int] = frozenset()) -> Recall:
        """The block of at most ``budget`` tokens from a ranking: its hits in rank order,
        each with the messages that follow it, while they fit. A second, smaller budget
        for the same question costs no second search."""
        if budget <= 0 or not ranking.ranked:
            return Recall(terms=ranking.terms, reason="no room" if budget <= 0 else ranking.reason,
                          semantic=ranking.semantic)
        lines = _Lines(ranking.terms, ranking.role, ranking.counting)  # each line rendered once per block
        footer = _footer(ranking.asker)
        chosen = self._choose(ranking.thread_id, ranking.through_id, ranking.ranked, budget,
                              exclude, lines, ranking.strength, footer)
        if not chosen:  # matches that are left out fit nowhere (before: "nothing matches")
            unshown = any(hit_id not in exclude for hit_id in ranking.ranked)
            return Recall(terms=ranking.terms, semantic=ranking.semantic,
                          reason="no room" if unshown else "nothing summarized matches")
        return Recall(text=_render(chosen, lines, footer), ids=sorted(chosen), terms=ranking.terms,
                      semantic=ranking.semantic, reranked=ranking.reranked,
                      rerank_reason=ranking.rerank_reason)

    def _rank(self, thread_id: int, through_id: int, query: str, terms: list[str],
              names: list[str], today: dt.date | None = None
              ) -> tuple[list[int], bool, str | None, str | None]:
        """Message ids, best first: bm25 and (if available) semantic rankings fused; a
        question that names a date adds a third ranking, of the messages written then,
        and ranks those up, as a question naming one speaker ranks up that speaker's
        messages. The candidates' rows are read once, for all of that. Also whether a
        ranking by meaning was fused in, whose words the question asks about, and for a
        question about the user's own words the one name that side carries
        (:attr:`Ranking.asker`)."""
        lexical = [hit_id for hit_id, _ in self.store.recall_hits(
            thread_id, through_id, fts_query(terms), LEXICAL_HITS)] if terms else []
        by_meaning = self.semantic(thread_id, through_id, query, LEXICAL_HITS) \
            if self.semantic is not None else []
        if by_meaning:  # the vectors are the thread's, every branch: keep the active one's
            on_path = self.store.on_path(thread_id, by_meaning)
            by_meaning = [i for i in by_meaning if i in on_path]
        asked = {n for n in names if re.search(rf"\b{re.escape(n)}\b", query, re.IGNORECASE)}
        speaker = next(iter(asked)) if len(asked) == 1 else None
        role = asked_role(query) if not asked else None
        periods = periods_in(query, today)
        then = self._written_then(thread_id, through_id, query, terms, periods) if periods else []
        rows = self.store.messages_by_id([*lexical, *by_meaning, *then]) \
            if by_meaning or speaker or role or periods else {}
        meaning = _statements(by_meaning, rows)
        boosts = _Boosts(speaker, role, periods)
        first = fuse([lexical, meaning, _statements(then, rows)])
        ranked = boosts.ranked(first, rows)
        strength = _relative(first, ranked)
        parts = question_parts(query, names)[:MAX_PARTS]
        if (parts or self.reranker is not None) and len(ranked) > 1:
            rows = {**rows, **self.store.messages_by_id([i for i in ranked if i not in rows])}
        reranked = ranked
        rerank = self.reranker is not None
        if rerank and len(ranked) > 1:
            reranked, strength = self._rerank(self._rerank_query(query), terms, ranked, rows, boosts,
                                              COUNTING_RE.search(query) is not None, strength)
        elif rerank:
            self._rerank_reason = "fewer than two candidates: nothing to reorder"
        if parts and len(ranked) > 1:  # each part ranked as the whole is, its boosts too
            part_rankings = []
            for part in parts:
                part_scores = self._score_part(thread_id, through_id, part, names, ranked, rows)
                part_ranked = boosts.ranked(part_scores, rows)
                part_strength = _relative(part_scores, part_ranked)
                if rerank and len(part_ranked) > 1:
                    part_ranked, part_strength = self._rerank(part, query_terms(part, names), part_ranked,
                                                              rows, boosts, False, part_strength)
                part_rankings.append(part_ranked)
                # a part's own best hits are as strong as the whole question's
                for i, value in part_strength.items():
                    strength[i] = max(strength.get(i, 0.0), value)
            reranked = _interleave([reranked, *part_rankings])
        self._strength = strength
        return reranked, bool(meaning), role, _asker(role, reranked, rows)

    def _rerank_query(self, query: str) -> str:
        """The question as the cross-encoder can read it whole (:func:`rerank_query`), in
        its own tokens when it counts them."""
        count = getattr(self.reranker, "query_tokens", None)
        limit = getattr(self.reranker, "max_query_tokens", None)
        if count is None or limit is None:
            count, limit = self.counter.count_text, RERANK_QUERY_TOKENS
        return rerank_query(query, count, limit)

    def _rerank(self, query: str, terms: list[str], ranked: list[int], rows: dict[int, dict],
                boosts: _Boosts, counting: bool,
                strength: dict[int, float]) -> tuple[list[int], dict[int, float]]:
        """``ranked`` with its first :data:`RERANK_CANDIDATES` reordered: the
        cross-encoder reads each with ``query`` as the block would show it (its date, its
        speaker, a long message's window around the question's words), its order is fused
        with ``ranked``'s (reciprocal rank fusion, equal weights) and the question's boosts
        applied again; the rest follow in their order. A reranker that fails leaves the
        order as it was (one log line)."""
        top = [i for i in ranked[:RERANK_CANDIDATES] if isinstance(rows.get(i, {}).get("content"), str)]
        if len(top) < 2:
            self._rerank_reason = self._rerank_reason or "fewer than two candidates: nothing to reorder"
            return ranked, strength
        lines = _Lines(terms, counting=counting)
        lines.hits.update(top)
        passages = []
        for i in top:
            said = said_from_row(rows[i])
            line = lines.line(said)[2:]  # "Speaker: text", without the list's dash
            passages.append(f"{fmt_date(said.date)}. {line}" if said.date else line)
        started = time.perf_counter()
        try:
            scores = list(self.reranker.score(query, passages))
        except Stopped:  # the user's Stop during a send: the model stops before its first token
            self._rerank_reason = RERANK_STOPPED
            return ranked, strength
        except Exception as exc:  # noqa: BLE001 - any failure of the model: keep the order recall had
            log.warning("reranking failed (%s); recall keeps its own order", exc)
            self._rerank_reason = f"reranking failed ({' '.join(str(exc).split()) or type(exc).__name__})"
            return ranked, strength
        finally:
            self._rerank_s += time.perf_counter() - started
        if len(scores) != len(top):
            log.warning("the reranker gave %d scores for %d passages; recall keeps its own order",
                        len(scores), len(top))
            self._rerank_reason = f"the reranker gave {len(scores)} scores for {len(top)} passages"
            return ranked, strength
        self._reranked = True
        by_model = [top[k] for k in sorted(range(len(top)), key=lambda k: (-scores[k], k))]
        # fused with recall's own order, not put in its place: alone the cross-encoder ranks
        # the assistant's explanations above the user's own statements ("did I…"), and the
        # asked side's boost on its order lifts every such message above the answer
        fused = fuse([top, by_model])
        head = boosts.ranked(fused, rows)
        chosen = set(head)
        rest = [i for i in ranked if i not in chosen]
        # each hit's strength is its fused score over the best one's; past the candidates
        # the cross-encoder read, the first stage's, never above the weakest it read
        new = _relative(fused, head)
        floor = min(new.values())
        new.update((i, min(strength.get(i, 0.0), floor)) for i in rest)
        return [*head, *rest], new

    def _score_part(self, thread_id: int, through_id: int, part: str, names: list[str],
                    candidates: list[int], rows: dict[int, dict]) -> dict[int, float]:
        """The whole question's candidates scored for one part of it: by meaning (the
        part's own vector, scored on the candidates' rows only) fused with the part's
        words (how many of them each candidate holds; ties in the whole ranking's order).
        Only the candidates are searched, so a part costs one short embedding, not a
        second scan of the thread: recall stays within its bound on long threads."""
        words = query_terms(part, names)
        held = {i: sum(1 for w in words if holds(str(rows.get(i, {}).get("content") or ""), w))
                for i in candidates}
        lexical = sorted((i for i in candidates if held[i]), key=lambda i: -held[i])
        by_meaning = self.semantic(thread_id, through_id, part, LEXICAL_HITS, among=candidates) \
            if self.semantic is not None else []
        return fuse([lexical, _statements(by_meaning, rows)])

    def _written_then(self, thread_id: int, through_id: int, query: str, terms: list[str],
                      periods: list[Period]) -> list[int]:
        """The messages written in the periods a question names (or soon after, see
        ``Period.holds``), best first by meaning, or by bm25 without a semantic ranking.
        "Which city was she visiting in August 2023?" finds the August messages that
        talk of a trip, though the whole chat talks of cities and no message says
        "August"."""
        years = self.store.sent_years(thread_id)
        if years is None:
            return []
        ids = self.store.sent_within(thread_id, through_id,
                                     [days for p in periods for days in p.days(*years)])
        if not ids:
            return []
        if self.semantic is not None:
            return self.semantic(thread_id, through_id, query, LEXICAL_HITS, among=ids)
        return [hit_id for hit_id, _ in self.store.recall_hits(
            thread_id, through_id, fts_query(terms), LEXICAL_HITS, among=ids)] if terms else []

    def block_for(self, thread_id: int, through_id: int, ids: Sequence[int],
                  terms: Sequence[str] = ()) -> str:
        """The block that would show exactly these messages, each with the messages that
        follow it, whatever it costs (what a perfect ranking would show; the retention
        bench's ceiling), clipped around ``terms`` as a block for them would be."""
        chosen: dict[int, Said] = {}
        lines = _Lines(terms)
        for message_id in ids:
            group = self._group(thread_id, through_id, message_id, frozenset())
            lines.hits.update(s.id for s in group[:1])
            chosen.update((s.id, s) for s in group)
        return _render(chosen, lines) if chosen else ""

    def _choose(self, thread_id: int, through_id: int, ranked: list[int], budget: int,
                exclude: frozenset[int], lines: _Lines,
                strength: dict[int, float] | None = None,
                footer: str = RECALL_FOOTER) -> dict[int, Said]:
        """The hits and the messages that follow each, in rank order while they fit; after
        the first hit, only those whose strength reaches :data:`RECALL_CUTOFF`."""
        spent = self.counter.count_text(f"{RECALL_HEADER}\n{footer}\n\n")
        chosen: dict[int, Said] = {}
        headings: set[str] = set()
        for hit_id in ranked:
            if budget - spent < MIN_ROOM_TOKENS:
                break
            if hit_id in chosen or hit_id in exclude:
                continue
            if chosen and strength and strength.get(hit_id, 0.0) < RECALL_CUTOFF:
                continue  # far below the best: the evidence has ended
            following = 0 if lines.counting or lines.role else FOLLOWING
            group = [s for s in self._group(thread_id, through_id, hit_id, exclude, following)
                     if s.id not in chosen]
            if not group or group[0].id != hit_id:
                continue
            lines.hits.add(hit_id)
            new_headings = {fmt_date(s.date) for s in group if s.date} - headings
            cost = self.counter.count_text("\n".join(
                [*(f"{h}:" for h in sorted(new_headings)), *(lines.line(s) for s in group)])) + 1
            if spent + cost > budget:
                continue
            chosen.update((s.id, s) for s in group)
            headings |= new_headings
            spent += cost
        return chosen

    def _group(self, thread_id: int, through_id: int, hit_id: int,
               exclude: frozenset[int], following: int = FOLLOWING) -> list[Said]:
        """A hit and up to ``following`` user/assistant messages after it."""
        ids = [hit_id, *self.store.following(thread_id, hit_id, through_id, following)]
        ids = [i for i in ids if i == hit_id or i not in exclude]
        rows = self.store.messages_by_id(ids)
        return [said_from_row(rows[i]) for i in ids
                if i in rows and isinstance(rows[i].get("content"), str)]


@dataclass(frozen=True)
class _Boosts:
    """What ranks a message up for one question: the one speaker it names, the side whose
    words it asks about ("did I…"), the periods it names."""

    speaker: str | None
    role: str | None
    periods: list[Period]

    def ranked(self, scores: dict[int, float], rows: dict[int, dict]) -> list[int]:
        """Fused ``scores`` with the boosts applied, best first (ties: older first)."""
        for i in scores:
            row = rows.get(i, {})
            if self.speaker is not None and row.get("name") == self.speaker:
                scores[i] *= NAMED_SPEAKER_BOOST
            if self.role and row.get("role") == self.role:
                scores[i] *= ASKED_ROLE_BOOST
            if self.periods and any(p.holds(day_of(row.get("sent_at"))) for p in self.periods):
                scores[i] *= NAMED_DATE_BOOST
        return sorted(scores, key=lambda i: (-scores[i], i))


def _asker(role: str | None, ranked: list[int], rows: dict[int, dict]) -> str | None:
    """For a question about the user's own words, the one name the user's side carries
    among the candidates (the person typing, in a chat imported with names); None when
    that side is unnamed or carries several names."""
    if role != "user":
        return None
    names = {rows[i].get("name") for i in ranked if rows.get(i, {}).get("role") == "user"}
    names.discard(None)
    return next(iter(names)) if len(names) == 1 else None


def _relative(scores: dict[int, float], ranked: Sequence[int]) -> dict[int, float]:
    """Each ranked id's score over the best one's (1.0 for the first)."""
    best = scores.get(ranked[0], 0.0) if ranked else 0.0
    return {i: scores[i] / best if best > 0 else 1.0 for i in ranked}


def _interleave(rankings: Sequence[Sequence[int]]) -> list[int]:
    """Rankings merged in turns (the first's best, the second's best, …), each id once:
    every part of a question gets its best hits near the top."""
    out: dict[int, None] = {}
    for rank in range(max((len(r) for r in rankings), default=0)):
        for ranking in rankings:
            if rank < len(ranking):
                out.setdefault(ranking[rank], None)
    return list(out)


def _statements(ids: list[int], rows: dict[int, dict]) -> list[int]:
    """A ranking by meaning without questions (a question is near other questions in
    meaning, and holds no fact) and without repeats of the same words. A message that
    says something and then asks ("Oscar, my guinea pig, is great. How are your pets?")
    is a statement: it keeps its place."""
    seen: set[str] = set()
    out = []
    for i in ids:
        text = " ".join(str(rows.get(i, {}).get("content") or "").lower().split())
        if text and not _asks_only(text) and text not in seen:
            seen.add(text)
            out.append(i)
    return out


def _asks_only(text: str) -> bool:
    """Is every sentence of ``text`` a question? In any script: "我的猫叫什么名字？你呢？"
    asks only, "我的猫叫米米。你呢？" says something first."""
    # its sentences as ANY_SENTENCE_END_RE.split cuts them, looked at up to the first that
    # says something (a long message's first sentence, not every one of them)
    asked, start = False, 0
    cuts = itertools.chain((m.span() for m in ANY_SENTENCE_END_RE.finditer(text)), [(len(text), 0)])
    for cut, after in cuts:
        sentence, start = text[start:cut], after
        if ANY_WORD_RE.search(sentence):
            if not _is_question(sentence):
                return False
            asked = True
    return asked


def _is_question(sentence: str) -> bool:
    """Does a sentence end in a question mark (before closing quotes or brackets)?"""
    return sentence.rstrip(" \"')]」』）").endswith(QUESTION_MARKS)


class _Lines:
    """Each message's line in one block, rendered once: ``- Speaker: text``, relative
    dates anchored; a long hit clipped around the question's words to :data:`MAX_CHARS`
    (the block's tokens go to what matches, not to a long message's first lines), a
    message shown after a hit to its first :data:`FOLLOWER_CHARS` (a reply answers
    first). For a question that counts (``counting``) a hit is clipped to
    :data:`COUNTING_HIT_CHARS`; it, and a hit for a question about one side's own words
    (``role``), is shown alone."""

    def __init__(self, terms: Sequence[str] = (), role: str | None = None, counting: bool = False):
        self.terms = [t.lower() for t in terms]
        self.role = role
        self.counting = counting
        self.hits: set[int] = set()  # hits, as opposed to the messages shown after them
        self._lines: dict[int, str] = {}

    def line(self, said: Said) -> str:
        line = self._lines.get(said.id)
        if line is None:
            if said.id in self.hits:
                text = clip_around(said.text, self.terms, COUNTING_HIT_CHARS if self.counting else MAX_CHARS)
            else:  # a reply answers from its start
                text = clip_start(said.text, FOLLOWER_CHARS)
            line = self._lines[said.id] = f"- {said.speaker}: {resolve_relative(text, said.date)}"
        return line


def _footer(asker: str | None) -> str:
    """The block's last line(s): for a question about the user's own words in a chat whose
    user side is named, who "I" is ("What did I plant?" with Rosa's and Tomas's messages
    above: the bundled model answered with Tomas's until told)."""
    return f"{RECALL_FOOTER}\nI am {asker}." if asker else RECALL_FOOTER


def _render(chosen: dict[int, Said], lines: _Lines, footer: str = RECALL_FOOTER) -> str:
    """The block, in message order, each date said once (as the ledger does)."""
    out = [RECALL_HEADER]
    current = None
    for message_id in sorted(chosen):
        said = chosen[message_id]
        heading = fmt_date(said.date) if said.date else None
        if heading and heading != current:
            out.append(f"{heading}:")
            current = heading
        out.append(lines.line(said))
    out.append(footer)
    return "\n".join(out)


def attach(block: str, content: str) -> str:
    """The newest user message as the model sees it, recall first."""
    return f"{block}\n\n{content}" if block else content
