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
