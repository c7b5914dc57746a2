import pytest

from iris_desktop import settings as S
from iris_desktop.settings import SETTINGS, SettingsError, load_settings, write_config_value


def test_every_key_has_type_default_help_and_valid_default():
    assert {"context.window", "context.token_budget_ratio", "context.compaction_threshold",
            "context.prune_protect_turns", "context.compaction_min_turns",
            "context.keep_recent_ratio", "context.summary_max_tokens", "context.token_counter",
            "model.path", "model.n_ctx", "model.temperature", "model.max_tokens",
            "model.n_threads", "model.gpu", "tools.enabled", "tools.allowed_paths",
            "tools.shell", "tools.max_calls_per_turn", "chat.system_prompt"} <= set(SETTINGS)
    for s in SETTINGS.values():
        assert s.help and s.kind
        s.validate(s.default)
        assert s.env_var == "IRIS_" + s.key.upper().replace(".", "_")


def test_seed_defaults():
    d = S.defaults()
    assert d["context.window"] == "auto"
    assert d["context.token_budget_ratio"] == 0.70
    assert d["context.compaction_threshold"] == 0.75
    assert d["context.prune_protect_turns"] == 2
    assert d["context.compaction_min_turns"] == 20
    assert d["context.keep_recent_ratio"] == 0.5
    assert d["context.summary_max_tokens"] == 768
    assert d["model.n_ctx"] == 8192 and d["model.max_tokens"] == 1024
    assert d["tools.shell"] is False and d["tools.max_calls_per_turn"] == 8
    assert d["tools.allowed_paths"] == []


def test_layering_defaults_file_env_cli(tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_text("[context]\ntoken_budget_ratio = 0.6\nprune_protect_turns = 3\n")
    env = {"IRIS_CONTEXT_PRUNE_PROTECT_TURNS": "4", "IRIS_MODEL_N_CTX": "4096"}
    s = load_settings(cfg, env, {"model.n_ctx": "2048"})
    assert s["context.token_budget_ratio"] == 0.6 and s.source("context.token_budget_ratio") == "file"
    assert s["context.prune_protect_turns"] == 4 and s.source("context.prune_protect_turns") == "env"
    assert s["model.n_ctx"] == 2048 and s.source("model.n_ctx") == "cli"
    assert s.source("context.window") == "default"


@pytest.mark.parametrize(
    "key,value,fragment",
    [
        ("context.token_budget_ratio", "1.5", "from 0.1 to 0.95"),
        ("context.token_budget_ratio", "lots", "a number"),
        ("context.window", "12", "'auto' or an integer from 512"),
        ("context.token_counter", "words", "one of auto, model, tiktoken, heuristic"),
        ("tools.enabled", "read_file,format_disk", "unknown: format_disk"),
        ("tools.shell", "maybe", "true or false"),
        ("model.n_ctx", "-5", "or an integer from 512 to"),
    ],
)
def test_invalid_values_name_key_value_and_range(key, value, fragment):
    with pytest.raises(SettingsError) as err:
        SETTINGS[key].parse(value)
    message = str(err.value)
    assert key in message and repr(value) in message and fragment in message


def test_unknown_key_is_refused():
    with pytest.raises(SettingsError, match="unknown setting 'context.ratio'"):
        S.lookup("context.ratio")


def test_bad_file_and_env_values_fall_back_and_are_reported(tmp_path):
    cfg = tmp_path / "config.toml"
    original = "[context]\ntoken_budget_ratio = 7\nwindow = 4096\nbogus = 1\n"
    cfg.write_text(original)
    s = load_settings(cfg, {"IRIS_CONTEXT_COMPACTION_THRESHOLD": "high"})
    assert s["context.token_budget_ratio"] == 0.70
    assert s["context.window"] == 4096
    assert s["context.compaction_threshold"] == 0.75
    text = "\n".join(s.problems)
    assert "context.token_budget_ratio" in text and "bogus" in text
    assert "IRIS_CONTEXT_COMPACTION_THRESHOLD" in text
    assert cfg.read_text() == original  # never rewritten silently


def test_unreadable_toml_is_reported_not_fatal(tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_text("this is = = not toml")
    s = load_settings(cfg, {})
    assert s["context.token_budget_ratio"] == 0.70
    assert "cannot read the settings file" in s.problems[0]


def test_write_validates_first_and_keeps_other_keys(tmp_path):
    cfg = tmp_path / "config.toml"
    write_config_value(cfg, "context.token_budget_ratio", "0.8")
    write_config_value(cfg, "tools.allowed_paths", "/a,/b")
    before = cfg.read_bytes()
    with pytest.raises(SettingsError):
        write_config_value(cfg, "context.token_budget_ratio", "2")
    assert cfg.read_bytes() == before
    s = load_settings(cfg, {})
    assert s["context.token_budget_ratio"] == 0.8
    assert s["tools.allowed_paths"] == ["/a", "/b"]
    write_config_value(cfg, "context.token_budget_ratio", None)
    assert load_settings(cfg, {})["context.token_budget_ratio"] == 0.7


def test_the_readme_settings_table_names_every_key():
    """The README's table is written by hand: a new key must be added to it."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("| key | default | meaning |"):]
    table = table[: table.index("\n\n")]
    missing = [key for key in SETTINGS if f"`{key}`" not in table]
    assert not missing, f"README's settings table lacks {missing}"


def test_every_key_has_a_plain_language_label():
    for s in SETTINGS.values():
        assert s.label and s.label != s.key and "." not in s.label.split()[0], s.key
    assert SETTINGS["context.token_budget_ratio"].label == \
        "How much of the window a request may fill"


def test_appearance_keys_through_file_env_and_config_set(tmp_path, capsys):
    from iris_desktop.cli import main

    assert S.defaults()["ui.theme"] == "system" and S.defaults()["ui.font_size"] == 0
    assert SETTINGS["ui.theme"].env_var == "IRIS_UI_THEME"
    s = load_settings(None, {"IRIS_UI_THEME": "Dark", "IRIS_UI_FONT_SIZE": "14"})
    assert (s["ui.theme"], s.source("ui.theme"), s["ui.font_size"]) == ("dark", "env", 14)
    bad = load_settings(None, {"IRIS_UI_THEME": "purple", "IRIS_UI_FONT_SIZE": "5"})
    assert (bad["ui.theme"], bad["ui.font_size"]) == ("system", 0)
    problems = "\n".join(bad.problems)
    assert "one of system, light, dark" in problems
    assert "0 (the system's size) or an integer from 8 to 24" in problems
    data = str(tmp_path / "home")
    assert main(["--data-dir", data, "config", "set", "ui.theme", "dark"]) == 0
    assert main(["--data-dir", data, "config", "set", "ui.font_size", "0"]) == 0
    assert main(["--data-dir", data, "config", "set", "ui.font_size", "30"]) == 2
    capsys.readouterr()
    assert main(["--data-dir", data, "config", "get", "ui.theme"]) == 0
    assert capsys.readouterr().out.strip() == "dark"
    config = (tmp_path / "home" / "config.toml").read_text()
    assert "[ui]" in config and 'theme = "dark"' in config


def test_two_writers_at_once_keep_both_keys(tmp_path):
    """Before, `config set` read, edited and renamed with no lock: of two at once one key
    was lost in 1-2 of 20 rounds, of ten at once most were, each saying it was saved."""
    import subprocess
    import sys

    keys = {"model.top_k": "15", "model.min_p": "0.07", "model.top_p": "0.9", "model.temperature": "0.5",
            "ui.theme": "dark", "context.summary_max_tokens": "512"}
    data = tmp_path / "data"
    runs = [subprocess.Popen([sys.executable, "-m", "iris_desktop", "--data-dir", str(data),
                              "config", "set", key, value], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True) for key, value in keys.items()]
    assert all(run.wait(timeout=120) == 0 for run in runs), [run.stderr.read() for run in runs]
    settings = load_settings(data / "config.toml", env={})
    assert {key: S.lookup(key).to_text(settings[key]) for key in keys} == keys


def test_resetting_a_key_removes_its_older_name_too(tmp_path):
    """Before, `config reset model.gpu` (and the dialog's auto) left an older file's
    n_gpu_layers = 5 in force, exit 0."""
    path = tmp_path / "config.toml"
    path.write_text("[model]\nn_gpu_layers = 5\n")
    assert load_settings(path, env={}).source("model.gpu") == "file"
    S.reset_config(path, "model.gpu")
    assert load_settings(path, env={}).source("model.gpu") == "default"
    assert "n_gpu_layers" not in path.read_text()


def test_a_file_name_that_is_not_utf8_is_a_sentence_not_a_bug(tmp_path):
    odd = tmp_path / "caf\udce9"  # how Python holds a Latin-1 byte in a file name
    with pytest.raises(SettingsError, match=r"holds bytes that are not UTF-8 .* rename it, or give "
                                            r"it with --set or IRIS_TOOLS_ALLOWED_PATHS"):
        write_config_value(tmp_path / "config.toml", "tools.allowed_paths", [str(odd)])
    assert not (tmp_path / "config.toml").exists()


def test_a_linked_settings_file_stays_a_link(tmp_path):
    dotfile = tmp_path / "dotfiles" / "iris.toml"
    dotfile.parent.mkdir()
    dotfile.write_text("# mine\n[ui]\ntheme = \"light\"\n")
    link = tmp_path / "config.toml"
    link.symlink_to(dotfile)
    write_config_value(link, "ui.theme", "dark")
    assert link.is_symlink() and 'theme = "dark"' in dotfile.read_text()
    assert dotfile.read_text().startswith("# mine")


def test_problems_are_said_in_iris_words_and_briefly(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('[model]\nn_gpu_layers = "x"\n[context]\nprune_protect_turns = ' + "9" * 2000 + "\n")
    problems = load_settings(path, env={}).problems
    assert any("model.n_gpu_layers: invalid value 'x': expected an integer" in p for p in problems), problems
    assert not any("invalid literal" in p for p in problems)
    assert all(len(p) < 600 for p in problems), [len(p) for p in problems]  # not 2,000 digits
    # more digits than Python reads: a traceback at every start, and in config set
    path.write_text("[context]\nprune_protect_turns = " + "9" * 5000 + "\n")
    problem, = load_settings(path, env={}).problems
    assert "holds a number of more than 4,300 digits" in problem and "using the defaults" in problem
    with pytest.raises(SettingsError, match="holds a number of more than 4,300 digits"):
        write_config_value(path, "ui.theme", "dark")


# -- an audit of the settings' faces (session 55) ------------------------------------------


def test_a_text_setting_is_bounded_so_the_file_stays_readable(tmp_path):
    """Before: Preferences saved a 1.1 MB system prompt into a file Iris then refused to
    read, and every setting went back to its default."""
    with pytest.raises(SettingsError, match="chat.system_prompt: 200,001 characters is too long"):
        SETTINGS["chat.system_prompt"].parse("x" * (S.MAX_TEXT_CHARS + 1))
    assert SETTINGS["chat.system_prompt"].parse("x" * S.MAX_TEXT_CHARS)
    path = tmp_path / "config.toml"
    # values of the longest length with every character escaped in TOML still refused whole
    with pytest.raises(SettingsError, match="would be .* bytes, more than the 1,048,576 Iris reads"):
        S.write_config_values(path, {"chat.system_prompt": "\x01" * S.MAX_TEXT_CHARS})
    assert not path.exists()  # nothing written
    write_config_value(path, "chat.system_prompt", "é" * S.MAX_TEXT_CHARS)
    assert load_settings(path, env={})["chat.system_prompt"] == "é" * S.MAX_TEXT_CHARS


def test_a_file_saved_with_a_byte_order_mark_is_read(tmp_path):
    path = tmp_path / "config.toml"
    path.write_bytes("\ufeff[model]\ntemperature = 0.3\n".encode())
    settings = load_settings(path, env={})
    assert settings["model.temperature"] == 0.3 and not settings.problems
    write_config_value(path, "model.top_k", 20)  # `config set` edits it too
    assert load_settings(path, env={})["model.top_k"] == 20


def test_an_unreadable_file_is_marked_as_such(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("[ui]\nfont_size = 14pt\n")
    settings = load_settings(path, env={})
    assert settings.file_unreadable is not None and "not valid TOML" in settings.file_unreadable
    assert settings.with_overrides({"model.top_k": "5"}).file_unreadable == settings.file_unreadable
    path.write_text("[ui]\nfont_size = 14\n")
    assert load_settings(path, env={}).file_unreadable is None


@pytest.mark.parametrize("typed", ["Context.Window", "CONTEXT.WINDOW", "context_window",
                                   "context-window"])
def test_a_key_in_the_wrong_case_or_with_underscores_is_named(typed):
    with pytest.raises(SettingsError, match="did you mean context.window"):
        S.lookup(typed)


def test_the_model_context_size_is_0_or_at_least_512():
    """Before: 100 was accepted, the breakdown planned a window of 100 and llama.cpp
    loaded 256."""
    setting = SETTINGS["model.n_ctx"]
    assert setting.parse("0") == 0 and setting.parse("512") == 512
    with pytest.raises(SettingsError, match="0 \\(the model's trained maximum\\) or an integer from 512"):
        setting.parse("100")


def test_a_restored_default_is_planned_as_the_default_the_file_will_then_hold():
    """Before: Restore defaults (n_ctx 8192) was read as a value the user chose, and a
    model trained for 4,096 had OK disabled though saving removes the key."""
    from iris_desktop.core.views import parse_fields

    base = S.defaults().with_overrides({"model.n_ctx": "2048"})
    candidate, errors = parse_fields(base, {"model.n_ctx": "8192", "model.top_k": "20"})
    assert not errors
    assert candidate.source("model.n_ctx") == "default" and candidate.source("model.top_k") == "file"


# -- an audit of the settings' faces (session 57) ------------------------------------------


def test_config_reset_says_when_the_environment_still_wins(capsys, monkeypatch, tmp_path):
    """Before: with IRIS_CONTEXT_WINDOW=2048 set, `config reset context.window` printed
    "= auto (the default…)" and nothing else, and `config get` then gave 2048; a full
    reset said every setting was at its default. Now both warn as `config set` does."""
    from iris_desktop.cli import main

    data = ["--data-dir", str(tmp_path)]
    assert main([*data, "config", "set", "context.window", "4096"]) == 0
    monkeypatch.setenv("IRIS_CONTEXT_WINDOW", "2048")
    capsys.readouterr()
    assert main([*data, "config", "reset", "context.window"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("context.window = auto")
    assert ("IRIS_CONTEXT_WINDOW is set in this environment and wins over the settings file; "
            "unset it for the default to apply") in err
    monkeypatch.setenv("IRIS_MODEL_TOP_K", "3")
    assert main([*data, "config", "reset"]) == 0
    err = capsys.readouterr().err
    assert "IRIS_CONTEXT_WINDOW, IRIS_MODEL_TOP_K are set in this environment and win" in err
    monkeypatch.delenv("IRIS_CONTEXT_WINDOW")
    monkeypatch.delenv("IRIS_MODEL_TOP_K")
    assert main([*data, "config", "reset", "context.window"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("where", ["parse", "file", "env"])
def test_a_relative_model_path_is_refused_as_preferences_refuse_it(tmp_path, where):
    """Before: `config set model.path mymodel.gguf`, the file and IRIS_MODEL_PATH took a
    relative path (the file of whatever folder Iris was started from) that Preferences
    refuses. 'bundled', an absolute path and one from ~ are taken."""
    setting = SETTINGS["model.path"]
    for good in ("bundled", "/models/x.gguf", "~/models/x.gguf", "C:\\models\\x.gguf"):
        assert setting.parse(good) == good
    said = "model.path: mymodel.gguf is not a full path"
    if where == "parse":
        with pytest.raises(SettingsError, match=said):
            write_config_value(tmp_path / "config.toml", "model.path", "mymodel.gguf")
        assert not (tmp_path / "config.toml").exists()
        return
    config = tmp_path / "config.toml"
    config.write_text('[model]\npath = "mymodel.gguf"\n' if where == "file" else "")
    s = load_settings(config, {"IRIS_MODEL_PATH": "mymodel.gguf"} if where == "env" else {})
    assert s["model.path"] == "bundled"
    assert any(said in p for p in s.problems), s.problems


def test_a_typo_in_a_key_is_suggested_as_for_the_environment():
    """Before: `config set context.windw 4096` and `--set context.windw=1` said "unknown
    setting" with no suggestion, while IRIS_CONTEXT_WINDW got "did you mean"."""
    with pytest.raises(SettingsError, match="unknown setting 'context.windw'; did you mean context.window\\?"):
        S.lookup("context.windw")
    with pytest.raises(SettingsError, match="did you mean model.temperature\\?"):
        S.parse_assignments(["model.temprature=0.5"])
    with pytest.raises(SettingsError) as err:
        S.lookup("context.future_knob")
    assert "did you mean" not in str(err.value)


def test_each_problem_says_its_own_outcome(tmp_path):
    """Before: a key of a newer Iris was "unknown setting …; using the default" (it has
    none), and a bad variable was "ignored" though the file's value is what is used."""
    config = tmp_path / "config.toml"
    config.write_text("[context]\ntoken_budget_ratio = 0.5\nfuture_knob = 1\nwindw = 3\n"
                      "[model]\nn_gpu_layers = 0\n")
    s = load_settings(config, {"IRIS_CONTEXT_TOKEN_BUDGET_RATIO": "abc",
                               "IRIS_MODEL_TOP_K": "lots"})
    text = "\n".join(s.problems)
    assert s["context.token_budget_ratio"] == 0.5 and s["model.gpu"] == "off"
    assert f"{config}: context.future_knob is not known to this version of Iris; ignored\n" in text + "\n"
    assert "context.windw is not known to this version of Iris; ignored (did you mean context.window?)" in text
    assert "IRIS_CONTEXT_TOKEN_BUDGET_RATIO: context.token_budget_ratio: invalid value 'abc': " \
           "expected a number from 0.1 to 0.95; ignored, the settings file's value is used" in text
    assert "IRIS_MODEL_TOP_K" in text and "ignored, the default is used" in text
    assert "model.n_gpu_layers = 0 is read as model.gpu = off" in text
    assert "default" not in [p for p in s.problems if "n_gpu_layers" in p][0]


def test_the_start_box_says_no_default_that_is_not_used(monkeypatch, tmp_path, qapp):
    """Before: the start-up box said "settings not used … Iris uses the defaults for
    these" of an older key that is used (n_gpu_layers = 0 as model.gpu = off) and of a bad
    variable whose file value is used; a newer Iris's key opened the box on every start.
    Now each problem says its own outcome, and a newer Iris's key is only logged (and said
    in the status bar)."""
    pytest.importorskip("PySide6")
    from support.windows import run_gui_recording

    data = tmp_path / "data"
    data.mkdir()
    (data / "config.toml").write_text("[context]\ntoken_budget_ratio = 0.5\n[model]\n"
                                      "n_gpu_layers = 0\nq8_weights = false\n")
    monkeypatch.setenv("IRIS_CONTEXT_TOKEN_BUDGET_RATIO", "abc")
    shown = run_gui_recording(monkeypatch, data)
    assert shown[0][0] == "warning" and shown[1:] == [("window", "")], shown
    assert "Iris uses the defaults for these" not in shown[0][1]
    assert "is read as model.gpu = off" in shown[0][1]
    assert "ignored, the settings file's value is used" in shown[0][1]
    monkeypatch.delenv("IRIS_CONTEXT_TOKEN_BUDGET_RATIO")
    (data / "config.toml").write_text("[context]\nfuture_knob = 1\n")
    assert run_gui_recording(monkeypatch, data) == [("window", "")]  # no box on every start
    import logging
    from types import SimpleNamespace

    from iris_desktop.ui.app import _tell_settings

    host = SimpleNamespace(settings=load_settings(data / "config.toml", {}),
                           paths=SimpleNamespace(config_path=data / "config.toml"))
    assert _tell_settings(host, logging.getLogger("test")) == (
        "The settings file has context.future_knob, not known to this version of Iris; "
        "ignored (see the log)")


def test_config_reset_without_a_settings_file_says_so_and_makes_none(capsys, tmp_path):
    """Before: `config reset` on a fresh data folder said "(removed from …/config.toml)" of
    a file that never existed, and `config reset KEY` wrote an empty one."""
    from iris_desktop.cli import main

    data = ["--data-dir", str(tmp_path / "fresh")]
    assert main([*data, "config", "reset"]) == 0
    assert "(there is no settings file; " in capsys.readouterr().out
    assert main([*data, "config", "reset", "context.window"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("context.window = auto  (the default; there is no settings file; ")
    assert not (tmp_path / "fresh" / "config.toml").exists()
    assert main([*data, "config", "set", "context.window", "4096"]) == 0
    assert main([*data, "config", "reset", "context.window"]) == 0
    assert "(the default; removed from " in capsys.readouterr().out
