"""Recall's queries, and the search of the thread list: full-text (FTS5, ``messages_fts``),
by the day a message was written, by who wrote it. All of them only read."""

from __future__ import annotations

import datetime as dt
import functools
import json
import re
import unicodedata
from collections.abc import Sequence
from typing import Any

from iris_desktop.core.store.base import Connected

#: the most words, and characters, the search box looks for
MAX_SEARCH_TERMS = 16
MAX_SEARCH_CHARS = 1_000
#: the most message hits of one chat among the first results (one long chat filled all 50
#: rows, hiding every other chat's); more of it follow only when others have no more
HITS_PER_CHAT = 5
#: the most matches of a query that are ranked: its newest ones (ranking all 134,120
#: messages that hold a word in "a" took 5.6 s and held the window's searches and chat
#: loads behind it); a query that matches fewer is ranked whole, as before
MAX_RANKED = 2_000
#: a word of at most this many letters or digits is a whole word, not a prefix ("a" was
#: every word in a; "go", "js", "AI" find those words)
WHOLE_WORD_AT_MOST = 2
#: a message longer than this (characters) gets its snippet from the first place of a
#: searched word, not from FTS5's snippet(): that scores every place a word is found
#: against every other, and a pasted book or log of 5 MB holding the word 50,000 times
#: took minutes, and could not be stopped (tests/test_long_message_cost.py)
LONG_SNIPPET_CHARS = 100_000
#: where a snippet's found word starts and ends, while it is made: control characters, so
#: a bracket the message writes ("a[i]") is not taken for one (:func:`_marked`)
_OPEN, _CLOSE = "\x02", "\x03"
#: those characters where a message writes them (a space each): not taken for marks
_UNMARKED = str.maketrans({_OPEN: " ", _CLOSE: " "})


def _unsegmented(term: str) -> bool:
    """A word the full-text index keeps inside longer runs or drops: Chinese, Japanese or
    Korean text (written without spaces), or a symbol such as an emoji. (ASCII punctuation
    is looked for as written by :func:`_fts_part` instead.)"""
    return any(not ch.isalnum() and not ch.isascii() or "\u3040" <= ch <= "\u30ff"
               or "\u3400" <= ch <= "\u9fff" or "\uac00" <= ch <= "\ud7af" for ch in term)


#: a word whose punctuation at an edge belongs to it, found only where it is written so:
#: "C++", "C#", "F#" (a word ending in + or #) and ".NET" (a dot and a word); punctuation
#: at the edge of any other word ("spring.", "error:", "#python", "@bob", "'quoted'") is
#: the sentence's, dropped as the index drops it (a review found "spring." finding nothing
#: once every edge was taken as written)
_AS_WRITTEN = re.compile(r"[^\W_]+[+#]+|\.[^\W_]+")


#: the control characters a search leaves out (C0, DEL, C1)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _fts_part(term: str) -> tuple[str | None, bool]:
    """What the full-text index is asked for ``term`` (None: nothing, the term is only
    punctuation), and whether the messages must hold ``term`` as written too: the
    tokenizer drops punctuation, so "C++" was the prefix "c"* (every word in c). A word of
    :data:`_AS_WRITTEN`'s shape is found where it is written so ("C++": the word "c" held
    as "C++"); any other word is a prefix, its punctuation dropped as before ("spring."
    finds "springtime"; "node.js", "e-mail", "don't" also find "node js", "e mail",
    "don’t"). A word of one or two letters or digits ("a", "I", "go") is a whole word: as a
    prefix it matched nearly every message."""
    letters = sum(ch.isalnum() for ch in term)
    if not letters:
        return None, True
    prefix = "*" if letters > WHOLE_WORD_AT_MOST else ""
    if _AS_WRITTEN.fullmatch(term):
        return f'"{term}"' + (prefix if term[-1].isalnum() else ""), True
    return f'"{term}"{prefix}', False


#: the combining marks the full-text index's tokenizer drops (SQLite's unicode61 with
#: remove_diacritics=1: sqlite3Fts5UnicodeIsdiacritic, part of U+0300–U+0331)
_DIACRITICS = frozenset("\u0300\u0301\u0302\u0303\u0304\u0306\u0307\u0308\u0309\u030a"
                        "\u030b\u030c\u030f\u0311\u031b\u0323\u0324\u0325\u0326\u0327"
                        "\u0328\u032d\u032e\u0330\u0331")


def folded(text: str) -> str:
    """``text`` compared as the full-text index compares words: case folded, and a Latin
    letter with one of those marks as the letter alone ("Café" → "cafe", "Ölwechsel" →
    "olwechsel"); ø, ł, ß, ǖ (two marks), Greek, Cyrillic, Arabic and the vowel signs of
    Devanagari or Thai stay as they are, as they do in the index."""
    return text.casefold() if text.isascii() else "".join(map(_folded_char, text))


@functools.lru_cache(maxsize=4096)
def _folded_char(ch: str) -> str:
    if ch in _DIACRITICS:  # a mark written apart from its letter ("e\u0301")
        return ""
    out: list[str] = []
    for one in unicodedata.normalize("NFC", ch.casefold()):  # (casefold makes "İ" i and ̇)
        parts = unicodedata.normalize("NFD", one)
        if len(parts) == 2 and parts[0].isascii() and parts[0].isalpha() and parts[1] in _DIACRITICS:
            one = parts[0]
        elif one in _DIACRITICS and out and out[-1].isascii():
            continue
        out.append(one)
    return "".join(out)


class Search(Connected):
    """Finding messages: what :mod:`iris_desktop.core.recall` ranks, and what the thread
    list's search box shows."""

    def recall_hits(
        self, thread_id: int, through_id: int, fts: str, limit: int = 60,
        among: Sequence[int] | None = None,
    ) -> list[tuple[int, float]]:
        """(id, bm25 rank) of the active branch's messages up to ``through_id`` (and
        among ``among``, when given) that match the FTS5 query ``fts``, best first: what
        the user and the model said, and the tools' outputs (an agent's results, a flag
        it found, a traceback, lived only there once summarized: never recalled)."""
        if through_id <= 0 or not fts or (among is not None and not among):
            return []
        rows = self.conn.execute(
            f"""
            SELECT m.id, rank FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid
            WHERE messages_fts MATCH ? AND m.thread_id = ? AND m.id <= ?
              AND m.role IN ('user', 'assistant', 'tool')
              AND EXISTS (SELECT 1 FROM thread_paths p WHERE p.thread_id = m.thread_id
                          AND p.message_id = m.id)
              {"AND m.id IN (SELECT value FROM json_each(?))" if among is not None else ""}
            ORDER BY rank LIMIT ?
            """,
            (fts, thread_id, through_id, *([json.dumps(list(among))] if among is not None else []), limit),
        ).fetchall()
        return [(int(r[0]), float(r[1])) for r in rows]

    def sent_within(self, thread_id: int, through_id: int,
                    days: Sequence[tuple[dt.date, dt.date]]) -> list[int]:
        """Ids of the active branch's user and assistant messages up to ``through_id``
        that were written on one of the ``days`` ranges (first, last, inclusive; the writer's local
        day, as ``sent_at`` says), oldest first. Read by the ``messages_thread_sent``
        index."""
        found: set[int] = set()
        for first, last in days:
            rows = self.conn.execute(
                """
                SELECT id FROM messages m INDEXED BY messages_thread_sent
                WHERE thread_id = ? AND sent_at >= ? AND sent_at < ? AND id <= ?
                  AND role IN ('user', 'assistant')
                  AND EXISTS (SELECT 1 FROM thread_paths p WHERE p.thread_id = m.thread_id
                              AND p.message_id = m.id)
                """,
                (thread_id, first.isoformat(), (last + dt.timedelta(days=1)).isoformat(), through_id),
            ).fetchall()
            found.update(int(r[0]) for r in rows)
        return sorted(found)

    def sent_years(self, thread_id: int) -> tuple[int, int] | None:
        """The first and last year the thread's messages were written in (by
        ``sent_at``), or None when none says."""
        years = []
        for order in ("ASC", "DESC"):
            row = self.conn.execute(
                "SELECT sent_at FROM messages INDEXED BY messages_thread_sent "
                f"WHERE thread_id = ? AND sent_at IS NOT NULL ORDER BY sent_at {order} LIMIT 1",
                (thread_id,),
            ).fetchone()
            if row is None or not str(row[0])[:4].isdigit():
                return None
            years.append(int(str(row[0])[:4]))
        return years[0], years[1]

    def thread_speakers(self, thread_id: int, limit: int = 32) -> list[str]:
        """The names the thread's messages carry (OpenAI's ``name`` field), most used
        first (ties by name). Counting them reads every message of the thread (3.5 ms
        at 100k, and recall asks twice per question), so the answer is kept until the
        thread's first or newest message id changes: messages are only ever added, or
        deleted with their thread."""
        key = (thread_id, limit, *self.conn.execute(  # two lookups in messages_thread
            "SELECT (SELECT min(id) FROM messages WHERE thread_id = :t), "
            "(SELECT max(id) FROM messages WHERE thread_id = :t)", {"t": thread_id}).fetchone())
        if self._speakers is not None and self._speakers[0] == key:
            return list(self._speakers[1])
        rows = self.conn.execute(
            """
            SELECT name FROM messages INDEXED BY messages_thread_name
            WHERE thread_id = ? AND name IS NOT NULL AND role IN ('user', 'assistant')
            GROUP BY name ORDER BY count(*) DESC, name LIMIT ?
            """,
            (thread_id, limit),
        ).fetchall()
        names = [r[0] for r in rows if r[0]]
        self._speakers = (key, names)
        return list(names)

    def following(self, thread_id: int, message_id: int, through_id: int, count: int) -> list[int]:
        """Up to ``count`` user or assistant messages right after ``message_id`` on the
        active branch (≤ ``through_id``); stops at anything else (a tool result)."""
        rows = self.conn.execute(
            "SELECT m.id, m.role FROM thread_paths p JOIN messages m ON m.id = p.message_id "
            "WHERE p.thread_id = ? AND p.message_id > ? AND p.message_id <= ? "
            "ORDER BY p.message_id LIMIT ?",
            (thread_id, message_id, through_id, count),
        ).fetchall()
        out: list[int] = []
        for mid, role in rows:
            if role not in ("user", "assistant"):
                break
            out.append(int(mid))
        return out

    def search(self, query: str, limit: int = 50) -> list[dict[str, Any]]:
        """Threads whose title holds every word of ``query`` (any order, taken literally,
        compared as the full-text index compares: :func:`folded`), then messages that match
        (FTS5), best first. A word the full-text index cannot find inside a longer run
        (Chinese or Japanese text, an emoji), or a query of punctuation only, is looked for
        as it is written; a word with punctuation at its edges ("C++", ".NET") is found
        where it is written so, punctuation inside a word ("node.js") ranks the messages
        that write it so first. At most MAX_SEARCH_TERMS words of at most MAX_SEARCH_CHARS
        characters in all: a pasted page took 40 s. A word of one or two letters is a
        whole word, a longer one a prefix too; a query matching more than MAX_RANKED
        messages is ranked among its newest MAX_RANKED matches (:meth:`_matching`)."""
        # control characters are no words: a NUL ended FTS5's reading of its quoted term
        # ("unterminated string"; a failed search's explanation then read the file: s67)
        text = _CONTROL.sub(" ", query[:MAX_SEARCH_CHARS])
        terms = (text.replace('"', " ").split() or text.split())[:MAX_SEARCH_TERMS]
        if not terms:
            return []
        words = [folded(t) for t in terms]
        titles = [{"thread_id": r[0], "title": r[1], "message_id": None, "snippet": r[1]}
                  for r in self.conn.execute("SELECT id, title FROM threads ORDER BY updated_at DESC, id DESC")
                  if all(w in folded(r[1] or "") for w in words)]
        parts = [_fts_part(t) for t in terms]
        if any(_unsegmented(t) for t in terms) or not any(fts for fts, _ in parts):
            return titles + list(map(_marked, _spread(self._search_as_written(terms, limit * 4), limit)))
        fts = " ".join(fts for fts, _ in parts if fts)
        written = [t for t, (_, edged) in zip(terms, parts) if edged]
        marked = [t for t in terms if not t.isalnum() and t not in written]
        return titles + list(map(_marked, self._matching(
            fts, written, marked, limit, [t for t, (part, _) in zip(terms, parts) if part])))

    def _matching(self, fts: str, written: list[str], marked: list[str],
                  limit: int, words: Sequence[str] = ()) -> list[dict[str, Any]]:
        """Messages that match the FTS5 query ``fts`` and hold each of ``written`` as it is
        written (case folded as SQLite's lower() does), those that hold each of ``marked``
        so too first, then by rank; the best HITS_PER_CHAT of each chat first, then the
        rest: chosen in SQL over every hit (a long chat's 200 best hits hid another chat's
        one); snippets only for those chosen. A very common word ("the", "I love") is
        ranked among its newest MAX_RANKED matches only: the rows those are read from
        are found newest first and the search stops there (ranking every match made a
        one-letter search take seconds). A message over LONG_SNIPPET_CHARS gets its
        snippet around the first place of one of ``words`` (:func:`_long_snippet`)."""
        holds = "instr(lower(m.content), lower(?)) > 0"
        where = "".join(f" AND {holds}" for _ in written)
        # (1: a message that writes a marked word otherwise, "node js" for "node.js")
        apart = f"NOT ({' AND '.join(holds for _ in marked)})" if marked else "NULL"
        chosen = self.conn.execute(
            f"""
            SELECT id, nth FROM (
                SELECT id, r, apart,
                       ROW_NUMBER() OVER (PARTITION BY thread_id ORDER BY apart, r) AS nth
                FROM (SELECT m.id, m.thread_id, messages_fts.rank AS r, {apart} AS apart
                      FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid
                      WHERE messages_fts MATCH ?{where}
                      ORDER BY messages_fts.rowid DESC LIMIT ?))
            ORDER BY nth > ?, apart, r LIMIT ?
            """, (*marked, fts, *written, max(MAX_RANKED, limit), HITS_PER_CHAT, limit)).fetchall()
        if not chosen:
            return []
        picked = ", ".join(str(int(mid)) for mid, _ in chosen)
        if written:  # the tokenizer's snippet marks "c" of "C++": the term as written
            rows = {r[2]: {"thread_id": r[0], "title": r[1], "message_id": r[2],
                           "snippet": _snippet(r[3], written[0])}
                    for r in self.conn.execute(
                        f"SELECT m.thread_id, t.title, m.id, m.content FROM messages m JOIN "
                        f"threads t ON t.id = m.thread_id WHERE m.id IN ({picked})")}
        else:
            rows = {r["message_id"]: r for r in self.db.query(
                f"""
                SELECT m.thread_id, t.title, m.id AS message_id,
                       snippet(messages_fts, 0, char(2), char(3), '…', 12) AS snippet
                FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid
                JOIN threads t ON t.id = m.thread_id
                WHERE messages_fts MATCH :fts AND messages_fts.rowid BETWEEN :low AND :high
                  AND +messages_fts.rowid IN ({picked}) AND coalesce(length(m.content), 0) <= :long
                  AND coalesce(instr(m.content, char(2)) + instr(m.content, char(3)), 0) = 0
                """, {"fts": fts, "low": min(mid for mid, _ in chosen),
                      "high": max(mid for mid, _ in chosen), "long": LONG_SNIPPET_CHARS})}
            # (one pass over the chosen ones' range: a rowid lookup each set up the query
            # anew, every word in "the" read 50 times)
            # a very long message, or one that writes the marks' characters: its snippet read here
            if len(rows) < len(chosen):
                rows.update({r[2]: {"thread_id": r[0], "title": r[1], "message_id": r[2],
                                    "snippet": _long_snippet(r[3], words)}
                             for r in self.conn.execute(
                                 f"SELECT m.thread_id, t.title, m.id, m.content FROM messages m "
                                 f"JOIN threads t ON t.id = m.thread_id WHERE m.id IN ({picked}) "
                                 f"AND (length(m.content) > ? OR instr(m.content, char(2)) > 0 "
                                 f"OR instr(m.content, char(3)) > 0)", (LONG_SNIPPET_CHARS,))})
        return _grouped([(rows[mid], nth <= HITS_PER_CHAT) for mid, nth in chosen if mid in rows])

    def _search_as_written(self, terms: list[str], limit: int) -> list[dict[str, Any]]:
        """Messages holding every term as written (newest first), with a snippet."""
        where = " AND ".join("instr(lower(m.content), lower(?)) > 0" for _ in terms)
        rows = self.conn.execute(
            f"SELECT m.thread_id, t.title, m.id, m.content FROM messages m "
            f"JOIN threads t ON t.id = m.thread_id WHERE m.content IS NOT NULL AND {where} "
            f"ORDER BY m.id DESC LIMIT ?", (*terms, limit)).fetchall()
        return [{"thread_id": thread_id, "title": title, "message_id": message_id,
                 "snippet": _snippet(content, terms[0])}
                for thread_id, title, message_id, content in rows]


def _snippet(content: str, term: str) -> str:
    """Up to 40 characters either side of ``term``'s first place in ``content`` (in any
    case), the term marked as the index's snippets mark a word."""
    at = max(content.lower().find(term.lower()), 0)
    return _around(content, at, at + len(term))


def _around(content: str, at: int, end: int) -> str:
    """Up to 40 characters either side of ``content[at:end]``, which is marked."""
    start = max(at - 40, 0)
    return (("…" if start else "") + content[start:at].translate(_UNMARKED) + _OPEN
            + content[at:end].translate(_UNMARKED) + _CLOSE
            + content[end:end + 40].translate(_UNMARKED) + "…")


def _marked(hit: dict[str, Any]) -> dict[str, Any]:
    """A message hit as shown: ``text``, its snippet unmarked; ``marks``, the (start,
    end) of each found word in it, for the window to set in bold; ``snippet``, the words
    in [brackets] for a plain list. A mark the message itself writes is dropped."""
    text, marks, start = "", [], None
    for part in re.split("([\x02\x03])", hit["snippet"] or ""):
        if part == _OPEN:
            start = len(text)
        elif part == _CLOSE:
            if start is not None:
                marks.append((start, len(text)))
            start = None
        else:
            text += part
    return {**hit, "snippet": _bracketed(text, marks), "text": text, "marks": marks}


def _bracketed(text: str, marks: list[tuple[int, int]]) -> str:
    """``text`` with each marked span in [brackets]."""
    out, at = [], 0
    for start, end in marks:
        out += [text[at:start], "[", text[start:end], "]"]
        at = end
    return "".join(out) + text[at:]


def _word_pattern(word: str) -> re.Pattern[str] | None:
    """``word`` as the full-text index finds it (:func:`_fts_part`): its runs of letters
    and digits (the tokenizer's words) with anything else between, in any case, a Latin
    letter with or without the marks the index drops (:func:`folded`); the start of a
    word when it has more than WHOLE_WORD_AT_MOST letters, else a whole word. None for a
    word of punctuation only."""
    # (a letter whose full case folding is longer, ß → ss, keeps its simple lower case, as
    # the index's unicode61 tokenizer does: "straße" finds "Straße", not "STRASSE")
    runs = re.findall(r"[^\W_]+", "".join(c.lower() if c.casefold() != c.lower() else folded(c) for c in word))
    if not runs:
        return None
    body = r"[\W_]+".join("".join(map(_letter, run)) for run in runs)
    tail = r"[^\W_]*" if sum(map(len, runs)) > WHOLE_WORD_AT_MOST else r"(?![^\W_])"
    return re.compile(rf"(?<![^\W_]){body}{tail}", re.IGNORECASE)


@functools.lru_cache(maxsize=256)
def _letter(ch: str) -> str:
    """A folded letter as a regex: itself or a Latin letter that folds to it, each with
    any of the marks written apart after it."""
    same = "".join(c for c in map(chr, range(0xC0, 0x250)) if folded(c) == ch)
    return f"[{re.escape(ch + same)}][{''.join(sorted(_DIACRITICS))}]*"


def _long_snippet(content: str, words: Sequence[str]) -> str:
    """Up to 40 characters either side of the first place in ``content`` where the index
    finds one of ``words`` (:func:`_word_pattern`; else where one is written, in any case),
    marked as the index's snippets mark a word; the start when none is found."""
    patterns = [p for p in map(_word_pattern, words) if p is not None]
    places = [m.span() for m in (p.search(content) for p in patterns) if m] or [
        m.span() for m in (re.search(re.escape(w), content, re.IGNORECASE) for w in words) if m]
    if not places:
        return content[:80].translate(_UNMARKED) + "…"
    return _around(content, *min(places))


def _spread(hits: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """The first ``limit`` of ``hits`` (best first), at most HITS_PER_CHAT of one chat
    before every chat's have had their turn, then the rest in order (:func:`_grouped`)."""
    seen: dict[int, int] = {}
    first, rest = [], []
    for hit in hits:
        seen[hit["thread_id"]] = seen.get(hit["thread_id"], 0) + 1
        (first if seen[hit["thread_id"]] <= HITS_PER_CHAT else rest).append(hit)
    # the first ``limit`` by round then rank, grouped after (grouping first dropped a
    # chat's hits by the order of the groups when the first round alone passed ``limit``)
    return _grouped(([(hit, True) for hit in first] + [(hit, False) for hit in rest])[:limit])


def _grouped(hits: list[tuple[dict[str, Any], bool]]) -> list[dict[str, Any]]:
    """``hits`` (best first, each marked whether it is among its chat's first
    HITS_PER_CHAT), listed by chat: the first ones of each chat, chats in the order of
    their best hit, before any chat's further ones (grouped the same way)."""
    out: list[dict[str, Any]] = []
    for first in (True, False):
        part = [hit for hit, is_first in hits if is_first is first]
        order = {tid: i for i, tid in enumerate(dict.fromkeys(h["thread_id"] for h in part))}
        out += sorted(part, key=lambda h: order[h["thread_id"]])
    return out
