"""The main window as a newcomer met it (session 64's newcomer audit), each on real Qt
widgets offscreen over a real data folder:

- the meter's tooltip padded its numbers with spaces in a proportional font (they
  zig-zagged), did not say what "Free" is, and said "Compaction threshold" where
  summaries mostly start at the budget's dashed line;
- the inspector's first sentence had no subject ("the system prompt and 4 messages, …");
- the welcome panel's model card appeared above the examples once the model was ready,
  pushing them down as the newcomer went to click one;
- the disabled Send button said "Send (Enter)" while the model loaded, and nothing said
  when a draft typed meanwhile could be sent;
- the quit question while replying did not say what becomes of the reply;
- at 1024 px the model's label kept 380 px while a passing message got 250 and was cut.
"""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QPoint, Qt  # noqa: E402
from PySide6.QtGui import Qt as GuiQt  # noqa: E402  (mightBeRichText)
from PySide6.QtGui import QTextCursor, QTextDocument, QTextTable  # noqa: E402

from iris_desktop.core.store import Store  # noqa: E402

from support.fakes import ScriptedRuntime  # noqa: E402
from support.windows import settle  # noqa: E402

BREAKDOWN = {"window": 8192, "ratio": 0.7, "budget": 5734, "system": 25, "tools": 0,
             "summary": 0, "recall": 0, "history": 314, "draft": 0, "available": 5709,
             "threshold": 6144, "used": 339, "free": 7853}


def _tables(html: str) -> list[list[list[str]]]:
    """The tables of rich text, as Qt lays them out: rows of cell texts."""
    doc = QTextDocument()
    doc.setHtml(html)
    found = []
    for frame in doc.rootFrame().childFrames():
        if isinstance(frame, QTextTable):
            rows = []
            for r in range(frame.rows()):
                row = []
                for c in range(frame.columns()):
                    cell = frame.cellAt(r, c)
                    cursor = cell.firstCursorPosition()
                    cursor.setPosition(cell.lastCursorPosition().position(),
                                       QTextCursor.MoveMode.KeepAnchor)
                    row.append(cursor.selectedText())
                rows.append(row)
            found.append(rows)
    return found


def _plain(html: str) -> str:
    doc = QTextDocument()
    doc.setHtml(html)
    return doc.toPlainText()


def test_the_meter_tooltip_is_a_table_of_the_numbers_and_says_what_the_lines_are(make_window):
    window = make_window()
    meter = window.meter
    meter.set_breakdown(BREAKDOWN, dropped=3, note="Model loaded at 16,384 tokens")
    tip = meter.toolTip()
    assert GuiQt.mightBeRichText(tip)
    tables = _tables(tip)
    assert len(tables) == 1
    assert tables[0] == [["System", "25"], ["Tools", "0"], ["Summary", "0"], ["Recall", "0"],
                         ["History", "314"], ["Draft", "0"], ["Used", "339"],
                         ["Free (the reply is written here, up to model.max_tokens)", "7,853"]]
    text = _plain(tip)
    lines = text.splitlines()
    assert lines[0].startswith("3 earlier turns are not sent: past the budget (the dashed line).")
    assert lines[1] == "Model loaded at 16,384 tokens"
    assert lines[2] == "Context window: 8,192 tokens (exact counts)"
    assert "Budget (the dashed line): window × 0.7 = 5,734 tokens" in text
    assert "Red line: 6,144 tokens." in text
    from iris_desktop.core.meter_words import WHEN_SUMMARIZED, meter_tooltip

    assert WHEN_SUMMARIZED in text and "whichever comes first" in WHEN_SUMMARIZED
    assert "Compaction threshold" not in text
    # a screen reader gets the words, never the markup
    said = meter.accessibleDescription()
    assert "<" not in said and "339 of 8,192 tokens used." in said and "7,853" in said
    # the plain form (a monospaced terminal's) keeps its columns
    plain = meter_tooltip(BREAKDOWN).splitlines()
    numbers = [line for line in plain if line.rstrip()[-1:].isdigit() and ":" not in line]
    assert len(numbers) == 8 and len({len(line) for line in numbers}) == 1, plain


def test_every_place_that_explains_the_lines_says_when_summaries_start(make_window, qtbot):
    window = make_window()
    welcome = window.welcome.text.text()
    assert "whichever comes first" in welcome and "compaction mark" not in welcome
    assert "when a request reaches it, the oldest turns are summarized" not in welcome
    store = window.host.store
    thread = store.create_thread("a chat")
    store.add_messages(thread, [{"role": "user", "content": "hello"},
                                {"role": "assistant", "content": "hi"}] * 2)
    window.inspector.toggleViewAction().trigger()  # View ▸ Context inspector
    window.open_thread(thread)
    dock = window.inspector
    qtbot.waitUntil(lambda: dock.report is not None and dock.thread_id == thread, timeout=20_000)
    window.send("And now?")
    qtbot.waitUntil(lambda: not window.generating, timeout=10_000)
    qtbot.waitUntil(lambda: bool(dock.chart_label.text()), timeout=10_000)
    legend = dock.chart_label.text()
    assert "the compaction threshold, as on the meter" not in legend
    assert "the oldest turns no longer fit the budget" in legend
    # the first sentence has a subject, and says "of the window" once
    first = dock.request_label.text()
    assert first.startswith("Next request: the system prompt and "), first
    assert " tokens of the " not in first.split("(")[0] and "-token window (" in first


def test_the_examples_stay_put_when_the_model_card_appears(make_window, qtbot):
    window = make_window()
    window.resize(1400, 900)
    panel = window.welcome
    card = panel.recommend
    card.hide()
    qtbot.wait(50)
    where = [b.mapTo(panel, QPoint(0, 0)).y() for b in panel.examples]
    card.text.setText("The model that came with Iris is small. For this computer Iris "
                      "suggests a larger one.")
    card.button.setText("Download it (1.1 GB)")
    card.button.show()
    card.show()
    qtbot.waitUntil(lambda: card.height() > 40, timeout=2_000)
    qtbot.wait(50)
    assert [b.mapTo(panel, QPoint(0, 0)).y() for b in panel.examples] == where
    assert card.mapTo(panel, QPoint(0, 0)).y() > where[-1]  # under them


def test_send_says_why_it_waits_and_the_draft_is_said_sendable_once(make_window, qtbot):
    runtime = ScriptedRuntime(["Hello."])
    window = make_window(runtime, load=False)
    composer = window.composer
    button = composer.button
    assert not button.isEnabled()
    assert button.toolTip() == "Loading the model…"
    assert button.accessibleDescription() == "Loading the model…"
    said = []
    window.app_state.statusMessage.connect(lambda text, _ms: said.append(text))
    composer.edit.setPlainText("Typed while it loads")
    window.load_model()
    qtbot.waitUntil(lambda: window.model_state == "ready", timeout=60_000)
    settle(qtbot, window)
    assert button.isEnabled() and button.toolTip() == "Send (Enter)"
    assert said.count("Ready: press Enter to send your message") == 1, said
    assert window.status_area.current_message() == "Ready: press Enter to send your message"
    # an empty box at ready says nothing of the kind
    composer.set_can_send(False, "Loading the model…")
    composer.edit.clear()
    composer.set_can_send(True)
    assert said.count("Ready: press Enter to send your message") == 1


def test_the_quit_question_says_the_reply_is_kept_and_it_is(make_window, qtbot):
    window = make_window(ScriptedRuntime([" ".join(["word"] * 400)], delay_s=0.05))
    window.send("Tell me a long story")
    qtbot.waitUntil(lambda: window.generating, timeout=5_000)
    entries = window.view.transcript.entries
    qtbot.waitUntil(lambda: bool(entries()) and "word word" in (entries()[-1].text or ""),
                    timeout=10_000)
    box = window.ask_quit()
    assert box.text() == "Stop the reply and quit? What it has written so far is kept."
    thread = window.thread_id
    quit_button = next(b for b in box.buttons() if b.text().replace("&", "") == "Quit")
    qtbot.mouseClick(quit_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window._closed, timeout=10_000)
    with Store(window.host.paths.db_path) as store:
        reply = store.messages(thread)[-1]
    assert reply["role"] == "assistant" and reply["content"].startswith("word word")
    assert reply["status"] == "interrupted", reply["status"]  # shown as stopped


MODEL = "Qwen2.5-Coder-0.5B-Instruct · 8,192-token window · CPU"
IMPORTED = "Imported 40 chats from a ChatGPT export (conversations.json)"


def test_at_1024_px_a_passing_message_gets_the_room_and_the_model_label_gives_way(
        make_window, qtbot):
    window = make_window()
    window.resize(1024, 700)
    window.model_label.setText(MODEL)
    qtbot.wait(100)
    label, message = window.model_label, window.status_area.message
    assert label.shown_text() == MODEL  # room for all of it while the sentence is short
    window.app_state.show_message(IMPORTED, 10_000)
    qtbot.waitUntil(lambda: message.shown_text() == IMPORTED, timeout=2_000)
    qtbot.wait(50)
    assert message.shown_text() == IMPORTED  # whole, not "Imported 40 chats from a ChatGPT…"
    assert message.fontMetrics().horizontalAdvance(IMPORTED) <= message.contentsRect().width()
    shown = label.shown_text()
    assert shown != MODEL and shown.endswith("…") and MODEL.startswith(shown[:-1].rstrip(" ·"))
    assert shown.startswith("Qwen2.5-Coder-0.5B-Instruct")  # the name stays
    assert MODEL in _plain(label.toolTip()).replace("\xa0", " ")  # all of it in the tooltip
    bar = window.statusBar()
    right = message.mapTo(bar, QPoint(message.width(), 0)).x()
    assert right <= label.mapTo(bar, QPoint(0, 0)).x()
    assert window.meter.mapTo(bar, QPoint(window.meter.width(), 0)).x() <= bar.width()
    window.status_area.end_message()  # the message goes: the label has its room back
    qtbot.waitUntil(lambda: label.shown_text() == MODEL, timeout=2_000)



#: a sentence of 100 characters (an import's, a slow reply's cause)
SLOW = ("Imported 1 chat from a text-generation-webui chat history. 1 other file was left out: "
        "see the note.")


def test_at_the_default_size_a_long_sentence_is_read_whole_and_the_model_label_gives_way(
        make_window, qtbot):
    """A newcomer audit (session 66): at 1280×800 the sentences that say why or what to do
    were cut at 64 characters ("…3 characters' replies are marked with their…", the slow
    hint's cause: "…keep the processor busy (load 4.0 on 2…"), while the model's label kept
    its whole width. Now a sentence takes up to 120 characters' room first."""
    window = make_window()
    window.resize(1280, 800)
    window.model_label.setText(MODEL)
    qtbot.wait(100)
    state = window.status_area.state
    window.app_state.show_status(SLOW)
    qtbot.waitUntil(lambda: state.shown_text() == SLOW, timeout=2_000)
    qtbot.wait(50)
    assert state.shown_text() == SLOW
    assert window.model_label.shown_text().startswith("Qwen2.5-Coder-0.5B-Instruct")
