"""Preferences: a budget counted for values since made invalid does not replace "Fix the
marked values…" (over a long chat the count took 6 s and came back after the user typed a
window above n_ctx: the figures of the old values were shown beside the red error)."""
import pytest

pytest.importorskip("pytestqt")

from support.windows import open_preferences  # noqa: E402


def test_a_budget_counted_before_an_invalid_value_is_not_shown(make_window, qtbot):
    window = make_window()
    dialog = open_preferences(window, qtbot)
    counted = dialog._preview
    held = []
    dialog._preview = lambda candidate, answer: held.append((candidate, answer))
    dialog.fields["context.recall_max_tokens"].set_value(300)  # valid: a budget is asked for
    qtbot.waitUntil(lambda: len(held) == 1, timeout=5_000)
    dialog.fields["context.window"].set_value(10_000_000)     # invalid: above the model's n_ctx
    qtbot.waitUntil(lambda: bool(dialog.errors), timeout=5_000)
    qtbot.wait(300)                                            # (the debounce: "Fix the marked values…")
    assert dialog.breakdown.text() == ""
    candidate, answer = held[0]
    counted(candidate, answer)                                 # the old values' budget comes back now
    qtbot.wait(500)
    assert dialog.errors
    assert dialog.breakdown.text() == "", dialog.breakdown.text()[:200]
