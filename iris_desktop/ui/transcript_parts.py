"""The small things painted on a transcript card, laid out and painted: the header's
badges, the ‹ n/m › switcher between a message's alternatives and the attachment chips.
Plain functions of an entry and rects; the delegate calls them. And the one thing the
view keeps across a reset of its rows: its current message (:class:`CurrentKeeper`)."""

from __future__ import annotations

from PySide6.QtCore import QObject, QRect, QRectF, Qt
from PySide6.QtGui import QColor, QFont, QFontMetrics, QPainter, QPalette, QPen

from iris_desktop.core.store import utf8_length
from iris_desktop.core.views import Entry
from iris_desktop.ui.highlight import blend
from iris_desktop.units import file_size
from iris_desktop.untrusted import show_untrusted

#: the transcript's column at its widest, in line heights: about 95 characters a line
COLUMN_FONT_HEIGHTS = 52


def column(view_width: int, unit: int) -> tuple[int, int]:
    """(left, width) of the transcript's column in a view ``view_width`` wide: the
    view's width up to COLUMN_FONT_HEIGHTS line heights (``unit``), centred, so that a
    wide window does not run each line across the screen."""
    width = min(max(view_width, 200), COLUMN_FONT_HEIGHTS * unit)
    return max((view_width - width) // 2, 0), width


#: the most of one message a card lays out and paints: a pasted or imported message of
#: 20 MB froze the window 10 s on each paint, and one of 300 MB never showed
MAX_SHOWN_CHARS = 100_000


def shown_part(text: str, markdown: bool) -> str:
    """``text``, or for a message longer than MAX_SHOWN_CHARS its beginning and a line
    saying it is shown in part (Copy and export give all of it; the model gets it whole,
    as the context engine counts it)."""
    if len(text) <= MAX_SHOWN_CHARS:
        return text
    note = (f"[shown in part: the first {MAX_SHOWN_CHARS:,} of {len(text):,} characters "
            f"({file_size(utf8_length(text))}); Copy or File ▸ Export gives all of it]")
    cut = text[:MAX_SHOWN_CHARS]
    fences = [line.lstrip()[:3] for line in cut.splitlines() if line.lstrip()[:3] in ("```", "~~~")]
    if len(fences) % 2:  # cut inside a code block: it is closed before the note
        cut += "\n" + fences[-1]
    return f"{cut}\n\n{'*' + note + '*' if markdown else note}"


def stopped_empty(entry: Entry) -> str:
    """What a reply stopped before its first word shows where its text would be (Stop
    while the prompt was read or the earlier turns summarized), and, while it is the
    newest reply, how to have it answer."""
    if entry.role != "assistant" or entry.status != "interrupted" or entry.text:
        return ""
    how = (" To have it answer, click Regenerate on this card (or right-click it). By "
           "keyboard: Shift+F10 (or the Menu key) on this message, then Regenerate."
           if entry.can_regenerate else "")
    return f"Stopped before Iris began to answer.{how}"


def badges(entry: Entry) -> list[tuple[str, str]]:
    """(text, tone) pairs for the header; tone in info | warn | error | dim."""
    found = []
    if entry.state == "pruned":
        found.append(("cleared for the model", "info"))
    elif entry.state == "clipped":
        found.append(("shortened for the model", "warn"))
    elif entry.state == "summarized":
        found.append(("summarized", "dim"))
    elif entry.state == "dropped":
        found.append(("not sent — waiting to be summarized", "warn"))
    if entry.status == "streaming":
        found.append(("generating…", "info"))
    elif entry.status == "interrupted":
        found.append(("stopped", "warn"))
    elif entry.status == "error":
        found.append(("failed", "error"))
    elif entry.role == "assistant" and entry.can_continue:  # cut off at model.max_tokens:
        found.append(("cut off", "warn"))  # it looked finished (an audit); its card shows Continue
    elif entry.role == "assistant" and entry.filtered:  # said once in the status line, then
        found.append(("cut off by the content filter", "warn"))  # not again
    if entry.kind == "tool" and entry.error:
        found.append(("error", "error"))
    if entry.damaged:
        found.append((DAMAGED_BADGE, "error"))
    return found


#: the badge of a message whose stored text is damaged on disk (its tooltip says more)
DAMAGED_BADGE = "damaged on disk"
#: how the chat's note names a damaged message, by role
_WHICH = {"user": "your message", "assistant": "Iris's reply", "tool": "a tool's result",
          "system": "a system message"}


def damage_note(damaged: list[Entry]) -> str:
    """The one note a chat opened with messages damaged on disk gets (their cards have
    the badge): which ones, what it means and what can be done (``Entry.damaged``). The
    app showed � and said nothing (only the CLI named them)."""
    names = [_WHICH.get(e.role, "a message") + (f" in turn {e.turn}" if e.turn else "")
             for e in damaged[:5]]
    if len(damaged) == 1:
        return f"{names[0][0].upper()}{names[0][1:]} is damaged on disk: {damaged[0].damaged}"
    more = len(damaged) - len(names)
    listed = ", ".join(names[:-1]) + (f", {names[-1]} and {more:,} more" if more
                                      else f" and {names[-1]}")
    return (f"{len(damaged):,} messages of this chat are damaged on disk (marked on their "
            f"cards): {listed}; in each, {damaged[0].damaged}")


def damage_tooltip(entry: Entry) -> str | None:
    """What hovering a damaged message's card says; None for a sound one."""
    return f"Damaged on disk: {entry.damaged}" if entry.damaged else None


def paint_badges(painter: QPainter, entry: Entry, x: int, header: QRect, pal: QPalette,
                 small: QFont, u: int, right: int | None = None) -> None:
    """The badges as pills from ``x`` along the header's middle, none past ``right`` (the
    switcher's or the links' left edge): the last that does not fit is elided ("not sent
    — waiting…"), and those after it are left out (they ran past the card's edge, cut
    mid-word, at a large font in a narrow window: a newcomer's audit)."""
    right = header.right() if right is None else right
    painter.setFont(small)
    sfm = QFontMetrics(small)
    base, text = pal.color(QPalette.ColorRole.Base), pal.color(QPalette.ColorRole.Text)
    tones = {"info": pal.color(QPalette.ColorRole.Highlight), "warn": QColor(215, 140, 20),
             "error": QColor(205, 55, 45), "dim": pal.color(QPalette.ColorRole.Mid)}
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)  # small pills: cheap
    for badge, tone in badges(entry):
        w = sfm.horizontalAdvance(badge) + u // 2
        if x + w > right:  # elided to the room left, or not drawn when even "…" is too wide
            badge = sfm.elidedText(badge, Qt.TextElideMode.ElideRight, right - x - u // 2)
            if badge in ("", "…"):
                break
            w = sfm.horizontalAdvance(badge) + u // 2
        h = sfm.height() + 2
        r = QRectF(x, header.center().y() - h / 2, w, h)
        color = tones[tone]
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(blend(base, color, 0.22))
        painter.drawRoundedRect(r, h / 2, h / 2)
        painter.setPen(blend(color, text, 0.35))
        painter.drawText(r, Qt.AlignmentFlag.AlignCenter, badge)
        x += w + u // 3
    painter.setRenderHint(QPainter.RenderHint.Antialiasing, False)


def switcher_rects(entry: Entry, left_of: QRect, fm: QFontMetrics, u: int
                   ) -> tuple[QRect, QRect, QRect] | None:
    """(‹, n/m, ›) just left of ``left_of`` (the header's Copy), or None when the entry
    has no alternatives."""
    if entry.branch is None or entry.branch[1] < 2:
        return None
    top, h = left_of.top(), left_of.height()
    arrow_w = max(fm.horizontalAdvance("‹") + u // 2, u)
    label_w = fm.horizontalAdvance(f"{entry.branch[0]}/{entry.branch[1]}") + u // 3
    nxt = QRect(left_of.left() - u // 3 - arrow_w, top, arrow_w, h)
    label = QRect(nxt.left() - label_w, top, label_w, h)
    return QRect(label.left() - arrow_w, top, arrow_w, h), label, nxt


def paint_switcher(painter: QPainter, entry: Entry, rects: tuple[QRect, QRect, QRect],
                   pal: QPalette) -> None:
    """‹ and › in the link colour, or dimmed at either end."""
    prev, label, nxt = rects
    at, count = entry.branch
    link = pal.color(QPalette.ColorRole.Link)
    dim = pal.color(QPalette.ColorRole.PlaceholderText)
    center = Qt.AlignmentFlag.AlignCenter
    painter.setPen(link if at > 1 else dim)
    painter.drawText(prev, center, "‹")
    painter.setPen(pal.color(QPalette.ColorRole.Text))
    painter.drawText(label, center, f"{at}/{count}")
    painter.setPen(link if at < count else dim)
    painter.drawText(nxt, center, "›")


def chip_text(name: str, tokens: int) -> str:
    """A file's chip: its name with invisible and reordering characters as escapes (one
    named ``evil\u202etxt.exe`` drew as "evilexe.txt", a newline cut the name)."""
    return f"{show_untrusted(name)} · {tokens:,} tokens"


def chip_rects(entry: Entry, left: int, top: int, width: int, small: QFont, u: int
               ) -> list[tuple[QRect, str]]:
    """A chip per attachment (name, tokens) below ``top``, wrapped onto as many lines as
    needed; none without attachments."""
    if not entry.attachments:
        return []
    sfm = QFontMetrics(small)
    h = sfm.height() + u // 3
    x, y = left, top + u // 3
    chips = []
    for name, tokens in entry.attachments:
        text = chip_text(name, tokens)
        w = min(sfm.horizontalAdvance(text) + u + 2, width)
        if x > left and x + w > left + width:
            x, y = left, y + h + u // 4
        chips.append((QRect(x, y, w, h), text))
        x += w + u // 3
    return chips


def paint_chips(painter: QPainter, chips: list[tuple[QRect, str]], pal: QPalette,
                fill: QColor, small: QFont, u: int) -> None:
    if not chips:
        return
    text = pal.color(QPalette.ColorRole.Text)
    painter.setFont(small)
    sfm = QFontMetrics(small)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    for rect, label in chips:
        r = QRectF(rect).adjusted(0.5, 0.5, -0.5, -0.5)
        painter.setPen(QPen(blend(fill, text, 0.25), 1))
        painter.setBrush(blend(fill, pal.color(QPalette.ColorRole.Base), 0.6))
        painter.drawRoundedRect(r, r.height() / 2, r.height() / 2)
        painter.setPen(text)
        inner = rect.adjusted(u // 2, 0, -(u // 2), 0)
        if sfm.horizontalAdvance(label) > inner.width():
            label = sfm.elidedText(label, Qt.TextElideMode.ElideMiddle, inner.width())
        painter.drawText(inner, Qt.AlignmentFlag.AlignCenter, label)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing, False)


class CurrentKeeper(QObject):
    """Keeps the transcript's current message across a reset of its rows (a reload after
    a turn; Regenerate and Edit… cutting the rows shown). Before, the view had no current
    row after one (-1), even with the keyboard's focus on it: Alt+Left, which the row said
    to press, did nothing and Up went to the first message. Now, when the view had a
    current row or the focus, the same message stays current when it is still a row; when
    it went (the reply regenerated, the message edited) the newest row becomes current and
    stays the newest as the new reply's rows come, until the user moves. Setting it never
    scrolls: following the bottom stays the view's."""

    def __init__(self, view):
        super().__init__(view)
        self.view = view
        self._key: str | None = None  # the current entry's key before a reset
        self._had = False  # the view had a current row or the focus before a reset
        self._newest = False  # the current message went: the newest row is current
        self._setting = False
        model = view.model()
        model.modelAboutToBeReset.connect(self._before)
        model.modelReset.connect(self._after)
        model.rowsInserted.connect(self._inserted)
        view.selectionModel().currentChanged.connect(self._moved)

    def forget(self) -> None:
        """Another chat is opened: nothing of this one's current message carries over."""
        self._key, self._had, self._newest = None, False, False

    def _before(self) -> None:
        entry = self.view.current_entry()
        self._key = entry.key if entry is not None else None
        self._had = entry is not None or self.view.hasFocus() or self._newest

    def _after(self) -> None:
        if not self._had:
            return
        model = self.view.transcript
        row = model.row_of(self._key) if self._key is not None else None
        self._newest = row is None and self._key not in model.keys()
        self._set(model.rowCount() - 1 if row is None else row)

    def _inserted(self, _parent, _first: int, last: int) -> None:
        if self._newest and last == self.view.transcript.rowCount() - 1:
            self._set(last)

    def _set(self, row: int) -> None:
        if row < 0:
            return
        view, scroll = self.view, self.view.hasAutoScroll()
        self._setting = True
        view.setAutoScroll(False)
        try:
            view.setCurrentIndex(view.transcript.index(row))
        finally:
            view.setAutoScroll(scroll)
            self._setting = False

    def _moved(self, *_indexes) -> None:
        if not self._setting:
            self._newest = False
