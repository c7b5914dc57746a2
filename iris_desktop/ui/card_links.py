"""A card's header and actions: the header painted (who, badges, switcher, links), the
links' places and what a click on them hits, and the card's context menu, the links and
the menu deciding with the same conditions (:func:`offers`).

Copy shows while a card is hovered or selected. A reply that was stopped, failed or cut
off also shows Continue and Regenerate, always: they were only in the context menu, and
a newcomer who stopped a reply saw a badge and no way on (an audit). The row's accessible
description names them and their keys (:class:`LinkedTranscript`)."""

from __future__ import annotations

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, QPoint, QRect, Qt
from PySide6.QtGui import QFont, QFontMetrics, QPainter, QPalette
from PySide6.QtWidgets import QMenu

from iris_desktop.core.views import Entry
from iris_desktop.ui.transcript_model import ENTRY_ROLE, TranscriptModel
from iris_desktop.ui.transcript_parts import paint_badges, paint_switcher

#: what each link says; the header shows them right-aligned in this order, Copy last
LABELS = {"continue": "Continue", "regenerate": "Regenerate", "copy": "Copy"}


def offers(entry: Entry, action: str) -> bool:
    """Whether the message's actions (its menu, its links) include ``action``: regenerate,
    continue or edit."""
    if entry.kind != "message" or entry.message_id is None:
        return False
    if action == "edit":
        return entry.role == "user"
    wanted = {"regenerate": entry.can_regenerate, "continue": entry.can_continue}[action]
    return entry.role == "assistant" and wanted


def unfinished(entry: Entry) -> bool:
    """A reply that was stopped, failed or cut off (the ones that show their links)."""
    return entry.role == "assistant" and (entry.status in ("interrupted", "error")
                                          or entry.can_continue)


def shown_links(entry: Entry) -> list[str]:
    """Continue and Regenerate where the entry's menu offers them on an unfinished reply."""
    if not unfinished(entry):
        return []
    return [name for name in ("continue", "regenerate") if offers(entry, name)]


def link_rects(entry: Entry, header: QRect, fm: QFontMetrics, u: int) -> dict[str, QRect]:
    """Each link's rect at the right of ``header``, Copy's always (a notice shows none,
    but the ‹ n/m › switcher goes left of it), then Regenerate's and Continue's to its
    left where the card shows them."""
    rects: dict[str, QRect] = {}
    right = header.right()
    for name in ("copy", *reversed(shown_links(entry))):
        w = fm.horizontalAdvance(LABELS[name]) + u // 2
        rects[name] = QRect(right - w, header.top(), w, header.height())
        right -= w + u // 3
    return rects


def leftmost(rects: dict[str, QRect]) -> QRect:
    return min(rects.values(), key=QRect.left)


def paint_links(painter: QPainter, entry: Entry, rects: dict[str, QRect], pal: QPalette,
                hovered: bool) -> None:
    """The links in the link colour: Copy while ``hovered`` (or selected), the others
    always."""
    painter.setPen(pal.color(QPalette.ColorRole.Link))
    for name, rect in rects.items():
        if name != "copy" or (hovered and entry.kind != "notice"):
            painter.drawText(rect, Qt.AlignmentFlag.AlignCenter, LABELS[name])


def paint_header(painter: QPainter, entry: Entry, g: dict, pal: QPalette,
                 fonts: tuple[QFont, QFont, QFont], label: str, hovered: bool) -> None:
    """The card's header (``g``: the delegate's layout of the card): who speaks
    (``label``) in bold, the badges, the ‹ n/m › switcher and the links. ``fonts``: the
    view's, its bold and its small one."""
    font, bold, small = fonts
    header: QRect = g["header"]
    painter.setFont(bold)
    painter.setPen(pal.color(QPalette.ColorRole.Text))
    painter.drawText(header, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, label)
    x = header.left() + QFontMetrics(bold).horizontalAdvance(label) + g["u"] // 2
    right = (g["switch"][0] if g["switch"] is not None else leftmost(g["links"])).left()
    paint_badges(painter, entry, x, header, pal, small, g["u"], right - g["u"] // 3)
    painter.setFont(font)
    if g["switch"] is not None:
        paint_switcher(painter, entry, g["switch"], pal)
    paint_links(painter, entry, g["links"], pal, hovered)


def link_at(entry: Entry, rects: dict[str, QRect], pos: QPoint) -> str:
    """The link at ``pos`` ("copy", "continue", "regenerate"), or ""."""
    for name, rect in rects.items():
        if rect.contains(pos) and (name != "copy" or entry.kind != "notice"):
            return name
    return ""


def described(entry: Entry) -> str | None:
    """The row's accessible description: the links it shows and their keys, or None."""
    names = [LABELS[name] for name in shown_links(entry)]
    if not names:
        return None
    return (f"{' and '.join(names)}: Shift+F10 (or the Menu key) on this message, then "
            f"{' or '.join(names)}. Ctrl+C copies it.")


class LinkedTranscript(TranscriptModel):
    """The transcript's model, whose rows also have an accessible description naming the
    links they show (the spoken text stays ``transcript_model.spoken``'s)."""

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if role == Qt.ItemDataRole.AccessibleDescriptionRole:
            entry = super().data(index, ENTRY_ROLE)
            return described(entry) if entry is not None else None
        return super().data(index, role)


def message_menu(view, index: QModelIndex) -> QMenu:
    """The context menu of ``view``'s (a ``TranscriptView``'s) row ``index``."""
    entry: Entry = index.data(ENTRY_ROLE)
    menu = QMenu(view)
    editor = view.text_editor  # over this row's text, with some of it selected:
    if editor is not None and editor.entry.key == entry.key and editor.has_selection():
        menu.addAction("Copy selection", editor.copy)
    menu.addAction("Copy message", lambda: view.delegate.copy(entry))
    mid = entry.message_id
    if offers(entry, "regenerate"):
        menu.addAction("Regenerate", lambda: view.regenerateRequested.emit(mid))
    if offers(entry, "edit"):
        menu.addAction("Edit…", lambda: view.edit_message(entry))
    if offers(entry, "continue"):
        menu.addAction("Continue", lambda: view.continueRequested.emit(mid))
    if entry.kind == "message" and mid is not None and entry.branch is not None \
            and entry.branch[1] > 1:
        number, count = entry.branch
        for label, step, on in (("Previous alternative\tAlt+Left", -1, number > 1),
                                ("Next alternative\tAlt+Right", 1, number < count)):
            menu.addAction(label, lambda step=step: view.switchRequested.emit(mid, step)
                           ).setEnabled(on)
    if entry.kind in ("tool", "divider"):
        expanded = entry.key in view.transcript.expanded
        persistent = QPersistentModelIndex(index)
        menu.addAction("Collapse" if expanded else "Expand",
                       lambda: view.toggle(view.transcript.index(persistent.row())))
    return menu
