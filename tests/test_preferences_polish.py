"""Preferences as a newcomer met it (the audit of 7 December): the real dialog, offscreen,
typed into and clicked through as a user does (pytest-qt), on a real data folder and
settings file with a scripted model.

- "Context window" goes back to auto by typing 'auto' (any case), by clearing the box or
  with its Auto button: typing auto over 4096 kept 4096 without a word.
- A typed number is kept whole and marked with what was typed: 999999 was cut to 9999 as
  it was typed (the box's reach), and the error quoted '9999'.
- An invalid spin box keeps its arrows: the red border (a style sheet) made Qt's style
  stop drawing them.
- The live budget shows every line at the dialog's size (5 of 9 in a small scroll area,
  one cut through), and "Fix the marked values…" once (it was in the bar and under it).
- The help under the context settings and the budget's lines in plain words; a note under
  "When older turns are summarized" when its red line is not below the request budget."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QPoint, QRect, Qt  # noqa: E402
from PySide6.QtGui import QColor  # noqa: E402
from PySide6.QtWidgets import QScrollArea, QSpinBox, QStyle, QStyleOptionSpinBox  # noqa: E402

from iris_desktop.core.store import Store  # noqa: E402
from iris_desktop.paths import app_paths  # noqa: E402
from iris_desktop.settings import SETTINGS, load_settings  # noqa: E402
from iris_desktop.ui.bounded_spin import BoundedDoubleSpinBox, BoundedSpinBox  # noqa: E402

from support.windows import settle  # noqa: E402

pytestmark = pytest.mark.usefixtures("system_look_after")


def open_preferences(window, qtbot, size=(880, 728)):
    window.menus.actions["preferences"].trigger()  # Edit ▸ Preferences…
    dialog = window.menus.settings_dialog
    qtbot.waitUntil(dialog.isVisible, timeout=5_000)
    dialog.resize(*size)  # the dialog's size on a 1400×900 screen (the audit's)
    qtbot.waitUntil(lambda: dialog.last_preview is not None, timeout=10_000)
    return dialog


def type_into(qtbot, spin, text: str, leave: bool = True) -> None:
    spin.setFocus()
    spin.selectAll()
    qtbot.keyClicks(spin, text)
    if leave:
        qtbot.keyClick(spin, Qt.Key.Key_Tab)


def seeded_window(make_window, qtbot, data_dir):
    with Store(app_paths(data_dir).ensure().db_path) as store:
        thread = store.create_thread("seeded")
        store.add_messages(thread, [{"role": "user", "content": "hello " * 50},
                                    {"role": "assistant", "content": "hi " * 40},
                                    {"role": "user", "content": "more " * 30},
                                    {"role": "assistant", "content": "yes " * 30}])
    window = make_window()
    window.open_thread(thread)
    settle(qtbot, window)
    return window


# -- 1. auto, typed ---------------------------------------------------------------------


def test_typing_auto_or_clearing_the_box_gives_the_window_back_to_auto(make_window, qtbot,
                                                                        data_dir):
    window = make_window()
    dialog = open_preferences(window, qtbot)
    field = dialog.fields["context.window"]
    spin = field.editor.spin
    type_into(qtbot, spin, "4096")
    assert field.raw() == "4096"
    qtbot.mouseClick(dialog.apply_button, Qt.MouseButton.LeftButton)
    config = dialog.settings.config_path
    assert load_settings(config, env={})["context.window"] == 4096
    type_into(qtbot, spin, "Au", leave=False)  # its first letters: kept while typing
    assert spin.lineEdit().text().startswith("Au")
    qtbot.keyClicks(spin, "TO")
    qtbot.keyClick(spin, Qt.Key.Key_Tab)
    assert spin.value() == -1 and field.raw() == "auto" and not field.error.isVisible()
    assert spin.text().startswith("auto")
    assert dialog.apply_button.isEnabled()
    qtbot.mouseClick(dialog.apply_button, Qt.MouseButton.LeftButton)
    assert load_settings(config, env={})["context.window"] == "auto"  # saved: auto
    type_into(qtbot, spin, "8192")
    assert field.raw() == "8192"
    spin.setFocus()
    spin.selectAll()
    qtbot.keyClick(spin, Qt.Key.Key_Delete)  # an empty box: auto
    qtbot.keyClick(spin, Qt.Key.Key_Tab)
    assert field.raw() == "auto" and not field.error.isVisible()
    type_into(qtbot, spin, "8192")
    qtbot.mouseClick(field.editor.auto, Qt.MouseButton.LeftButton)  # the Auto button
    assert field.raw() == "auto"
    # a word that is not the special value's is still refused, key by key
    type_into(qtbot, spin, "8192")
    type_into(qtbot, spin, "x", leave=False)
    assert "x" not in spin.lineEdit().text()
    qtbot.keyClick(spin, Qt.Key.Key_Tab)


def test_the_other_special_values_take_their_words_and_an_empty_box(make_window, qtbot):
    """ZeroEditors (model.n_ctx, ui.font_size): 0 is their special value; an empty box and
    the special text typed give it, as 'auto' does for the window."""
    window = make_window()
    dialog = open_preferences(window, qtbot)
    size = dialog.fields["ui.font_size"]
    dialog.tabs.setCurrentIndex(dialog.sections.index("ui"))
    type_into(qtbot, size.editor.spin, "12")
    assert size.raw() == "12"
    type_into(qtbot, size.editor.spin, "The System's Size")
    assert size.raw() == "0" and not size.error.isVisible()
    type_into(qtbot, size.editor.spin, "12")
    size.editor.spin.setFocus()
    size.editor.spin.selectAll()
    qtbot.keyClick(size.editor.spin, Qt.Key.Key_Delete)
    qtbot.keyClick(size.editor.spin, Qt.Key.Key_Tab)
    assert size.raw() == "0"


# -- 2. a typed number kept whole -------------------------------------------------------


def test_a_typed_number_is_kept_whole_and_named_in_its_error(make_window, qtbot):
    window = make_window()
    dialog = open_preferences(window, qtbot)
    field = dialog.fields["context.recall_max_tokens"]
    type_into(qtbot, field.editor.spin, "999999")
    assert field.editor.spin.value() == 999999
    assert "999,999" in field.editor.spin.text() or "999999" in field.editor.spin.text()
    assert field.error.isVisible() and "'999999'" in field.error.text(), field.error.text()
    assert not dialog.ok_button.isEnabled()
    edit = field.editor.spin.lineEdit()  # and shown whole: the box widens for it
    qtbot.waitUntil(lambda: edit.width() >= edit.fontMetrics().horizontalAdvance(edit.text()),
                    timeout=5_000)
    # every numeric editor: a number far past its maximum is kept and named
    checked = []
    for key, f in dialog.fields.items():
        spin = getattr(f.editor, "spin", None)
        if f.locked or not isinstance(spin, (BoundedSpinBox, BoundedDoubleSpinBox)):
            continue
        if not spin.isEnabled():  # model.gpu's layers: only with "layers:"
            continue
        dialog.tabs.setCurrentIndex(dialog.sections.index(SETTINGS[key].section))
        typed = "987654321" if isinstance(spin, BoundedSpinBox) else "1234567"  # (was said as 1.23457e+06)
        type_into(qtbot, spin, typed)
        assert str(f.raw()) == typed, (key, spin.text())
        assert f.error.isVisible() and f"'{typed}'" in f.error.text(), (key, f.error.text())
        checked.append(key)
        f.set_value(SETTINGS[key].default if key != "context.window" else 4096)
    assert len(checked) >= 20, checked


def test_a_box_that_holds_any_number_stays_as_wide_as_its_own_numbers(make_window, qtbot):
    window = make_window()
    dialog = open_preferences(window, qtbot)
    for key in ("context.prune_protect_turns", "context.window", "context.recall_max_tokens"):
        spin = dialog.fields[key].editor.spin
        plain = QSpinBox()  # the setting's own range, as a plain spin box is sized for it
        plain.setRange(spin.minimum(), spin.maximum())
        plain.setSuffix(spin.suffix())
        plain.setSpecialValueText(spin.specialValueText())
        plain.setGroupSeparatorShown(spin.isGroupSeparatorShown())
        assert abs(spin.sizeHint().width() - plain.sizeHint().width()) <= 2, key
        assert abs(spin.minimumSizeHint().width() - plain.minimumSizeHint().width()) <= 2, key


# -- 3. the arrows of an invalid spin box -----------------------------------------------


def arrows(spin):
    """The pixels of the spin box's up and down buttons."""
    option = QStyleOptionSpinBox()
    spin.initStyleOption(option)
    style = spin.style()
    up = style.subControlRect(QStyle.ComplexControl.CC_SpinBox, option,
                              QStyle.SubControl.SC_SpinBoxUp, spin)
    down = style.subControlRect(QStyle.ComplexControl.CC_SpinBox, option,
                                QStyle.SubControl.SC_SpinBoxDown, spin)
    image = spin.grab().toImage()
    return [image.copy(r) for r in (up, down)], (up, down)


def test_an_invalid_spin_box_keeps_its_arrows_and_is_framed_red(make_window, qtbot):
    window = make_window()
    dialog = open_preferences(window, qtbot)
    field = dialog.fields["context.window"]
    spin = field.editor.spin
    type_into(qtbot, spin, "4096")
    qtbot.wait(20)
    valid, rects = arrows(spin)
    type_into(qtbot, spin, "100")
    assert field.error.isVisible()
    qtbot.wait(20)
    invalid, rects_then = arrows(spin)
    assert rects_then == rects  # the buttons are where they were
    assert [i == v for i, v in zip(invalid, valid)] == [True, True]  # and drawn as they were
    assert spin.style().metaObject().className() != "QStyleSheetStyle"
    # the mark: red pixels just outside the spin box, on the editor
    image = field.editor.grab().toImage()
    box = QRect(spin.mapTo(field.editor, QPoint(0, 0)), spin.size())
    red = QColor("#c0392b").rgb()
    around = [image.pixel(box.left() - 1, box.center().y()),
              image.pixel(box.center().x(), box.top() - 1),
              image.pixel(box.center().x(), box.bottom() + 1)]
    assert around == [red] * 3, [hex(p) for p in around]
    type_into(qtbot, spin, "4096")
    image = field.editor.grab().toImage()
    assert image.pixel(box.left() - 1, box.center().y()) != red


# -- 4. the live budget -----------------------------------------------------------------


def test_the_budget_shows_every_line_at_the_dialogs_size(make_window, qtbot, data_dir):
    window = seeded_window(make_window, qtbot, data_dir)
    dialog = open_preferences(window, qtbot)
    qtbot.wait(50)
    scroll = dialog.budget_box.findChild(QScrollArea, "live-breakdown-scroll")
    label = dialog.breakdown
    lines = label.text().splitlines()
    assert len(lines) >= 9, lines
    qtbot.waitUntil(lambda: label.height() <= scroll.viewport().height(), timeout=5_000)
    assert scroll.verticalScrollBar().maximum() == 0  # nothing to scroll to
    viewport = QRect(scroll.viewport().mapToGlobal(QPoint(0, 0)), scroll.viewport().size())
    shown = QRect(label.mapToGlobal(QPoint(0, 0)), label.size())
    assert viewport.contains(shown), (viewport, shown)
    # each line's own rectangle (the label's text, line by line) inside the box
    height = label.fontMetrics().lineSpacing()
    assert label.contentsRect().height() >= height * len(lines)
    assert dialog.budget_box.geometry().bottom() < dialog.buttons.geometry().top()


def test_the_fix_sentence_is_said_once(make_window, qtbot, data_dir):
    window = seeded_window(make_window, qtbot, data_dir)
    dialog = open_preferences(window, qtbot)
    ratio = dialog.fields["context.token_budget_ratio"]
    type_into(qtbot, ratio.editor.spin, "1.5")
    sentence = "Fix the marked values to see the budget (Context ⚠)."
    qtbot.waitUntil(lambda: dialog.meter.problem == sentence, timeout=5_000)
    box = dialog.budget_box
    said = [w.text() for w in (box.breakdown, box.problem, box.window_line)
            if w.isVisible() and w.text()]
    assert not any("Fix the marked values" in text for text in said), said
    assert not box.sentences.isVisible()
    type_into(qtbot, ratio.editor.spin, "0.7")
    qtbot.waitUntil(lambda: box.breakdown.text() != "" and box.sentences.isVisible(),
                    timeout=5_000)


# -- 5. plain words -----------------------------------------------------------------------


JARGON = re.compile(r"model's n_ctx|never pruned|Count floor|unsummarized|verbatim tail|"
                    r"ceil\(|trigger tokens|compact once")


def test_the_context_settings_and_the_budget_speak_plainly(make_window, qtbot, data_dir):
    window = seeded_window(make_window, qtbot, data_dir)
    dialog = open_preferences(window, qtbot)
    for key, field in dialog.fields.items():
        if key.startswith("context."):
            assert not JARGON.search(field.hint.text()), (key, field.hint.text())
    assert "auto: the context size the model was loaded with" in (
        dialog.fields["context.window"].hint.text())
    assert "[Tool output cleared]" in dialog.fields["context.prune_protect_turns"].hint.text()
    assert "0 = never by count" in dialog.fields["context.compaction_min_turns"].hint.text()
    text = dialog.breakdown.text()
    for old in ("Turn floor:", "Protect:", "unsummarized turn(s)", "Compaction threshold:"):
        assert old not in text, text
    assert "Red line:" in text and "(the dashed line)" in text
    assert "Tool output: the newest 2 turns keep theirs" in text


def test_a_red_line_above_the_budget_gets_a_note_not_an_error(make_window, qtbot):
    window = make_window()
    dialog = open_preferences(window, qtbot)
    threshold = dialog.fields["context.compaction_threshold"]
    type_into(qtbot, threshold.editor.spin, "0.8")  # above the budget, 0.70
    assert threshold.note.isVisible() and "seldom reached" in threshold.note.text()
    assert not threshold.error.isVisible() and dialog.ok_button.isEnabled()
    assert threshold.note.text() in threshold.editor.spin.accessibleDescription()
    type_into(qtbot, threshold.editor.spin, "0.5")  # below it: both lines count
    assert not threshold.note.isVisible()
    type_into(qtbot, dialog.fields["context.token_budget_ratio"].editor.spin, "0.4")
    assert threshold.note.isVisible() and "(0.4)" in threshold.note.text()
