"""A card's badges stay left of its switcher and links: the last that does not fit is
elided, those after it left out (a newcomer's audit: "not sent — waiting for compaction"
ran past the card's edge, cut mid-word, at 20 pt in an 800-px window)."""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6")

from PySide6.QtCore import QRect  # noqa: E402
from PySide6.QtGui import QColor, QFont, QImage, QPainter, QPalette  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from iris_desktop.core.views import Entry  # noqa: E402
from iris_desktop.ui.transcript_parts import badges, paint_badges  # noqa: E402


def _painted_columns(right: int | None, points: int = 20) -> set[int]:
    QApplication.instance() or QApplication([])
    image = QImage(900, 40, QImage.Format.Format_RGB32)
    image.fill(QColor(255, 255, 255))
    entry = Entry("message", "m:1", 1, "user", 1, "old question", state="dropped",
                  status="interrupted")
    assert [b for b, _ in badges(entry)] == ["not sent — waiting to be summarized", "stopped"]
    small = QFont()
    small.setPointSize(points)
    painter = QPainter(image)
    paint_badges(painter, entry, 10, QRect(0, 0, 900, 40), QPalette(), small, 12, right)
    painter.end()
    return {x for x in range(900) for y in range(40) if image.pixel(x, y) != 0xFFFFFFFF}


def test_badges_end_before_the_switcher_and_links():
    free = _painted_columns(None)
    assert max(free) > 300  # (both pills at 20 pt: wider than the room below)
    bounded = _painted_columns(250)
    assert bounded and max(bounded) <= 250  # before: drawn on to the card's edge
    assert min(bounded) >= 10


def test_no_room_no_badge():
    assert _painted_columns(14) == set()
