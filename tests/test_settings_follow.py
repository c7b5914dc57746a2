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


@pytest.mark.usefixtures("system_look_after")
def test_a_bad_value_then_the_line_removed_puts_the_default_in_force(make_window, qtbot,
                                                                       data_dir):
    """Before: a half-typed value kept the value in force (as it should), but once the line
    was removed the window kept it with no word: the default had been taken as read, so
    the file's default looked unchanged. `config get` said system while the window was
    dark."""
    config = app_paths(data_dir).ensure().config_path
    window = make_window()
    state = window.app_state
    config.write_text('[ui]\ntheme = "dark"\n')
    qtbot.waitUntil(lambda: state.settings["ui.theme"] == "dark", timeout=10_000)
    messages = said(window)
    config.write_text('[ui]\ntheme = "dar"\n')  # half typed: the value in force is kept
    qtbot.waitUntil(lambda: len(messages) >= 1, timeout=10_000)
    assert "the value in force is kept" in messages[0] and state.settings["ui.theme"] == "dark"
    config.write_text("")  # the line removed: the default, as `config get` says
    qtbot.waitUntil(lambda: state.settings["ui.theme"] == "system", timeout=10_000)
    assert window.appearance.applied == ("system", 0)
    assert "in force: ui.theme" in messages[-1], messages


def test_a_key_read_only_at_start_is_said_to_wait_for_the_next_start(make_window, qtbot,
                                                                     data_dir):
    """Before: `config set storage.encrypt true` was said "in force" while the history
    stays unencrypted until the next start converts it."""
    config = app_paths(data_dir).ensure().config_path
    window = make_window()
    messages = said(window)
    write_config_value(config, "storage.encrypt", True)
    write_config_value(config, "model.top_k", 12)
    qtbot.waitUntil(lambda: bool(messages), timeout=10_000)
    assert "not in use until Iris starts again: storage.encrypt" in messages[-1], messages
    assert "in force: model.top_k;" in messages[-1] and "in force: storage" not in messages[-1]
    assert window.host.storage.key is None


def test_a_model_key_with_no_model_loaded_is_not_said_to_keep_old_values(make_window, qtbot,
                                                                       data_dir, tmp_path):
    """Before: with no model loaded (its load failed) a new model.path in the file was said
    to wait because "the model keeps its old values" — there is no model."""
    config = app_paths(data_dir).ensure().config_path
    write_config_value(config, "model.path", str(tmp_path / "gone.gguf"))
    window = make_window(None)
    assert window.model_state == "failed"
    window.models.box.done(0)
    messages = said(window)
    write_config_value(config, "model.path", str(tmp_path / "fixed.gguf"))
    qtbot.waitUntil(lambda: bool(messages), timeout=10_000)
    assert "keeps its old values" not in messages[-1]
    assert "not in use yet: model.path (no model is loaded; Model ▸ Reload loads it with this " \
        "value)" in messages[-1], messages


def test_preferences_opened_during_a_model_try_keep_the_try_and_say_so(make_window, qtbot, data_dir,
                                                           tmp_path, monkeypatch):
    """Before: opening Preferences while a chosen model loaded read the file again and put
    its model.path in force: the model being tried was no longer the one in the settings
    (the status, the library, a later Reload went back to the old one); and its field
    said it was set with --set."""
    import threading

    window = make_window()
    state, gate, original = window.app_state, threading.Event(), window.host.load_model

    def load_model(settings=None, **kwargs):
        if "try" in str(settings["model.path"]):
            gate.wait(30)
        return original(settings, **kwargs)

    monkeypatch.setattr(window.host, "load_model", load_model)
    trying = str(tmp_path / "try.gguf")
    window.models.use_file(trying)
    dialog = window.preferences()
    assert state.settings["model.path"] == trying
    # before (an audit): the field said "Set for this run with --set model.path=…; it is
    # not saved" of a model chosen in the window, to be saved once it has loaded
    field = dialog.fields["model.path"]
    assert field.locked.startswith("Being tried") and "--set" not in field.hint.text()
    assert field.hint.text() == field.locked
    dialog.fields["context.prune_protect_turns"].editor.spin.setValue(5)
    dialog.accept()
    assert state.settings["model.path"] == trying
    assert state.settings["context.prune_protect_turns"] == 5
    gate.set()
    qtbot.waitUntil(lambda: window.models.job is None, timeout=20_000)
    assert window.model_state == "ready" and state.settings["model.path"] == trying
    assert trying in app_paths(data_dir).config_path.read_text()


@pytest.mark.usefixtures("system_look_after")
def test_the_watch_stops_with_the_window(make_window, qtbot, data_dir):
    """Before: a change made just before quitting was put in force after the window had
    shut down and the host had closed (model.kv_cache_mb 0 deleted the saved states on
    the way out). ``ConfigWatch.stop()`` (called by ``MainWindow.shutdown``) ends it."""
    config = app_paths(data_dir).ensure().config_path
    window = make_window()
    messages = said(window)
    write_config_value(config, "ui.theme", "dark")
    qtbot.wait(50)
    window.shutdown()
    watch = window.menus.config_watch
    watch.stop()  # what MainWindow.shutdown calls
    assert not watch.timer.isActive()
    assert not watch.watcher.files() and not watch.watcher.directories()
    qtbot.wait(1_200)
    write_config_value(config, "ui.theme", "light")
    qtbot.wait(800)
    assert watch.follow() == [] and messages == []
    assert window.app_state.settings["ui.theme"] == "system"
    watch.stop()  # again: nothing more
