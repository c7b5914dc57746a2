"""A long chat's page read as the user scrolls up (:mod:`iris_desktop.ui.transcript_pages`)
that holds a message damaged on disk: the note naming it is added once, at the chat's end,
and the rows the user is reading stay where they are. Before, the note went through
``add_notice``, which shows the newest page first: reading up to the damaged message sent
the user back to the chat's last message. Real SQLite (a byte of the file flipped), real
widgets offscreen."""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from iris_desktop.core.store import Store  # noqa: E402
from iris_desktop.paths import app_paths  # noqa: E402
from iris_desktop.ui.transcript_model import ENTRY_ROLE  # noqa: E402

from support.faults import flip_message_byte  # noqa: E402
from support.windows import settle  # noqa: E402


def _lines(n: int) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"line number {i} here"}
            for i in range(n)]


@pytest.mark.parametrize("damaged", [False, True])
def test_an_old_page_with_a_damaged_message_keeps_the_place(make_window, qtbot, data_dir, damaged):
    with Store(app_paths(data_dir).ensure().db_path) as store:
        tid = store.create_thread("long")
        ids = store.add_messages(tid, _lines(3_000))
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    if damaged:  # a message of the chat's first page: read only when the user gets there
        flip_message_byte(app_paths(data_dir).db_path, ids[10], at=0, mask=0x80)
    window = make_window()
    window.open_thread(tid)
    view, model = window.view, window.view.transcript
    qtbot.waitUntil(lambda: model.total == 3_000, timeout=60_000)
    settle(qtbot, window)
    assert model.older  # (the chat opened on its newest page)
    bar, rounds = view.verticalScrollBar(), 0
    while model.older:  # up to the top, until every page is read
        bar.setValue(0)
        settle(qtbot, window)
        qtbot.wait(5)
        rounds += 1
        assert rounds < 300
    settle(qtbot, window)
    top = view.indexAt(view.viewport().rect().topLeft()).data(ENTRY_ROLE)
    assert top is not None and top.message_id is not None
    assert top.message_id < ids[1_500], f"the rows moved to message {top.message_id}"
    assert bar.value() < bar.maximum() // 2, (bar.value(), bar.maximum())
    notes = [e for e in model.entries() if e.kind == "notice"]
    if damaged:
        assert len(notes) == 1 and model.entries()[-1] is notes[0]  # once, at the end
        assert "damaged on disk" in notes[0].text
        assert next(e for e in model.entries() if e.message_id == ids[10]).damaged
    else:
        assert notes == []
