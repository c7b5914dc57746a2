"""Small helpers the tests (and the benchmarks) share."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from iris_desktop.core.compaction import CompactionEvent, Compactor
from iris_desktop.core.config import CompactionSettings, ContextParams
from iris_desktop.core.planner import Planner
from iris_desktop.core.store import Store
from iris_desktop.core.summary import FIELDS
from iris_desktop.generation import GenerationRequest
from iris_desktop.tokens import TokenCounter


def compactor_for(store: Store, counter: TokenCounter, params: ContextParams,
                  settings: CompactionSettings | None = None, **kw: Any) -> Compactor:
    """A Compactor through a planner of these parts (what the app builds from settings)."""
    return Compactor(store, Planner(params, counter, compaction=settings), **kw)


def compact_while_due(compactor: Compactor, thread_id: int, limit: int = 12
                      ) -> list[CompactionEvent]:
    """Compact until no trigger is due (an imported long chat); stops at the first event
    that is not ``ok``."""
    events: list[CompactionEvent] = []
    for _ in range(limit):
        trigger, _ = compactor.check(thread_id)
        if trigger == "none":
            break
        events.append(compactor.compact(thread_id, trigger))
        if events[-1].outcome != "ok":
            break
    return events


def complete(model: Any, messages: list[dict], **kw: Any) -> tuple[str, Any]:
    """The whole reply and its statistics (a Generation, read to its end)."""
    generation = model.stream(GenerationRequest(messages, **kw))
    return generation.text(), generation.stats


def protocol_members(protocol: type) -> dict[str, Any]:
    """The names a Protocol class declares (annotations, methods, properties), with what
    each is in the class body (None for a bare annotation)."""
    members: dict[str, Any] = {name: None for name in getattr(protocol, "__annotations__", {})}
    for name, value in vars(protocol).items():
        if not name.startswith("_") and (callable(value) or isinstance(value, property)):
            members[name] = value
    return members


def signature_problems(name: str, declared: Any, actual: Any) -> list[str]:
    """How ``actual``'s parameters differ from ``declared``'s: every declared parameter
    must exist with the same kind and default, and ``actual`` may require nothing more."""
    import inspect

    want = inspect.signature(declared).parameters
    have = inspect.signature(actual).parameters
    problems = []
    for pname, param in want.items():
        if pname == "self":
            continue
        got = have.get(pname)
        if got is None:
            problems.append(f"{name}() has no parameter {pname!r}")
        elif got.kind != param.kind:
            problems.append(f"{name}({pname}) is {got.kind.description}, not {param.kind.description}")
        elif got.default != param.default:
            problems.append(f"{name}({pname}) defaults to {got.default!r}, not {param.default!r}")
    for pname, got in have.items():
        if (pname not in want and got.default is inspect.Parameter.empty
                and got.kind not in (got.VAR_POSITIONAL, got.VAR_KEYWORD)):
            problems.append(f"{name}() requires {pname!r}, which the protocol does not pass")
    return problems


def protocol_problems(obj: Any, protocol: type) -> list[str]:
    """Why ``obj`` does not satisfy ``protocol`` member by member ([] when it does):
    a missing attribute, a method that is not callable, or one whose signature differs."""
    problems = []
    for name, declared in protocol_members(protocol).items():
        if not hasattr(obj, name):
            problems.append(f"no {name}")
            continue
        if callable(declared) and not isinstance(declared, property):
            actual = getattr(type(obj), name, None)
            if not callable(actual):
                problems.append(f"{name} is not a method")
                continue
            problems += signature_problems(name, declared, actual)
    return problems


def run_cli(capsys: Any, *argv: Any) -> tuple[int, str, str]:
    """``iris-desktop ARGV`` run in-process through ``cli.main``: (exit code, stdout,
    stderr). Arguments may be paths or numbers (each is passed as ``str``)."""
    from iris_desktop.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_sentence(err: str) -> bool:
    """One line on stderr from the CLI (``iris-desktop: …``), no traceback."""
    return err.count("\n") == 1 and err.startswith("iris-desktop: ") and "Traceback" not in err


def cmake_flags(cmake_args: str) -> dict[str, str]:
    """``-DNAME=VALUE`` arguments of a CMAKE_ARGS string, by name."""
    return dict(arg[2:].split("=", 1) for arg in cmake_args.split() if arg.startswith("-D"))


def tool_ok(result: Any) -> str:
    """A tool call's text, after checking that it succeeded."""
    assert result.ok, result.content
    return result.content


def tool_refused(result: Any) -> str:
    """A tool call's text, after checking that it was refused with an ``error: `` line."""
    assert not result.ok, result.content
    assert result.content.startswith("error: ")
    return result.content


def llm_json(words=60, **fields):
    """A model's summary as JSON: every field empty but ``fields``, a summary of ``words``
    words, and the two relational fields filled."""
    data = {f: [] for f in FIELDS}
    data.update(summary=" ".join(f"fact{i}" for i in range(words)), emotional_thread="calm",
                relationship_dynamics="friendly")
    data.update(fields)
    return json.dumps(data)


def link_bundled_model(data: Any, model_path: Any) -> None:
    """A data folder whose models folder links the bundled model assembled once for the
    tests (and its ``.verified`` sidecar), so the CLI loads it without assembling it again."""
    (data / "models").mkdir(parents=True)
    for name in (model_path.name, model_path.name + ".verified"):
        (data / "models" / name).symlink_to(model_path.parent / name)


def chat_turns(turns: int, words: int = 20) -> list[dict]:
    """``turns`` question/answer pairs of ``words`` filler words each (a chat to seed)."""
    out = []
    for i in range(turns):
        out.append({"role": "user", "content": f"question {i} " + "word " * words})
        out.append({"role": "assistant", "content": f"answer {i} " + "word " * words})
    return out


def on_a_terminal(args: list[str], answers: dict[bytes, str], timeout_s: float = 120
                  ) -> tuple[int, bytes]:
    """Run ``iris-desktop ARGS`` on a real terminal (a pty: getpass reads it), typing each
    of ``answers``' values once its question (the key) has been asked, in order; returns
    (the exit code, everything the terminal showed)."""
    import os
    import pty
    import select
    import sys
    import time

    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        os.execv(sys.executable, [sys.executable, "-m", "iris_desktop.cli", *map(str, args)])
    pending = list(answers.items())
    seen, end = b"", time.monotonic() + timeout_s
    while time.monotonic() < end:
        if not select.select([fd], [], [], 1)[0]:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
        if pending and seen.count(pending[0][0]) and seen.rstrip().endswith(b":"):
            os.write(fd, pending.pop(0)[1].encode() + b"\n")
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert not pending, (pending, seen)  # every question was asked and answered
    return os.waitstatus_to_exitcode(status), seen


def chatgpt_export(folder: Path, chats: int, answer_padding: int = 0) -> Path:
    """``folder``/conversations.json: a ChatGPT-shaped export of ``chats`` short
    conversations, a question and an answer each (the answer ``answer_padding`` characters
    longer)."""
    def chat(n: int) -> dict:
        mapping = {"root": {"id": "root", "message": None, "parent": None, "children": ["u"]},
                   "u": {"id": "u", "parent": "root", "children": ["a"], "message": {
                       "id": "u", "author": {"role": "user"}, "create_time": 1.7e9 + n,
                       "content": {"content_type": "text", "parts": [f"Question {n} about fig {n}?"]}}},
                   "a": {"id": "a", "parent": "u", "children": [], "message": {
                       "id": "a", "author": {"role": "assistant"}, "create_time": 1.7e9 + n + 1,
                       "content": {"content_type": "text",
                                   "parts": [f"Answer {n}: " + "x" * answer_padding]}}}}
        return {"title": f"Chat {n}", "create_time": 1.7e9 + n, "mapping": mapping,
                "current_node": "a"}
    path = Path(folder) / "conversations.json"
    path.write_text(json.dumps([chat(n) for n in range(chats)]))
    return path


def vm_steps(store: Any, action: Callable[[], Any], every: int = 1000) -> tuple[int, Any]:
    """(SQLite virtual-machine steps ``action`` took on ``store``'s connection, counted in
    ``every``s, and what it returned): work counted, never timed."""
    calls = [0]

    def tick() -> int:
        calls[0] += 1
        return 0

    store.conn.set_progress_handler(tick, every)
    try:
        result = action()
    finally:
        store.conn.set_progress_handler(None, 0)
    return calls[0] * every, result


def finished_within(call: Callable[[], Any], seconds: float) -> tuple[bool, Any]:
    """``call()`` in a daemon thread, waited for up to ``seconds``: (whether it finished,
    its result or the exception it raised). A call that never ends is a False, not a hung
    test run (the bound is generous: a slow machine never fails it)."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    return not worker.is_alive(), (outcome[0] if outcome else None)
