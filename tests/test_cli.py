"""The CLI contract, run in-process through main() and once as a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from iris_desktop.cli import main

from conftest import AGENT_FILES, CHAT_FILES, load_corpus


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_import_export_round_trip_every_corpus_file(capsys, tmp_path):
    data = str(tmp_path / "home")
    for path in AGENT_FILES + CHAT_FILES:
        code, out, err = run(capsys, "--data-dir", data, "import", str(path))
        assert code == 0, err
        thread = out.strip()
        code, out, _ = run(capsys, "--data-dir", data, "export", thread)
        assert json.loads(out) == load_corpus(path), path.name


def test_import_jsonl_and_title(capsys, tmp_path):
    f = tmp_path / "chat.jsonl"
    f.write_text('{"role": "user", "content": "What is a walrus?"}\n\n'
                 '{"role": "assistant", "content": "A large marine mammal."}\n')
    code, out, _ = run(capsys, "import", str(f), "--title", "Walrus")
    assert code == 0
    code, out, _ = run(capsys, "threads", "--json", "--no-model")
    rows = json.loads(out)
    assert rows[0]["title"] == "Walrus" and rows[0]["messages"] == 2 and rows[0]["tokens"] > 0


@pytest.mark.parametrize(
    "content,fragment",
    [
        ('[{"role": "user", "content": "hi"},', "invalid JSON at line 1"),
        ('[{"role": "user", "content": "hi"}, {"role": "wizard", "content": "x"}]',
         "message index 1: unknown role 'wizard'"),
        ('{"messages": [{"role": "user", "content": "hi"}, '
         '{"role": "tool", "tool_call_id": "c9", "content": "out"}]}',
         "messages[1]: tool result 'c9' has no matching tool call"),
        ('{"role": "user", "content": "a"}\n{"role": "user", "content": 5}\n',
         "line 2: content must be"),
        ('{"role": "user", "content": "a"}\n{"role": \n', "line 2: invalid JSON"),
    ],
)
def test_malformed_import_is_refused_and_nothing_written(capsys, tmp_path, content, fragment):
    f = tmp_path / "bad.json"
    f.write_text(content)
    code, out, err = run(capsys, "import", str(f))
    assert code == 2 and fragment in err and "nothing was written" in err
    code, out, _ = run(capsys, "threads", "--json", "--no-model")
    assert json.loads(out) == []


def test_context_json_fields(capsys):
    code, out, _ = run(capsys, "import", str(AGENT_FILES[3]))
    thread = out.strip()
    code, out, err = run(capsys, "--set", "context.window=16384", "context", thread, "--json",
                         "--no-model")
    assert code == 0, err
    r = json.loads(out)
    for key in ("window", "window_source", "token_budget_ratio", "counter", "system_tokens",
                "tool_tokens", "summary_tokens", "history_tokens", "available", "protect_turns",
                "compaction_due", "trigger", "messages"):
        assert key in r
    assert r["window"] == 16384 and r["window_source"] == "config"
    assert r["counter"] == "heuristic"
    assert r["available"] == int(16384 * 0.7) - r["system_tokens"] - r["tool_tokens"]
    assert len(r["messages"]) == len(load_corpus(AGENT_FILES[3]))
    assert {m["state"] for m in r["messages"]} <= {"verbatim", "pruned", "summarized", "dropped"}
    assert all({"id", "role", "turn", "tokens", "state"} <= set(m) for m in r["messages"])


def test_context_too_large_exits_3(capsys, tmp_path):
    f = tmp_path / "big.json"
    f.write_text(json.dumps([{"role": "user", "content": "word " * 20000}]))
    _, out, _ = run(capsys, "import", str(f))
    code, out, err = run(capsys, "--set", "context.window=2048", "context", out.strip(),
                         "--no-model")
    assert code == 3
    assert "the newest turn alone is 25,004 tokens" in err and "the window allows" in err


def test_unknown_thread_and_bad_set_are_usage_errors(capsys):
    assert run(capsys, "context", "99", "--no-model")[0] == 2
    code, _, err = run(capsys, "--set", "context.token_budget_ratio=3", "threads")
    assert code == 2 and "context.token_budget_ratio" in err and "0.1 to 0.95" in err


def test_config_set_get_list_reset(capsys, tmp_path):
    code, _, _ = run(capsys, "config", "set", "context.token_budget_ratio", "0.8")
    assert code == 0
    assert run(capsys, "config", "get", "context.token_budget_ratio")[1].strip() == "0.8"
    _, path, _ = run(capsys, "config", "path")
    from pathlib import Path
    before = Path(path.strip()).read_bytes()
    code, _, err = run(capsys, "config", "set", "context.token_budget_ratio", "1.2")
    assert code == 2 and "expected a number from 0.1 to 0.95" in err
    code, _, err = run(capsys, "config", "set", "context.nope", "1")
    assert code == 2 and "unknown setting" in err
    assert Path(path.strip()).read_bytes() == before
    _, out, _ = run(capsys, "config", "list", "--json")
    rows = {r["key"]: r for r in json.loads(out)}
    assert rows["context.token_budget_ratio"]["source"] == "file"
    assert rows["context.token_budget_ratio"]["env"] == "IRIS_CONTEXT_TOKEN_BUDGET_RATIO"
    run(capsys, "config", "reset", "context.token_budget_ratio")
    assert run(capsys, "config", "get", "context.token_budget_ratio")[1].strip() == "0.7"


def test_env_override_and_bad_env_warns(capsys, monkeypatch):
    monkeypatch.setenv("IRIS_CONTEXT_PRUNE_PROTECT_TURNS", "5")
    monkeypatch.setenv("IRIS_CONTEXT_COMPACTION_THRESHOLD", "lots")
    code, out, err = run(capsys, "config", "list", "--json")
    rows = {r["key"]: r for r in json.loads(out)}
    assert rows["context.prune_protect_turns"]["value"] == 5
    assert rows["context.prune_protect_turns"]["source"] == "env"
    assert rows["context.compaction_threshold"]["value"] == 0.75
    assert "IRIS_CONTEXT_COMPACTION_THRESHOLD" in err


def test_console_script_runs_as_a_subprocess(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "iris_desktop", "--data-dir", str(tmp_path), "threads", "--no-model"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0 and "no threads yet" in result.stdout


def test_context_shows_recall_for_a_draft_after_compaction(capsys):
    locomo = next(p for p in CHAT_FILES if p.stem == "locomo-26")
    _, out, _ = run(capsys, "import", str(locomo))
    thread = out.strip()
    small = ("--set", "context.window=4096")
    code, out, err = run(capsys, *small, "compact", thread, "--json", "--no-model")
    assert code == 0 and json.loads(out)["outcome"] == "ok", err
    question = "When did Caroline go to the LGBTQ support group?"
    code, out, err = run(capsys, *small, "context", thread, "--json", "--no-model",
                         "--draft", question)
    assert code == 0, err
    r = json.loads(out)
    assert r["recall"]["max_tokens"] == 1024 and r["recall"]["terms"] == ["lgbtq", "support", "group"]
    assert 0 < r["recall_tokens"] <= 1024 and r["recall"]["ids"] and r["recall"]["reason"] == ""
    recalled = [m for m in r["messages"] if m["recalled"]]
    assert [m["id"] for m in recalled] == r["recall"]["ids"]
    assert {m["state"] for m in recalled} == {"summarized"}
    assert r["predicted_prompt_tokens"] == (r["system_tokens"] + r["tool_tokens"] + r["summary_tokens"]
                                            + r["recall_tokens"] + r["history_tokens"] + r["draft_tokens"])
    code, out, _ = run(capsys, *small, "context", thread, "--no-model", "--draft", question)
    assert code == 0 and f"recall      {len(r['recall']['ids'])} summarized messages" in out
    code, out, _ = run(capsys, *small, "context", thread, "--no-model", "--draft", "I love pottery.")
    assert code == 0 and "recall      none (the message asks nothing)" in out
    # off is off
    code, out, _ = run(capsys, *small, "--set", "context.recall_max_tokens=0", "context", thread,
                       "--json", "--no-model", "--draft", question)
    assert json.loads(out)["recall_tokens"] == 0 and json.loads(out)["recall"]["ids"] == []
