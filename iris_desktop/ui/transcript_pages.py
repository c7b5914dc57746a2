"""Reading the open chat into the transcript a page at a time (:mod:`iris_desktop.core.pages`).

Opening a chat reads its newest page (``PAGE_MESSAGES``); a turn's reload reads the turn
(``turn_delta.tail_since``). The pages before it are read on the DB thread when the user
scrolls near the top of what was read (before the rows run out: the next page is there
when they get to it), and put in front of the entries without moving the rows in view.
A message that is not read yet (a search hit, the alternative a branch switch shows,
Home: the chat's first message) is reached by reading the pages back to it in one job on
the DB thread (``pages_back_to``), put in front of the entries once.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QFontMetrics

from iris_desktop.core.pages import PAGE_MESSAGES, Page, older_page, pages_back_to, transcript_page
from iris_desktop.core.store import ThreadGone
from iris_desktop.core.turn_delta import Loaded
from iris_desktop.core.views import Entry
from iris_desktop.ui.transcript_model import PAGE

#: ``want`` for Home: the chat's first entry
TOP = "top"


class TranscriptPages(QObject):
    """The open chat's pages in ``control.view`` (a ThreadControl: ``app_state``,
    ``background``, ``states``)."""

    def __init__(self, control: Any):
        super().__init__(control)
        self.control = control
        self.view = control.view
        self.loaded: Loaded | None = None  # what the transcript shows (a turn reads its own)
        self.reading: tuple[int, int] | None = None  # (thread, below): a page being read
        self.want: str | None = None  # the key to show once read (a message, or TOP)
        #: (thread, message) a reload is to show once read: a reload asked for meanwhile
        #: (the chat list saw the branch a search hit switched to) shows it too; before,
        #: that newer job replaced the hit's and the chat opened at its end
        self.hit: tuple[int, int] | None = None
        self.view.verticalScrollBar().valueChanged.connect(self._scrolled)
        self.view.installEventFilter(self)

    def reload(self, message_id: int | None = None) -> None:
        """The open chat's entries again: its last turn's on, when its branch is as loaded,
        else its newest page; then ``message_id`` shown (read back to it) or the newest."""
        state, model = self.control.app_state, self.view.transcript
        tid = state.thread_id
        loaded = self.loaded  # (cleared since, as by a chat change, a reply streamed into
        # the emptied transcript meanwhile or not: its anchor is gone, so read it anew)
        loaded = loaded if loaded is not None and loaded.anchor is not None \
            and model.holds_message(loaded.anchor) else None
        if tid is None:
            return
        if message_id is None and self.hit is not None and self.hit[0] == tid:
            message_id = self.hit[1]
        self.hit = (tid, message_id) if message_id is not None else None

        def show(result: tuple[list[Entry], Loaded, bool, int]) -> None:
            if self.hit is not None and self.hit[0] == tid:
                self.hit = None  # shown, or left with its chat (New chat meanwhile): not later
            if tid != state.thread_id:
                return
            self.hit = None
            entries, self.loaded, whole, older = result
            self._with_states(entries)
            if whole:
                self.reading, self.want = None, None  # (a page asked for before: left)
                model.older = older  # (first: the reset's listeners see the whole count)
                model.set_entries(entries)
            else:
                model.merge_tail(loaded.anchor, entries)
            if message_id is not None:
                self.show_key(f"m:{message_id}")
            else:
                self.view.follow_bottom()

        def failed(_exc: BaseException) -> None:  # (a hit left pending took a later reload there)
            if self.hit is not None and self.hit[0] == tid:
                self.hit = None

        self.control.background.run(lambda store: transcript_page(store, tid, loaded), show,
                                    failed, key="transcript")

    def show_key(self, key: str) -> None:
        """Scroll to the entry ``key`` (TOP: the first), reading the pages back to it."""
        model = self.view.transcript
        if key == TOP and not model.older:
            self.view.go_top()
        elif key != TOP and key in model.keys():
            self.view.scroll_to_key(key)
        elif model.older:
            self.want = key
            self.read_older()

    def read_older(self) -> None:
        """Read the page before the entries (once at a time) and put it in front."""
        tid, model = self.control.app_state.thread_id, self.view.transcript
        below = model.first_message_id()
        if tid is None or below is None or not model.older or self.reading == (tid, below):
            return
        self.reading = (tid, below)

        def put(page: Page) -> None:
            if self.reading != (tid, below):
                return
            self.reading = None
            if tid != self.control.app_state.thread_id or model.first_message_id() != below:
                return  # another chat, or another branch's page, is shown by now
            self._with_states(page.entries)
            model.prepend(page.entries, page.older)
            want, self.want = self.want, None
            if want is not None and model.older and want != TOP and all(e.key != want for e in page.entries):
                self.want = want  # not in this page: the one before
                self.read_older()
            elif want is not None:
                self.show_key(want)
            elif self.view.verticalScrollBar().value() <= self._near():
                self.view._maybe_load_more(self.view.verticalScrollBar().value())

        def failed(exc: BaseException) -> None:
            if self.reading == (tid, below):
                self.reading, self.want = None, None
            if not isinstance(exc, ThreadGone):  # (a deleted chat: said as such elsewhere)
                self.control.app_state.show_message(f"Could not read the earlier messages: {exc}", 8000)

        want = self.want  # a message (or the first) far back: the pages to it in one job
        target = int(want[2:]) if want and want.startswith("m:") and want[2:].isdigit() else None
        self.control.background.run(
            (lambda store: older_page(store, tid, below, PAGE_MESSAGES)) if want is None
            else (lambda store: pages_back_to(store, tid, below, target)), put, failed)

    def _with_states(self, entries: list[Entry]) -> None:
        states = self.control.states
        for entry in entries:
            state = states.get(entry.message_id)
            if state is not None:
                entry.state = state

    def _near(self) -> int:
        return QFontMetrics(self.view.font()).height() * 3

    def _scrolled(self, value: int) -> None:
        """Scrolled near the top with few entries read above the rows: read the page
        before (``value``: where the user went; the view moves the bar after a reveal)."""
        model = self.view.transcript
        if model.older and model.hidden_above <= 2 * PAGE and value <= self._near():
            self.read_older()

    def eventFilter(self, watched, event) -> bool:
        """Home goes to the chat's first message: the pages before are read, then shown."""
        if (watched is self.view and event.type() == QEvent.Type.KeyPress
                and event.key() == Qt.Key.Key_Home and self.view.transcript.older
                and event.modifiers() & ~Qt.KeyboardModifier.KeypadModifier in (
                    Qt.KeyboardModifier.NoModifier, Qt.KeyboardModifier.ControlModifier)):
            self.show_key(TOP)
        return False
