"""File ▸ Change history passphrase…: the encrypted history encrypted again with a new key
from the window (before, only ``iris-desktop rekey`` could, and not while the window was
open: the window itself holds the history).

The window cannot close its connections to the history (one per thread) and go on, so
the change is an in-process restart: :class:`KeyChange` asks for the keys
(:class:`RekeyDialog`), records the request and closes the window as File ▸ Quit does;
``run_gui`` (:mod:`.app`) then changes the key (:func:`change_key_now`, the CLI's
``storage_key.change_key`` on a worker thread behind a progress dialog) and opens a new
host and window on the history (:func:`reopening`: the new passphrase, or the current one
when the change failed, is handed to the start once, so nothing is asked again). A
failure leaves the history as it was: the current key still opens it."""

from __future__ import annotations

import hmac
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QMessageBox,
    QProgressBar,
    QRadioButton,
    QVBoxLayout,
    QWidget,
)

from iris_desktop.keyring_secrets import keyring_present
from iris_desktop.storage_key import NEW_PASSPHRASE_ENV, PASSPHRASE_ENV, AskPassphrase

log = logging.getLogger("iris.ui")

#: the menu item's tip while the history is not encrypted (the item is disabled then)
NOT_ENCRYPTED = ("The chat history is not encrypted, so it has no key to change: to encrypt "
                 "it, turn on “Encrypt the chat history on disk” in Edit ▸ Preferences "
                 "(storage.encrypt); Iris encrypts it at the next start")
#: what the progress dialog says at each stage of ``convert`` (its ``step`` names)
STAGES = {
    "": "Encrypting a copy of the chat history with the new key…",
    "exported": "Checking the copy against the chat history…",
    "verified": "Writing the copy to disk…",
    "synced": "Putting the copy in place of the chat history…",
    "swapped": "Opening the chat history again…",
}


@dataclass(frozen=True)
class KeyChangeRequest:
    """What the dialog asked for: ``to`` "passphrase" or "keyring"; the current
    passphrase (None: the key is the keyring's) and the new one. Never printed."""

    to: str
    current: str | None = field(default=None, repr=False)
    new: str | None = field(default=None, repr=False)

    def env(self) -> dict[str, str]:
        """``change_key``'s environment: the two passphrases, in a dict of its own (the
        process's environment is not touched)."""
        env = {PASSPHRASE_ENV: self.current} if self.current else {}
        if self.to == "passphrase" and self.new:
            env[NEW_PASSPHRASE_ENV] = self.new
        return env


class RekeyDialog(QDialog):
    """The new key of the history at ``path``: a passphrase typed twice, or (``keyring``:
    one can be reached) a new key kept in the keyring; and, when ``current_kind`` is
    "passphrase", the current passphrase, which ``check`` tells right or wrong (a wrong
    one is said here and asked again, the window still open)."""

    def __init__(self, path: Path, current_kind: str, keyring: bool,
                 check: Callable[[str], bool], parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("rekey-dialog")
        self.setWindowTitle("Change the chat history's passphrase")
        self.check = check
        #: the current passphrase is asked (not when the keyring's key encrypts it)
        self.asks_current = current_kind == "passphrase"
        self.intro = QLabel(
            f"The chat history at {path} is encrypted. To encrypt it again with a new key, "
            "Iris closes the window and the chat history, writes an encrypted copy of it with "
            "the new key, checks the copy, puts it in place of the old file, and opens them "
            "again; this takes a moment (longer for a long history). If anything fails, "
            "nothing is changed and the current key still opens it. Copies made before "
            "(backups, databases set aside) keep their old key.", objectName="rekey-intro",
            wordWrap=True)
        self.current = QLineEdit(objectName="current-passphrase",
                                 echoMode=QLineEdit.EchoMode.Password)
        self.to_passphrase = QRadioButton("A new &passphrase", objectName="to-passphrase",
                                          checked=True)
        self.to_keyring = QRadioButton("A new key kept in this computer's &keyring",
                                       objectName="to-keyring")
        self.new = QLineEdit(objectName="new-passphrase", echoMode=QLineEdit.EchoMode.Password)
        self.again = QLineEdit(objectName="new-passphrase-again",
                               echoMode=QLineEdit.EchoMode.Password)
        self.problem = QLabel("", objectName="rekey-problem", wordWrap=True, visible=False)
        self.problem.setStyleSheet("color: #c0392b;")
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.ok = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        self.ok.setText("Change the key")
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        self._lay_out(keyring)
        for edit in (self.current, self.new, self.again):
            edit.textChanged.connect(self._update)
        self.to_passphrase.toggled.connect(self._update)
        self._update()

    def _lay_out(self, keyring: bool) -> None:
        """The widgets asked for; those not (the current passphrase of a keyring's key,
        the keyring's choice without one) stay out of the dialog."""
        layout = QVBoxLayout(self)
        layout.addWidget(self.intro)
        form = QFormLayout()
        if self.asks_current:
            form.addRow("Current passphrase:", self.current)
        else:
            form.addRow(QLabel("Its key is kept in this computer's keyring now.", wordWrap=True))
        layout.addLayout(form)
        if keyring:
            for button, hint in ((self.to_passphrase, "Asked at each start; with it the data "
                                  "folder opens on any computer."),
                                 (self.to_keyring, "No passphrase to type; the data folder then "
                                  "opens only on this computer and user account.")):
                layout.addWidget(button)
                words = QLabel(hint, wordWrap=True)
                words.setContentsMargins(24, 0, 0, 0)  # under the button's text
                words.setBuddy(button)
                layout.addWidget(words)
        else:
            layout.addWidget(QLabel("No keyring can be reached from this session, so the new "
                                    "key is a passphrase.", objectName="rekey-no-keyring",
                                    wordWrap=True))
        fields = QFormLayout()
        fields.addRow("New passphrase:", self.new)
        fields.addRow("Again:", self.again)
        layout.addLayout(fields)
        if os.environ.get(PASSPHRASE_ENV):
            layout.addWidget(QLabel(f"{PASSPHRASE_ENV} is set where Iris was started: once the "
                                    "key is changed, unset it (or set it to the new passphrase) "
                                    "before Iris starts again, or it cannot open the history.",
                                    objectName="rekey-env", wordWrap=True))
        layout.addWidget(QLabel("A reply being written must be stopped or finished first.",
                                wordWrap=True))
        layout.addWidget(self.problem)
        layout.addWidget(self.buttons)
        self.setMinimumWidth(520)

    def _update(self) -> None:
        to_passphrase = self.to_passphrase.isChecked()
        self.new.setEnabled(to_passphrase)
        self.again.setEnabled(to_passphrase)
        new, again = self.new.text(), self.again.text()
        ready = (not self.asks_current or bool(self.current.text())) and (
            not to_passphrase or (bool(new) and again == new))
        self.ok.setEnabled(ready)
        if to_passphrase and again and again != new:
            self._say("The two new passphrases differ.")
        elif self.problem.text() == "The two new passphrases differ.":
            self._say(None)

    def _say(self, problem: str | None) -> None:
        self.problem.setText(problem or "")
        self.problem.setVisible(bool(problem))
        if self.isVisible():
            self.adjustSize()  # room for it (the wrapped texts above it were squeezed)

    def accept(self) -> None:
        """Checked before the window closes: a wrong current passphrase, or a new one that
        is the current one or cannot be used, is said here and asked again."""
        current, new = self.current.text(), self.new.text()
        to_passphrase = self.to_passphrase.isChecked()
        if self.asks_current and not self.check(current):
            self._say("That is not the current passphrase of the chat history; nothing was "
                      "changed. Type it again.")
            self.current.clear()
            self.current.setFocus()
            return
        if to_passphrase and (not new or new != self.again.text()):
            self._say("Type the new passphrase twice, the same both times.")
            return
        if to_passphrase and "\x00" in new:
            self._say("That passphrase cannot be used (it holds a NUL character); choose another.")
            return
        if to_passphrase and self.asks_current and new == current:
            self._say("That is the current passphrase: choose a new one.")
            return
        super().accept()

    def request(self) -> KeyChangeRequest:
        """The request the dialog was accepted with."""
        to = "passphrase" if self.to_passphrase.isChecked() else "keyring"
        return KeyChangeRequest(to, self.current.text() if self.asks_current else None,
                                self.new.text() if to == "passphrase" else None)

    def clear(self) -> None:
        """Forget what was typed (the request holds it until the change is done)."""
        for edit in (self.current, self.new, self.again):
            edit.clear()


class KeyChange(QObject):
    """File ▸ Change history passphrase… of ``window`` (its ``menus.actions["change-key"]``):
    enabled while the history is encrypted; the dialog, then :attr:`request` recorded and
    the window closed for ``run_gui`` to do the change (a reply being written refuses it,
    said in ``refusal``)."""

    def __init__(self, window: Any):
        super().__init__(window)
        self.window = window
        #: what the accepted dialog asked for: ``run_gui`` changes the key when it is set
        self.request: KeyChangeRequest | None = None
        self.dialog: RekeyDialog | None = None
        self.refusal: QMessageBox | None = None
        self.action = window.menus.actions["change-key"]
        encrypted = window.host.encrypted
        self.action.setEnabled(encrypted)
        tip = ("Encrypt the chat history again with a new passphrase or key" if encrypted
               else NOT_ENCRYPTED)
        self.action.setToolTip(tip)
        self.action.setStatusTip(tip)
        self.action.triggered.connect(self.open)

    def open(self) -> RekeyDialog | None:
        """The dialog (non-blocking); None when a reply is being written or an import is
        under way (said)."""
        if self._refused():
            return None
        key = self.window.host.storage.key
        if key is None:  # (the item is disabled then)
            return None
        dialog = RekeyDialog(self.window.host.paths.db_path, key.kind, keyring_present(),
                             self._is_current, self.window)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(lambda: self._accepted(dialog))
        dialog.rejected.connect(dialog.clear)
        self.dialog = dialog
        dialog.open()
        return dialog

    def _is_current(self, text: str) -> bool:
        """Whether ``text`` is the passphrase the history was opened with (compared with
        the key in memory: no file is read, and the window keeps the history open)."""
        key = self.window.host.storage.key
        return (key is not None and key.kind == "passphrase"
                and hmac.compare_digest(text.encode("utf-8"), key.secret))

    def _accepted(self, dialog: RekeyDialog) -> None:
        request = dialog.request()
        dialog.clear()
        if self._refused():
            return
        self.request = request
        log.info("changing the chat history's key: the window closes and opens again")
        self.window.quit_now()  # File ▸ Quit's path: drafts kept, the model closed

    def _refused(self) -> bool:
        """Whether the change must wait (a reply being written, or an import, which cannot
        be stopped and held the closing window for as long as it took), said in a box."""
        if self.window.app_state.generating:
            why = "A reply is being written: stop it (Esc) or let it finish"
        elif self.window.threads_control.importer.under_way:
            why = "An import is under way: let it finish (the status bar says how far it is)"
        else:
            return False
        box = QMessageBox(QMessageBox.Icon.Information, "Change the chat history's passphrase",
                          f"{why}, then change the passphrase.", QMessageBox.StandardButton.Ok,
                          self.window)
        box.setObjectName("rekey-refused")
        self.refusal = box
        box.open()
        return True


# -- between the windows: the change, with progress ----------------------------------------


class _Signals(QObject):
    stage = Signal(str)
    ended = Signal(object)


class KeyChangeProgress(QDialog):
    """What the change is doing, modal, while a worker thread does it (the event loop
    runs meanwhile); it cannot be closed until the change ends (``outcome``: None when it
    was done, else the sentence that says why not)."""

    def __init__(self) -> None:
        super().__init__(None)
        self.setObjectName("rekey-progress")
        self.setWindowTitle("Changing the chat history's key")
        self.setModal(True)
        self.setWindowFlag(Qt.WindowType.WindowCloseButtonHint, False)
        self.label = QLabel(STAGES[""], objectName="rekey-stage", wordWrap=True)
        bar = QProgressBar(self)
        bar.setRange(0, 0)  # busy: the stages take unknown times
        layout = QVBoxLayout(self)
        layout.addWidget(self.label)
        layout.addWidget(bar)
        self.setMinimumWidth(420)
        self.ended = False
        self.outcome: str | None = None

    def show_stage(self, name: str) -> None:
        self.label.setText(STAGES.get(name, self.label.text()))

    def finish(self, outcome: str | None) -> None:
        self.ended, self.outcome = True, outcome
        self.accept()

    def reject(self) -> None:  # Esc: the change is not stopped halfway
        if self.ended:
            super().reject()

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        if not self.ended:
            event.ignore()
            return
        super().closeEvent(event)


def change_key_now(paths: Any, request: KeyChangeRequest) -> str | None:
    """``storage_key.change_key`` on a worker thread behind :class:`KeyChangeProgress`,
    with every connection of this process to the history closed (the window is gone).
    Returns None when the key was changed, else the one sentence that says why not (the
    history then unchanged)."""
    from iris_desktop.core.store import StoreError
    from iris_desktop.storage_key import change_key

    progress = KeyChangeProgress()
    signals = _Signals(progress)
    signals.stage.connect(progress.show_stage)
    signals.ended.connect(progress.finish)

    def work() -> None:
        try:
            change_key(paths, request.to, env=request.env(), ask=None, step=signals.stage.emit,
                       again="choose File ▸ Change history passphrase… again")
            outcome = None
        except StoreError as exc:
            outcome = str(exc)
        except Exception as exc:  # an unforeseen failure: said, and in the log in full
            log.exception("changing the chat history's key failed")
            outcome = (f"changing the key failed ({type(exc).__name__}: {exc}); the log has the "
                       "details")
        signals.ended.emit(outcome)

    worker = threading.Thread(target=work, name="iris-rekey")
    worker.start()
    progress.exec()  # until the worker's ``ended`` (queued to this thread) arrives
    worker.join()
    outcome = progress.outcome
    progress.deleteLater()
    if outcome is not None:
        log.warning("the chat history's key was not changed: %s", outcome)
    return outcome


def reopening(request: KeyChangeRequest, outcome: str | None,
              fallback: AskPassphrase) -> tuple[AskPassphrase, str]:
    """How the history is opened again after :func:`change_key_now`: the passphrase it
    has now handed to the start once (the new one, or the current one when the change
    failed; then the other, should the file be the other's), then ``fallback`` (the
    dialog); and what the new window says of it."""
    left = [p for p in ((request.new, request.current) if outcome is None
                        else (request.current, request.new)) if p]

    def ask(path: Path, new: bool, problem: str | None) -> str | None:
        if not new and left:
            return left.pop(0)
        return fallback(path, new, problem)

    ask.forget = left.clear  # (the start is over: no passphrase kept for nothing)

    if outcome is not None:
        return ask, "The chat history's key was not changed; it opens with its current key"
    said = ("The chat history's key was changed: it is encrypted with the new passphrase now, "
            "asked at each start (with it the data folder opens on any computer)"
            if request.to == "passphrase" else
            "The chat history's key was changed: it is encrypted with a new key kept in this "
            "computer's keyring now (no passphrase is asked)")
    said += "; copies made before keep their old key"
    if os.environ.get(PASSPHRASE_ENV):
        said += f"; unset {PASSPHRASE_ENV} before Iris starts again"
    return ask, said
