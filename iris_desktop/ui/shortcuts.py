"""Help ▸ Keyboard shortcuts: every shortcut of the window, generated from the menu
bar's actions (so a shortcut added to a menu item is listed with no change here), and the
few keys that are not actions (the composer's, the chat list's, the transcript's)."""

from __future__ import annotations

from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QMenuBar,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

#: (where, keys, what they do) for the keys that no menu item carries
OTHER_KEYS = (
    ("Message box", "Enter", "Send the message"),
    ("Message box", "Shift+Enter", "Start a new line"),
    ("Message box", "Esc", "Stop the reply"),
    ("Chat list", "Delete", "Delete the chat under the cursor"),
    ("Chat list", "F2", "Rename the chat under the cursor"),
    ("Transcript", "Home", "Go to the first message"),
    ("Transcript", "End", "Go to the newest message"),
    ("Transcript", "Ctrl+Home", "Go to the first message (as Home)"),
    ("Transcript", "Ctrl+End", "Go to the newest message (as End)"),
    ("Transcript", "Enter", "Open the message's text to select part of it"),
    ("Transcript", "Shift+F10", "The message's actions: Regenerate, Edit, Continue, alternatives"),
    ("Transcript", "Menu", "The message's actions (as Shift+F10)"),
    ("Transcript", "Alt+Left", "The previous alternative of the message"),
    ("Transcript", "Alt+Right", "The next alternative of the message"),
    ("Transcript", "Esc", "Stop the reply"),
    ("Edit message", "Ctrl+Enter", "Send the edited message as a new version"),
)


def shortcut_rows(bar: QMenuBar) -> list[tuple[str, list[QKeySequence], str]]:
    """(where, keys, what they do) for every menu item with a shortcut, menu by menu,
    then the keys in :data:`OTHER_KEYS`."""
    rows: list[tuple[str, list[QKeySequence], str]] = []
    for top in bar.actions():
        menu = top.menu()
        if menu is None:
            continue
        where = top.text().replace("&", "")
        for action in menu.actions():
            keys = [k for k in action.shortcuts() if not k.isEmpty()]
            if keys and not action.isSeparator():
                rows.append((where, keys, action.text().replace("&", "").rstrip("…")))
    rows += [(where, [QKeySequence(keys)], what) for where, keys, what in OTHER_KEYS]
    return rows


def native(keys: list[QKeySequence]) -> str:
    """The keys as the platform writes them (⌘N on macOS, Ctrl+N elsewhere)."""
    return "  or  ".join(k.toString(QKeySequence.SequenceFormat.NativeText) for k in keys)


class ShortcutsDialog(QDialog):
    """A table of :func:`shortcut_rows`."""

    def __init__(self, bar: QMenuBar, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Keyboard shortcuts")
        self.setObjectName("shortcuts")
        self.rows = shortcut_rows(bar)
        self.table = QTableWidget(len(self.rows), 3)
        self.table.setTabKeyNavigation(False)  # Tab reaches Close
        self.table.setAccessibleName("Keyboard shortcuts")
        self.table.setHorizontalHeaderLabels(["Where", "Keys", "What it does"])
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        for row, (where, keys, what) in enumerate(self.rows):
            for column, value in enumerate((where, native(keys), what)):
                self.table.setItem(row, column, QTableWidgetItem(value))
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.table)
        layout.addWidget(buttons)
        fm = self.fontMetrics()
        self.resize(fm.horizontalAdvance("0") * 70, fm.height() * (len(self.rows) + 8))

    def keys(self) -> list[str]:
        """Every key listed, in the portable notation ("Ctrl+N")."""
        return [k.toString() for _, keys, _ in self.rows for k in keys]
