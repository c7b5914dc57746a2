"""The transcript view on its own (no model, no host): highlighted code blocks and their
Copy buttons, selecting part of a message, the actions of a message, the switcher, the
attachment chips, Home and End."""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QPoint, Qt  # noqa: E402
from PySide6.QtGui import QColor, QGuiApplication, QPalette, QTextCursor  # noqa: E402
from PySide6.QtWidgets import QDialogButtonBox  # noqa: E402

from iris_desktop.core.views import Entry  # noqa: E402
from iris_desktop.ui.highlight import CodeTheme, code_boxes, split_fences  # noqa: E402
from iris_desktop.ui.transcript_model import MAX_ROWS, PAGE  # noqa: E402
from iris_desktop.ui.transcript_text import MessageText  # noqa: E402

from support.windows import code_block_colours  # noqa: E402

CODE = 'def greet(name):\n    """Say hello."""\n    return f"hi {name}"  # 42'
REPLY = f"Here it is:\n\n```python\n{CODE}\n```\n\nCall it with **a name**."


def message(mid: int, role: str, text: str, **kw) -> Entry:
    return Entry("message", f"m:{mid}", mid, role, mid, text, **kw)


@pytest.fixture
def view(transcript_view):
    return transcript_view


def show(view, qtbot, entries: list[Entry]) -> None:
    view.transcript.set_entries(entries)
    view.doItemsLayout()
    qtbot.wait(10)


def code_colours(doc) -> set[str]:
    (block, _, _), = code_boxes(doc)
    return code_block_colours(doc, block)


def test_fences_split_into_prose_and_code_a_streaming_one_runs_to_the_end():
    assert split_fences(REPLY) == [("Here it is:\n", None), (CODE, "python"),
                                   ("\nCall it with **a name**.", None)]
    assert split_fences("so far:\n~~~\nx = 1\n") == [("so far:", None), ("x = 1", "")]


def test_a_code_block_is_highlighted_labelled_and_its_copy_button_copies_the_code(view, qtbot):
    show(view, qtbot, [message(1, "user", "Write greet"), message(2, "assistant", REPLY)])
    index = view.transcript.index(1)
    doc = view.delegate._doc(view.transcript.entry(1), view.delegate.body_width())
    (block, box, _), = code_boxes(doc)
    assert block.label == "python" and block.code == CODE
    assert len(code_colours(doc)) > 1
    assert "```" not in doc.toPlainText()
    rect, = view.delegate.code_copy_rects(index)
    with qtbot.waitSignal(view.copied) as copied:
        qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert QGuiApplication.clipboard().text() == CODE == copied.args[0]
    assert view.text_editor is None  # a click on Copy does not start a selection


def test_copy_gives_a_code_block_as_stored_and_says_it_holds_direction_characters(view, qtbot):
    """Before (an audit): the block's Copy gave the code as the window shows it, with
    ``\\u202e`` typed out in place of the character (not the code stored), while
    Ctrl+C on the message gave the stored characters. Now both give what is stored, and
    the status bar says it holds characters that change the direction."""
    from iris_desktop.untrusted import copied_note

    code = 'access = "user\u202e \u2066// admin\u2069 \u2066"'
    reply = f"Look:\n\n```python\n{code}\n```\n"
    show(view, qtbot, [message(1, "user", "hi"), message(2, "assistant", reply)])
    index = view.transcript.index(1)
    doc = view.delegate._doc(view.transcript.entry(1), view.delegate.body_width())
    assert "\\u202e" in doc.toPlainText() and "\u202e" not in doc.toPlainText()  # shown escaped
    rect, = view.delegate.code_copy_rects(index)
    with qtbot.waitSignal(view.copied) as copied:
        qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert QGuiApplication.clipboard().text() == code == copied.args[0]
    assert copied_note(code).startswith("Copied; it holds 4 characters that change the direction")
    assert copied_note(CODE) == "Copied"


def test_a_fence_without_a_language_is_guessed_or_text_and_user_messages_highlight_too(view, qtbot):
    show(view, qtbot, [message(1, "user", "```\nimport os\nfor i in range(3):\n    print(i)\n```"),
                       message(2, "assistant", "```\nhello there\n```")])
    labels = [[b.label for b, _, _ in code_boxes(view.delegate._doc(e, view.delegate.body_width()))]
              for e in view.transcript.entries()]
    assert labels == [["python"], ["text"]]


def test_code_colours_follow_a_dark_palette_and_stay_readable(view, qtbot):
    show(view, qtbot, [message(1, "assistant", REPLY)])
    entry = view.transcript.entry(0)
    light = code_colours(view.delegate._doc(entry, view.delegate.body_width()))
    dark = QPalette()
    for role, colour in ((QPalette.ColorRole.Window, "#202124"), (QPalette.ColorRole.Base, "#17181a"),
                         (QPalette.ColorRole.Text, "#e8e8e8"), (QPalette.ColorRole.WindowText, "#e8e8e8")):
        dark.setColor(role, QColor(colour))
    view.setPalette(dark)
    theme = view.delegate._code_theme()
    assert theme.dark
    doc = view.delegate._doc(entry, view.delegate.body_width())
    colours = code_colours(doc)
    assert colours != light and len(colours) > 1
    from iris_desktop.ui.highlight import contrast

    assert all(contrast(QColor(c), theme.background) >= 4.5 for c in colours)
    assert not CodeTheme(QPalette(QColor("#f0f0f0")), QGuiApplication.font()).dark


def test_a_block_still_streaming_is_highlighted_once_it_closes(view, qtbot):
    so_far = f"Here it is:\n\n```python\n{CODE}\n"
    show(view, qtbot, [message(1, "assistant", so_far, status="streaming")])
    width = view.delegate.body_width()
    assert len(code_colours(view.delegate._doc(view.transcript.entry(0), width))) == 1
    view.transcript.update(0, text=so_far + "```\n", status="complete")
    assert len(code_colours(view.delegate._doc(view.transcript.entry(0), width))) > 1


def press_text(view, qtbot, row: int) -> MessageText:
    index = view.transcript.index(row)
    text = view.delegate.geometry(index)["text"]
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton,
                     pos=QPoint(text.left() + 5, text.top() + 5))
    editor = view.text_editor
    assert isinstance(editor, MessageText)
    return editor


def test_part_of_a_message_is_selected_and_copied(view, qtbot):
    text = "The quick brown fox jumps over the lazy dog."
    show(view, qtbot, [message(1, "user", text), message(2, "assistant", REPLY)])
    editor = press_text(view, qtbot, 0)
    assert editor.document() is view.delegate._doc(view.transcript.entry(0), view.delegate.body_width())
    assert editor.geometry() == view.delegate.geometry(view.transcript.index(0))["text"]
    assert view.current_entry().key == "m:1"
    cursor = editor.textCursor()
    cursor.setPosition(4)
    cursor.setPosition(15, QTextCursor.MoveMode.KeepAnchor)
    editor.setTextCursor(cursor)
    with qtbot.waitSignal(view.copied):
        qtbot.keyClick(editor, Qt.Key.Key_C, Qt.KeyboardModifier.ControlModifier)
    assert QGuiApplication.clipboard().text() == "quick brown"
    assert view.copy_selection() and QGuiApplication.clipboard().text() == "quick brown"
    QGuiApplication.clipboard().clear()
    assert QGuiApplication.focusObject() is editor  # Edit ▸ Copy calls the focused widget's copy()
    QGuiApplication.focusObject().copy()
    assert QGuiApplication.clipboard().text() == "quick brown"
    cursor.clearSelection()
    editor.setTextCursor(cursor)
    assert not view.copy_selection()
    view.copy()  # nothing selected: the whole message, as before
    assert QGuiApplication.clipboard().text() == text


def test_a_mouse_drag_selects_and_one_editor_at_most(view, qtbot):
    show(view, qtbot, [message(1, "user", "alpha beta gamma delta"), message(2, "assistant", REPLY)])
    text = view.delegate.geometry(view.transcript.index(0))["text"]
    y = text.top() + 5
    qtbot.mousePress(view.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(text.left() + 1, y))
    qtbot.mouseMove(view.viewport(), QPoint(text.right() - 2, y))
    qtbot.mouseRelease(view.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(text.right() - 2, y))
    editor = view.text_editor
    assert editor is not None and editor.has_selection()
    assert view.copy_selection() and QGuiApplication.clipboard().text().startswith("alpha beta")
    second = press_text(view, qtbot, 1)  # another row: the first editor closes
    qtbot.wait(10)
    assert second is not editor
    assert len([w for w in view.viewport().findChildren(MessageText) if w.isVisible()]) == 1
    view.transcript.append_text("m:2", " More.")  # its entry changed (a streamed token)
    assert view.text_editor is None and view.delegate.editing is None


def test_the_context_menu_offers_what_the_entry_allows(view, qtbot):
    show(view, qtbot, [message(1, "user", "hi"),
                       message(2, "assistant", "hello", can_regenerate=True, can_continue=True),
                       message(3, "assistant", "plain")])

    def actions(row: int) -> list[str]:
        return [a.text() for a in view.context_menu(view.transcript.index(row)).actions()]

    assert actions(0) == ["Copy message", "Edit…"]
    assert actions(1) == ["Copy message", "Regenerate", "Continue"]
    assert actions(2) == ["Copy message"]
    menu = view.context_menu(view.transcript.index(1))
    for name, signal in (("Regenerate", view.regenerateRequested), ("Continue", view.continueRequested)):
        with qtbot.waitSignal(signal) as emitted:
            next(a for a in menu.actions() if a.text() == name).trigger()
        assert emitted.args == [2]


def test_the_edit_dialog_emits_the_new_text_on_save_and_nothing_on_cancel(view, qtbot):
    show(view, qtbot, [message(7, "user", "old text")])
    edits = []
    view.editRequested.connect(lambda mid, text: edits.append((mid, text)))
    edit = next(a for a in view.context_menu(view.transcript.index(0)).actions() if a.text() == "Edit…")
    edit.trigger()
    dialog = view.edit_dialog
    assert dialog.isVisible() and dialog.text() == "old text"
    qtbot.mouseClick(dialog.buttons.button(QDialogButtonBox.StandardButton.Cancel), Qt.MouseButton.LeftButton)
    assert edits == [] and not dialog.isVisible()
    dialog = view.edit_message(view.transcript.entry(0))
    qtbot.mouseClick(dialog.buttons.button(QDialogButtonBox.StandardButton.Save), Qt.MouseButton.LeftButton)
    assert edits == []  # unchanged
    dialog = view.edit_message(view.transcript.entry(0))
    dialog.editor.setPlainText("   \n")
    qtbot.mouseClick(dialog.buttons.button(QDialogButtonBox.StandardButton.Save), Qt.MouseButton.LeftButton)
    assert edits == []  # blank
    dialog = view.edit_message(view.transcript.entry(0))
    dialog.editor.setPlainText("new text")
    qtbot.mouseClick(dialog.buttons.button(QDialogButtonBox.StandardButton.Save), Qt.MouseButton.LeftButton)
    assert edits == [(7, "new text")]


def test_escape_on_a_changed_edit_asks_before_discarding_it(view, qtbot):
    show(view, qtbot, [message(7, "user", "old text")])
    edits = []
    view.editRequested.connect(lambda mid, text: edits.append((mid, text)))
    dialog = view.edit_message(view.transcript.entry(0))
    qtbot.waitUntil(dialog.isVisible)
    dialog.editor.setPlainText("a long rewrite I do not want to lose")
    qtbot.keyClick(dialog.editor, Qt.Key.Key_Escape)
    box = dialog.discard_box
    assert box is not None and box.isVisible() and dialog.isVisible()
    assert "Discard your edit of this message?" in box.text()
    assert box.defaultButton().text() == "Keep editing"
    qtbot.keyClick(box, Qt.Key.Key_Escape)  # Escape answers "Keep editing"
    qtbot.waitUntil(lambda: not box.isVisible())
    assert dialog.isVisible() and dialog.text() == "a long rewrite I do not want to lose"
    dialog.close()  # the title bar's close asks too
    box = dialog.discard_box
    assert box is not None and box.isVisible() and dialog.isVisible()
    discard = next(b for b in box.buttons() if b.text() == "Discard")
    qtbot.mouseClick(discard, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not dialog.isVisible())
    assert edits == []
    dialog = view.edit_message(view.transcript.entry(0))  # unchanged: Escape closes at once
    qtbot.waitUntil(dialog.isVisible)
    qtbot.keyClick(dialog.editor, Qt.Key.Key_Escape)
    assert not dialog.isVisible() and dialog.discard_box is None


def test_the_switcher_emits_only_where_there_is_an_alternative(view, qtbot):
    show(view, qtbot, [message(1, "user", "hi"), message(2, "assistant", "first", branch=(1, 2))])
    index = view.transcript.index(1)
    prev, label, nxt = view.delegate.geometry(index)["switch"]
    assert view.delegate.geometry(view.transcript.index(0))["switch"] is None
    switches = []
    view.switchRequested.connect(lambda mid, step: switches.append((mid, step)))
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=prev.center())
    assert switches == []  # ‹ at the first alternative
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=nxt.center())
    assert switches == [(2, 1)]


def test_attachment_chips_are_painted_under_a_user_message(view, qtbot):
    plain = message(1, "user", "see the notes")
    attached = message(2, "user", "see the notes", attachments=[("notes.md", 1234), ("a.py", 56)])
    show(view, qtbot, [plain, attached])
    assert view.delegate.height_for(attached) > view.delegate.height_for(plain)
    chips = view.delegate.geometry(view.transcript.index(1))["chips"]
    assert [text for _, text in chips] == ["notes.md · 1,234 tokens", "a.py · 56 tokens"]
    assert view.delegate.geometry(view.transcript.index(0))["chips"] == []
    view.grab()  # paints without error


def test_home_reaches_the_first_entry_and_end_the_last(view, qtbot):
    entries = [message(i, "user" if i % 2 else "assistant", f"message {i}") for i in range(1, 501)]
    show(view, qtbot, entries)
    assert view.transcript.has_older
    view.setFocus()
    qtbot.keyClick(view, Qt.Key.Key_Home, Qt.KeyboardModifier.ControlModifier)
    # the first page, in place of the newest: never all 500 rows laid out at once
    assert not view.transcript.has_older and view.transcript.rowCount() == PAGE
    assert view.transcript.has_newer
    assert view.verticalScrollBar().value() == 0
    assert view.current_entry().key == "m:1"
    assert view.indexAt(QPoint(10, 10)).row() == 0
    qtbot.keyClick(view, Qt.Key.Key_End)
    qtbot.waitUntil(view.at_bottom)
    assert view.current_entry().key == "m:500"


def test_html_in_a_message_is_shown_as_the_text_it_is(view, qtbot):
    """Before: markdown read raw HTML, so a reply about "the <span> element" showed
    "Use the " and nothing after; a message's <img> or <a> would have been drawn."""
    reply = ('**Use** the <span> element, or <b>bold</b>, and <img src="/etc/logo.png">; '
             'see <a href="https://example.com">this</a>.\n\n```html\n<p>hi</p>\n```\n'
             'Then <div> again.')
    show(view, qtbot, [message(1, "assistant", reply)])
    shown = view.delegate._doc(view.transcript.entry(0), 600).toPlainText()
    for text in ('Use the <span> element, or <b>bold</b>, and <img src="/etc/logo.png">',
                 '<a href="https://example.com">this</a>', "<p>hi</p>", "Then <div> again."):
        assert text in shown


def _long_chat(n: int) -> list[Entry]:
    return [message(i, "user" if i % 2 else "assistant", f"message {i}: " + "words " * (i % 7 * 9))
            for i in range(1, n + 1)]


def _top_key(view) -> str:
    return view.transcript.entry(view.indexAt(QPoint(10, 2)).row()).key


def _measured(view) -> list[str]:
    """The entries whose height the next layout asks for (each one is text laid out)."""
    asked = []
    height_for = view.delegate.height_for
    view.delegate.height_for = lambda entry, width=None: asked.append(entry.key) or height_for(entry, width)
    return asked


def test_a_20000_message_chat_lays_out_a_few_hundred_rows_at_most(view, qtbot):
    """Before: Home revealed every message as a row, so Home itself, every streamed token
    that added a line and every resize measured all 20,000 (3.5 s a layout; 15 s stalls
    while a reply streamed after Home). Now Home shows the first page in place of the
    newest, and scrolling up lets the newest rows go past MAX_ROWS."""
    show(view, qtbot, _long_chat(20_000))
    view.setFocus()
    qtbot.keyClick(view, Qt.Key.Key_Home, Qt.KeyboardModifier.ControlModifier)
    assert view.current_entry().key == "m:1" and view.transcript.rowCount() == PAGE
    asked = _measured(view)
    view.resize(640, 500)  # a resize measures every row shown again
    view.doItemsLayout()
    assert 0 < len(set(asked)) <= PAGE
    qtbot.keyClick(view, Qt.Key.Key_End, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(view.at_bottom)
    assert view.current_entry().key == "m:20000" and not view.transcript.has_newer
    for _ in range(12):  # the wheel to the top, page after page
        view.verticalScrollBar().setValue(0)
        assert view.transcript.rowCount() <= MAX_ROWS
    assert view.transcript.has_newer  # the newest rows let go
    asked.clear()
    view.doItemsLayout()
    assert len(set(asked)) <= MAX_ROWS


def test_a_page_that_fits_the_view_is_not_a_dead_end(view, qtbot):
    """Home on a tall window whose first page of one-line messages fits in it: with no
    scroll bar, no scrolling could reveal the next page (only End got out)."""
    show(view, qtbot, [message(i, "user", "hi") for i in range(1, 1001)])
    view.resize(700, 4000)
    view.go_top()
    assert view.transcript.rowCount() > PAGE and view.verticalScrollBar().maximum() > 0
    assert view.current_entry().key == "m:1"


def test_scrolling_up_and_down_a_long_chat_keeps_the_text_in_view(view, qtbot):
    show(view, qtbot, _long_chat(1_000))
    view.scrollToBottom()
    bar = view.verticalScrollBar()
    for _ in range(10):  # up: the first row stays at the top as a page comes in above it
        before = view.transcript.entry(0).key
        bar.setValue(0)
        assert _top_key(view) == before and bar.value() > 0
    first = view.transcript.entry(0).key
    assert view.transcript.has_newer and view.transcript.rowCount() == MAX_ROWS
    bottom = QPoint(10, view.viewport().height() - 2)
    while view.transcript.has_newer:  # down: the last row stays at the bottom as rows go
        before = view.transcript.entry(view.transcript.rowCount() - 1).key
        bar.setValue(bar.maximum())
        assert view.transcript.entry(view.indexAt(bottom).row()).key == before
    assert view.transcript.entry(0).key != first
    assert view.transcript.entry(view.transcript.rowCount() - 1).key == "m:1000"


def test_a_reply_streams_on_while_the_user_reads_the_start_of_a_long_chat(view, qtbot):
    chat = _long_chat(1_000)
    show(view, qtbot, chat + [message(1001, "assistant", "Once", status="streaming")])
    view.go_top()
    assert view.transcript.row_of("m:1001") is None
    assert view.transcript.append_text("m:1001", " upon a time") is None  # not a row
    assert view.current_entry().key == "m:1"  # the reader stays where they are
    view.go_bottom()
    qtbot.waitUntil(view.at_bottom)
    assert view.current_entry().text == "Once upon a time"
    view.go_top()
    row = view.transcript.append(message(1002, "user", "and then?"))  # a new message: the newest
    assert view.transcript.entry(row).key == "m:1002" and not view.transcript.has_newer


def test_the_editor_closes_when_scrolled_away_or_the_palette_changes(view, qtbot):
    show(view, qtbot, [message(i, "user", f"message {i}\n" * 6) for i in range(1, 30)])
    view.scrollToTop()
    press_text(view, qtbot, 0)
    view.scrollToBottom()
    assert view.text_editor is None
    press_text(view, qtbot, view.transcript.rowCount() - 1)
    view.setPalette(QPalette(QColor("#303030")))
    assert view.text_editor is None and view.delegate.editing is None


def test_a_wide_window_centres_the_conversation_in_a_readable_column(make_window, qtbot, data_dir):
    """Before: on a 2,400-pixel window each line ran the full width (some 300 characters).
    Now the cards are a column of about 95 characters, centred; a narrow window still
    uses its whole width."""
    from iris_desktop.core.store import Store
    from iris_desktop.paths import app_paths
    from iris_desktop.ui.transcript_parts import COLUMN_FONT_HEIGHTS

    from support.windows import settle

    with Store(app_paths(data_dir).ensure().db_path) as store:
        thread = store.create_thread("wide")
        store.add_messages(thread, [{"role": "user", "content": "word " * 400},
                                    {"role": "assistant", "content": "reply " * 400}])
    window = make_window()
    window.open_thread(thread)
    settle(qtbot, window)
    view = window.view
    delegate = view.itemDelegate()
    unit = delegate._unit()
    for width, wide in ((2400, True), (900, False)):
        window.resize(width, 800)
        qtbot.wait(100)
        card = delegate.geometry(view.model().index(0, 0))["card"]
        viewport = view.viewport().width()
        if wide:
            assert card.width() <= COLUMN_FONT_HEIGHTS * unit
            assert abs(card.left() - (viewport - card.right())) <= 2  # centred
        else:
            assert card.width() >= viewport - 2 * unit and card.left() < unit


def test_a_huge_message_is_shown_in_part_and_copied_whole(view, qtbot):
    """Before (an audit): a chat holding a 20 MB paste took 16 s to open, the window frozen
    10 s at each paint; one of 300 MB never showed. A card lays out at most
    MAX_SHOWN_CHARS and says so; Copy gives the message whole."""
    from PySide6.QtGui import QGuiApplication

    from iris_desktop.ui.transcript_parts import MAX_SHOWN_CHARS

    huge = "word " * 1_000_000  # 5,000,000 characters
    show(view, qtbot, [message(1, "user", huge), message(2, "assistant", "**ok** " * 30_000)])
    doc = view.delegate._doc(view.transcript.entry(0), view.delegate.body_width())
    shown = doc.toPlainText()
    assert len(shown) < MAX_SHOWN_CHARS + 200
    assert shown.endswith("[shown in part: the first 100,000 of 5,000,000 characters (5 MB); "
                          "Copy or File ▸ Export gives all of it]")
    short = view.delegate._doc(view.transcript.entry(1), view.delegate.body_width())
    assert "[shown in part: the first 100,000 of 210,000 characters" in short.toPlainText()
    view.setCurrentIndex(view.transcript.index(0))
    view.copy()
    assert QGuiApplication.clipboard().text() == huge


def test_a_code_block_the_cut_falls_in_is_closed_and_copies_whole(view, qtbot):
    """A review: cut inside a fenced block, the note showed as code and the block's Copy
    gave the cut code."""
    code = "\n".join(f"print({n})" for n in range(20_000))
    reply = "intro " * 16_000 + "\n```python\n" + code + "\n```\nThat is all."
    show(view, qtbot, [message(1, "user", "Code please"), message(2, "assistant", reply)])
    doc = view.delegate._doc(view.transcript.entry(1), view.delegate.body_width())
    (block, _, _), = code_boxes(doc)
    assert block.code == code  # the block's Copy gives all of it
    assert doc.toPlainText().rstrip().endswith("Copy or File ▸ Export gives all of it]")
    assert "```" not in doc.toPlainText()


def test_a_reply_cut_off_at_its_limit_says_so_on_its_card():
    """A newcomer's first hour (an audit): a reply cut off at model.max_tokens had no mark
    on its card (a stopped one has "stopped"); only a passing status message said so, and
    after a switch of chats nothing did. Its card says it, and so does a screen reader."""
    from iris_desktop.ui.transcript_model import spoken
    from iris_desktop.ui.transcript_parts import badges

    cut = message(2, "assistant", "Mercury, Venus, Earth,", can_continue=True)
    assert ("cut off", "warn") in badges(cut)
    assert spoken(cut).startswith("Iris (cut off): Mercury")
    stopped = message(3, "assistant", "Mercury", status="interrupted", can_continue=True)
    assert [b for b, _ in badges(stopped)] == ["stopped"]  # said once
    assert badges(message(4, "assistant", "A whole answer.")) == []


def test_the_edit_dialog_says_what_sending_the_edit_does(view, qtbot):
    """It said "Save", and the later turns vanished without a word (a newcomer's audit)."""
    show(view, qtbot, [message(7, "user", "first"), message(8, "assistant", "answer"),
                       message(9, "user", "second"), message(10, "assistant", "answer 2")])
    dialog = view.edit_message(view.transcript.entry(0))
    save = dialog.buttons.button(QDialogButtonBox.StandardButton.Save)
    assert save.text() == "Send as a new version"
    assert dialog.note.text() == ("Iris answers the edited message as a new version of the chat "
                                  "from here; this version and the 3 messages after it stay "
                                  "behind the ‹ › switcher on the message.")
    dialog.reject()
    dialog = view.edit_message(view.transcript.entry(2))
    assert "this version and the 1 message after it stay" in dialog.note.text()
    dialog.reject()
