"""An imported chat shows its date in the chat list (the window's and ``iris-desktop
threads``): when it was last written to in the app it came from, its newest message's
time, which is also the time both lists are ordered by. Before, a chat showed no date
at all (the window gave one only to two chats of one title), so 300 chats imported from
ChatGPT read as one undated list, and the CLI listing had no date column.

Real parts: the CLI imports real export files into a real data folder, the window is
the real one (offscreen), the store a real SQLite file."""

from __future__ import annotations

import datetime as dt
import json
import re

from iris_desktop.core.store import Store
from iris_desktop.paths import app_paths

from conftest import FIXTURES
from support.helpers import chatgpt_export, run_cli
from support.windows import settle

LIBRECHAT = FIXTURES / "local-apps" / "librechat" / "librechat-opts-nonr-branches.json"
TEXTGEN = FIXTURES / "local-apps" / "textgen" / "20250105-14-30-12.json"


def newest_times(data_dir) -> dict[int, float]:
    """Each chat's newest message's time, as its source dated it."""
    with Store(app_paths(data_dir).db_path) as store:
        return {t["id"]: max(dt.datetime.fromisoformat(m["sent_at"]).timestamp()
                             for m in store.all_messages(t["id"]) if m["sent_at"])
                for t in store.threads()}


def test_imported_chats_show_their_newest_messages_date_in_the_window_and_the_cli(
        make_window, qtbot, data_dir, capsys, tmp_path):
    from iris_desktop.ui.chat_dates import DATE_ROLE, full_day, list_day
    from iris_desktop.ui.threads import THREAD_ROLE

    for path in (chatgpt_export(tmp_path, 3), LIBRECHAT, TEXTGEN):
        code, _out, err = run_cli(capsys, "--data-dir", data_dir, "import", path)
        assert code == 0, err
    newest = newest_times(data_dir)
    assert len(newest) == 5
    # ordered by that time, newest first, in the CLI and the window alike
    order = sorted(newest, key=lambda t: (newest[t], t), reverse=True)
    code, out, err = run_cli(capsys, "--data-dir", data_dir, "threads", "--no-model")
    assert code == 0, err
    lines = out.splitlines()
    assert [int(line.split()[0]) for line in lines] == order
    for line in lines:
        thread = int(line.split()[0])
        day = dt.datetime.fromtimestamp(newest[thread]).strftime("%Y-%m-%d %H:%M")
        assert re.match(rf"\s*{thread}  {day}  ", line), line  # before: no date at all
    assert len({line.index("≈") for line in lines}) == 1  # the columns line up
    code, out, _ = run_cli(capsys, "--data-dir", data_dir, "threads", "--no-model", "--json")
    assert [row["updated_at"] for row in json.loads(out)] == [newest[t] for t in order]

    window = make_window()
    settle(qtbot, window)
    chats = window.threads.list
    qtbot.waitUntil(lambda: chats.count() == 5, timeout=5_000)
    items = [chats.item(i) for i in range(chats.count())]
    assert [item.data(THREAD_ROLE) for item in items] == order
    for item in items:
        when = newest[item.data(THREAD_ROLE)]
        assert item.data(DATE_ROLE) == list_day(when) != ""
        assert f"Last written to {full_day(when)}" in item.toolTip()
        assert "\n" not in item.text()  # still one line a chat: the date is drawn beside it
    # the row is as tall as its title needs beside the date (a long one wraps, not cut)
    from PySide6.QtWidgets import QStyleOptionViewItem

    option = QStyleOptionViewItem()
    chats.initViewItemOption(option)
    delegate, index = chats.itemDelegate(), chats.indexFromItem(items[0])
    one_line = delegate.sizeHint(option, index).height()
    items[0].setText("a long title " * 12)
    assert delegate.sizeHint(option, index).height() > 2 * one_line

def test_a_chat_written_to_today_shows_its_time_and_older_ones_their_day():
    from iris_desktop.ui.chat_dates import full_day, list_day

    now = dt.datetime(2024, 6, 10, 12, 0).timestamp()
    assert list_day(dt.datetime(2024, 6, 10, 8, 5).timestamp(), now) == "08:05"
    assert list_day(dt.datetime(2024, 6, 9, 22, 30).timestamp(), now) == "yesterday"
    assert list_day(dt.datetime(2024, 1, 2, 7, 0).timestamp(), now) == "2 Jan"
    assert list_day(dt.datetime(2023, 12, 31, 7, 0).timestamp(), now) == "31 Dec 2023"
    assert full_day(dt.datetime(2023, 12, 31, 7, 0).timestamp()) == "31 Dec 2023 07:00"
    for unshowable in (None, 0, -62135596800.0, 1e20):  # none, year 0, past year 9999
        assert list_day(unshowable, now) == "" and full_day(unshowable) == ""


def test_title_hits_follow_the_lists_order_when_chats_share_a_time(tmp_path):
    """Chats imported together share their times (an export's chats dated to the second);
    the list puts the newer chat first, and so do the search's title hits now (before:
    the older first, in the opposite order of the list)."""
    with Store(tmp_path / "a.db") as store:
        ids = [store.create_thread(f"Trip plan {n}") for n in range(3)]
        for thread in ids:
            store.date_thread(thread, 1.7e9, 1.7e9)
        listed = [t["id"] for t in store.threads()]
        assert listed == ids[::-1]
        assert [hit["thread_id"] for hit in store.search("trip plan")
                if hit["message_id"] is None] == listed


def test_two_chats_of_one_title_keep_their_second_line_and_no_second_date(qtbot):
    """Two chats of one title already say when, to the minute, on a second line
    (``told_apart``): the date is not drawn beside their titles again."""
    from iris_desktop.ui.chat_dates import DATE_ROLE
    from iris_desktop.ui.threads import ThreadPanel

    panel = ThreadPanel()
    qtbot.addWidget(panel)
    when = dt.datetime(2024, 3, 5, 10, 15).timestamp()
    panel.show_threads([{"id": n, "title": title, "updated_at": when + n * 60, "messages": 2}
                        for n, title in ((3, "Python help"), (2, "Python help"), (1, "Lisbon"))])
    rows = [panel.list.item(i) for i in range(3)]
    assert [r.text() for r in rows] == ["Python help\n   5 Mar 2024 10:18",
                                        "Python help\n   5 Mar 2024 10:17", "Lisbon"]
    assert [r.data(DATE_ROLE) for r in rows] == [None, None, "5 Mar 2024"]
