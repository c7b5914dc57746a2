"""The question before a shell command runs: the whole command, however long, in a box
that scrolls and wraps, so nothing of it is out of sight when Run is pressed.

Before (an audit), the command sat in a message box's text: ``echo hello`` + 3,000 spaces
+ ``; touch RAN`` asked for a box 22,330 px wide, clipped to the screen, showing only
"echo hello" beside Run; 120 line breaks before a second command pushed both buttons off
the screen. Now the command wraps anywhere, a run of blanks or of line breaks longer
than a glance is told by its length (a marked "3,000 spaces": the exact characters, told),
the box's size is bounded and fitted to the screen, and a line says how long the
command is and that a part of it is below when it does not fit."""

from __future__ import annotations

import html
import re

from PySide6.QtCore import QSize
from PySide6.QtGui import QFontDatabase, QTextOption
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QPushButton,
    QTextEdit,
    QVBoxLayout,
    QWidget,
)

from iris_desktop.ui.screen_fit import fit_to_screen
from iris_desktop.untrusted import show_untrusted

#: runs of spaces or tabs longer than this are shown by their length
BLANKS_SHOWN = 8
#: runs of line breaks longer than this are shown by their length
LINE_BREAKS_SHOWN = 2

_BLANKS = re.compile(rf"[ \t]{{{BLANKS_SHOWN + 1},}}")
_BREAKS = re.compile(rf"\n{{{LINE_BREAKS_SHOWN + 1},}}")


#: how a run told by its length looks: marked, so it never reads as the command's own text
_TOLD = ('<span style="background-color:#fde68a; color:#1f2937; font-style:italic">'
         '&nbsp;{}&nbsp;</span>')


def shown_command(command: str) -> str:
    """``command`` as the question shows it (HTML for a box that keeps blanks and line
    breaks): every invisible or reordering character as an escape (``show_untrusted``),
    and long runs of blanks or line breaks told by their length, marked, so a part hidden
    after them is in sight."""
    def blanks(match: re.Match) -> str:
        run = match.group()
        what = ("spaces" if set(run) == {" "} else "tabs" if set(run) == {"\t"}
                else "spaces and tabs")
        return "\0" + f"{len(run):,} {what}" + "\1"

    text = _BLANKS.sub(blanks, show_untrusted(command, multiline=True))
    text = _BREAKS.sub(lambda m: "\n\0" + f"{len(m.group()):,} line breaks" + "\1\n", text)
    # (NUL and SOH cannot be in the text here: show_untrusted made every control an escape)
    text = html.escape(text).replace("\0", _TOLD.split("{}")[0]).replace("\1", _TOLD.split("{}")[1])
    return f'<div style="white-space: pre-wrap">{text}</div>'


class ShellConfirm(QDialog):
    """Run / Don't run for one command; Don't run is the default and Escape's answer.
    ``answered(bool)`` through ``finished``: :attr:`approved` once closed."""

    def __init__(self, command: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("shell-confirm")
        self.setWindowTitle("Run a shell command?")
        self.setModal(True)
        self.approved = False
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("Iris wants to run this command on your computer:", self))
        self.command_view = QTextEdit(self)
        self.command_view.setReadOnly(True)
        self.command_view.setHtml(shown_command(command))
        self.command_view.setWordWrapMode(QTextOption.WrapMode.WrapAnywhere)
        self.command_view.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.command_view.setAccessibleName("The command to run")
        layout.addWidget(self.command_view, 1)
        lines = command.count("\n") + 1
        self.size_label = QLabel(
            f"{len(command):,} characters on {lines:,} line{'s' if lines != 1 else ''}. "
            "It runs only if you choose Run.", self)
        self.size_label.setWordWrap(True)
        layout.addWidget(self.size_label)
        buttons = QDialogButtonBox(self)
        self.run_button: QPushButton = buttons.addButton("Run", QDialogButtonBox.ButtonRole.AcceptRole)
        self.deny_button: QPushButton = buttons.addButton("Don't run",
                                                          QDialogButtonBox.ButtonRole.RejectRole)
        self.run_button.setAutoDefault(False)
        self.deny_button.setDefault(True)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        metrics = self.command_view.fontMetrics()  # about 84 columns and 14 lines of it
        fit_to_screen(self, self.sizeHint().expandedTo(
            QSize(metrics.horizontalAdvance("x") * 84, metrics.lineSpacing() * 14)))
        self.deny_button.setFocus()

    def accept(self) -> None:
        self.approved = True
        super().accept()

    def showEvent(self, event) -> None:
        super().showEvent(event)
        bar = self.command_view.verticalScrollBar()
        if bar.maximum() > 0:  # more below than the box shows: said, beside the length
            self.size_label.setText(self.size_label.text().replace(
                "It runs only", "Scroll to read all of it; it runs only"))

    def command_text(self) -> str:
        """What the box shows."""
        return self.command_view.toPlainText()
