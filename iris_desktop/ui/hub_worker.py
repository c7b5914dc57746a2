"""The download dialog's worker: hub calls (``runtime.hub``) on a thread of their own,
one at a time, with their results and a download's progress back on the GUI thread as
queued signals; how sizes and memory read in the dialog; the question about a failed
download's partial file; and the hub token's dialog."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtWidgets import QInputDialog, QLineEdit, QMessageBox, QWidget

from iris_desktop.runtime.hub import HubError, fits_in_memory, set_hub_token
from iris_desktop.runtime.remote import server_address
from iris_desktop.ui.boxes import plain_box
from iris_desktop.units import file_size, memory_size


def gb(n: int | None, about: bool = False) -> str:
    if not n:
        return "–"
    text = file_size(n)
    return f"about {text}" if about else text


def fits_text(estimate: int | None, total: int | None) -> str:
    fits = fits_in_memory(estimate, total)
    if fits is None:
        return "–"
    return f"fits ({memory_size(total, 0)})" if fits else f"too big for {memory_size(total, 0)}"


class HubCalls(QObject):
    """Runs one hub call at a time on a worker thread; ``on_done(result, error)`` is
    called back on the GUI thread (a queued signal), and so are ``progressed`` emits."""

    finished = Signal(object, object, object)  # on_done, result, error
    progressed = Signal(object)

    def __init__(self, parent: QObject) -> None:
        super().__init__(parent)
        self.thread: threading.Thread | None = None
        #: a call runs, or its answer has not been handled yet
        self.busy = False
        self.finished.connect(self._finished)

    def run(self, fn: Callable[[], Any], on_done: Callable[[Any, BaseException | None], None]) -> None:
        def work() -> None:
            result, error = None, None
            try:
                result = fn()
            except Exception as exc:  # HubError, or anything else: said in one sentence
                error = exc
            try:
                self.finished.emit(on_done, result, error)
            except RuntimeError:  # the dialog is gone
                pass

        self.busy = True
        self.thread = threading.Thread(target=work, name="iris-hub", daemon=True)
        self.thread.start()

    @Slot(object, object, object)
    def _finished(self, on_done: Callable, result: Any, error: BaseException | None) -> None:
        self.busy = False
        on_done(result, error)


def sentence(error: BaseException | None) -> str:
    if isinstance(error, HubError):
        return str(error)
    return f"The hub request failed: {error}." if error is not None else ""


def token_dialog(parent: QWidget, hub_url: str, said: Callable[[str], Any]) -> QInputDialog:
    """Token…: a token for gated or private models, saved in the OS keyring for this hub
    (as a server's API key; empty forgets it); ``said`` gets the one-sentence outcome."""
    dialog = QInputDialog(parent)
    dialog.setObjectName("hub-token")
    dialog.setWindowTitle("Hub token")
    try:
        where = server_address(hub_url)
    except ValueError:
        where = hub_url
    dialog.setLabelText(f"A token for {where}, for gated or private models. It is kept in this "
                        "computer's keyring and sent to the hub only; leave it empty to forget it.")
    dialog.setTextEchoMode(QLineEdit.EchoMode.Password)

    def save(text: str) -> None:
        try:
            set_hub_token(hub_url, text.strip())
        except Exception as exc:  # no keyring, or it refused: say so, keep nothing
            said(f"The keyring did not keep the token ({exc}).")
            return
        said(f"Token saved in the keyring for {where}." if text.strip() else f"Token for {where} forgotten.")

    dialog.textValueSelected.connect(save)
    dialog.open()
    return dialog


def partial_question(parent: QWidget, error: HubError, remove_it: Callable[[], Any]) -> QMessageBox:
    """After a failed download: keep the partial file (to resume, or to look at) or remove
    it (``remove_it``); the user says."""
    size = error.partial.stat().st_size if error.partial is not None and error.partial.exists() else 0
    box = plain_box(QMessageBox(QMessageBox.Icon.Warning, "The download did not finish", str(error),
                                parent=parent))
    box.setObjectName("partial-question")
    box.setInformativeText(f"The partial file ({gb(size)}) is {error.partial}."
                           + (" Keep it to resume later?" if error.resumable else " It is not used; keep it anyway?"))
    keep = box.addButton("Keep it", QMessageBox.ButtonRole.AcceptRole)
    remove = box.addButton("Remove it", QMessageBox.ButtonRole.DestructiveRole)
    box.setDefaultButton(keep if error.resumable else remove)
    box.finished.connect(lambda _result: box.clickedButton() is remove and remove_it())
    box.open()
    return box
