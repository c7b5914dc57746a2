"""kill -9 in the middle of a streamed reply loses at most a second of text, never the
user's message, and leaves a sound database. Twenty rounds, each a real process."""

import pytest

from support.crash import check, crash_once


@pytest.mark.parametrize("round_", range(20))
def test_sigkill_mid_reply(tmp_path, model_path, round_):
    result = crash_once(tmp_path / f"home{round_}", model_path)
    check(result)
    assert result["recovered"] == 1
