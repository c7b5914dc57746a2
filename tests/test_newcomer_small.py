"""A newcomer's small stumbles (session 60's first-hour audit), each met in a real window or
through the real CLI on a real data folder:

- Preferences said `context.token_budget_ratio` is a "fraction of the context window
  allocated to conversation history": not what else it holds, nor what raising it does;
- the welcome panel introduced the bundled model twice (its card, then its text);
- the context inspector opened 256 pixels wide in a 1400×900 window (no message text in
  its table, its last tab's name cut);
- two chats of one title were two identical rows in the chat list;
- ``config set model.path /missing.gguf`` was saved with a warning, and the next start
  failed to load it.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from datetime import datetime

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402

from iris_desktop.core.store import Store  # noqa: E402
from iris_desktop.paths import app_paths  # noqa: E402
from iris_desktop.runtime.bundled import BUNDLED_MODEL  # noqa: E402
from iris_desktop.settings import SETTINGS  # noqa: E402

from support.gguf_fixtures import tiny_model  # noqa: E402
from support.helpers import one_sentence, run_cli  # noqa: E402
from support.windows import open_preferences, settle, window_on  # noqa: E402

pytestmark = pytest.mark.usefixtures("system_look_after")


def db_path(data_dir):
    return app_paths(data_dir).ensure().db_path


def seed_thread(data_dir, title: str, messages: int, updated: datetime | None = None) -> int:
    """A chat of ``messages`` messages, last written to at ``updated`` (local time)."""
    with Store(db_path(data_dir)) as store:
        thread = store.create_thread(title)
        store.add_messages(thread, [{"role": ("user", "assistant")[i % 2], "content": f"m{i}"}
                                    for i in range(messages)])
    if updated is not None:
        with sqlite3.connect(db_path(data_dir)) as conn:
            conn.execute("UPDATE threads SET updated_at = ? WHERE id = ?", (updated.timestamp(), thread))
    return thread


# -- 1. the budget ratio in plain words -----------------------------------------------------


def test_the_budget_ratio_says_what_it_is_a_share_of_and_what_raising_it_does(make_window, qtbot,
                                                                              capsys, tmp_path):
    window = make_window()
    dialog = open_preferences(window, qtbot)
    field = dialog.fields["context.token_budget_ratio"]
    hint = field.hint.text()
    # what it is a share of, what the share holds, where the rest goes, what raising it does
    for words in ("share of the context window one request may fill", "the system prompt",
                  "the conversation itself", "The rest is kept for the model's reply",
                  "Raising it sends more of a long chat word for word",
                  "leaves less room for the reply"):
        assert words in hint, (words, hint)
    assert field.title.text() == "<b>How much of the window a request may fill</b>"
    # the controls say it to a screen reader, and the CLI's list says the same words
    assert all("The rest is kept for the model's reply" in c.accessibleDescription()
               for c in field.controls)
    code, out, _ = run_cli(capsys, "--data-dir", tmp_path / "cli", "config", "list", "--json")
    row = next(r for r in json.loads(out) if r["key"] == "context.token_budget_ratio")
    assert code == 0 and row["help"] == SETTINGS["context.token_budget_ratio"].help
    assert row["help"] in hint
    dialog.reject()


# -- 2. the bundled model, introduced once -------------------------------------------------


def test_the_welcome_panel_introduces_the_bundled_model_once(make_window, qtbot):
    window = make_window()
    card = window.welcome.recommend
    qtbot.waitUntil(card.isVisible, timeout=20_000)  # this computer read: the card says it
    assert window.welcome_control.showing
    said = card.text.text() + window.welcome.text.text()
    assert said.count(BUNDLED_MODEL.display_name) == 1, said
    assert said.count("The model that came with Iris") == 1, said
    assert card.text.text().startswith(f"The model that came with Iris ({BUNDLED_MODEL.display_name})")
    # the panel still says where the model runs, and that nothing leaves the computer
    assert "runs <b>on this computer</b>. Nothing you type leaves it" in window.welcome.text.text()


# -- 3. the inspector's first width --------------------------------------------------------


def test_the_inspector_opens_wide_enough_once_and_then_keeps_the_users_width(qtbot, data_dir):
    from iris_desktop.ui.main_window import INSPECTOR_SHARE

    thread = seed_thread(data_dir, "a chat", 2)
    window, host = window_on(qtbot, data_dir, (1400, 900))
    try:
        window.open_thread(thread)
        settle(qtbot, window)
        window.inspector.toggleViewAction().trigger()  # View ▸ Context inspector
        qtbot.waitUntil(lambda: window.inspector.report is not None, timeout=5_000)
        qtbot.wait(50)
        dock = window.inspector
        assert dock.width() <= 1400 * INSPECTOR_SHARE + 1  # the conversation keeps the most
        bar = dock.tabs.tabBar()  # every tab's name in view, none behind a scroll button
        assert bar.tabRect(bar.count() - 1).right() <= bar.width(), (dock.width(), bar.width())
        table = dock.request_table  # the message column shows some of each message
        assert table.columnViewportPosition(5) + 100 <= table.viewport().width(), dock.width()
        # the user's narrower width is what the next start brings back
        window.resizeDocks([dock], [300], Qt.Orientation.Horizontal)
        qtbot.wait(50)
        narrow = dock.width()
        assert narrow < 320
    finally:
        window.shutdown()
        host.close()
    window, host = window_on(qtbot, data_dir, (1400, 900))
    try:
        qtbot.waitUntil(window.inspector.isVisible, timeout=5_000)  # open when it was closed
        qtbot.wait(50)
        assert abs(window.inspector.width() - narrow) <= 2, (window.inspector.width(), narrow)
        window.inspector.hide()  # closed and opened again: still the user's
        window.inspector.toggleViewAction().trigger()
        qtbot.waitUntil(window.inspector.isVisible, timeout=5_000)
        qtbot.wait(50)
        assert abs(window.inspector.width() - narrow) <= 2, (window.inspector.width(), narrow)
    finally:
        window.shutdown()
        host.close()


def test_the_inspectors_first_width_fits_a_small_window(make_window, qtbot):
    from iris_desktop.ui.main_window import INSPECTOR_SHARE

    window = make_window()
    window.resize(760, 600)
    qtbot.wait(50)
    window.inspector.toggleViewAction().trigger()
    qtbot.waitUntil(window.inspector.isVisible, timeout=5_000)
    qtbot.waitUntil(lambda: window.inspector.width() <= 760 * INSPECTOR_SHARE + 1, timeout=5_000)
    assert window.welcome.width() >= 200  # the conversation keeps the rest


# -- 4. two chats of one title -------------------------------------------------------------


def test_two_chats_of_one_title_are_told_apart_in_the_list(qtbot, data_dir):
    older = seed_thread(data_dir, "Python help", 2, datetime(2024, 3, 5, 10, 15))
    newer = seed_thread(data_dir, "Python help", 6, datetime(2024, 3, 6, 18, 40))
    alone = seed_thread(data_dir, "Lisbon trip", 2, datetime(2024, 3, 7, 9, 0))
    same_a = seed_thread(data_dir, "Untitled", 1, datetime(2024, 3, 8, 9, 0))
    same_b = seed_thread(data_dir, "Untitled", 1, datetime(2024, 3, 8, 9, 0))
    same_c = seed_thread(data_dir, "Untitled", 3, datetime(2024, 3, 8, 9, 0))
    window, host = window_on(qtbot, data_dir, (1400, 900))
    try:
        chats = window.threads.list
        qtbot.waitUntil(lambda: chats.count() == 6, timeout=5_000)
        from iris_desktop.ui.threads import THREAD_ROLE

        rows = {chats.item(i).data(THREAD_ROLE): chats.item(i).text() for i in range(chats.count())}
        assert rows[alone] == "Lisbon trip"  # a title of its own: one line, as before
        assert rows[older] == "Python help\n   5 Mar 2024 10:15"
        assert rows[newer] == "Python help\n   6 Mar 2024 18:40"
        # the same minute: the messages too; the same messages as well: the chat's number
        assert rows[same_c] == "Untitled\n   8 Mar 2024 09:00, 3 messages"
        assert rows[same_a] == f"Untitled\n   8 Mar 2024 09:00, 1 message, chat #{same_a}"
        assert rows[same_b] == f"Untitled\n   8 Mar 2024 09:00, 1 message, chat #{same_b}"
        assert len(set(rows.values())) == 6
        # renamed apart (Rename…), one line each again
        window.threads_control.rename_thread(newer, "Python help, part 2")
        qtbot.waitUntil(lambda: "Python help" in _texts(chats), timeout=10_000)
        assert "Python help, part 2" in _texts(chats)
    finally:
        window.shutdown()
        host.close()


def _texts(chats) -> list[str]:
    return [chats.item(i).text() for i in range(chats.count())]


def test_today_and_yesterday_are_said_in_words():
    from iris_desktop.ui.threads import told_apart

    now = datetime(2024, 6, 10, 12, 0).timestamp()
    threads = [{"id": 1, "title": "plan", "updated_at": datetime(2024, 6, 10, 8, 5).timestamp(),
                "messages": 4},
               {"id": 2, "title": "plan ", "updated_at": datetime(2024, 6, 9, 22, 30).timestamp(),
                "messages": 4},
               {"id": 3, "title": "plan", "updated_at": datetime(2024, 1, 2, 7, 0).timestamp(),
                "messages": 4}]
    assert told_apart(threads, now) == {1: "today 08:05", 2: "yesterday 22:30", 3: "2 Jan 07:00"}


# -- 6. a model file that is not there -----------------------------------------------------

FIX = "give a GGUF model file's full path, or 'bundled' for the model that came with Iris"


def test_config_set_refuses_a_model_file_that_is_not_there_or_not_a_model(capsys, tmp_path):
    data = tmp_path / "data"
    missing = tmp_path / "missing.gguf"
    code, out, err = run_cli(capsys, "--data-dir", data, "config", "set", "model.path", missing)
    assert (code, out, err) == (2, "", f"iris-desktop: model.path: there is no file {missing}; {FIX}\n")
    assert not (data / "config.toml").exists()  # nothing saved: the next start is unharmed
    notes = tmp_path / "notes.txt"
    notes.write_text("hello, these are my notes\n")
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    for path, what in ((notes, "not a GGUF file (a model file starts with 'GGUF'; this one with 'hell')"),
                       (empty, "not a GGUF file (the file is empty)")):
        code, out, err = run_cli(capsys, "--data-dir", data, "config", "set", "model.path", path)
        assert (code, out, err) == (2, "", f"iris-desktop: model.path: {path}: {what}; {FIX}\n")
    code, out, err = run_cli(capsys, "--data-dir", data, "config", "set", "model.path", tmp_path)
    assert (code, out, err) == (2, "", f"iris-desktop: model.path: {tmp_path} is a folder, not a "
                                       f"GGUF model file; {FIX}\n")
    assert not (data / "config.toml").exists()
    # a relative path keeps its own sentence; a real GGUF is saved, as before
    code, _, err = run_cli(capsys, "--data-dir", data, "config", "set", "model.path", "x.gguf")
    assert code == 2 and one_sentence(err) and "x.gguf is not a full path" in err
    model = tiny_model(tmp_path / "tiny.gguf")
    code, out, err = run_cli(capsys, "--data-dir", data, "config", "set", "model.path", model)
    assert code == 0 and out.startswith(f"model.path = {model}") and err == "", err
    if sys.platform != "win32":  # a named pipe is refused by its kind, never opened (it would wait)
        pipe = tmp_path / "pipe.gguf"
        os.mkfifo(pipe)
        code, out, err = run_cli(capsys, "--data-dir", data, "config", "set", "model.path", pipe)
        assert (code, out) == (2, "") and err == (
            f"iris-desktop: model.path: {pipe} is a named pipe (FIFO), not a GGUF model file; {FIX}\n")
    assert f'path = "{model}"' in (data / "config.toml").read_text()


def test_the_way_back_to_the_bundled_model_still_works(capsys, tmp_path):
    """A settings file an older Iris saved with a missing model: 'bundled' and 'reset' take
    it back to the model that came with Iris."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "config.toml").write_text(f'[model]\npath = "{tmp_path / "gone.gguf"}"\n')
    code, out, err = run_cli(capsys, "--data-dir", data, "config", "set", "model.path", "bundled")
    assert code == 0 and out.startswith("model.path = bundled  (") and err == "", err
    (data / "config.toml").write_text(f'[model]\npath = "{tmp_path / "gone.gguf"}"\n')
    code, out, err = run_cli(capsys, "--data-dir", data, "config", "reset", "model.path")
    assert code == 0 and out.startswith("model.path = bundled  (the default;") and err == "", err
    code, out, _ = run_cli(capsys, "--data-dir", data, "config", "get", "model.path")
    assert (code, out) == (0, "bundled\n")


def test_a_model_path_with_no_file_says_where_it_was_set_and_the_way_back(capsys, tmp_path, monkeypatch):
    """A settings file an older Iris saved with a missing model (or a variable, or --set):
    the start said only "cannot load the model: /missing.gguf: file not found"."""
    data = tmp_path / "data"
    data.mkdir()
    config = data / "config.toml"
    config.write_text('[model]\npath = "/nonexistent/x.gguf"\n')
    code, out, err = run_cli(capsys, "--data-dir", data, "chat", "Hi")
    assert code == 1 and out == "" and one_sentence(err)
    assert err == (f"iris-desktop: cannot load the model: /nonexistent/x.gguf: file not found (model.path "
                   f"in {config}); set model.path to a GGUF file that is there, or back to the model that "
                   "came with Iris ('iris-desktop config set model.path bundled', or Model ▸ Models… in "
                   "the window)\n")
    monkeypatch.setenv("IRIS_MODEL_PATH", "/nonexistent/y.gguf")
    code, out, err = run_cli(capsys, "--data-dir", data, "chat", "Hi")
    assert code == 1 and err == ("iris-desktop: cannot load the model: /nonexistent/y.gguf: file not found "
                                 "(model.path from IRIS_MODEL_PATH); set IRIS_MODEL_PATH to a GGUF file "
                                 "that is there, or unset it\n")
    monkeypatch.delenv("IRIS_MODEL_PATH")
    code, out, err = run_cli(capsys, "--data-dir", data, "--set", "model.path=/nonexistent/z.gguf", "chat", "Hi")
    assert code == 1 and err.endswith("/nonexistent/z.gguf: file not found (model.path from --set or --model); "
                                      "give a GGUF file that is there\n")
    # the way back the sentence names works, and nothing of the history was touched
    assert run_cli(capsys, "--data-dir", data, "config", "set", "model.path", "bundled")[0] == 0
    assert "/nonexistent" not in config.read_text()


def test_chats_dated_with_a_placeholder_are_listed_and_told_apart(make_window, qtbot, data_dir, capsys,
                                                                  tmp_path):
    """A review: an export dated with Go's zero time ("0001-01-01T00:00:00Z"), imported
    twice, emptied the whole chat list (year 0 cannot be shown; the list was cleared
    first). The placeholder no longer dates a chat, and a stored one is left unsaid."""
    from iris_desktop.ui.threads import told_apart

    export = tmp_path / "chat.json"
    export.write_text(json.dumps({"title": "Python help", "messages": [
        {"role": "user", "content": "hi", "created_at": "0001-01-01T00:00:00Z"},
        {"role": "assistant", "content": "hello", "created_at": "0001-01-01T00:00:00Z"}]}))
    for _ in range(2):
        code, _out, err = run_cli(capsys, "--data-dir", data_dir, "import", "--again", export)
        assert code == 0, err
    window = make_window()
    settle(qtbot, window)
    assert window.threads.list.count() == 2
    with Store(app_paths(data_dir).db_path) as store:
        assert all(thread["updated_at"] > 0 for thread in store.threads())
    same = [{"id": n, "title": "Python help", "updated_at": -62135596800.0, "messages": 2} for n in (1, 2)]
    assert told_apart(same) == {1: "2 messages, chat #1", 2: "2 messages, chat #2"}


def test_epoch_zero_without_a_time_zone_is_a_placeholder_in_any_zone(capsys, tmp_path, monkeypatch):
    """A review: "1970-01-01T00:00:00" (no zone) is read as local time, 18,000 s in New
    York, and dated the chat 1970 there (a placeholder everywhere else)."""
    import time

    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        data = tmp_path / "data"
        export = tmp_path / "epoch.json"
        export.write_text(json.dumps({"title": "epoch", "messages": [
            {"role": "user", "content": "hi", "created_at": "1970-01-01T00:00:00"},
            {"role": "assistant", "content": "hello", "created_at": "1970-01-01T00:00:00"}]}))
        assert run_cli(capsys, "--data-dir", data, "import", export)[0] == 0
        with Store(app_paths(data).db_path) as store:
            assert [t["updated_at"] > 365 * 86_400 for t in store.threads()] == [True]
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
