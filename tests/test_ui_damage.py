"""A message damaged on disk, named in the window (pytest-qt, offscreen), on a real SQLite
file whose bytes are flipped (``tests/support/faults.py``): the card says "damaged on
disk" beside the existing badges (its tooltip and its spoken text say more), and the chat
says once, in a note that needs no click, which message it is, what it means and what can
be done ('iris-desktop recover' only where it lists a copy set aside). Nothing in the file
is changed. Before, the window showed the � and named nothing (only the CLI did)."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
from pathlib import Path

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402

from iris_desktop.core.store import Store  # noqa: E402
from iris_desktop.paths import app_paths  # noqa: E402
from iris_desktop.ui.transcript_model import ENTRY_ROLE  # noqa: E402
from iris_desktop.ui.transcript_parts import badges  # noqa: E402

from conftest import SYNTHETIC_CHAT  # noqa: E402
from support.faults import flip_message_byte  # noqa: E402
from support.helpers import run_cli  # noqa: E402
from support.windows import settle  # noqa: E402

REPLY = "The lighthouse keeper counted forty-two gulls on the north jetty today."
MESSAGES = [
    {"role": "user", "content": "Tell me about the lighthouse on the headland, please."},
    {"role": "assistant", "content": "It was built in 1871 of granite quarried two miles inland."},
    {"role": "user", "content": "And what did the keeper see this morning from the gallery?"},
    {"role": "assistant", "content": REPLY},
    {"role": "user", "content": "Did the fog come in before the evening supply boat arrived?"},
    {"role": "assistant", "content": "It rolled in at six, an hour before the boat tied up."},
]


def stored(db: Path) -> dict[int, bytes]:
    """Every message's stored text as bytes (a damaged text too), by id."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return dict(conn.execute("SELECT id, CAST(content AS BLOB) FROM messages"))


def seed(data_dir: Path, title: str = "lighthouse") -> tuple[int, list[int]]:
    with Store(app_paths(data_dir).ensure().db_path) as store:
        thread = store.create_thread(title)
        ids = store.add_messages(thread, MESSAGES)
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return thread, ids


def notices(window) -> list:
    return [e for e in window.view.transcript.entries() if e.kind == "notice"]


def entry_of(window, message_id: int):
    return next(e for e in window.view.transcript.entries() if e.message_id == message_id)


def index_of(window, message_id: int):
    model = window.view.transcript
    return model.index(model.reveal(f"m:{message_id}"))


def test_a_damaged_message_is_named_on_its_card_and_once_in_a_note(make_window, qtbot, data_dir,
                                                                     tmp_path):
    thread, ids = seed(data_dir)
    damaged_id = ids[3]
    db = app_paths(data_dir).db_path
    flip_message_byte(db, damaged_id, at=REPLY.index("forty"), mask=0x80)  # 'f' → not UTF-8
    before = stored(db)
    assert b"\xe6orty-two" in before[damaged_id]

    window = make_window()
    window.open_thread(thread)
    settle(qtbot, window)

    damaged = entry_of(window, damaged_id)
    assert damaged.text == REPLY.replace("forty", "\ufffdorty")  # shown as it reads
    what = getattr(damaged, "damaged", "")
    assert what.startswith("part of its stored text is damaged (shown as \ufffd). "
                           "The rest of the chat reads normally; Iris has changed nothing in the history."), what
    # no copy was set aside: recover, which lists none, is not offered
    assert "Iris keeps no second copy of a message" in what and "recover" not in what
    assert ("damaged on disk", "error") in badges(damaged)
    assert not any(getattr(e, "damaged", "") or ("damaged on disk", "error") in badges(e)
                   for e in window.view.transcript.entries() if e.message_id != damaged_id)

    index = index_of(window, damaged_id)
    assert index.data(ENTRY_ROLE).message_id == damaged_id
    assert index.data(Qt.ItemDataRole.ToolTipRole) == f"Damaged on disk: {what}"
    spoken = index.data(Qt.ItemDataRole.AccessibleTextRole)
    assert spoken.startswith("Iris (damaged on disk): ") and "\ufffdorty-two" in spoken
    sound = index_of(window, ids[5])
    assert sound.data(Qt.ItemDataRole.ToolTipRole) is None

    [note] = notices(window)  # a note in the chat, not a box to dismiss
    assert note.speaker == "Note" and not note.error
    assert note.text == f"Iris's reply in turn {damaged.turn} is damaged on disk: {what}"
    assert window.view.transcript.entries()[-1] is note  # where the chat opens: its end

    window.threads_control.reload_transcript()  # a reload (after a turn) says it no more
    settle(qtbot, window)
    assert len(notices(window)) == 1
    assert getattr(entry_of(window, damaged_id), "damaged", "") == what  # the badge stays

    window.resize(1000, 720)
    qtbot.wait(50)
    window.grab().save(str(tmp_path / "damaged.png"))  # paints, badge and note, without error
    assert stored(db) == before  # nothing in the file was changed


def test_several_damaged_messages_and_a_copy_set_aside(make_window, qtbot, data_dir, capsys):
    """A long imported chat with two damaged messages, one far above what opens: one note
    names both; with a copy of the history set aside, the note names 'recover' and what
    it holds; another chat opened has no note, and the damaged one opened again is told
    again, once."""
    code, _, err = run_cli(capsys, "--data-dir", data_dir, "import", SYNTHETIC_CHAT)
    assert code == 0, err
    db = app_paths(data_dir).db_path
    with contextlib.closing(sqlite3.connect(db)) as conn:
        thread = conn.execute("SELECT id FROM threads").fetchone()[0]
        unique = [r[0] for r in conn.execute(
            "SELECT id FROM messages m WHERE length(content) > 60 AND "
            "(SELECT count(*) FROM messages o WHERE o.content = m.content) = 1 ORDER BY id")]
    far, near = unique[2], unique[-2]
    for message_id in (far, near):
        flip_message_byte(db, message_id, at=30, mask=0xC0)
    shutil.copyfile(db, db.with_name("iris.db.before-restore-20250101T000000"))
    other, _ = seed(data_dir, "a sound chat")
    before = stored(db)

    window = make_window()
    window.open_thread(thread)
    settle(qtbot, window)
    model = window.view.transcript
    assert model.row_of(f"m:{far}") is None  # far above the rows shown at first
    [note] = notices(window)
    turns = {e.message_id: e.turn for e in model.entries() if e.message_id in (far, near)}
    roles = {e.message_id: e.role for e in model.entries() if e.message_id in (far, near)}
    which = {"user": "your message", "assistant": "Iris's reply"}
    first = which[roles[far]]
    assert note.text.startswith(
        f"2 messages of this chat are damaged on disk (marked on their cards): "
        f"{first} in turn {turns[far]} and {which[roles[near]]} in turn {turns[near]}; "
        "in each, part of its stored text is damaged (shown as \ufffd). "), note.text
    assert note.text.endswith("'iris-desktop recover' lists 1 earlier copy of the history Iris "
                              "set aside, which may hold the text whole.")
    assert ("damaged on disk", "error") in badges(index_of(window, far).data(ENTRY_ROLE))

    window.open_thread(other)
    settle(qtbot, window)
    assert notices(window) == []
    window.open_thread(thread)
    settle(qtbot, window)
    assert len(notices(window)) == 1
    assert stored(db) == before


def test_the_note_stays_one_through_a_turn_and_a_regenerate(make_window, qtbot, data_dir):
    """A turn, then Regenerate (which shows the rows up to the reply again): one note, in
    its place. Before, rows given again with the notes among them got every note above
    the cut twice (an error notice too)."""
    from support.fakes import ScriptedRuntime

    thread, ids = seed(data_dir)
    flip_message_byte(app_paths(data_dir).db_path, ids[3], at=REPLY.index("forty"), mask=0x80)
    window = make_window(ScriptedRuntime(["First answer.", "Second answer."], delay_s=0.05))
    window.open_thread(thread)
    settle(qtbot, window)
    window.send("And the next day?")
    qtbot.waitUntil(lambda: not window.generating, timeout=20_000)
    settle(qtbot, window)
    kinds = [e.kind for e in window.view.transcript.entries()]
    assert kinds == ["message"] * 6 + ["notice"] + ["message"] * 2
    model = window.view.transcript
    reply = model.index(model.row_of(model.entries()[-1].key))
    menu = window.view.context_menu(reply)
    next(a for a in menu.actions() if a.text() == "Regenerate").trigger()
    assert window.generating  # while the new reply is written, too
    assert len(notices(window)) == 1, [e.key for e in window.view.transcript.entries()]
    qtbot.waitUntil(lambda: not window.generating, timeout=20_000)
    settle(qtbot, window)
    shown = window.view.transcript.entries()
    assert [e.kind for e in shown] == kinds, [e.key for e in shown]
    assert shown[-1].text == "Second answer."
