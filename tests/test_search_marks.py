"""A search hit shows the found word in bold, not in [brackets] a message's own brackets
could not be told from ("a[i]" beside "[elephant]")."""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402

from iris_desktop.core.store import Store  # noqa: E402
from iris_desktop.paths import app_paths  # noqa: E402
from iris_desktop.ui.search_marks import MARKED_ROLE, marked_line  # noqa: E402

from support.fakes import ScriptedRuntime  # noqa: E402

CODE = "index a[i] then the elephant in b[j]"


def test_a_hit_says_where_its_words_are_apart_from_the_brackets_it_writes(fresh_store):
    thread = fresh_store.create_thread("code")
    fresh_store.add_messages(thread, [{"role": "user", "content": CODE},
                                      {"role": "user", "content": "x" * 120_001 + " elephant[0] here"}])
    hits = {"xxx" in h["text"]: h for h in fresh_store.search("elephant") if h["message_id"]}
    short = hits[False]  # FTS5's snippet
    assert short["text"] == CODE
    assert [short["text"][a:b] for a, b in short["marks"]] == ["elephant"]
    assert short["snippet"] == CODE.replace("elephant", "[elephant]")  # (the plain form, as before)
    long = hits[True]  # a very long message's own snippet
    assert [long["text"][a:b] for a, b in long["marks"]] == ["elephant"]
    assert long["text"].endswith("elephant[0] here…")


def test_a_mark_the_message_writes_is_not_taken_for_one(fresh_store):
    thread = fresh_store.create_thread("odd")
    fresh_store.add_messages(thread, [{"role": "user", "content": "a \x03 stray \x02 mark by the elephant"}])
    hit = next(h for h in fresh_store.search("elephant") if h["message_id"])
    assert [hit["text"][a:b] for a, b in hit["marks"]] == ["elephant"]


def test_marked_line_is_one_line_escaped_and_bold_where_marked():
    plain, rich = marked_line("a <b>\n\n tag & the\u202ecat", [(14, 17), (2, 5)])
    assert plain == "a <b> tag & the\\u202ecat"
    assert rich == "a <b>&lt;b&gt;</b> tag &amp; <b>the</b>\\u202ecat"


def test_the_window_lists_a_hit_with_its_word_in_bold(make_window, qtbot, data_dir):
    with Store(app_paths(data_dir).ensure().db_path) as store:
        thread = store.create_thread("zoo")
        store.add_messages(thread, [{"role": "user", "content": CODE}])
    window = make_window(ScriptedRuntime([]))
    qtbot.keyClick(window, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier)
    qtbot.keyClicks(window.threads.search, "elephant")
    panel = window.threads.list
    qtbot.waitUntil(lambda: panel.count() >= 1 and "elephant" in panel.item(panel.count() - 1).text(),
                    timeout=5_000)
    item = panel.item(panel.count() - 1)
    assert item.text() == f"zoo\n   {CODE}"  # what a screen reader reads: no brackets added
    assert "<b>elephant</b>" in item.data(MARKED_ROLE) and "a[i]" in item.data(MARKED_ROLE)
    bold = panel.viewport().grab(panel.visualItemRect(item)).toImage()
    item.setData(MARKED_ROLE, None)  # the same row drawn as plain text
    qtbot.wait(50)
    plain = panel.viewport().grab(panel.visualItemRect(item)).toImage()
    assert bold != plain  # the delegate drew it, and drew it otherwise than plain text
    assert panel.visualItemRect(item).height() > 2 * panel.fontMetrics().height()  # both lines


def test_hits_of_two_chats_of_one_title_are_told_apart_and_each_title_said_once(make_window, qtbot, data_dir):
    """A newcomer's audit: two chats that began with the same question both listed every
    hit under the same bare title, so no hit could be told to be of which chat (the list
    itself says "today 18:02, 2 messages, chat #3"); now each chat's first hit says the
    list's words, and its further hits go under it without the title again."""
    with Store(app_paths(data_dir).ensure().db_path) as store:
        for _ in range(2):
            thread = store.create_thread("Python tuples")
            store.add_messages(thread, [{"role": "user", "content": "What is a tuple?"},
                                        {"role": "assistant", "content": "A tuple is an immutable list."}])
    window = make_window(ScriptedRuntime([]))
    panel = window.threads.list
    qtbot.waitUntil(lambda: panel.count() == 2, timeout=5_000)
    listed = sorted(panel.item(i).text() for i in range(2))
    assert listed[0] != listed[1] and all("chat #" in text for text in listed)
    window.threads.search.setText("tuple")
    qtbot.waitUntil(lambda: panel.count() == 6, timeout=5_000)
    texts = [panel.item(i).text() for i in range(panel.count())]
    assert texts[0] != texts[1] and all("chat #" in text for text in texts[:2])  # the titles, told apart
    hits = texts[2:]
    heads = [t.split("\n")[0] for t in hits if not t.startswith("   ")]
    assert len(heads) == 2 and heads[0] != heads[1] and all("chat #" in h for h in heads)
    assert [t.startswith("   ") for t in hits] == [False, True, False, True]  # further hits under the first
    spoken = [panel.item(i).data(Qt.ItemDataRole.AccessibleTextRole) for i in range(2, 6)]
    assert all(s.startswith("Python tuples · ") for s in spoken)
