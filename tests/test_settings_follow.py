"""A running window follows the settings file (``ui/config_watch.py``): `config set` in a
terminal, an editor's save. Real Qt widgets offscreen, a real settings file written as
another process writes it (atomically, or in place as an editor may)."""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from PySide6.QtWidgets import QApplication, QMessageBox  # noqa: E402

from iris_desktop.paths import app_paths  # noqa: E402
from iris_desktop.settings import write_config_value  # noqa: E402


def said(window) -> list[str]:
    """What the window says in its status bar from now on."""
    messages: list[str] = []
    window.app_state.statusMessage.connect(lambda text, _ms: messages.append(text))
    return messages


def no_box() -> bool:
    return not any(isinstance(w, QMessageBox) and w.isVisible() for w in QApplication.topLevelWidgets())


@pytest.mark.usefixtures("system_look_after")
def test_the_window_follows_config_set_from_a_terminal(make_window, qtbot, data_dir):
    """Before: `config set context.token_budget_ratio 0.5` and `config set ui.theme dark`
    changed nothing in a running window (its budget stayed 0.7 of the window, the theme
    light) until Preferences was opened, though the help says "Applies at once"."""
    config = app_paths(data_dir).ensure().config_path
    window = make_window()
    messages = said(window)
    write_config_value(config, "context.token_budget_ratio", 0.5)
    write_config_value(config, "ui.theme", "dark")
    state = window.app_state
    qtbot.waitUntil(lambda: state.settings["ui.theme"] == "dark"
                    and state.planner.params.token_budget_ratio == 0.5, timeout=10_000)
    assert window.appearance.applied == ("dark", 0)
    assert any("in force: context.token_budget_ratio" in m for m in messages), messages
    # again, with the file edited in place (not replaced) as some editors save
    config.write_text(config.read_text().replace("0.5", "0.6"))
    qtbot.waitUntil(lambda: state.planner.params.token_budget_ratio == 0.6, timeout=10_000)


def test_a_file_broken_mid_write_keeps_the_settings_and_is_said_once(make_window, qtbot, data_dir):
    """An editor saving a half-typed file: the settings in force stay, one status message
    says why (not one per save), no box; a bad value keeps the value in force (not the
    default, which a start would use) and says so."""
    config = app_paths(data_dir).ensure().config_path
    window = make_window()
    state = window.app_state
    write_config_value(config, "context.token_budget_ratio", 0.5)
    qtbot.waitUntil(lambda: state.settings["context.token_budget_ratio"] == 0.5, timeout=10_000)
    messages = said(window)
    for text in ("[context\ntoken_budget_ratio = 0.5\n", "[context\ntoken_budget_ratio = 0.5\n\n"):
        config.write_text(text)  # two saves of a file that is not TOML
        qtbot.waitUntil(lambda: len(messages) >= 1, timeout=10_000)
        qtbot.wait(700)
    assert len(messages) == 1 and "not valid TOML" in messages[0], messages
    assert "settings in force are kept" in messages[0]
    assert state.settings["context.token_budget_ratio"] == 0.5 and no_box()
    config.write_text("[context]\ntoken_budget_ratio = 5\n")  # a value half typed
    qtbot.waitUntil(lambda: len(messages) >= 2, timeout=10_000)
    assert "context.token_budget_ratio: invalid value 5" in messages[1], messages
    assert messages[1].endswith("the value in force is kept")
    assert state.settings["context.token_budget_ratio"] == 0.5 and no_box()
    config.write_text("[context]\ntoken_budget_ratio = 0.55\n")  # typed to the end
    qtbot.waitUntil(lambda: state.planner.params.token_budget_ratio == 0.55, timeout=10_000)


def test_a_model_key_changed_in_the_file_waits_for_a_reload(make_window, qtbot, data_dir):
    """A model.* key that needs a reload is not in use until Model ▸ Reload, and the
    window says so rather than reload the model under the user."""
    config = app_paths(data_dir).ensure().config_path
    window = make_window()
    loaded = window.app_state.loaded
    messages = said(window)
    write_config_value(config, "model.n_ctx", 4096)
    write_config_value(config, "model.top_k", 12)
    qtbot.waitUntil(lambda: window.app_state.settings["model.n_ctx"] == 4096, timeout=10_000)
    qtbot.waitUntil(lambda: bool(messages), timeout=5_000)
    assert "in force: model.top_k" in messages[-1]
    assert "not in use yet: model.n_ctx (the model keeps its old values until Model ▸ Reload)" \
        in messages[-1], messages
    qtbot.wait(300)
    assert window.app_state.loaded is loaded and window.model_state == "ready"


def test_preferences_open_follow_the_file_where_the_user_has_not_edited(make_window, qtbot,
                                                                        data_dir):
    """Preferences open while `config set` runs elsewhere: the fields the user has not
    touched show the new values (the budget follows), an edited one keeps what was typed,
    and OK writes only the user's edits (the other change stays in the file)."""
    config = app_paths(data_dir).ensure().config_path
    window = make_window()
    dialog = window.preferences()
    qtbot.waitUntil(lambda: dialog.last_preview is not None, timeout=5_000)
    dialog.fields["context.prune_protect_turns"].editor.spin.setValue(4)
    write_config_value(config, "context.prune_protect_turns", 7)
    write_config_value(config, "context.window", 2048)
    qtbot.waitUntil(lambda: dialog.fields["context.window"].raw() == "2048", timeout=10_000)
    qtbot.waitUntil(lambda: dialog.last_preview.window == 2048, timeout=5_000)
    assert dialog.fields["context.prune_protect_turns"].raw() == "4"
    assert dialog.changed() == ["context.prune_protect_turns"]
    dialog.accept()
    text = config.read_text()
    assert "prune_protect_turns = 4" in text and "window = 2048" in text
    assert window.app_state.settings["context.window"] == 2048


def test_iris_own_writes_do_not_undo_a_choice_for_this_run(make_window, qtbot, data_dir):
    """The watch puts in force what changed in the file since it was read: Iris's own
    save (read again at once) changes nothing more, and a value chosen for this run
    only (a model being tried, a choice a variable pins) stays."""
    config = app_paths(data_dir).ensure().config_path
    window = make_window()
    state = window.app_state
    state.set_settings(state.settings.with_overrides({"model.top_k": "33"}))  # this run only
    write_config_value(config, "model.temperature", 0.3)
    qtbot.waitUntil(lambda: state.settings["model.temperature"] == 0.3, timeout=10_000)
    assert state.settings["model.top_k"] == 33
