"""Reading a prompt that does not move says why, when the processor is busy.

A newcomer ran Iris beside other work: "Reading the conversation… 0 of 44 tokens (0%)"
stood for minutes, and nothing said why; the slow hint (``runtime.speed``) came only once
tokens were written. Now, when the prompt's progress has not moved for :data:`STALL_S`
seconds and other programs keep the processor busy (its load average), the bar's text
adds that cause ("· slow: other programs are using the processor (load 9.8 on 2)"); the
next progress replaces it."""

from __future__ import annotations

import re

from PySide6.QtCore import QObject, QTimer

from iris_desktop.runtime.speed import busy_processor
from iris_desktop.ui.app_state import AppState

#: seconds a prompt's progress may stand still before its cause is looked for
STALL_S = 10.0
#: the progress texts watched: a prompt's (``core.events.progress_words``: "Reading the
#: conversation… 0 of 44 tokens (0%)")
READING = re.compile(r"… [\d,]+ of [\d,]+ tokens \(\d+%\)")


class StallWatch(QObject):
    """Watches the status bar's progress (``busyChanged``) for a prompt that stands still."""

    def __init__(self, app_state: AppState, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.app_state = app_state
        self._shown: tuple[str, float | None] | None = None
        self._timer = QTimer(self, singleShot=True)
        self._timer.timeout.connect(self._stalled)
        app_state.busyChanged.connect(self._busy)

    def _busy(self, text: str | None, fraction: float | None) -> None:
        if text and READING.search(text) and " · slow: " not in text:
            if self._shown != (text, fraction):  # it moved (or began): wait again
                self._shown = (text, fraction)
                self._timer.start(int(STALL_S * 1000))
        elif not (text and " · slow: " in text):
            self._shown = None
            self._timer.stop()

    def _stalled(self) -> None:
        why = busy_processor()
        if self._shown is not None and why:
            text, fraction = self._shown
            self.app_state.busy(f"{text} · slow: {why}", fraction)
