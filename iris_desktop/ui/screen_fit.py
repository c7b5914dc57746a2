"""Windows that fit the screen: a dialog's size is what it asks for, but never more than
the free area of the screen it opens on (its parent's), whatever the text size."""

from __future__ import annotations

from PySide6.QtCore import QRect, QSize
from PySide6.QtWidgets import QWidget

#: the largest share of the screen's free area a window opens at
SCREEN_SHARE = 0.9


def fitted_size(preferred: QSize, minimum: QSize, available: QRect) -> QSize:
    """``preferred``, at most :data:`SCREEN_SHARE` of ``available``, at least ``minimum``
    where that still fits, and never larger than ``available``."""
    share = QSize(int(available.width() * SCREEN_SHARE), int(available.height() * SCREEN_SHARE))
    return preferred.boundedTo(share).expandedTo(minimum).boundedTo(available.size())


def fit_to_screen(widget: QWidget, preferred: QSize) -> QSize:
    """Resize ``widget`` to :func:`fitted_size` on its parent's screen (or its own) and
    keep it inside that screen's free area; returns the size."""
    anchor = widget.parentWidget() or widget
    available = anchor.screen().availableGeometry()
    size = fitted_size(preferred, widget.minimumSizeHint(), available)
    widget.resize(size)
    if widget.isVisible():
        frame = widget.frameGeometry()
        left = min(max(frame.left(), available.left()), available.right() + 1 - frame.width())
        top = min(max(frame.top(), available.top()), available.bottom() + 1 - frame.height())
        widget.move(left, top)
    return size
