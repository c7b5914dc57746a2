"""A lock let go while the search's worker process runs is free at once.

The agent's search runs in a child forked for it (``core.tools.worker.in_worker``); the
child gets a copy of every open descriptor, a lock another thread holds at that moment
included. Before, :func:`iris_desktop.files.exclusive_lock` released its lock by closing
its descriptor, which left the child's copy holding it until the child ended (up to the
search's time limit + 15 s): the history, settings or GPU records stayed "locked by
another process" for that long after Iris let go of them. Now the lock is released for
every copy. A real fork, a real lock file, a second open of it as the next user."""

from __future__ import annotations

import threading
import time

import pytest

from iris_desktop.core.tools import worker
from iris_desktop.files import Busy, exclusive_lock

pytestmark = pytest.mark.skipif(not worker._IN_WORKER, reason="the search forks on Linux only")


def test_a_lock_let_go_while_the_searchs_child_runs_is_free_at_once(tmp_path):
    lock, started, done = tmp_path / "settings.lock", tmp_path / "started", tmp_path / "done"

    def search() -> str:  # in the child: says it runs, then waits for the test (20 s at most)
        started.touch()
        for _ in range(2000):
            if done.exists():
                break
            time.sleep(0.01)
        return "searched"

    results: list[str] = []
    with exclusive_lock(lock):  # held while the worker forks: its child gets the descriptor
        searching = threading.Thread(target=lambda: results.append(
            worker.in_worker(search, threading.Event())))
        searching.start()
        for _ in range(2000):
            if started.exists():
                break
            time.sleep(0.01)
        assert started.exists()
    try:
        with exclusive_lock(lock):  # the next user, while the child still runs
            taken = True
    except Busy:
        taken = False
    finally:
        done.touch()
        searching.join(30)
    assert results == ["searched"]
    assert taken, "the lock stayed held by the search's child after Iris let go of it"
