"""A newcomer's stumbles in the real window (session 62's audit), each met on real Qt
widgets over a real data folder:

- a 200 KB paste: "Draft: too large (at least 40,512 tokens; 5,709 fit)" in one line
  widened the composer's button column until the message box was 120 px wide at 800×600;
- Send stayed enabled for that draft: Enter took it out of the box, "Thinking…", then put
  it back under a red "Iris could not answer" card ending in "raise context.window and
  model.n_ctx";
- File ▸ Import conversation…'s filter was cut off before its extensions, and a folder
  (an unzipped ChatGPT or Claude export, Jan's threads) could be imported by the CLI only;
- "Delete … and all its 6 messages?" beside a chat showing 4 (2 on another branch).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402

from iris_desktop.core.store import Store  # noqa: E402

from support.fakes import ScriptedRuntime  # noqa: E402
from support.windows import settle  # noqa: E402

LINE = "The quick brown fox jumps over the lazy dog while the log rotates at midnight. "
PASTE = LINE * 2600  # about 200 KB: too large for an 8,192-token window, not certainly so
JAN_THREADS = Path(__file__).parent / "fixtures" / "foreign" / "jan" / "threads"


def too_large_window(make_window, qtbot, runtime=None):
    window = make_window(runtime or ScriptedRuntime([]), overrides={"context.window": "8192"})
    window.resize(800, 600)
    qtbot.wait(50)
    window.inspector.toggleViewAction().trigger()  # View ▸ Context inspector, as audited
    qtbot.waitUntil(window.inspector.isVisible, timeout=5_000)
    window.composer.edit.setPlainText(PASTE)
    qtbot.waitUntil(lambda: window.composer.tokens.text().startswith("Draft: too large"),
                    timeout=20_000)
    settle(qtbot, window)
    qtbot.wait(50)
    return window


# -- 1. the message box keeps its room ---------------------------------------------------


def test_a_too_large_draft_leaves_the_message_box_its_room_at_800x600(make_window, qtbot):
    window = too_large_window(make_window, qtbot)
    composer = window.composer
    label = composer.tokens
    assert composer.edit.width() >= 290, composer.edit.width()  # was 120
    button = composer.button  # the buttons' column did not grow to the sentence (298 px)
    assert button.width() <= button.sizeHint().width() + 10, button.width()
    # all of its words are shown (wrapped), and said in full to a mouse and a screen reader
    assert label.heightForWidth(label.width()) <= label.height()
    assert label.text().startswith("Draft: too large (at least ")
    for said in (label.toolTip(), label.accessibleDescription()):
        assert said.startswith("Too large to send: at least ") and " fit in this chat; " in said
        assert "shorten the message" in said and said.endswith(".")
        assert "context.window" not in said and "n_ctx" not in said  # plain words


# -- 2. Send waits for a draft that fits -------------------------------------------------


def test_send_waits_while_the_draft_is_known_too_large_and_the_draft_stays(make_window, qtbot):
    runtime = ScriptedRuntime(["Noted."])
    window = too_large_window(make_window, qtbot, runtime)
    composer, button = window.composer, window.composer.button
    assert not button.isEnabled()
    tip = button.toolTip()
    assert tip.startswith("Too large to send: at least ") and "Preferences (Ctrl+,)" in tip
    assert "attach" not in tip.lower()  # an attached file counts as the text: no way out
    assert button.accessibleDescription() == tip
    shown: list[str] = []
    window.app_state.statusMessage.connect(lambda text, _ms: shown.append(text))
    entries = len(window.view.transcript.entries())
    composer.edit.setFocus()
    qtbot.keyClick(composer.edit, Qt.Key.Key_Return)
    qtbot.wait(300)
    settle(qtbot, window)
    assert shown == [tip]  # Enter says why, in the status bar
    assert not window.generating and runtime.requests == []
    assert composer.text() == PASTE  # never taken out of the box
    assert len(window.view.transcript.entries()) == entries  # no "Iris could not answer"
    with Store(window.host.paths.db_path) as store:
        assert all(store.messages(t["id"]) == [] for t in store.threads())

    # shortened: Send at once, before it is counted again (not held back on a guess)
    composer.edit.setPlainText("Summarize the log rotation in one line.")
    assert button.isEnabled() and button.toolTip() == "Send (Enter)"
    assert button.accessibleDescription() == ""
    qtbot.keyClick(composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: len(runtime.requests) == 1 and not window.generating, timeout=20_000)
    assert window.view.transcript.entries()[-1].text == "Noted."
    settle(qtbot, window)
    assert "too large" not in composer.tokens.text() and button.isEnabled()


def test_a_count_for_a_draft_typed_over_since_holds_nothing_back(make_window, qtbot):
    """The engine's answer for the draft before the last keystroke (its new count still to
    come) does not disable Send; one for the draft as it stands does, until it changes."""
    window = make_window(ScriptedRuntime([]))
    composer = window.composer
    composer.edit.setPlainText("a draft being typed")
    composer.set_draft_tokens(None, (40_512, 5_709))  # counted before the last keystroke
    assert composer.button.isEnabled()
    settle(qtbot, window)
    qtbot.waitUntil(lambda: not composer._debounce.isActive(), timeout=5_000)
    composer.set_draft_tokens(None, (40_512, 5_709))  # this very draft
    assert not composer.button.isEnabled()
    composer.set_generating(True)  # a reply under way: Stop is always there
    assert composer.button.isEnabled() and composer.button.toolTip() == "Stop generating (Esc)"
    composer.set_generating(False)
    assert not composer.button.isEnabled()
    composer.edit.insertPlainText("!")  # changed: not known until counted again
    assert composer.button.isEnabled()


# -- 3. File ▸ Import conversation…, Import folder… --------------------------------------


def test_the_import_dialogs_filter_shows_its_extensions(make_window, qtbot, monkeypatch):
    from iris_desktop.ui import thread_control

    asked: list[tuple] = []
    monkeypatch.setattr(thread_control.QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a, **k: asked.append(a) or ("", "")))
    window = make_window()
    window.menus.actions["import"].trigger()  # File ▸ Import conversation…
    (_parent, caption, _folder, filters), = asked
    assert filters == "Chat exports (*.json *.jsonl *.zip);;All files (*)"
    assert all(app in caption for app in ("ChatGPT", "Claude", "Jan"))
    assert len(caption) <= 80


def test_file_import_folder_imports_jans_threads_folder(make_window, qtbot, monkeypatch):
    from iris_desktop.ui import thread_control

    asked: list[tuple] = []
    monkeypatch.setattr(thread_control.QFileDialog, "getExistingDirectory",
                        staticmethod(lambda *a, **k: asked.append(a) or str(JAN_THREADS)))
    window = make_window()
    action = window.menus.actions["import-folder"]
    assert action.text().replace("&", "") == "Import folder…"
    assert action in window.menuBar().actions()[0].menu().actions()  # in File
    action.trigger()
    assert "ChatGPT" in asked[0][1] and "Jan" in asked[0][1]
    qtbot.waitUntil(lambda: window.threads.list.count() == 2, timeout=10_000)
    with Store(window.host.paths.db_path) as store:
        assert len(store.threads()) == 2 and all(store.messages(t["id"]) for t in store.threads())


def test_import_folder_dialog_imports_the_folder_chosen(make_window, qtbot, monkeypatch):
    """The folder goes the way a file goes (the CLI's ``import FOLDER``)."""
    from iris_desktop.ui import thread_control

    monkeypatch.setattr(thread_control.QFileDialog, "getExistingDirectory",
                        staticmethod(lambda *a, **k: str(JAN_THREADS)))
    window = make_window()
    window.threads_control.import_folder_dialog()
    qtbot.waitUntil(lambda: window.threads.list.count() == 2, timeout=10_000)
    monkeypatch.setattr(thread_control.QFileDialog, "getExistingDirectory",
                        staticmethod(lambda *a, **k: ""))  # Cancel: nothing
    window.threads_control.import_folder_dialog()
    settle(qtbot, window)
    assert window.threads.list.count() == 2


# -- 4. deleting a chat with branches -----------------------------------------------------


def seed_branched(window) -> int:
    """6 messages, 4 on the branch shown: the second question was edited and answered."""
    with Store(window.host.paths.db_path) as store:
        thread = store.create_thread("Trip to Lisbon in May")
        ids = store.add_messages(thread, [
            {"role": "user", "content": "Where should we stay?"},
            {"role": "assistant", "content": "Alfama or Baixa."},
            {"role": "user", "content": "And for food?"},
            {"role": "assistant", "content": "Time Out Market."}])
        store.add_message(thread, {"role": "user", "content": "And for fish?"}, parent_id=ids[1])
        store.add_message(thread, {"role": "assistant", "content": "Try Cervejaria Ramiro."})
    return thread


def test_the_delete_question_says_how_many_messages_are_on_other_branches(make_window, qtbot):
    window = make_window()
    thread = seed_branched(window)
    control = window.threads_control
    control.refresh_threads()
    qtbot.waitUntil(lambda: thread in control._rows, timeout=10_000)
    window.open_thread(thread)
    settle(qtbot, window)
    assert len(window.view.transcript.entries()) == 4  # what the chat shows
    box = control.delete_dialog(thread, "Trip to Lisbon in May")
    try:
        assert box.text() == ("Delete “Trip to Lisbon in May” and all its 6 messages (2 of them "
                              "on other branches)? This cannot be undone.")
    finally:
        box.reject()
    settle(qtbot, window)
    with Store(window.host.paths.db_path) as store:
        assert store.thread(thread) is not None  # Cancel: still there
        plain = store.create_thread("Weeknight pasta")
        store.add_messages(plain, [{"role": "user", "content": "Quick sauce?"},
                                   {"role": "assistant", "content": "Garlic and oil."}])
    control.refresh_threads()
    qtbot.waitUntil(lambda: plain in control._rows, timeout=10_000)
    box = control.delete_dialog(plain, "Weeknight pasta")
    try:  # one branch: as before
        assert box.text() == "Delete “Weeknight pasta” and all its 2 messages? This cannot be undone."
    finally:
        box.reject()


def test_a_small_draft_is_not_held_back_when_the_system_prompt_fills_the_budget(make_window, qtbot):
    """The review of this change: Send was disabled for "hi", its tooltip telling the user
    to shorten the message, when the system prompt alone filled the budget; the send then
    says the engine's own sentence (and, with a summary, refits it), as before."""
    window = make_window(ScriptedRuntime(["ok"]), overrides={
        "context.window": "1024", "chat.system_prompt": "Be brief and kind. " * 300})
    composer = window.composer
    composer.edit.setPlainText("hi")
    qtbot.wait(800)
    settle(qtbot, window)
    assert "too large" in window.meter.toolTip().lower() or window.meter.problem
    assert composer.button.isEnabled(), composer.button.toolTip()
    assert "shorten the message" not in composer.button.toolTip()
    composer.edit.setFocus()
    qtbot.keyClick(composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: any("system prompt" in e.text for e in window.view.transcript.entries()),
                    timeout=10_000)
