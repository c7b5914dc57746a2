"""The status bar says what the draft's prefill did, also when it gives way: the draft
cleared, another chat opened, a send, a failure. Before (a newcomer audit), a prefill
that gave way said nothing more, and "Prefilling… 1,118 of 1,499 tokens (74%)" stayed in
the status bar over a minute, on an empty chat, until the next send.

The real bundled model prefills; the window is the real one (``make_window``)."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from PySide6.QtCore import QObject, Qt, Slot  # noqa: E402

from iris_desktop.core.events import CacheStatus  # noqa: E402
from iris_desktop.core.store import Store  # noqa: E402
from iris_desktop.paths import app_paths  # noqa: E402

from support.helpers import chat_turns  # noqa: E402
from support.windows import settle  # noqa: E402

#: long enough that the draft's prefill reads many batches before it would end
LONG_CHAT = chat_turns(24, words=40)


def seed(data_dir, messages, title: str) -> int:
    with Store(app_paths(data_dir).ensure().db_path) as store:
        thread = store.create_thread(title)
        store.add_messages(thread, messages)
    return thread


def real_window(make_window, model_path):
    window = make_window(None, overrides={
        "model.path": str(model_path), "model.max_tokens": "4", "model.temperature": "0",
        "model.n_ctx": "8192"})  # the long chat is sent whole: no compaction
    assert window.model_state == "ready", window.models.error
    return window


@pytest.mark.parametrize("how", ["draft cleared", "chat switched", "send"])
def test_a_prefill_that_gives_way_leaves_no_progress_in_the_status_bar(
        make_window, qtbot, model_path, data_dir, how):
    long_chat = seed(data_dir, LONG_CHAT, "long")
    short_chat = seed(data_dir, chat_turns(1, words=5), "short")
    window = real_window(make_window, model_path)
    label = window.state_label
    seen: list[tuple[str, str, bool]] = []  # (state, the status bar after it, a turn ran)

    class Watcher(QObject):  # on the GUI thread, after the window's own slot
        @Slot(object)
        def cache_event(self, event: CacheStatus) -> None:
            seen.append((event.state, label.text(), window.generating))
            if event.state == "prefilling" and [s for s, *_ in seen].count("prefilling") == 1:
                assert label.text().startswith("Prefilling…")
                if how == "draft cleared":
                    window.composer.set_text("")
                elif how == "chat switched":
                    window.open_thread(short_chat)
                else:
                    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)

    watcher = Watcher(window)
    window.model.worker.cacheEvent.connect(watcher.cache_event)
    window.open_thread(long_chat)
    settle(qtbot, window)
    window.composer.edit.setFocus()
    window.composer.set_text("Which city did Rosa move to, and when did she move there?")
    qtbot.waitUntil(lambda: "prefilling" in [s for s, *_ in seen], timeout=120_000)
    # the prefill gave way: what it said last is gone (old: it stayed, and this timed out)
    qtbot.waitUntil(lambda: seen[-1][0] != "prefilling", timeout=120_000)
    if how == "send":  # it gave way to the turn, whose words it never replaced
        state, text, generating = next(s for s in seen if s[0] == "stopped")
        assert generating and text != "Ready" and label.text() != "Ready"
        window.turns.stop()  # (the whole long chat is read otherwise: minutes on 2 cores)
    qtbot.waitUntil(lambda: not window.generating, timeout=120_000)
    settle(qtbot, window)
    states = [s for s, *_ in seen]
    assert "prefilled" not in states and states.count("stopped") == 1, states
    assert not label.text().startswith("Prefilling")
    if how != "send":
        assert label.text() == "Ready"
        assert window.thread_id == (short_chat if how == "chat switched" else long_chat)


def test_a_prefill_that_fails_part_way_says_so_with_a_last_status(tmp_path, model_path,
                                                                   monkeypatch):
    """The host's part, for the CLI and the window: after its progress, a prefill that
    fails (logged: it is an optimisation) or is stopped ends with a "stopped" status, and
    one that ends says what the cache held."""
    from iris_desktop.host import Host
    from iris_desktop.runtime.protocol import Prefill

    host = Host(tmp_path / "data", {"model.path": str(model_path), "model.n_ctx": "4096"})
    host.load_model()
    try:
        thread = host.store.create_thread("long")
        host.store.add_messages(thread, LONG_CHAT)
        request = host.planner().plan(host.store, thread, "And then?")
        real = host.runtime.prefill

        def failing(messages, tools=None, *, cancel=None):  # a disk error after one batch
            work = real(messages, tools, cancel=cancel)

            def run(result):
                with work:
                    yield next(work)
                    raise OSError("the disk went away")

            return Prefill(run)

        monkeypatch.setattr(host.runtime, "prefill", failing)
        failed = [s.state for s in host.prefill(thread, request)]
        assert failed[-2:] == ["prefilling", "stopped"], failed
        monkeypatch.undo()
        newer_draft = threading.Event()  # set once the first batch is said
        states = []
        for status in host.prefill(thread, request, newer_draft):
            states.append(status.state)
            newer_draft.set()
        assert states[-1] == "stopped" and "prefilling" in states and "prefilled" not in states
        assert [s.state for s in host.prefill(thread, request)][-1] == "prefilled"
    finally:
        host.close()
