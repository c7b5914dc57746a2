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
