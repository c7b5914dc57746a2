"""``config set`` refuses a context the model cannot hold, as Preferences and the load do,
and the environment says which of its IRIS_ variables Iris does not read.

Before (an audit): ``config set model.n_ctx 100000`` (the bundled model was trained for
32,768) and ``config set context.window 16384`` (n_ctx 8,192) were saved with exit 0;
the next ``chat`` failed with exit 2. ``IRIS_DATA_DIR=/tmp/x iris-desktop config path``
printed the default path without a word. The real CLI, a real data folder, the real
bundled model (or a tiny real GGUF) read by its header, never loaded here.
"""

from __future__ import annotations

import pytest

from support.gguf_fixtures import tiny_model
from support.helpers import link_bundled_model, one_sentence, run_cli

N_CTX_100K = ("iris-desktop: model.n_ctx: 100,000 tokens is more than the model was trained for "
              "(32,768); use at most 32,768, or 0 for that maximum\n")
WINDOW_16K = ("iris-desktop: context.window: 16,384 tokens is more than the loaded model's n_ctx "
              "of 8,192; lower it, or raise model.n_ctx and reload the model\n")


@pytest.fixture
def data(tmp_path, model_path):
    """A data folder with the bundled model (linked, as the first start leaves it) and a
    settings file holding one value."""
    folder = tmp_path / "data"
    link_bundled_model(folder, model_path)
    (folder / "config.toml").write_text("[model]\nmax_tokens = 48\n")
    return folder


def test_config_set_refuses_what_the_bundled_model_cannot_hold_and_saves_nothing(capsys, data):
    before = (data / "config.toml").read_bytes()
    code, out, err = run_cli(capsys, "--data-dir", data, "config", "set", "model.n_ctx", "100000")
    assert (code, out, err) == (2, "", N_CTX_100K)
    code, out, err = run_cli(capsys, "--data-dir", data, "config", "set", "context.window", "16384")
    assert (code, out, err) == (2, "", WINDOW_16K)
    assert (data / "config.toml").read_bytes() == before
    # the same sentences as the load's: what the next chat said after the value was saved
    code, _, err = run_cli(capsys, "--data-dir", data, "--set", "model.n_ctx=100000",
                           "chat", "--new", "hi")
    assert (code, err) == (2, N_CTX_100K)
    # values the model holds are saved, in an order that raises n_ctx before the window
    for key, value in (("model.n_ctx", "32768"), ("context.window", "16384"), ("model.n_ctx", "0")):
        code, out, err = run_cli(capsys, "--data-dir", data, "config", "set", key, value)
        assert code == 0 and out.startswith(f"{key} = {value}") and err == "", err
    # lowering n_ctx under the window that is saved now would make the same refusal
    code, out, err = run_cli(capsys, "--data-dir", data, "config", "set", "model.n_ctx", "8192")
    assert (code, out, err) == (2, "", (  # the other key named, and the order that works
        "iris-desktop: model.n_ctx = 8192 was not saved: with it, context.window: 16,384 tokens "
        "is more than the loaded model's n_ctx of 8,192; lower context.window first\n"))
    assert "n_ctx = 0" in (data / "config.toml").read_text()


def test_config_set_reads_the_trained_context_from_the_model_files_header(capsys, tmp_path,
                                                                          model_path):
    """model.path names a file of the user's: the bundled model's own file, then a tiny
    GGUF trained for 4,096 tokens (the n_ctx the file holds is then too large for it)."""
    data = tmp_path / "data"
    code, _, err = run_cli(capsys, "--data-dir", data, "config", "set", "model.path", model_path)
    assert code == 0 and err == "", err
    code, out, err = run_cli(capsys, "--data-dir", data, "config", "set", "model.n_ctx", "100000")
    assert (code, out, err) == (2, "", N_CTX_100K)
    code, _, err = run_cli(capsys, "--data-dir", data, "config", "set", "model.n_ctx", "16384")
    assert code == 0 and err == "", err
    before = (data / "config.toml").read_bytes()
    small = tiny_model(tmp_path / "small-4k.gguf")
    code, out, err = run_cli(capsys, "--data-dir", data, "config", "set", "model.path", small)
    assert (code, out) == (2, "") and err == (
        f"iris-desktop: model.path = {small} was not saved: with it, model.n_ctx: 16,384 tokens "
        "is more than the model was trained for (4,096); lower model.n_ctx first (0: what the "
        "model was trained for)\n")
    assert (data / "config.toml").read_bytes() == before


def test_a_model_that_cannot_be_read_does_not_block_the_set(capsys, tmp_path, monkeypatch):
    """No file to read (a model.path an older Iris saved, or a server): another key is
    saved, with one line saying it was not checked. (``config set model.path`` itself
    refuses a missing file: test_newcomer_small.py.)"""
    data = tmp_path / "data"
    data.mkdir()
    (data / "config.toml").write_text('[model]\npath = "/nonexistent/x.gguf"\n')
    code, out, err = run_cli(capsys, "--data-dir", data, "config", "set", "model.n_ctx", "100000")
    assert code == 0 and out.startswith("model.n_ctx = 100000")
    assert err == ("iris-desktop: warning: model.n_ctx was not checked against the model's context: "
                   "/nonexistent/x.gguf: file not found; the model's load checks it\n")
    monkeypatch.setenv("IRIS_MODEL_BACKEND", "openai")
    code, out, err = run_cli(capsys, "--data-dir", data, "config", "set", "context.window", "16384")
    assert code == 0 and out.startswith("context.window = 16384") and one_sentence(err)
    assert "model.backend is openai" in err
    text = (data / "config.toml").read_text()
    assert "n_ctx = 100000" in text and "window = 16384" in text


def test_the_check_sees_the_environment_and_leaves_a_problem_that_was_there(capsys, data,
                                                                            monkeypatch):
    """The settings the next load sees: a variable's value counts (IRIS_CONTEXT_WINDOW,
    with n_ctx lowered under it), and a problem the file had before (a hand-written n_ctx)
    does not block setting another key."""
    monkeypatch.setenv("IRIS_CONTEXT_WINDOW", "8192")
    code, out, err = run_cli(capsys, "--data-dir", data, "config", "set", "model.n_ctx", "4096")
    assert (code, out) == (2, "") and err == (
        "iris-desktop: model.n_ctx = 4096 was not saved: with it, context.window: 8,192 tokens "
        "is more than the loaded model's n_ctx of 4,096 (set by IRIS_CONTEXT_WINDOW); lower "
        "context.window first\n")
    monkeypatch.delenv("IRIS_CONTEXT_WINDOW")
    (data / "config.toml").write_text("[model]\nn_ctx = 100000\n")
    code, out, err = run_cli(capsys, "--data-dir", data, "config", "set", "context.window", "4096")
    assert code == 0 and out.startswith("context.window = 4096") and err == ""


def test_a_variable_the_model_cannot_hold_is_refused_at_load_with_the_sentence(capsys, data,
                                                                               monkeypatch):
    """IRIS_MODEL_N_CTX and IRIS_CONTEXT_WINDOW are not saved by anyone: the load refuses
    them, as it refuses --set (tests/test_cli.py), and nothing is stored."""
    monkeypatch.setenv("IRIS_MODEL_N_CTX", "100000")
    code, out, err = run_cli(capsys, "--data-dir", data, "chat", "--new", "hi")
    assert (code, out, err) == (2, "", N_CTX_100K)
    monkeypatch.delenv("IRIS_MODEL_N_CTX")
    monkeypatch.setenv("IRIS_CONTEXT_WINDOW", "16384")
    code, out, err = run_cli(capsys, "--data-dir", data, "chat", "--new", "hi")
    assert (code, out) == (2, "") and err.endswith(WINDOW_16K)
    monkeypatch.delenv("IRIS_CONTEXT_WINDOW")
    assert run_cli(capsys, "--data-dir", data, "threads", "--no-model")[1] == "no threads yet\n"


@pytest.mark.parametrize("name", ["IRIS_DATA_DIR", "IRIS_DATA", "IRIS_DIR", "iris_data_dir"])
def test_a_guess_at_the_data_folders_variable_is_said(capsys, tmp_path, monkeypatch, name):
    """Before: IRIS_DATA_DIR=/tmp/x iris-desktop config path printed the default path, exit
    0, and nothing on stderr. Said by config path and by every command that reads the
    settings (the window shows the same problems before it opens)."""
    monkeypatch.setenv(name, str(tmp_path / "x"))
    said = (f"iris-desktop: warning: environment {name} is not read; the data folder is set by "
            "IRIS_HOME (or --data-dir)\n")
    code, out, err = run_cli(capsys, "config", "path")
    assert code == 0 and out.strip().endswith("config.toml") and err == said
    code, out, err = run_cli(capsys, "config", "get", "context.window")
    assert code == 0 and err == said
    assert not (tmp_path / "x").exists()


def test_the_help_names_the_environment_variables(capsys):
    with pytest.raises(SystemExit):
        run_cli(capsys, "--help")
    out = " ".join(capsys.readouterr().out.split())
    assert "IRIS_HOME is the data folder" in out and "IRIS_WEIGHTS_DIR" in out
    assert "every setting has a variable IRIS_<SECTION>_<KEY> (context.window: IRIS_CONTEXT_WINDOW)" in out


def test_the_window_says_the_guess_before_it_opens(monkeypatch, tmp_path, qapp):
    """The window tells settings problems in a box before it opens; the guess is one."""
    from support.windows import run_gui_recording

    monkeypatch.setenv("IRIS_DATA_DIR", str(tmp_path / "x"))
    shown = run_gui_recording(monkeypatch, tmp_path / "data")
    assert shown[0][0] == "warning" and shown[1:] == [("window", "")]
    assert "environment IRIS_DATA_DIR is not read; the data folder is set by IRIS_HOME (or " \
        "--data-dir)" in shown[0][1]
