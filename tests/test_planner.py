"""The planner is the one source of truth: the request that is shown is the request
that is sent, to the token, with a chat template that renders tools itself; builds are
cached; a model closed under a counting thread fails cleanly."""

from __future__ import annotations

import json
import threading

import pytest

from iris_desktop.cli import main
from iris_desktop.core.config import ContextParams, ToolsConfig
from iris_desktop.core.events import ReplySaved, RequestSent, TurnDone
from iris_desktop.core.planner import Planner
from iris_desktop.host import Host, build_agent, load_runtime
from iris_desktop.settings import load_settings
from iris_desktop.tokens import HeuristicCounter

from support.fakes import ScriptedRuntime


def chat(turns: int) -> list[dict]:
    out = []
    for i in range(turns):
        out += [{"role": "user", "content": f"question {i} about the garden"},
                {"role": "assistant", "content": f"answer {i}: plant tomatoes in May"}]
    return out


def test_plans_are_cached_by_thread_state_and_draft(fresh_store):
    thread = fresh_store.create_thread("t")
    fresh_store.add_messages(thread, chat(5))
    planner = Planner(ContextParams(window=4096), HeuristicCounter())
    first = planner.plan(fresh_store, thread)
    assert planner.plan(fresh_store, thread) is first and planner.builds == 1
    planner.plan(fresh_store, thread, "a draft")
    assert planner.builds == 2
    fresh_store.add_message(thread, {"role": "user", "content": "one more"})
    assert planner.plan(fresh_store, thread) is not first and planner.builds == 3


def test_the_agent_reports_what_it_sent_in_at_most_two_builds(fresh_store):
    runtime = ScriptedRuntime(["Plant them in May."])
    planner = Planner(ContextParams(window=8192), runtime.counter(), runtime=runtime)
    thread = fresh_store.create_thread("t")
    fresh_store.add_messages(thread, chat(3))
    events = list(build_agent(planner, fresh_store).send(thread, "When do I plant tomatoes?"))
    sent = next(e for e in events if isinstance(e, RequestSent)).request
    assert runtime.requests[0] == sent.messages  # the reported request is the sent one
    done = events[-1]
    assert isinstance(done, TurnDone) and done.next_request is not None
    assert planner.builds <= 2  # the request, and the next one (compaction check and views)
    assert planner.plan(fresh_store, thread) is done.next_request  # no third build


def test_a_closed_model_fails_counting_cleanly_while_another_thread_counts(model_path):
    """Reloading the model while the meter counts on the DB thread must never touch
    freed memory: counting holds the model's lifetime lock, and after close it raises."""
    from iris_desktop.runtime.model import LocalModel

    model = LocalModel.load(model_path, n_ctx=2048)
    counter = model.counter()
    results: list[str] = []
    started = threading.Event()

    def count_forever() -> None:
        started.set()
        for i in range(100_000):
            try:
                counter.count_message({"role": "user", "content": f"message {i} " * 20})
            except RuntimeError as exc:
                results.append(str(exc))
                return
        results.append("never closed")

    worker = threading.Thread(target=count_forever)
    worker.start()
    started.wait()
    model.close()
    worker.join(timeout=60)
    assert results and "closed" in results[0]


# -- a template that renders tools itself, with a tools folder set -----------------------


@pytest.fixture
def tools_folder(tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "garden.txt").write_text("Tomatoes go in after the last frost.\n")
    return folder


def test_context_draft_predicts_what_chat_reports_with_native_tools(capsys, tmp_path, model_path,
                                                                    tools_folder):
    """`context --json --draft T` predicts the prompt_tokens that `chat --thread --json T`
    then reports, with a template that takes tools (Qwen2.5's) and tools on a folder."""
    settings = ["--data-dir", str(tmp_path / "home"), "--set", f"model.path={model_path}",
                "--set", f"tools.allowed_paths={tools_folder}", "--set", "model.temperature=0",
                "--set", "model.max_tokens=16", "--set", "model.n_ctx=4096"]
    assert main([*settings, "chat", "--new", "--json", "Hello! Who are you?"]) == 0
    thread = json.loads(capsys.readouterr().out)["thread_id"]
    assert main([*settings, "context", str(thread), "--json", "--draft", "Say goodbye."]) == 0
    context = json.loads(capsys.readouterr().out)
    with Host(tmp_path / "home") as host:
        before = len(host.store.requests(thread))
    assert context["tools_native"] and context["tools"] and context["prompt_exact"]
    assert context["chat_format"] == "jinja"
    assert main([*settings, "chat", "--thread", str(thread), "--json", "Say goodbye."]) == 0
    reply = json.loads(capsys.readouterr().out)
    with Host(tmp_path / "home") as host:
        first_of_turn = host.store.requests(thread)[before]  # the request for the draft
    assert first_of_turn["prompt_tokens"] == first_of_turn["predicted_prompt_tokens"]
    assert context["predicted_prompt_tokens"] == first_of_turn["prompt_tokens"]
    if reply["finish_reason"] != "stop" or not reply["reply"]:
        pytest.fail(f"the model did not answer: {reply}")


def test_planner_meter_and_inspector_agree_with_the_model(tmp_path, model_path, tools_folder):
    """The planner's prediction for a draft equals the prompt tokens the model reports when
    that draft is sent, and the inspector's rows add up to it."""
    from iris_desktop.core.views import inspector_report

    settings = load_settings(None, env={}).with_overrides({
        "model.path": str(model_path), "tools.allowed_paths": str(tools_folder),
        "model.temperature": "0", "model.max_tokens": "8", "model.n_ctx": "4096"})
    with Host(tmp_path / "home", settings=settings) as session:
        model = load_runtime(settings, session.paths)
        try:
            planner = Planner.from_settings(settings, model)
            assert planner.tool_prompt().native
            store = session.store
            thread = store.create_thread("t")
            store.add_messages(thread, chat(2))
            draft = "Which file mentions tomatoes?"
            predicted = planner.plan(store, thread, draft)
            report = inspector_report(store, planner, thread, draft)
            assert sum(r["tokens"] for r in report["request"]) == predicted.predicted_prompt_tokens
            assert report["breakdown"] == predicted.breakdown.as_dict()
            for event in build_agent(planner, store, compact=False).send(thread, draft):
                if isinstance(event, ReplySaved):
                    reported = event.stats  # what llama.cpp evaluated for the request
        finally:
            model.close()
    assert reported.prompt_tokens == predicted.predicted_prompt_tokens


def test_tools_are_in_the_native_template_not_the_system_prompt(tmp_path, model_path,
                                                                tools_folder):
    from iris_desktop.paths import app_paths

    settings = load_settings(None, env={}).with_overrides({"model.path": str(model_path),
                                                           "model.n_ctx": "2048"})
    model = load_runtime(settings, app_paths(tmp_path))
    try:
        planner = Planner.from_settings(settings, model)
        planner_tools = Planner(planner.params, planner.counter, runtime=model,
                                tools=ToolsConfig(allowed_paths=(str(tools_folder),)))
        prompt = planner_tools.tool_prompt()
        assert prompt.native and prompt.text == "" and prompt.native_tokens > 100
    finally:
        model.close()
