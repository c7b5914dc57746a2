"""A reply a server's content filter cut short is marked in the exports as the window
says it: the Markdown export heads it "(cut off: the server's content filter stopped
the reply)", the JSON export gives it ``"finish_reason": "content_filter"`` (OpenAI's
word, as a reply cut at its token cap gets ``"length"``), and importing that JSON keeps
the mark. The window's card says it too (before, only the status line said it, once, as
the turn ended; reopened, the reply looked finished). Before, both exports wrote the
reply as a finished one.

Real parts: the CLI against a real loopback HTTP server that streams the reply and then
finish reason "content_filter", a real data folder, the real window (offscreen)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from support.helpers import run_cli
from support.windows import settle

FILTERED_HEADING = "## Assistant (cut off: the server's content filter stopped the reply)"


class FilteringServer:
    """A loopback OpenAI-compatible server whose streamed reply is "The first half" and
    then finish reason ``content_filter``."""

    def __init__(self):
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, code: int, body: bytes, kind: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/v1/models":
                    return self._send(200, json.dumps({"data": [{"id": "f", "context_length": 8192}]})
                                      .encode(), "application/json")
                self._send(404, b"{}", "application/json")

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if not body.get("stream"):
                    return self._send(200, json.dumps({"choices": [{"index": 0, "message": {
                        "role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}).encode(),
                        "application/json")
                events = ({"choices": [{"index": 0, "delta": {"content": "The first half"}}]},
                          {"choices": [{"index": 0, "delta": {}, "finish_reason": "content_filter"}]})
                stream = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(stream + b"data: [DONE]\n\n")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.settings = ["--set", "model.backend=openai",
                         "--set", f"model.base_url=http://127.0.0.1:{self.httpd.server_address[1]}/v1"]

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def exported(capsys, data, fmt: str = "json") -> str:
    code, out, err = run_cli(capsys, "--data-dir", data, "export", "1", "--format", fmt)
    assert code == 0, err
    return out


def test_a_reply_the_content_filter_cut_is_marked_in_both_exports_and_kept_on_import(
        capsys, data_dir, tmp_path):
    with FilteringServer() as server:
        code, out, err = run_cli(capsys, "--data-dir", data_dir, *server.settings, "chat", "hello")
    assert code == 0 and out == "The first half\n", err
    assert "[cut off: the server's content filter stopped the reply]" in err  # as before
    markdown = exported(capsys, data_dir, "md")
    assert f"{FILTERED_HEADING}\n\nThe first half\n" in markdown, markdown  # before: "## Assistant"
    reply = json.loads(exported(capsys, data_dir))["messages"][-1]
    assert reply["content"] == "The first half"
    assert reply["finish_reason"] == "content_filter" and "status" not in reply, reply
    # Iris's own JSON export, imported: the mark stays, in both exports of the copy
    target = tmp_path / "chat.json"
    target.write_text(exported(capsys, data_dir))
    copy = tmp_path / "copy"
    code, out, err = run_cli(capsys, "--data-dir", copy, "import", target)
    assert (code, out.strip()) == (0, "1"), err
    assert json.loads(exported(capsys, copy))["messages"][-1]["finish_reason"] == "content_filter"
    assert FILTERED_HEADING in exported(capsys, copy, "md")
    # not a reply to go on with (the filter would cut it again): no Continue, as before
    code, _, err = run_cli(capsys, "--data-dir", copy, "--set", "model.backend=openai",
                           "--set", "model.base_url=http://127.0.0.1:9/v1", "chat",
                           "--thread", "1", "--continue")
    assert code != 0 and "continue" in err.lower(), err


def test_a_reply_that_ended_on_its_own_and_one_cut_at_its_cap_keep_their_marks(tmp_path):
    """The content filter's mark is one more finish reason: a finished reply gets none,
    one cut at its token cap "length" and "(cut off)" as before."""
    from iris_desktop.core.conversation import export_messages, markdown_export
    from iris_desktop.core.store import Store

    with Store(tmp_path / "a.db") as store:
        thread = store.create_thread("three replies")
        ids = {}
        for why in ("stop", "length", "content_filter"):
            store.add_message(thread, {"role": "user", "content": f"ask {why}"})
            ids[why] = store.add_message(thread, {"role": "assistant", "content": f"reply {why}"})
            store.add_request(thread, {"prompt_tokens": 5, "finish_reason": why,
                                       "reply_id": ids[why]})
        assert store.cut_off_replies(thread) == {ids["length"]: "length",
                                                 ids["content_filter"]: "content_filter"}
        replies = [m for m in export_messages(store, thread)["messages"] if m["role"] == "assistant"]
        assert [m.get("finish_reason") for m in replies] == [None, "length", "content_filter"]
        text = markdown_export(store, thread)
        assert text.count("## Assistant\n") == 1 and text.count("## Assistant (cut off)\n") == 1
        assert f"{FILTERED_HEADING}\n\nreply content_filter" in text
        assert store.filtered_replies(list(ids.values())) == {ids["content_filter"]}


def test_the_window_marks_the_reply_on_its_card_when_the_chat_is_opened_again(
        capsys, make_window, qtbot, data_dir, tmp_path):
    from iris_desktop.ui.transcript_parts import badges

    with FilteringServer() as server:
        code, _, err = run_cli(capsys, "--data-dir", data_dir, *server.settings, "chat", "hello")
    assert code == 0, err
    window = make_window()
    window.open_thread(1)
    settle(qtbot, window)
    qtbot.waitUntil(lambda: len(window.view.transcript.entries()) == 2, timeout=5_000)
    question, reply = window.view.transcript.entries()
    assert reply.filtered and not reply.can_continue
    assert ("cut off by the content filter", "warn") in badges(reply)  # before: no badge
    assert not question.filtered and badges(question) == []
