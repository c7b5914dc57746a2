"""A chat the window could not delete is said to be still there, and why, in the words
the CLI uses; a chat deleted meanwhile (by another window or a command) is simply gone.

Before (an audit of two processes): the model thread logged every failure of a delete
("database is locked" while another process held the write lock, a full disk) and
reported the chat deleted; the chat stayed listed, nothing on screen said why, and the
user believed it deleted. A chat deleted meanwhile was logged as an ERROR, with a
traceback, though nothing had gone wrong.
"""

from __future__ import annotations

import logging
import sqlite3

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from PySide6.QtWidgets import QMessageBox  # noqa: E402

from iris_desktop.core import store as store_module  # noqa: E402
from iris_desktop.core.store import Store  # noqa: E402
from iris_desktop.paths import app_paths  # noqa: E402

from support.fakes import ScriptedRuntime  # noqa: E402
from support.windows import settle  # noqa: E402


def seeded(data_dir, *titles: str) -> list[int]:
    with Store(app_paths(data_dir).ensure().db_path) as store:
        made = []
        for title in titles:
            made.append(store.create_thread(title))
            store.add_messages(made[-1], [{"role": "user", "content": "hello"},
                                          {"role": "assistant", "content": "hi"}])
    return made


def failure_boxes(window) -> list[QMessageBox]:
    return [box for box in window.findChildren(QMessageBox, "failure") if box.isVisible()]


def errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_delete_while_another_process_writes_says_so_and_the_chat_stays(
        make_window, qtbot, data_dir, monkeypatch, caplog):
    """Another process holds the write lock past the busy timeout: a box says the chat
    was not deleted and why (the CLI's sentence), and it stays listed and whole. Once the
    lock is free, the same delete works."""
    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_S", 0.5)  # the window waits 0.5 s, not 10
    plans, _ = seeded(data_dir, "Holiday plans", "Shopping")
    window = make_window(ScriptedRuntime([]))
    qtbot.waitUntil(lambda: window.threads.list.count() == 2, timeout=5_000)
    db = app_paths(data_dir).db_path
    holder = sqlite3.connect(db, isolation_level=None)  # another process, writing
    holder.execute("BEGIN IMMEDIATE")
    try:
        window.threads_control.delete_thread(plans)
        qtbot.waitUntil(lambda: bool(failure_boxes(window)), timeout=10_000)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    box = failure_boxes(window)[0]
    assert box.windowTitle() == "Chat not deleted"
    assert box.text() == (f"“Holiday plans” was not deleted. Another Iris process is writing to "
                          f"{db}; close it or wait, then try again.")
    settle(qtbot, window)
    assert window.threads.list.count() == 2
    with Store(db) as store:
        assert store.message_count(plans) == 2
    assert errors(caplog) == []  # said on screen, not as an error with a traceback
    box.close()
    window.threads_control.delete_thread(plans)  # the lock is free: it goes
    qtbot.waitUntil(lambda: window.threads.list.count() == 1, timeout=10_000)
    assert failure_boxes(window) == []


def test_a_chat_deleted_meanwhile_by_a_command_is_simply_gone(make_window, qtbot, data_dir,
                                                               caplog):
    """The delete box was open while the CLI deleted the chat: Delete removes it from the
    list, with no box and no error in the log."""
    plans, _ = seeded(data_dir, "Holiday plans", "Shopping")
    window = make_window(ScriptedRuntime([]))
    qtbot.waitUntil(lambda: window.threads.list.count() == 2, timeout=5_000)
    window.threads_control.poll_timer.stop()  # the window has not looked since
    with Store(app_paths(data_dir).db_path) as command:
        command.delete_thread(plans)
    caplog.set_level(logging.INFO, logger="iris.ui.model")
    window.threads_control.delete_thread(plans)
    qtbot.waitUntil(lambda: window.threads.list.count() == 1, timeout=10_000)
    settle(qtbot, window)
    assert failure_boxes(window) == []
    assert errors(caplog) == []
    assert any("already deleted" in r.getMessage() for r in caplog.records
               if r.levelno == logging.INFO)


def test_a_delete_whose_saved_states_cannot_go_says_what_is_left(make_window, qtbot, data_dir,
                                                                  monkeypatch):
    """The chat left the history, but a file kept for it could not be removed: the box
    says it was deleted and what was not."""
    plans, _ = seeded(data_dir, "Holiday plans", "Shopping")
    window = make_window(ScriptedRuntime([]))
    qtbot.waitUntil(lambda: window.threads.list.count() == 2, timeout=5_000)
    from iris_desktop.runtime.kv_store import KVStateStore

    def refused(folder, thread_id):
        raise PermissionError(13, "Permission denied", f"/kv/{thread_id}-1.kv")

    monkeypatch.setattr(KVStateStore, "forget_in", staticmethod(refused))
    window.threads_control.delete_thread(plans)
    qtbot.waitUntil(lambda: bool(failure_boxes(window)), timeout=10_000)
    box = failure_boxes(window)[0]
    assert box.windowTitle() == "Chat deleted"
    assert box.text() == (f"“Holiday plans” was deleted, but not everything kept for it. "
                          f"/kv/{plans}-1.kv: Permission denied.")
    qtbot.waitUntil(lambda: window.threads.list.count() == 1, timeout=10_000)
