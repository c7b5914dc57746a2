"""The context inspector while another chat's report is made: it showed the chat open
before ("the system prompt and 6 messages, 227 tokens…") for the 20 s a 50,000-message
chat's first count took, with nothing saying it was stale (long-chat audit, session 63).
A real window offscreen, a real SQLite file."""

from __future__ import annotations

from support.windows import settle


def test_switching_chats_says_the_inspector_is_counting_not_the_old_chat_s_numbers(
        make_window, qtbot):
    window = make_window()
    store = window.host.store
    short = store.create_thread("short")
    store.add_messages(short, [{"role": "user" if i % 2 == 0 else "assistant",
                                "content": f"short {i}"} for i in range(6)])
    long = store.create_thread("long")
    store.add_messages(long, [{"role": "user" if i % 2 == 0 else "assistant",
                               "content": f"long message {i}"} for i in range(600)])
    window.inspector.toggleViewAction().trigger()  # View ▸ Context inspector
    window.open_thread(short)
    dock = window.inspector
    qtbot.waitUntil(lambda: dock.report is not None and dock.thread_id == short, timeout=20_000)
    assert dock.request_label.text().startswith("Next request: the system prompt and 6 messages")
    window.open_thread(long)  # its report is made on the DB thread: meanwhile, said so
    assert dock.report is None and dock.thread_id is None
    assert dock.request_label.text() == "Counting this chat's messages for its next request…"
    assert dock.request_table.rowCount() == 0
    qtbot.waitUntil(lambda: dock.report is not None and dock.thread_id == long, timeout=60_000)
    settle(qtbot, window)
    assert dock.request_label.text().startswith("Next request: the system prompt and ")
    shown = [dock.request_table.item(r, 5).toolTip() or dock.request_table.item(r, 5).text()
             for r in range(dock.request_table.rowCount())]
    assert any("long message 599" in text for text in shown)
    window.open_thread(long)  # the same chat again: its report stays while it is made again
    assert dock.report is not None and dock.thread_id == long
