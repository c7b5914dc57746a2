"""How far a long import is, said as it goes: in the window's status bar ("Importing
conversations.json: reading, 1,200 of 3,000 chats…", then "storing, …") and on a
terminal's one line; before, a 276 MB export said "Importing conversations.json…" for a
minute with nothing after it. A real export file, a real SQLite file, a real window."""

from __future__ import annotations

import sys

import pytest

from iris_desktop.core import foreign
from iris_desktop.core.store import Store

from support.helpers import chatgpt_export, on_a_terminal, run_cli
from support.holders import encrypt_history


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
    window.app_state.backgroundMessage.connect(lambda text, _ms: shown.append(text))
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


def test_an_import_leaves_a_running_reply_s_state_alone_and_is_not_read_aloud(
        make_window, qtbot, tmp_path, often):
    """Its words of how far it is wait behind a reply's state (they hid "Generating…"
    and its bar for the whole import) and are shown, not spoken four times a second; and
    once it ended they are not shown later (held back, they came back after its report)."""
    path = export(tmp_path, 300)
    window = make_window()
    area = window.status_area
    window.app_state.set_generating(True)  # a reply is being written
    area.show_busy("Generating…")
    hidden: list[bool] = []
    window.app_state.backgroundMessage.connect(lambda *_: hidden.append(area.state.isHidden()))
    window.threads_control.import_file(str(path))
    qtbot.waitUntil(lambda: window.threads.list.count() == 300, timeout=60_000)
    qtbot.waitUntil(lambda: area.current_message().startswith("Imported 300 chats"), timeout=10_000)
    assert len(hidden) > 10 and not any(hidden)
    assert area.state.text() == "Generating…"
    spoken = [t for t, _ in window.announcer.announced if ": reading, " in t or ": storing, " in t]
    assert spoken == []
    assert any(t.startswith("Importing conversations.json") for t, _ in window.announcer.announced)
    window.app_state.set_generating(False)  # the reply ends, then the report's time is up
    area.end_message()
    assert area.current_message() == ""


def test_without_a_reply_an_import_s_progress_is_shown(make_window, qtbot, tmp_path, often):
    path = export(tmp_path, 300)
    window = make_window()
    area = window.status_area
    shown: list[bool] = []
    window.app_state.backgroundMessage.connect(
        lambda text, _ms: shown.append(area.current_message() == text))
    window.threads_control.import_file(str(path))
    qtbot.waitUntil(lambda: window.threads.list.count() == 300, timeout=60_000)
    assert len(shown) > 10 and all(shown)


def test_the_passphrase_prompt_after_a_long_read_starts_its_own_line(tmp_path, capsys, monkeypatch):
    """The "reading" line was left open once the export was read: the passphrase prompt
    (and any warning or error) of the history it goes into began after its stale count."""
    data = tmp_path / "data"
    encrypt_history(capsys, monkeypatch, data, "correct horse battery")
    monkeypatch.delenv("IRIS_STORAGE_PASSPHRASE")
    path = export(tmp_path, 6000)  # reading it takes longer than PROGRESS_S: a "reading" line
    code, seen = on_a_terminal(["--data-dir", data, "import", path],
                               {b"assphrase": "correct horse battery"})
    assert code == 0
    assert b"chats\xe2\x80\xa6Passphrase" not in seen, seen[:400]
    if b"reading, " in seen:  # (a quiet machine reads it within PROGRESS_S: no line then)
        assert b"\r\x1b[KPassphrase" in seen, seen[:400]


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
