"""A model's load in the window when the user changes their mind: a second choice while
one loads, Cancel, a reload that fails (pytest-qt, offscreen, on a real SQLite file).

The real models (the bundled one, gemma-3-270m) load where the timing is the app's own;
a scripted runtime behind a gate where the order of events must be forced.
"""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from iris_desktop.runtime.errors import ModelError  # noqa: E402

from support.fakes import ScriptedRuntime  # noqa: E402


def box_shown(window) -> bool:
    return window.models.box is not None and window.models.box.isVisible()


def test_a_second_choice_while_one_loads_is_loaded_saved_and_can_be_cancelled(
        make_window, qtbot, model_path, base_model_path, tmp_path):
    """Before: choosing a model in Models… while another choice was still loading took the
    first load's "loading was cancelled" for the second one's failure: an error box ("The
    new model could not be loaded…"), the settings rolled back, yet the second model
    loaded and ran, was never saved, and its Cancel did nothing (no load was known)."""
    window = make_window(None, overrides={"model.path": str(model_path), "model.n_ctx": "2048"})
    before = window.models.info["path"]
    mine = tmp_path / "mine.gguf"
    mine.hardlink_to(model_path)  # another file, so the first pick really loads
    said = []
    window.announcer.say = lambda text, *_a, **_k: said.append(text)

    window.models.use_file(str(mine))
    window.models.use_file(str(base_model_path))  # the user picks again at once
    assert window.models.job is not None  # Cancel reaches the second load
    qtbot.waitUntil(lambda: window.models.job is None, timeout=120_000)
    assert window.model_state == "ready", window.models.error
    # a screen reader hears of the model that answers, once (a replaced load was said too)
    assert [t for t in said if t.startswith("Model ready")] == [
        f"Model ready: {window.models.info['name']}"]
    assert window.models.info["path"] == str(base_model_path)
    assert not box_shown(window)
    assert window.host.settings["model.path"] == str(base_model_path)
    assert str(base_model_path) in window.host.paths.config_path.read_text()

    # twice again, then Cancel: the second load stops, the model in use stays, said in passing
    window.models.use_file(str(mine))
    window.models.use_file(str(model_path))
    window.models.cancel_load()
    qtbot.waitUntil(lambda: window.models.job is None, timeout=120_000)
    assert window.models.info["path"] == str(base_model_path)
    assert window.model_state == "ready" and "cancelled" in window.models.error
    assert not box_shown(window)
    assert window.status_area.current_message().startswith("Loading cancelled; Iris goes on with ")
    assert window.host.settings["model.path"] == str(base_model_path)
    assert before != window.models.info["path"]


def gated_window(make_window, monkeypatch):
    """A window on a scripted runtime whose first load waits at a gate: the loads asked
    for meanwhile queue behind it, and that first one ignores its cancel (it has loaded
    before the cancel was seen). Returns (window, gate, the model.path of each load run)."""
    window = make_window(ScriptedRuntime([]))
    host, gate, ran = window.host, threading.Event(), []
    original = host.load_model

    def load_model(settings=None, **kwargs):
        ran.append(settings["model.path"])
        if len(ran) == 1:
            gate.wait(30)
        if settings["model.path"].endswith("broken.gguf"):
            raise ModelError(settings["model.path"], "not a GGUF file")
        return original(settings, **kwargs)

    monkeypatch.setattr(host, "load_model", load_model)
    return window, gate, ran


def test_a_replaced_load_is_skipped_or_ignored_and_only_the_last_choice_is_saved(
        make_window, qtbot, monkeypatch, tmp_path):
    """Three picks in a row: the first had loaded before its cancel was seen, the second
    was replaced before it started (it loads nothing), the third is the one kept."""
    window, gate, ran = gated_window(make_window, monkeypatch)
    paths = [tmp_path / f"{name}.gguf" for name in ("first", "second", "third")]
    for path in paths:
        path.write_bytes(b"GGUF")
        window.models.use_file(str(path))
        qtbot.waitUntil(lambda: bool(ran), timeout=5_000)  # the first is loading
    third = window.models.job
    gate.set()
    qtbot.waitUntil(lambda: window.models.job is None, timeout=20_000)
    assert ran == [str(paths[0]), str(paths[2])]  # the second never loaded
    assert window.model_state == "ready" and window.app_state.loaded.job is third
    assert not box_shown(window)
    assert window.host.settings["model.path"] == str(paths[2])
    assert str(paths[2]) in window.host.paths.config_path.read_text()


def test_when_the_newer_choice_fails_iris_names_the_model_that_answers(
        make_window, qtbot, monkeypatch, tmp_path):
    """The replaced load that did load is the model a failure of the newer one goes on
    with (the one before it is closed): the box and the settings say that one, and it is
    saved (it was in force but not saved: a restart went back to the model before it)."""
    window, gate, ran = gated_window(make_window, monkeypatch)
    first, broken = tmp_path / "first.gguf", tmp_path / "broken.gguf"
    first.write_bytes(b"GGUF")
    window.models.use_file(str(first))
    job = window.models.job
    qtbot.waitUntil(lambda: bool(ran), timeout=5_000)  # it is loading
    window.models.use_file(str(broken))
    gate.set()
    qtbot.waitUntil(lambda: window.models.job is None, timeout=20_000)
    assert ran == [str(first), str(broken)]
    assert window.model_state == "ready" and window.app_state.loaded.job is job
    assert "not a GGUF file" in window.models.error
    assert box_shown(window) and "not a GGUF file" in window.models.box.informativeText()
    assert window.host.settings["model.path"] == str(first)
    assert str(first) in window.host.paths.config_path.read_text()
    window.models.box.done(0)


def test_cancel_of_a_first_load_is_no_failure(make_window, qtbot, tmp_path, monkeypatch):
    """Before: Cancel during a load with no model loaded yet opened the warning "Iris
    could not load its model…" with "loading was cancelled", as if something broke."""
    window = make_window(None, overrides={"model.path": str(tmp_path / "gone.gguf")})
    assert window.model_state == "failed"
    window.models.box.done(0)
    original = window.host.load_model

    def load_model(settings=None, cancel=None, **kwargs):  # the real load, once Cancel is
        assert cancel is not None and cancel.wait(30)  # pressed (it could finish first)
        return original(settings, cancel=cancel, **kwargs)

    monkeypatch.setattr(window.host, "load_model", load_model)
    window.models.use_file("bundled")
    window.models.cancel_load()
    qtbot.waitUntil(lambda: window.models.job is None, timeout=120_000)
    assert window.model_state == "failed" and "cancelled" in window.models.error
    assert not box_shown(window), window.models.box.text()
    assert window.status_area.current_message().startswith("Loading cancelled; no model is loaded")


def test_a_failed_reload_says_the_model_in_use_goes_on(make_window, qtbot, monkeypatch):
    """Before: Reload (or new settings) of the model in use that failed said "The new
    model could not be loaded", though no new model was chosen."""
    window = make_window(ScriptedRuntime([]))

    def fail(settings=None, **kwargs):
        raise ModelError("mine.gguf", "the file is truncated")

    monkeypatch.setattr(window.host, "load_model", fail)
    window.models.load()
    qtbot.waitUntil(lambda: window.models.job is None, timeout=20_000)
    assert window.model_state == "ready"
    assert window.models.box.text().startswith("The model could not be loaded again, so Iris goes on with ")
    window.models.box.done(0)


def test_a_failed_load_that_keeps_the_model_in_use_is_not_said_as_ready(make_window, qtbot,
                                                                         monkeypatch):
    """A review found the screen reader told "Model ready: <the old model>" after a load
    failed and the model in use was kept (the state goes back to ready, with the error)."""
    from iris_desktop.runtime.errors import ModelError

    window = make_window(ScriptedRuntime([]))
    said: list[str] = []
    window.announcer.say = lambda text, *_a, **_k: said.append(text)

    def load_model(settings=None, **_kwargs):
        raise ModelError(settings["model.path"], "not a GGUF file")

    monkeypatch.setattr(window.host, "load_model", load_model)
    window.models.use_file("/nonexistent/broken.gguf")
    qtbot.waitUntil(lambda: window.models.job is None, timeout=20_000)
    assert window.model_state == "ready" and window.models.error
    assert not [t for t in said if t.startswith("Model ready")], said


def slow_try(window, monkeypatch, fails: bool = True):
    """The window's loads of a file named ``try*.gguf`` wait at a gate (then fail, or load
    the scripted model): what the user does meanwhile happens during the try."""
    host, gate, original = window.host, threading.Event(), window.host.load_model

    def load_model(settings=None, cancel=None, **kwargs):
        if "try" in str(settings["model.path"]):
            gate.wait(30)
            if cancel is not None and cancel.is_set():
                raise ModelError("loading was cancelled", "cancelled")
            if fails:
                raise ModelError(settings["model.path"], "not a GGUF file")
        return original(settings, cancel=cancel, **kwargs)

    monkeypatch.setattr(host, "load_model", load_model)
    return gate


@pytest.mark.usefixtures("system_look_after")
@pytest.mark.parametrize("end", ["fails", "cancelled"])
def test_a_failed_try_takes_back_only_the_model_keys_it_set(make_window, qtbot, monkeypatch,
                                                            tmp_path, end):
    """Before: a model try that failed or was cancelled put back every setting as it was
    when the model was chosen: `config set ui.theme dark` in a terminal, or a budget ratio
    saved in Preferences, during the load were undone in the window while the file kept
    them. Now only the model.* keys the try set go back."""
    from iris_desktop.settings import write_config_value

    window = make_window()
    state, config = window.app_state, window.host.paths.config_path
    path = state.settings["model.path"]
    gate = slow_try(window, monkeypatch)
    window.models.use_file(str(tmp_path / "try.gguf"))
    write_config_value(config, "ui.theme", "dark")  # another terminal
    qtbot.waitUntil(lambda: state.settings["ui.theme"] == "dark", timeout=10_000)
    dialog = window.preferences()  # and Preferences, saved during the load
    dialog.fields["context.token_budget_ratio"].editor.set_value(0.5)
    dialog.accept()
    assert state.settings["context.token_budget_ratio"] == 0.5
    if end == "cancelled":
        window.models.cancel_load()
    gate.set()
    qtbot.waitUntil(lambda: window.models.job is None, timeout=20_000)
    if window.models.box is not None:
        window.models.box.done(0)
    assert state.settings["model.path"] == path and state.settings.source("model.path") != "cli"
    assert state.settings["ui.theme"] == "dark" and window.appearance.applied == ("dark", 0)
    assert state.planner.params.token_budget_ratio == 0.5


@pytest.mark.usefixtures("system_look_after")
def test_a_second_choice_keeps_what_changed_during_the_first(make_window, qtbot, monkeypatch,
                                                             tmp_path):
    """Before: choosing again while a choice loaded started over from the settings taken
    at the first choice: a theme set in the file meanwhile went back at once."""
    from iris_desktop.settings import write_config_value

    window, gate, ran = gated_window(make_window, monkeypatch)
    state = window.app_state
    first = tmp_path / "first.gguf"
    first.write_bytes(b"GGUF")
    window.models.use_file(str(first))
    qtbot.waitUntil(lambda: bool(ran), timeout=5_000)
    write_config_value(window.host.paths.config_path, "ui.theme", "dark")
    qtbot.waitUntil(lambda: state.settings["ui.theme"] == "dark", timeout=10_000)
    window.models.use_file(str(tmp_path / "broken.gguf"))
    assert state.settings["ui.theme"] == "dark"
    gate.set()
    qtbot.waitUntil(lambda: window.models.job is None, timeout=20_000)
    window.models.box.done(0)
    assert state.settings["ui.theme"] == "dark"
    assert state.settings["model.path"] == str(first)  # the replaced choice that loaded
