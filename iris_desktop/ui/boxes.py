"""A failure said in a message box, as the CLI says it, and shown as plain text.

Qt guesses whether a message box's text is HTML (``Qt.AutoText``): an error that quotes
a server's error page, a file name or a model name with tags in it was drawn as HTML, its
links clickable. These boxes show text as text, and a database or file error in the CLI's
sentence (a full disk named, with the file it could not write), not SQLite's own words.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from PySide6 import QtGui
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox, QWidget

from iris_desktop.core.store import explain


def plain_box(box: QMessageBox) -> QMessageBox:
    """``box`` with its text and informative text shown as plain text."""
    box.setTextFormat(Qt.TextFormat.PlainText)
    return box


def plain_tip(text: str) -> str:
    """``text`` for a tooltip, shown word for word (Qt draws a tooltip that looks like
    HTML as HTML)."""
    return QtGui.Qt.convertFromPlainText(text)


def warn(parent: QWidget | None, title: str, text: str) -> QMessageBox:
    """A warning with ``text`` as plain text, open over ``parent`` (not blocking)."""
    box = plain_box(QMessageBox(QMessageBox.Icon.Warning, title, text, parent=parent))
    box.setObjectName("failure")
    box.open()
    return box


def failure(exc: BaseException, db_path: Path) -> str:
    """What went wrong, in a sentence (capitalized): a database error as the CLI explains
    it, a file that could not be written or read with its name and the reason."""
    if isinstance(exc, sqlite3.Error):  # the DB thread says these already (Background)
        text = explain(exc, db_path)
    elif isinstance(exc, OSError) and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    else:
        text = str(exc)
    return text[:1].upper() + text[1:]


def export_failure(exc: BaseException, path: str, db_path: Path) -> str:
    """Why an export to ``path`` failed: the file that could not be written (not the
    temporary file beside it that failed first), or the history that could not be read."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"Nothing was exported: {path} could not be written ({exc.strerror}); choose another file."
    return f"Nothing was exported. {failure(exc, db_path)}."
