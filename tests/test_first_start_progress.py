"""The first start's set-up: the bundled model is assembled from its packages (a few
seconds, once), said with its percentage in the window's status line and on the CLI's
stderr, and the load's time says the set-up beside the load ("set up in 9.8 s, model
loaded in 7.7 s"; before, "Loading the model…" with no percentage, and "model loaded in
7.7 s" left the set-up out).

Each test starts on a fresh data folder, so the real parts are really assembled (about
3 s each), then the real model loads."""

from __future__ import annotations

import logging
import re

from iris_desktop.runtime.bundled import BUNDLED_MODEL, ensure_bundled_model

from support.helpers import on_a_terminal, run_cli

#: what the window and the CLI say while the bundled model is set up, with its percentage
SETTING_UP = re.compile(r"[Ss]etting up the bundled model \(once\)… (\d+)%")
#: the load's time with the set-up's
TIMES = r"set up in \d+\.\d s, model loaded in \d+\.\d s"


def percentages(texts: list[str]) -> list[int]:
    return [int(m.group(1)) for text in texts for m in SETTING_UP.finditer(text)]


def test_the_assembly_says_its_stage_then_its_fraction_as_it_writes(tmp_path):
    heard: list[object] = []
    target = ensure_bundled_model(tmp_path / "models", stage=heard.append, progress=heard.append)
    assert heard[0] == "assembling" and heard.count("assembling") == 1
    fractions = heard[1:]
    assert all(isinstance(f, float) for f in fractions)
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert len(fractions) >= len(BUNDLED_MODEL.parts)  # a block at a time, not a part
    assert target.stat().st_size == BUNDLED_MODEL.size
    again: list[object] = []  # set up already: nothing to say
    assert ensure_bundled_model(tmp_path / "models", stage=again.append, progress=again.append) == target
    assert again == []


def test_the_window_shows_the_set_up_s_percentage_then_both_times(make_window, qtbot):
    window = make_window(runtime=None, load=False)
    shown: list[str] = []
    window.app_state.busyChanged.connect(lambda text, _fraction: text and shown.append(text))
    window.load_model()
    qtbot.waitUntil(lambda: window.model_state in ("ready", "failed"), timeout=120_000)
    assert window.model_state == "ready", window.app_state.model_error
    said = percentages(shown)
    assert len(set(said)) >= 3 and said == sorted(said) and said[-1] == 100, shown
    # the set-up is said before the load, and the load after it
    first = next(i for i, text in enumerate(shown) if SETTING_UP.search(text))
    assert "Loading the model…" in shown[first:]
    assert re.fullmatch(rf"Ready \({TIMES}\)", window.status_area.state.text()), \
        window.status_area.state.text()


def test_the_cli_says_the_set_up_and_its_time_off_a_terminal(capsys):
    code, out, err = run_cli(capsys, "threads")
    assert code == 0, err
    lines = err.splitlines()
    # a log gets the set-up said once as it starts, no line per percent, then the times
    assert lines.count("iris-desktop: setting up the bundled model (once)…") == 1, err
    assert not percentages(lines)
    assert any(re.fullmatch(rf"iris-desktop: {TIMES}", line) for line in lines), err
    assert "Traceback" not in err


def test_the_cli_shows_the_set_up_s_percentage_in_place_on_a_terminal(tmp_path):
    code, seen = on_a_terminal(["--data-dir", tmp_path / "data", "threads"], {})
    text = seen.decode("utf-8", "replace")
    assert code == 0, text
    said = percentages(text.split("\r\x1b[K"))
    assert len(set(said)) >= 3 and said == sorted(said) and said[-1] == 100, text
    assert re.search(rf"iris-desktop: {TIMES}", text), text


def test_the_first_loads_8_bit_copy_counts_as_set_up_not_as_loading(tmp_path, model_path, monkeypatch,
                                                                     caplog):
    """The first load of the bundled model also writes the exact 8-bit copy of its Q5_0
    weights (once per computer, "Preparing the model for this computer (once)…"): its
    time was inside "model loaded in …", so the first start seemed to load slowly and the
    next ones quickly. Now it is set-up time, and the load's time is the load's."""
    from iris_desktop.host_models import load_runtime, load_time_words
    from iris_desktop.paths import app_paths
    from iris_desktop.settings import load_settings

    monkeypatch.setenv("IRIS_WEIGHTS_DIR", str(tmp_path / "weights"))  # no copy there yet
    paths = app_paths(tmp_path / "data").ensure()
    settings = load_settings(paths.config_path, cli={"model.path": str(model_path), "model.n_ctx": "1024"})
    heard: list[str] = []
    caplog.set_level(logging.INFO, logger="iris")
    model = load_runtime(settings, paths, stage=heard.append)
    try:
        assert heard.index("copying") < heard.index("loading")
        # the log's "loaded … in X s" is the load's too, the copy's time named apart
        loaded = [r.getMessage() for r in caplog.records if ": loaded " in r.getMessage()]
        assert len(loaded) == 1 and "before it, the 8-bit copy (once) in" in loaded[0], loaded
        assert model.setup_time_s > 0 and model.load_time_s > 0
        assert load_time_words(model.load_time_s, model.setup_time_s).startswith("set up in ")
    finally:
        model.close()
    again: list[str] = []  # the copy is there: nothing to set up
    caplog.clear()
    model = load_runtime(settings, paths, stage=again.append)
    try:
        assert "copying" not in again and model.setup_time_s == 0.0
        assert not any("8-bit copy" in r.getMessage() for r in caplog.records)
    finally:
        model.close()
