"""A very long message (a pasted book or log of several MB) costs search and recall work
that grows with the places its words are found, not with the message: counted, never
timed. The search box's snippet of such a message is no longer FTS5's snippet(), which
scores every place a word is found against every other (minutes for 5 MB holding the word
50,000 times, and no stopping it); recall's clip of it cuts only the sentences that hold a
word of the question, and shows exactly what it showed before."""

from __future__ import annotations

import re
import string
import sys

import pytest

from iris_desktop.core.recall import clip_around


class TooMuchWork(Exception):
    pass


def lines_run(action, bound: int):
    """(Python lines ``action`` ran, what it returned), stopping it with TooMuchWork once
    past ``bound``: a slow version fails at once, not after minutes."""
    count = [0]

    def local(frame, event, arg):
        if event == "line":
            count[0] += 1
            if count[0] > bound:
                raise TooMuchWork(f"more than {bound} lines")
        return local

    sys.settrace(lambda frame, event, arg: local)
    try:
        result = action()
    finally:
        sys.settrace(None)
    return count[0], result


def snippet_chars(store, action):
    """(characters of the messages whose snippet FTS5's snippet() made, what ``action``
    returned)."""
    real = store.db.query
    chars = [0]

    def query(sql, params=None):
        rows = list(real(sql, params))
        if "snippet(" in sql:
            ids = [r["message_id"] for r in rows]
            chars[0] += sum(len(row[0] or "") for i in ids for row in store.conn.execute(
                "SELECT content FROM messages WHERE id = ?", (i,)))
        return rows

    store.db.query = query
    try:
        result = action()
        return chars[0], result
    finally:
        del store.db.query  # (the instance's attribute over the method)


def log_lines(count: int, word: str = "Kettle") -> str:
    return "".join(f"line {i}: the {word} boiled over, {word.lower()} again.\n" if i % 2 == 0
                   else f"line {i}: nothing here at all today, really.\n" for i in range(count))


def test_searching_a_word_a_very_long_message_holds_reads_no_fts_snippet_of_it(fresh_store):
    """A log of 300 kB, then 5 MB, holding "kettle" thousands of times: the search box's
    snippet of it shows the word in brackets, and FTS5's snippet() reads only the short
    message (before: the whole log, every place against every other)."""
    thread = fresh_store.create_thread("log")
    fresh_store.add_message(thread, {"role": "user", "content": "a short note about the kettle"})
    for lines in (6_000, 100_000):  # 300 kB (fails fast without the fix), then 5 MB
        fresh_store.add_message(thread, {"role": "assistant", "content": log_lines(lines)})
        for query in ("kettle", "KETT", "kettle boiled"):
            chars, hits = snippet_chars(fresh_store, lambda q=query: fresh_store.search(q))
            assert chars <= 1_000, (lines, query, chars)
            assert len(hits) == (3 if lines == 100_000 else 2) - (query == "kettle boiled")
            for hit in hits:
                assert re.search(r"\[kettle\]", hit["snippet"], re.IGNORECASE), hit["snippet"]
                assert len(hit["snippet"]) <= 200


def test_a_long_messages_snippet_finds_the_word_as_the_index_does(fresh_store):
    """The index folds case and Latin marks and finds a longer word by its start ("café"
    for "CAFE", "Ölwechsel" for "olwech"), a word of two letters whole; so does the long
    message's snippet. A short message keeps FTS5's own snippet."""
    thread = fresh_store.create_thread("t")
    filler = "nothing to see in this line at all. " * 4_000
    fresh_store.add_messages(thread, [
        {"role": "user", "content": filler + "We met at the Café Central, then the Ölwechsel, go on."},
        {"role": "user", "content": "The café was closed."}])
    assert [h["snippet"] for h in fresh_store.search("cafe")] == [
        "The [café] was closed.",
        "… see in this line at all. We met at the [Café] Central, then the Ölwechsel, go on.…"]
    assert "the [Ölwechsel]," in fresh_store.search("OLWECH")[0]["snippet"]
    assert "[go] on" in fresh_store.search("go")[0]["snippet"]


def test_clipping_a_long_message_cuts_only_where_the_words_are():
    """A 5 MB text clipped around two words found in 40 of its sentences runs about as
    many lines of Python as a 50 kB one (before: every word of it, each piece searched for
    each word: about 3 s per MB on two busy cores); a 5 MB log without a full stop, a
    piece of about half the limit at a time, to the last place a word is found."""
    def message(lines: int, stop: str = ".") -> str:
        return "".join(f"line {i}: the kettle boiled over again today, at noon{stop}\n"
                       if i % (lines // 40) == 7 else
                       f"line {i}: nothing here at all, really; carry on with the rest{stop}\n"
                       for i in range(lines))

    short, long, log = message(1_000), message(80_000), message(80_000, stop="")
    assert len(long) > 5_000_000
    small, _ = lines_run(lambda: clip_around(short, ["kettl", "boil"], 600), 100_000)
    big, clipped = lines_run(lambda: clip_around(long, ["kettl", "boil"], 600), 100_000)
    assert big < small + 1_000, (small, big)
    assert clipped.startswith("… line 7: the kettle boiled over again today, at noon. …")
    assert clipped.count("kettle") == 10 and len(clipped) <= 600
    steps, clipped = lines_run(lambda: clip_around(log, ["kettl", "boil"], 600), len(log) // 40)
    assert clipped.count("kettle") >= 2 and len(clipped) < 610  # (HEAD too: "… " and " …" past the limit)


#: what clip_around showed before it was made to cut only where the words are (HEAD's
#: recall.clip_around on these): the same, to the character
TRICKY = [
    ("We moved to Tallinn. " * 3 + "Then the cat, the Cat and the CAT ran! " + "x" * 700
     + " end? The art of starting.", ["cat", "art"], 120,
     "… Then the cat, the Cat and the CAT ran! … The art of starting."),
    ("İstanbul ſtart Kelvin K-scale: the ſtart was great. START again. " * 6, ["start", "kel"], 90,
     "İstanbul ſtart Kelvin K-scale: the ſtart was great. START again. … START again. …"),
    ("no stops here just words " * 40 + "painting paint painted", ["paint"], 60,
     "… painting paint painted"),
    ("a. " * 200 + "b. hello there.", ["hello", "a"], 50, "a. a. a. a. a. a. a. a. a. a. a. a. …"),
    ("first line\n\nsecond\tline   with  spaces. " * 20 + "中文。句子！ 🙂 end", ["line", "中文", "a b", ""], 100,
     "first line second line with spaces. first line second line with spaces. … 中文。句子！ 🙂 end"),
    ("word" * 300 + " tail. Short one with term. " + "y " * 200, ["term", "wordword"], 80,
     "… Short one with term. …"),
]


@pytest.mark.parametrize(("text", "terms", "limit", "shown"), TRICKY)
def test_clipping_shows_what_it_showed_before(text, terms, limit, shown):
    assert clip_around(text, terms, limit) == shown


def test_the_characters_that_fold_oddly_are_all_listed():
    """clip's CASE_ODD: every character whose lower case is not one character, or that
    matches an ASCII letter or digit ignoring case (re) other than by its lower case."""
    from iris_desktop.core.clip import CASE_ODD

    plain = string.ascii_lowercase + string.digits
    one = re.compile(f"[{plain}]", re.IGNORECASE)
    odd = [ch for ch in map(chr, range(0x80, 0x110000))
           if len(ch.lower()) != 1 or ch.lower() in plain or one.fullmatch(ch)]
    assert "".join(odd) == CASE_ODD


class Counted(str):
    """A text that counts the characters split or sliced out of it."""

    read = 0

    def split(self, *args):
        Counted.read += len(self)
        return str.split(self, *args)

    def __getitem__(self, key):
        part = str.__getitem__(self, key)
        Counted.read += len(part)
        return part


def test_a_long_message_shown_after_a_hit_is_read_only_for_its_first_line():
    """A 5 MB reply shown after a hit is read for its first 600 characters (before: split
    and joined whole, 0.25 s for 10 MB, for every block)."""
    from iris_desktop.core.recall import FOLLOWER_CHARS, _Lines
    from iris_desktop.core.records import said_from_row

    text = "We finally moved to Tallinn last week.\n\n  " + "Is it cold there? It is. " * 200_000
    Counted.read = 0
    line = _Lines().line(said_from_row({"id": 1, "role": "assistant", "content": Counted(text)}))
    assert Counted.read < 10 * FOLLOWER_CHARS
    assert line == "- Assistant: " + " ".join(text.split())[:FOLLOWER_CHARS - 1].rstrip() + "…"


def test_whether_a_long_message_only_asks_is_known_at_its_first_statement():
    """A 5 MB message that says something first is not "only asking" at its first
    sentence (before: all of it split into sentences, each looked at)."""
    from iris_desktop.core.recall import _asks_only

    text = "We finally moved to Tallinn last week. " + "Is it cold there? It is. " * 200_000
    steps, asks = lines_run(lambda: _asks_only(text), 1_000)
    assert asks is False
    assert _asks_only("Is it cold? " * 3) and not _asks_only("") and not _asks_only("?? !")
    assert _asks_only("我的猫叫什么名字？你呢？") and not _asks_only("我的猫叫米米。你呢？")


@pytest.mark.parametrize(("text", "term", "held"), [
    ("the art of it", "art", True), ("starting over", "art", False), ("start, art", "art", True),
    ("ſtart", "start", True), ("K-scale", "kel", False), ("KELVIN", "kelv", True),
    ("x" * 50_000 + " painting", "paint", True), ("xpaint " * 1_000, "paint", False),
    ("", "", False), ("a", "", True), ("中文", "中文", True),
])
def test_a_part_of_a_question_is_found_where_its_pattern_matches(text, term, held):
    """recall's ``holds`` answers as the term's pattern does (:func:`_term_pattern`)."""
    from iris_desktop.core.clip import _term_pattern, holds

    assert holds(text, term) is held is bool(_term_pattern(term).search(text))


def test_a_long_messages_snippet_marks_a_word_the_index_finds_otherwise_as_written(fresh_store):
    """"Straße": the index finds it, the folded pattern ("strasse") does not; the snippet
    marks it where it is written. A word found nowhere (the index's own reading of it)
    gives the message's start."""
    thread = fresh_store.create_thread("t")
    fresh_store.add_message(thread, {"role": "user", "content": "x " * 60_000 + "Die Straße ist lang."})
    assert "Die [Straße] ist" in fresh_store.search("straße")[0]["snippet"]
    # (review: with "STRASSE" written first, the folded pattern marked it, a word the index
    # does not find for "straße"; the index keeps ß, and so does the pattern now)
    other = fresh_store.create_thread("u")
    fresh_store.add_message(other, {"role": "user", "content": "y " * 60_000 + "Erst STRASSE, dann die Straße."})
    hit = next(h for h in fresh_store.search("straße") if h["thread_id"] == other)
    assert "die [Straße]" in hit["snippet"] and "[STRASSE]" not in hit["snippet"]
