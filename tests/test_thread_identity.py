"""A chat's id names one chat for good: a deleted chat's id (and its messages' ids) is
never given to another, by this process or another, and where a database holds an id
given again (an older Iris gave them), what compares chats by id tells them apart.

Before (an audit of two processes): ids were SQLite's max(id) + 1, so deleting the newest
chat (the CLI's ``delete``) and making any chat (``chat``, ``import``) gave the new chat
the old id. The window that showed the deleted chat then showed the new one as if it
were the same, its draft for the deleted chat sent there, and the planner's cache, keyed
by the id and a state that said nothing of which chat it was, gave the new chat the
deleted chat's request (its messages went to the model).
"""

from __future__ import annotations

import sqlite3
import threading

import pytest

from iris_desktop.core.config import ContextParams
from iris_desktop.core.planner import Planner
from iris_desktop.core.store import SCHEMA_VERSION, Store
from iris_desktop.paths import app_paths

from support.fakes import HeuristicCounter, ScriptedRuntime
from support.windows import settle

ALICE = [{"role": "user", "content": "secret plans for alice"},
         {"role": "assistant", "content": "ok alice"}]
BOB = [{"role": "user", "content": "bob's shopping list"}, {"role": "assistant", "content": "ok bob"}]


def seeded(store: Store, title: str, messages: list[dict]) -> int:
    thread = store.create_thread(title)
    store.add_messages(thread, messages)
    return thread


def reuse_ids(store: Store, title: str, messages: list[dict]) -> int:
    """A new chat made as an older Iris made it once the newest chat was deleted: its id
    and its messages' ids are the deleted ones' (max(id) + 1, the ids' mark forgotten)."""
    if store.conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'id_marks'").fetchone():
        store.conn.execute("DELETE FROM id_marks")
    made = seeded(store, title, messages)
    # made later than the deleted chat, whatever the clock's resolution (Windows: 15.6 ms)
    store.conn.execute("UPDATE threads SET created_at = created_at + 1 WHERE id = ?", (made,))
    return made


def test_a_deleted_chats_ids_are_never_given_again_by_any_process(tmp_path):
    """Before: the newest chat deleted in one process, the next chat made in another took
    its id, and its first messages the deleted messages' ids. Now both are new."""
    path = tmp_path / "iris.db"
    with Store(path) as window, Store(path) as command:
        older = seeded(window, "older", [{"role": "user", "content": "hello"}])
        newest = seeded(window, "alice", ALICE)
        last_message = window.newest_message_id()
        command.delete_thread(newest)  # the CLI's `delete`
        made = seeded(window, "bob", BOB)  # the window's next chat
        assert made > newest > older
        assert min(m["id"] for m in window.all_messages(made)) > last_message
        command.delete_thread(made)
        again = command.create_thread("carol")  # and the other way round, an empty chat
        assert again > made
    with Store(path) as reopened:  # the mark is in the file, not in a connection
        reopened.delete_thread(again)
        assert reopened.create_thread("dave") > again


def test_an_older_history_migrates_and_its_ids_are_never_given_again(tmp_path):
    """A history written by schema 15 opens with its chats as they were, and from then on
    a deleted chat's id stays its own."""
    from iris_desktop.core import store as store_module

    conn = sqlite3.connect(tmp_path / "old.db")
    for script in store_module.MIGRATIONS[:15]:
        for statement in store_module._split_sql(script):
            conn.execute(statement)
    for number in (1, 2):
        conn.execute("INSERT INTO threads(title, created_at, updated_at) VALUES (?, 0, 0)",
                     (f"chat {number}",))
        conn.execute("INSERT INTO messages(thread_id, turn, role, content, created_at) "
                     "VALUES (?, 1, 'user', 'hello', 0)", (number,))
    conn.execute("PRAGMA user_version = 15")
    conn.commit()
    conn.close()
    with Store(tmp_path / "old.db") as store:
        assert store.schema_version == SCHEMA_VERSION >= 16
        assert [t["title"] for t in store.threads()] == ["chat 2", "chat 1"]
        store.delete_thread(2)
        made = store.create_thread("new")
        assert made == 3
        assert store.add_message(made, {"role": "user", "content": "hi"}) == 3
        assert store.integrity_check() == "ok"


def test_two_processes_making_and_deleting_chats_at_once_never_share_an_id(tmp_path):
    """Each writer reads the next id inside its own INSERT, under the write lock: two at
    once never take the same one, and none fails."""
    path = tmp_path / "iris.db"
    Store(path).close()
    made: list[list[int]] = [[], []]
    errors: list[BaseException] = []

    def writer(number: int) -> None:
        try:
            with Store(path) as store:
                for i in range(30):
                    thread = seeded(store, f"w{number} {i}", [{"role": "user", "content": "x"}])
                    made[number].append(thread)
                    if i % 3 == 0:
                        store.delete_thread(thread)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    workers = [threading.Thread(target=writer, args=(n,)) for n in (0, 1)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert errors == []
    assert len(set(made[0]) | set(made[1])) == 60


def test_the_planner_never_gives_a_new_chat_a_deleted_chats_request(tmp_path):
    """Before: the request planned for the deleted chat was the new chat's, from the
    cache (the meter and the inspector showed alice's messages in bob's chat)."""
    with Store(tmp_path / "iris.db") as store:
        planner = Planner(ContextParams(window=8192), HeuristicCounter())
        alice = seeded(store, "alice", ALICE)
        planned = planner.plan(store, alice)
        store.delete_thread(alice)
        # as long a reply as alice's: before, only the id told the two chats apart
        bob = seeded(store, "bob", [BOB[0], {"role": "assistant", "content": "ok bobby"}])
        request = planner.plan(store, bob)
        assert request is not planned
        assert "secret plans for alice" not in str(request.messages)
        assert "bob's shopping list" in str(request.messages)


def test_a_chat_given_a_deleted_chats_id_is_another_chat_to_the_planner(tmp_path):
    """A history where an older Iris gave an id again: the thread's state says which chat
    it is (when it was made), so a request cached for the deleted one is not the other's."""
    with Store(tmp_path / "iris.db") as store:
        planner = Planner(ContextParams(window=8192), HeuristicCounter())
        alice = seeded(store, "alice", ALICE)
        planner.plan(store, alice)
        state = store.thread_state(alice)
        store.delete_thread(alice)
        # the same head id, status and length: only which chat it is tells them apart
        bob = reuse_ids(store, "bob", [BOB[0], {"role": "assistant", "content": "ok bobby"}])
        assert bob == alice
        assert store.thread_state(bob)[:-1] == state[:-1]
        assert store.thread_state(bob) != state
        request = planner.plan(store, bob)
        assert "secret plans for alice" not in str(request.messages)
        assert "bob's shopping list" in str(request.messages)


# -- the window -----------------------------------------------------------------------------

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")


def window_on(make_window, qtbot, data_dir, draft: str):
    """A window showing alice's chat (the newest), ``draft`` typed for it; it looks at the
    database when the test says."""
    db = app_paths(data_dir).ensure().db_path
    with Store(db) as store:
        seeded(store, "older", [{"role": "user", "content": "hello"}])
        alice = seeded(store, "secret plans for alice", ALICE)
    window = make_window(ScriptedRuntime([]))
    window.threads_control.poll_timer.stop()
    window.open_thread(alice)
    qtbot.waitUntil(lambda: len(window.view.transcript.entries()) == 2, timeout=5_000)
    # the list as the window last read it holds alice's chat (a busy machine read it
    # after the test's poll below: then nothing had changed since)
    qtbot.waitUntil(lambda: alice in window.threads_control._rows, timeout=10_000)
    settle(qtbot, window)
    window.composer.set_text(draft)
    return window, db, alice


def assert_moved_to_a_new_chat(window, qtbot, alice: int, draft: str) -> None:
    window.threads_control.poll()
    qtbot.waitUntil(lambda: window.thread_id is None, timeout=6_000)
    assert window.composer.text() == draft
    assert window.status_area.current_message().startswith(
        "“secret plans for alice” was deleted in another Iris window or by a command")
    assert window.view.transcript.entries() == [] or all(
        "alice" not in (e.text or "") for e in window.view.transcript.entries())


def test_a_window_on_a_deleted_chat_never_takes_the_next_chat_made_for_it(make_window, qtbot,
                                                                          data_dir):
    """Before: the CLI deleted the chat on screen and imported another, which took its id;
    the window showed bob's chat as the same one, said nothing, and kept the draft meant
    for alice to send into bob's chat. Now the new chat has its own id, and the window
    says that alice's chat was deleted and moves the draft to a new chat."""
    draft = "reply meant for alice: the password is hunter2"
    window, db, alice = window_on(make_window, qtbot, data_dir, draft)
    with Store(db) as command:  # `delete`, then `import`
        command.delete_thread(alice)
        bob = seeded(command, "bob", BOB)
    assert bob != alice
    assert_moved_to_a_new_chat(window, qtbot, alice, draft)


def test_a_window_tells_a_chat_given_the_open_chats_id_from_it(make_window, qtbot, data_dir):
    """A history where an older Iris gave the id again: the list's row of the id changed
    when it was made, and the window takes it for the open chat gone, not for it."""
    draft = "reply meant for alice"
    window, db, alice = window_on(make_window, qtbot, data_dir, draft)
    with Store(db) as command:
        command.delete_thread(alice)
        assert reuse_ids(command, "bob", BOB) == alice
    assert_moved_to_a_new_chat(window, qtbot, alice, draft)
    qtbot.waitUntil(lambda: window.threads.list.count() == 2, timeout=5_000)


def test_a_salvage_keeps_the_ids_deleted_chats_had(tmp_path):
    """A review: a salvage copied the chats into a new file whose marks were empty, so the
    newest chat deleted before the damage gave its id to the next chat made. The marks are
    carried over where they can be read."""
    from iris_desktop.core.store import salvage

    db = tmp_path / "iris.db"
    with Store(db) as store:
        kept = seeded(store, "kept", BOB)
        newest = seeded(store, "secret plans for alice", ALICE)
        store.delete_thread(newest)
        store.checkpoint()
    salvage(db, ["a test: the file is taken for damaged"])
    with Store(db) as store:
        assert [t["id"] for t in store.threads()] == [kept]
        assert store.create_thread("after the salvage") > newest


def test_a_reply_whose_writer_died_is_shown_cut_off_not_being_written(make_window, qtbot,
                                                                      data_dir):
    """An audit: a command killed while it wrote a reply in the chat a window showed left
    the reply "being written" in the window for good (a dead writer commits nothing the
    window could notice; only a start marked it). The window's poll marks it cut off."""
    import subprocess
    import sys as _sys

    db = app_paths(data_dir).ensure().db_path
    with Store(db) as store:
        thread = seeded(store, "watched", BOB)
    window = make_window(ScriptedRuntime([]))
    window.open_thread(thread)
    qtbot.waitUntil(lambda: len(window.view.transcript.entries()) == 2, timeout=5_000)
    gone = subprocess.run([_sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    with Store(db) as command:  # its reply, being written by a process that is gone now
        reply = command.add_message(thread, {"role": "assistant", "content": "half a rep"},
                                    status="streaming")
        command.conn.execute("UPDATE streams SET pid = ?, pid_start = NULL WHERE message_id = ?",
                             (int(gone.stdout), reply))
    window.threads_control.poll()
    qtbot.waitUntil(lambda: [e.status for e in window.view.transcript.entries()][-1:] == ["streaming"],
                    timeout=10_000)
    qtbot.waitUntil(lambda: window.view.transcript.entries()[-1].status == "interrupted",
                    timeout=20_000)
    with Store(db) as store:
        assert store.conn.execute("SELECT status FROM messages WHERE id = ?",
                                  (reply,)).fetchone()[0] == "interrupted"
