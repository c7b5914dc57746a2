"""Review of session 65: the 'doctor' hint is for the command word argparse refused, not
for any argument that happens to be 'test' or 'check' (a '--set KEY VALUE' whose value
is 'test' lost its own hint, '--set takes KEY=VALUE as one argument')."""

from __future__ import annotations

import pytest

from support.helpers import one_sentence, run_cli


@pytest.mark.parametrize("argv, hint", [
    (["--set", "chat.system_prompt", "test", "chat"],
     "; --set takes KEY=VALUE as one argument (--set chat.system_prompt=test)"),
    (["--set", "chat.system_prompt", "check", "chat"],
     "; --set takes KEY=VALUE as one argument (--set chat.system_prompt=check)"),
    (["chta", "test"], None),  # a typo of 'chat': not a check command
    # an option's value or a subcommand's action (session 66's review: both got the hint)
    (["export", "--format", "test", "1"], None),
    (["config", "check"], None),
])
def test_the_self_test_hint_is_only_for_a_check_command(capsys, argv, hint):
    with pytest.raises(SystemExit) as ended:
        run_cli(capsys, *argv)
    err = capsys.readouterr().err
    assert ended.value.code == 2 and one_sentence(err), err
    assert "--self-test" not in err, err
    if hint is not None:
        assert hint in err, err


@pytest.mark.parametrize("word", ["doctor", "check", "selftest", "self-test", "test", "Doctor"])
def test_a_check_command_still_points_to_the_self_test(capsys, word):
    with pytest.raises(SystemExit) as ended:
        run_cli(capsys, "--set", "ui.theme=dark", word, "now")
    err = capsys.readouterr().err
    assert ended.value.code == 2 and one_sentence(err)
    assert "; to check the installation: iris-desktop --self-test (see" in err, err
