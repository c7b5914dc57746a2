"""The composer: Enter sends, Shift+Enter is a newline, Esc stops; Send becomes Stop.
Files dropped on it (or chosen with Attach…) go with the message, one chip each."""

from __future__ import annotations

import os

from PySide6.QtCore import QEvent, QRect, Qt, QTimer, Signal
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from iris_desktop.core.attachments import Attachment, model_text
from iris_desktop.core.engine import certainly_too_large
from iris_desktop.core.store import utf8_length
from iris_desktop.untrusted import show_untrusted

#: the message box is never narrower than this many pixels, nor 20 characters: the chat
#: list and the inspector give way first (at 800×600 it was left 120 px, a few words a line)
MIN_WIDTH = 290
TOKENS_TIP = "Tokens of the draft, counted by the context engine"


def too_large_words(needed: int, allowed: int, files: bool) -> str:
    """Why a draft cannot be sent, and what to do, in one sentence (Send's tooltip, the
    status bar on Enter). An attached file counts as the text does: attaching the text
    instead would not make it fit."""
    what = "the message or its attached files" if files else "the message"
    return (f"Too large to send: at least {needed:,} tokens, and {allowed:,} fit in this chat; "
            f"shorten {what}, or choose a larger context window in Preferences (Ctrl+,).")


def dropped_files(mime) -> list[str]:
    """The local files of a drag, if it carries any."""
    if mime is None or not mime.hasUrls():
        return []
    return [u.toLocalFile() for u in mime.urls() if u.isLocalFile()]


class ComposerEdit(QPlainTextEdit):
    submitted = Signal()
    stopRequested = Signal()
    filesDropped = Signal(list)  # local paths

    def dragEnterEvent(self, event) -> None:
        if dropped_files(event.mimeData()):
            event.acceptProposedAction()
            return
        super().dragEnterEvent(event)

    def dragMoveEvent(self, event) -> None:
        if dropped_files(event.mimeData()):
            event.acceptProposedAction()
            return
        super().dragMoveEvent(event)

    def dropEvent(self, event) -> None:
        files = dropped_files(event.mimeData())
        if files:  # attached, not pasted in as file:// text
            event.acceptProposedAction()
            self.filesDropped.emit(files)
            return
        super().dropEvent(event)

    def keyPressEvent(self, event) -> None:
        key = event.key()
        if key in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            if event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
                self.insertPlainText("\n")
            else:
                self.submitted.emit()
            return
        if key == Qt.Key.Key_Escape:
            self.stopRequested.emit()
            return
        super().keyPressEvent(event)


class Composer(QWidget):
    """The draft box, the Send/Stop button, the draft's live token count, and the files
    attached to the draft (``attachments``; chips with their tokens above the box)."""

    sendRequested = Signal(str)
    stopRequested = Signal()
    draftChanged = Signal(str)  # debounced
    #: files to attach: paths dropped or chosen (the window reads and checks them)
    attachRequested = Signal(list)
    attachmentsChanged = Signal()
    #: Enter while the box cannot send (no model, one loading): why, to show and say
    refused = Signal(str)
    #: the model became ready with a draft in the box: a sentence for the status bar
    ready = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.edit = ComposerEdit(self)
        #: the box's text, and the draft as the model reads it: read once per change (a
        #: 5 MB draft was copied out several times a keystroke, by each that showed it)
        self._text: str | None = None
        self._model: tuple[str, tuple[Attachment, ...], str] | None = None
        self.edit.document().contentsChange.connect(self._forget_text)
        self.edit.textChanged.connect(self._forget_text)
        self.edit.setPlaceholderText("Message Iris  (Enter to send, Shift+Enter for a new line)")
        self.edit.setTabChangesFocus(True)
        self._line = QFontMetrics(self.edit.font()).lineSpacing()
        self._fit_height()
        self.button = QPushButton("Send", self)
        self.button.setDefault(True)
        self.tokens = QLabel("Draft: 0 tokens", self)
        self.tokens.setToolTip(TOKENS_TIP)
        # under the box, where it may wrap: beside it, "Draft: too large (at least 40,512
        # tokens; 5,709 fit)" widened the buttons' column and left the box 120 px at 800×600
        self.tokens.setWordWrap(True)
        self.attach_button = QPushButton("Attach…", self)
        self.attach_button.setToolTip("Attach text files (or drop them here): plain text, "
                                      "Markdown, source code, CSV, JSON")
        self.attach_button.clicked.connect(self.choose_files)
        self.edit.setAccessibleName("Message")
        self.edit.setAccessibleDescription("Enter sends, Shift+Enter starts a new line, "
                                           "Esc stops the reply")
        self.button.setAccessibleName("Send")
        self.attach_button.setAccessibleName("Attach files")
        self.tokens.setAccessibleName("Draft size")
        self.generating = False
        self._can_send = True
        self._why_not = ""  # why it cannot send (``set_can_send``)
        #: why this draft cannot be sent: the engine found it too large for the window
        #: (``set_draft_tokens``); '' when it fits or is not counted yet
        self._too_large = ""
        self.attachments: list[Attachment] = []
        self._chip_tokens: list[int | None] = []
        #: where each file was read from, where known (not for a draft read back)
        self._paths: list[str | None] = []
        self._requested: list[str] = []  # paths asked for, until the files read come
        self.chips = QHBoxLayout()
        self.chips.setContentsMargins(0, 0, 0, 0)
        self.chips.addStretch(1)
        chips = QWidget(self)
        chips.setLayout(self.chips)
        chips.setVisible(False)

        side = QVBoxLayout()
        side.addWidget(self.button)
        side.addWidget(self.attach_button)
        side.addStretch(1)
        box = QVBoxLayout()
        box.addWidget(chips)
        box.addWidget(self.edit, 1)
        box.addWidget(self.tokens)
        row = QHBoxLayout(self)
        row.setContentsMargins(8, 4, 8, 6)
        row.addLayout(box, 1)
        row.addLayout(side)
        self.setAcceptDrops(True)
        self.edit.filesDropped.connect(self.attachRequested)
        self.attachRequested.connect(self._asked)

        self._debounce = QTimer(self, singleShot=True, interval=150)
        self._debounce.timeout.connect(lambda: self.draftChanged.emit(self.text()))
        self.edit.textChanged.connect(self._debounce.start)
        self.edit.textChanged.connect(self._fit_height)
        self.edit.textChanged.connect(self._draft_edited)
        self.edit.submitted.connect(self._submit)
        self.edit.stopRequested.connect(self.stopRequested)
        self.button.clicked.connect(self._clicked)

    def changeEvent(self, event) -> None:
        if event.type() == QEvent.Type.FontChange:  # ui.font_size applied live
            self._line = QFontMetrics(self.edit.font()).lineSpacing()
            self._fit_height()
        super().changeEvent(event)

    def _fit_height(self) -> None:
        """Grow with the draft from 2 to 8 lines, then scroll; empty, as many lines as the
        placeholder takes at this width (at 18 pt it was cut in half). Never narrower
        than :data:`MIN_WIDTH` or 20 characters (the panels beside give way first)."""
        edit, doc = self.edit, self.edit.document()
        if edit.minimumWidth() != (least := max(edit.fontMetrics().averageCharWidth() * 20, MIN_WIDTH)):
            edit.setMinimumWidth(least)
        lines = 8 if doc.blockCount() >= 8 else doc.lineCount()  # (8 lines at most)
        if not doc.characterCount() > 1 and edit.placeholderText():
            width = max(edit.viewport().width() - 2 * int(edit.document().documentMargin()), 1)
            needed = edit.fontMetrics().boundingRect(
                QRect(0, 0, width, 100_000), Qt.TextFlag.TextWordWrap, edit.placeholderText())
            lines = -(-needed.height() // max(self._line, 1))
        height = max(2, min(8, lines)) * self._line + 2 * int(edit.frameWidth()) + 10
        if (edit.minimumHeight(), edit.maximumHeight()) != (height, height):  # else not
            edit.setFixedHeight(height)  # set again: in a 5 MB draft that took 0.3 s a key

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if not self.edit.document().characterCount() > 1:
            self._fit_height()  # the placeholder wraps anew

    def _forget_text(self, *_change) -> None:
        self._text = None

    def _draft_edited(self) -> None:
        """The draft changed: whether it fits is not known until it is counted again
        (Send is not held back on a guess)."""
        if self._too_large:
            self._too_large = ""
            self._update_enabled()

    def text(self) -> str:
        if self._text is None:
            self._text = self.edit.toPlainText()
        return self._text

    def model_draft(self) -> str:
        """The draft as the model would read it: the text, then each attached file (what
        the meter counts); made again only when either changed."""
        text, files = self.text(), tuple(self.attachments)
        if self._model is None or self._model[0] is not text or self._model[1] != files:
            self._model = (text, files, model_text(text, files))
        return self._model[2]

    def too_large(self, params) -> bool:
        """The draft is certainly too large for any request of ``params``' window: the
        model refuses it before it is stored, by this same check (so a send keeps it here)."""
        return certainly_too_large(params, utf8_length(self.model_draft().strip())) is not None

    # -- attachments --

    def choose_files(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(
            self, "Attach files", "", "Text files (*.txt *.md *.csv *.json *.py *.js *.ts *.html "
            "*.css *.c *.h *.cpp *.rs *.go *.java *.sh *.toml *.yaml *.yml *.xml *.log);;All files (*)")
        if paths:
            self.attachRequested.emit(paths)

    def _asked(self, paths: list[str]) -> None:
        self._requested = [os.path.abspath(p) for p in paths]

    def add_attachments(self, attachments: list[Attachment]) -> None:
        """Attach files that were read and checked. The same file again (read from the same
        place, or the same name and text) replaces it; another of the same name is kept
        beside it, both sent as the CLI sends them (before, it took the other's place
        unsaid: two README.md from two folders sent one)."""
        asked, self._requested = self._requested, []
        for attachment in attachments:
            path = next((p for p in asked if os.path.basename(p) == attachment.name), None)
            if path is not None:
                asked.remove(path)
            for i, old in enumerate(self.attachments):
                if old == attachment or (path is not None and self._paths[i] == path):
                    del self.attachments[i], self._chip_tokens[i], self._paths[i]
                    break
            self.attachments.append(attachment)
            self._chip_tokens.append(None)
            self._paths.append(path)
        self._changed()

    def set_attachments(self, attachments: list[Attachment]) -> None:
        """The draft's files are ``attachments`` (another chat's draft is shown)."""
        if attachments or self.attachments:
            self.attachments, self._chip_tokens = list(attachments), [None] * len(attachments)
            self._paths = [None] * len(attachments)
            self._changed()

    def remove_attachment(self, index: int) -> None:
        if 0 <= index < len(self.attachments):
            del self.attachments[index], self._chip_tokens[index], self._paths[index]
            self._changed()

    def chip_names(self) -> list[str]:
        """Each file's name as its chip shows it: invisible and reordering characters as
        escapes (``evil\u202etxt.exe`` drew as "evilexe.txt"); files of the same name told
        apart by their folder, or else their order ("README.md (b)", "README.md (2)")."""
        names = [a.name for a in self.attachments]
        folders = [os.path.basename(os.path.dirname(p)) if p else "" for p in self._paths]
        shown = []
        for i, name in enumerate(names):
            label = show_untrusted(name)
            same = [f for n, f in zip(names, folders) if n == name]
            if len(same) > 1:
                tag = folders[i] if folders[i] and same.count(folders[i]) == 1 else \
                    str(names[:i + 1].count(name))
                label += f" ({show_untrusted(tag)})"
            shown.append(label)
        return shown

    def set_attachment_tokens(self, tokens: list[int]) -> None:
        """Each chip's size in tokens, as the engine counts it."""
        if len(tokens) == len(self.attachments):
            self._chip_tokens = list(tokens)
            self._draw_chips()

    def _changed(self) -> None:
        self._draft_edited()
        self._draw_chips()
        self.attachmentsChanged.emit()
        self._debounce.start()

    def _draw_chips(self) -> None:
        while self.chips.count() > 1:  # the stretch stays last
            item = self.chips.takeAt(0)
            if item.widget() is not None:
                item.widget().deleteLater()
        names = self.chip_names()
        for i, (attachment, tokens) in enumerate(zip(self.attachments, self._chip_tokens)):
            size = f"{tokens:,} tokens" if tokens is not None else f"{attachment.size:,} bytes"
            chip = QToolButton(self)
            chip.setObjectName("attachment-chip")
            chip.setText(f"{names[i]} · {size}  ✕")
            read_as = f" ({attachment.read_as})" if attachment.read_as else ""  # (Windows-1252)
            chip.setToolTip(f"{names[i]}: {attachment.size:,} bytes{read_as}, sent with the "
                            "message. Click to remove it.")
            chip.clicked.connect(lambda _=False, i=i: self.remove_attachment(i))
            chip.setAccessibleName(f"Remove the attached file {names[i]} ({size})")
            self.chips.insertWidget(i, chip)
            QWidget.setTabOrder(self.edit if i == 0 else self.chips.itemAt(i - 1).widget(), chip)
        if self.attachments:  # Tab: the message, its files, then Send
            QWidget.setTabOrder(self.chips.itemAt(len(self.attachments) - 1).widget(), self.button)
        self.chips.parentWidget().setVisible(bool(self.attachments))

    def dragEnterEvent(self, event) -> None:
        if dropped_files(event.mimeData()):
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:
        files = dropped_files(event.mimeData())
        if files:
            event.acceptProposedAction()
            self.attachRequested.emit(files)

    def set_text(self, text: str) -> None:
        self.edit.setPlainText(text)

    def clear(self, quiet: bool = False) -> None:
        """Empty the draft and its attachments; ``quiet``: without announcing a draft
        change (a send, whose reported request redraws everything that shows the draft)."""
        self.edit.clear()
        if self.attachments:
            self.attachments, self._chip_tokens, self._paths = [], [], []
            self._draw_chips()
            self.attachmentsChanged.emit()  # the saved draft loses them (sent, not kept)
        if quiet:
            self._debounce.stop()

    def set_generating(self, generating: bool) -> None:
        self.generating = generating
        self.button.setText("Stop" if generating else "Send")
        self.button.setAccessibleName("Stop the reply" if generating else "Send")
        self._update_enabled()

    def set_can_send(self, can: bool, reason: str = "") -> None:
        """Sending needs a loaded model; the reason shows as a tooltip. A draft typed while
        it could not send is said to be sendable now, once (``ready``)."""
        if can and not self._can_send and self.text().strip():
            self.ready.emit("Ready: press Enter to send your message")
        self._can_send = can
        self._why_not = "" if can else (reason or "No model is loaded")
        self.edit.setPlaceholderText(
            "Message Iris  (Enter to send, Shift+Enter for a new line)" if can else
            (reason or "No model is loaded"))
        self.edit.viewport().update()  # the placeholder is not repainted on its own
        self._update_enabled()

    def _update_enabled(self) -> None:
        """Send needs a model, and a draft not known to be too large; Stop is always there."""
        held = "" if self.generating else self._too_large
        self.button.setEnabled(self.generating or (self._can_send and not held))
        held = held or ("" if self.generating or self._can_send else self._why_not)
        self.button.setToolTip("Stop generating (Esc)" if self.generating else held or "Send (Enter)")
        self.button.setAccessibleDescription(held)

    def set_draft_tokens(self, count: int | None, too_large: tuple[int, int] | None = None) -> None:
        """The draft's tokens; ``too_large``: (needed, allowed) when the turn it makes does
        not fit (before, "Draft: – tokens" beside 30,000 pasted words): Send then waits for
        a shorter draft (before, Enter took it out of the box, and a red "Iris could not
        answer" card came back with it). A count for a draft typed over since (its new
        count still to come) holds nothing back."""
        if too_large is not None:
            needed, allowed = too_large
            self.tokens.setText(f"Draft: too large (at least {needed:,} tokens; {allowed:,} fit)")
            why = too_large_words(needed, allowed, bool(self.attachments))
            self._too_large = "" if self._debounce.isActive() else why
            self.tokens.setToolTip(why)
            self.tokens.setAccessibleDescription(why)
        else:
            self._too_large = ""
            self.tokens.setText("Draft: – tokens" if count is None else f"Draft: {count:,} tokens")
            self.tokens.setToolTip(TOKENS_TIP)
            self.tokens.setAccessibleDescription("")
        self._update_enabled()

    def _clicked(self) -> None:
        if self.generating:
            self.stopRequested.emit()
        else:
            self._submit()

    def _submit(self) -> None:
        text = self.text()
        if not self.generating and not self._can_send:  # (Enter did nothing, unsaid)
            self.refused.emit(self._why_not)
            return
        if not self.generating and self._too_large:  # it stays in the box, as it is
            self.refused.emit(self._too_large)
            return
        if self.generating or not (text.strip() or self.attachments):
            return
        self.sendRequested.emit(text)
