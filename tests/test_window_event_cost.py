"""What a repaint of the window costs on the GUI thread, counted (never timed).

Session 61 fitted the inspector's width with an event filter on the main window: Python
ran for every event the window got, and a repaint of any part of it (each streamed token,
each status sentence) sends the window an UpdateRequest and a Paint. In ui_latency's switch
of chats that was 614 calls, a quarter of the calls from Qt into the app's Python, each
taking the GIL, which it waits for while the model thread copies the chat's 38 MB KV state
(the switch's longest stall went from 20 to 36 ms after session 61: docs/benchmarks.md).
The width is now fitted from the window's ``resizeEvent``: on a resize only.
"""

from __future__ import annotations

import sys
from collections import Counter

import pytest

pytest.importorskip("pytestqt")

from support.windows import settle  # noqa: E402


def _entered(code_file: str):
    """A profile function that counts the calls of functions defined in ``code_file``,
    and the counter it fills (the GUI thread's only: ``sys.setprofile`` is per thread)."""
    calls: Counter[str] = Counter()

    def profile(frame, event, _arg):
        if event == "call" and frame.f_code.co_filename.endswith(code_file):
            calls[frame.f_code.co_qualname] += 1

    return profile, calls


def test_repainting_the_window_runs_nothing_of_the_inspectors(make_window, qtbot):
    window = make_window()
    settle(qtbot, window)
    profile, calls = _entered("ui/inspector.py")
    sys.setprofile(profile)
    try:
        for i in range(20):  # what a streamed reply does: the status line and the transcript
            window.app_state.show_status(f"Writing… {i} tokens")
            window.view.viewport().update()
            window.repaint()
            qtbot.wait(5)
    finally:
        sys.setprofile(None)
    assert window.isVisible()
    assert sum(calls.values()) == 0, calls  # before: InspectorWidth.eventFilter, 119-122 calls


def test_a_resize_still_fits_the_inspector_and_only_a_resize(make_window, qtbot):
    window = make_window()
    window.resize(1400, 700)
    window.inspector.toggleViewAction().trigger()
    qtbot.waitUntil(window.inspector.isVisible, timeout=5_000)
    settle(qtbot, window)
    profile, calls = _entered("ui/inspector.py")
    sys.setprofile(profile)
    try:
        window.resize(900, 600)
        qtbot.wait(20)
        resized = calls["InspectorWidth.fit"]
        window.repaint()
        qtbot.wait(20)
    finally:
        sys.setprofile(None)
    assert resized >= 1  # the resize was seen: the width is capped (test_newcomer_ui)
    assert calls["InspectorWidth.fit"] == resized, calls  # the repaint added no fit
    assert "InspectorWidth.eventFilter" not in calls, calls
