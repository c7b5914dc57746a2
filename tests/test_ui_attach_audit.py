"""Files attached in the window (an audit of attachments and drafts): two files of one
name are both kept, and a file's name is shown as stored, never reordered or cut."""

from __future__ import annotations

import pytest

from support.fakes import ScriptedRuntime
from support.windows import settle

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")


def chips(window) -> list:
    from PySide6.QtWidgets import QToolButton

    return [c for c in window.composer.findChildren(QToolButton, "attachment-chip")
            if c.isVisible()]


def test_two_files_of_one_name_from_two_folders_are_both_sent(make_window, qtbot, tmp_path):
    """Before: README.md from folder a and README.md from folder b, attached together:
    the second silently took the first's place, and only B's port reached the model (the
    CLI's ``--attach`` sends both). Now both are kept, their chips tell them apart by
    folder, both go with the message; the same file attached again still replaces itself."""
    for folder, port in (("a", 8080), ("b", 9090)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "README.md").write_text(f"Project {folder}: the port is {port}.\n")
    runtime = ScriptedRuntime(["Two ports."])
    w = make_window(runtime)
    w.composer.attachRequested.emit([str(tmp_path / "a" / "README.md"),
                                     str(tmp_path / "b" / "README.md")])
    assert [a.text for a in w.composer.attachments] == ["Project a: the port is 8080.\n",
                                                        "Project b: the port is 9090.\n"]
    (tmp_path / "a" / "README.md").write_text("Project a: the port is 8081.\n")
    w.composer.attachRequested.emit([str(tmp_path / "a" / "README.md")])  # edited, again
    assert sorted(a.text for a in w.composer.attachments) == [
        "Project a: the port is 8081.\n", "Project b: the port is 9090.\n"]
    qtbot.waitUntil(lambda: len(chips(w)) == 2 and all("tokens" in c.text() for c in chips(w)),
                    timeout=5_000)
    assert sorted(c.text().split(" · ")[0] for c in chips(w)) == ["README.md (a)",
                                                                   "README.md (b)"]
    w.composer.set_text("Which ports?")
    w.turns.send(w.composer.text())
    qtbot.waitUntil(lambda: not w.generating, timeout=20_000)  # the turn ran
    settle(qtbot, w)
    sent = runtime.requests[-1][-1]["content"]
    assert "8081" in sent and "9090" in sent
    user = next(e for e in w.view.transcript.entries() if e.role == "user")
    assert [name for name, _tokens in user.attachments] == ["README.md", "README.md"]


def test_file_names_that_reorder_or_break_the_line_show_as_escapes(make_window, qtbot,
                                                                   tmp_path):
    """Before: a file named ``evil\\u202etxt.exe`` drew as "evilexe.txt" on its chip (in
    the box and under the sent message), its tooltip and accessible name too, and a name
    holding a newline was cut. Now those characters show as escapes, as the refusal box
    shows them."""
    from PySide6.QtGui import QFont

    from iris_desktop.ui.transcript_parts import chip_text

    evil, broken = "evil\u202etxt.exe", "nl\nname.txt"
    (tmp_path / evil).write_text("payload\n")
    (tmp_path / broken).write_text("second\n")
    w = make_window(ScriptedRuntime(["Seen."]))
    w.composer.attachRequested.emit([str(tmp_path / evil), str(tmp_path / broken)])
    assert [a.name for a in w.composer.attachments] == [evil, broken]  # sent as they are
    qtbot.waitUntil(lambda: len(chips(w)) == 2, timeout=5_000)
    for chip in chips(w):
        for shown in (chip.text(), chip.toolTip(), chip.accessibleName()):
            assert "\u202e" not in shown and "\n" not in shown, shown
    assert chips(w)[0].text().startswith("evil\\u202etxt.exe · ")
    assert chips(w)[1].text().startswith("nl\\x0aname.txt · ")
    assert chip_text(evil, 12) == "evil\\u202etxt.exe · 12 tokens"
    assert chip_text(broken, 3) == "nl\\x0aname.txt · 3 tokens"
    w.composer.set_text("look")
    w.turns.send(w.composer.text())
    qtbot.waitUntil(lambda: not w.generating, timeout=20_000)  # the turn ran
    settle(qtbot, w)
    user = next(e for e in w.view.transcript.entries() if e.role == "user")
    from iris_desktop.ui.transcript_parts import chip_rects

    drawn = [text for _rect, text in chip_rects(user, 0, 0, 600, QFont(), 12)]
    assert all("\u202e" not in t and "\n" not in t for t in drawn), drawn
