"""A long chat opens on its newest page and reads the pages before it as the user goes
up (:mod:`iris_desktop.core.pages`, :mod:`iris_desktop.ui.transcript_pages`): opening a
50,000-message chat read its whole branch (~1.4 s, GUI stalls of 350-450 ms). Counted
(rows read, and the most one read returned), never timed; and what the pages show, once
all are read, is exactly what reading the whole branch shows: dividers, alternatives,
tool cards whose call is on the page before, states. Real SQLite, real widgets offscreen."""

from __future__ import annotations

from dataclasses import replace

import pytest
from PySide6.QtCore import Qt

from support.windows import settle


def _lines(n: int, word: str) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{word} {i}"} for i in range(n)]


class _Reads:
    """Message rows the store returns while it is on: in all, and the most one read gave."""

    def __init__(self):
        self.rows = self.most = 0

    def __enter__(self):
        from iris_desktop.core.store import messages as store_messages

        self._real = real = store_messages.Messages._query

        def query(store, sql, params):
            rows = real(store, sql, params)
            self.rows += len(rows)
            self.most = max(self.most, len(rows))
            return rows

        store_messages.Messages._query = query
        return self

    def __exit__(self, *exc):
        from iris_desktop.core.store import messages as store_messages

        store_messages.Messages._query = self._real


def _full(window) -> list:
    """What reading the whole branch gives, with the engine's states of a fresh plan."""
    from iris_desktop.core.views import load_transcript, message_states

    store, tid = window.host.store, window.app_state.thread_id
    planner = window.app_state.planner
    states = message_states(planner.engine(store), planner.plan_or_error(store, tid))
    return [replace(e, state=states.get(e.message_id, e.state)) for e in load_transcript(store, tid)]


def _shown(window) -> list:
    return [e for e in window.view.transcript.entries() if e.kind != "notice"]


def _scroll_up_through_all(qtbot, window) -> int:
    """Scroll to the top until every page is read and shown; the pages read."""
    view, model = window.view, window.view.transcript
    pages = 0
    while model.older or model.has_older:
        older = model.older
        view.verticalScrollBar().setValue(0)
        settle(qtbot, window)
        qtbot.wait(5)
        pages += model.older != older
        assert pages < 200
    return pages


def _long_chat(store, tid: int) -> dict:
    """2,105 messages on the branch, with what a page must get right: a summary's divider,
    a regenerated reply (alternatives) far back, a turn of 400 tool calls that a page's
    edge falls in (each result's card shows its call); the ids worth looking at."""
    ids = store.add_messages(tid, _lines(300, "early"))
    store.add_summary(tid, {"prev_id": None, "first_message_id": ids[0], "covers_through_id": ids[99],
                            "first_turn": 1, "last_turn": 50, "fields": {"summary": "early turns"},
                            "text": "x", "tokens": 30, "counter": "heuristic", "path": "extractive"})
    question = store.add_messages(tid, [{"role": "user", "content": "an old question"}])[0]
    store.add_message(tid, {"role": "assistant", "content": "an old answer v1"})
    store.set_head(tid, question)
    store.add_message(tid, {"role": "assistant", "content": "an old answer v2"})
    store.add_messages(tid, [{"role": "user", "content": "look at these files"}])
    for k in range(400):  # one turn longer than a page: some page's edge falls in it
        call = {"id": f"c{k}", "type": "function",
                "function": {"name": "read_file", "arguments": f'{{"path": "f{k}"}}'}}
        store.add_messages(tid, [{"role": "assistant", "content": "", "tool_calls": [call]},
                                 {"role": "tool", "tool_call_id": f"c{k}", "content": f"contents of f{k}"}])
    middle = store.add_messages(tid, _lines(1_000, "middle"))
    store.add_messages(tid, _lines(2, "late"))
    return {"first": ids[0], "question": question, "middle": middle[100]}


def test_opening_a_long_chat_reads_its_newest_page(make_window, qtbot):
    """A 6,000-message chat: the window reads one page (it read every message: 6,000
    rows, in one read), shows the newest message, counts every message in ``total``, and
    the engine's states for it are a fresh plan's (it counts from the store)."""
    from iris_desktop.core.pages import PAGE_MESSAGES

    from support.fakes import ScriptedRuntime

    window = make_window(ScriptedRuntime([]))
    store = window.host.store
    tid = store.create_thread("long")
    store.add_messages(tid, _lines(6_000, "line"))
    with _Reads() as reads:
        window.open_thread(tid)
        qtbot.waitUntil(lambda: window.view.transcript.total == 6_000, timeout=60_000)
        settle(qtbot, window)
        qtbot.wait(300)
        settle(qtbot, window)
    model = window.view.transcript
    assert len(model.entries()) <= PAGE_MESSAGES + 2 and model.older >= 6_000 - PAGE_MESSAGES - 2
    assert model.entries()[-1].text == "line 5999" and model.entries()[-1].can_regenerate
    bar = window.view.verticalScrollBar()
    assert bar.value() == bar.maximum() > 0  # at the newest message
    # before: the 6,000 rows in one read, and the request's (~1,700: the engine counts and
    # prunes what the window can hold, 500 a read); now a page of them and the request's
    assert reads.most <= max(PAGE_MESSAGES + 2, 500), f"one read returned {reads.most:,} rows"
    assert reads.rows < 3_000, f"{reads.rows:,} message rows read opening a 6,000-message chat"
    expected = _full(window)
    held = window.threads_control.states
    assert {e.message_id: held.get(e.message_id) for e in expected if e.message_id} == {
        e.message_id: e.state for e in expected if e.message_id}
    assert _shown(window) == expected[-len(_shown(window)):]


def test_scrolling_up_reads_every_page_and_shows_a_whole_read(make_window, qtbot):
    """Going up page by page (each read on its own, none whole) ends with the entries a
    whole read gives: the divider, both alternatives' places, every tool card with its
    call's name and arguments, the states; the rows in view stay put as a page comes."""
    from iris_desktop.core.pages import PAGE_MESSAGES

    from support.fakes import ScriptedRuntime

    window = make_window(ScriptedRuntime([]))
    store = window.host.store
    tid = store.create_thread("long")
    _long_chat(store, tid)
    window.open_thread(tid)
    qtbot.waitUntil(lambda: window.view.transcript.total >= 2_100, timeout=60_000)
    settle(qtbot, window)
    assert len(window.view.transcript.entries()) < 2 * PAGE_MESSAGES
    with _Reads() as reads:
        pages = _scroll_up_through_all(qtbot, window)
    assert pages >= 3 and reads.most < 2 * PAGE_MESSAGES
    expected = _full(window)
    shown = _shown(window)
    assert [e.key for e in shown] == [e.key for e in expected]
    assert shown == expected
    assert any(e.kind == "divider" for e in shown)
    assert [e.branch for e in shown if e.text.startswith("an old answer")] == [(2, 2)]
    tools = [e for e in shown if e.kind == "tool"]
    assert len(tools) == 400 and all(e.tool_name == "read_file" and '"f' in e.arguments for e in tools)
    assert window.view.transcript.entry(0).key == expected[0].key  # the first row: the first message


@pytest.mark.parametrize("how", ["search", "home"])
def test_a_jump_to_the_oldest_message_reads_back_to_it_a_page_at_a_time(make_window, qtbot, how):
    """A search hit on the first message of a 6,000-message chat (and Home) reads the pages
    back to it, each a read of one page (no read of the whole branch at once), in one job
    handed to the window once (each page was its own job and its own change of the model:
    a 50,000-message chat's jump took 1.2-1.6 s with 3-4 stalls of 100-170 ms), and shows
    it: a row, current, in view."""
    from iris_desktop.core.pages import PAGE_MESSAGES

    from support.fakes import ScriptedRuntime

    window = make_window(ScriptedRuntime([]))
    store = window.host.store
    tid = store.create_thread("long")
    first = store.add_messages(tid, _lines(6_000, "line"))[0]
    view = window.view
    model, prepended = view.transcript, []
    real_prepend = model.prepend
    model.prepend = lambda entries, older: prepended.append(len(entries)) or real_prepend(entries, older)
    with _Reads() as reads:
        if how == "search":
            window.threads_control.open_thread(tid, first)
        else:
            window.open_thread(tid)
            qtbot.waitUntil(lambda: view.transcript.total == 6_000, timeout=60_000)
            settle(qtbot, window)
            view.setFocus()
            qtbot.keyClick(view, Qt.Key.Key_Home)
        qtbot.waitUntil(lambda: view.current_entry() is not None
                        and view.current_entry().message_id == first, timeout=120_000)
        settle(qtbot, window)
    assert view.transcript.older == 0 and len(view.transcript.entries()) == 6_000
    assert len(prepended) == 1 and prepended[0] > 5_000, prepended
    assert view.viewport().rect().intersects(view.visualRect(view.currentIndex()))
    assert reads.most <= max(PAGE_MESSAGES + 2, 500), f"one read returned {reads.most:,} rows"
    assert view.transcript.entries() == _full(window)


def test_editing_an_old_message_read_in_a_page(make_window, qtbot):
    """An old user message reached by scrolling up (it was not in the newest page) is
    edited: the new branch is shown from its newest page, the edit has its two
    alternatives, and going up again gives what a whole read of the new branch gives."""
    from support.fakes import ScriptedRuntime

    window = make_window(ScriptedRuntime(["An edited answer."]))
    store = window.host.store
    tid = store.create_thread("long")
    marks = _long_chat(store, tid)
    window.open_thread(tid)
    qtbot.waitUntil(lambda: window.view.transcript.total >= 2_100, timeout=60_000)
    settle(qtbot, window)
    target = f"m:{marks['middle']}"
    assert target not in window.view.transcript.keys()  # not in the newest page
    _scroll_up_through_all(qtbot, window)
    entry = next(e for e in window.view.transcript.entries() if e.key == target)
    assert entry.role == "user"
    with _Reads() as reads:
        window.turns.edit(entry.message_id, "An edited question?")
        qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
        settle(qtbot, window)
        qtbot.wait(300)
        settle(qtbot, window)
    model = window.view.transcript
    assert [e.text for e in model.entries()[-2:]] == ["An edited question?", "An edited answer."]
    assert model.entries()[-2].branch == (2, 2) and model.older > 0  # a page of the new branch
    # the new branch's newest page, back to where the long tool turn starts (a page's edge
    # falls in it): 903 rows; before, the whole new branch in one read, 1,205
    assert reads.most < 1_000, f"one read returned {reads.most:,} rows"
    _scroll_up_through_all(qtbot, window)
    assert _shown(window) == _full(window)
