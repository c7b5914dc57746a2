"""The passphrase of an encrypted chat history (``storage.encrypt``), asked at start.

When the history is encrypted and neither ``IRIS_STORAGE_PASSPHRASE`` nor the keyring
holds its key, the app asks for the passphrase before the window opens; when encryption
is being turned on and there is no keyring, it asks for a new one, twice. A wrong
passphrase is said in the dialog and asked again (``storage_key.ATTEMPTS`` times). The
passphrase is handed to the host and never kept or written by the dialog.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QVBoxLayout,
    QWidget,
)


class PassphraseDialog(QDialog):
    """Ask for the passphrase of the history at ``path`` (``new``: choose one, typed twice;
    ``problem``: why the last one did not work)."""

    def __init__(self, path: Path, new: bool = False, problem: str | None = None,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("passphrase-dialog")
        self.new = new
        self.setWindowTitle("Encrypt the chat history" if new else "Encrypted chat history")
        text = (f"The chat history at {path} is to be encrypted (storage.encrypt is on) and this "
                "computer has no keyring to keep its key. Choose a passphrase: it is asked at "
                "every start, and the history cannot be read without it."
                if new else f"The chat history at {path} is encrypted. Enter its passphrase.")
        self.intro = QLabel(text, objectName="passphrase-intro", wordWrap=True)
        self.problem = QLabel(problem or "", objectName="passphrase-problem", wordWrap=True)
        self.problem.setStyleSheet("color: #c0392b;")
        self.problem.setVisible(bool(problem))
        self.passphrase = QLineEdit(objectName="passphrase", echoMode=QLineEdit.EchoMode.Password)
        self.again = QLineEdit(objectName="passphrase-again", echoMode=QLineEdit.EchoMode.Password)
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        form = QFormLayout()
        form.addRow("Passphrase:", self.passphrase)
        if new:
            form.addRow("Again:", self.again)
        layout = QVBoxLayout(self)
        layout.addWidget(self.intro)
        layout.addLayout(form)
        layout.addWidget(self.problem)
        layout.addWidget(self.buttons)
        self.passphrase.textChanged.connect(self._update)
        self.again.textChanged.connect(self._update)
        self._update()

    def _update(self) -> None:
        text = self.passphrase.text()
        ok = bool(text) and (not self.new or self.again.text() == text)
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setEnabled(ok)
        if self.new and self.again.text() and self.again.text() != text:
            self.problem.setText("The two passphrases differ.")
            self.problem.setVisible(True)

    def value(self) -> str | None:
        """The passphrase entered; None when the dialog was cancelled."""
        if self.result() != QDialog.DialogCode.Accepted:
            return None
        return self.passphrase.text() or None


def ask_passphrase(path: Path, new: bool, problem: str | None) -> str | None:
    """``storage_key.AskPassphrase`` for the desktop app: the dialog, modal, before the
    window opens; None when the user cancels."""
    dialog = PassphraseDialog(path, new, problem)
    dialog.exec()
    value = dialog.value()
    dialog.passphrase.clear()
    dialog.again.clear()
    dialog.deleteLater()
    return value
