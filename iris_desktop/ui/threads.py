"""The left panel: "New chat", the search box and the thread list (or search results)."""

from __future__ import annotations

import html
import time
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from PySide6.QtCore import QEvent, QItemSelectionModel, Qt, QTimer, Signal
from PySide6.QtGui import QKeySequence, QPainter, QShortcut
from PySide6.QtWidgets import (
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from iris_desktop.ui.chat_dates import DATE_ROLE, DatedDelegate, full_day, list_day
from iris_desktop.ui.search_marks import MARKED_ROLE, marked_line
from iris_desktop.untrusted import show_directional

THREAD_ROLE = Qt.ItemDataRole.UserRole + 1
MESSAGE_ROLE = Qt.ItemDataRole.UserRole + 2
TITLE_ROLE = Qt.ItemDataRole.UserRole + 3  # as stored: shown with show_directional
#: what the empty list says (a newcomer's first look at the panel)
NO_CHATS = ("No chats yet.\n\nType a message below to start one, or bring chats from "
            "ChatGPT, Claude, Open WebUI, LM Studio, Jan, LibreChat, SillyTavern and other "
            "chat apps with File ▸ Import conversation…")


def told_apart(threads: list[dict[str, Any]], now: float | None = None) -> dict[int, str]:
    """A second line for each chat whose title another listed chat has too, by id: when it
    was last written to (two "Python help" rows read as one chat listed twice); its
    messages too where that is the same, and its number where even those are. A title of
    its own gets none: the list stays one line a chat."""
    by_title: dict[str, list[dict[str, Any]]] = {}
    for thread in threads:  # (spaces the list does not show do not tell them apart)
        by_title.setdefault(" ".join(str(thread["title"]).split()), []).append(thread)
    lines: dict[int, str] = {}
    for same in (group for group in by_title.values() if len(group) > 1):
        for thread in same:
            lines[thread["id"]] = _when(thread.get("updated_at"), now)
        for more in (_messages, lambda thread: f"chat #{thread['id']}"):
            said = Counter(lines[t["id"]] for t in same)  # (not list.count: 3,000 took 0.2 s)
            for thread in same:
                if said[lines[thread["id"]]] > 1:
                    lines[thread["id"]] = ", ".join(filter(None, (lines[thread["id"]], more(thread))))
    return lines


def _when(stamp: float | None, now: float | None = None) -> str:
    """'today 14:05', 'yesterday 09:30', '7 Dec 14:05', '7 Dec 2024 14:05' (local time)."""
    if not stamp:
        return ""
    try:
        day = datetime.fromtimestamp(stamp)
    except (ValueError, OverflowError, OSError):  # (year 0: one such chat emptied the list)
        return ""
    today = datetime.fromtimestamp(time.time() if now is None else now).date()
    clock = day.strftime("%H:%M")
    if day.date() == today:
        return f"today {clock}"
    if day.date() == today - timedelta(days=1):
        return f"yesterday {clock}"
    year = "" if day.year == today.year else f" {day.year}"
    return f"{day.day} {day.strftime('%b')}{year} {clock}"


def _messages(thread: dict[str, Any]) -> str:
    count = thread.get("branch_messages", thread.get("messages")) or 0
    return f"{count:,} message{'' if count == 1 else 's'}"


class _ChatList(QListWidget):
    """The list, which says what to do while it is empty (drawn, not an item: the list's
    items are chats only)."""

    placeholder = ""

    def paintEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().paintEvent(event)
        if self.count() or not self.placeholder:
            return
        painter = QPainter(self.viewport())
        painter.setPen(self.palette().placeholderText().color())
        area = self.viewport().rect().adjusted(8, 8, -8, -8)
        painter.drawText(area, int(Qt.AlignmentFlag.AlignTop | Qt.TextFlag.TextWordWrap), self.placeholder)


class ThreadPanel(QWidget):
    newChat = Signal()
    threadChosen = Signal(int, object)  # thread id, message id to show (or None)
    searchChanged = Signal(str)  # debounced; '' = show all threads
    renameRequested = Signal(int, str)
    deleteRequested = Signal(int, str)
    settingsRequested = Signal(int)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.new_button = QPushButton("New chat", self)
        self.new_button.setToolTip("Start a new conversation (Ctrl+N)")
        self.search = QLineEdit(self)
        self.search.setPlaceholderText("Search titles and messages (Ctrl+F)")
        self.search.setClearButtonEnabled(True)
        self.list = _ChatList(self)
        self.list.placeholder = NO_CHATS
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.setWordWrap(True)
        self.list.setItemDelegate(DatedDelegate(self.list))  # (its date at the right)
        self.list.setUniformItemSizes(False)
        # what a screen reader says for each (the Tab order is the layout's: new, search, list)
        self.new_button.setAccessibleName("New chat")
        self.search.setAccessibleName("Search chats")
        self.search.setAccessibleDescription("Finds titles and messages; Enter opens the "
                                             "first result, Down goes to the results, "
                                             "Escape clears the search")
        self.list.setAccessibleName("Chats")
        self.list.setAccessibleDescription("Enter opens a chat, F2 renames it, Delete deletes it")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 0, 6)
        layout.addWidget(self.new_button)
        layout.addWidget(self.search)
        layout.addWidget(self.list, 1)
        self.current_id: int | None = None
        self._apart: dict[int, str] = {}  # the list's second lines (told_apart), for results
        self._debounce = QTimer(self, singleShot=True, interval=200)
        self._debounce.timeout.connect(lambda: self.searchChanged.emit(self.query()))
        self.search.textChanged.connect(self._debounce.start)
        self._open_first = False  # Enter before the results came: the first opens then
        self.search.installEventFilter(self)  # Enter, Down, Escape (they did nothing)
        self.new_button.clicked.connect(self.newChat)
        self.list.itemActivated.connect(self._chosen)
        self.list.itemClicked.connect(self._chosen)
        self.list.customContextMenuRequested.connect(self._menu)
        # the keys every file manager and chat list has, while the list has the focus
        for key, signal in ((QKeySequence.StandardKey.Delete, self.deleteRequested),
                            (QKeySequence(Qt.Key.Key_F2), self.renameRequested)):
            shortcut = QShortcut(QKeySequence(key), self.list)
            shortcut.setContext(Qt.ShortcutContext.WidgetShortcut)
            shortcut.activated.connect(lambda signal=signal: self._on_current(signal))

    def query(self) -> str:
        return self.search.text().strip()

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 (Qt's name)
        """In the search box: Enter opens the first result (once they come, when typed
        just now), Down goes to the results, Escape clears a search (and, with none,
        does what it does elsewhere)."""
        if watched is not self.search or event.type() not in (QEvent.Type.KeyPress,
                                                               QEvent.Type.ShortcutOverride):
            return super().eventFilter(watched, event)
        key = event.key()
        if key == Qt.Key.Key_Escape and self.search.text():
            if event.type() == QEvent.Type.KeyPress:
                self.search.clear()
            event.accept()  # (an override accepted: the key comes here, not to a shortcut)
            return event.type() == QEvent.Type.KeyPress
        if event.type() != QEvent.Type.KeyPress or not self.query():
            return False
        if key in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            if self._debounce.isActive():  # the results are not those of what is typed yet
                self._debounce.stop()
                self._open_first = True
                self.searchChanged.emit(self.query())
            else:
                self._choose_first()
            return True
        if key == Qt.Key.Key_Down and self._first() is not None:
            self.list.setCurrentItem(self._first())
            self.list.setFocus(Qt.FocusReason.TabFocusReason)
            return True
        return False

    def _first(self) -> QListWidgetItem | None:
        return next((self.list.item(i) for i in range(self.list.count())
                     if self.list.item(i).data(THREAD_ROLE) is not None), None)

    def _choose_first(self) -> None:
        first = self._first()
        if first is not None:
            self.list.setCurrentItem(first)
            self._chosen(first)

    def show_threads(self, threads: list[dict[str, Any]]) -> None:
        if self.query():
            return  # search results stay until the search is cleared
        cursor = self.list.currentItem()  # the keyboard's place (F2 on another chat)
        cursor = cursor.data(THREAD_ROLE) if cursor is not None and self.list.hasFocus() else None
        self.list.clear()
        apart = self._apart = told_apart(threads)
        for thread in threads:
            title = show_directional(thread["title"])
            item = QListWidgetItem(f"{title}\n   {apart[thread['id']]}" if thread["id"] in apart else title)
            shown, stored = thread.get("branch_messages", thread["messages"]), thread["messages"]
            when = full_day(thread.get("updated_at"))  # the time the list is ordered by
            item.setToolTip(f"{title}\n" + (f"Last written to {when}\n" if when else "")
                            + f"{shown:,} messages" + (
                f" on the branch shown, {stored:,} with its other branches" if shown != stored else ""))
            if thread["id"] not in apart:  # (its second line says when, to the minute)
                item.setData(DATE_ROLE, list_day(thread.get("updated_at")))
            item.setData(TITLE_ROLE, thread["title"])
            item.setData(THREAD_ROLE, thread["id"])
            self.list.addItem(item)
            if thread["id"] == self.current_id:
                item.setSelected(True)
                self.list.setCurrentItem(item)
        for row in range(self.list.count()):  # it stays there (it jumped to the open chat)
            if cursor not in (None, self.current_id) and self.list.item(row).data(THREAD_ROLE) == cursor:
                self.list.setCurrentItem(self.list.item(row), QItemSelectionModel.SelectionFlag.NoUpdate)

    def show_results(self, query: str, rows: list[dict[str, Any]]) -> None:
        if query != self.query():
            return
        opening, self._open_first = self._open_first, False
        self.list.clear()
        if not rows:
            item = QListWidgetItem(f"No match for “{query}”")
            item.setFlags(Qt.ItemFlag.NoItemFlags)
            self.list.addItem(item)
        before = None  # a chat's further hits under its first: its title said once
        for row in rows:
            tid = row["thread_id"]
            title = show_directional(" ".join(str(row["title"]).split()))
            words = self._apart.get(tid)  # (two chats of one title: as the list tells them apart)
            item = QListWidgetItem(f"{title}\n   {words}" if words else title)
            title += f" · {words}" if words else ""
            item.setToolTip(title)
            if row.get("message_id") is not None:  # the found words in bold (search_marks)
                snippet, rich = marked_line(row.get("text") or "", row.get("marks") or [])
                head, rich_head = ("", "") if before == tid else (f"{title}\n", f"{html.escape(title)}<br>")
                item.setText(f"{head}   {snippet}")
                item.setData(MARKED_ROLE, f"{rich_head}&nbsp;&nbsp;&nbsp;{rich}")
                item.setData(Qt.ItemDataRole.AccessibleTextRole, f"{title}: {snippet}")
                item.setToolTip(f"{title}\n{snippet}")
            before = tid if row.get("message_id") is not None else None
            item.setData(TITLE_ROLE, row["title"])
            item.setData(THREAD_ROLE, tid)
            item.setData(MESSAGE_ROLE, row.get("message_id"))
            self.list.addItem(item)
        if opening:
            self._choose_first()

    def select(self, thread_id: int | None) -> None:
        self.current_id = thread_id
        for i in range(self.list.count()):
            item = self.list.item(i)
            if item.data(THREAD_ROLE) == thread_id and item.data(MESSAGE_ROLE) is None:
                self.list.setCurrentItem(item)
                return
        self.list.clearSelection()

    def _chosen(self, item: QListWidgetItem) -> None:
        thread_id = item.data(THREAD_ROLE)
        if thread_id is not None:
            self.threadChosen.emit(int(thread_id), item.data(MESSAGE_ROLE))

    def _on_current(self, signal) -> None:
        """Emit ``signal`` (rename or delete) for the thread under the list's cursor."""
        item = self.list.currentItem()
        if item is not None and item.data(THREAD_ROLE) is not None:
            signal.emit(int(item.data(THREAD_ROLE)), item.data(TITLE_ROLE))

    def _menu(self, pos) -> None:
        item = self.list.itemAt(pos)
        if item is None or item.data(THREAD_ROLE) is None:
            return
        thread_id = int(item.data(THREAD_ROLE))
        title = item.data(TITLE_ROLE)
        menu = QMenu(self)
        menu.addAction("Rename…", lambda: self.renameRequested.emit(thread_id, title))
        menu.addAction("Chat settings…", lambda: self.settingsRequested.emit(thread_id))
        menu.addAction("Delete…", lambda: self.deleteRequested.emit(thread_id, title))
        menu.exec(self.list.viewport().mapToGlobal(pos))
