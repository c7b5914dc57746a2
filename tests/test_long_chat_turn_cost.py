"""A turn in a long chat costs the turn, not the whole chat: after a send the window read
the whole active branch again (every message made an Entry, compared with those on screen
on the GUI thread) and every message's state twice (``describe``): 16,634 message rows for
one turn in a 5,000-message chat, ~150,000 and GUI stalls of 0.4-0.8 s at 50,000. Counted
(rows read), never timed. And what a turn's partial reads show is exactly what reading the
whole branch again shows, after a send, a regenerate, an edit and a branch switch."""

from __future__ import annotations

from dataclasses import replace

import pytest

from support.windows import settle


def _lines(n: int, word: str) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{word} {i}"} for i in range(n)]


def _turn_done(qtbot, window) -> None:
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    settle(qtbot, window)
    qtbot.wait(300)
    settle(qtbot, window)


@pytest.mark.parametrize("messages", [5_000])
def test_a_turn_in_a_long_chat_reads_the_turn_not_the_whole_chat(make_window, qtbot, messages):
    from iris_desktop.core.store import messages as store_messages

    from support.fakes import ScriptedRuntime

    window = make_window(ScriptedRuntime(["Reply."] * 4))
    store = window.host.store
    tid = store.create_thread("long")
    store.add_messages(tid, _lines(messages, "line"))
    window.open_thread(tid)
    qtbot.waitUntil(lambda: window.view.transcript.total >= messages, timeout=60_000)
    settle(qtbot, window)

    read = [0]
    real_query, real_meta = store_messages.Messages._query, store_messages.Messages.meta_range

    def query(self, sql, params):
        rows = real_query(self, sql, params)
        read[0] += len(rows)
        return rows

    def meta_range(self, *a, **k):
        rows = real_meta(self, *a, **k)
        read[0] += len(rows)
        return rows

    store_messages.Messages._query, store_messages.Messages.meta_range = query, meta_range
    try:
        window.send("One more question?")
        _turn_done(qtbot, window)
    finally:
        store_messages.Messages._query, store_messages.Messages.meta_range = real_query, real_meta
    assert window.view.transcript.total == messages + 2
    assert [e.text for e in window.view.transcript.entries()[-2:]] == ["One more question?", "Reply."]
    # before: 16,634 rows (the whole branch, then every state twice); now the turn's and
    # the request's (a few hundred at most, whatever the chat's length)
    assert read[0] < 2_000, f"{read[0]:,} message rows read for one turn in a {messages:,}-message chat"


def _shown_equals_a_full_reload(window) -> None:
    """The transcript's entries (notices aside) and states are what reading the whole
    branch again gives: ``load_transcript`` with the states of a fresh ``describe``."""
    from iris_desktop.core.views import load_transcript, message_states

    store, tid = window.host.store, window.app_state.thread_id
    planner = window.app_state.planner
    states = message_states(planner.engine(store), planner.plan_or_error(store, tid))
    held = window.threads_control.states
    assert {mid: held.get(mid) for mid in states} == states
    expected = [replace(e, state=states.get(e.message_id, e.state)) for e in load_transcript(store, tid)]
    shown = [e for e in window.view.transcript.entries() if e.kind != "notice"]
    assert [e.key for e in shown] == [e.key for e in expected]
    assert shown == expected


def test_after_a_send_regenerate_edit_and_branch_switch_the_transcript_is_a_full_reloads(make_window, qtbot):
    from support.fakes import ScriptedRuntime

    window = make_window(ScriptedRuntime([f"Answer {k}." for k in range(12)]))
    store = window.host.store
    tid = store.create_thread("chat")
    store.add_messages(tid, _lines(40, "line"))
    window.open_thread(tid)
    qtbot.waitUntil(lambda: window.view.transcript.total >= 40, timeout=20_000)
    settle(qtbot, window)
    _shown_equals_a_full_reload(window)

    window.send("First question?")
    _turn_done(qtbot, window)
    _shown_equals_a_full_reload(window)
    note = window.view.transcript.entry(window.view.transcript.add_notice("A note.", error=False)).key
    window.send("Second question?")
    _turn_done(qtbot, window)
    _shown_equals_a_full_reload(window)
    keys = [e.key for e in window.view.transcript.entries()]
    assert keys.count(note) == 1  # the note stays once, where it was: before the new turn
    assert keys.index(note) == len(keys) - 3
    reply = window.view.transcript.entries()[-1]
    assert reply.can_regenerate and reply.text.startswith("Answer")

    window.turns.regenerate(reply.message_id)  # a second alternative of the newest reply
    _turn_done(qtbot, window)
    _shown_equals_a_full_reload(window)
    assert window.view.transcript.entries()[-1].branch == (2, 2)

    window.threads_control.switch_branch(window.view.transcript.entries()[-1].message_id, -1)
    _turn_done(qtbot, window)
    _shown_equals_a_full_reload(window)
    assert window.view.transcript.entries()[-1].message_id == reply.message_id

    window.send("Third question?")  # on the switched-to branch
    _turn_done(qtbot, window)
    _shown_equals_a_full_reload(window)

    user = [e for e in window.view.transcript.entries() if e.role == "user"][-2]
    window.turns.edit(user.message_id, "Second question, edited?")  # a new branch from there
    _turn_done(qtbot, window)
    _shown_equals_a_full_reload(window)
    assert [e for e in window.view.transcript.entries() if e.role == "user"][-1].branch == (2, 2)

    window.send("Fourth question?")
    _turn_done(qtbot, window)
    _shown_equals_a_full_reload(window)


def _small_window_host(tmp_path):
    """A host of a 2,048-token window (long chats drop most of their turns), no model."""
    from iris_desktop.host import Host

    from support.fakes import ScriptedRuntime

    host = Host(tmp_path / "data", {"context.window": "2048", "context.recall_semantic": "false"},
                runtime=ScriptedRuntime([]), compact=False)
    return host, host.planner(host.settings, fallback=True)


def test_a_turns_states_are_describes(tmp_path):
    """The states read as a turn's (only the messages after the older planned head, and
    the request's) are ``describe``'s of every message: as the chat grows, while a reply
    streams and once it ended, after a branch change and a compaction."""
    from iris_desktop.core.turn_delta import states_since
    from iris_desktop.core.views import message_states

    host, planner = _small_window_host(tmp_path)
    try:
        store = host.store
        tid = store.create_thread("chat")
        store.add_messages(tid, _lines(400, "a longer line of words to fill the window"))
        basis, streaming, shapes, before = None, None, [], {}
        for k in range(8):
            request = planner.plan_or_error(store, tid)
            engine = planner.engine(store)
            states, basis = states_since(engine, request, basis)
            expected = message_states(engine, request)
            assert {mid: states.get(mid) for mid in expected} == expected, k
            if states.changed is not None:  # every message whose state changed is said
                moved = {mid for mid, state in expected.items() if before.get(mid, state) != state}
                assert moved <= set(states.changed), k
            assert len(dict(states)) < len(expected) / 3, k  # (held: those read; the rest follow the rule)
            before = expected
            shapes.append(states.changed is not None)
            if k == 1:  # a reply being written (verbatim while it streams), then ended
                streaming = store.add_message(tid, {"role": "assistant", "content": "so"}, status="streaming")
            elif k == 2:
                store.update_streaming(streaming, "so far, so good", status="complete")
            elif k == 4:  # a branch change: the newest reply replaced
                store.set_head(tid, store.parent_of(store.head(tid)))
            elif k == 5:  # a compaction: the first 100 messages summarized
                ids = [r["id"] for r in store.messages(tid)]
                store.add_summary(tid, {
                    "prev_id": None, "first_message_id": ids[0], "covers_through_id": ids[99],
                    "first_turn": 1, "last_turn": 50, "fields": {"summary": "early"}, "text": "x",
                    "tokens": 30, "counter": "heuristic", "path": "extractive"})
            if k != 1:
                store.add_messages(tid, _lines(2, f"turn {k}"))
        # read as a turn's where it can be, every message after a branch change or compaction
        assert shapes == [False, True, True, True, True, False, False, True]
    finally:
        host.close()


def test_a_chats_first_states_read_no_message_rows(tmp_path):
    """Opening a chat asks for every message's state: they were read row by row (6,000
    rows here; a 50,000-message chat's 0.3 s on the DB thread and a garbage collection that
    stalled the window). A state follows from the request's id sets, so the first states
    read none (only the replies still streaming), and are still ``describe``'s."""
    from iris_desktop.core.turn_delta import states_since
    from iris_desktop.core.views import message_states

    host, planner = _small_window_host(tmp_path)
    try:
        store = host.store
        tid = store.create_thread("chat")
        store.add_messages(tid, _lines(6_000, "line"))
        streaming = store.add_message(tid, {"role": "assistant", "content": "so"}, status="streaming")
        request, engine = planner.plan_or_error(store, tid), planner.engine(store)
        read, real = [], store.meta_range

        def meta_range(*args, **kwargs):
            rows = real(*args, **kwargs)
            read.extend(rows)
            return rows

        store.meta_range = meta_range
        states, _ = states_since(engine, request, None)
        assert read == []
        expected = message_states(engine, request)
        assert {mid: states.get(mid) for mid in expected} == expected
        assert states.get(streaming) == "verbatim" and len(dict(states)) == 1
    finally:
        host.close()
