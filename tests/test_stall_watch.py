"""A prompt read that stands still says why when the processor is busy (a newcomer audit,
session 66: "Reading the conversation… 0 of 44 tokens (0%)" stood for minutes under load
and nothing said why). A real window (offscreen); the load average is the test's."""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

import iris_desktop.runtime.speed as speed  # noqa: E402
import iris_desktop.ui.stall_watch as stall_watch  # noqa: E402

READING = "Reading the conversation… 0 of 44 tokens (0%)"


def test_a_prompt_that_stands_still_on_a_busy_processor_says_why(make_window, qtbot, monkeypatch):
    monkeypatch.setattr(stall_watch, "STALL_S", 0.2)
    monkeypatch.setattr(speed, "_load", lambda: 9.8)
    monkeypatch.setattr(speed.os, "cpu_count", lambda: 2)
    window = make_window()
    shown: list[object] = []
    window.app_state.busyChanged.connect(lambda text, fraction: shown.append(text))
    window.app_state.busy(READING, 0.0)
    qtbot.waitUntil(lambda: any(t and " · slow: " in t for t in shown), timeout=5_000)
    assert shown[-1] == f"{READING} · slow: other programs are using the processor (load 9.8 on 2)"
    window.app_state.busy("Reading the conversation… 20 of 44 tokens (45%)", 0.45)  # it moved
    assert shown[-1] == "Reading the conversation… 20 of 44 tokens (45%)"
    window.app_state.busy(None)


def test_nothing_is_added_on_a_quiet_processor_or_after_the_read(make_window, qtbot, monkeypatch):
    monkeypatch.setattr(stall_watch, "STALL_S", 0.2)
    monkeypatch.setattr(speed, "_load", lambda: 0.4)
    window = make_window()
    shown: list[object] = []
    window.app_state.busyChanged.connect(lambda text, fraction: shown.append(text))
    window.app_state.busy(READING, 0.0)
    qtbot.wait(600)
    assert shown == [READING]
    monkeypatch.setattr(speed, "_load", lambda: 9.8)
    window.app_state.busy(None)  # the read ended: nothing is said after it
    qtbot.wait(600)
    assert shown == [READING, None]
