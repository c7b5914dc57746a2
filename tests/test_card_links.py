"""Continue and Regenerate as links on a reply's card, beside Copy: a reply that was
stopped, failed or cut off shows them (before, only the context menu had them, and a
newcomer who stopped a reply saw a "stopped" badge and no way on: an audit). Clicked in
the real window (pytest-qt, offscreen) on the scripted runtime."""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QRect, Qt  # noqa: E402
from PySide6.QtGui import QAccessible, QColor  # noqa: E402
from test_ui_branches import rows, settle  # noqa: E402

from iris_desktop.ui.transcript_model import ENTRY_ROLE  # noqa: E402

from support.fakes import ScriptedRuntime  # noqa: E402


def reply_index(w):
    model = w.view.transcript
    return next(model.index(r) for r in reversed(range(model.rowCount()))
                if model.index(r).data(ENTRY_ROLE).role == "assistant")


def links(w) -> dict[str, QRect]:
    """The reply card's header links and where they are (viewport coordinates); a card
    without them has Copy alone."""
    g = w.view.delegate.geometry(reply_index(w))
    return g.get("links", {"copy": g["copy"]})


def inked(w, rect: QRect) -> bool:
    """Whether something is painted in ``rect`` in the link colour (text, not the card)."""
    w.view.clearSelection()  # nothing hovered or selected: Copy is not painted
    w.view.setCurrentIndex(w.view.transcript.index(0))
    image = w.view.viewport().grab().toImage()
    link = w.view.palette().color(w.view.palette().ColorRole.Link)
    for x in range(rect.left(), rect.right() + 1):
        for y in range(rect.top(), rect.bottom() + 1):
            pixel = QColor(image.pixel(x, y))
            if abs(pixel.red() - link.red()) + abs(pixel.green() - link.green()) \
                    + abs(pixel.blue() - link.blue()) < 60:
                return True
    return False


def click(qtbot, w, name: str) -> None:
    assert name in links(w), f"no {name} on the card"
    rect = links(w)[name]
    assert w.view.delegate.target(reply_index(w), rect.center())[0] == name
    qtbot.mouseClick(w.view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())


def stopped_window(make_window, qtbot, *more: str):
    runtime = ScriptedRuntime(["one two three four five six seven eight", *more], delay_s=0.02)
    w = make_window(runtime)
    w.show()
    w.send("Count")
    qtbot.waitUntil(lambda: any("three" in e.text for e in rows(w)), timeout=10_000)
    w.turns.stop()
    settle(qtbot, w)
    return w


def test_a_stopped_reply_shows_continue_and_regenerate_and_continue_goes_on(make_window, qtbot):
    w = stopped_window(make_window, qtbot, "nine ten")
    stopped = reply_index(w).data(ENTRY_ROLE)
    assert stopped.status == "interrupted"
    shown = links(w)
    assert list(shown) == ["copy", "regenerate", "continue"]  # right to left
    assert shown["continue"].right() < shown["regenerate"].left() < shown["copy"].left()
    assert inked(w, shown["continue"]) and inked(w, shown["regenerate"])
    assert not inked(w, shown["copy"])  # Copy still shows only on a hovered card
    click(qtbot, w, "continue")
    settle(qtbot, w)
    replies = [e for e in rows(w) if e.role == "assistant"]
    assert len(replies) == 1
    assert replies[0].text.startswith(stopped.text) and replies[0].text.endswith("nine ten")
    assert replies[0].status == "complete" and list(links(w)) == ["copy"]


def test_regenerate_on_a_stopped_reply_adds_an_alternative(make_window, qtbot):
    w = stopped_window(make_window, qtbot, "A fresh answer.")
    click(qtbot, w, "regenerate")
    settle(qtbot, w)
    reply = reply_index(w).data(ENTRY_ROLE)
    assert reply.text == "A fresh answer." and reply.branch == (2, 2)
    assert list(links(w)) == ["copy"]  # complete: Regenerate is in its menu only


def test_a_complete_reply_shows_neither(make_window, qtbot):
    w = make_window(ScriptedRuntime(["All done."]))
    w.show()
    w.send("Hello")
    settle(qtbot, w)
    index = reply_index(w)
    entry = index.data(ENTRY_ROLE)
    assert entry.status == "complete" and entry.can_regenerate  # (its menu has Regenerate)
    shown = w.view.delegate.geometry(index)["links"]
    assert list(shown) == ["copy"]
    left_of_copy = shown["copy"].translated(-shown["copy"].width(), 0).center()
    assert w.view.delegate.target(index, left_of_copy)[0] not in ("continue", "regenerate")
    assert not inked(w, QRect(shown["copy"].left() - 8 * shown["copy"].width(),
                              shown["copy"].top(), 8 * shown["copy"].width(),
                              shown["copy"].height()))
    assert index.data(Qt.ItemDataRole.AccessibleDescriptionRole) is None


def test_a_failed_reply_shows_regenerate(make_window, qtbot):
    w = make_window(ScriptedRuntime([ValueError("the model broke"), "Second try."]))
    w.show()
    w.send("Hello")
    settle(qtbot, w)
    failed = reply_index(w).data(ENTRY_ROLE)
    assert failed.status == "error" and failed.text  # a word came before the failure:
    assert list(links(w)) == ["copy", "regenerate", "continue"]  # it can go on from it
    assert inked(w, links(w)["regenerate"])
    click(qtbot, w, "regenerate")
    settle(qtbot, w)
    assert reply_index(w).data(ENTRY_ROLE).text == "Second try."


def test_a_reply_cut_off_at_the_cap_shows_both(make_window, qtbot):
    w = make_window(ScriptedRuntime(["one two three four five six", "seven eight"],
                                    cut_at_cap=True), overrides={"model.max_tokens": "3"})
    w.show()
    w.send("Count")
    settle(qtbot, w)
    cut = reply_index(w).data(ENTRY_ROLE)
    assert cut.status == "complete" and cut.can_continue
    assert list(links(w)) == ["copy", "regenerate", "continue"]


def test_a_screen_reader_hears_the_links_and_their_keys(make_window, qtbot):
    w = stopped_window(make_window, qtbot)
    index = reply_index(w)
    view = QAccessible.queryAccessibleInterface(w.view)
    cells = [view.child(i) for i in range(view.childCount())]
    cell = next(c for c in cells if c is not None
                and c.text(QAccessible.Text.Name) == index.data(Qt.ItemDataRole.AccessibleTextRole))
    said = cell.text(QAccessible.Text.Description)
    assert "Continue" in said and "Regenerate" in said and "Shift+F10" in said
    # and the keys it names do it: Shift+F10 opens the menu that has both
    names = [a.text() for a in w.view.context_menu(index).actions()]
    assert "Continue" in names and "Regenerate" in names
