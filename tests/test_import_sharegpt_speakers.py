"""A ShareGPT conversation with a turn by a speaker Iris does not know ("bot"): before,
those turns were dropped without a word and the chat stored as the user's questions alone
(the import said "imported 1 chat"). Now that chat is skipped, named with why, while the
file's other chats are imported; a file of that one chat is refused, nothing written. The
real CLI in-process and the real SQLite store."""

from __future__ import annotations

import json

from support.helpers import one_sentence
from support.helpers import run_cli as run


def _chat(cid: str, answerer: str, answer: str) -> dict:
    return {"id": cid, "conversations": [
        {"from": "human", "value": "What is 2+2?"}, {"from": answerer, "value": answer},
        {"from": "human", "value": "And 3+3?"}, {"from": answerer, "value": "Six."}]}


def test_a_chat_with_an_unknown_speaker_is_skipped_and_named(capsys, tmp_path):
    source = tmp_path / "sharegpt.json"
    source.write_text(json.dumps([_chat("a", "bot", "It is 4."), _chat("b", "gpt", "Four.")]))
    code, out, err = run(capsys, "import", source)
    assert code == 0, err
    ids = out.split()
    assert len(ids) == 1, out  # the chat whose replies Iris cannot tell is not stored in part
    assert "skipped 1" in err and "'bot'" in err, err
    code, md, _ = run(capsys, "export", "--format", "md", ids[0])
    assert code == 0 and "Four." in md and "Six." in md


def test_a_file_of_that_one_chat_is_refused(capsys, tmp_path):
    source = tmp_path / "one.json"
    source.write_text(json.dumps([_chat("a", "bot", "It is 4.")]))
    code, out, err = run(capsys, "import", source)
    assert code == 2 and out == "" and one_sentence(err), err
    assert "nothing was written" in err and "turn 2's speaker 'bot'" in err, err
    code, out, _ = run(capsys, "threads", "--json", "--no-model")
    assert code == 0 and json.loads(out) == [], out
