"""How far a long import is, said as it goes: in the window's status bar ("Importing
conversations.json: reading, 1,200 of 3,000 chats…", then "storing, …") and on a
terminal's one line; before, a 276 MB export said "Importing conversations.json…" for a
minute with nothing after it. A real export file, a real SQLite file, a real window."""

from __future__ import annotations

import sys

import pytest

from iris_desktop.core import foreign
from iris_desktop.core.store import Store

from support.helpers import chatgpt_export, run_cli


def export(tmp_path, chats: int):
    """A ChatGPT-shaped export of ``chats`` short conversations."""
    return chatgpt_export(tmp_path, chats)


@pytest.fixture
def often(monkeypatch):
    """Progress after every chat read, and a transaction of a few chats at most."""
    monkeypatch.setattr(foreign, "PROGRESS_S", 0.0)
    monkeypatch.setattr(foreign, "CHUNK_S", 0.001)


def test_reading_and_storing_say_how_far_they_are(tmp_path, often):
    path = export(tmp_path, 300)
    read: list[tuple[int, int]] = []
    stored: list[tuple[int, int]] = []
    loaded = foreign.load_conversations(path, progress=lambda done, total: read.append((done, total)))
    with Store(tmp_path / "iris.db") as store:
        imported = foreign.import_conversations(
            store, loaded, progress=lambda done, total: stored.append((done, total)))
    assert len(imported.ids) == 300
    assert read == [(n, 300) for n in range(1, 301)]
    assert len(stored) >= 2 and {total for _, total in stored} == {300}
    done = [n for n, _ in stored]
    assert done == sorted(set(done)) and 0 < done[0] and done[-1] < 300  # (the end: its report)


def test_the_window_says_how_far_an_import_is_and_then_what_it_did(make_window, qtbot, tmp_path,
                                                                   often):
    path = export(tmp_path, 200)
    window = make_window()
    shown: list[str] = []
    window.app_state.statusMessage.connect(lambda text, _ms: shown.append(text))
    window.threads_control.import_file(str(path))
    qtbot.waitUntil(lambda: window.threads.list.count() == 200, timeout=60_000)
    qtbot.waitUntil(lambda: shown and shown[-1].startswith("Imported 200 chats"), timeout=10_000)
    reading = [t for t in shown if t.startswith("Importing conversations.json: reading, ")]
    storing = [t for t in shown if t.startswith("Importing conversations.json: storing, ")]
    assert reading and reading[-1].startswith(
        "Importing conversations.json: reading, 200 of 200 chats…"), shown
    assert storing and all(" of 200 chats…" in t for t in storing), shown
    last_progress = max(i for i, t in enumerate(shown) if ": storing, " in t)
    assert all(not t.startswith("Importing") for t in shown[last_progress + 1:]), shown


def test_a_terminal_shows_how_far_an_import_is_on_one_line(tmp_path, capsys, monkeypatch, often):
    path = export(tmp_path, 50)
    monkeypatch.setattr(type(sys.stderr), "isatty", lambda self: True, raising=False)
    code, out, err = run_cli(capsys, "--data-dir", tmp_path / "data", "import", path)
    assert code == 0, err
    assert len(out.split()) == 50
    assert "\r\x1b[Kiris-desktop: reading, 50 of 50 chats…" in err
    assert "\r\x1b[Kiris-desktop: storing, " in err
    last = err.rindex("chats…")
    assert err[last:].startswith("chats…\r\x1b[K")  # the line cleared before the report
    assert "Traceback" not in err


def test_a_pipe_gets_no_progress_line(tmp_path, capsys, often):
    path = export(tmp_path, 20)
    code, _, err = run_cli(capsys, "--data-dir", tmp_path / "data", "import", path)
    assert code == 0, err
    assert "\x1b[K" not in err and "of 20 chats…" not in err
