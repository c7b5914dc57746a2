"""The tools against a second audit's hostile inputs: a command's background jobs and
detached processes, paths that name an unknown user or a name too long for the system, a
search pointed at a pipe, a reply that makes more tool calls than any reply may, and the
shell's time limit as a setting."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from iris_desktop.core.config import AgentConfig, ContextParams, ToolsConfig
from iris_desktop.core.events import ToolFinished, TurnDone, TurnFailed
from iris_desktop.core.planner import Planner
from iris_desktop.core.tools import Sandbox
from iris_desktop.host import build_agent
from iris_desktop.runtime.remote.sse import MAX_STREAMED_CALLS as MAX_REPLY_CALLS
from iris_desktop.settings import SETTINGS, SettingsError, defaults

from support.fakes import ScriptedRuntime
from support.helpers import tool_ok, tool_refused

POSIX = os.name == "posix"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "root"
    folder.mkdir()
    (folder / "notes.txt").write_text("hello\nneedle here\n", encoding="utf-8")
    return folder


def _shell(root: Path, timeout_s: float = 60.0) -> Sandbox:
    return Sandbox([root], enabled=["run_shell"], shell=True, confirm_shell=lambda _: True,
                   shell_timeout_s=timeout_s)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, killed and not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def _kill(pid: int) -> None:
    """Clean up what a test started (on the code before the fix it ran on)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _pid_in(content: str) -> int:
    return int(content.split("stdout:\n", 1)[1].split()[0])


@pytest.mark.skipif(not POSIX, reason="uses sleep and process groups")
def test_a_job_left_in_the_background_ends_with_the_command(root: Path) -> None:
    """Before (an audit): ``sleep 4242 >/dev/null 2>&1 & echo started`` came back "ok" at
    once and the sleep ran on in the command's process group, after README's "Stop ends a
    running command and everything it started". Now: the group is killed once the shell
    has ended."""
    started = time.monotonic()
    content = tool_ok(_shell(root).run(
        "run_shell", {"command": "sleep 300 >/dev/null 2>&1 & echo $!"}))
    pid = _pid_in(content)
    try:
        # it did not wait for the job either (300 s, or the 60 s limit): a ceiling no slow
        # machine reaches for an echo
        assert time.monotonic() - started < 30
        deadline = time.monotonic() + 30  # the kill was sent: only its reaping is waited
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid)
    finally:
        _kill(pid)


@pytest.mark.skipif(not POSIX or shutil.which("setsid") is None,
                    reason="uses setsid and process groups")
def test_a_detached_process_is_said_and_the_call_ends_at_its_time(root: Path) -> None:
    """Before (an audit): ``setsid sleep 4243 & echo escaped`` with a 5 s limit came back
    after 15 s (5 s more for each pipe it held), saying "timed out after 5 s and was
    stopped" while the sleep ran on. Now: back within the limit and a short grace, saying
    that a process it detached may still run."""
    started = time.monotonic()
    content = tool_refused(_shell(root, timeout_s=1).run(
        "run_shell", {"command": "setsid sleep 300 & echo $!"}))
    pid = _pid_in(content)
    try:
        # before, 11 s (5 s more for each of the two pipes): a ceiling well under that
        assert time.monotonic() - started < 9
        first = content.splitlines()[0]
        assert first == ("error: command timed out after 1 s and was stopped; a process it "
                         "detached may still run: setsid sleep 300 & echo $!")
    finally:
        _kill(pid)


@pytest.mark.skipif(not POSIX, reason="~user names a user on POSIX systems only")
def test_an_unknown_user_s_home_is_named_as_such(root: Path) -> None:
    """Before (an audit): ``~nosuchuser/x`` was "it is a loop of links" (expanduser's
    error was taken for resolve()'s). Now: its own sentence."""
    box = Sandbox([root], enabled=["read_file", "list_directory", "search_files"])
    for name, arguments in (("read_file", {"path": "~nosuchuser-iris/x"}),
                            ("list_directory", {"path": "~nosuchuser-iris"}),
                            ("search_files", {"pattern": "x", "path": "~nosuchuser-iris"})):
        content = tool_refused(box.run(name, arguments))
        assert "the user 'nosuchuser-iris' is not known here" in content, content
        assert "loop of links" not in content


@pytest.mark.skipif(not POSIX, reason="the limit on a name's length differs on Windows")
def test_a_name_too_long_is_said_in_the_tools_words(root: Path) -> None:
    """Before (an audit): a 300-character name was "read_file failed: OSError: [Errno 36]
    File name too long: '/the/full/path…'" (the fallback for a bug in a tool). Now: the
    sentence other unresolvable paths get."""
    box = Sandbox([root], enabled=["read_file", "list_directory", "search_files"])
    long = "a" * 300
    for name, arguments in (("read_file", {"path": long}), ("list_directory", {"path": long}),
                            ("search_files", {"pattern": "x", "path": long})):
        content = tool_refused(box.run(name, arguments))
        assert content == f"error: cannot resolve path {long!r}: File name too long", content


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_search_pointed_at_a_pipe_says_it_was_not_searched(root: Path) -> None:
    """Before (an audit): ``search_files {"path": "fifo"}`` answered "0 matches", the pipe
    left out unsaid. Now: said not a regular file, as read_file says; a folder that holds
    one is still searched."""
    os.mkfifo(root / "fifo")
    box = Sandbox([root], enabled=["read_file", "search_files"])
    content = tool_refused(box.run("search_files", {"pattern": "x", "path": "fifo"}))
    assert content == "error: fifo is not a regular file; not searched"
    assert "not a regular file" in tool_refused(box.run("read_file", {"path": "fifo"}))
    assert "notes.txt:2: needle here" in tool_ok(box.run("search_files", {"pattern": "needle"}))


def _call(name: str, **arguments) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


def test_a_reply_with_more_calls_than_any_reply_may_make_runs_none(fresh_store, root) -> None:
    """Before (an audit): calls a local model wrote as text had no bound: each became a
    stored tool row ("limit reached" past tools.max_calls_per_turn), 50,000 calls 50,000
    rows, while a server's streamed calls were held to 64 a reply. Now: the same bound,
    the reply kept as text, no call stored or run, and one sentence."""
    reply = "".join(_call("list_directory", path=".") for _ in range(MAX_REPLY_CALLS + 1))
    runtime = ScriptedRuntime([reply, "never asked"])
    planner = Planner(ContextParams(window=1 << 16, system_prompt="You are Iris."),
                      runtime.counter(), runtime=runtime, agent=AgentConfig(),
                      tools=ToolsConfig(allowed_paths=(str(root),)))
    agent = build_agent(planner, fresh_store, compact=False)
    thread = fresh_store.create_thread("t")
    events = list(agent.send(thread, "look around"))
    assert not [e for e in events if isinstance(e, ToolFinished)]
    failed = [e for e in events if isinstance(e, TurnFailed)]
    assert len(failed) == 1
    assert failed[0].text.startswith(f"The model wrote more than {MAX_REPLY_CALLS} tool calls")
    assert isinstance(events[-1], TurnDone) and events[-1].finish_reason == "error"
    rows = fresh_store.messages(thread)
    assert [r["role"] for r in rows] == ["user", "assistant"]
    assert not rows[-1].get("tool_calls") and rows[-1]["content"] == reply
    assert len(runtime.requests) == 1


@pytest.mark.skipif(not POSIX, reason="uses sleep")
def test_the_shell_time_limit_is_a_setting(root: Path) -> None:
    """Before (an audit): run_shell's 60 s limit was fixed, in no setting and no document.
    Now: ``tools.shell_timeout_s`` (1 to 3600 seconds), passed through
    ``Sandbox.from_config``."""
    setting = SETTINGS["tools.shell_timeout_s"]
    assert defaults()["tools.shell_timeout_s"] == 60
    assert setting.parse("5") == 5
    with pytest.raises(SettingsError, match="from 1 to 3,600"):
        setting.parse("0")
    config = SimpleNamespace(allowed_paths=[str(root)], enabled=["run_shell"], shell=True,
                             shell_timeout_s=0.5)
    box = Sandbox.from_config(config, confirm_shell=lambda _: True)
    content = tool_refused(box.run("run_shell", {"command": "sleep 5"}))
    assert content.startswith("error: command timed out after 0.5 s and was stopped")
    # the settings reach the sandbox the host builds (a ToolsConfig from the settings)
    from iris_desktop.core.config import ToolsConfig

    tools = ToolsConfig.from_settings(defaults().with_overrides({"tools.shell_timeout_s": "7"}))
    assert tools.shell_timeout_s == 7
    assert Sandbox.from_config(tools)._timeout == 7
