"""The search box's odd matches (an audit): a title's accents counted where a message's
were not, a word with symbols the index drops ("C++") searched as a prefix of every
word in c, a query of punctuation only that found nothing, in the store and in the
window."""

from __future__ import annotations

import pytest

from iris_desktop.core.store import Store
from iris_desktop.paths import app_paths
from iris_desktop.ui.search_marks import MARKED_ROLE

from support.windows import settle

#: (a title, and the same text as a message; a query; whether it is found)
SAME_WAY = [
    ("Le café du coin", "cafe", True),
    ("Le café du coin", "CAFÉ", True),
    ("Le café du coin", "café", True),
    ("Le cafe\u0301 du coin", "cafe", True),  # the mark written apart from its letter
    ("Ölwechsel Termin", "olwechsel", True),
    ("naïve plan", "naive", True),
    ("İstanbul trip", "istanbul", True),
    ("Καλημέρα φίλε", "καλημέρα", True),
    ("Καλημέρα φίλε", "καλημερα", False),  # Greek keeps its accents, in the index too
    ("नमस्ते दुनिया", "नमस्ते", True),
    ("नमस्ते दुनिया", "नमसत", False),  # Devanagari's vowel signs are not dropped
    ("สวัสดี ครับ", "สวสด", False),  # nor Thai's
    ("مرحبا بالعالم", "مرحبا", True),
    ("ǖber alles", "uber", False),  # two marks on one letter: the index keeps them
    ("Øresund bridge", "oresund", False),  # ø is a letter of its own
]


def hits(store: Store, query: str, **kw) -> list[dict]:
    return [h for h in store.search(query, **kw) if h["message_id"] is not None]


def test_titles_and_messages_match_a_query_the_same_way_accents_and_all(fresh_store):
    """Before: "cafe" found no chat titled "Le café du coin" ("No match") while "resume"
    found "résumé" in a message: the title was compared with its accents, the message
    text (FTS5, remove_diacritics) without. Now a title is folded as the index folds a
    word: a Latin letter's mark only, nothing of Greek, Devanagari, Thai or Arabic."""
    for text, query, found in SAME_WAY:
        thread = fresh_store.create_thread(text)
        fresh_store.add_messages(thread, [{"role": "user", "content": text}])
        mine = [h for h in fresh_store.search(query) if h["thread_id"] == thread]
        title = any(h["message_id"] is None for h in mine)
        message = any(h["message_id"] is not None for h in mine)
        assert (title, message) == (found, found), (text, query)


def test_a_word_with_symbols_the_index_drops_is_found_as_it_is_written(fresh_store):
    """Before: "C++" was the prefix "c"*: every message with a word in c ("[col]:val").
    Now a word with symbols at its edges (C++, C#, F#, .NET) finds the messages that
    write it so; punctuation inside a word (node.js) still finds "node js" too, after the
    messages that write it as typed; a plain word is a prefix as before."""
    thread = fresh_store.create_thread("notes")
    col, cpp, dotnet, network, node_js, nodejs = fresh_store.add_messages(thread, [
        {"role": "user", "content": "set col:val in the config"},
        {"role": "user", "content": "I write C++ every day"},
        {"role": "user", "content": "C# and F# run on .NET"},
        {"role": "user", "content": "the network is down, see section c"},
        {"role": "user", "content": "node js"},  # short: the index ranks it first
        {"role": "user", "content": "we run node.js on the build server for the web app"},
    ])
    assert [h["message_id"] for h in hits(fresh_store, "C++")] == [cpp]
    assert "[C++]" in hits(fresh_store, "c++")[0]["snippet"]
    for query in ("C#", "F#", ".NET", ".net"):
        found = hits(fresh_store, query)
        assert [h["message_id"] for h in found] == [dotnet], query
        assert f"[{query.upper() if query == '.net' else query}]" in found[0]["snippet"]
    assert {h["message_id"] for h in hits(fresh_store, "net")} == {dotnet, network}
    assert [h["message_id"] for h in hits(fresh_store, "col")] == [col]
    assert [h["message_id"] for h in hits(fresh_store, "node.js")] == [nodejs, node_js]
    assert [h["message_id"] for h in hits(fresh_store, "node js")] == [node_js, nodejs]
    assert [h["message_id"] for h in hits(fresh_store, "C++ every")] == [cpp]
    assert hits(fresh_store, "C++ network") == []



@pytest.mark.parametrize("query", ["spring.", "error:", "#python", "@bob", "python/", "'spring'",
                                   "(spring)", "bob,"])
def test_a_word_with_a_sentences_punctuation_at_its_edge_is_still_found(fresh_store, query):
    """The punctuation around a word in a sentence is dropped, as the index drops it (a
    review: once every word with punctuation at an edge had to be held as written,
    "spring.", "error:", "#python", "@bob" each found nothing where they found a message)."""
    thread = fresh_store.create_thread("t")
    [found] = fresh_store.add_messages(thread, [
        {"role": "user", "content": "bob wrote python in the spring and hit an error there"}])
    assert [h["message_id"] for h in hits(fresh_store, query)] == [found]

@pytest.mark.parametrize("mark", ["-", ":", "(", "*", '"', "^", "->", "?!"])
def test_a_query_of_punctuation_only_finds_the_messages_that_hold_it(fresh_store, mark):
    """Before: "-", ":" or '"' said "No match" while "^" or "(" were found."""
    thread = fresh_store.create_thread("symbols")
    fresh_store.add_messages(thread, [{"role": "user", "content": "nothing here at all"},
                                      {"role": "user", "content": f"a {mark} b"}])
    found = hits(fresh_store, mark)
    assert len(found) == 1 and f"[{mark}]" in found[0]["snippet"]


def test_a_punctuation_search_reads_each_message_once_and_a_symbol_word_only_its_matches(
        fresh_store):
    """The cost, counted: on a 5,000-message chat a query of punctuation only reads each
    message's text at most once (as "^" did before), and "C++" reads only the messages
    the index finds holding the word c, not every one."""
    thread = fresh_store.create_thread("long")
    rows = [{"role": "user", "content": f"note {i}: the weather is fine today"} for i in range(5_000)]
    for i in range(0, 5_000, 500):
        rows[i] = {"role": "user", "content": f"note {i}: I tried C++ and plain c again"}
    fresh_store.add_messages(thread, rows)
    texts = {r["content"] for r in rows}
    read: list[str] = []

    def lower(value):
        if value in texts:
            read.append(value)
        return value.lower() if isinstance(value, str) else value

    fresh_store.conn.create_function("lower", 1, lower, deterministic=True)
    for query in ("^", "-", "—", "C++"):
        read.clear()
        found = hits(fresh_store, query, limit=50)
        if query == "C++":
            assert len(found) == 10 and len(read) <= 10
        else:
            assert found == [] and 0 < len(read) <= 5_000, query


def test_the_window_finds_a_title_without_its_accents_cpp_as_written_and_a_dash(
        make_window, qtbot, data_dir):
    pytest.importorskip("pytestqt")
    with Store(app_paths(data_dir).ensure().db_path) as store:
        thread = store.create_thread("Le café du coin")
        store.add_messages(thread, [{"role": "user", "content": "set col:val in the config"},
                                    {"role": "user", "content": "I write C++ every day"},
                                    {"role": "user", "content": "a - b"}])
    window = make_window()
    box, rows = window.threads.search, window.threads.list

    def shown(query: str) -> list[str]:
        box.clear()
        with qtbot.waitSignal(window.threads.searchChanged, timeout=10_000,
                              check_params_cb=lambda q: q == query):
            qtbot.keyClicks(box, query)
        settle(qtbot, window)
        return [rows.item(i).data(MARKED_ROLE) or rows.item(i).text() for i in range(rows.count())]

    assert shown("cafe") == ["Le café du coin"]
    assert shown("C++") == ["Le café du coin<br>&nbsp;&nbsp;&nbsp;I write <b>C++</b> every day…"]
    assert shown("-") == ["Le café du coin<br>&nbsp;&nbsp;&nbsp;a <b>-</b> b…"]
    assert rows.item(0).text() == "Le café du coin\n   a - b…"  # (read aloud without marks)
