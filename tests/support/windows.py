"""The main window on a fresh data folder, for the GUI's tests (a pytest plugin loaded by
``tests/conftest.py``; Qt is imported only when a test asks for a window).

``make_window(runtime, overrides, load)`` builds the window through the one host:
- a scripted runtime (the default, an empty one): no model file is loaded, compaction is
  off, and recall by meaning is off (its windows need no embedding of every message); the
  model is then expected to be ready;
- ``runtime=None``: the model named by the settings loads, as in the app (``load=False``:
  the window starts without loading it).
:func:`settle` waits until the DB thread has answered everything asked so far;
``transcript_view`` is the transcript on its own, shown at 700×500."""

from __future__ import annotations

import pytest

from support.fakes import ScriptedRuntime

#: ``make_window``'s default: a fresh scripted runtime with nothing to say
EMPTY = object()


def settle(qtbot, window) -> None:
    """Wait until the DB thread has answered everything asked so far."""
    qtbot.waitUntil(lambda: window.background.idle, timeout=20_000)
    qtbot.wait(10)
    qtbot.waitUntil(lambda: window.background.idle, timeout=20_000)


@pytest.fixture
def data_dir(tmp_path):
    return tmp_path / "data"


@pytest.fixture
def make_window(qtbot, data_dir):
    from iris_desktop.host import Host
    from iris_desktop.ui.main_window import main_window

    made = []

    def make(runtime=EMPTY, overrides=None, load=True):
        runtime = ScriptedRuntime([]) if runtime is EMPTY else runtime
        if runtime is not None:
            overrides = {"context.recall_semantic": "false", **(overrides or {})}
        host = Host(data_dir, overrides or {}, runtime=runtime, compact=runtime is None)
        window = main_window(host, load=load)
        qtbot.addWidget(window)
        window.show()
        made.append((window, host))
        if load:
            qtbot.waitUntil(lambda: window.model_state in ("ready", "failed"), timeout=60_000)
            if runtime is not None:
                assert window.model_state == "ready", window.app_state.model_error
        settle(qtbot, window)
        return window

    yield make
    for window, host in made:
        window.shutdown()
        host.close()


@pytest.fixture
def system_look_after(qapp):
    """The application's look and text size are process-wide: a test that changes them
    leaves the system's (``pytest.mark.usefixtures("system_look_after")``)."""
    from iris_desktop.ui.theme import apply_appearance

    yield
    apply_appearance(qapp, "system", 0)


@pytest.fixture
def transcript_view(qtbot):
    from iris_desktop.ui.transcript import TranscriptView

    view = TranscriptView()
    qtbot.addWidget(view)
    view.resize(700, 500)
    view.show()
    qtbot.waitExposed(view)
    return view


def code_block_colours(doc, block) -> set[str]:
    """The colours of the non-blank text of one code block (``highlight.code_boxes``) of a
    transcript document."""
    colours = set()
    for number in range(block.first, block.last + 1):
        it = doc.findBlockByNumber(number).begin()
        while not it.atEnd():
            fragment = it.fragment()
            if fragment.text().strip():
                colours.add(fragment.charFormat().foreground().color().name())
            it += 1
    return colours


def run_gui_recording(monkeypatch, data, titles: bool = False) -> list[tuple[str, ...]]:
    """Start the real app on ``data`` with its message boxes and main window recorded
    (the window quits at once): ``[(kind, text), ...]`` in the order they were shown, or
    ``(kind, title, text)`` with ``titles`` (the exit code is then not checked: a refused
    start's is 1)."""
    from PySide6.QtCore import QTimer

    from iris_desktop.ui import app as app_module

    shown: list[tuple[str, ...]] = []

    def box(kind):
        return staticmethod(lambda parent, title, text: shown.append(
            (kind, title, text) if titles else (kind, text)))

    class Boxes:
        warning, critical, information = box("warning"), box("critical"), box("information")

    class Window:
        def show(self):
            QTimer.singleShot(0, app_module.QApplication.instance().quit)

        def shutdown(self):
            pass

    monkeypatch.setattr(app_module, "QMessageBox", Boxes)
    monkeypatch.setattr(app_module, "main_window",
                        lambda session: shown.append(("window", "", "") if titles else ("window", "")) or Window())
    monkeypatch.setattr(app_module, "setup_logging", lambda path: None)
    code = app_module.run_gui(data)
    assert titles or code == 0
    return shown


def open_preferences(window, qtbot, timeout: int = 10_000):
    """Preferences as the menu opens it, its first budget shown; the window's watch of the
    settings file off (what is tested is what the dialog does on its own)."""
    watch = getattr(window.menus, "config_watch", None)
    if watch is not None:
        watch.watcher.blockSignals(True)
    dialog = window.preferences()
    qtbot.waitUntil(lambda: dialog.last_preview is not None, timeout=timeout)
    return dialog


def window_on(qtbot, folder, size: tuple[int, int] | None = None):
    """(window, host) on the data folder ``folder`` with a scripted model, ready (shown at
    ``size`` when given); the caller shuts both down."""
    from iris_desktop.host import Host
    from iris_desktop.ui.main_window import main_window

    host = Host(folder, {"context.recall_semantic": "false"}, runtime=ScriptedRuntime([]),
                compact=False)
    window = main_window(host)
    qtbot.addWidget(window)
    window.show()
    if size is not None:
        window.resize(*size)
    qtbot.waitUntil(lambda: window.model_state == "ready", timeout=10_000)
    return window, host
