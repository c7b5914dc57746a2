"""File ▸ Import… of a file whose chats were imported before: the window asks once whether
to import them again, as new copies. Before, it only said they "were not imported again",
and importing them anyway took the CLI's ``import --again``."""

from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QMessageBox  # noqa: E402

from conftest import FIXTURES  # noqa: E402
from support.windows import settle  # noqa: E402

CLAUDE = FIXTURES / "foreign" / "claude" / "conversations.json"
TITLES = ["Trip to Lisbon in May", "Weather lookup"]  # the export's chats, in its order


def imported(window, qtbot, path, said: list[str]) -> None:
    """Import ``path`` through the window and wait until it says what it did."""
    before = len(said)
    window.threads_control.import_file(str(path))
    qtbot.waitUntil(lambda: any(not t.startswith("Importing") for t in said[before:]),
                    timeout=20_000)
    settle(qtbot, window)


def question(window, qtbot) -> QMessageBox:
    qtbot.waitUntil(lambda: any(b.isVisible() for b in window.findChildren(QMessageBox,
                                                                           "import-again")),
                    timeout=5_000)
    return next(b for b in window.findChildren(QMessageBox, "import-again") if b.isVisible())


def click(qtbot, box: QMessageBox, text: str) -> None:
    qtbot.mouseClick(next(b for b in box.buttons() if b.text().replace("&", "") == text),
                     Qt.MouseButton.LeftButton)


def listed(window) -> list[str]:
    """The titles listed (a chat whose title repeats has a second line: test_newcomer_small.py)."""
    from iris_desktop.ui.threads import TITLE_ROLE

    return sorted(window.threads.list.item(i).data(TITLE_ROLE) for i in range(window.threads.list.count()))


def stored_titles(window) -> list[str]:
    from iris_desktop.core.store import Store

    with Store(window.host.paths.db_path) as store:
        return sorted(t["title"] for t in store.threads())


def asked(window) -> bool:
    return any(b.isVisible() for b in window.findChildren(QMessageBox, "import-again"))


def status(window) -> list[str]:
    said: list[str] = []
    window.app_state.statusMessage.connect(lambda text, _ms: said.append(text))
    return said


def test_import_again_adds_the_chats_imported_before_as_new_copies(make_window, qtbot, tmp_path):
    window = make_window()
    said = status(window)
    export = tmp_path / "conversations.json"
    shutil.copy(CLAUDE, export)
    imported(window, qtbot, export, said)
    assert stored_titles(window) == TITLES and not asked(window)  # nothing skipped: no question
    imported(window, qtbot, export, said)
    assert said[-1] == ("2 chats were imported before (“Trip to Lisbon in May”, “Weather "
                        "lookup”) and were not imported again.")
    box = question(window, qtbot)
    assert box.windowTitle() == "Import again?" and box.textFormat() == Qt.TextFormat.PlainText
    assert box.text() == ("2 chats of conversations.json were imported before (“Trip to Lisbon "
                          "in May”, “Weather lookup”). Import them again as new copies?")
    assert box.defaultButton().text().replace("&", "") == "Keep as is"
    first_ids = set(stored_ids(window))
    export.unlink()  # the file as it was read is imported: it is not read again
    click(qtbot, box, "Import again")
    qtbot.waitUntil(lambda: window.threads.list.count() == 4, timeout=20_000)
    settle(qtbot, window)
    assert stored_titles(window) == sorted(TITLES * 2) == listed(window)
    assert said[-1].startswith("Imported 2 chats from a Claude export.")
    new = set(stored_ids(window)) - first_ids
    assert len(new) == 2 and window.thread_id in new  # the first copy opened
    assert not asked(window)  # asked once
    assert not any("--again" in text for text in said)


def test_keep_as_is_changes_nothing(make_window, qtbot, tmp_path):
    window = make_window()
    said = status(window)
    imported(window, qtbot, CLAUDE, said)
    opened = window.thread_id
    imported(window, qtbot, CLAUDE, said)
    box = question(window, qtbot)
    told = len(said)
    click(qtbot, box, "Keep as is")
    # answered, the box is deleted, and with it what it held for "Import again" (in review:
    # every answered box stayed, holding the whole file's chats, for the rest of the run)
    qtbot.waitUntil(lambda: window.findChildren(QMessageBox, "import-again") == [], timeout=5_000)
    settle(qtbot, window)
    assert stored_titles(window) == TITLES == listed(window)
    assert len(said) == told and window.thread_id == opened


def test_only_the_chats_skipped_are_imported_again(make_window, qtbot, tmp_path):
    """A file of a chat imported before and a new one: the new one is stored at once, and
    "Import again" adds a copy of the other only (not a second copy of the new one)."""
    window = make_window()
    said = status(window)
    first = tmp_path / "first.json"
    first.write_text(json.dumps(json.loads(CLAUDE.read_text())[:1]))  # its first chat alone
    imported(window, qtbot, first, said)
    assert stored_titles(window) == TITLES[:1] and not asked(window)
    imported(window, qtbot, CLAUDE, said)
    assert stored_titles(window) == TITLES
    box = question(window, qtbot)
    assert box.text() == ("1 chat of conversations.json was imported before (“Trip to Lisbon "
                          "in May”). Import it again as a new copy?")
    click(qtbot, box, "Import again")
    qtbot.waitUntil(lambda: window.threads.list.count() == 3, timeout=20_000)
    settle(qtbot, window)
    assert stored_titles(window) == sorted([*TITLES, TITLES[0]]) == listed(window)
    assert said[-1].startswith("Imported 1 chat from a Claude export.")


def stored_ids(window) -> list[int]:
    from iris_desktop.core.store import Store

    with Store(window.host.paths.db_path) as store:
        return [t["id"] for t in store.threads()]


def test_a_file_that_is_not_a_conversation_is_refused_without_a_bug_in_the_log(
        make_window, qtbot, tmp_path, caplog):
    """Before (an audit): the box said why, but iris.log got "ERROR background job
    failed" and a 20-line traceback, as if Iris had a bug."""
    import logging

    notes = tmp_path / "notes.md"
    notes.write_text("# Shopping\n\n- eggs\n")
    window = make_window(None)
    said = status(window)
    caplog.set_level(logging.INFO)
    window.threads_control.import_file(str(notes))
    qtbot.waitUntil(lambda: any(t.startswith("Nothing was imported") for t in said),
                    timeout=20_000)
    settle(qtbot, window)
    failed = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert failed == []
    [refused] = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert "not a conversation file" in refused
