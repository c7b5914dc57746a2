"""``threads`` marks a chat's size "≈" exactly when the window (its meter and inspector,
and ``context``'s ``prompt_exact``) calls the counts estimated. Before, under the bundled
model (a Jinja template: ``counter.exact`` is False) ``threads`` showed "≈41 tokens"
while ``context`` counted the same 41 history tokens with the model's own tokenizer and
called the request exact. The real CLI, the real bundled model."""

from __future__ import annotations

import json

from support.helpers import run_cli

CHAT = [{"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris is the capital of France."},
        {"role": "user", "content": "And of Italy?"},
        {"role": "assistant", "content": "Rome."}]


def _thread_line(out: str, thread: str) -> str:
    return next(line for line in out.splitlines() if line.split()[:1] == [thread])


def test_threads_marks_sizes_as_the_meter_does(capsys, tmp_path, model_path):
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps(CHAT), encoding="utf-8")
    data = ["--data-dir", tmp_path / "data"]
    code, out, err = run_cli(capsys, *data, "import", chat)
    assert code == 0, err
    thread = out.strip()
    model = [*data, "--set", f"model.path={model_path}"]

    code, out, err = run_cli(capsys, *model, "context", thread, "--json")
    assert code == 0, err
    context = json.loads(out)
    assert context["counter"].startswith("model:") and context["prompt_exact"] is True
    assert context["counter_exact"] is False  # the Jinja template: the request is counted whole
    history = context["history_tokens"]  # the whole chat is in the request

    code, out, err = run_cli(capsys, *model, "threads")
    assert code == 0, err
    line = _thread_line(out, thread)
    assert f" {history:,} tokens" in line and "≈" not in line, line  # before: "≈41 tokens"
    code, out, err = run_cli(capsys, *model, "threads", "--json")
    row = json.loads(out)[0]
    assert (row["tokens"], row["counter"], row["exact"]) == (history, context["counter"], True)

    # without the model: estimated, and said so by both
    code, out, err = run_cli(capsys, *data, "context", thread, "--json", "--no-model")
    assert code == 0, err
    assert json.loads(out)["prompt_exact"] is False
    code, out, err = run_cli(capsys, *data, "threads", "--no-model")
    assert code == 0 and "≈" in _thread_line(out, thread), out
    code, out, err = run_cli(capsys, *data, "threads", "--no-model", "--json")
    assert json.loads(out)[0]["exact"] is False


def test_a_counter_other_than_the_models_stays_estimated_with_the_model_loaded(capsys, tmp_path,
                                                                               model_path):
    """``context.token_counter = tiktoken`` with the model loaded: the meter says "≈"
    (not the model's own counts), and so does ``threads``."""
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps(CHAT), encoding="utf-8")
    data = ["--data-dir", tmp_path / "data"]
    thread = run_cli(capsys, *data, "import", chat)[1].strip()
    model = [*data, "--set", f"model.path={model_path}", "--set", "context.token_counter=tiktoken"]
    code, out, err = run_cli(capsys, *model, "context", thread, "--json")
    assert code == 0 and json.loads(out)["prompt_exact"] is False, err
    code, out, err = run_cli(capsys, *model, "threads")
    assert code == 0 and "≈" in _thread_line(out, thread), out
