"""The desktop GUI with pytest-qt (QT_QPA_PLATFORM=offscreen), on a real SQLite file.

The real bundled model answers where any answer will do; the scripted runtime is used
only for what the model cannot produce on demand (a tool call, a slow fixed reply).
"""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from PySide6.QtCore import QPoint, Qt, QTimer  # noqa: E402
from PySide6.QtGui import QAction, QKeySequence  # noqa: E402
from PySide6.QtWidgets import QMessageBox, QWidget  # noqa: E402

from iris_desktop.core.events import ReplyToken, RequestSent  # noqa: E402
from iris_desktop.core.store import Store  # noqa: E402
from iris_desktop.core.views import SUMMARY_FIELDS  # noqa: E402
from iris_desktop.host import Host  # noqa: E402
from iris_desktop.paths import app_paths  # noqa: E402
from iris_desktop.settings import SETTINGS, Setting  # noqa: E402
from iris_desktop.ui.settings_dialog import SettingsDialog  # noqa: E402
from iris_desktop.ui.settings_editors import (  # noqa: E402
    ChoiceEditor,
    IntEditor,
    PathEditor,
    RatioEditor,
)
from iris_desktop.ui.transcript import PAGE  # noqa: E402
from iris_desktop.units import file_size  # noqa: E402

from support.fakes import ScriptedRuntime  # noqa: E402
from support.helpers import chat_turns as chat  # noqa: E402
from support.windows import settle  # noqa: E402

FIELDS = {key: f"{label} of the early conversation" for key, label in SUMMARY_FIELDS}


def call(name: str, **arguments) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


def send(qtbot, window, text: str) -> None:
    window.composer.edit.setFocus()
    window.composer.set_text(text)
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)


def wait_turn(qtbot, window, timeout=30_000) -> None:
    qtbot.waitUntil(lambda: not window.generating, timeout=timeout)
    settle(qtbot, window)


def entries(window):
    return window.view.transcript.entries()


def seed_thread(data_dir, messages, title="seeded") -> int:
    from iris_desktop.core.store import Store

    with Store(app_paths(data_dir).ensure().db_path) as store:
        thread = store.create_thread(title)
        store.add_messages(thread, messages)
    return thread


# -- sending ----------------------------------------------------------------------------------


def test_send_streams_a_reply_from_the_real_model(make_window, qtbot, model_path):
    window = make_window(None, overrides={"model.path": str(model_path), "model.max_tokens": "24",
                                    "model.temperature": "0", "model.n_ctx": "4096"})
    assert window.model_state == "ready", window.models.error
    assert "4,096-token window" in window.model_label.text()
    assert "model.n_ctx" in window.model_label.toolTip() and "Q4_K_M" in window.model_label.toolTip()
    tokens, statuses = [], []
    window.model.worker.turnEvent.connect(
        lambda e: isinstance(e, ReplyToken) and tokens.append(e.text))
    window.view.transcript.dataChanged.connect(
        lambda a, b: statuses.append(window.view.transcript.entry(a.row()).status))
    send(qtbot, window, "Hello! What is the capital of France?")
    assert window.composer.button.text() == "Stop"
    wait_turn(qtbot, window)
    assert window.composer.button.text() == "Send"
    shown = entries(window)
    assert [(e.role, e.kind) for e in shown] == [("user", "message"), ("assistant", "message")]
    assert shown[0].text == "Hello! What is the capital of France?"
    assert len(tokens) > 1 and "streaming" in statuses  # it grew token by token
    assert shown[1].status == "complete" and shown[1].text.strip()
    assert shown[1].text == "".join(tokens)
    assert window.composer.text() == ""


def test_stop_cancels_the_reply(make_window, qtbot):
    runtime = ScriptedRuntime([" ".join(f"w{i}" for i in range(400))], delay_s=0.01)
    window = make_window(runtime)
    send(qtbot, window, "Tell me a long story")
    qtbot.waitUntil(lambda: runtime.started.is_set(), timeout=10_000)
    qtbot.waitUntil(lambda: len(entries(window)) == 2 and bool(entries(window)[1].text),
                    timeout=10_000)
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Escape)
    wait_turn(qtbot, window)
    reply = entries(window)[1]
    assert reply.status == "interrupted"
    assert 0 < len(reply.text.split()) < 400
    assert window.state_label.text() == "Stopped"
    assert window.composer.button.text() == "Send"


def test_tool_card_shows_full_output_after_pruning(make_window, qtbot, tmp_path):
    folder = tmp_path / "allowed"
    folder.mkdir()
    (folder / "a.txt").write_text("".join(f"row {i}: the secret is {i * 7}\n" for i in range(60)))
    runtime = ScriptedRuntime([call("read_file", path="a.txt"), "The secret is 0.",
                               "Anything else?"])
    window = make_window(runtime, overrides={"tools.allowed_paths": json.dumps([str(folder)]),
                                             "context.prune_protect_turns": "0"})
    send(qtbot, window, "What is in a.txt?")
    wait_turn(qtbot, window)
    send(qtbot, window, "Thanks")
    wait_turn(qtbot, window)
    card = next(e for e in entries(window) if e.kind == "tool")
    assert card.tool_name == "read_file" and json.loads(card.arguments) == {"path": "a.txt"}
    assert card.state == "pruned"  # the engine cleared it for the model...
    assert "row 59: the secret is 413" in card.text  # ...the card still has all of it
    assert runtime.requests[-1][3]["content"] == "[Tool output cleared]"
    row = window.view.transcript.row_of(card.key)
    index = window.view.transcript.index(row)
    collapsed = window.view.delegate.sizeHint(None, index).height()
    click(qtbot, window, row)
    assert card.key in window.view.transcript.expanded
    assert window.view.delegate.sizeHint(None, index).height() > collapsed * 5


def test_tool_error_shows_in_its_card(make_window, qtbot, tmp_path):
    folder = tmp_path / "allowed"
    folder.mkdir()
    runtime = ScriptedRuntime([call("read_file", path="missing.txt"), "It is not there."])
    window = make_window(runtime, overrides={"tools.allowed_paths": json.dumps([str(folder)])})
    send(qtbot, window, "Read missing.txt")
    wait_turn(qtbot, window)
    card = next(e for e in entries(window) if e.kind == "tool")
    assert card.error and "does not exist" in card.text


def shell_question(make_window, qtbot, tmp_path, command: str):
    """(window, its open shell question, the allowed folder) once the scripted model asked
    to run ``command``."""
    folder = tmp_path / "allowed"
    folder.mkdir()
    runtime = ScriptedRuntime([call("run_shell", command=command), "Done."])
    window = make_window(runtime, overrides={
        "tools.allowed_paths": json.dumps([str(folder)]), "tools.shell": "true",
        "tools.enabled": "read_file,run_shell"})
    send(qtbot, window, "Run it")
    qtbot.waitUntil(lambda: window.turns.shell_box is not None and window.turns.shell_box.isVisible(),
                    timeout=10_000)
    return window, window.turns.shell_box, folder


def test_shell_command_asks_with_the_exact_command(make_window, qtbot, tmp_path):
    command = "echo iris-was-here && echo $((6 * 7))"
    window, box, _ = shell_question(make_window, qtbot, tmp_path, command)
    assert box.command_text() == command
    qtbot.mouseClick(box.run_button, Qt.MouseButton.LeftButton)
    wait_turn(qtbot, window)
    card = next(e for e in entries(window) if e.kind == "tool")
    assert "iris-was-here" in card.text and "42" in card.text


def test_shell_dialog_shows_bidi_and_invisible_characters_as_escapes(make_window, qtbot, tmp_path):
    """A right-to-left override (or an isolate, a zero-width space) would let the dialog show
    another command than the one that runs: each is shown as an escape such as \\u202e."""
    command = "echo safe \u202e;txt.exe hsab | moc.live//:ptth lruc\u2066#\u2069\u200b"
    window, box, _ = shell_question(make_window, qtbot, tmp_path, command)
    shown = box.command_text()
    assert "echo safe \\u202e;txt.exe hsab | moc.live//:ptth lruc\\u2066#\\u2069\\u200b" in shown
    assert not any(c in shown for c in "\u202e\u2066\u2069\u200b")
    qtbot.mouseClick(box.deny_button, Qt.MouseButton.LeftButton)
    wait_turn(qtbot, window)
    card = next(e for e in entries(window) if e.kind == "tool")
    assert "the user refused to run" in card.text


@pytest.mark.parametrize("command", ["echo hello" + " " * 3000 + "; touch RAN",
                                     "ls" + "\n" * 120 + "touch RAN",
                                     "echo " + "word " * 4000 + "&& touch RAN"])
def test_the_shell_question_shows_all_of_a_long_command_and_its_buttons(make_window, qtbot,
                                                                      tmp_path, command):
    """Before (an audit): the command sat in a message box's text. 3,000 spaces before a
    second command made the box 22,330 px wide, clipped to the screen, showing "echo
    hello" beside Run; 120 line breaks pushed Run and Don't run off the screen."""
    window, box, folder = shell_question(make_window, qtbot, tmp_path, command)
    screen = box.screen().availableGeometry()
    assert screen.contains(box.frameGeometry())  # the whole box, buttons included, on screen
    for button in (box.run_button, box.deny_button):
        assert button.isVisible() and box.rect().contains(button.geometry().center())
    view = box.command_view
    assert view.horizontalScrollBar().maximum() == 0  # wrapped: nothing out of sight sideways
    shown = box.command_text()
    assert "touch RAN" in shown  # said, not hidden after the blanks
    assert len(shown) < 2_000 or view.verticalScrollBar().maximum() > 0
    assert f"{len(command):,} characters" in box.size_label.text()
    if view.verticalScrollBar().maximum() > 0:
        assert "Scroll to read all of it" in box.size_label.text()
    assert box.deny_button.isDefault()
    qtbot.keyClick(box, Qt.Key.Key_Escape)  # Escape: Don't run
    wait_turn(qtbot, window)
    assert not (folder / "RAN").exists()
    card = next(e for e in entries(window) if e.kind == "tool")
    assert "the user refused to run" in card.text


def test_search_files_runs_in_its_worker_from_the_window(make_window, qtbot, tmp_path):
    """On Linux a search runs in a child forked from the app (under a memory limit): from
    the window's model thread too, while the GUI and the DB thread run."""
    folder = tmp_path / "allowed"
    folder.mkdir()
    (folder / "notes.txt").write_text("alpha\nthe launch is on Friday\n")
    runtime = ScriptedRuntime([call("search_files", pattern="launch"),
                               call("search_files", pattern="a{1000000000}"), "Friday."])
    window = make_window(runtime, overrides={"tools.allowed_paths": json.dumps([str(folder)])})
    send(qtbot, window, "When is the launch?")
    wait_turn(qtbot, window)
    cards = [e for e in entries(window) if e.kind == "tool"]
    assert "notes.txt:2: the launch is on Friday" in cards[0].text
    assert "repeat count of 1,000,000,000" in cards[1].text
    assert window.model_state == "ready"


def test_too_large_message_is_explained_and_kept(make_window, qtbot):
    runtime = ScriptedRuntime(["never sent"])
    window = make_window(runtime, overrides={"context.window": "512",
                                             "context.token_budget_ratio": "0.2"})
    send(qtbot, window, "long " * 600)
    wait_turn(qtbot, window)
    shown = entries(window)
    notice = shown[-1]
    assert notice.kind == "notice" and notice.text.startswith("Not sent: the newest turn alone is")
    assert "the history budget allows 73 (window 512 × ratio 0.2 − system 29 " in notice.text
    assert runtime.requests == []
    assert window.composer.text() == "long " * 600  # kept in the box, to shorten or split
    from iris_desktop.core.store import Store

    with Store(window.host.paths.db_path) as store:  # refused before it was stored
        assert [r["role"] for r in store.messages(window.thread_id)] == []


def test_a_huge_paste_is_refused_before_it_is_stored(make_window, qtbot):
    """Before: a 2 MB paste was saved into the chat, then refused."""
    runtime = ScriptedRuntime(["never sent"])
    window = make_window(runtime, overrides={"context.window": "4096"})
    paste = "0123456789abcdef " * 120_000  # about 2 MB
    send(qtbot, window, paste)
    wait_turn(qtbot, window, timeout=60_000)
    assert entries(window)[-1].text.startswith("Not sent: ")
    assert runtime.requests == [] and window.composer.text() == paste
    from iris_desktop.core.store import Store

    with Store(window.host.paths.db_path) as store:
        assert all(store.messages(t["id"]) == [] for t in store.threads())


# -- history, dividers, meter -----------------------------------------------------------------


def click(qtbot, window, row: int, pos: QPoint | None = None) -> None:
    view = window.view
    index = view.transcript.index(row)
    view.scrollTo(index)
    qtbot.wait(20)
    rect = view.visualRect(index)
    point = pos or QPoint(rect.center().x(), rect.top() + rect.height() // 3)
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=point)


def test_compaction_divider_appears_and_expands(make_window, qtbot, data_dir):
    thread = seed_thread(data_dir, chat(12))
    from iris_desktop.core.store import Store

    with Store(app_paths(data_dir).ensure().db_path) as store:
        ids = [r["id"] for r in store.messages(thread)]
        summary = store.add_summary(thread, {
            "prev_id": None, "first_message_id": ids[0], "covers_through_id": ids[15],
            "first_turn": 1, "last_turn": 8, "fields": FIELDS, "text": "Early talk.",
            "tokens": 60, "counter": "heuristic", "path": "llm"})
        store.add_compaction_event(thread, {
            "trigger": "tokens", "outcome": "ok", "path": "llm", "turns_archived": 8,
            "tokens_before": 41200, "tokens_after": 3100, "kept_turns": 4,
            "summary_tokens": 60, "duration_s": 2.0, "summary_id": summary})
    window = make_window(ScriptedRuntime([]))
    window.open_thread(thread)
    settle(qtbot, window)
    shown = entries(window)
    divider = shown[16]
    assert divider.kind == "divider"
    assert divider.title == "Earlier turns summarized (turns 1–8, 41,200 → 3,100 tokens)"
    assert all(e.state == "summarized" and e.dimmed for e in shown[:16])
    assert not any(e.dimmed for e in shown[17:])
    row = window.view.transcript.row_of(divider.key)
    index = window.view.transcript.index(row)
    before = window.view.delegate.sizeHint(None, index).height()
    click(qtbot, window, row)
    assert divider.key in window.view.transcript.expanded
    assert window.view.delegate.sizeHint(None, index).height() > before * 4
    doc = window.view.delegate._doc(divider, window.view.delegate.body_width())
    assert all(label in doc.toPlainText() for _, label in SUMMARY_FIELDS)


def test_meter_equals_the_engine_breakdown(make_window, qtbot, data_dir):
    thread = seed_thread(data_dir, chat(8))
    window = make_window(ScriptedRuntime([]))
    window.open_thread(thread)
    window.composer.set_text("a draft that is being typed")
    qtbot.waitUntil(lambda: bool(window.meter.breakdown) and window.meter.breakdown["draft"] > 0,
                    timeout=5_000)
    settle(qtbot, window)
    from iris_desktop.core.store import Store

    with Store(window.host.paths.db_path) as store:
        expected = window.context.planner.plan(store, thread, "a draft that is being typed"
                                               ).breakdown
    assert window.meter.breakdown == expected.as_dict()
    assert window.composer.tokens.text() == f"Draft: {expected.draft:,} tokens"
    tip = window.meter.toolTip()
    assert f"{expected.history:,}" in tip and f"{expected.threshold:,}" in tip


def test_search_finds_a_message_and_opens_it(make_window, qtbot, data_dir):
    seed_thread(data_dir, chat(3), title="other")
    messages = chat(30)
    messages[41]["content"] = "we talked about the purple elephant in the garden"
    target = seed_thread(data_dir, messages, title="zoo")
    window = make_window(ScriptedRuntime([]))
    qtbot.keyClick(window, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier)
    assert window.threads.search.hasFocus()
    qtbot.keyClicks(window.threads.search, "elephant")
    qtbot.waitUntil(lambda: window.threads.list.count() >= 1
                    and "elephant" in window.threads.list.item(0).text(), timeout=5_000)
    item = window.threads.list.item(0)
    qtbot.mouseClick(window.threads.list.viewport(), Qt.MouseButton.LeftButton,
                     pos=window.threads.list.visualItemRect(item).center())
    settle(qtbot, window)
    assert window.thread_id == target
    current = window.view.current_entry()
    assert current is not None and "purple elephant" in current.text


def test_search_results_follow_a_delete_and_a_hit_of_a_deleted_chat_says_so(make_window, qtbot,
                                                                            data_dir):
    """An audit: results stayed as they were while the box held text (a chat deleted in
    this window or by a command still listed); a click on a deleted chat's hit opened an
    empty chat that refused every message."""
    messages = chat(3)
    messages[0]["content"] = "banana bread recipe"
    doomed = seed_thread(data_dir, messages, title="Alpha plans")
    messages[0]["content"] = "banana split"
    seed_thread(data_dir, messages, title="Beta notes")
    window = make_window(ScriptedRuntime([]))
    qtbot.keyClicks(window.threads.search, "banana")
    qtbot.waitUntil(lambda: window.threads.list.count() == 2, timeout=5_000)
    from iris_desktop.ui.threads import MESSAGE_ROLE

    hit = next(window.threads.list.item(i).data(MESSAGE_ROLE) for i in range(2)
               if "Alpha" in window.threads.list.item(i).text())
    with Store(app_paths(data_dir).db_path) as store:  # another process
        store.delete_thread(doomed)
    said: list[str] = []
    window.app_state.statusMessage.connect(lambda text, _ms: said.append(text))
    window.threads_control.open_thread(doomed, hit)  # a click on the hit
    qtbot.waitUntil(lambda: any("That chat was deleted" in t for t in said), timeout=5_000)
    assert window.thread_id != doomed
    qtbot.waitUntil(lambda: window.threads.list.count() == 1
                    and "Beta" in window.threads.list.item(0).text(), timeout=10_000)
    said.clear()
    window.threads_control.open_thread(doomed)  # a title hit: opened, found gone, said
    qtbot.waitUntil(lambda: any("That chat was deleted" in t for t in said), timeout=5_000)
    assert window.thread_id is None


def test_a_5000_message_thread_opens_without_5000_widgets(make_window, qtbot, data_dir):
    thread = seed_thread(data_dir, chat(2500, words=12))
    window = make_window(ScriptedRuntime([]))
    widgets_before = len(window.findChildren(QWidget))
    window.open_thread(thread)  # counted, not timed: one page of rows, no widget per message
    qtbot.waitUntil(lambda: window.view.transcript.total == 5000, timeout=60_000)
    settle(qtbot, window)
    assert window.view.transcript.rowCount() == PAGE
    assert len(window.findChildren(QWidget)) - widgets_before < 10
    bar = window.view.verticalScrollBar()
    assert bar.value() == bar.maximum() > 0  # opened at the newest message
    bar.setValue(0)  # scrolling to the top reveals the previous page
    qtbot.waitUntil(lambda: window.view.transcript.rowCount() == 2 * PAGE, timeout=5_000)


def test_rename_and_delete_a_thread(make_window, qtbot, data_dir):
    thread = seed_thread(data_dir, chat(2), title="old title")
    window = make_window(ScriptedRuntime([]))
    window.threads_control.rename_thread(thread, "new title")
    qtbot.waitUntil(lambda: window.threads.list.count() == 1
                    and window.threads.list.item(0).text() == "new title", timeout=5_000)
    # before (an audit): a pasted title kept its line breaks (a row three lines high) and
    # any length (5,000 characters: a sideways scroll bar); a blank one was ignored unsaid
    window.threads_control.rename_thread(thread, "Line one\nLine two\r\n  line three")
    qtbot.waitUntil(lambda: window.threads.list.item(0).text() == "Line one Line two line three",
                    timeout=5_000)
    window.threads_control.rename_thread(thread, "x" * 5_000)
    qtbot.waitUntil(lambda: window.threads.list.item(0).text() == "x" * 199 + "…", timeout=5_000)
    window.threads_control.rename_thread(thread, " \n ")
    qtbot.waitUntil(lambda: "title cannot be empty" in window.status_area.current_message(),
                    timeout=5_000)
    assert window.threads.list.item(0).text() == "x" * 199 + "…"
    window.threads_control.delete_thread(thread)
    qtbot.waitUntil(lambda: window.threads.list.count() == 0, timeout=5_000)
    # (a newcomer's audit: the status bar kept its last words, and said nothing of it)
    assert window.status_area.current_message() == "Deleted “" + "x" * 199 + "…”"


def test_a_long_chat_deleted_in_the_window_gives_its_space_back(make_window, qtbot, data_dir):
    """Before: 3,000 long messages deleted in the window left the file at its size (the
    pages zeroed, never freed). Now they go back to the disk, with the window open."""
    thread = seed_thread(data_dir, chat(1_500, words=150), title="long")
    kept = seed_thread(data_dir, chat(1), title="kept")
    db = app_paths(data_dir).db_path
    window = make_window(ScriptedRuntime([]))
    settle(qtbot, window)
    with Store(db) as store:
        store.checkpoint()
    before = db.stat().st_size
    assert before > 2_000_000
    window.threads_control.delete_thread(thread)
    qtbot.waitUntil(lambda: window.threads.list.count() == 1, timeout=10_000)
    settle(qtbot, window)
    assert db.stat().st_size < before / 10
    with Store(db) as store:
        assert [t["id"] for t in store.threads()] == [kept]


# -- preferences ------------------------------------------------------------------------------


def open_preferences(window, qtbot) -> SettingsDialog:
    dialog = window.preferences()
    qtbot.waitUntil(lambda: dialog.last_preview is not None, timeout=5_000)
    return dialog


def test_every_context_key_has_a_field(make_window, qtbot):
    window = make_window(ScriptedRuntime([]))
    dialog = open_preferences(window, qtbot)
    assert {k for k in SETTINGS if k.startswith("context.")} <= set(dialog.fields)
    assert set(dialog.fields) == set(SETTINGS)
    assert [dialog.tabs.tabText(i) for i in range(dialog.tabs.count())] == [
        "Context", "Model", "Downloads", "Tools", "Chat", "Storage", "Appearance"]
    ratio = dialog.fields["context.token_budget_ratio"]
    assert "× window" in ratio.hint.text() and "0.1 to 0.95" in ratio.hint.text()
    # editors generated from the settings model: slider + spin box, spin box, combo, file
    assert isinstance(ratio.editor, RatioEditor)
    assert (ratio.editor.spin.minimum(), ratio.editor.spin.maximum()) == (0.1, 0.95)
    assert ratio.editor.meaning.text() == "= 5,734 of 8,192 tokens"
    turns = dialog.fields["context.prune_protect_turns"].editor
    assert isinstance(turns, IntEditor) and turns.spin.suffix() == " turns"
    assert (turns.spin.minimum(), turns.spin.maximum()) == (0, 100)
    assert isinstance(dialog.fields["context.token_counter"].editor, ChoiceEditor)
    assert isinstance(dialog.fields["model.path"].editor, PathEditor)
    window_field = dialog.fields["context.window"].editor
    assert window_field.spin.text().startswith("auto")
    dialog.reject()


def test_a_new_setting_key_gets_a_field_with_no_ui_change(make_window, qtbot, monkeypatch):
    fake = Setting("context.fake_knob", "int", 3, "A knob added by a test.", minimum=0,
                   maximum=9, unit="knobs")
    monkeypatch.setitem(SETTINGS, fake.key, fake)
    window = make_window(ScriptedRuntime([]))
    dialog = open_preferences(window, qtbot)
    field = dialog.fields["context.fake_knob"]
    assert field.raw() == "3" and "A knob added by a test." in field.hint.text()
    assert isinstance(field.editor, IntEditor)
    assert (field.editor.spin.maximum(), field.editor.spin.suffix()) == (9, " knobs")
    field.editor.spin.setValue(12)  # the spin box keeps it in range
    assert field.raw() == "9" and dialog.ok_button.isEnabled()
    dialog.reject()


def test_an_invalid_value_is_marked_and_disables_ok(make_window, qtbot):
    window = make_window(ScriptedRuntime([]))
    dialog = open_preferences(window, qtbot)
    path = dialog.fields["model.path"]
    path.editor.line.setText("   ")
    assert not dialog.ok_button.isEnabled()
    assert not path.error.isHidden()  # on the Model page
    assert path.error.text().startswith("Invalid value '   ': expected")  # (its label says which)
    path.editor.line.setText("bundled")
    assert dialog.ok_button.isEnabled() and path.error.isHidden()
    # more than the loaded model's n_ctx (8,192 here) is refused, with both numbers
    window_field = dialog.fields["context.window"]
    window_field.editor.spin.setValue(16384)
    assert not dialog.ok_button.isEnabled()
    assert window_field.error.text() == (
        "16,384 tokens is more than the loaded model's n_ctx of 8,192; "
        "lower it, or raise model.n_ctx and reload the model")
    dialog.fields["model.n_ctx"].editor.spin.setValue(16384)  # applies after a reload
    assert dialog.ok_button.isEnabled()
    dialog.reject()


def test_the_budget_breakdown_updates_live_before_apply(make_window, qtbot, data_dir):
    thread = seed_thread(data_dir, chat(40, words=40))
    window = make_window(ScriptedRuntime([]))
    window.open_thread(thread)
    settle(qtbot, window)
    dialog = open_preferences(window, qtbot)
    assert dialog.last_preview.window == 8192
    dialog.fields["context.window"].editor.spin.setValue(2048)
    qtbot.waitUntil(lambda: dialog.last_preview.window == 2048, timeout=5_000)
    text = dialog.breakdown.text()
    assert "Window 2,048 tokens" in text and "budget 1,433" in text
    assert dialog.last_preview.dropped_turns > 0
    ratio = dialog.fields["context.token_budget_ratio"].editor
    ratio.slider.setValue(50)  # the slider moves the spin box, and the other way round
    assert ratio.spin.value() == 0.5
    qtbot.waitUntil(lambda: "budget 1,024" in dialog.breakdown.text(), timeout=5_000)
    assert ratio.meaning.text() == "= 1,024 of 2,048 tokens"
    dialog.fields["context.prune_protect_turns"].editor.spin.setValue(5)
    qtbot.waitUntil(lambda: dialog.last_preview.protect_configured == 5, timeout=5_000)
    assert not window.host.paths.config_path.exists()  # nothing saved before Apply
    dialog.reject()


def test_apply_persists_and_offers_a_reload(make_window, qtbot):
    window = make_window(ScriptedRuntime([]))
    dialog = open_preferences(window, qtbot)
    dialog.fields["model.n_ctx"].editor.spin.setValue(4096)
    dialog.fields["context.compaction_threshold"].editor.spin.setValue(0.8)
    qtbot.mouseClick(dialog.ok_button, Qt.MouseButton.LeftButton)
    text = window.host.paths.config_path.read_text()
    assert "n_ctx = 4096" in text and "compaction_threshold = 0.8" in text
    assert window.host.settings["model.n_ctx"] == 4096
    qtbot.waitUntil(lambda: getattr(window.menus, "reload_box", None) is not None
                    and window.menus.reload_box.isVisible(), timeout=5_000)
    assert "model.n_ctx" in window.menus.reload_box.text()
    loads = []
    window.model.worker.loaded.connect(loads.append)
    window.menus.reload_box.done(QMessageBox.StandardButton.Yes)
    assert window.model_state == "loading"  # reloading in the background
    qtbot.waitUntil(lambda: window.model_state == "ready" and len(loads) == 1, timeout=10_000)


def test_environment_overrides_are_locked(make_window, qtbot, monkeypatch):
    monkeypatch.setenv("IRIS_CONTEXT_TOKEN_BUDGET_RATIO", "0.5")
    window = make_window(ScriptedRuntime([]))
    dialog = open_preferences(window, qtbot)
    field = dialog.fields["context.token_budget_ratio"]
    assert not field.editor.isEnabled()
    assert "IRIS_CONTEXT_TOKEN_BUDGET_RATIO" in field.hint.text()
    assert field.raw() == "0.5"
    dialog.restore_defaults("context")
    assert field.raw() == "0.5"  # a locked field is left alone
    dialog.reject()


def test_restore_defaults_per_page(make_window, qtbot):
    window = make_window(ScriptedRuntime([]))
    dialog = open_preferences(window, qtbot)
    dialog.fields["context.window"].editor.spin.setValue(4096)
    dialog.fields["model.max_tokens"].editor.spin.setValue(99)
    dialog.restore_defaults("context")
    assert dialog.fields["context.window"].raw() == "auto"
    assert dialog.fields["model.max_tokens"].raw() == "99"
    dialog.reject()


def test_ok_keeps_every_setting_it_was_not_asked_to_change(make_window, qtbot, data_dir):
    """Before, Preferences' OK after changing only the theme wrote back every value a
    field could not show exactly: min_p 0.025 became 0.03, repeat_penalty 1.005 became
    1.0, and a system prompt's non-breaking space a plain one."""
    config = app_paths(data_dir).ensure().config_path
    prompt = "Answer\u00a0briefly.  "
    config.write_text('[model]\nmin_p = 0.025\nrepeat_penalty = 1.005\n[context]\n'
                      f'token_budget_ratio = 0.725\nsystem_prompt = "{prompt}"\n')
    window = make_window(ScriptedRuntime([]))
    dialog = open_preferences(window, qtbot)
    assert dialog.changed() == [] and not dialog.apply_button.isEnabled()  # nothing changed yet
    dialog.fields["ui.theme"].editor.combo.setCurrentText("dark")
    assert dialog.changed() == ["ui.theme"]
    dialog.accept()
    written = config.read_text()
    for kept in ("min_p = 0.025", "repeat_penalty = 1.005", "token_budget_ratio = 0.725",
                 f'system_prompt = "{prompt}"', 'theme = "dark"'):
        assert kept in written, (kept, written)


def test_a_settings_file_broken_while_running_keeps_the_settings_in_force(make_window, qtbot,
                                                                         data_dir):
    """Before: a typo made by hand while the app ran put every default in force as soon
    as Preferences opened (window, ratio, theme), without a word, and Model ▸ Reload then
    loaded the model with the default n_ctx and threads."""
    config = app_paths(data_dir).ensure().config_path
    config.write_text("[context]\ntoken_budget_ratio = 0.5\n[model]\nn_ctx = 2048\n")
    window = make_window(ScriptedRuntime([]))
    assert window.app_state.settings["context.token_budget_ratio"] == 0.5
    config.write_text(config.read_text() + "[ui]\nfont_size = 14pt\n")
    dialog = open_preferences(window, qtbot)
    assert window.app_state.settings["context.token_budget_ratio"] == 0.5
    assert window.app_state.settings["model.n_ctx"] == 2048
    assert dialog.fields["model.n_ctx"].raw() == "2048"
    message = window.status_area.current_message()
    assert "could not be read again" in message and "not valid TOML" in message, message
    dialog.fields["model.top_k"].editor.spin.setValue(7)
    dialog.accept()  # nothing is written into a file Iris cannot read
    assert dialog.refusal is not None and "not valid TOML" in dialog.refusal.text()
    assert "14pt" in config.read_text() and "top_k" not in config.read_text()
    dialog.refusal.done(0)
    dialog.reject()


def test_restore_defaults_wins_over_a_change_made_elsewhere_while_open(make_window, qtbot,
                                                                       data_dir):
    """Before: `config set model.top_k 20` in another process while Preferences was open
    stayed in force after the user chose Restore defaults (40) and OK: a value equal to the
    one read at opening was never written."""
    from iris_desktop.settings import write_config_value

    config = app_paths(data_dir).ensure().config_path
    window = make_window(ScriptedRuntime([]))
    dialog = open_preferences(window, qtbot)
    write_config_value(config, "model.top_k", 20)  # another process
    write_config_value(config, "context.summary_max_tokens", 500)
    dialog.restore_defaults("model")
    dialog.accept()
    text = config.read_text()
    assert "top_k" not in text  # the default: removed from the file
    assert "summary_max_tokens = 500" in text  # a key not touched here keeps its new value
    assert window.app_state.settings["model.top_k"] == 40


def test_no_to_reloading_says_what_is_not_in_use_yet(make_window, qtbot):
    window = make_window(ScriptedRuntime([]))
    dialog = open_preferences(window, qtbot)
    dialog.fields["model.n_ctx"].editor.spin.setValue(4096)
    qtbot.mouseClick(dialog.ok_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: getattr(window.menus, "reload_box", None) is not None
                    and window.menus.reload_box.isVisible(), timeout=5_000)
    window.menus.reload_box.done(QMessageBox.StandardButton.No)
    assert window.status_area.current_message() == (
        "Not in use yet: model.n_ctx (the model keeps its old values until Model ▸ Reload)")


def test_a_system_prompt_too_long_for_the_settings_file_is_marked(make_window, qtbot, data_dir):
    """Before: a 1.1 MB prompt was saved, and Iris then refused its own settings file."""
    window = make_window(ScriptedRuntime([]))
    dialog = open_preferences(window, qtbot)
    dialog.fields["chat.system_prompt"].editor.text.setPlainText("x" * 1_100_000)
    qtbot.waitUntil(lambda: "chat.system_prompt" in dialog.errors, timeout=5_000)
    assert "1,100,000 characters is too long" in dialog.errors["chat.system_prompt"]
    assert not dialog.ok_button.isEnabled()
    dialog.accept()
    assert not app_paths(data_dir).config_path.exists()
    dialog.reject()


def test_ok_that_cannot_write_the_settings_says_so(make_window, qtbot, monkeypatch):
    """Before: a read-only settings folder or a full disk left the dialog open, silent, and
    a traceback on stderr (the OSError was not caught)."""
    from iris_desktop import settings as settings_module

    window = make_window(ScriptedRuntime([]))
    dialog = open_preferences(window, qtbot)

    def refused(path, data, mode=0o600):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(settings_module, "atomic_write", refused)
    dialog.fields["ui.theme"].editor.combo.setCurrentText("dark")
    assert dialog.apply() is False
    box = dialog.refusal
    assert box.isVisible() and box.text().startswith("Nothing was saved: cannot write ")
    assert "Permission denied" in box.text()
    box.done(0)
    dialog.reject()


# -- the model, the inspector, the window -----------------------------------------------------


def test_a_missing_model_explains_and_history_stays_usable(make_window, qtbot, data_dir, tmp_path):
    seed_thread(data_dir, chat(2), title="still here")
    missing = tmp_path / "nope.gguf"
    window = make_window(None, overrides={"model.path": str(missing)})
    assert window.model_state == "failed"
    box = window.models.box
    assert box is not None and box.isVisible()
    assert str(missing) in box.informativeText()
    assert any(b.text() == "Choose model file…" for b in box.buttons())
    assert not window.composer.button.isEnabled()
    box.done(0)
    settle(qtbot, window)
    assert window.threads.list.item(0).text() == "still here"
    assert window.model_state == "failed"  # "Continue without a model": browsing only


def test_choose_model_file_after_a_failure_loads_it(make_window, qtbot, tmp_path, model_path,
                                                    monkeypatch):
    from PySide6.QtWidgets import QFileDialog

    window = make_window(None, overrides={"model.path": str(tmp_path / "nope.gguf")})
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a, **k: (str(model_path), "GGUF models (*.gguf)")))
    box = window.models.box
    choose = next(b for b in box.buttons() if b.text() == "Choose model file…")
    qtbot.mouseClick(choose, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.model_state == "ready", timeout=60_000)
    assert window.composer.button.isEnabled()
    assert str(model_path) in window.host.paths.config_path.read_text()


def summarize_first_turns(data_dir, thread: int) -> tuple[list[int], int]:
    """A stored summary over the first two turns (four messages): (message ids, its id)."""
    from iris_desktop.core.store import Store

    with Store(app_paths(data_dir).ensure().db_path) as store:
        ids = [r["id"] for r in store.messages(thread)]
        summary = store.add_summary(thread, {
            "prev_id": None, "first_message_id": ids[0], "covers_through_id": ids[3],
            "first_turn": 1, "last_turn": 2, "fields": FIELDS, "text": "x", "tokens": 30,
            "counter": "heuristic", "path": "extractive"})
    return ids, summary


def window_with_inspector(make_window, qtbot, thread: int):
    """A window on ``thread`` with the inspector open and its report in."""
    window = make_window(ScriptedRuntime([]))
    window.open_thread(thread)
    window.inspector.toggleViewAction().trigger()
    qtbot.waitUntil(lambda: window.inspector.report is not None, timeout=5_000)
    settle(qtbot, window)
    return window, window.inspector


def test_inspector_shows_request_summaries_events_and_chart(make_window, qtbot, data_dir):
    thread = seed_thread(data_dir, chat(6))
    ids, summary = summarize_first_turns(data_dir, thread)
    from iris_desktop.core.store import Store

    with Store(app_paths(data_dir).ensure().db_path) as store:
        store.add_request(thread, {"prompt_tokens": 700, "window": 8192})
        store.add_compaction_event(thread, {"trigger": "turns", "outcome": "ok",
                                            "tokens_before": 700, "tokens_after": 300,
                                            "summary_id": summary})
        store.add_request(thread, {"prompt_tokens": 320, "window": 8192})
    window, dock = window_with_inspector(make_window, qtbot, thread)
    assert dock.request_table.rowCount() == 1 + 8  # system + the 4 unsummarized turns
    states = {dock.request_table.item(r, 3).text() for r in range(dock.request_table.rowCount())}
    assert states == {"verbatim"}  # the newest turn is answered: nothing to recall for
    assert dock.report["recalled_ids"] == []
    assert dock.summaries.topLevelItemCount() == 1 and dock.events.rowCount() == 1
    assert dock.chart.points["values"] == [700, 320]
    assert dock.chart.points["compactions"][0]["index"] == 1
    assert "4 summarized" in dock.request_label.text()
    assert "counted with an estimate of about 4 characters a token" in dock.request_label.text()


def test_the_inspector_says_when_there_is_no_summary_or_compaction_yet(make_window, qtbot,
                                                                        data_dir):
    """Before: the Summaries page of a chat never compacted read "No …" (the sentence
    was cut to the first column) and Compactions was an empty grid."""
    thread = seed_thread(data_dir, chat(2))
    window, dock = window_with_inspector(make_window, qtbot, thread)
    empty = dock.summaries.topLevelItem(0)
    assert empty.text(0) == "No summary yet: nothing has been compacted."
    assert empty.isFirstColumnSpanned()
    assert dock.events.rowCount() == 1 and dock.events.columnSpan(0, 0) == dock.events.columnCount()
    assert dock.events.item(0, 0).text().startswith("No compaction yet")


def test_typed_question_shows_recall_in_the_meter_and_inspector(make_window, qtbot, data_dir):
    thread = seed_thread(data_dir, chat(6))
    ids, _ = summarize_first_turns(data_dir, thread)
    window = make_window(ScriptedRuntime([]))
    window.open_thread(thread)
    window.inspector.toggleViewAction().trigger()
    window.composer.set_text("What was question 1 about?")
    qtbot.waitUntil(lambda: (window.inspector.report or {}).get("recalled_ids"), timeout=10_000)
    qtbot.waitUntil(lambda: window.meter.breakdown and window.meter.breakdown["recall"] > 0,
                    timeout=10_000)
    dock = window.inspector
    settle(qtbot, window)
    states = [dock.request_table.item(r, 3).text() for r in range(dock.request_table.rowCount())]
    assert states[-2:] == ["recalled", "draft"]
    assert all(i <= ids[3] for i in dock.report["recalled_ids"])
    assert window.meter.breakdown["recall"] == dock.report["breakdown"]["recall"]


def test_about_names_every_version(make_window):
    import llama_cpp
    from PySide6.QtCore import qVersion

    window = make_window(ScriptedRuntime([]))
    text = window.menus.about_text()
    assert llama_cpp.__version__ in text and qVersion() in text and "Iris Desktop 0.1.0" in text


def test_geometry_and_splitter_are_remembered(make_window, qtbot, data_dir):
    window = make_window(ScriptedRuntime([]), load=False)
    screen = window.screen().availableGeometry()  # it opens within 90% of the screen
    assert window.width() <= 0.9 * screen.width() + 1 and window.height() <= 0.9 * screen.height() + 1
    window.resize(700, 520)  # inside the offscreen platform's 800×600 screen
    window.splitter.setSizes([300, 400])
    window.shutdown()
    assert (data_dir / "ui-state.ini").exists()
    again = make_window(ScriptedRuntime([]), load=False)
    assert (again.width(), again.height()) == (700, 520)
    assert abs(again.splitter.sizes()[0] - 300) <= 2


def test_interrupted_streams_are_marked_at_start(make_window, qtbot, data_dir):
    from iris_desktop.core.store import Store

    with Store(app_paths(data_dir).ensure().db_path) as store:
        thread = store.create_thread("crashed")
        store.add_message(thread, {"role": "user", "content": "hi"})
        reply = store.add_message(thread, {"role": "assistant", "content": "half"},
                                  status="streaming")
    window = make_window(ScriptedRuntime([]), load=False)
    window.open_thread(thread)
    settle(qtbot, window)
    assert entries(window)[-1].status == "interrupted"
    with Store(app_paths(data_dir).ensure().db_path) as store:
        assert store.messages(thread)[-1]["id"] == reply
        assert store.messages(thread)[-1]["status"] == "interrupted"


# -- one planner: what is shown is what is sent -----------------------------------------------


def test_a_sent_message_costs_at_most_two_builds(make_window, qtbot, data_dir):
    thread = seed_thread(data_dir, chat(6))
    window = make_window(ScriptedRuntime(["Sure, here it is."]))
    window.inspector.toggleViewAction().trigger()
    window.open_thread(thread)
    settle(qtbot, window)
    planner = window.context.planner
    before = planner.builds
    send(qtbot, window, "One more question, please.")
    wait_turn(qtbot, window)
    assert window.context.planner is planner
    assert planner.builds - before <= 2  # the request sent, and the next one the views draw
    with Store(window.host.paths.db_path) as store:
        shown = planner.plan(store, thread)  # a cache hit: what the views drew
    assert planner.builds - before <= 2
    assert window.meter.breakdown == shown.breakdown.as_dict()
    assert window.inspector.report["predicted_prompt_tokens"] == shown.predicted_prompt_tokens


def test_meter_and_inspector_show_the_request_the_model_then_reports(make_window, qtbot,
                                                                    model_path, tmp_path):
    """Qwen's template renders the tools itself; with a tools folder set, the draft's
    meter and inspector equal the prompt tokens llama.cpp reports for it, to the token."""
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "plan.txt").write_text("Water the tomatoes on Sunday.\n")
    window = make_window(None, overrides={
        "model.path": str(model_path), "model.max_tokens": "8", "model.temperature": "0",
        "model.n_ctx": "4096", "tools.allowed_paths": json.dumps([str(folder)])})
    assert window.model_state == "ready", window.models.error
    window.inspector.toggleViewAction().trigger()
    send(qtbot, window, "Hello!")
    wait_turn(qtbot, window, timeout=120_000)
    draft = "Say goodbye."
    window.composer.set_text(draft)
    qtbot.waitUntil(lambda: bool(window.meter.breakdown) and window.meter.breakdown["draft"] > 0
                    and window.inspector.report and window.inspector.report["request"][-1]
                    ["state"] == "draft", timeout=20_000)
    settle(qtbot, window)
    meter = window.meter.breakdown["used"]
    report = window.inspector.report
    assert sum(r["tokens"] for r in report["request"]) == report["predicted_prompt_tokens"] == meter
    assert not window.meter.estimated
    sent = []
    window.model.worker.turnEvent.connect(
        lambda e: isinstance(e, RequestSent) and sent.append(e.request))
    send(qtbot, window, draft)
    wait_turn(qtbot, window, timeout=120_000)
    assert sent[0].predicted_prompt_tokens == meter and sent[0].exact
    with Store(window.host.paths.db_path) as store:
        recorded = store.requests(window.thread_id)[-1]
    assert recorded["prompt_tokens"] == recorded["predicted_prompt_tokens"] == meter


def test_reloading_the_model_while_the_meter_refreshes_does_not_crash(make_window, qtbot,
                                                                      model_path, data_dir):
    thread = seed_thread(data_dir, chat(20, words=60))
    window = make_window(None, overrides={"model.path": str(model_path), "model.n_ctx": "2048"})
    window.open_thread(thread)
    settle(qtbot, window)
    timer = QTimer(window, interval=2)
    timer.timeout.connect(window.context.refresh_meter)
    timer.start()
    for _ in range(3):  # each reload closes the model the DB thread may be counting with
        window.load_model()
        qtbot.waitUntil(lambda: window.model_state == "ready", timeout=60_000)
        qtbot.wait(50)
    timer.stop()
    settle(qtbot, window)
    window.context.refresh_meter()
    settle(qtbot, window)
    assert window.meter.breakdown and window.meter.breakdown["history"] > 0


def test_compact_now_summarizes_the_open_chat(make_window, qtbot, data_dir):
    thread = seed_thread(data_dir, chat(30, words=40))
    window = make_window(ScriptedRuntime([]), overrides={"context.summarizer": "extractive",
                                                         "context.window": "4096"})
    window.open_thread(thread)
    settle(qtbot, window)
    action = window.findChild(QAction, "compact-now")
    assert action.shortcut() == QKeySequence("Ctrl+Shift+K")
    action.trigger()
    qtbot.waitUntil(lambda: not window.generating, timeout=30_000)
    settle(qtbot, window)
    shown = entries(window)
    assert any(e.kind == "divider" for e in shown)
    assert any(e.state == "summarized" for e in shown)
    assert "are summarized now, in under a second" in window.state_label.text()


# -- every turn starts fast: prefill, warm-up, each thread's KV state --------------------------


def real_window(make_window, model_path, **extra):
    overrides = {"model.path": str(model_path), "model.max_tokens": "4",
                 "model.temperature": "0", "model.n_ctx": "4096", **extra}
    window = make_window(None, overrides=overrides)
    assert window.model_state == "ready", window.models.error
    return window


def last_request(window) -> dict:
    with Store(window.host.paths.db_path) as store:
        return store.requests(window.thread_id)[-1]


def test_a_prefilled_draft_is_sent_evaluating_only_a_few_tokens(make_window, qtbot, model_path,
                                                                data_dir):
    thread = seed_thread(data_dir, chat(6, words=30))
    window = real_window(make_window, model_path)
    statuses: list[str] = []
    window.model.worker.cacheStatus.connect(statuses.append)
    window.open_thread(thread)
    settle(qtbot, window)
    window.composer.set_text("What was the second question about, in one word?")
    qtbot.waitUntil(lambda: "Prefilled" in statuses, timeout=120_000)
    assert any(s.startswith("Prefilling…") for s in statuses)
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)
    wait_turn(qtbot, window, timeout=120_000)
    sent = last_request(window)
    assert sent["prompt_tokens"] > 300
    assert sent["evaluated_tokens"] <= 8  # the draft's prompt was evaluated while typing


def test_each_thread_keeps_its_kv_state_when_the_user_comes_back(make_window, qtbot, model_path,
                                                                data_dir):
    first = seed_thread(data_dir, chat(6, words=30), title="first")
    second = seed_thread(data_dir, chat(6, words=30), title="second")
    window = real_window(make_window, model_path)
    statuses: list[str] = []
    window.model.worker.cacheStatus.connect(statuses.append)
    for thread, text in ((first, "Hello"), (second, "Hi"), (first, "Thanks")):
        window.open_thread(thread)
        settle(qtbot, window)
        send(qtbot, window, text)
        wait_turn(qtbot, window, timeout=120_000)
    assert "Restored from cache" in statuses
    back = last_request(window)
    assert back["prompt_tokens"] > 300 and back["evaluated_tokens"] < 40
    kv = list((window.host.paths.data_dir / "kv-cache").glob("*.kv"))
    assert {p.name.split("-")[0] for p in kv} == {str(first), str(second)}


def test_a_warm_up_gives_way_to_a_queued_send(model_path, tmp_path):
    """The worker called directly: a warm-up stops as soon as a job is queued behind it."""
    import threading as th

    from iris_desktop.core.config import ContextParams
    from iris_desktop.core.planner import Planner
    from iris_desktop.ui.model_thread import LoadJob, ModelWorker

    host = Host(tmp_path / "data", {"model.path": str(model_path), "model.n_ctx": "4096"})
    worker = ModelWorker(host)
    worker.load(LoadJob(host.settings))
    statuses: list[str] = []
    model = host.runtime
    planner = Planner(ContextParams(window=4096), model.counter(), runtime=model)
    thread = host.store.create_thread("t")
    host.store.add_messages(thread, chat(40, words=40))
    request = planner.plan(host.store, thread)

    def warm() -> None:  # as the worker does after a compaction, with its queue as cancel
        statuses.extend(e.describe() for e in host.warm(thread, request, worker.give_way))

    runner = th.Thread(target=warm)
    runner.start()
    for _ in range(60_000):  # until the first batch is in (bounded by count, not time)
        if len(model.kv_tokens()) > 0 or not runner.is_alive():
            break
        runner.join(0.01)
    worker.give_way.queued()  # a send arrives
    runner.join()
    assert "Ready (warmed up)" not in statuses
    assert len(model.kv_tokens()) < request.predicted_prompt_tokens
    worker.release()
    host.close()


def test_models_dialog_lists_loads_cancels_and_keeps_the_model_on_failure(
        make_window, qtbot, model_path, base_model_path, tmp_path):
    """Model ▸ Models…: the library in a table; a broken file or a cancelled load leaves
    the model in use answering and the setting unchanged; a base model is marked."""
    window = make_window(None, overrides={"model.path": str(model_path), "model.n_ctx": "2048"})
    assert window.model_state == "ready"
    before = window.models.info["path"]
    dialog = window.models.open_library()
    qtbot.waitUntil(lambda: dialog.table.rowCount() > 0, timeout=30_000)
    names = [dialog.table.item(r, 0).text() for r in range(dialog.table.rowCount())]
    sources = [dialog.table.item(r, 1).text() for r in range(dialog.table.rowCount())]
    assert sources[0] == "bundled" and "Qwen2.5-Coder" in names[0]
    in_use = [r for r in range(dialog.table.rowCount())
              if "in use" in dialog.table.item(r, 9).text()]
    assert in_use, "the model in use is marked"
    # the file's size as the download and the file manager count it (the bundled GGUF is
    # 491 MB; it read "468 MiB" here and "491 MB" in the download dialog); memory as sold
    assert dialog.table.item(0, 5).text() == file_size(model_path.stat().st_size)
    assert dialog.table.item(0, 5).text().endswith(" MB")
    assert dialog.table.item(0, 8).text().endswith((" MB", " GB"))
    assert "2,048-token window" in dialog.status.text() and "model(s)" not in dialog.status.text()
    qtbot.mouseClick(dialog.download_button, Qt.MouseButton.LeftButton)  # one click away
    qtbot.waitUntil(lambda: window.models.downloads is not None
                    and window.models.downloads.isVisible(), timeout=5_000)
    window.models.downloads.close()

    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    dialog.useModel.emit(str(broken))
    qtbot.waitUntil(lambda: window.models.job is None, timeout=60_000)
    assert window.model_state == "ready" and window.models.info["path"] == before
    assert window.composer.button.isEnabled()
    assert "broken.gguf" in window.models.box.informativeText()
    assert any(b.text().startswith("Keep ") for b in window.models.box.buttons())
    assert window.host.settings["model.path"] == str(model_path)
    window.models.box.done(0)

    progress: list[float] = []
    window.model.worker.loadProgress.connect(progress.append)
    window.models.use_file(str(base_model_path))
    window.models.cancel_load()
    qtbot.waitUntil(lambda: window.models.job is None, timeout=60_000)
    assert window.models.info["path"] == before  # cancelled: still the previous model
    assert "cancelled" in window.models.error
    # asked for: said in passing (it was a warning box, "could not be loaded")
    assert not window.models.box.isVisible()
    assert window.status_area.current_message().startswith("Loading cancelled; Iris goes on with ")

    window.models.use_file(str(base_model_path))
    assert dialog.progress.isVisible() and dialog.cancel_button.isVisible()
    qtbot.waitUntil(lambda: window.models.job is None, timeout=60_000)
    assert window.models.info["path"] == str(base_model_path)
    assert progress and max(progress) == pytest.approx(1.0)
    assert "base model" in window.model_label.text()
    assert str(base_model_path) in window.host.paths.config_path.read_text()
    assert not dialog.progress.isVisible()


def test_a_first_load_says_it_prepares_the_model_then_loads_it(make_window, qtbot, monkeypatch, tmp_path,
                                                               base_model_path):
    """The first load of a model writes its 8-bit copy (runtime/weights.py): the status bar
    says so, with the percentage, then "Loading the model…"; the next load says only that."""
    monkeypatch.setenv("IRIS_WEIGHTS_DIR", str(tmp_path / "weights"))  # no copy there yet
    window = make_window(None, overrides={"model.path": str(base_model_path)}, load=False)
    texts: list[str] = []
    window.app_state.busyChanged.connect(lambda text, fraction: texts.append(text))
    for expect_copy in (True, False):
        texts.clear()
        window.models.load()
        qtbot.waitUntil(lambda: window.models.job is None, timeout=120_000)
        assert window.model_state == "ready", window.models.error
        preparing = [t for t in texts if t and t.startswith("Preparing the model for this computer (once)… ")]
        loading = [t for t in texts if t and t.startswith("Loading the model… ")]
        assert bool(preparing) == expect_copy, texts
        assert loading and loading[-1].endswith("100%")
        if expect_copy:  # the copy first, then the load, in that order
            assert texts.index(preparing[-1]) < texts.index(loading[0])
            assert int(preparing[-1].rsplit(" ", 1)[1].rstrip("%")) <= 80
        assert texts[-1] is None  # the status bar is free again
    assert list((tmp_path / "weights").glob("*.q8_0.gguf"))


def test_about_shows_the_model_licenses(make_window, qtbot):
    window = make_window(ScriptedRuntime([]))
    text = window.menus.about_text()
    assert "Apache-2.0" in text and "Qwen2.5-Coder" in text and "all-MiniLM" in text
    box = window.menus.licenses()
    assert "Apache License" in box.detailedText()
    # a window one can read: resizable, most of a screen's lines, not a message box's five
    assert box.view.height() > 20 * box.view.fontMetrics().lineSpacing()
    assert box.minimumSize() != box.maximumSize()
    box.done(0)


def test_a_reply_cut_off_at_max_tokens_says_so_in_the_status_bar(make_window, qtbot):
    """…and only until the next turn starts (before, an audit: "Cut off…" stayed through
    the next turn, hiding its "Generating…", and was still shown after it ended
    complete)."""
    window = make_window(ScriptedRuntime(["one two three four five", "Yes."], cut_at_cap=True),
                         overrides={"model.max_tokens": "3"})
    window.send("Count")
    qtbot.waitUntil(lambda: window.status_area.current_message().startswith("Cut off"),
                    timeout=20_000)  # (settle waits for the DB thread, not for the turn)
    assert window.status_area.current_message() == (
        "Cut off: the reply reached model.max_tokens (3 tokens); Continue on the reply goes on")
    assert window.state_label.text() == "Cut off"
    seen: list[str] = []
    window.app_state.generatingChanged.connect(
        lambda on: seen.append(window.status_area.current_message()) if on else None)
    window.send("Say yes")
    qtbot.waitUntil(lambda: seen and not window.generating, timeout=20_000)
    assert seen == [""] and not window.status_area.message.isVisible()
    assert not window.status_area.current_message().startswith("Cut off")
    assert window.status_area.state.isVisible() and window.state_label.text() != "Cut off"


def test_a_draft_too_large_for_the_window_says_so_beside_the_box(make_window, qtbot):
    """Before: 30,000 pasted words showed "Draft: – tokens" (the meter's tooltip alone
    said why)."""
    window = make_window(ScriptedRuntime([]))
    window.composer.edit.setPlainText("word " * 30_000)
    qtbot.waitUntil(lambda: window.composer.tokens.text().startswith("Draft: too large"),
                    timeout=20_000)
    assert window.composer.tokens.text().startswith("Draft: too large (at least 37,504 tokens; ")
    window.composer.edit.setPlainText("word " * 10)
    qtbot.waitUntil(lambda: "too large" not in window.composer.tokens.text(), timeout=10_000)
    assert re.fullmatch(r"Draft: \d+ tokens", window.composer.tokens.text())


def test_the_status_bars_sentence_about_a_chat_goes_when_another_is_opened(make_window, qtbot, data_dir):
    """Before: after a reply in a long chat the status bar said "9978 older turns are not
    sent…", and it stayed when a two-message chat was opened, or the long chat deleted.
    Now it is about the chat it was said for (and its count reads 1,234)."""
    long_turns = [m for n in range(1_300) for m in (
        {"role": "user", "content": f"Turn {n}: the walk by the river was long."},
        {"role": "assistant", "content": f"Noted, turn {n}."})]
    long_chat = seed_thread(data_dir, long_turns, title="long")
    short_chat = seed_thread(data_dir, long_turns[:2], title="short")
    window = make_window(ScriptedRuntime(["Yes.", "word " * 400], delay_s=0.01),
                         overrides={"context.window": "8192"})
    window.open_thread(long_chat)
    settle(qtbot, window)
    window.send("And then?")
    qtbot.waitUntil(lambda: not window.generating, timeout=20_000)
    said = window.status_area.state.text()
    assert re.fullmatch(r"\d,\d{3} older turns are not sent; the inspector \(Ctrl\+I\) says why\.",
                        said), said
    window.open_thread(short_chat)
    settle(qtbot, window)
    assert window.status_area.state.text() == "Ready"
    # a turn that ends while another chat is open says nothing about the one it answered
    window.open_thread(long_chat)
    settle(qtbot, window)
    window.send("And after that?")
    qtbot.waitUntil(lambda: window.generating, timeout=5_000)
    window.open_thread(short_chat)
    qtbot.waitUntil(lambda: not window.generating, timeout=30_000)
    assert "older turns" not in window.status_area.state.text()
