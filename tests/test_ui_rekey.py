"""File ▸ Change history passphrase…: the encrypted history's key changed from the window
(before, only ``iris-desktop rekey`` could, and not while the window was open). A real
SQLCipher file under a real data folder, the real app (``run_gui``) driven from its own
event loop through the dialogs a user sees, a real second process holding the history,
and an in-memory keyring plugged into the ``keyring`` package (this machine has none)."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("sqlcipher3")
pytest.importorskip("PySide6")

from PySide6.QtCore import Qt, QTimer  # noqa: E402
from PySide6.QtWidgets import (  # noqa: E402
    QApplication,
    QDialogButtonBox,
    QMessageBox,
    QRadioButton,
    QWidget,
)

from iris_desktop.core.store.cipher import is_encrypted  # noqa: E402

from support.fakes import ScriptedRuntime  # noqa: E402
from support.helpers import chatgpt_export  # noqa: E402
from support.helpers import run_cli as run  # noqa: E402
from support.holders import encrypt_history, hold_encrypted
from support.network import memory_keyring  # noqa: E402
from support.windows import settle  # noqa: E402

OLD = "correct horse battery staple 4711"
NEW = "a new passphrase for the laptop 2026"
PHRASE = "quince-harbour-5520"
TITLES = ("garden", "planted", "trip")

pytestmark = pytest.mark.usefixtures("no_keyring")


@pytest.fixture
def data(tmp_path, capsys) -> tuple[Path, dict[str, int]]:
    """A plain history of three chats, one holding PHRASE: (data folder, {title: id})."""
    folder = tmp_path / "data"
    threads = {}
    for title in TITLES:
        chat = tmp_path / f"{title}.jsonl"
        chat.write_text(json.dumps({"role": "user", "content": f"About the {title}: {PHRASE}."})
                        + "\n" + json.dumps({"role": "assistant", "content": "Noted."}) + "\n")
        code, out, err = run(capsys, "--data-dir", folder, "import", chat, "--title", title)
        assert code == 0, err
        threads[title] = int(out.strip())
    return folder, threads


def encrypt(capsys, monkeypatch, folder: Path, passphrase: str | None = OLD) -> None:
    """Encrypted as a user does (storage.encrypt on for one start), then the setting and
    the passphrase gone from the environment: the app asks for it."""
    encrypt_history(capsys, monkeypatch, folder, passphrase)
    monkeypatch.delenv("IRIS_STORAGE_PASSPHRASE", raising=False)


def opens_with(capsys, monkeypatch, folder: Path, passphrase: str | None) -> tuple[int, str]:
    """(exit code, what `export` printed or said) with ``passphrase`` in the environment."""
    if passphrase is None:
        monkeypatch.delenv("IRIS_STORAGE_PASSPHRASE", raising=False)
    else:
        monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", passphrase)
    code, out, err = run(capsys, "--data-dir", folder, "export", "1")
    monkeypatch.delenv("IRIS_STORAGE_PASSPHRASE", raising=False)
    return code, out + err


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- the real app, driven from its event loop ----------------------------------------------


class Script:
    """Steps run in order from Qt's event loops (the app's, and the dialogs' nested ones):
    each is called every 20 ms until it returns true. A step that raises ends the script
    (its error is kept); so does the safety net, which then closes every dialog and window
    until the app returns (a test never hangs on a box nobody answers)."""

    def __init__(self, *steps):
        self.steps = list(steps)
        self.done: list[str] = []
        self.error: BaseException | None = None
        self.over = False
        self.deadline = time.monotonic() + 300  # a safety net only, never an assertion
        QTimer.singleShot(0, self.tick)

    def tick(self) -> None:
        if self.over:
            return
        if self.error is None and self.steps and time.monotonic() < self.deadline:
            try:
                if self.steps[0]():
                    self.done.append(self.steps.pop(0).__name__)
            except BaseException as exc:  # noqa: BLE001 (kept, said by the test)
                self.error = exc
        elif self.error is not None or self.steps:
            self.bail()
        QTimer.singleShot(20, self.tick)

    @staticmethod
    def bail() -> None:
        modal = QApplication.activeModalWidget()
        if modal is not None:
            modal.close() if modal.objectName() == "rekey-progress" else modal.reject()
        for widget in QApplication.topLevelWidgets():
            if widget.objectName() == "iris-main" and widget.isVisible():
                widget.quit_now()


def run_app(monkeypatch, folder: Path, *steps) -> tuple[int, list, Script]:
    """``run_gui`` on ``folder`` with ``steps`` (each given the windows made so far):
    (its exit code, the windows it opened, the script)."""
    from iris_desktop.ui import app as app_module
    from iris_desktop.ui.main_window import main_window

    windows: list = []

    def make(host):  # the app's window, without loading a model (not what is tested)
        window = main_window(host, load=False)
        windows.append(window)
        return window

    monkeypatch.setattr(app_module, "main_window", make)
    monkeypatch.setattr(app_module, "setup_logging", lambda path: None)
    script = Script(*[lambda step=step: step(windows) for step in steps])
    for built, step in zip(script.steps, steps):
        built.__name__ = step.__name__
    try:
        code = app_module.run_gui(folder)
    finally:
        script.over = True
    assert script.error is None, f"after {script.done}: {script.error!r}"
    assert not script.steps, f"stuck after {script.done}"
    return code, windows, script


def asked_at_start(seen: list[str], passphrase: str = OLD):
    """The step that answers the start's passphrase dialog (each one shown is counted in
    ``seen``, its problem text)."""
    from iris_desktop.ui.passphrase_dialog import PassphraseDialog

    def passphrase_asked(windows) -> bool:
        dialog = QApplication.activeModalWidget()
        if not isinstance(dialog, PassphraseDialog):
            return False
        seen.append(dialog.problem.text())
        dialog.passphrase.setText(passphrase)
        dialog.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
        return True

    return passphrase_asked


def change_key_through_the_dialog(threads: dict[str, int], current: str | None,
                                  new: str | None):
    """Steps: the window ready (its chats listed) with the "planted" chat open, File ▸
    Change history passphrase…, then the dialog filled in (``new`` None: the keyring) and
    its button clicked."""

    def window_ready(windows) -> bool:
        if len(windows) != 1 or windows[0].threads.list.count() != len(threads):
            return False
        windows[0].open_thread(threads["planted"])
        return True

    def chat_open_then_menu(windows) -> bool:
        window = windows[0]
        if window.thread_id != threads["planted"] or not window.background.idle:
            return False
        action = window.menus.actions["change-key"]
        assert action.isEnabled() and action.text() == "Change history &passphrase…"
        action.trigger()
        return True

    def dialog_filled(windows) -> bool:
        dialog = windows[0].key_change.dialog
        if dialog is None or not dialog.isVisible():
            return False
        assert "closes the window and the chat history" in dialog.intro.text()
        if current is not None:
            dialog.current.setText(current)
        if new is None:
            dialog.findChild(QRadioButton, "to-keyring").setChecked(True)
        else:
            dialog.new.setText(new)
            dialog.again.setText(new)
        assert dialog.ok.isEnabled()
        dialog.ok.click()
        return True

    return [window_ready, chat_open_then_menu, dialog_filled]


def reopened(threads: dict[str, int], said: list[str], asked: list[str]):
    """The step that waits for the second window (its chats listed, the chat that was
    open open again), keeps its status message, and quits; a passphrase dialog shown
    meanwhile is kept in ``asked`` and cancelled."""
    from iris_desktop.ui.passphrase_dialog import PassphraseDialog

    def second_window(windows) -> bool:
        dialog = QApplication.activeModalWidget()
        if isinstance(dialog, PassphraseDialog):
            asked.append(dialog.problem.text())
            dialog.reject()
            return False
        if len(windows) != 2 or windows[1].threads.list.count() != len(threads):
            return False
        if windows[1].thread_id != threads["planted"] or not windows[1].background.idle:
            return False
        said.append(windows[1].status_area.current_message())
        windows[1].menus.actions["quit"].trigger()
        return True

    return second_window


def test_the_window_changes_the_passphrase_and_opens_again_with_the_new_one(
        capsys, monkeypatch, data):
    folder, threads = data
    encrypt(capsys, monkeypatch, folder)
    seen: list[str] = []
    later: list[str] = []
    said: list[str] = []
    code, windows, _ = run_app(monkeypatch, folder, asked_at_start(seen),
                               *change_key_through_the_dialog(threads, OLD, NEW),
                               reopened(threads, said, later))
    assert code == 0 and len(windows) == 2
    assert seen == [""] and later == []  # asked once, at the start: not after the change
    assert said and "key was changed" in said[0] and "new passphrase" in said[0], said
    assert is_encrypted(folder / "iris.db") is True
    code, out = opens_with(capsys, monkeypatch, folder, OLD)
    assert code != 0 and "does not open" in out  # the old passphrase opens it no more
    code, out = opens_with(capsys, monkeypatch, folder, NEW)
    assert code == 0 and PHRASE in out
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", NEW)
    code, out, err = run(capsys, "--data-dir", folder, "threads", "--no-model")
    assert code == 0 and all(title in out for title in TITLES), err  # every chat is there
    for path in folder.rglob("*"):  # neither passphrase written anywhere
        if path.is_file():
            content = path.read_bytes()
            assert OLD.encode() not in content and NEW.encode() not in content, path


def test_another_process_holding_the_history_is_said_and_the_window_opens_on_the_old_key(
        capsys, monkeypatch, data):
    folder, threads = data
    encrypt(capsys, monkeypatch, folder)
    before = digest(folder / "iris.db")
    holder = hold_encrypted(folder / "iris.db", OLD)
    seen: list[str] = []
    boxes: list[str] = []
    said: list[str] = []

    def refusal_said(windows) -> bool:
        box = QApplication.activeModalWidget()
        if not isinstance(box, QMessageBox):
            return False
        boxes.append(box.text())
        box.accept()
        return True

    try:
        assert holder.stdout.readline().strip() == "ready"
        code, windows, _ = run_app(monkeypatch, folder, asked_at_start(seen),
                                   *change_key_through_the_dialog(threads, OLD, NEW),
                                   refusal_said, reopened(threads, said, seen))
    finally:
        holder.communicate("", timeout=60)
    assert holder.returncode == 0
    assert code == 0 and len(windows) == 2
    assert len(boxes) == 1 and "Another Iris process (the app, or a chat) has" in boxes[0]
    assert "nothing was changed" in boxes[0] and "Traceback" not in boxes[0]
    assert seen == [""]  # the window opened again on the old key, not asked again
    assert said and "was not changed" in said[0], said
    assert digest(folder / "iris.db") == before
    code, out = opens_with(capsys, monkeypatch, folder, OLD)
    assert code == 0 and PHRASE in out


def test_a_passphrase_becomes_a_key_in_the_keyring(capsys, monkeypatch, data):
    folder, threads = data
    encrypt(capsys, monkeypatch, folder)
    kept = memory_keyring()
    seen: list[str] = []
    said: list[str] = []
    code, windows, _ = run_app(monkeypatch, folder, asked_at_start(seen),
                               *change_key_through_the_dialog(threads, OLD, None),
                               reopened(threads, said, seen))
    assert code == 0 and seen == [""]
    assert said and "new key kept in this computer's keyring" in said[0], said
    salt = (folder / "iris.db").read_bytes()[:16].hex()
    assert list(kept) == [("iris-desktop-storage", f"database {salt}")]
    code, out = opens_with(capsys, monkeypatch, folder, None)  # nothing asked: the keyring's
    assert code == 0 and PHRASE in out
    code, out = opens_with(capsys, monkeypatch, folder, OLD)
    assert code != 0


def test_a_key_in_the_keyring_becomes_a_passphrase_and_the_folder_opens_elsewhere(
        capsys, monkeypatch, data):
    """The history encrypted with the keyring's key (never asked at start): no current
    passphrase is asked, the window opens again without asking, and the data folder then
    opens with the new passphrase where that keyring is not."""
    folder, threads = data
    kept = memory_keyring()
    encrypt(capsys, monkeypatch, folder, None)
    asked: list[str] = []
    said: list[str] = []

    def no_current_asked(windows) -> bool:
        dialog = windows[0].key_change.dialog if windows else None
        if dialog is None or not dialog.isVisible():
            return False
        assert not dialog.asks_current and not dialog.current.isVisible()
        return True

    steps = change_key_through_the_dialog(threads, None, NEW)
    code, windows, _ = run_app(monkeypatch, folder, *steps[:2], no_current_asked, steps[2],
                               reopened(threads, said, asked))
    assert code == 0 and asked == []  # asked neither at the start nor after the change
    assert said and "new passphrase" in said[0], said
    kept.clear()  # another computer: no key in its keyring
    code, out = opens_with(capsys, monkeypatch, folder, None)
    assert code != 0 and "it was encrypted with a passphrase" in out
    code, out = opens_with(capsys, monkeypatch, folder, NEW)
    assert code == 0 and PHRASE in out


# -- the dialog and the menu item, in a window ---------------------------------------------


def test_a_wrong_current_passphrase_is_asked_again_and_changes_nothing(
        qtbot, capsys, monkeypatch, data, make_window):
    folder, _ = data
    encrypt(capsys, monkeypatch, folder)
    before = digest(folder / "iris.db")
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", OLD)  # (this start's: said in the dialog)
    window = make_window()  # (its data folder is ``folder``)
    assert window.host.encrypted
    window.menus.actions["change-key"].trigger()
    dialog = window.key_change.dialog
    qtbot.waitUntil(dialog.isVisible)
    assert dialog.findChild(QRadioButton, "to-keyring") is None  # no keyring: not offered
    assert dialog.findChild(QWidget, "rekey-no-keyring") is not None
    assert "IRIS_STORAGE_PASSPHRASE is set" in dialog.findChild(QWidget, "rekey-env").text()
    qtbot.keyClicks(dialog.current, "not the passphrase")
    qtbot.keyClicks(dialog.new, NEW)
    qtbot.keyClicks(dialog.again, NEW[:-1])
    assert not dialog.ok.isEnabled() and "differ" in dialog.problem.text()
    qtbot.keyClicks(dialog.again, NEW[-1])
    qtbot.mouseClick(dialog.ok, Qt.MouseButton.LeftButton)
    assert dialog.isVisible() and "not the current passphrase" in dialog.problem.text()
    assert dialog.current.text() == ""  # cleared, to be typed again
    assert window.key_change.request is None and window.isVisible()
    qtbot.keyClicks(dialog.current, OLD)
    dialog.new.setText(OLD)
    dialog.again.setText(OLD)
    qtbot.mouseClick(dialog.ok, Qt.MouseButton.LeftButton)
    assert dialog.isVisible() and "That is the current passphrase" in dialog.problem.text()
    dialog.reject()
    assert window.key_change.request is None and window.isVisible()
    window.shutdown()
    window.host.close()
    assert digest(folder / "iris.db") == before
    code, out = opens_with(capsys, monkeypatch, folder, OLD)
    assert code == 0 and PHRASE in out


def test_the_item_is_disabled_on_a_plain_history_and_says_how_to_encrypt(make_window):
    window = make_window()
    action = window.menus.actions["change-key"]
    assert not window.host.encrypted
    assert not action.isEnabled()
    assert "Edit ▸ Preferences" in action.toolTip() and "storage.encrypt" in action.toolTip()
    assert action in window.menuBar().actions()[0].menu().actions()  # in File


def test_a_reply_being_written_refuses_the_change_with_a_sentence(
        qtbot, capsys, monkeypatch, data, make_window):
    folder, _ = data
    encrypt(capsys, monkeypatch, folder)
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", OLD)
    go = threading.Event()

    def slow(messages) -> str:
        go.wait(120)
        return "Done."

    window = make_window(ScriptedRuntime([slow]))
    window.send("Hello?")
    qtbot.waitUntil(lambda: window.generating, timeout=10_000)
    try:
        window.menus.actions["change-key"].trigger()
        box = window.key_change.refusal
        assert box is not None and box.isVisible()
        assert "A reply is being written: stop it" in box.text()
        assert window.key_change.dialog is None and window.key_change.request is None
        box.accept()
    finally:
        go.set()
    qtbot.waitUntil(lambda: not window.generating, timeout=20_000)
    settle(qtbot, window)
    assert window.isVisible()


def test_an_import_under_way_refuses_the_change_with_a_sentence(
        qtbot, capsys, monkeypatch, data, make_window, tmp_path):
    """An import cannot be stopped: the closing window waited for it, unanswering, for
    as long as it took (a minute for a large export)."""
    from iris_desktop.core import foreign

    folder, _ = data
    encrypt(capsys, monkeypatch, folder)
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", OLD)
    go, reading = threading.Event(), threading.Event()
    load = foreign.load_conversations

    def held(*args, **kwargs):
        reading.set()
        go.wait(120)
        return load(*args, **kwargs)

    monkeypatch.setattr(foreign, "load_conversations", held)
    window = make_window()
    window.threads_control.import_file(str(chatgpt_export(tmp_path, 3)))
    qtbot.waitUntil(reading.is_set, timeout=10_000)
    try:
        window.menus.actions["change-key"].trigger()
        box = window.key_change.refusal
        assert box is not None and box.isVisible()
        assert box.text().startswith("An import is under way: let it finish")
        assert window.key_change.dialog is None and window.key_change.request is None
        box.accept()
    finally:
        go.set()
    qtbot.waitUntil(lambda: not window.threads_control.importer.under_way, timeout=20_000)
    settle(qtbot, window)
    assert window.isVisible()
    window.menus.actions["change-key"].trigger()  # once it ended: the dialog
    assert window.key_change.dialog is not None
    window.key_change.dialog.reject()


def test_the_change_between_windows_says_each_stage_and_a_wrong_key_changes_nothing(
        qapp, capsys, monkeypatch, data):
    """:func:`change_key_now` as ``run_gui`` calls it once the window is closed: the
    progress dialog follows the conversion's stages; a current passphrase that does not
    open the history (it never gets here from the dialog, which checks it) changes
    nothing and says why."""
    from iris_desktop.paths import app_paths
    from iris_desktop.ui.rekey_dialog import KeyChangeProgress, KeyChangeRequest, change_key_now

    folder, _ = data
    encrypt(capsys, monkeypatch, folder)
    before = digest(folder / "iris.db")
    outcome = change_key_now(app_paths(folder), KeyChangeRequest("passphrase", "not it", NEW))
    assert outcome is not None and "does not open the encrypted history" in outcome
    assert "nothing was changed" in outcome and digest(folder / "iris.db") == before
    stages: list[str] = []
    show = KeyChangeProgress.show_stage
    monkeypatch.setattr(KeyChangeProgress, "show_stage",
                        lambda self, name: (stages.append(self.label.text()), show(self, name)))
    assert change_key_now(app_paths(folder), KeyChangeRequest("passphrase", OLD, NEW)) is None
    assert stages == ["Encrypting a copy of the chat history with the new key…",
                      "Checking the copy against the chat history…",
                      "Writing the copy to disk…",
                      "Putting the copy in place of the chat history…"]
    code, out = opens_with(capsys, monkeypatch, folder, NEW)
    assert code == 0 and PHRASE in out


def test_a_change_the_disk_refuses_says_to_use_the_window_s_item_again(
        qapp, capsys, monkeypatch, data):
    """The review of this change: a full disk during File ▸ Change history passphrase… said
    "free some space, then run 'iris-desktop rekey' again", a command the user never ran.
    The copy is refused as a full disk refuses it (the conversion's export, stubbed to
    raise the sentence the real one raises)."""
    from iris_desktop.core.store import StoreError, cipher
    from iris_desktop.paths import app_paths
    from iris_desktop.ui.rekey_dialog import KeyChangeRequest, change_key_now

    folder, _ = data
    encrypt(capsys, monkeypatch, folder)
    before = digest(folder / "iris.db")

    def full(conn, path, copy, target, then):
        raise StoreError(f"the disk holding {path} is full; it was not changed; free some "
                         f"space, then {then}")

    monkeypatch.setattr(cipher, "_export", full)
    outcome = change_key_now(app_paths(folder), KeyChangeRequest("passphrase", OLD, NEW))
    assert outcome is not None and outcome.endswith(
        "free some space, then choose File ▸ Change history passphrase… again"), outcome
    assert "iris-desktop rekey" not in outcome and digest(folder / "iris.db") == before


def test_the_passphrases_handed_to_the_start_are_forgotten_after_it():
    """The review of this change: the passphrase a start did not use (the old one after a
    change) stayed in the handing-over closure for the second window's whole life."""
    from iris_desktop.ui.rekey_dialog import KeyChangeRequest, reopening

    asked: list[bool] = []
    ask, _ = reopening(KeyChangeRequest("passphrase", OLD, NEW), None,
                       lambda path, new, problem: asked.append(new) or "typed")
    assert ask(Path("iris.db"), False, None) == NEW  # the start: the new one, not asked
    ask.forget()
    assert ask(Path("iris.db"), False, "wrong") == "typed" and asked == [False]  # OLD gone
