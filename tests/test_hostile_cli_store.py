"""Hostile places around the CLI, the history and a server (the s66 audit): a stdout on a
full disk, a history path that is a folder / a symbolic link loop / a named pipe, a reply
the server's content filter cut, a Content-Length that lies, a 401 with no key set, a
data folder that cannot be resolved, a log that is a named pipe, ``recover`` of a file
that is no database, and the import help.

Each is run for real: the CLI as a subprocess (a hang is a timeout, and what Python
prints at exit is seen) or in-process, real files, named pipes and folders, a real
loopback HTTP server, ``/dev/full`` and (where mounting is allowed) a real full tmpfs.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from support.faults import full_disk
from support.helpers import one_sentence, run_cli
from support.misbehaving_server import MisbehavingServer

REPO = Path(__file__).resolve().parents[1]
IRIS = [sys.executable, "-m", "iris_desktop"]
#: a command's deadline: none of these may wait (a named pipe), and none needs this long
DEADLINE_S = 300


def iris(home: Path, *args: str, stdout=subprocess.PIPE, timeout: float = DEADLINE_S):
    return subprocess.run(IRIS + list(args), stdout=stdout, stderr=subprocess.PIPE, text=True,
                          timeout=timeout, cwd=REPO, env={**os.environ, "IRIS_HOME": str(home)})


def server_settings(url: str) -> list[str]:
    return ["--set", "model.backend=openai", "--set", f"model.base_url={url}"]


def last_reply(home: Path, settings: list[str], thread: int = 1) -> dict:
    done = iris(home, *settings, "export", str(thread))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["messages"][-1]


def no_bug(err: str) -> bool:
    return ("this is a bug" not in err and "Traceback" not in err
            and "Exception ignored" not in err)


# -- A. stdout on a full disk: the reply is saved whole, and said so -------------------------


def test_a_reply_written_to_dev_full_is_saved_whole_and_said_so(tmp_path):
    home = tmp_path / "home"
    with MisbehavingServer("normal", tokens=["Hello", ",", " world"]) as server:
        settings = server_settings(server.base_url)
        with open("/dev/full", "w") as full:
            done = iris(home, *settings, "chat", "hello", stdout=full)
        assert done.returncode == 1, done.stderr
        assert no_bug(done.stderr), done.stderr
        assert ("iris-desktop: could not write the reply to standard output (No space left "
                "on device); it is saved in thread 1") in done.stderr
        reply = last_reply(home, settings)
    assert reply["content"] == "Hello, world", reply  # before: "" and "interrupted"
    assert reply.get("status") is None, reply


def test_a_reply_written_to_a_full_file_system_is_saved_whole(tmp_path):
    home = tmp_path / "home"
    with MisbehavingServer("normal", tokens=["Hello", ",", " world"]) as server, \
            full_disk(tmp_path, "1m") as disk:
        settings = server_settings(server.base_url)
        with open(disk.path / "reply.txt", "w") as out:
            disk.fill()
            done = iris(home, *settings, "chat", "hello", stdout=out)
        assert done.returncode == 1 and no_bug(done.stderr), done.stderr
        assert "could not write the reply to standard output (No space left on device)" \
            in done.stderr
        assert last_reply(home, settings)["content"] == "Hello, world"


@pytest.mark.parametrize("args", [["threads", "--no-model", "--json"], ["export", "1"],
                                  ["context", "1", "--no-model", "--json"]])
def test_any_command_whose_stdout_is_full_says_so_in_one_sentence(tmp_path, capsys, args):
    home = tmp_path / "home"
    os.environ["IRIS_HOME"] = str(home)  # (the clean_env fixture sets it back)
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps([{"role": "user", "content": "hi"},
                                {"role": "assistant", "content": "hello " * 3000}]))
    code, _out, err = run_cli(capsys, "import", chat)
    assert code == 0, err
    with open("/dev/full", "w") as full:
        done = iris(home, *args, stdout=full)
    assert done.returncode == 1, done.stderr
    assert done.stderr.endswith("iris-desktop: could not write to standard output (No space "
                                "left on device)\n"), done.stderr
    assert no_bug(done.stderr), done.stderr


@pytest.mark.parametrize("args", [["--help"], ["threads", "--help"], ["--version"]])
def test_help_and_version_on_a_full_stdout_say_so(tmp_path, args):
    """argparse drops its own write errors: ``--help > /dev/full`` said nothing, exit 0."""
    with open("/dev/full", "w") as full:
        done = iris(tmp_path / "home", *args, stdout=full)
    assert done.returncode == 1, done.stderr
    assert done.stderr == ("iris-desktop: could not write to standard output (No space "
                           "left on device)\n"), done.stderr


def test_help_to_a_reader_that_left_is_quiet(tmp_path):
    reader = subprocess.Popen([sys.executable, "-m", "iris_desktop", "--help"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
                              env={**os.environ, "IRIS_HOME": str(tmp_path / "home")})
    reader.stdout.close()  # like `| head -0`: the reader is gone before the help is written
    _out, err = reader.communicate(timeout=60)
    assert reader.returncode in (0, 1) and no_bug(err.decode()), err


# -- B. the history's place holds a folder, a loop, a named pipe -----------------------------


def _place(home: Path, kind: str) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    db = home / "iris.db"
    if kind == "folder":
        db.mkdir()
    elif kind == "loop":
        db.symlink_to("iris.db")
    else:
        os.mkfifo(db)
    return db


@pytest.mark.parametrize("kind, said", [("folder", "is a folder, not a database"),
                                        ("loop", "is a symbolic link that loops"),
                                        ("fifo", "is a named pipe (FIFO), not a database")])
def test_a_history_path_that_holds_no_file_is_one_sentence(tmp_path, kind, said):
    home = tmp_path / "home"
    db = _place(home, kind)
    try:
        done = iris(home, "threads", "--no-model", timeout=120)  # a pipe waited for ever
    except subprocess.TimeoutExpired:
        pytest.fail("a named pipe in the history's place held the command")
    assert done.returncode == 1, done.stderr
    assert one_sentence(done.stderr) and no_bug(done.stderr), done.stderr
    assert f"the history {db} {said}" in done.stderr
    assert "move it away and start again" in done.stderr


def test_the_window_says_a_folder_in_the_historys_place_in_its_dialog(qtbot, tmp_path,
                                                                      monkeypatch):
    from support.windows import run_gui_recording

    data = tmp_path / "data"
    _place(data, "folder")
    shown = run_gui_recording(monkeypatch, data, titles=True)  # before: IsADirectoryError
    assert len(shown) == 1, shown
    kind, title, text = shown[0]
    assert (kind, title) == ("critical", "Iris Desktop cannot start")
    assert text == (f"the history {data / 'iris.db'} is a folder, not a database; move it "
                    "away and start again")


# -- C. a reply the server's content filter cut ----------------------------------------------


class _Server:
    """A loopback OpenAI-compatible server: ``/v1/models`` answered by ``models`` (a
    callable on the handler), a streamed reply of one delta and then ``finish``."""

    def __init__(self, finish: str = "stop", models=None, status: int = 200):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _json(self, code, value):
                body = json.dumps(value).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if status != 200:
                    return self._json(status, {"error": {"message": "Incorrect API key"}})
                if self.path == "/v1/models":
                    if models is not None:
                        return models(self)
                    return self._json(200, {"data": [{"id": "f", "context_length": 8192}]})
                self._json(404, {"error": {"message": "no"}})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if status != 200:
                    return self._json(status, {"error": {"message": "Incorrect API key"}})
                if not body.get("stream"):
                    return self._json(200, {"choices": [{"index": 0, "message": {
                        "role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 10, "completion_tokens": 1}})
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for event in ({"choices": [{"index": 0, "delta": {"content": "The first half"}}]},
                              {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}):
                    self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                self.wfile.write(b"data: [DONE]\n\n")
                outer.streamed += 1

        self.streamed = 0
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def _finish_reasons(home: Path) -> list[str]:
    with sqlite3.connect(home / "iris.db") as conn:
        return [row[0] for row in conn.execute("SELECT finish_reason FROM requests ORDER BY id")]


def test_a_reply_the_servers_content_filter_cut_is_said_and_not_stored_as_finished(capsys):
    home = Path(os.environ["IRIS_HOME"])
    with _Server("content_filter") as server:
        code, out, err = run_cli(capsys, *server_settings(server.base_url), "chat", "hello")
    assert code == 0, err
    assert out == "The first half\n"
    assert "[cut off: the server's content filter stopped the reply]" in err, err
    assert _finish_reasons(home)[-1] == "content_filter"  # before: "stop", as if finished


def test_a_reply_that_ends_on_its_own_is_no_cut_off(capsys):
    home = Path(os.environ["IRIS_HOME"])
    with _Server("stop") as server:
        code, _out, err = run_cli(capsys, *server_settings(server.base_url), "chat", "hello")
    assert code == 0 and "cut off" not in err and "filter" not in err, err
    assert _finish_reasons(home)[-1] == "stop"


# -- D. a Content-Length that lies, a 401 without a key ------------------------------------


def test_a_content_length_that_lies_is_said_as_announced_not_as_sent():
    from iris_desktop.runtime.errors import ServerError
    from iris_desktop.runtime.remote import RemoteRuntime

    def liar(handler):
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", "2000000000")
        handler.end_headers()
        handler.wfile.write(b'{"object":"list","data":[{"id":"h","object":"model"}]}')
        handler.wfile.flush()
        handler.close_connection = True

    with _Server(models=liar) as server, pytest.raises(ServerError) as caught:
        RemoteRuntime.connect(server.base_url)
    said = str(caught.value)
    assert "announced an answer of 1.9 GiB (Content-Length)" in said, said
    assert "more than the 8 MiB Iris reads" in said and "sent more than" not in said


def test_a_401_without_an_api_key_says_one_is_needed_and_where_it_goes():
    from iris_desktop.runtime.errors import ServerError
    from iris_desktop.runtime.remote import RemoteRuntime

    with _Server(status=401) as server:
        with pytest.raises(ServerError) as caught:
            RemoteRuntime.connect(server.base_url)
        said = str(caught.value)
        assert "needs an API key and none is set (HTTP 401)" in said, said
        assert "Model ▸ Server…" in said and "refused" not in said
        with pytest.raises(ServerError) as caught:
            RemoteRuntime.connect(server.base_url, api_key="wrong")
        assert "refused the API key (HTTP 401)" in str(caught.value)


# -- D. a data folder that cannot be resolved, a log that is a named pipe -------------------


def test_a_data_folder_on_a_symlink_loop_is_one_sentence(tmp_path, capsys):
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    code, _out, err = run_cli(capsys, "--data-dir", tmp_path / "a" / "x", "threads", "--no-model")
    assert code == 1 and one_sentence(err) and no_bug(err), err  # before: two tracebacks
    assert err.startswith(f"iris-desktop: cannot use the folder {tmp_path / 'a' / 'x'} (")


def test_a_data_folder_name_too_long_is_one_sentence(tmp_path, capsys):
    code, _out, err = run_cli(capsys, "--data-dir", tmp_path / ("a" * 256), "threads",
                              "--no-model")
    assert code == 1 and one_sentence(err) and no_bug(err), err  # before: "this is a bug"
    assert "(File name too long); choose another --data-dir" in err


def test_the_bug_sentence_never_raises_on_a_data_folder_it_cannot_resolve(tmp_path, capsys):
    import argparse

    from iris_desktop.cli import _bug

    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    args = argparse.Namespace(data_dir=str(tmp_path / "a" / "x"))
    assert _bug(args, ValueError("boom")) == 1
    err = capsys.readouterr().err
    assert "unexpected error (ValueError: boom)" in err and "the log file" in err


def test_a_log_that_is_a_named_pipe_holds_nothing_and_is_said_once(tmp_path, capsys):
    from iris_desktop.logfile import PrivateLogFile

    (tmp_path / "logs").mkdir()
    fifo = tmp_path / "logs" / "iris.log"
    os.mkfifo(fifo)
    handler = PrivateLogFile(fifo)
    logger = logging.getLogger("iris.test.fifo")
    logger.addHandler(handler)
    logger.propagate = False
    worker = threading.Thread(target=lambda: [logger.warning("record %d", n) for n in range(3)],
                              daemon=True)
    try:
        worker.start()
        worker.join(60)
        held = worker.is_alive()
        if held:  # let the thread go: a reader opens the pipe
            os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
            worker.join(60)
    finally:
        logger.removeHandler(handler)
        handler.close()
    assert not held, "the log waited for a reader of a named pipe"
    err = capsys.readouterr().err
    assert err == (f"iris-desktop: warning: the log {fifo} is a named pipe (FIFO), not a "
                   "file; nothing is logged this run (move it away)\n")


def test_a_command_with_a_named_pipe_for_its_log_does_not_wait(tmp_path):
    home = tmp_path / "home"
    (home / "logs").mkdir(parents=True)
    os.mkfifo(home / "logs" / "iris.log")
    (home / "iris.db").mkdir()  # a failure that logs (its sentence, and the log's warning)
    try:
        done = iris(home, "threads", "--no-model", timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("a named pipe as the log held the command")
    assert done.returncode == 1 and no_bug(done.stderr), done.stderr
    assert "is a folder, not a database" in done.stderr


# -- D. recover of a file that is no database; E. the import help -----------------------------


def test_recover_of_a_text_file_says_it_is_no_set_aside_database(tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("notes " * 200)  # over one page: it looked like an encrypted database
    code, _out, err = run_cli(capsys, "recover", notes, "--yes")
    assert code == 1 and one_sentence(err), err
    assert f"{notes} is not a database Iris set aside" in err
    assert "is encrypted" not in err


def test_recover_of_a_short_text_file_is_refused_before_any_question(tmp_path, capsys):
    """A file under one page (a plain file's size) was met by "add --yes (nobody to ask)"
    or, on a terminal, by the question whether to put it back, and refused only after."""
    notes = tmp_path / "notes.txt"
    notes.write_text("hello\n")
    code, _out, err = run_cli(capsys, "recover", notes)  # no --yes, no terminal
    assert code == 1 and one_sentence(err), err
    assert f"{notes} is not a database Iris set aside" in err and "--yes" not in err


def test_the_import_help_names_every_format_that_imports(capsys, monkeypatch):
    from iris_desktop.cli import build_parser

    monkeypatch.setenv("COLUMNS", "1000")  # no name broken at its hyphen

    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    said = " ".join(capsys.readouterr().out.split())
    for name in ("LibreChat", "text-generation-webui", "BetterChatGPT", "SillyTavern",
                 "Gemini activity (MyActivity.json)"):
        assert name in said, name


def test_the_window_says_a_filtered_reply_was_cut_and_offers_no_continue():
    """The clause the window's status bar and the CLI share (``views.cut_off``): a reply a
    server's content filter cut is said so, without "Continue on the reply goes on" (a
    filtered reply is not one Continue takes up)."""
    from types import SimpleNamespace

    from iris_desktop.core.views import CONTENT_FILTERED, cut_off

    filtered = SimpleNamespace(finish_reason="content_filter", completion_tokens=2, prompt_tokens=9)
    assert cut_off(filtered, 512, 8192) == CONTENT_FILTERED == "the server's content filter stopped the reply"
    assert cut_off(SimpleNamespace(finish_reason="stop", completion_tokens=2, prompt_tokens=9), 512) is None


def test_a_model_hub_whose_content_length_lies_is_said_as_announced():
    """The hub's answers too (session 66: the server's were said so, the hub's still read
    "sent more than 8 MiB" of a 2-byte body that announced 2 GB)."""
    from iris_desktop.runtime.hub import HubClient, HubError

    from support.network import ScriptedSocketServer, http_answer

    class AnyQuery(dict):  # (the search's path holds its query)
        def get(self, path, default=None):
            return super().get(path.split("?")[0], default)

    answers = AnyQuery({"/api/models": http_answer("200 OK", b"[]", length=2_000_000_000)})
    with ScriptedSocketServer(answers) as hub, HubClient(hub.base_url.removesuffix("/v1")) as client, \
            pytest.raises(HubError) as caught:
        client.search("qwen")
    said = str(caught.value)
    assert "announced 1.9 GiB (Content-Length), more than the" in said and "sent more than" not in said, said
    with ScriptedSocketServer({}) as other, HubClient(other.base_url.removesuffix("/v1")) as client, \
            pytest.raises(HubError) as caught:  # a hub address that is no hub: its search is 404
        client.search("qwen")
    assert "answered HTTP 404 (Not Found) to the search for 'qwen'; check that models.hub_url is a " \
        "Hugging Face hub." in str(caught.value), str(caught.value)
