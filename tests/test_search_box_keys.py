"""The chat list's search box takes the keys its description promises (a newcomer's
audit: Enter, Down and Escape did nothing; the results were reached by Tab alone)."""

from __future__ import annotations

from PySide6.QtCore import Qt

from iris_desktop.core.store import Store
from iris_desktop.paths import app_paths

from support.fakes import ScriptedRuntime


def _window(make_window, qtbot, data_dir):
    with Store(app_paths(data_dir).ensure().db_path) as store:
        for title, said in (("Holiday", "a fig trip to Spain"), ("Work", "the quarterly report")):
            thread = store.create_thread(title)
            store.add_messages(thread, [{"role": "user", "content": said},
                                        {"role": "assistant", "content": "Noted."}])
    window = make_window(ScriptedRuntime([]))
    qtbot.waitUntil(lambda: window.threads.list.count() == 2, timeout=5_000)
    return window


def test_enter_typed_at_once_opens_the_first_result(make_window, qtbot, data_dir):
    window = _window(make_window, qtbot, data_dir)
    chosen = []
    window.threads.threadChosen.connect(lambda tid, mid: chosen.append((tid, mid)))
    box = window.threads.search
    box.setFocus()
    qtbot.keyClicks(box, "quarterly")
    qtbot.keyClick(box, Qt.Key.Key_Return)  # before the 200 ms pause: the results follow
    qtbot.waitUntil(lambda: bool(chosen), timeout=5_000)
    assert chosen[0][0] == 2 and chosen[0][1] is not None  # the message found, in "Work"


def test_down_goes_to_the_results_and_escape_clears(make_window, qtbot, data_dir):
    window = _window(make_window, qtbot, data_dir)
    panel, box = window.threads, window.threads.search
    box.setFocus()
    qtbot.keyClicks(box, "fig")
    qtbot.waitUntil(lambda: panel.list.item(0).text().endswith("a fig trip to Spain"),
                    timeout=5_000)
    qtbot.keyClick(box, Qt.Key.Key_Down)
    assert panel.list.currentItem() is panel.list.item(0)
    box.setFocus()
    qtbot.keyClick(box, Qt.Key.Key_Escape)
    assert box.text() == ""
    qtbot.waitUntil(lambda: panel.list.count() == 2, timeout=5_000)  # every chat again
