"""Review of session 65: a message that writes the characters a snippet's marks are made
of (\\x02 … \\x03, control characters an imported or pasted text may hold) no longer
gets words of its own choosing set in bold as found words, nor loses those characters
from the snippet; the word searched for is still the one marked."""

from __future__ import annotations

import pytest

OWN = "\x02fake\x03 said by the elephant"


@pytest.mark.parametrize("query, content, found", [
    ("elephant", OWN, "elephant"),  # FTS5's snippet
    ("elephant", "the elephant and the \x02fake\x03 one", "elephant"),
    ("蛋糕", "蛋糕 \x02假\x03 很好吃", "蛋糕"),  # found as written (no word breaks)
    ("c++", "\x02fake\x03 in C++ code", "C++"),  # a word found where it is written so
])
def test_only_the_found_word_is_marked(fresh_store, query, content, found):
    thread = fresh_store.create_thread("odd")
    fresh_store.add_messages(thread, [{"role": "user", "content": content}])
    hits = [h for h in fresh_store.search(query) if h.get("message_id")]
    assert len(hits) == 1, hits
    hit = hits[0]
    assert [hit["text"][a:b] for a, b in hit["marks"]] == [found], hit
    assert "fake" in hit["text"] or "假" in hit["text"]  # the message's words stay shown
    assert "[fake]" not in hit["snippet"] and "[假]" not in hit["snippet"]


def test_a_long_message_that_writes_them_is_marked_right_too(fresh_store):
    thread = fresh_store.create_thread("odd")
    fresh_store.add_messages(thread, [{"role": "user", "content": "x " * 60_000 + OWN}])
    hit = next(h for h in fresh_store.search("elephant") if h.get("message_id"))
    assert [hit["text"][a:b] for a, b in hit["marks"]] == ["elephant"]
