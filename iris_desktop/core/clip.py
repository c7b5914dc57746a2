"""A long recalled message clipped around the question's words (:func:`clip_around`), in
work that grows with the places those words are found rather than with every word of the
message: a pasted book or log of 10 MB held in a chat was cut into every sentence and
piece, word by word, and each piece searched for each word of the question, for every
question and every rerank of it (about 3 s per MB on two busy cores). What is shown is
the same as before for any text and words.

A clipped text is cut into sentences (at a space after ".", "!" or "?"), and a sentence
longer than the limit into pieces of about half of it, at spaces (:func:`_pieces`); the
pieces that hold the most words are kept, in their order. Here each word's places are
found in the whole text at once (in its lower case, or by a regex that ignores case, then
checked as :func:`_term_pattern` matches them: :func:`_places`), and only the sentences
they are in are cut into pieces (:func:`_found`). What is left grows with the text: its
whitespace made single spaces, its lower case, and one regex pass for the sentences' ends:
0.3–0.4 s for 10 MB of prose, was 0.9–1.5 s (two busy cores).
"""

from __future__ import annotations

import bisect
import itertools
import operator
import re
from collections import Counter
from collections.abc import Sequence

SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+")
#: where a sentence ends in a text whose whitespace is single spaces (SENTENCE_END_RE's)
_SENTENCE_END_SPACED = re.compile(r"[.!?] ")
#: the characters whose lower case is not one character, or that match an ASCII letter
#: when case is ignored (``re.IGNORECASE``) though their lower case is not it: "İ", "ı",
#: "ſ" and the Kelvin sign. In a text without them, a word of ASCII letters and digits is
#: at the places of ``text.lower()`` where its lower case is (tests/test_long_message_cost.py
#: checks this list against every character)
CASE_ODD = "\u0130\u0131\u017f\u212a"
#: the least a kept piece costs (one character and a space or an ellipsis)
_LEAST_COST = 3


def clip_around(text: str, terms: Sequence[str], limit: int) -> str:
    """``text`` in at most ``limit`` characters: whole when it fits, else the sentences
    that hold the most of ``terms`` (crude stems, matched as word prefixes), in their
    order, with "…" where text was left out; the start when no sentence holds any."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    starts, held = _found(text, terms, limit)  # the pieces' starts; piece → terms it holds

    def piece(i: int) -> str:  # (the i-th piece, from 1)
        return text[starts[i - 1]:starts[i] - 1 if i < len(starts) else len(text)]

    if not held:
        return _clip(text, limit)
    order = sorted(held)  # the pieces that hold any, in the text's order
    keep: set[int] = set()
    room = limit
    for score in sorted(set(held.values()), reverse=True):
        for i in order:
            if room < _LEAST_COST:
                break
            if held[i] == score and (cost := len(piece(i)) + 2) <= room:  # a space, or "…"
                keep.add(i)
                room -= cost
    if not keep:  # the best piece alone is longer than the limit
        best = max(order, key=lambda i: (held[i], -i))
        return ("… " if best > 1 else "") + _clip(piece(best), limit - 2)
    out = []
    for i in sorted(keep):
        if i > 1 and i - 1 not in keep:
            out.append("…")
        out.append(piece(i))
    if max(keep) < len(starts):
        out.append("…")
    return " ".join(out)


def _found(text: str, terms: Sequence[str], limit: int) -> tuple[list[int], Counter[int]]:
    """Where the pieces of ``text`` (whitespace already single spaces) that hold any of
    ``terms`` start (with others'), and how many of the terms each holds, by its place in
    that list (from 1). Each word's places are found in the whole text at once
    (:func:`_places`), and only the long sentences that hold one are cut into pieces; a
    word with a space in it (or none) is looked for in every piece instead, as before."""
    patterns = [_term_pattern(t) for t in terms]
    spread = [k for k, t in enumerate(terms) if t and " " not in t]
    rest = [patterns[k] for k, t in enumerate(terms) if not t or " " in t]
    lowered = text.lower() if any(_plain(terms[k]) for k in spread) and not any(
        ch in text for ch in CASE_ODD) else None
    places = [_places(text, lowered, terms[k], patterns[k]) for k in spread]
    held: Counter[int] = Counter()
    if not rest and not any(places):
        return [0], held
    starts = _sentence_starts(text)
    count = len(starts)
    ends = [*map(operator.sub, starts[1:], itertools.repeat(1)), len(text)]
    long = itertools.compress(range(1, count + 1),  # (bisect's numbers: from 1)
                              map(limit.__lt__, map(operator.sub, ends, starts)))
    if not rest:
        long = set(long).intersection(itertools.chain.from_iterable(
            map(bisect.bisect, itertools.repeat(starts), at) for at in places))
    size = max(limit // 2, 40)
    for i in list(long):
        starts += _piece_starts(text, starts[i - 1], ends[i - 1], size)
    starts.sort()
    for at in places:
        held.update(set(map(bisect.bisect, itertools.repeat(starts), at)))
    if rest:
        for i in range(1, len(starts) + 1):
            piece = text[starts[i - 1]:starts[i] - 1 if i < len(starts) else len(text)]
            held[i] += sum(1 for p in rest if p.search(piece))
    return starts, +held


def _places(text: str, lowered: str | None, term: str, pattern: re.Pattern[str]) -> list[int]:
    """Where ``pattern`` (``term``'s) matches ``text``, in order (at least one of
    overlapping ones: having no space, they are in one piece). A word of ASCII letters and
    digits is looked for in the text's lower case first, each place then checked with the
    pattern (a regex that ignores case, with a word's edge, reads a text several times
    slower)."""
    needle = term.lower()
    if lowered is None or not _plain(term) or lowered.count(needle) > len(text) // 32:
        return list(map(re.Match.start, pattern.finditer(text)))  # (many: each checked costs more)
    at = list(map(re.Match.start, re.finditer(re.escape(needle), lowered)))
    return list(itertools.compress(at, map(pattern.match, itertools.repeat(text), at)))


def holds(text: str, term: str) -> bool:
    """Does :func:`_term_pattern` (``term``'s) match somewhere in ``text``? The same
    answer, read about four times faster where it does not: a regex that ignores case
    reads a text slowly with a word's edge (``\\b``) before it, so the word is looked for
    without it first, then checked there (and searched on from there if it is not a word's
    start: "art" in "start")."""
    pattern = _term_pattern(term)
    first = re.search(re.escape(term), text, re.IGNORECASE)
    if first is None:
        return False
    return bool(pattern.match(text, first.start()) or pattern.search(text, first.start() + 1))


def _sentence_starts(text: str) -> list[int]:
    """Where the sentences of ``text`` (single spaces) start: 0, and after each ". ", "! "
    or "? " (SENTENCE_END_RE's places), in order."""
    return [0, *map(re.Match.end, _SENTENCE_END_SPACED.finditer(text))]


def _piece_starts(text: str, start: int, end: int, size: int) -> list[int]:
    """Where the pieces of the sentence ``text[start:end]`` start, after its first (as
    :func:`_piece_end` ends them)."""
    out = []
    while end - start > size:
        space = text.rfind(" ", start, start + size + 1)
        if space < 0 and (space := text.find(" ", start, end)) < 0:
            break
        start = space + 1
        out.append(start)
    return out


def _plain(term: str) -> bool:
    """A word of ASCII letters and digits only: found in a text's lower case."""
    return term.isascii() and term.isalnum()


def _piece_end(text: str, start: int, end: int, size: int) -> int:
    """Where the piece of a sentence (``text[..end]``) that starts at ``start`` ends: after
    as many of its words as fit in ``size`` characters, or its first word alone."""
    if end - start <= size:
        return end
    space = text.rfind(" ", start, start + size + 1)
    if space < 0:
        space = text.find(" ", start, end)
    return space if space >= 0 else end


def _term_pattern(term: str) -> re.Pattern[str]:
    """A search term as FTS5 matches it (:func:`fts_query`): a stem of four letters or
    more as a word prefix, a shorter one as a whole word."""
    return re.compile(rf"\b{re.escape(term)}" + ("" if len(term) >= 4 else r"\b"), re.IGNORECASE)


def _pieces(sentence: str, limit: int) -> list[str]:
    """A sentence longer than ``limit`` (a list run together, a paragraph without stops)
    in parts of about half the limit, at spaces."""
    if len(sentence) <= limit:
        return [sentence]
    out, start, size = [], 0, max(limit // 2, 40)
    while True:
        end = _piece_end(sentence, start, len(sentence), size)
        out.append(sentence[start:end])
        if end >= len(sentence):
            return out
        start = end + 1


def clip_start(text: str, limit: int) -> str:
    """``text``'s start in at most ``limit`` characters, its whitespace single spaces
    (``_clip(" ".join(text.split()), limit)``), reading only as much of a long text as
    that needs: a message shown after a hit, of 10 MB, was read whole for its first line."""
    if limit < 1:  # (_clip's text[:limit - 1] counts from the end)
        return _clip(" ".join(text.split()), limit)
    size = 2 * limit + 64
    while True:
        head = " ".join(text[:size].split())  # (the start of the whole text's, whatever the cut)
        if len(head) > limit or size >= len(text):
            return _clip(head, limit)
        size *= 4


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"
