"""A failure said in a message box, as the CLI says it, or a question asked in one,
shown as plain text.

Qt guesses whether a message box's text is HTML (``Qt.AutoText``): an error that quotes
a server's error page, a file name or a model name with tags in it was drawn as HTML, its
links clickable. These boxes show text as text (a bidi override in a chat's title or a
server's message as an escape: the box says what is stored, :mod:`iris_desktop.untrusted`),
and a file error in the CLI's sentence (the file it could not write, and why).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6 import QtGui
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox, QWidget

from iris_desktop.untrusted import show_directional


def plain_box(box: QMessageBox) -> QMessageBox:
    """``box`` with its text and informative text shown as plain text."""
    box.setTextFormat(Qt.TextFormat.PlainText)
    box.setText(show_directional(box.text()))
    box.setInformativeText(show_directional(box.informativeText()))
    return box


def plain_tip(text: str) -> str:
    """``text`` for a tooltip, shown word for word (Qt draws a tooltip that looks like
    HTML as HTML)."""
    return QtGui.Qt.convertFromPlainText(show_directional(text))


def warn(parent: QWidget | None, title: str, text: str) -> QMessageBox:
    """A warning with ``text`` as plain text, open over ``parent`` (not blocking)."""
    box = plain_box(QMessageBox(QMessageBox.Icon.Warning, title, text, parent=parent))
    box.setObjectName("failure")
    box.open()
    return box


def ask(parent: QWidget | None, title: str, text: str, answers: tuple[str, str],
        on_yes: Callable[[], Any], name: str, detail: str = "") -> QMessageBox:
    """A question with ``text`` (and ``detail`` below it) as plain text, open over
    ``parent`` (not blocking), with two buttons, ``answers``: (yes, no). ``on_yes`` runs on
    yes; no, the default and Escape, changes nothing."""
    box = QMessageBox(QMessageBox.Icon.Question, title, text, parent=parent)
    box.setInformativeText(detail)
    box = plain_box(box)
    box.setObjectName(name)
    yes = box.addButton(answers[0], QMessageBox.ButtonRole.AcceptRole)
    no = box.addButton(answers[1], QMessageBox.ButtonRole.RejectRole)
    box.setDefaultButton(no)
    box.setEscapeButton(no)
    box.finished.connect(lambda _: box.clickedButton() is yes and on_yes())
    box.finished.connect(box.deleteLater)  # and what ``on_yes`` holds with it
    box.open()
    return box


def failure(exc: BaseException) -> str:
    """What went wrong, in a sentence (capitalized): a file that could not be written or
    read with its name and the reason; a database error comes already said in the CLI's
    words (``Background`` explains it on the DB thread)."""
    if isinstance(exc, OSError) and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    else:
        text = str(exc)
    return text[:1].upper() + text[1:]


def whole_sentence(text: str) -> str:
    """``text`` capitalized and ended by a full stop, unless it ends in one already (or in
    "?" or "!")."""
    return text[:1].upper() + text[1:] + ("" if text.endswith((".", "?", "!")) else ".")


def export_failure(exc: BaseException, path: str) -> str:
    """Why an export to ``path`` failed: the file that could not be written (not the
    temporary file beside it that failed first), or the history that could not be read."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"Nothing was exported: {path} could not be written ({exc.strerror}); choose another file."
    return f"Nothing was exported. {failure(exc)}."
