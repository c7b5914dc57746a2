"""Model ▸ Add a server…: an OpenAI-compatible server (llama.cpp's ``llama-server``,
vLLM, Ollama, a hosted API) instead of the local model, and the one-time question before
a conversation first leaves this computer.

The dialog edits a base URL, a model name and an API key. "Test connection" probes the
server off the GUI thread (``runtime.remote.test_connection``) and lists its models with
their windows and whether prompt counts will be exact; the model box is filled from it.
The key goes to the OS keyring on OK, never to config.toml. Plain ``http://`` to another
machine is warned about as it is typed. What the dialog decides is emitted
(``serverChosen``, ``serverRemoved``); saving ``model.backend``, ``model.base_url`` and
``model.name`` and reconnecting is the caller's.
"""

from __future__ import annotations

import threading

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from iris_desktop.host import connect_words
from iris_desktop.runtime.remote import (
    ServerError,
    ServerInfo,
    delete_api_key,
    get_api_key,
    is_loopback,
    privacy_warning,
    server_address,
    set_api_key,
    test_connection,
)
from iris_desktop.runtime.remote.address import clean_api_key
from iris_desktop.settings import SettingsError, lookup
from iris_desktop.ui.boxes import warn


def _url_problem(url: str) -> str | None:
    """Why ``model.base_url`` cannot be ``url`` (a password in it), in the setting's words."""
    try:
        lookup("model.base_url").parse(url)
    except SettingsError as exc:
        return str(exc).split(": ", 1)[-1]
    return None


#: the most models the model box offers (a server listing 100,000 froze the dialog)
LISTED_MODELS = 1000

#: the QSettings value listing the servers the user agreed to send conversations to
CONFIRMED_SERVERS = "remote/confirmed_servers"


class ServerDialog(QDialog):
    """Add, change or remove the server. ``serverChosen(base_url, model)`` on OK (the
    key, if one was typed, is already in the keyring); ``serverRemoved(base_url)`` when
    the user removes it (its key is deleted)."""

    serverChosen = Signal(str, str)
    serverRemoved = Signal(str)
    #: a probe's ServerInfo or exception, from the probing thread to the GUI thread
    _tested = Signal(object, object)
    _waiting = Signal(str, str)  # (the URL probed, what it waits for: host.connect_words)

    def __init__(self, base_url: str = "", model: str = "", parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("server-dialog")
        self.setWindowTitle("Server" if base_url else "Add a server")
        self.url = QLineEdit(base_url, objectName="base-url",
                             placeholderText="http://127.0.0.1:8080 or https://host/v1")
        self.model = QComboBox(objectName="model-name", editable=True)
        self.model.setEditText(model)
        self.key = QLineEdit(objectName="api-key", echoMode=QLineEdit.EchoMode.Password)
        plain = Qt.TextFormat.PlainText  # what a server answers is text, never drawn as HTML
        self.warning = QLabel(objectName="privacy-warning", wordWrap=True, textFormat=plain)
        self.warning.setStyleSheet("color: #c0392b;")
        self.result = QLabel(objectName="test-result", wordWrap=True, textFormat=plain,
                             textInteractionFlags=Qt.TextInteractionFlag.TextSelectableByMouse)
        self.test_button = QPushButton("Test connection", objectName="test-connection")
        self.remove_button = QPushButton("Remove server", objectName="remove-server")
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.addButton(self.remove_button, QDialogButtonBox.ButtonRole.DestructiveRole)
        self.remove_button.setEnabled(bool(base_url))
        self.info: ServerInfo | None = None
        self._probe: threading.Thread | None = None
        #: the server whose saved key the placeholder describes: the keyring (D-Bus or
        #: Keychain, which may block) is asked once per server, not once per keystroke
        self._key_address: str | None = None
        self._layout()
        self.url.textChanged.connect(self._url_changed)
        self.test_button.clicked.connect(self.test)
        self.remove_button.clicked.connect(self.remove)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        self._tested.connect(self._show_test, Qt.ConnectionType.QueuedConnection)
        self._waiting.connect(self._show_wait, Qt.ConnectionType.QueuedConnection)
        self._url_changed(base_url)

    def _layout(self) -> None:
        form = QFormLayout()
        form.addRow("Base URL", self.url)
        form.addRow("Model", self.model)
        form.addRow("API key", self.key)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.warning)
        layout.addWidget(self.test_button, alignment=Qt.AlignmentFlag.AlignLeft)
        layout.addWidget(self.result, 1)
        # room for a URL, a model path and the test's result without clipping
        self.setMinimumWidth(self.fontMetrics().horizontalAdvance("0") * 72)
        layout.addWidget(self.buttons)

    def base_url(self) -> str:
        return self.url.text().strip()

    def _address(self) -> str | None:
        """``host:port`` of the URL typed, or None while it is not a URL."""
        try:
            return server_address(self.base_url())
        except ValueError:
            return None

    def _url_changed(self, _text: str) -> None:
        """Say at once what the URL means: not a URL yet, plain http to another machine,
        and whether a key is already saved for that server."""
        address = self._address()
        problem = _url_problem(self.base_url()) if address is not None else None
        ok = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        ok.setEnabled(address is not None and problem is None)
        self.test_button.setEnabled(address is not None and problem is None)
        if address is None or problem:
            self.warning.setText(problem or ("Type the server's address, for example "
                                             "http://127.0.0.1:8080" if self.base_url() else ""))
            return
        self.warning.setText(privacy_warning(self.base_url()) or "")
        if address == self._key_address:
            return
        self._key_address = address
        saved = get_api_key(self.base_url())
        self.key.setPlaceholderText("saved in the system keyring (type to replace)" if saved
                                    else "none (leave empty if the server needs none)")

    # -- Test connection --

    def test(self) -> None:
        """Probe the server on a helper thread; the result arrives through ``_tested``."""
        if self._address() is None or (self._probe is not None and self._probe.is_alive()):
            return
        url, typed = self.base_url(), self.key.text().strip()  # a pasted key's line end
        self.test_button.setEnabled(False)
        self.result.setText(f"Connecting to {self._address()}…")

        address = self._address()

        def waiting(path: str, waited_s: float) -> None:  # on the probing thread
            self._waiting.emit(url, connect_words(address, path, waited_s))

        def probe() -> None:  # the keyring too is asked here, off the GUI thread
            try:
                self._tested.emit(url, test_connection(url, typed or get_api_key(url), on_wait=waiting))
            except Exception as exc:  # shown in the dialog, whatever it is
                self._tested.emit(url, exc)

        self._probe = threading.Thread(target=probe, name="iris-server-test", daemon=True)
        self._probe.start()

    def _show_wait(self, url: str, words: str) -> None:
        """What a slow test waits for ("Connecting to …… waiting for /v1/models (12 s)"),
        while it still runs for the URL shown."""
        if url == self.base_url() and not self.test_button.isEnabled():
            self.result.setText(words)

    def _show_test(self, url: str, outcome: object) -> None:
        self.test_button.setEnabled(self._address() is not None)
        if url != self.base_url():
            return  # the URL changed while it was probed
        if isinstance(outcome, Exception):
            self.info = None
            self.result.setText(f"Could not use {url}: {outcome}")
            return
        assert isinstance(outcome, ServerInfo)
        self.info = outcome
        lines = outcome.describe()
        if len(outcome.models) > LISTED_MODELS:
            lines.append(f"The model box offers the first {LISTED_MODELS:,} of "
                         f"{len(outcome.models):,}; type the name of another.")
        self.result.setText("\n".join(lines))
        typed = self.model.currentText()
        self.model.clear()
        self.model.addItems([m.name for m in outcome.models[:LISTED_MODELS]])
        self.model.setEditText(typed if typed and outcome.model(typed) else
                               (outcome.models[0].name if outcome.models else typed))

    # -- OK and Remove --

    def accept(self) -> None:
        """Save a typed key in the keyring (a refusal is said, and the dialog stays)."""
        url = self.base_url()
        try:
            key = clean_api_key(url, self.key.text())
        except ServerError:  # said without repeating the key
            warn(self, "The API key was not saved",
                 "The API key has characters an HTTP header cannot carry (a space inside it, "
                 "or letters beyond plain ASCII); type it again.")
            return
        if key:
            try:
                set_api_key(url, key)
            except Exception as exc:  # no keyring on this system, or it refused
                warn(self, "The API key was not saved",
                     f"The system keyring refused the key: {exc}")
                return
        self.serverChosen.emit(url, self.model.currentText().strip())
        super().accept()

    def remove(self) -> None:
        """Forget this server: its key leaves the keyring; the caller goes back to the
        local model."""
        url = self.base_url()
        if self._address() is not None:
            delete_api_key(url)
        self.serverRemoved.emit(url)
        super().reject()


def _confirmed(state: QSettings) -> set[str]:
    return set(str(state.value(CONFIRMED_SERVERS, "") or "").split())


def _agreed_key(base_url: str) -> str:
    """What an agreement is kept under: the address and its scheme (agreeing to
    ``https://h:8443`` covered ``http://h:8443`` too, whose plain-http warning was then
    never shown)."""
    scheme = base_url.split("://", 1)[0].lower() if "://" in base_url else "http"
    return f"{scheme}://{server_address(base_url)}"


def needs_send_confirmation(base_url: str, state: QSettings) -> bool:
    """The conversation would leave this computer for a server not yet agreed to."""
    return not is_loopback(base_url) and _agreed_key(base_url) not in _confirmed(state)


def confirm_send(base_url: str, state: QSettings, parent: QWidget | None = None) -> bool:
    """Before the first send to a server on another machine: "Send your conversation to
    host:port?" (with the plain-http warning when it applies). The answer Yes is
    remembered per server in ``state`` (the window's ``ui-state.ini``); a loopback server
    is never asked about. Call it on the GUI thread before handing a send to the model
    thread; False means do not send."""
    if not needs_send_confirmation(base_url, state):
        return True
    address = server_address(base_url)
    box = QMessageBox(QMessageBox.Icon.Question, "Send to a server?",
                      f"Send your conversation to {address}?",
                      QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No, parent)
    box.setObjectName("remote-send-confirm")
    box.setInformativeText(
        "Each request carries the system prompt, the summary and as much recent history as "
        "fits the window; the server's operator can read it. Iris asks once per server."
        + (f"\n\n{warning}" if (warning := privacy_warning(base_url)) else ""))
    box.setDefaultButton(QMessageBox.StandardButton.No)
    if box.exec() != QMessageBox.StandardButton.Yes:
        return False
    state.setValue(CONFIRMED_SERVERS, " ".join(sorted(_confirmed(state) | {_agreed_key(base_url)})))
    return True


def hold_conversation(runtime: object, state: QSettings) -> None:
    """Tell a server runtime whether the conversation may go to it yet: not to a server on
    another machine the user has not agreed to (``confirm_send``), so that until then the
    meter, the draft's count and the inspector count locally (estimated) and nothing of
    the chat or the draft is sent. A local model is left as it is. Before, opening a chat
    sent its messages, and the draft as it was typed, to be counted."""
    base_url = getattr(runtime, "base_url", None)
    if base_url and hasattr(runtime, "conversation_allowed"):
        runtime.conversation_allowed = not needs_send_confirmation(base_url, state)


def forget_send_confirmation(base_url: str, state: QSettings) -> None:
    """Ask again before the next send to this server (it was removed)."""
    remaining = _confirmed(state) - {_agreed_key(base_url), server_address(base_url)}
    state.setValue(CONFIRMED_SERVERS, " ".join(sorted(remaining)))
