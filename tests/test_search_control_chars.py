"""A search holding control characters (a NUL pasted from a terminal or a binary file)
finds what its words find, and never fails: a NUL ended FTS5's reading of its quoted term
("unterminated string"), and the window said the database could not be used (s67 audit;
that failure's explanation also dropped the process's locks: tests/test_lock_keeping.py)."""

from __future__ import annotations

import random

from iris_desktop.core.store import open_store


def test_a_nul_in_a_search_is_a_space(tmp_path):
    store, _ = open_store(tmp_path / "iris.db")
    try:
        thread = store.create_thread("Holiday")
        store.add_message(thread, {"role": "user", "content": "a fig trip to Spain"})
        hits = store.search("fig\x00 trip")
        assert [h["message_id"] for h in hits if h["message_id"]] == [1]
        assert store.search("\x00") == [] and store.search("\x00\x01\x7f") == []
    finally:
        store.close()


def test_no_query_of_any_characters_fails(tmp_path):
    store, _ = open_store(tmp_path / "iris.db")
    try:
        thread = store.create_thread("notes")
        store.add_message(thread, {"role": "user", "content": "C++ and node.js, naïve café 東京"})
        pick = random.Random(67)
        alphabet = ['"', "'", "*", "^", ":", "(", ")", "-", "+", "\x00", "\x01", "\x1f", "\x7f",
                    "\x85", "\u2028", " ", "a", "é", "東", "NEAR", "AND", "OR", "NOT", "{", "}"]
        for _ in range(3000):
            query = "".join(pick.choice(alphabet) for _ in range(pick.randint(1, 12)))
            store.search(query)  # (raises on failure)
    finally:
        store.close()
