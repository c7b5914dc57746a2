"""Review of session 65: the settings' ranges are said with thousands separators
("an integer from 512 to 1,048,576"), so a number typed as the message writes it
("4,096") is read as that number, not refused by a sentence that seems to allow it."""

from __future__ import annotations

import pytest

from iris_desktop.settings import SETTINGS, SettingsError

from support.helpers import run_cli


def test_config_set_takes_an_integer_written_as_the_range_is(capsys, tmp_path):
    data = tmp_path / "data"
    code, _, err = run_cli(capsys, "--data-dir", data, "config", "set", "model.n_ctx", "4,096")
    assert code == 0, err
    code, out, _ = run_cli(capsys, "--data-dir", data, "config", "get", "model.n_ctx")
    assert code == 0 and out.strip() == "4096"


@pytest.mark.parametrize("key, typed, value", [
    ("model.n_ctx", "4,096", 4096), ("model.n_ctx", " 131,072 ", 131072),
    ("context.window", "8,192", 8192), ("model.n_ctx", "4096", 4096),
])
def test_grouped_integers_are_read(key, typed, value):
    assert SETTINGS[key].parse(typed) == value


@pytest.mark.parametrize("key, typed", [
    ("model.n_ctx", "4,09"), ("model.n_ctx", "40,96"), ("model.n_ctx", "4,096,"),
    ("model.n_ctx", ",4096"), ("context.window", "1,5"), ("context.token_budget_ratio", "0,5"),
])
def test_what_is_no_grouped_integer_is_still_refused(key, typed):
    with pytest.raises(SettingsError, match="invalid value"):
        SETTINGS[key].parse(typed)
