"""A reply imported from another app says which app it was written in, never "Iris".

Before (a newcomer audit): a Claude or ChatGPT export imported into the window showed
each imported reply under the heading "Iris" (``ROLE_LABELS``: assistant → "Iris" for a
message with no ``name``), so the window told the user that Iris wrote text it never
wrote, while the Markdown export said "Assistant". Now each imported reply carries the
app (``"imported_from"``, kept in the store's ``extra``): the window heads its card with
the app ("Claude", "ChatGPT", "Open WebUI", "LM Studio", "Jan"), the Markdown export says
"Assistant — imported from Claude", and the inspector's recalled messages name it too. A
reply Iris writes in the imported chat is "Iris". Iris's own JSON export carries the mark,
so a chat exported and imported again keeps both. The mark never reaches a model: the
request to a real server on loopback, and the local prompt text, hold no trace of it.

Real parts: the real CLI in-process (``run_cli``), the real SQLite file, a real
OpenAI-compatible server on loopback (``MisbehavingServer``), the window under
QT_QPA_PLATFORM=offscreen with the scripted runtime (what it sends, as the local model
gets it, rendered by the ChatML format the bundled Qwen model uses).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from iris_desktop.core import foreign
from iris_desktop.core.config import ContextParams
from iris_desktop.core.foreign_parts import APPS
from iris_desktop.core.planner import Planner
from iris_desktop.core.store import Store
from iris_desktop.core.views import load_transcript
from iris_desktop.host import build_agent
from iris_desktop.paths import app_paths
from iris_desktop.runtime.chat_format import ChatMLFormat

from conftest import FIXTURES
from support.fakes import ScriptedRuntime
from support.helpers import run_cli as run
from support.misbehaving_server import MisbehavingServer

FOREIGN = FIXTURES / "foreign"
CLAUDE = FOREIGN / "claude" / "conversations.json"
CHATGPT = FOREIGN / "chatgpt" / "librechat-chatgpt-modern-export.json"
SOURCES = [(CLAUDE, "Claude"), (CHATGPT, "ChatGPT"),
           (FOREIGN / "openwebui" / "librechat-openwebui-export.json", "Open WebUI"),
           (FOREIGN / "lmstudio" / "1746009600000.conversation.json", "LM Studio"),
           (FOREIGN / "jan" / "threads", "Jan")]
#: the keys a request's message may carry (what a chat template or a server reads)
WIRE_KEYS = {"role", "content", "tool_calls", "tool_call_id", "name"}


def cli(capsys, data: Path, *argv) -> str:
    code, out, err = run(capsys, "--data-dir", data, *argv)
    assert code == 0, err
    return out


def imported(capsys, data: Path, source: Path, *options) -> list[int]:
    return [int(line) for line in cli(capsys, data, "import", *options, source).split()]


def speakers(data: Path, thread: int) -> list[tuple[str, str]]:
    """(role, the card's heading) of each message the window shows."""
    with Store(app_paths(data).db_path) as store:
        return [(e.role, e.speaker) for e in load_transcript(store, thread) if e.kind == "message"]


def reply_headings(markdown: str) -> list[str]:
    return [line for line in markdown.splitlines() if line.startswith("## Assistant")]


def test_every_other_apps_format_has_its_app():
    formats = [foreign.CHATGPT, foreign.OPEN_WEBUI, foreign.LM_STUDIO, foreign.CLAUDE,
               foreign.JAN, foreign.JAN_FOLDER]
    assert all(APPS.get(fmt) for fmt in formats)
    assert not any(fmt in APPS for fmt in foreign.NATIVE)  # Iris's own formats: no app


@pytest.mark.parametrize(("source", "app"), SOURCES, ids=[app for _, app in SOURCES])
def test_imported_replies_name_their_app_in_the_window_and_the_markdown(capsys, tmp_path,
                                                                        source, app):
    data = tmp_path / "data"
    seen = 0
    for thread in imported(capsys, data, source):
        shown = speakers(data, thread)
        replies = [speaker for role, speaker in shown if role == "assistant"]
        assert set(replies) <= {app}, shown  # before: "Iris"
        assert "Iris" not in {speaker for _, speaker in shown}
        headings = reply_headings(cli(capsys, data, "export", thread, "--format", "md"))
        assert len(headings) == len(replies)
        assert all(h.endswith(f" — imported from {app}") for h in headings), headings
        messages = json.loads(cli(capsys, data, "export", thread))["messages"]
        assert {m.get("imported_from") for m in messages if m["role"] == "assistant"} <= {app}
        assert not any("imported_from" in m for m in messages if m["role"] != "assistant")
        seen += len(replies)
    assert seen  # (a Jan thread of one question has no reply)


def sent_bodies(server: MisbehavingServer) -> list[dict]:
    """The streamed chat requests the server got (the replies' requests)."""
    return [body for method, path, body in server.requests
            if method == "POST" and path.endswith("/chat/completions")
            and isinstance(body, dict) and body.get("stream")]


@pytest.mark.parametrize(("source", "app"), SOURCES[:2], ids=["Claude", "ChatGPT"])
def test_a_reply_iris_writes_in_an_imported_chat_is_iris_and_no_request_carries_the_app(
        capsys, tmp_path, source, app):
    """The imported chat goes on with Iris (a server on loopback): its new reply is "Iris",
    the imported ones stay the app's; the request sent holds each imported reply as
    role and content only, as stored, with no trace of the mark."""
    data = tmp_path / "data"
    thread = imported(capsys, data, source)[0]
    with Store(app_paths(data).db_path) as store:
        stored = [r["content"] for r in store.messages(thread) if r["role"] == "assistant"]
    with MisbehavingServer("normal", model=f"import-{uuid.uuid4().hex[:8]}",
                           tokens=["Happy", " to", " help."]) as server:
        code, out, err = run(capsys, "--data-dir", data, "--set", "model.backend=openai",
                             "--set", f"model.base_url={server.base_url}",
                             "chat", "--thread", thread, "Go on, please.")
        assert code == 0, err
    bodies = sent_bodies(server)
    assert bodies, server.requests
    for body in bodies:
        assert "imported_from" not in json.dumps(body, ensure_ascii=False)
        assert all(set(m) <= WIRE_KEYS and "name" not in m for m in body["messages"]), body
        replies = [m for m in body["messages"] if m["role"] == "assistant"]
        assert replies == [{"role": "assistant", "content": text} for text in stored]

    shown = speakers(data, thread)
    assert shown[-1] == ("assistant", "Iris")  # the new reply: Iris's own
    assert {s for r, s in shown[:-1] if r == "assistant"} == {app}
    headings = reply_headings(cli(capsys, data, "export", thread, "--format", "md"))
    assert headings[-1] == "## Assistant"
    assert all(h.endswith(f" — imported from {app}") for h in headings[:-1])

    # Iris's own JSON export, imported again: both kept (the mark round-trips)
    exported = tmp_path / "chat.json"
    cli(capsys, data, "export", thread, "-o", exported)
    replies = [m for m in json.loads(exported.read_text(encoding="utf-8"))["messages"]
               if m["role"] == "assistant"]
    assert [m.get("imported_from") for m in replies] == [app] * (len(replies) - 1) + [None]
    second = tmp_path / "second"
    [again] = imported(capsys, second, exported)
    assert speakers(second, again) == shown
    assert cli(capsys, second, "export", again, "--format", "md") == \
        cli(capsys, data, "export", thread, "--format", "md")
    [copy] = imported(capsys, data, exported, "--again")  # beside the original, too
    assert speakers(data, copy) == shown


def test_the_local_prompt_holds_no_trace_of_the_app(tmp_path):
    """What the local model reads: the agent's request (the scripted runtime records it,
    as the local runtime gets it) rendered by the ChatML format the bundled model uses."""
    from iris_desktop.core.foreign import import_conversations, load_conversations

    with Store(tmp_path / "iris.db") as store:
        thread = import_conversations(store, load_conversations(CLAUDE)).ids[0]
        stored = [r["content"] for r in store.messages(thread) if r["role"] == "assistant"]
        runtime = ScriptedRuntime(["Happy to help."])
        planner = Planner(ContextParams(window=32_768, system_prompt="You are Iris."),
                          runtime.counter(), runtime=runtime)
        list(build_agent(planner, store, compact=False).send(thread, "Go on, please."))
        [messages] = runtime.requests
        assert all(set(m) <= WIRE_KEYS and "name" not in m for m in messages), messages
        assert [m for m in messages if m["role"] == "assistant"] == \
            [{"role": "assistant", "content": text} for text in stored]
        prompt = ChatMLFormat().render_prompt(messages)
        assert "imported_from" not in prompt
        # the app's name is in the prompt only where the chat's own text has it
        assert prompt.count("Claude") == sum(m["content"].count("Claude") for m in messages)
        assert [e.speaker for e in load_transcript(store, thread)
                if e.kind == "message" and e.role == "assistant"][-1] == "Iris"


def test_the_window_heads_an_imported_reply_with_its_app(make_window, qtbot, tmp_path,
                                                         monkeypatch):
    """The audit's screenshot: a Claude chat imported with File ▸ Import; each imported
    reply's card is headed "Claude" (before: "Iris"), and the reply Iris writes next is
    headed "Iris"."""
    pytest.importorskip("pytestqt")
    from PySide6.QtCore import Qt

    from iris_desktop.ui import thread_control

    from support.windows import settle

    source = tmp_path / "conversations.json"
    source.write_text(json.dumps(json.loads(CLAUDE.read_text(encoding="utf-8"))[:1]),
                      encoding="utf-8")
    monkeypatch.setattr(thread_control.QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a, **k: (str(source), "")))
    runtime = ScriptedRuntime(["Happy to help."])
    window = make_window(runtime)
    window.menus.actions["import"].trigger()  # File ▸ Import conversation…
    qtbot.waitUntil(lambda: len(window.view.transcript.entries()) > 1, timeout=10_000)
    settle(qtbot, window)
    shown = window.view.transcript.entries()
    delegate, metrics = window.view.delegate, window.view.fontMetrics()
    replies = [e for e in shown if e.role == "assistant"]
    assert replies and {delegate.header_label(e, metrics, 800) for e in replies} == {"Claude"}
    row = next(i for i, e in enumerate(shown) if e.role == "assistant")
    model = window.view.transcript
    assert model.index(row).data(Qt.ItemDataRole.AccessibleTextRole).startswith("Claude: ")

    count = len(shown)
    window.composer.set_text("Go on, please.")
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not window.generating and len(runtime.requests) == 1, timeout=10_000)
    settle(qtbot, window)
    qtbot.waitUntil(lambda: len(window.view.transcript.entries()) == count + 2, timeout=10_000)
    shown = window.view.transcript.entries()
    assert delegate.header_label(shown[-1], metrics, 800) == "Iris"
    assert {delegate.header_label(e, metrics, 800) for e in shown[:-1]
            if e.role == "assistant"} == {"Claude"}
    assert not any("imported_from" in json.dumps(m) for m in runtime.requests[0])
