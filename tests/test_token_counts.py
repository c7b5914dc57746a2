"""A stored token count is always the count of the text stored now.

Measured in the real window before the fix: the GUI planned (and so cached counts) while
a reply was still streaming, and nothing dropped the count when the reply ended: 11 of
22 replies were stored as 5 tokens whatever their length, the inspector's system row
absorbed the error, and "Compact chat now" found "only 25 tokens to reclaim". These tests
drive the store, the engine, the real window with the real model, and the real CLI.
"""

from __future__ import annotations

import json

import pytest

from iris_desktop.core.engine import ensure_counts, wire_message
from iris_desktop.core.store import Store, row_to_message
from iris_desktop.tokens import HeuristicCounter

from support.helpers import run_cli as run


def stored_counts(store: Store, counter: str) -> dict[int, int]:
    rows = store.conn.execute("SELECT message_id, tokens FROM token_counts WHERE counter = ?",
                              (counter,)).fetchall()
    return dict(rows)


def fresh_count(store: Store, counter, message_id: int) -> int:
    row = store.messages_by_id([message_id])[message_id]
    return counter.count_message(wire_message(row_to_message(row)))


def test_a_reply_being_written_gets_no_cached_count(fresh_store):
    counter = HeuristicCounter()
    thread = fresh_store.create_thread()
    fresh_store.add_message(thread, {"role": "user", "content": "Tell me a story."})
    reply = fresh_store.add_message(thread, {"role": "assistant", "content": "Once"},
                                    status="streaming")
    metas = fresh_store.meta_range(thread, counter.name)
    counted = ensure_counts(fresh_store, counter, metas)
    assert counted[-1].tokens == fresh_count(fresh_store, counter, reply)  # counted for this read
    assert reply not in stored_counts(fresh_store, counter.name)  # but not cached
    # the store refuses it too, whoever asks
    fresh_store.cache_counts(counter.name, {reply: 1})
    assert reply not in stored_counts(fresh_store, counter.name)
    fresh_store.update_streaming(reply, "Once upon a time " * 30, status="complete")
    metas = fresh_store.meta_range(thread, counter.name)
    assert metas[-1].tokens is None
    ensure_counts(fresh_store, counter, metas)
    assert stored_counts(fresh_store, counter.name)[reply] == fresh_count(fresh_store, counter, reply) > 30


def test_a_count_cached_before_the_text_changed_is_dropped(fresh_store):
    """Whatever wrote the count (an older Iris, another process in a race), a change of
    the text drops it: the next read counts the text as it is."""
    counter = HeuristicCounter()
    thread = fresh_store.create_thread()
    reply = fresh_store.add_message(thread, {"role": "assistant", "content": "Hi"}, status="streaming")
    fresh_store.conn.execute("UPDATE messages SET status = 'complete' WHERE id = ?", (reply,))
    fresh_store.cache_counts(counter.name, {reply: 5})
    assert stored_counts(fresh_store, counter.name) == {reply: 5}
    fresh_store.conn.execute("UPDATE messages SET content = ? WHERE id = ?", ("Hi " * 100, reply))
    assert stored_counts(fresh_store, counter.name) == {}


def test_an_older_database_s_reply_counts_are_counted_again(tmp_path):
    """Counts of replies cached by an Iris before schema 10 may be of partial text."""
    path = tmp_path / "old.db"
    with Store(path) as store:
        thread = store.create_thread()
        user, reply = store.add_messages(thread, [{"role": "user", "content": "hello there"},
                                                  {"role": "assistant", "content": "word " * 60}])
        store.cache_counts("heuristic", {user: 3, reply: 5})
        store.conn.execute("DROP TRIGGER token_counts_not_streaming")
        store.conn.execute("DROP TRIGGER token_counts_text_changed")
        store.conn.execute("DROP TABLE drafts")  # schema 14's
        store.conn.execute("ALTER TABLE compaction_events DROP COLUMN head_id")  # 15's
        store.conn.execute("PRAGMA user_version = 9")
    with Store(path) as store:
        assert stored_counts(store, "heuristic") == {user: 3}


# -- the GUI path and the CLI, with the real model -----------------------------------------


@pytest.fixture
def qt_parts():
    pytest.importorskip("PySide6")
    pytest.importorskip("pytestqt")
    from iris_desktop.host import Host
    from iris_desktop.ui.main_window import main_window

    return Host, main_window


def test_streamed_replies_in_the_window_store_fresh_counts_and_the_cli_agrees(
        qt_parts, qtbot, tmp_path, model_path, capsys):
    """Two real replies streamed in the real window, the meter and the inspector
    refreshing while they stream (as they do for a user): every stored count equals a
    fresh count of the stored text, and the window's numbers equal ``context --json``'s
    for the same thread, message by message."""
    from PySide6.QtCore import Qt

    Host, main_window = qt_parts
    data = tmp_path / "data"
    overrides = {"model.path": str(model_path), "model.max_tokens": "48", "model.temperature": "0",
                 "model.n_ctx": "4096"}
    host = Host(data, overrides)
    window = main_window(host, load=True)
    qtbot.addWidget(window)
    window.show()
    try:
        qtbot.waitUntil(lambda: window.model_state in ("ready", "failed"), timeout=120_000)
        assert window.model_state == "ready", window.models.error
        window.inspector.toggleViewAction().trigger()
        for text in ("Write a short poem about the sea.", "Now one about the mountains."):
            window.composer.edit.setFocus()
            window.composer.set_text(text)
            qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)
            qtbot.waitUntil(lambda: window.generating, timeout=20_000)
            while window.generating:  # the views re-plan while the reply grows
                window.context.refresh()
                qtbot.wait(150)
            qtbot.waitUntil(lambda: window.background.idle, timeout=60_000)
        qtbot.wait(300)
        qtbot.waitUntil(lambda: window.background.idle, timeout=60_000)
        thread = window.thread_id
        counter = window.context.planner.counter
        with Store(host.paths.db_path) as store:
            stored = stored_counts(store, counter.name)
            replies = [r["id"] for r in store.messages(thread) if r["role"] == "assistant"]
            assert len(replies) == 2
            for mid in stored:
                assert stored[mid] == fresh_count(store, counter, mid), mid
            assert all(fresh_count(store, counter, mid) > 5 for mid in replies)
        shown = window.meter.breakdown
        gui_rows = {r["id"]: r["tokens"] for r in window.inspector.report["request"] if r["id"]}
    finally:
        window.shutdown()
        host.close()
    code, out, err = run(capsys, "--data-dir", str(data), *[a for k, v in overrides.items()
                                                             for a in ("--set", f"{k}={v}")],
                         "context", str(thread), "--json")
    assert code == 0, err
    report = json.loads(out)
    assert (report["system_tokens"], report["history_tokens"], report["predicted_prompt_tokens"]) == (
        shown["system"], shown["history"], shown["used"])
    assert {m["id"]: m["tokens"] for m in report["messages"] if m["id"] in gui_rows} == gui_rows
