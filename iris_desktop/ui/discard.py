"""Dialogs that ask before throwing away what was typed in them.

Escape, Cancel or the title bar's close button rejected an edit at once: a rewritten
message or system prompt was gone with one stray key. A dialog that mixes this in asks
first when it holds changes ("Discard" or "Keep editing", Keep editing the default and
Escape's answer); without changes it closes as before. The question is non-blocking
(``discard_box``), so the window keeps painting and tests can answer it.
"""

from __future__ import annotations

from PySide6.QtWidgets import QMessageBox

from iris_desktop.ui.boxes import plain_box


class AsksBeforeDiscarding:
    """Mix into a ``QDialog`` (before it) and implement :meth:`has_changes`."""

    discard_box: QMessageBox | None = None
    #: what the question calls the changes, e.g. "your edit of this message"
    changes_name = "your changes"
    #: what discarding them means
    discard_detail = "What you typed is not saved."

    def has_changes(self) -> bool:
        raise NotImplementedError

    def reject(self) -> None:
        if not self.has_changes():
            super().reject()  # type: ignore[misc]
            return
        if self.discard_box is not None and self.discard_box.isVisible():
            return
        box = plain_box(QMessageBox(QMessageBox.Icon.Question, "Discard changes?",
                                    f"Discard {self.changes_name}? {self.discard_detail}",
                                    parent=self))  # type: ignore[arg-type]
        box.setObjectName("discard-changes")
        discard = box.addButton("Discard", QMessageBox.ButtonRole.DestructiveRole)
        keep = box.addButton("Keep editing", QMessageBox.ButtonRole.RejectRole)
        box.setDefaultButton(keep)
        box.setEscapeButton(keep)
        box.buttonClicked.connect(lambda button: self._answered(button is discard))
        self.discard_box = box
        box.open()

    def _answered(self, discard: bool) -> None:
        self.discard_box = None
        if discard:
            super().reject()  # type: ignore[misc]
