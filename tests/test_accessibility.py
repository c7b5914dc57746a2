"""Accessibility (issue #47 item 6): every control the keyboard reaches in the main
window, Preferences and the context inspector has a name and a sensible role, Tab goes
through all of them, and a finished reply, an error and a compaction are announced.

The Qt-level checks run everywhere (offscreen). The AT-SPI check starts a private D-Bus
session, Xvfb and the AT-SPI registry, runs the window there and reads it as a screen
reader would (pyatspi, from the system's Python); it is skipped, saying why, where those
are not installed."""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtGui import QAccessible  # noqa: E402
from PySide6.QtWidgets import (  # noqa: E402
    QAbstractItemView,
    QAbstractScrollArea,
    QApplication,
    QPlainTextEdit,
    QTextEdit,
    QWidget,
)

from iris_desktop.core.events import CompactionEvent, CompactionFinished  # noqa: E402

from support.fakes import ScriptedRuntime  # noqa: E402

Role = QAccessible.Role
#: roles a control may have: what it does, said by its kind
CONTROL_ROLES = {Role.Button, Role.CheckBox, Role.RadioButton, Role.ComboBox, Role.SpinBox,
                 Role.Slider, Role.EditableText, Role.List, Role.Table, Role.Tree,
                 Role.PageTabList, Role.PageTab, Role.ProgressBar, Role.StaticText,
                 Role.ScrollBar, Role.ButtonMenu}


pytestmark = pytest.mark.usefixtures("system_look_after")


@pytest.fixture
def window(make_window, qtbot):
    """The window once this computer has been read: the welcome card's button is named
    by the recommendation (before it, the card and its button are hidden and unnamed)."""
    w = make_window(ScriptedRuntime(["Paris is the capital of France.", ValueError("the model broke")]))
    qtbot.waitUntil(lambda: w.models.recommend.recommendation is not None, timeout=60_000)
    return w


def keyboard_controls(root: QWidget) -> list[QWidget]:
    """What Tab reaches under ``root``, walked here (not with the app's own helper): a
    focus proxy's target stands for it, a spin box's or combo box's inner parts for the
    box; hidden windows (a combo box's popup) are not part of it."""
    found = []
    for widget in [root, *root.findChildren(QWidget)]:
        if not widget.focusPolicy() & Qt.FocusPolicy.TabFocus or widget.focusProxy() is not None:
            continue
        if widget.window() is not root.window() and widget.window() is not root:
            continue  # another window: a popup, a dialog checked on its own
        owner = widget.parentWidget()
        while owner is not None and owner is not root and not owner.inherits("QComboBox") \
                and not owner.inherits("QAbstractSpinBox"):
            owner = owner.parentWidget()
        if owner is not None and owner is not root:
            continue
        found.append(widget)
    return found


def describe(widget: QWidget) -> str:
    return f"{type(widget).__name__}({widget.objectName()!r}) under {type(widget.parentWidget()).__name__}"


def problems(root: QWidget) -> list[str]:
    """Controls without a name (their own accessibleName, or for a button its text: what
    assistive technology is told), or with no sensible role."""
    found = []
    for widget in keyboard_controls(root):
        iface = QAccessible.queryAccessibleInterface(widget)
        if iface is None or not iface.text(QAccessible.Text.Name).strip():
            found.append(f"{describe(widget)}: no accessible name")
            continue
        if not widget.accessibleName().strip() and not widget.inherits("QAbstractButton"):
            found.append(f"{describe(widget)}: named only by chance (no accessibleName)")
        role = iface.role()
        scroll_pane = isinstance(widget, QAbstractScrollArea) and not isinstance(
            widget, (QAbstractItemView, QPlainTextEdit, QTextEdit))
        if role not in CONTROL_ROLES and not (scroll_pane and role == Role.Client):
            found.append(f"{describe(widget)}: role {role.name}")
    return found


def test_every_control_of_the_window_preferences_and_inspector_has_a_name_and_role(
        window, qtbot, tmp_path):
    w = window
    w.inspector.toggleViewAction().trigger()
    attached = tmp_path / "notes.txt"
    attached.write_text("some notes\n", encoding="utf-8")
    w.composer.attachRequested.emit([str(attached)])  # a chip: a control too
    qtbot.waitUntil(lambda: len(w.composer.attachments) == 1, timeout=5_000)
    w.send("What is the capital of France?")
    qtbot.waitUntil(lambda: not w.generating, timeout=10_000)
    qtbot.waitUntil(lambda: w.background.idle, timeout=10_000)
    assert problems(w) == []
    assert problems(w.inspector) == []
    dialog = w.preferences()
    qtbot.waitUntil(dialog.isVisible, timeout=5_000)
    assert problems(dialog) == []
    # the controls a newcomer looks for first, by name
    names = {c.accessibleName() for c in keyboard_controls(w)}
    assert {"Message", "Send", "Search chats", "Chats", "Conversation", "Context budget",
            "New chat", "Attach files"} <= names
    meter = QAccessible.queryAccessibleInterface(w.meter)
    assert meter.role() == Role.ProgressBar
    assert "tokens used" in meter.text(QAccessible.Text.Description)
    window_field = dialog.fields["context.window"].editor.spin
    assert window_field.accessibleName() == "Context window"
    assert dialog.fields["context.window"].title.buddy() is window_field


def tab_from(w, start: QWidget, qtbot, most: int) -> list[QWidget]:
    """The widgets Tab reaches from ``start`` (first), in order, until one comes again
    or ``most`` were seen."""
    w.activateWindow()
    start.setFocus(Qt.FocusReason.TabFocusReason)
    qtbot.waitUntil(lambda: QApplication.focusWidget() is start, timeout=5_000)
    seen: list[QWidget] = []
    for _ in range(most):
        focus = QApplication.focusWidget()
        if focus in seen:
            break
        seen.append(focus)
        qtbot.keyClick(focus, Qt.Key.Key_Tab)
    return seen


def test_tab_reaches_every_control_of_the_window(window, qtbot):
    w = window
    w.send("What is the capital of France?")  # the conversation shows (not the welcome)
    qtbot.waitUntil(lambda: not w.generating, timeout=10_000)
    w.inspector.toggleViewAction().trigger()
    qtbot.waitUntil(w.inspector.isVisible, timeout=5_000)
    # with rows in it: a table's Tab went cell to cell, round and round (an audit)
    qtbot.waitUntil(lambda: w.inspector.request_table.rowCount() > 0, timeout=5_000)
    seen = tab_from(w, w.threads.new_button, qtbot, 60)
    # the ring closes: Tab after the inspector's last control comes back to the first
    # (an audit: with the inspector open, Tab went round the inspector and never left it)
    assert QApplication.focusWidget() is w.threads.new_button, describe(QApplication.focusWidget())
    c, t, i = w.composer, w.threads, w.inspector
    wanted = [t.new_button, t.search, t.list, w.view, c.edit, c.button, c.attach_button,
              w.meter, i.tabs.tabBar(), i.request_table, i.chart_scroll]
    assert [x for x in wanted if x not in seen] == []
    # in reading order
    assert [seen.index(x) for x in wanted] == sorted(seen.index(x) for x in wanted)
    reachable = [x for x in keyboard_controls(w) if x.isVisible() and x.isEnabled()
                 and x.window() is w and not x.inherits("QToolButton")]
    missed = [describe(x) for x in reachable if x not in seen
              and not any(x.isAncestorOf(s) or s.isAncestorOf(x) for s in seen)]
    assert missed == []


def test_tab_leaves_every_table_and_enter_uses_the_model_chosen(window, qtbot):
    """Models…, Keyboard shortcuts and Download…: Tab leaves the table for the buttons
    (it went cell to cell, so Use this model and Close were never reached), and Enter on
    a model of the list uses it (it opened the file dialog)."""
    from PySide6.QtWidgets import QTableWidget

    w = window
    dialogs = [w.models.open_library(), w.menus.shortcuts()]
    qtbot.waitUntil(lambda: dialogs[0].table.rowCount() > 0, timeout=30_000)
    for dialog in dialogs:
        qtbot.waitUntil(dialog.isVisible, timeout=5_000)
        dialog.activateWindow()
        dialog.table.setFocus()
        qtbot.keyClick(dialog.table, Qt.Key.Key_Tab)
        assert QApplication.focusWidget() is not dialog.table, dialog.objectName()
    models = dialogs[0]
    assert models.use_button.isDefault() and not models.open_button.autoDefault()
    asked = []
    models.useModel.disconnect()  # what Enter asks for, not a load
    models.useModel.connect(asked.append)
    models.activateWindow()
    models.table.setFocus()
    models.table.selectRow(0)
    qtbot.keyClick(models.table, Qt.Key.Key_Return)
    assert models.entries[0]["source"] == "bundled" and asked == ["bundled"]  # Use this model
    every = [t for top in QApplication.topLevelWidgets() for t in top.findChildren(QTableWidget)]
    assert every and [t.objectName() or t.parent().objectName() for t in every
                      if t.tabKeyNavigation()] == []
    for dialog in dialogs:
        dialog.close()


def test_tab_on_the_welcome_panel_goes_from_the_chats_to_the_examples_then_the_box(window, qtbot):
    """Before: the welcome's "Try one" buttons came after the budget meter, at the end
    of the window. Now they follow the chats, where the conversation will be, and the
    message box follows them."""
    w = window
    qtbot.waitUntil(w.welcome.isVisible, timeout=5_000)
    seen = tab_from(w, w.threads.list, qtbot, 12)[1:]  # what follows the chat list
    card = w.welcome.recommend  # a larger model to download, where there is one: under
    wanted = [*w.welcome.examples]  # the examples, so after them
    wanted += [b for b in (card.button, card.stop_button) if b.isVisible()]
    wanted += [w.composer.edit]
    assert seen[:len(wanted)] == wanted


def test_a_reply_an_error_and_a_compaction_are_announced(window, qtbot):
    w = window
    said = w.announcer.announced
    w.send("What is the capital of France?")
    qtbot.waitUntil(lambda: not w.generating, timeout=10_000)
    assert said[-1] == ("Iris replied: Paris is the capital of France.", False)
    w.send("And of Spain?")
    qtbot.waitUntil(lambda: not w.generating, timeout=10_000)
    qtbot.waitUntil(lambda: any(assertive for _, assertive in said), timeout=5_000)
    error = next(text for text, assertive in said if assertive)
    assert error.startswith("Iris could not answer:")
    event = CompactionEvent("tokens", "ok", "extractive", 2, 4, 900, 300, 1, 120, 0.4,
                            first_turn=1, last_turn=2)
    w.model.worker.turnEvent.emit(CompactionFinished(w.thread_id, event))
    qtbot.waitUntil(lambda: said[-1][0].startswith("Turns 1–2 (4 messages) are summarized now"), timeout=5_000)


# -- read through AT-SPI, as a screen reader does ---------------------------------------------

#: the window, driven from inside: ready, then (when the reader says go) a reply, Compact
#: now, and a turn that fails; it quits when the reader is done
AT_SPI_APP = r'''
import sys
from pathlib import Path

work = Path(sys.argv[1])
sys.path.insert(0, sys.argv[2])  # tests/: the scripted runtime
from PySide6.QtCore import QTimer
from iris_desktop.host import Host
from iris_desktop.ui.app import application
from iris_desktop.ui.main_window import main_window
from support.fakes import ScriptedRuntime

app = application()
host = Host(work / "data", {"context.recall_semantic": "false", "context.summarizer": "extractive"},
            runtime=ScriptedRuntime(["Paris is the capital of France.", ValueError("it broke")]),
            compact=True)
window = main_window(host)
window.show()
window.inspector.show()
steps = ["wait model", "wait go", "reply", "compact", "fail", "done"]

def tick():
    step = steps[0]
    if step == "wait model" and window.model_state == "ready":
        window.preferences()
        (work / "ready").write_text("ready")
    elif step == "wait go" and (work / "go").exists():
        pass
    elif step == "reply" and not window.generating:
        window.send("What is the capital of France?")
    elif step == "compact" and not window.generating:
        window.menus.actions["compact-now"].trigger()
    elif step == "fail" and not window.generating:
        window.send("And of Spain?")
    elif step == "done":
        if (work / "quit").exists():
            app.quit()
        return
    else:
        return
    steps.pop(0)

timer = QTimer()
timer.timeout.connect(tick)
timer.start(200)
QTimer.singleShot(90_000, app.quit)
app.exec()
window.shutdown()
host.close()
'''

#: the screen reader's side (the system's Python with pyatspi): every focusable object
#: shown in the window and its dialogs, with role, name and labels; then the
#: announcements heard after "go"
AT_SPI_READER = r'''
import json, sys, time
from pathlib import Path
import pyatspi
from gi.repository import GLib

work = Path(sys.argv[1])
out = {"apps": [], "controls": {}, "announcements": []}

def heard(event):
    out["announcements"].append({"text": str(event.any_data), "politeness": event.detail1})
    if len(out["announcements"]) >= 3:
        GLib.timeout_add(500, loop.quit)

pyatspi.Registry.registerEventListener(heard, "object:announcement")
deadline = time.time() + 60
while not (work / "ready").exists() and time.time() < deadline:
    time.sleep(0.2)
time.sleep(1.5)
desktop, iris = pyatspi.Registry.getDesktop(0), None
for _ in range(50):
    apps = [desktop.getChildAtIndex(i) for i in range(desktop.childCount)]
    out["apps"] = [a.name for a in apps if a is not None]
    iris = next((a for a in apps if a is not None and a.name == "Iris Desktop"), None)
    if iris is not None:
        break
    time.sleep(0.2)

def walk(node, found, depth=0):
    if node is None or depth > 80:
        return
    states = node.getState()
    if states.contains(pyatspi.STATE_FOCUSABLE) and states.contains(pyatspi.STATE_SHOWING):
        labelled = [r for r in node.getRelationSet()
                    if r.getRelationType() == pyatspi.RELATION_LABELLED_BY]
        found.append({"role": node.getRoleName(), "name": node.name,
                      "description": node.description, "labelled": bool(labelled)})
    for i in range(node.childCount):
        walk(node.getChildAtIndex(i), found, depth + 1)

if iris is not None:
    for i in range(iris.childCount):
        top = iris.getChildAtIndex(i)
        found = []
        walk(top, found)
        out["controls"][f"{top.getRoleName()}: {top.name}"] = found
(work / "go").write_text("go")
loop = GLib.MainLoop()
GLib.timeout_add(30_000, loop.quit)
loop.run()
(work / "quit").write_text("quit")
(work / "result.json").write_text(json.dumps(out, indent=1))
'''

AT_SPI_RUN = r'''
work=$1; repo=$2; python=$3
/usr/libexec/at-spi-bus-launcher --launch-immediately &
launcher=$!
sleep 1
QT_QPA_PLATFORM=xcb QT_LINUX_ACCESSIBILITY_ALWAYS_ON=1 QT_ACCESSIBILITY=1 PYTHONPATH=$repo \
    "$python" "$work/app.py" "$work" "$repo/tests" > "$work/app.log" 2>&1 &
app=$!
/usr/bin/python3 "$work/reader.py" "$work" > "$work/reader.log" 2>&1
wait $app
kill $launcher 2>/dev/null
'''

#: roles that name no control: a control reported with one of them is a bug
NO_ROLES = {"unknown", "invalid", "redundant object", "extended"}


def at_spi_missing() -> str | None:
    """Why an AT-SPI session cannot be run here, or None."""
    import shutil
    import subprocess
    from pathlib import Path

    for tool in ("xvfb-run", "dbus-run-session"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian: xvfb, dbus)"
    if not Path("/usr/libexec/at-spi-bus-launcher").exists():
        return "at-spi2-core is not installed (no /usr/libexec/at-spi-bus-launcher)"
    probe = subprocess.run(["/usr/bin/python3", "-c", "import pyatspi"], capture_output=True)
    if probe.returncode:
        return "the system's Python has no pyatspi (Debian: python3-pyatspi)"
    return None


def test_a_screen_reader_finds_names_and_roles_and_hears_the_announcements(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    missing = at_spi_missing()
    if missing:
        pytest.skip(reason=f"no AT-SPI session: {missing}")
    for name, text in (("app.py", AT_SPI_APP), ("reader.py", AT_SPI_READER), ("run.sh", AT_SPI_RUN)):
        (tmp_path / name).write_text(text, encoding="utf-8")
    repo = Path(__file__).resolve().parents[1]
    subprocess.run(["xvfb-run", "-a", "dbus-run-session", "--", "bash", str(tmp_path / "run.sh"),
                    str(tmp_path), str(repo), sys.executable], timeout=150, capture_output=True)
    result = tmp_path / "result.json"
    logs = "\n".join((tmp_path / n).read_text(errors="replace")[-1500:]
                     for n in ("app.log", "reader.log") if (tmp_path / n).exists())
    if not result.exists():
        pytest.skip(reason=f"the AT-SPI bus could not be started or read: {logs}")
    out = json.loads(result.read_text())
    if "Iris Desktop" not in out["apps"]:
        pytest.skip(reason=f"the window never reached the AT-SPI registry: {out['apps']}; {logs}")
    tops = out["controls"]
    assert any(top.startswith("frame: Iris Desktop") for top in tops), tops.keys()
    assert "dialog: Preferences" in tops, tops.keys()
    bad = []
    for top, controls in tops.items():
        for control in controls:
            # a combo box's name is its value on Linux: it is labelled by its setting's label
            named = control["name"].strip() or (control["role"] == "combo box"
                                                and control["labelled"])
            if not named or control["role"] in NO_ROLES:
                bad.append(f"{top}: {control}")
    assert bad == []
    found = {c["name"] for controls in tops.values() for c in controls}
    assert {"Message", "Send", "Search chats", "Chats", "Context budget", "Next request, "
            "message by message", "Context window", "OK: apply and close"} <= found
    roles = {c["name"]: c["role"] for controls in tops.values() for c in controls}
    assert roles["Context budget"] == "progress bar" and roles["Chats"] == "list"
    assert roles["Context window"] == "spin button" and roles["Message"] == "text"
    heard = out["announcements"]
    texts = [h["text"] for h in heard]
    assert any(t == "Iris replied: Paris is the capital of France." for t in texts), heard
    assert any(t.startswith("Compaction") or t.startswith("Compacted") for t in texts), heard
    failed = [h for h in heard if h["text"].startswith("Iris could not answer")]
    assert failed and failed[0]["politeness"] == 2, heard  # assertive: ATSPI_LIVE_ASSERTIVE
    assert all(h["politeness"] == 1 for h in heard if h not in failed), heard  # polite


def test_the_window_opens_ready_to_type(window, qtbot):
    """Before (an audit): the first focus was on New chat; a keyboard user had to find the
    message box first."""
    window.activateWindow()
    qtbot.waitUntil(lambda: QApplication.focusWidget() is window.composer.edit, timeout=5_000)


# -- an audit of keyboard use (session 55) ------------------------------------------------------


def test_tab_leaves_every_text_field_of_preferences(window, qtbot):
    """Before: Tab in "Folders the tools may read" or the system prompt typed a tab
    character and stayed there; OK and Apply were out of reach by Tab."""
    dialog = window.preferences()
    qtbot.waitUntil(dialog.isVisible, timeout=5_000)
    for key in ("tools.allowed_paths", "chat.system_prompt"):
        field = dialog.fields[key].editor.text
        dialog.tabs.setCurrentIndex(dialog.sections.index(key.split(".")[0]))
        field.setFocus(Qt.FocusReason.TabFocusReason)
        qtbot.waitUntil(field.hasFocus, timeout=5_000)
        before = field.toPlainText()
        qtbot.keyClick(field, Qt.Key.Key_Tab)
        assert not field.hasFocus() and field.toPlainText() == before, key
    dialog.reject()


def test_the_download_dialogs_controls_and_the_menus_access_keys(window, qtbot, tmp_path):
    from iris_desktop.ui.download_dialog import DownloadDialog

    dialog = DownloadDialog("http://127.0.0.1:9", tmp_path / "models", 8192)
    qtbot.addWidget(dialog)
    assert problems(dialog) == []
    assert (dialog.search_edit.accessibleName(), dialog.repos.accessibleName(),
            dialog.table.accessibleName()) == ("Search the model hub", "Models found",
                                               "Files of the chosen model")
    for top in window.menuBar().actions():  # Alt+H, L opened nothing: two items had L
        keys = [a.text().split("&")[1][:1].lower() for a in top.menu().actions()
                if "&" in a.text()]
        assert len(keys) == len(set(keys)), (top.text(), keys)


def test_a_model_ready_is_announced(window, qtbot):
    """Before: the box stays disabled while the model loads; "Ready" was shown, never said."""
    said = window.announcer.announced
    window.menus.actions["reload-model"].trigger()
    qtbot.waitUntil(lambda: ("Model ready: ScriptedRuntime", False) in said, timeout=10_000)


def test_the_live_rate_is_shown_at_most_once_a_second(make_window, qtbot):
    """The status line is what screen readers hear: the tokens-per-second text was set
    about 30 times a second while a reply streamed."""
    w = make_window(ScriptedRuntime(["word " * 120], delay_s=0.01))
    shown: list[str] = []
    w.app_state.statusText.connect(shown.append)
    w.send("Count")
    qtbot.waitUntil(lambda: any(t.startswith("Generating") for t in shown), timeout=20_000)
    qtbot.waitUntil(lambda: not w.generating, timeout=20_000)
    live = [t for t in shown if t.startswith("Generating")]
    assert 1 <= len(live) <= 4, live  # about 1.2 s of streaming


def test_a_rows_state_a_divider_and_a_wait_for_a_summary_are_spoken():
    """Before (an audit): a compaction divider was read as "divider: "; a stopped, failed,
    summarized or not-yet-sent message was read without the badge that says so, and a
    tool row without its name. (The wait for a summary is announced: see
    test_newcomer_ui.py::test_a_send_that_waits_for_a_summary_says_so_in_the_transcript.)"""
    from iris_desktop.core.views import Entry
    from iris_desktop.ui.transcript_model import spoken

    divider = Entry("divider", "d:1", title="▸ Earlier turns summarized (turns 1–53)")
    assert spoken(divider) == "▸ Earlier turns summarized (turns 1–53). Shift+F10, Expand: the summary"
    stopped = Entry("message", "m:2", 2, "assistant", text="word word", status="interrupted")
    assert spoken(stopped).endswith("(stopped): word word")
    failed = Entry("message", "m:3", 3, "assistant", text="partial", status="error")
    assert "(failed): partial" in spoken(failed)
    waiting = Entry("message", "m:4", 4, "user", text="old question", state="dropped")
    assert "(not sent — waiting to be summarized): old question" in spoken(waiting)
    tool = Entry("tool", "t:5", 5, "tool", text="Traceback…", tool_name="run_shell", error=True)
    assert spoken(tool).startswith("Tool run_shell (error): Traceback")
