"""The transcript's data: every entry of one thread (plain data from ``core.views``),
of which a window of at most ``MAX_ROWS`` is shown as rows: the newest ``PAGE`` at first;
scrolling to the top reveals older pages and, past ``MAX_ROWS``, lets the newest go
(scrolling down brings them back), so a 20,000-message chat never lays out more than a
few hundred rows. A long chat's entries are its newest page at first (``older``: the
branch's messages before them, not read yet); :mod:`.transcript_pages` puts the pages
before them in front as the user goes up. No painting here (``transcript_delegate``), no
widget (``transcript``).
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from PySide6.QtCore import QAbstractListModel, QModelIndex, Qt

from iris_desktop.core.views import ROLE_LABELS, Entry
from iris_desktop.ui.transcript_parts import badges, damage_note, damage_tooltip, stopped_empty

ENTRY_ROLE = Qt.ItemDataRole.UserRole + 1
PAGE = 40  # entries laid out at first (a few screens), and revealed per scroll to an edge
#: rows shown at most: every layout (a streamed token that adds a line, a resize) measures
#: each row, so the window slides rather than grows
MAX_ROWS = 5 * PAGE


class TranscriptModel(QAbstractListModel):
    """Entries of one thread; rows are those from ``offset`` to ``end``."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self._all: list[Entry] = []
        self._offset = 0
        self._end = 0
        self.expanded: set[str] = set()
        self._notices: list[tuple[int, Entry]] = []  # (anchor message id, entry)
        self._notice_seq = itertools.count(1)
        self._damage_told: set[int] = set()  # damaged messages the chat's note named
        self.older = 0  # the branch's messages before the entries, not read yet (pages)

    # -- Qt ------------------------------------------------------------------------------

    def rowCount(self, parent=QModelIndex()) -> int:  # noqa: B008 - Qt's signature
        return 0 if parent.isValid() else self._end - self._offset

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < self.rowCount():
            return None
        entry = self._all[self._offset + index.row()]
        if role == ENTRY_ROLE:
            return entry
        if role == Qt.ItemDataRole.DisplayRole:
            return entry.copy_text()
        if role == Qt.ItemDataRole.AccessibleTextRole:
            return spoken(entry)
        if role == Qt.ItemDataRole.ToolTipRole:
            return damage_tooltip(entry)
        return None

    # -- reading -------------------------------------------------------------------------

    @property
    def total(self) -> int:
        """Entries, and the messages of the branch not read yet (each counted as one)."""
        return len(self._all) + self.older

    @property
    def hidden_above(self) -> int:
        """Entries read that are above the rows shown."""
        return self._offset

    @property
    def has_older(self) -> bool:
        return self._offset > 0

    @property
    def has_newer(self) -> bool:
        """Newer entries are not rows now (the user went up a long way)."""
        return self._end < len(self._all)

    def entries(self) -> list[Entry]:
        return list(self._all)

    def keys(self) -> set[str]:
        return {entry.key for entry in self._all}

    def entry(self, row: int) -> Entry:
        return self._all[self._offset + row]

    def row_of(self, key: str) -> int | None:
        """The row of the entry ``key``; None when it is not a row now."""
        i = self._find(key)
        return i - self._offset if i is not None and self._offset <= i < self._end else None

    def _find(self, key: str) -> int | None:
        for i in range(len(self._all) - 1, -1, -1):
            if self._all[i].key == key:
                return i
        return None

    def holds_message(self, message_id: int) -> bool:
        """Whether ``message_id``'s entry is read (looked for from the newest back)."""
        return any(e.message_id == message_id for e in reversed(self._all))

    def first_message_id(self) -> int | None:
        return next((e.message_id for e in self._all if e.message_id is not None), None)

    def last_message_id(self) -> int:
        for entry in reversed(self._all):
            if entry.message_id is not None:
                return entry.message_id
        return 0

    # -- changing ------------------------------------------------------------------------

    def clear(self) -> None:
        self.beginResetModel()
        self._all, self._offset, self._end, self.older = [], 0, 0, 0
        self._notices.clear()
        self._damage_told.clear()
        self.expanded.clear()
        self.endResetModel()

    def set_entries(self, entries: list[Entry]) -> None:
        """Show ``entries`` (plus this session's notices). When the rows are the same
        ones as now (a reload after a turn), only changed rows repaint: no flicker.
        Messages found damaged on disk are named once, in a note (:meth:`_tell_damage`)."""
        merged = self._with_notices(entries)
        if [e.key for e in merged] == [e.key for e in self._all]:
            for i, (old, new) in enumerate(zip(self._all, merged)):
                if old != new:
                    self._all[i] = new
                    if self._offset <= i < self._end:
                        index = self.index(i - self._offset)
                        self.dataChanged.emit(index, index)
        else:
            self.beginResetModel()
            self._all = merged
            self._offset, self._end = max(0, len(merged) - PAGE), len(merged)
            self.endResetModel()
        self._tell_damage(self._all)

    def merge_tail(self, anchor: int, entries: list[Entry]) -> None:
        """Show ``entries``, the branch's messages from message ``anchor`` on (a turn's
        reload: the rows before it are the same), in place of the entries from it on: the
        rows already there (a streamed reply) change in place, new ones are added at the
        end; work and signals for the turn's rows only, not the whole chat's."""
        start = len(self._all)
        while start and (self._all[start - 1].kind == "notice"
                         or (self._all[start - 1].kind != "divider"
                             and (self._all[start - 1].message_id or 0) >= anchor)):
            start -= 1
        old = self._all[start:]
        keys = {e.key for e in old}
        merged = self._with_notices(entries, [n for n in self._notices if n[1].key in keys])
        if [e.key for e in merged[:len(old)]] != [e.key for e in old]:
            self.set_entries(self._all[:start] + merged)  # (rows gone: what set_entries does)
            return
        for i, (was, new) in enumerate(zip(old, merged), start):
            if was != new:
                self._all[i] = new
                if self._offset <= i < self._end:
                    self.dataChanged.emit(self.index(i - self._offset), self.index(i - self._offset))
        added = merged[len(old):]
        if added and self._end == len(self._all):
            self.beginInsertRows(QModelIndex(), self.rowCount(), self.rowCount() + len(added) - 1)
            self._all.extend(added)
            self._end += len(added)
            self.endInsertRows()
            self._drop(top=True)
        else:
            self._all.extend(added)
        self._tell_damage(merged)

    def prepend(self, entries: list[Entry], older: int) -> None:
        """Put ``entries``, the page of the branch before the entries, in front of them
        (not rows yet: scrolling up reveals them); ``older``: the messages before those."""
        self._all[:0] = entries
        self._offset += len(entries)
        self._end += len(entries)
        self.older = older
        self._tell_damage(entries, here=False)

    def _tell_damage(self, entries: list[Entry], here: bool = True) -> None:
        """A note, once while the chat is open, naming its messages found damaged on disk
        that no note named yet (each card has its badge): the user is told which, what
        it means and what can be done, without a box to dismiss. ``here`` False (a page
        read above the rows, the user reading there): the note goes at the end without
        moving the rows (``add_notice`` shows the newest page: the user was sent to the
        chat's end from the page being read)."""
        new = [e for e in entries if e.damaged and e.message_id not in self._damage_told]
        if not new:
            return
        self._damage_told.update(e.message_id for e in new)
        if here:
            self.add_notice(damage_note(new), error=False)
            return
        entry = Entry("notice", f"n:{next(self._notice_seq)}", text=damage_note(new),
                      role="notice", error=False)
        self._notices.append((self.last_message_id(), entry))
        if self._end == len(self._all):  # the rows reach the end: a row there (below the view)
            self.beginInsertRows(QModelIndex(), self.rowCount(), self.rowCount())
            self._all.append(entry)
            self._end += 1
            self.endInsertRows()
        else:
            self._all.append(entry)

    def show_span(self, start: int, end: int) -> None:
        """Show the entries from ``start`` to ``end`` (a jump: Home, End, a search hit)."""
        start, end = max(0, start), min(len(self._all), end)
        if (start, end) != (self._offset, self._end):
            self.beginResetModel()
            self._offset, self._end = start, end
            self.endResetModel()

    def show_newest(self) -> None:
        if self.has_newer:
            self.show_span(len(self._all) - PAGE, len(self._all))

    def _with_notices(self, entries: list[Entry],
                      notices: list[tuple[int, Entry]] | None = None) -> list[Entry]:
        """``entries`` with this session's notices (or ``notices``) in place. Notices among
        them (the rows given again up to a cut: Regenerate, Edit) are left out and put back
        once: before, each notice above the cut showed twice until the reply was saved."""
        notices = self._notices if notices is None else notices
        if not notices:
            return list(entries)
        entries = [entry for entry in entries if entry.kind != "notice"]
        out: list[Entry] = []
        pending = sorted(notices, key=lambda n: n[0])
        for entry in entries:
            while pending and entry.message_id is not None and pending[0][0] < entry.message_id:
                out.append(pending.pop(0)[1])
            out.append(entry)
        out.extend(n[1] for n in pending)
        return out

    def apply_states(self, states: dict[int, str]) -> None:
        """Set each message's state (verbatim | pruned | summarized | dropped). States that
        say which of them changed (``changed``: a turn's) visit the entries from the end
        back to the oldest changed one only."""
        changed = getattr(states, "changed", None)
        low = min(changed, default=None) if changed is not None else 0
        first = last = None
        for i in range(len(self._all) - 1, -1, -1) if low is not None else ():
            entry = self._all[i]
            if entry.message_id is not None and entry.message_id < low:
                break
            state = states.get(entry.message_id) if entry.message_id is not None else None
            if state is not None and state != entry.state:
                entry.state = state  # in place: a 5,000-entry thread changes thousands at once
                if self._offset <= i < self._end:
                    first = i if first is None else min(first, i)
                    last = i if last is None else max(last, i)
        if first is not None:
            self.dataChanged.emit(self.index(first - self._offset), self.index(last - self._offset))

    def append(self, entry: Entry) -> int:
        """Add ``entry`` as the newest row (the newest page is shown first, if it was not);
        its row."""
        self.show_newest()
        row = self.rowCount()
        self.beginInsertRows(QModelIndex(), row, row)
        self._all.append(entry)
        self._end += 1
        self.endInsertRows()
        self._drop(top=True)
        return self.rowCount() - 1

    def add_notice(self, text: str, error: bool = True) -> int:
        """A message of the app's own (an error, or a note: ``error`` False), kept in
        place across reloads."""
        entry = Entry("notice", f"n:{next(self._notice_seq)}", text=text, role="notice",
                      error=error)
        self._notices.append((self.last_message_id(), entry))
        return self.append(entry)

    def reword_notice(self, key: str, text: str) -> None:
        """Change the words of the notice ``key`` (across reloads too)."""
        self._notices = [(anchor, replace(entry, text=text) if entry.key == key else entry)
                         for anchor, entry in self._notices]
        self.change(key, text=text)

    def update(self, row: int, **changes) -> None:
        i = self._offset + row
        self._all[i] = replace(self._all[i], **changes)
        index = self.index(row)
        self.dataChanged.emit(index, index)

    def change(self, key: str, **changes) -> int | None:
        """Change the entry ``key``, a row or not (a reply streams on while the user reads
        the chat's start); its row, None when it is not one."""
        i = self._find(key)
        if i is None:
            return None
        row = self.row_of(key)
        if row is None:
            self._all[i] = replace(self._all[i], **changes)
        else:
            self.update(row, **changes)
        return row

    def append_text(self, key: str, text: str) -> int | None:
        """Add ``text`` to the entry ``key`` (a streamed reply); its row, or None."""
        i = self._find(key)
        return None if i is None else self.change(key, text=self._all[i].text + text)

    def toggle(self, key: str) -> None:
        self.expanded.symmetric_difference_update({key})

    def load_older(self, count: int = PAGE) -> int:
        """Reveal up to ``count`` older entries at the top, letting the newest rows go past
        ``MAX_ROWS``; returns how many were revealed."""
        count = min(count, self._offset)
        if count:
            self.beginInsertRows(QModelIndex(), 0, count - 1)
            self._offset -= count
            self.endInsertRows()
            self._drop(top=False)
        return count

    def load_newer(self, count: int = PAGE) -> tuple[int, list[Entry]]:
        """Reveal up to ``count`` newer entries at the bottom, letting the oldest rows go
        past ``MAX_ROWS``: (how many were revealed, the entries that left at the top)."""
        count = min(count, len(self._all) - self._end)
        if not count:
            return 0, []
        self.beginInsertRows(QModelIndex(), self.rowCount(), self.rowCount() + count - 1)
        self._end += count
        self.endInsertRows()
        return count, self._drop(top=True)

    def _drop(self, top: bool) -> list[Entry]:
        """Rows past ``MAX_ROWS`` leave, at the top or the bottom; the entries that left."""
        excess = self.rowCount() - MAX_ROWS
        if excess <= 0:
            return []
        first = 0 if top else self.rowCount() - excess
        gone = self._all[self._offset + first:self._offset + first + excess]
        self.beginRemoveRows(QModelIndex(), first, first + excess - 1)
        if top:
            self._offset += excess
        else:
            self._end -= excess
        self.endRemoveRows()
        return gone

    def reveal(self, key: str) -> int | None:
        """Make sure the entry ``key`` is a row (showing the page around it); its row."""
        i = next((i for i, entry in enumerate(self._all) if entry.key == key), None)
        if i is None:
            return None
        if not self._offset <= i < self._end:
            self.show_span(i - PAGE // 2, i + PAGE // 2)
        return i - self._offset


def spoken(entry: Entry) -> str:
    """What a screen reader reads for a row: who, what the badges say (stopped, failed,
    summarized, not sent…: they were only drawn), the whole text (a reply was cut at 500
    characters), and where there are alternatives, which one this is and how to switch
    (Alt+Left, Alt+Right). A divider reads its heading and how to expand it (it read
    "divider: ")."""
    if entry.kind == "divider":
        return f"{entry.title}. Shift+F10, Expand: the summary"
    who = (entry.speaker if entry.kind in ("message", "notice")
           else f"Tool {entry.tool_name}" if entry.kind == "tool" and entry.tool_name
           else ROLE_LABELS.get(entry.role, entry.kind))
    said = "; ".join(badge for badge, _tone in badges(entry) if badge != "generating…")
    text = f"{who}{f' ({said})' if said else ''}: {entry.text or stopped_empty(entry)}"
    if entry.branch is not None and entry.branch[1] > 1:
        text += f" (alternative {entry.branch[0]} of {entry.branch[1]}; Alt+Left, Alt+Right)"
    return text
