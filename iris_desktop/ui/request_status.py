"""The status bar's sentence about a chat, said when a turn (or Compact now) ended in it,
and when it stops holding.

* Another chat opened (or the one shown deleted): whatever the turn ended with ("9,978
  older turns are not sent", "Cut off") would be read as about that one; "Ready" instead.
* The chat's next request is planned anew (another Iris process saved its summary in it,
  or changed it otherwise; its settings or branch changed): a sentence about the request
  planned when the turn ended ("165 older turns are not sent; …", or that another process
  is compacting the chat and its summary is used once it is saved) no longer holds, and
  "Ready" takes its place, unless something else was said since. Before, it stayed for
  good: the bar said turns were not sent beside a meter, and a transcript, showing the
  other process's summary."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject

from iris_desktop.core.events import CompactionEvent
from iris_desktop.ui.app_state import AppState


def compacted_elsewhere(event: CompactionEvent) -> bool:
    """A compaction skipped because another Iris process compacts (or just compacted) the
    chat: its summary is the one used, and the skip's own sentence says so."""
    return event.elsewhere


class RequestStatus(QObject):
    """Holds what :meth:`said` of which chat; ``idle`` gives the words that replace it."""

    def __init__(self, app_state: AppState, idle: Callable[[], str], parent: QObject):
        super().__init__(parent)
        self.app_state = app_state
        self.idle = idle
        self._chat: int | None = None  # the chat the turn's sentence is about
        self._about: tuple[int, str] | None = None  # (the chat, a sentence about its request)
        self._shown = ""  # the status sentence shown now, whoever said it
        app_state.statusText.connect(self._show)
        app_state.busyChanged.connect(lambda text, _fraction: text is not None and self._show(text))
        app_state.threadChanged.connect(self._thread_changed)
        app_state.requestReported.connect(self._replanned)

    def said(self, thread_id: int | None, text: str, about_request: bool) -> None:
        """``text``, just shown, ended a turn in ``thread_id``; ``about_request``: it
        describes the request that chat sends next, as planned now."""
        self._chat = thread_id
        self._about = (thread_id, text) if about_request and thread_id is not None else None

    def _show(self, text: str) -> None:
        self._shown = text

    def _thread_changed(self, thread_id: int | None) -> None:
        if self._chat not in (None, thread_id) and not self.app_state.generating:
            self._chat = None
            self.app_state.show_status(self.idle())

    def _replanned(self, request: Any) -> None:
        if request is not None or self._about is None or self.app_state.generating:
            return  # (a request reported is the one planned: what was said of it holds)
        (thread_id, text), self._about = self._about, None
        if thread_id == self.app_state.thread_id and self._shown == text:
            self.app_state.show_status(self.idle())
