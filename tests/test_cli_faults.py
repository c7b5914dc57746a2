"""Faults around the CLI: settings files that are not what they seem, failures that must
read as one sentence (no traceback on stderr), and a reader of stdout that leaves.

Everything runs the real CLI, mostly as a subprocess (a hang shows as a timeout, and
what Python itself prints at exit is seen), on real files and the real bundled model;
the failing server is a real HTTP server on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import tracemalloc
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from iris_desktop.settings import (
    MAX_CONFIG_BYTES,
    SettingsError,
    load_settings,
    reset_config,
    write_config_value,
)

from conftest import SYNTHETIC_CHAT

REPO = Path(__file__).resolve().parents[1]
#: every command's deadline: a settings file must never make one wait
PROMPT_S = 60
DEEP_ARRAY = "a = " + "[" * 100_000
LONG_DOTTED_KEY = ".".join(["a"] * 20_000) + " = 1\n"


def iris(data: Path, *args: str, timeout: float = PROMPT_S, env: dict | None = None,
         **options) -> subprocess.CompletedProcess:
    """``iris-desktop --data-dir DATA ARGS`` as a subprocess, its output captured."""
    return subprocess.run([sys.executable, "-m", "iris_desktop", "--data-dir", str(data), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env={**os.environ, **(env or {})}, **options)


def no_traceback(err: str) -> bool:
    return "Traceback" not in err and "Exception ignored" not in err


def one_sentence(err: str) -> bool:
    """One line on stderr from the CLI, no traceback."""
    return err.count("\n") == 1 and err.startswith("iris-desktop: ") and no_traceback(err)


# -- settings files that are not what they seem ---------------------------------------------


def test_a_fifo_named_config_toml_never_blocks_a_command(tmp_path):
    """A named pipe where config.toml should be: every command reads no settings from it
    (nothing is waited for), says so in one sentence, and uses the defaults; ``config
    set`` and ``config reset`` refuse and leave the pipe alone."""
    data = tmp_path / "home"
    data.mkdir()
    fifo = data / "config.toml"
    os.mkfifo(fifo)
    for args in (["threads", "--no-model"], ["config", "list"],
                 ["config", "get", "context.window"], ["context", "1", "--no-model"]):
        started = time.monotonic()
        done = iris(data, *args)
        assert time.monotonic() - started < PROMPT_S
        warning = [line for line in done.stderr.splitlines() if "config.toml" in line]
        assert len(warning) == 1 and "named pipe (FIFO), not a regular file" in warning[0], done.stderr
        assert "using the defaults" in warning[0] and no_traceback(done.stderr)
        assert done.returncode == (2 if args[0] == "context" else 0), done.stderr  # no thread 1
    assert iris(data, "config", "get", "context.window").stdout.strip() == "auto"
    for args in (["config", "set", "context.window", "4096"], ["config", "reset", "context.window"],
                 ["config", "reset"]):
        done = iris(data, *args)
        assert done.returncode == 2 and one_sentence(done.stderr), done.stderr
        assert "named pipe (FIFO), not a regular file" in done.stderr
        assert "fix or remove it" in done.stderr
    assert fifo.is_fifo()


def test_a_folder_named_config_toml_is_refused_in_one_sentence(tmp_path):
    data = tmp_path / "home"
    (data / "config.toml").mkdir(parents=True)
    settings = load_settings(data / "config.toml", {})
    assert settings["context.window"] == "auto"
    assert "is a folder, not a regular file" in settings.problems[0]
    with pytest.raises(SettingsError, match="a folder, not a regular file"):
        write_config_value(data / "config.toml", "context.window", "4096")
    with pytest.raises(SettingsError, match="a folder, not a regular file"):
        reset_config(data / "config.toml")


def test_a_huge_config_toml_is_refused_without_reading_it(tmp_path):
    """A 50 MB settings file: refused from its size (never read into memory, by load or
    by ``config set``), the defaults used, the file left as it was."""
    cfg = tmp_path / "config.toml"
    with cfg.open("wb") as handle:
        handle.write(b"[context]\nwindow = 4096\n")
        handle.truncate(50 * 2**20)
    tracemalloc.start()
    try:
        settings = load_settings(cfg, {})
        with pytest.raises(SettingsError) as refused:
            write_config_value(cfg, "context.window", "2048")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, f"{peak:,} bytes held to refuse a 50 MB file"
    assert settings["context.window"] == "auto"
    assert f"a settings file may have at most {MAX_CONFIG_BYTES:,} bytes" in settings.problems[0] \
        or f"than the {MAX_CONFIG_BYTES:,} bytes a settings file may have" in settings.problems[0]
    assert "52,428,800" in settings.problems[0]
    assert "larger" in str(refused.value) and "fix or remove it" in str(refused.value)
    assert cfg.stat().st_size == 50 * 2**20
    # just under the limit is read; one byte over is not
    cfg.write_bytes(b"[context]\nwindow = 4096\n".ljust(MAX_CONFIG_BYTES, b"\n"))
    assert load_settings(cfg, {})["context.window"] == 4096
    cfg.write_bytes(b"[context]\nwindow = 4096\n".ljust(MAX_CONFIG_BYTES + 1, b"\n"))
    assert load_settings(cfg, {})["context.window"] == "auto"


@pytest.mark.parametrize("text", [DEEP_ARRAY, "a = " + "{b = " * 100_000, "[" + LONG_DOTTED_KEY[:-5] + "]\n",
                                  LONG_DOTTED_KEY], ids=["array", "inline-table", "table", "dotted-key"])
def test_a_deeply_nested_config_toml_is_refused_at_once(tmp_path, text):
    """100,000 nested brackets (Python's TOML parsers recurse once per level) or a dotted
    key of 20,000 parts (quadratic time and memory in tomllib) are refused before any
    parser runs, in a moment; ``config set`` refuses too and writes nothing."""
    cfg = tmp_path / "config.toml"
    cfg.write_text(text)
    started = time.monotonic()
    settings = load_settings(cfg, {})
    with pytest.raises(SettingsError) as refused:
        write_config_value(cfg, "context.window", "2048")
    assert time.monotonic() - started < 5
    assert "more than 32 levels deep" in settings.problems[0], settings.problems
    assert "more than 32 levels deep" in str(refused.value)
    assert cfg.read_text() == text


def test_a_deep_config_toml_gives_every_command_one_warning_not_a_traceback(tmp_path):
    data = tmp_path / "home"
    data.mkdir()
    (data / "config.toml").write_text(DEEP_ARRAY)
    done = iris(data, "threads", "--no-model")
    assert done.returncode == 0 and no_traceback(done.stderr), done.stderr
    assert done.stderr.count("\n") == 1 and "levels deep" in done.stderr
    done = iris(data, "config", "set", "context.window", "4096")
    assert done.returncode == 2 and one_sentence(done.stderr), done.stderr


def test_settings_files_as_people_write_them_still_load(tmp_path):
    """The depth check reads strings and comments as TOML does: dots, brackets and quotes
    inside them are text."""
    cfg = tmp_path / "config.toml"
    prompt = "Be brief. " * 100 + "[[[[ {{{{ a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q.r.s.t.u.v.w.x.y.z.1.2.3.4.5.6.7"
    cfg.write_text(
        "# a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q.r.s.t.u.v.w.x.y.z.1.2.3.4.5.6.7.8 [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\n"
        "[context]\nwindow = 4096\ntoken_budget_ratio = 0.8\n"
        f'[chat]\nsystem_prompt = """{prompt}\n"quoted" and \\""" too"""\n'
        "[tools]\nallowed_paths = ['/a/b.c/d.e', \"C:\\\\x.y\\\\z\"]\n"
        '[model]\n"temperature" = 0.5\n')
    settings = load_settings(cfg, {})
    assert settings.problems == []
    assert settings["context.window"] == 4096 and settings["model.temperature"] == 0.5
    assert settings["chat.system_prompt"].startswith("Be brief.")
    assert settings["tools.allowed_paths"] == ["/a/b.c/d.e", "C:\\x.y\\z"]
    write_config_value(cfg, "context.window", "2048")  # edited in place, the rest kept
    assert load_settings(cfg, {})["chat.system_prompt"] == settings["chat.system_prompt"]


def test_a_deeply_nested_list_in_the_environment_is_one_problem(tmp_path):
    settings = load_settings(None, {"IRIS_TOOLS_ENABLED": "[" * 100_000})
    assert settings["tools.enabled"] == ["read_file", "list_directory", "search_files"]
    (problem,) = settings.problems
    assert "IRIS_TOOLS_ENABLED" in problem and "nested too deeply" in problem
    assert len(problem) < 400  # the value is shown cut, not 100,000 brackets


# -- failures read as one sentence ----------------------------------------------------------


class _FailingServer:
    """An OpenAI-compatible server on 127.0.0.1 that lists a model and answers the
    calibration request, then fails every streamed reply with HTTP 500."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": "failing-1", "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if self.path != "/v1/chat/completions":
                    self._send(404, {"error": {"message": "not found"}})
                elif body.get("stream"):
                    self._send(500, {"error": {"message": "the model crashed"}})
                else:
                    self._send(200, {"choices": [{"index": 0, "finish_reason": "stop",
                                                  "message": {"role": "assistant", "content": "ok"}}],
                                     "usage": {"prompt_tokens": 20, "completion_tokens": 1}})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _FailingServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_server_failing_mid_turn_is_one_sentence_and_the_traceback_is_in_the_log(tmp_path):
    """The agent logs the failure with its traceback: that goes to the data dir's log
    file, never to stderr, where the user reads one sentence (``-v`` shows the log)."""
    data = tmp_path / "home"
    with _FailingServer() as server:
        settings = ["--set", "model.backend=openai", "--set", f"model.base_url={server.base_url}"]
        done = iris(data, *settings, "chat", "hello")
        verbose = iris(data, "-v", *settings, "chat", "hello again")
    assert done.returncode == 1, done.stderr
    # one sentence, then the thread the message was stored in
    lines = [line for line in done.stderr.splitlines() if line.strip() and line != "[thread 1]"]
    assert len(lines) == 1 and lines[0].startswith("iris-desktop: "), done.stderr
    assert "HTTP 500: the model crashed" in lines[0]
    assert no_traceback(done.stderr)
    log = (data / "logs" / "iris.log").read_text()
    assert "Traceback" in log and "generation failed" in log
    assert (data / "logs" / "iris.log").stat().st_mode & 0o777 == 0o600
    assert verbose.returncode == 1 and "Traceback" in verbose.stderr


def test_a_server_that_is_not_there_and_a_model_that_does_not_load_are_one_sentence(tmp_path):
    data = tmp_path / "home"
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"garbage, not a GGUF file")
    done = iris(data, "chat", "--model", str(bad), "hello")
    assert done.returncode == 1 and one_sentence(done.stderr), done.stderr
    assert "cannot load the model" in done.stderr and "not a GGUF file" in done.stderr
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = iris(data, "--set", "model.backend=openai",
                "--set", f"model.base_url=http://127.0.0.1:{port}/v1", "chat", "hello")
    assert done.returncode == 1 and one_sentence(done.stderr), done.stderr
    assert "cannot use the server" in done.stderr


def test_a_bug_is_one_sentence_naming_the_log(tmp_path, monkeypatch, capsys):
    """An exception nobody expected (a bug) still ends as one sentence that says it is a
    bug and where the traceback is, with exit code 1."""
    from iris_desktop import commands
    from iris_desktop.cli import main

    def broken(args, overrides):
        return {}["missing"]

    monkeypatch.setitem(commands.COMMANDS, "threads", broken)
    assert main(["--data-dir", str(tmp_path / "home"), "threads"]) == 1
    err = capsys.readouterr().err
    assert one_sentence(err) and "a bug in Iris" in err and "KeyError" in err
    assert str(tmp_path / "home" / "logs" / "iris.log") in err
    assert "Traceback" in (tmp_path / "home" / "logs" / "iris.log").read_text()


def test_an_unexpected_error_in_a_turn_names_itself_as_a_bug(tmp_path):
    from iris_desktop.host import plain_reason

    assert plain_reason(KeyError("content")) == "an internal error in Iris (KeyError: 'content')"
    text = plain_reason(AttributeError("'str' object has no attribute 'get'"), tmp_path / "iris.log")
    assert text.startswith("an internal error in Iris (AttributeError:") and str(tmp_path) in text
    assert plain_reason(OSError(28, "No space left on device", "/x/iris.db")) == \
        "No space left on device (/x/iris.db)"
    assert plain_reason(RuntimeError("no model is loaded")) == "no model is loaded"


# -- a reader of stdout that leaves -----------------------------------------------------------


def _read_then_close(command: list[str], n_bytes: int, timeout: float = 300) -> tuple[bytes, int, str]:
    """Run ``command``, read ``n_bytes`` of its stdout and close the pipe (``| head -c``);
    return what was read, its exit code and its stderr."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO) as process:
        shown = process.stdout.read(n_bytes)
        process.stdout.close()
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        err = process.stderr.read().decode()
    return shown, code, err


def _replies(db: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT content, status FROM messages WHERE role = 'assistant' "
                            "ORDER BY id").fetchall()


def test_a_closed_stdout_stops_a_streaming_chat_quietly_and_saves_the_reply(tmp_path, model_path):
    """``iris-desktop chat … | head -c 10``: the reply stops as Stop stops it (no more is
    generated), it is saved as far as it was generated and not left "streaming", and
    nothing but the model's text was written: exit 0, stderr empty."""
    data = tmp_path / "home"
    command = [sys.executable, "-m", "iris_desktop", "--data-dir", str(data),
               "--set", "model.temperature=0", "--set", "model.max_tokens=400", "chat",
               "--model", str(model_path), "Count from 1 to 200, separated by spaces."]
    shown, code, err = _read_then_close(command, 10)
    assert code == 0 and err == "", err
    (content, status), = _replies(data / "iris.db")
    assert status == "interrupted", (status, content)
    assert content.startswith(shown.decode()) and len(content) < 400, content
    assert content.split()[-1] != "200"  # stopped, not generated to the end


def test_a_closed_stdout_ends_chat_json_and_context_json_quietly(tmp_path, model_path):
    data = tmp_path / "home"
    base = [sys.executable, "-m", "iris_desktop", "--data-dir", str(data)]
    history = tmp_path / "long.json"
    history.write_text(json.dumps([{"role": ("user", "assistant")[i % 2],
                                    "content": f"message {i}: " + "words " * 700} for i in range(100)]))
    assert iris(data, "import", str(history)).returncode == 0
    # a report (400 KB) much larger than a pipe's buffer: the writer meets the closed pipe
    shown, code, err = _read_then_close([*base, "--set", "context.window=262144", "context", "1",
                                         "--json", "--no-model", "--show-request"], 10)
    assert shown == b'{\n  "threa' and code == 0 and err == "", err
    shown, code, err = _read_then_close([*base, "--set", "model.temperature=0",
                                         "--set", "model.max_tokens=8", "chat", "--model",
                                         str(model_path), "--json", "Say hi."], 10)
    assert shown == b'{\n  "threa' and code == 0, err
    assert no_traceback(err), err
    assert all(status != "streaming" for _, status in _replies(data / "iris.db"))


@pytest.mark.skipif(os.name != "posix", reason="sends itself SIGINT")
def test_ctrl_c_during_compact_stops_the_models_summary_as_stop_does(tmp_path, capsys, monkeypatch):
    """Before (an audit): `compact` took no Ctrl+C of its own: Python's KeyboardInterrupt
    was raised inside llama.cpp's abort callback, which printed a traceback and swallowed
    it, and the model's summary ran on for minutes. Now Ctrl+C stops it as Stop does (the
    extractive summary is used) and a second one interrupts for real. The compaction is
    the host's own, Stop included (test_compaction.py); here, that `compact` hands it
    the Ctrl+C."""
    import signal

    from iris_desktop.cli import main as cli_main
    from iris_desktop.core.events import CompactionEvent, CompactionFinished
    from iris_desktop.host import Host

    data = tmp_path / "home"
    assert cli_main(["--data-dir", str(data), "import", str(SYNTHETIC_CHAT)]) == 0
    seen = {}

    def compacting(self, thread_id, cancel=None, **_):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl+C while the model writes the summary
        seen["stopped"] = cancel is not None and cancel.is_set()
        yield CompactionFinished(thread_id, CompactionEvent(
            "manual", "ok", "extractive", 3, 6, 900, 300, 2, 120, 1.0,
            error="the model's summary could not be used (stopped by the user); one made of the "
                  "chat's own sentences was used instead",
            first_turn=1, last_turn=3))

    monkeypatch.setattr(Host, "compact", compacting)
    capsys.readouterr()
    code = cli_main(["--data-dir", str(data), "compact", "1", "--no-model"])
    out, err = capsys.readouterr()
    assert seen == {"stopped": True}
    assert code == 0 and "compacted (manual, extractive)" in out and "[stopping…]" in err
    assert "Traceback" not in err
