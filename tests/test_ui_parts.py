"""The GUI's parts on their own: workers called synchronously, the composer's keys,
menus and shortcuts, import/export, logging, and run_gui end to end."""

from __future__ import annotations

import json
import logging
import threading

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt, QTimer  # noqa: E402
from PySide6.QtGui import QAction, QKeySequence  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from iris_desktop.core.events import ReplyToken, TurnDone, TurnFailed, UserSaved  # noqa: E402
from iris_desktop.core.planner import Planner  # noqa: E402
from iris_desktop.core.turns import Turn  # noqa: E402
from iris_desktop.host import Host  # noqa: E402
from iris_desktop.ui.background import Background  # noqa: E402
from iris_desktop.ui.composer import Composer  # noqa: E402
from iris_desktop.ui.main_window import main_window  # noqa: E402
from iris_desktop.ui.model_thread import LoadJob, ModelWorker, TurnJob  # noqa: E402

from support.fakes import ScriptedRuntime  # noqa: E402


@pytest.fixture
def session(tmp_path):
    """A host on a fresh data dir (the GUI's window and workers run on one)."""
    host = Host(tmp_path / "data")
    yield host
    host.close()


def test_model_worker_runs_a_turn_synchronously(tmp_path):
    """The worker is a plain QObject: called directly, it emits one signal per event."""
    runtime = ScriptedRuntime(["Hi, how can I help?"])
    session = Host(tmp_path / "data", runtime=runtime, compact=False)
    worker = ModelWorker(session)
    events, created, loaded = [], [], []
    worker.turnEvent.connect(events.append)
    worker.threadCreated.connect(created.append)
    worker.loaded.connect(loaded.append)
    worker.load(LoadJob(session.settings))
    assert loaded[0].info["n_ctx"] == 8192 and session.runtime is runtime
    planner = Planner.from_settings(session.settings, runtime)
    worker.run_turn(TurnJob(Turn.send(None, "Hello"), planner))
    assert isinstance(events[0], UserSaved) and isinstance(events[-1], TurnDone)
    assert created and all(e.thread_id == created[0] for e in events)
    tokens = [e.text for e in events if isinstance(e, ReplyToken)]
    assert len(tokens) > 1 and "".join(tokens) == "Hi, how can I help?"
    worker.release()
    assert session.runtime is None
    session.close()


def test_model_worker_without_a_model_reports_instead_of_raising(session):
    worker = ModelWorker(session)
    events = []
    worker.turnEvent.connect(events.append)
    worker.run_turn(TurnJob(Turn.send(None, "Hello"), Planner.from_settings(session.settings)))
    assert [type(e) for e in events] == [TurnFailed, TurnDone]
    assert "no model is loaded" in events[0].text
    worker.release()


def test_background_runs_off_the_gui_thread_and_coalesces(qtbot, session):
    background = Background(session.stores)
    gui = threading.get_ident()
    seen, results = [], []
    background.run(lambda store: seen.append(threading.get_ident()) or store.threads(),
                   results.append)
    for i in range(5):
        background.run(lambda store, i=i: i, results.append, key="meter")
    failures = []
    background.run(lambda store: 1 / 0, results.append, failures.append)
    qtbot.waitUntil(lambda: background.idle, timeout=5_000)
    assert seen and seen[0] != gui
    assert results[0] == [] and results[1:] == [4]  # only the newest "meter" job answered
    assert isinstance(failures[0], ZeroDivisionError)
    background.close()


def test_enter_sends_shift_enter_adds_a_line_esc_stops(qtbot):
    composer = Composer()
    qtbot.addWidget(composer)
    sent, stops = [], []
    composer.sendRequested.connect(sent.append)
    composer.stopRequested.connect(lambda: stops.append(1))
    qtbot.keyClicks(composer.edit, "first line")
    qtbot.keyClick(composer.edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(composer.edit, "second line")
    assert sent == []
    qtbot.keyClick(composer.edit, Qt.Key.Key_Return)
    assert sent == ["first line\nsecond line"]
    composer.set_generating(True)
    assert composer.button.text() == "Stop"
    qtbot.keyClick(composer.edit, Qt.Key.Key_Return)
    assert len(sent) == 1  # no second send while generating
    qtbot.keyClick(composer.edit, Qt.Key.Key_Escape)
    qtbot.mouseClick(composer.button, Qt.MouseButton.LeftButton)
    assert stops == [1, 1]


@pytest.fixture
def window(qtbot, tmp_path):
    host = Host(tmp_path / "data", runtime=ScriptedRuntime([]), compact=False)
    w = main_window(host)
    qtbot.addWidget(w)
    qtbot.waitUntil(lambda: w.model_state == "ready", timeout=10_000)
    yield w
    w.shutdown()
    host.close()


def test_menus_and_shortcuts(window):
    actions = {a.text().replace("&", ""): a for a in window.findChildren(QAction)}
    assert actions["New chat"].shortcut() == QKeySequence("Ctrl+N")
    assert actions["Find…"].shortcut() == QKeySequence("Ctrl+F")
    assert actions["Preferences…"].shortcut() == QKeySequence("Ctrl+,")
    assert actions["Quit"].shortcut() == QKeySequence("Ctrl+Q")
    for name in ("Import conversation…", "Export chat…", "Copy", "Context inspector",
                 "Models…", "Open GGUF…", "Reload", "About Iris Desktop", "Open data folder", "Open log"):
        assert name in actions, name
    menus = [a.text().replace("&", "") for a in window.menuBar().actions()]
    assert menus == ["File", "Edit", "View", "Model", "Help"]


def test_import_then_export_markdown_and_json(window, qtbot, tmp_path):
    source = tmp_path / "chat.json"
    messages = [{"role": "user", "content": "What is a turn?"},
                {"role": "assistant", "content": "A user message and everything after it."}]
    source.write_text(json.dumps({"title": "Imported turns", "messages": messages}))
    window.threads_control.import_file(str(source))
    qtbot.waitUntil(lambda: window.thread_id is not None
                    and len(window.view.transcript.entries()) == 2, timeout=5_000)
    assert window.threads.list.item(0).text() == "Imported turns"
    window.threads_control.export_thread(window.thread_id, str(tmp_path / "out.json"), "json")
    window.threads_control.export_thread(window.thread_id, str(tmp_path / "out.md"), "md")
    qtbot.waitUntil(lambda: window.background.idle, timeout=5_000)
    exported = json.loads((tmp_path / "out.json").read_text())
    times = {key: exported.pop(key) for key in ("created_at", "updated_at")}  # the chat's place
    assert exported == {"title": "Imported turns", "messages": messages}
    assert all(isinstance(when, str) and when for when in times.values())
    assert (tmp_path / "out.md").read_text().startswith("# Imported turns")


def test_a_json_export_of_a_chat_with_branches_says_how_many_messages_it_holds(window, qtbot,
                                                                              tmp_path):
    """An audit: "Exported 2 messages" for a file of 3 (the branch shown was counted)."""
    from iris_desktop.core.store import Store

    with Store(window.host.paths.db_path) as store:
        thread = store.create_thread("Branches")
        first, reply = store.add_messages(thread, [{"role": "user", "content": "Hi"},
                                                   {"role": "assistant", "content": "Hello"}])
        store.add_message(thread, {"role": "assistant", "content": "Hey"}, parent_id=first)
    said: list[str] = []
    window.app_state.statusMessage.connect(lambda text, _ms: said.append(text))
    window.threads_control.export_thread(thread, str(tmp_path / "out.json"), "json")
    qtbot.waitUntil(lambda: any(t.startswith("Exported") for t in said), timeout=5_000)
    assert said[-1].startswith("Exported 3 messages to ")
    assert len(json.loads((tmp_path / "out.json").read_text())["messages"]) == 3


def test_the_window_imports_a_claude_export_as_downloaded_a_zip(window, qtbot, tmp_path):
    """File ▸ Import conversation… on the zip claude.ai sends: its chats in the list,
    the newest opened with its pasted file shown as an attachment."""
    import zipfile

    from conftest import FIXTURES

    archive = tmp_path / "data-2025-06-12.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.write(FIXTURES / "foreign" / "claude" / "conversations.json", "conversations.json")
        zf.writestr("users.json", "[]")
    window.threads_control.import_file(str(archive))
    qtbot.waitUntil(lambda: window.threads.list.count() == 2 and window.thread_id is not None,
                    timeout=10_000)
    titles = {window.threads.list.item(i).text() for i in range(2)}
    assert titles == {"Trip to Lisbon in May", "Weather lookup"}


def test_an_import_runs_beside_the_window_and_leaves_the_chat_the_user_opened(
        window, qtbot, tmp_path, monkeypatch):
    """Before (an audit): a 276 MB export took 50 s with "Ready" in the status bar, no chat
    could be opened meanwhile (its transcript queued behind the import on the DB thread),
    and at the end the window switched to the imported chat away from the one opened."""
    from iris_desktop.core import foreign

    first = tmp_path / "first.json"
    first.write_text(json.dumps({"title": "Opened meanwhile", "messages": [
        {"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there"}]}))
    window.threads_control.import_file(str(first))
    qtbot.waitUntil(lambda: window.thread_id is not None, timeout=5_000)
    opened = window.thread_id
    window.threads_control.new_chat()
    qtbot.waitUntil(lambda: window.thread_id is None, timeout=5_000)
    gate = threading.Event()
    load = foreign.load_conversations
    monkeypatch.setattr(foreign, "load_conversations",
                        lambda path, progress=None: gate.wait(20) and load(path, progress))
    second = tmp_path / "second.json"
    second.write_text(json.dumps({"title": "Imported later", "messages": [
        {"role": "user", "content": "Question"}, {"role": "assistant", "content": "Answer"}]}))
    window.threads_control.import_file(str(second))
    assert window.status_area.current_message().startswith("Importing second.json…")
    window.threads_control.open_thread(opened)  # while the import is held: it opens
    qtbot.waitUntil(lambda: [e.text for e in window.view.transcript.entries()]
                    == ["Hello", "Hi there"], timeout=5_000)
    gate.set()
    qtbot.waitUntil(lambda: window.threads.list.count() == 2, timeout=10_000)
    qtbot.waitUntil(lambda: "They are in the chat list" in window.status_area.current_message(),
                    timeout=5_000)
    assert window.thread_id == opened  # not switched away


def _failure_box(window, qtbot):
    from PySide6.QtWidgets import QMessageBox

    qtbot.waitUntil(lambda: bool(window.findChildren(QMessageBox, "failure")), timeout=5_000)
    box = window.findChildren(QMessageBox, "failure")[-1]
    assert box.textFormat() == Qt.TextFormat.PlainText
    return box


def test_a_full_disk_is_named_when_an_import_or_an_export_fails(window, qtbot, tmp_path):
    """Before: "Import refused — database or disk is full" (SQLite's words, no disk named)
    and "Export failed — [Errno 28] No space left on device" (no file named)."""
    source = tmp_path / "big.json"
    source.write_text(json.dumps({"title": "Too big", "messages": [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " * 400}
        for i in range(200)]}))
    # the database may not grow (SQLite answers as it does on a full disk: SQLITE_FULL)
    importing = window.threads_control.importer.thread_jobs()  # imports have a connection of their own
    importing.run(lambda store: store.conn.execute(
        "PRAGMA max_page_count = " + str(store.conn.execute("PRAGMA page_count").fetchone()[0])))
    window.threads_control.import_file(str(source))
    box = _failure_box(window, qtbot)
    assert box.windowTitle() == "Import failed"
    assert box.text().startswith("Nothing was imported.\n\nThe disk holding ")
    assert str(window.host.paths.db_path) in box.text() and "free some space" in box.text()
    box.setObjectName("seen")
    importing.run(lambda store: store.conn.execute("PRAGMA max_page_count = 1073741823"))
    thread = imported_thread(window, qtbot, tmp_path)
    window.threads_control.export_thread(thread, str(tmp_path / "no-such-folder" / "out.md"), "md")
    box = _failure_box(window, qtbot)
    assert box.windowTitle() == "Export failed"
    assert box.text() == (f"Nothing was exported: {tmp_path / 'no-such-folder' / 'out.md'} could "
                          "not be written (No such file or directory); choose another file.")


def imported_thread(window, qtbot, tmp_path) -> int:
    """A thread made through the window (imported and opened), shown in the list."""
    source = tmp_path / "doomed.json"
    source.write_text(json.dumps({"title": "Doomed chat", "messages": [
        {"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi"}]}))
    window.threads_control.import_file(str(source))
    qtbot.waitUntil(lambda: window.thread_id is not None
                    and window.threads.list.count() == 1, timeout=5_000)
    return window.thread_id


def stored_thread_ids(window) -> list[int]:
    from iris_desktop.core.store import Store

    with Store(window.host.paths.db_path) as store:
        return [t["id"] for t in store.threads()]


def delete_box_button(window, qtbot, thread_id: int, text: str):
    box = window.threads_control.delete_dialog(thread_id, "Doomed chat")
    qtbot.waitUntil(box.isVisible, timeout=5_000)
    assert box is window.threads_control.delete_box and "Doomed chat" in box.text()
    assert "and all its 2 messages?" in box.text()  # what is lost, every branch counted
    assert box.defaultButton().text() == "Cancel"  # Enter keeps the chat
    return next(b for b in box.buttons() if b.text().replace("&", "") == text)


def click_delete_and_wait(window, qtbot, box, thread_id: int) -> None:
    """Click the confirmation's Delete; wait until the chat is gone from the list."""
    deleted = []
    window.model.worker.threadDeleted.connect(deleted.append)
    delete = next(b for b in box.buttons() if b.text().replace("&", "") == "Delete")
    qtbot.mouseClick(delete, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: deleted == [thread_id] and window.threads.list.count() == 0,
                    timeout=5_000)


def test_delete_asks_and_the_delete_button_deletes(window, qtbot, tmp_path):
    thread_id = imported_thread(window, qtbot, tmp_path)
    deleted = []
    window.model.worker.threadDeleted.connect(deleted.append)
    button = delete_box_button(window, qtbot, thread_id, "Delete")
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: deleted == [thread_id] and window.threads.list.count() == 0,
                    timeout=5_000)
    assert not window.threads_control.delete_box.isVisible()
    assert window.thread_id is None and window.view.transcript.entries() == []
    assert stored_thread_ids(window) == []


def test_delete_cancelled_keeps_the_chat(window, qtbot, tmp_path):
    thread_id = imported_thread(window, qtbot, tmp_path)
    deleted = []
    window.model.worker.threadDeleted.connect(deleted.append)
    button = delete_box_button(window, qtbot, thread_id, "Cancel")
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not window.threads_control.delete_box.isVisible(), timeout=5_000)
    qtbot.wait(200)  # a deletion would be on the model thread by now
    qtbot.waitUntil(lambda: window.background.idle, timeout=5_000)
    assert deleted == []
    assert window.threads.list.count() == 1 and window.thread_id == thread_id
    assert stored_thread_ids(window) == [thread_id]


def test_the_delete_key_and_f2_act_on_the_chat_under_the_cursor(window, qtbot, tmp_path):
    thread_id = imported_thread(window, qtbot, tmp_path)
    asked = []
    window.threads.renameRequested.connect(lambda tid, title: asked.append(("rename", tid, title)))
    window.show()
    window.activateWindow()
    window.threads.list.setFocus()
    window.threads.list.setCurrentRow(0)
    qtbot.waitUntil(window.threads.list.hasFocus, timeout=5_000)
    qtbot.keyClick(window.threads.list, Qt.Key.Key_Delete)
    box = window.threads_control.delete_box
    qtbot.waitUntil(lambda: box is not None and box.isVisible(), timeout=5_000)
    assert "Doomed chat" in box.text()
    click_delete_and_wait(window, qtbot, box, thread_id)

    thread_id = imported_thread(window, qtbot, tmp_path)
    window.threads_control.rename_thread = lambda tid, title: asked.append(("renamed", tid, title))
    window.activateWindow()  # the message box had it
    window.threads.list.setFocus()
    window.threads.list.setCurrentRow(0)
    qtbot.waitUntil(window.threads.list.hasFocus, timeout=5_000)
    QTimer.singleShot(200, lambda: QApplication.activeModalWidget()
                      and QApplication.activeModalWidget().reject())
    qtbot.keyClick(window.threads.list, Qt.Key.Key_F2)
    assert asked[0] == ("rename", thread_id, "Doomed chat")


def test_the_file_menu_renames_and_deletes_the_open_chat(window, qtbot, tmp_path):
    """Before: Rename and Delete were only in the chat list's context menu and its F2 and
    Delete keys, which a newcomer never finds. Now File ▸ Rename chat… and Delete chat…
    act on the open chat, and say so when none is open. The rename dialog is the real
    one, typed into and accepted."""
    from PySide6.QtWidgets import QDialogButtonBox, QInputDialog, QLineEdit

    shown = []
    window.app_state.statusMessage.connect(lambda text, _ms: shown.append(text))
    window.menus.actions["delete-chat"].trigger()
    qtbot.waitUntil(lambda: "Open a chat to delete it" in shown, timeout=5_000)
    thread_id = imported_thread(window, qtbot, tmp_path)
    asked = []

    def answer() -> None:  # the modal dialog, as a user meets it
        dialog = QApplication.activeModalWidget()
        if not isinstance(dialog, QInputDialog):
            QTimer.singleShot(50, answer)
            return
        field = dialog.findChild(QLineEdit)
        asked.append((dialog.windowTitle(), field.text()))
        field.selectAll()
        qtbot.keyClicks(field, "Lisbon trip")
        ok = dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok)
        qtbot.mouseClick(ok, Qt.MouseButton.LeftButton)

    QTimer.singleShot(50, answer)
    window.menus.actions["rename-chat"].trigger()
    qtbot.waitUntil(lambda: window.threads.list.count() == 1
                    and window.threads.list.item(0).text().startswith("Lisbon trip"), timeout=5_000)
    assert asked == [("Rename chat", "Doomed chat")]  # the old title, ready to edit
    window.menus.actions["delete-chat"].trigger()
    qtbot.waitUntil(lambda: window.threads_control.delete_box is not None
                    and window.threads_control.delete_box.isVisible(), timeout=5_000)
    box = window.threads_control.delete_box
    assert "“Lisbon trip” and all its 2 messages?" in box.text()
    click_delete_and_wait(window, qtbot, box, thread_id)


def test_setup_logging_writes_a_rotating_file(tmp_path):
    from logging.handlers import RotatingFileHandler

    from iris_desktop.ui.app import setup_logging

    root = logging.getLogger()
    handler = setup_logging(tmp_path / "logs" / "iris.log")
    try:
        assert isinstance(handler, RotatingFileHandler)
        logging.getLogger("iris.test").warning("hello from the test")
        handler.flush()
        assert "hello from the test" in (tmp_path / "logs" / "iris.log").read_text()
    finally:
        root.removeHandler(handler)
        handler.close()


def test_the_app_started_through_the_cli_logs_its_details(tmp_path, monkeypatch):
    """Before (an audit): started as users start it (``iris-desktop``, whose log handler
    the app reuses), the root logger stayed at the CLI's WARNING: iris.log had no start,
    model-load or exit line, only what ``run_gui`` called directly (the tests) wrote."""
    from iris_desktop.cli import _logging
    from iris_desktop.ui.app import setup_logging

    root = logging.getLogger()
    monkeypatch.setattr(root, "level", logging.WARNING)  # as a fresh CLI process has it
    with _logging(str(tmp_path), verbose=False):
        handler = setup_logging(tmp_path / "logs" / "iris.log")
        assert getattr(handler, "_iris", False)  # the CLI's own, not a second one
        logging.getLogger("iris.app").info("Iris Desktop starting (the test)")
        handler.flush()
    assert "INFO iris.app [MainThread] Iris Desktop starting (the test)" in (
        tmp_path / "logs" / "iris.log").read_text()


def test_ctrl_c_in_the_terminal_quits_the_window(tmp_path):
    """Before, SIGINT (Ctrl+C in the terminal `make run` runs in) printed a traceback and
    left the window running; only SIGTERM ended it. It now quits as File ▸ Quit does."""
    import os
    import signal
    import subprocess
    import sys
    import threading

    data = tmp_path / "data"
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "IRIS_MODEL_PATH": str(tmp_path / "none.gguf")}
    app = subprocess.Popen([sys.executable, "-m", "iris_desktop", "-v", "--data-dir", str(data)],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    said: list[str] = []
    shown = threading.Event()

    def read() -> None:  # -v: the log on stderr too
        for line in app.stderr:
            said.append(line)
            if "window shown" in line:
                shown.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert shown.wait(timeout=120), said
        app.send_signal(signal.SIGINT)
        app.wait(timeout=60)
        reader.join(timeout=10)
    finally:
        if app.poll() is None:
            app.kill()
    assert app.returncode == 0, said
    assert not any("Traceback" in line for line in said) and "exited (0)" in said[-1], said


def test_run_gui_starts_loads_and_closes_the_model(qtbot, tmp_path, model_path, monkeypatch):
    from iris_desktop.ui import app as app_module

    windows = []
    real = app_module.main_window

    def spy(host):
        window = real(host)
        windows.append(window)
        return window

    monkeypatch.setattr(app_module, "main_window", spy)
    closed = []

    def quit_when_ready():
        if windows and windows[0].model_state in ("ready", "failed"):
            model = windows[0].host.runtime
            closed.append(model)
            QApplication.instance().quit()
        else:
            QTimer.singleShot(50, quit_when_ready)

    QTimer.singleShot(50, quit_when_ready)
    code = app_module.run_gui(tmp_path / "gui", {"model.path": str(model_path)})
    # the quit leaves every later event loop returning at once (QEventLoop.exec() == -1,
    # so qtbot.wait never waits); one more exec() of the application clears it
    QTimer.singleShot(0, QApplication.instance().quit)
    QApplication.instance().exec()
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "_iris", False)]:
        root.removeHandler(handler)
        handler.close()
    assert code == 0
    assert windows[0].model_state == "ready"
    assert closed[0] is not None and closed[0].closed  # model.close() ran before exit
    assert "Iris Desktop 0.1.0 starting" in (tmp_path / "gui" / "logs" / "iris.log").read_text()


def test_qt_calls_keep_the_references_of_none_and_true(qtbot):
    """PySide6 6.12 loses one reference to None per void call and to True per emit() on
    Python < 3.12, and the interpreter then aborts (PYSIDE-3474); pyproject.toml keeps
    that release off 3.11. This catches it if the constraint is lifted too early."""
    import sys

    from PySide6.QtCore import QObject, Signal

    class Emitter(QObject):
        fired = Signal(bool)

    emitter = Emitter()
    emitter.fired.connect(lambda value: None)
    none_before, true_before = sys.getrefcount(None), sys.getrefcount(True)
    for _ in range(1000):
        emitter.setObjectName("x")  # a C++ method that returns nothing
        emitter.fired.emit(True)
    assert sys.getrefcount(None) >= none_before - 100
    assert sys.getrefcount(True) >= true_before - 100


def test_the_window_opens_the_imported_chat_listed_first(window, qtbot, tmp_path):
    """A newcomer's audit: importing an export opened its first chat, the oldest, listed
    last ("Chat 0" at the bottom of the list); now the one the list shows first."""
    from support.helpers import chatgpt_export

    source = chatgpt_export(tmp_path, 5)  # chat n written at 1.7e9 + n: the last is the newest
    window.threads_control.import_file(str(source))
    qtbot.waitUntil(lambda: window.threads.list.count() == 5 and window.thread_id is not None,
                    timeout=10_000)
    first = window.threads.list.item(0).text()
    assert window.threads.list.currentItem().text() == first
    assert window.host.store.thread(window.thread_id)["title"] == first
