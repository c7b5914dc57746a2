"""Preferences after Apply, with the dialog left open (pytest-qt, offscreen, a real
settings file on a fresh data folder)."""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from iris_desktop.paths import app_paths  # noqa: E402
from iris_desktop.settings import write_config_value  # noqa: E402

from support.windows import open_preferences  # noqa: E402


def edit_and_wait(dialog, qtbot, edit) -> None:
    """Make an edit and wait for the preview it asks for."""
    before = dialog.last_preview
    edit()
    qtbot.waitUntil(lambda: dialog.last_preview is not before, timeout=5_000)


def test_apply_shows_what_another_process_set_meanwhile(make_window, qtbot, data_dir):
    """Before: another process ran `config set context.window 2048` while Preferences was
    open; after Apply the dialog still showed "auto" and a live budget on 8,192 tokens,
    neither in force. Now Apply reads the settings again: the field, the dialog's base
    and the budget show the 2,048-token window in force."""
    config = app_paths(data_dir).ensure().config_path
    window = make_window()
    dialog = open_preferences(window, qtbot)
    assert dialog.fields["context.window"].raw() == "auto"
    assert dialog.last_preview.window == 8192
    write_config_value(config, "context.window", 2048)  # `config set` in a terminal
    edit_and_wait(dialog, qtbot,
                  lambda: dialog.fields["context.token_budget_ratio"].editor.spin.setValue(0.5))
    before = dialog.last_preview
    assert dialog.apply()
    assert dialog.fields["context.window"].raw() == "2048"
    assert dialog.settings["context.window"] == 2048
    assert window.app_state.settings["context.window"] == 2048
    qtbot.waitUntil(lambda: dialog.last_preview is not before, timeout=5_000)
    assert dialog.last_preview.window == 2048
    assert dialog.last_preview.breakdown.budget == int(2048 * 0.5) == \
        int(window.app_state.planner.params.window * window.app_state.planner.params.token_budget_ratio)
    assert not dialog.has_changes() and not dialog.apply_button.isEnabled()
    # a later edit and OK write that edit, and keep the other process's window
    dialog.fields["context.prune_protect_turns"].editor.spin.setValue(4)
    dialog.accept()
    text = config.read_text()
    assert "window = 2048" in text and "token_budget_ratio = 0.5" in text
    assert "prune_protect_turns = 4" in text


def test_apply_keeps_a_field_edited_after_it_and_shows_the_rest(make_window, qtbot, data_dir):
    """What the user typed and has not applied stays as typed when Apply reads the
    settings again; only fields not edited follow the file."""
    config = app_paths(data_dir).ensure().config_path
    window = make_window()
    dialog = open_preferences(window, qtbot)
    write_config_value(config, "context.summary_max_tokens", 500)
    write_config_value(config, "model.top_k", 20)
    dialog.fields["model.top_k"].editor.spin.setValue(7)
    assert dialog.apply()
    assert dialog.fields["context.summary_max_tokens"].raw() == "500"
    assert dialog.fields["model.top_k"].raw() == "7"  # applied: written over the 20
    assert window.app_state.settings["model.top_k"] == 7
    assert "top_k = 7" in config.read_text() and "summary_max_tokens = 500" in config.read_text()
    dialog.reject()
