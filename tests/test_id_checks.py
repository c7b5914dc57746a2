"""Ids given on the command line are checked against the thread they name.

Before: ``switch THREAD MESSAGE`` accepted another thread's message and re-pointed the
thread into that one (its next ``chat`` failed with an internal KeyError, and once the
other thread was deleted this thread's history vanished from every view); ids like
10^30 reached SQLite and failed as an internal error.
"""

from __future__ import annotations

import json

import pytest

from iris_desktop.core.store import Store

from support.helpers import run_cli as run


@pytest.fixture
def two_threads(capsys, tmp_path):
    data = tmp_path / "home"
    for name in ("a", "b"):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps([{"role": "user", "content": f"hello {name}"},
                                    {"role": "assistant", "content": f"hi {name}"}]))
        assert run(capsys, "--data-dir", data, "import", path)[0] == 0
    return data


def test_switch_refuses_another_thread_s_message_and_changes_nothing(capsys, two_threads):
    data = two_threads
    with Store(data / "iris.db") as store:
        other = store.messages(2)[-1]["id"]
        before = [r["id"] for r in store.messages(1)]
    code, out, err = run(capsys, "--data-dir", data, "switch", 1, other, "next")
    assert code == 2 and err.strip() == f"iris-desktop: no message {other} in thread 1", err
    with Store(data / "iris.db") as store:
        assert [r["id"] for r in store.messages(1)] == before
        with pytest.raises(KeyError):
            store.set_head(1, other)
        assert [r["id"] for r in store.messages(1)] == before
    assert run(capsys, "--data-dir", data, "delete", 2, "--yes")[0] == 0
    code, out, err = run(capsys, "--data-dir", data, "export", 1)
    assert code == 0 and [m["content"] for m in json.loads(out)["messages"]] == ["hello a", "hi a"]


@pytest.mark.parametrize("value", [str(10**30), "-5", "0", "1e3", str(2**63)])
def test_ids_out_of_range_are_usage_errors_in_one_sentence(capsys, two_threads, value):
    for argv in (["switch", "1", value, "next"], ["switch", value, "1", "next"],
                 ["export", value], ["delete", value, "--yes"], ["context", value, "--no-model"],
                 ["chat", "--thread", "1", "--edit", value, "hi"]):
        with pytest.raises(SystemExit) as exit_:
            run(capsys, "--data-dir", two_threads, *argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and "Traceback" not in err
        assert "is not an id" in err or "not a whole number" in err or "expected one argument" in err, err
