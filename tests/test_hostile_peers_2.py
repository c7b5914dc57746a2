"""Hostile peers, second round (an audit of the network paths): a lone surrogate in
what a server streams or names, a finish reason that keeps changing, a model name of
megabytes, a ``/tokenize`` that counts millions of tokens for five characters, answers
whose structure costs 20 to 30 times their bytes, and failures said with Python's words
(a 16 KB ``bytearray(b'…')``, ``ReadError: [Errno 104]``, ``[SSL: …]``,
``UnsupportedProtocol``, "could not reach … is it running?" for a server that answered).

Against real HTTP servers on 127.0.0.1 (``tests/support/misbehaving_server.py``,
``tests/support/hub_server.py``), the real CLI (``cli.main``), the real runtime and a
real SQLite store. Hangs are counted (chunks the server sent before the client left),
with a generous wall-clock bound only as a safety net.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import threading
import tracemalloc
import uuid
from pathlib import Path

import pytest

from iris_desktop.core.events import ReplyToken, TurnFailed
from iris_desktop.core.store import Store
from iris_desktop.generation import GenerationRequest
from iris_desktop.runtime import remote  # remote.test_connection: pytest would collect the name
from iris_desktop.runtime.hub import HubClient, HubError
from iris_desktop.runtime.remote import RemoteRuntime, ServerError

from support.helpers import run_cli
from support.hub_server import HubServer
from support.misbehaving_server import MisbehavingServer

pytestmark = pytest.mark.usefixtures("no_proxy_no_keyring")

#: the longest sentence a user should read for a failure
SENTENCE_CHARS = 300
#: the safety net of a hang test: far longer than the bound it tests
SAFETY_S = 30.0
HI = [{"role": "user", "content": "hi"}]


def short_sentence(text: str) -> bool:
    """One line, one sentence, short, with no Python repr or class name in it."""
    return ("\n" not in text and len(text) <= SENTENCE_CHARS and "bytearray" not in text
            and "b'" not in text and "Error:" not in text and "Errno" not in text
            and "[SSL" not in text and "\x1b" not in text)


def server(mode: str = "normal", **options) -> MisbehavingServer:
    """A server with a model name of its own (no calibration of another test counts)."""
    options.setdefault("model", f"hostile-{uuid.uuid4().hex[:8]}")
    return MisbehavingServer(mode, **options)


def chat(capsys, data: Path, base_url: str, *argv: str) -> tuple[int, str, str]:
    return run_cli(capsys, "--data-dir", data, "--set", "model.backend=openai",
                   "--set", f"model.base_url={base_url}", *argv)


class Peak:
    """The most memory Python allocated while the block ran."""

    def __enter__(self) -> Peak:
        tracemalloc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bytes = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


# -- 1. and 2. a lone surrogate ---------------------------------------------------------------


def test_a_lone_surrogate_in_the_streamed_text_is_shown_and_kept_as_u_fffd(capsys, tmp_path):
    """Before: ``"[\\ud800]"`` in a chunk failed the turn with "'utf-8' codec can't encode
    character '\\ud800'", the reply left 'streaming' and empty, and the next start said
    falsely "what it had written is kept". Now: the half-pair is U+FFFD, as an invalid
    byte is, and the reply is saved whole."""
    data = tmp_path / "data"
    with server(tokens=["half:", "[\ud800]", " after"]) as s:
        code, out, err = chat(capsys, data, s.base_url, "chat", "--new", "hi")
    assert code == 0, err
    assert "half:[\ufffd] after" in out
    with Store(data / "iris.db") as store:
        reply = store.messages(store.threads()[0]["id"])[-1]
    assert (reply["content"], reply["status"]) == ("half:[\ufffd] after", "complete")
    code, _, err = run_cli(capsys, "--data-dir", data, "threads")
    assert code == 0 and "cut off" not in err, err


def test_a_lone_surrogate_in_a_tool_call_becomes_u_fffd():
    """Before: a call whose name held ``\\udc00`` and whose arguments held ``\\ud800`` (an
    escape of the event, or of the arguments' own JSON) came out as text UTF-8 cannot
    encode, and the turn failed on saving it."""
    calls = [{"index": 0, "id": "c1", "type": "function",
              "function": {"name": "read_\udc00file", "arguments": '{"path": "a\ud800"}'}},
             {"index": 1, "id": "c2", "type": "function",
              "function": {"name": "read_file", "arguments": '{"path": "b\\ud800"}'}}]
    with server("tool_call", tokens=[], calls=calls) as s, \
            RemoteRuntime.connect(s.base_url) as runtime:
        text = runtime.stream(GenerationRequest(HI, max_tokens=64)).text()
    text.encode("utf-8")  # valid text
    blocks = [json.loads(b.split("</tool_call>")[0]) for b in text.split("<tool_call>")[1:]]
    assert blocks == [{"name": "read_\ufffdfile", "arguments": {"path": "a\ufffd"}},
                      {"name": "read_file", "arguments": {"path": "b\ufffd"}}]


def test_a_reply_with_text_utf8_cannot_hold_is_saved_never_lost(fresh_store):
    """Defence in depth: whatever reaches the store, the save of a reply never fails on
    text UTF-8 cannot hold (before: UnicodeEncodeError, and the reply shown was lost)."""
    thread = fresh_store.create_thread("t")
    fresh_store.add_message(thread, {"role": "user", "content": "hi"})
    reply = fresh_store.add_message(thread, {"role": "assistant", "content": ""}, status="streaming")
    fresh_store.update_streaming(reply, "half:[\ud800]")  # a save while streaming
    calls = [{"id": "c1", "type": "function",
              "function": {"name": "read_file", "arguments": '{"path": "a\udc00"}'}}]
    fresh_store.update_streaming(reply, "half:[\ud800] after", status="complete", tool_calls=calls)
    row = fresh_store.messages(thread)[-1]
    assert (row["content"], row["status"]) == ("half:[\ufffd] after", "complete")
    stored = row["tool_calls"] if isinstance(row["tool_calls"], list) else json.loads(row["tool_calls"])
    assert stored[0]["function"]["arguments"] == '{"path": "a\ufffd"}'


def test_a_model_name_with_a_lone_surrogate_is_valid_text(capsys, tmp_path):
    """Before: ``"id": "m\\ud800x"`` ended ``chat`` with "unexpected error
    (UnicodeEncodeError …); this is a bug in Iris". Now: the name is text (U+FFFD)."""
    data = tmp_path / "data"
    with server(model="m\ud800x") as s:
        code, out, err = chat(capsys, data, s.base_url, "chat", "--new", "hi")
        sent = [body.get("model") for method, path, body in s.requests
                if path == "/v1/chat/completions" and isinstance(body, dict)]
    assert code == 0 and "bug" not in err, err
    assert out.startswith("Hello, world") and sent and set(sent) == {"m\ufffdx"}


# -- 3. a finish reason that keeps changing ---------------------------------------------------


def test_a_finish_reason_that_keeps_changing_ends_the_reply_after_its_grace():
    """Before: a server that sent a new finish reason every 50 ms (``r0``, ``r1``, …) and
    never ``[DONE]`` held the reply until it closed (208 s), the idle limit and the 2 s
    grace after a finish pushed on by each change. Now: the reply ends 2 s after its
    first finish reason, whatever comes after: the client leaves long before the server
    has sent what it would (counted, not timed)."""
    hold_s, interval_s = 60.0, 0.02
    with server("flipflop", interval_s=interval_s, hold_s=hold_s) as s, \
            RemoteRuntime.connect(s.base_url, idle_timeout_s=hold_s) as runtime:
        result: list = []
        turn = threading.Thread(target=lambda: result.append(
            runtime.stream(GenerationRequest(HI, max_tokens=64)).text()), daemon=True)
        turn.start()
        turn.join(SAFETY_S)
        ended = not turn.is_alive()
        s.release.set()
        assert ended, f"the reply did not end; {s.finishes_sent} finish reasons sent"
        assert s.client_gone.wait(10)
        assert result == ["Hello, world"]
        # what the server would have sent by its own bound, against what it did
        assert 0 < s.finishes_sent < (hold_s / interval_s) / 4, s.finishes_sent


# -- 4. a model name of megabytes -------------------------------------------------------------


def test_a_model_name_past_the_bound_is_refused_in_one_sentence(capsys, tmp_path):
    """Before: a 4 MiB model id was sent with every request and stored with every turn
    (the history grew 16 MB a turn, the log 4 MB). Now: a name longer than 1,024
    characters is refused, in one sentence saying how long it is and what to do."""
    from iris_desktop.runtime.remote.probe import MAX_MODEL_NAME

    data = tmp_path / "data"
    with server(model="M" * (4 << 20)) as s:
        code, _, err = chat(capsys, data, s.base_url, "chat", "--new", "hi")
        streamed = s.stream_started.is_set()
    assert code == 1 and not streamed, err
    line = err.strip().splitlines()[0]
    assert "4,194,304 characters" in line and f"{MAX_MODEL_NAME:,}" in line and "--alias" in line
    assert len(line) < 400 and "MMMM" not in err
    logs = list((data / "logs").glob("*.log"))
    assert all(log.stat().st_size < 64 << 10 for log in logs)
    with server(model="m" * MAX_MODEL_NAME) as s:  # at the bound: a name as any other
        assert remote.test_connection(s.base_url).models[0].name == "m" * MAX_MODEL_NAME


# -- 5. a count that cannot be one --------------------------------------------------------------


def test_a_tokenize_answer_past_what_the_text_can_hold_is_refused_naming_the_server(capsys, tmp_path):
    """Before: llama.cpp's ``/tokenize`` answering 64 MiB of ``[]`` for "hello" took
    1.78 GB and 115 s, and the user read that their system prompt had 22,369,589 tokens
    and should be shortened. Now: the answer may hold what the text can give (a token a
    byte), so it stops at a few KiB, and the sentence names the server and ``/tokenize``."""
    data = tmp_path / "data"
    with server("llama", answer_fault="empties", answer_path="/tokenize", bomb_bytes=4 << 20) as s:
        code, _, err = chat(capsys, data, s.base_url, "chat", "--new", "hi")
        with RemoteRuntime.connect(s.base_url) as runtime, Peak() as peak, \
                pytest.raises(ServerError) as raised:
            runtime.count_text("hello")
        port = s.port
    assert code != 0 and "system prompt" not in err, err
    assert f"127.0.0.1:{port}" in err and "/tokenize" in err
    assert f"127.0.0.1:{port}" in str(raised.value) and "/tokenize" in str(raised.value)
    assert short_sentence(str(raised.value)) and peak.bytes < 4 << 20, peak.bytes


def test_a_count_larger_than_its_text_is_not_believed():
    """A count of more tokens than the text has bytes (and a few more) is the server's
    fault, said as such, as a count out of range is; a true count is believed."""
    with server("llama", tokens_per_char=10) as s, RemoteRuntime.connect(s.base_url) as runtime:
        with pytest.raises(ServerError) as raised:
            runtime.count_text("hello")
        message = str(raised.value)
        assert message.startswith(f"127.0.0.1:{s.port} answered /tokenize with 50 tokens for 5 bytes")
        assert "server is broken" in message and short_sentence(message)
        s.tokens_per_char = 0.25
        assert runtime.count_text("hello there, world") == 4


# -- 6. memory: answers read whole -------------------------------------------------------------


def test_a_model_list_of_empties_is_refused_before_it_is_parsed():
    """Before: a ``/v1/models`` of 8 MiB of ``{}`` (under its byte cap) was parsed whole:
    about 190 MB. Now: an answer may hold a JSON value per 16 bytes of its cap; this one
    holds far more, and is refused before parsing (peak: the bytes read, and their text)."""
    with server(answer_fault="empties", bomb_bytes=(8 << 20) - 64) as s, Peak() as peak, \
            pytest.raises(ServerError) as raised:
        remote.test_connection(s.base_url)
    message = str(raised.value)
    assert "model list (/v1/models) as more than 524,288 JSON values" in message, message
    assert short_sentence(message) and peak.bytes < 48 << 20, peak.bytes


@pytest.mark.parametrize("what", ["search", "files"])
def test_a_hub_answer_of_empties_is_bounded_in_memory(what):
    """Before: a hub search or file list of 16 MiB of ``[]`` took 450 MB parsed. Now: a
    search's answer holds at most 1 MiB (Hugging Face's for 30 repositories is tens of
    KiB), and any answer a JSON value per 16 bytes of its cap."""
    with HubServer({"a/b": {"x.gguf": b"GGUF"}}) as hub:
        hub.answer_fault, hub.answer_match, hub.bomb_bytes = "empties", "/api/models", 8 << 20
        with HubClient(hub.url) as client, Peak() as peak, pytest.raises(HubError) as raised:
            client.search("qwen") if what == "search" else client.files("a/b")
    message = str(raised.value)
    # (a Content-Length over the cap is said as announced: the search's; a body read past it
    # as sent: the file list's, whose cap is larger)
    assert message.startswith((f"The model hub 127.0.0.1:{hub.hub.server_address[1]} sent more than ",
                               f"The model hub 127.0.0.1:{hub.hub.server_address[1]} announced "))
    assert short_sentence(message) and peak.bytes < 48 << 20, (what, peak.bytes)


# -- 7. failures in words -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 and its key (PEM files)."""
    pytest.importorskip("cryptography")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    folder = tmp_path_factory.mktemp("tls")
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return str(folder / "cert.pem"), str(folder / "key.pem")


def refusal(base_url: str) -> str:
    with pytest.raises(ServerError) as raised:
        remote.test_connection(base_url)
    return str(raised.value)


def test_tls_asked_of_the_wrong_server_is_said_with_what_to_do(certificate):
    """Before: http:// to a TLS server was "ReadError: [Errno 104] Connection reset by
    peer"; https:// to a plain one "cannot connect ([SSL: WRONG_VERSION_NUMBER] wrong
    version number (_ssl.c:1006))"; a self-signed certificate the raw "[SSL:
    CERTIFICATE_VERIFY_FAILED] …". Now: the cause and what to do, in a short sentence."""
    with server(tls=certificate) as tls, server() as plain:
        ports = tls.port, plain.port
        said = {
            "http:// to TLS": refusal(f"http://127.0.0.1:{tls.port}/v1"),
            "https:// to TLS": refusal(f"https://127.0.0.1:{tls.port}/v1"),
            "https:// to plain": refusal(f"https://127.0.0.1:{plain.port}/v1"),
        }
    assert said["http:// to TLS"] == (f"the server at 127.0.0.1:{ports[0]} answers with TLS: use "
                                      "https:// in model.base_url")
    assert said["https:// to TLS"].startswith(
        f"the server at 127.0.0.1:{ports[0]} has a self-signed certificate, which this computer "
        "does not trust")
    assert said["https:// to plain"] == (f"the server at 127.0.0.1:{ports[1]} does not answer "
                                         "with TLS at that port: use http:// in model.base_url")
    assert all(short_sentence(text) for text in said.values()), said


def test_a_server_that_answers_something_else_than_http_is_not_called_unreached():
    """Before: a stream answered "SSH-2.0-OpenSSH_9.6" was "could not reach the server …
    (… Server disconnected without sending a response.); is it running?": it was reached.
    Now: it closed the connection without an HTTP answer, and what to check."""
    with server("not_http") as s, RemoteRuntime.connect(s.base_url) as runtime, \
            pytest.raises(ServerError) as raised:
        port = s.port
        runtime.stream(GenerationRequest(HI, max_tokens=8)).text()
    message = str(raised.value)
    assert message == (f"the server at 127.0.0.1:{port} closed the connection without an HTTP "
                       "answer; check that model.base_url is the address and port of an HTTP server")
    assert "could not reach" not in message and "is it running" not in message


def test_a_malformed_chunk_is_said_short_and_the_text_kept(fresh_store):
    """Before: a chunk header of 16 KB of ANSI codes was repeated whole as
    ``bytearray(b'Z\\x1b[31m…')``, a 16 KB line on the terminal and three in the log. Now:
    "the server sent a malformed HTTP chunk", and the text that came is kept."""
    from iris_desktop.core.config import AgentConfig, ContextParams
    from iris_desktop.core.planner import Planner
    from iris_desktop.host import build_agent

    with server("bad_chunk", tokens=["Hello", " there"]) as s, \
            RemoteRuntime.connect(s.base_url) as runtime:
        params = ContextParams(window=runtime.n_ctx, system_prompt="You are Iris.", recall_max_tokens=0)
        planner = Planner(params, runtime.counter(), runtime=runtime,
                          agent=AgentConfig(max_tokens=64, temperature=0.0))
        thread = fresh_store.create_thread("t")
        events = list(build_agent(planner, fresh_store, compact=False).send(thread, "hi"))
        port = s.port
    failed = next(e for e in events if isinstance(e, TurnFailed))
    assert (f"127.0.0.1:{port}: the connection was lost mid-reply (the server sent a malformed "
            "HTTP chunk)") in failed.text, failed.text[:300]
    assert short_sentence(failed.text)
    shown = "".join(e.text for e in events if isinstance(e, ReplyToken))
    kept = fresh_store.messages(thread)[-1]
    assert shown == "Hello there" and (kept["content"], kept["status"]) == (shown, "error")


def test_a_hub_redirect_to_a_file_address_is_named_not_called_unreachable():
    """Before: a search answered with a 302 to ``file:///etc/passwd`` was "The model hub …
    cannot be reached (UnsupportedProtocol); check the network": it was reached. Now:
    where it redirected, and that Iris did not follow it, as a download says."""
    with HubServer({"a/b": {"x.gguf": b"GGUF"}}) as hub:
        hub.answer_fault, hub.answer_match = "redirect", "/api/models"
        with HubClient(hub.url) as client, pytest.raises(HubError) as raised:
            client.search("qwen")
    message = str(raised.value)
    assert message == (f"The model hub 127.0.0.1:{hub.hub.server_address[1]} redirected the search "
                       "for 'qwen' to file:///etc/passwd, which is not an http:// or https:// "
                       "address; Iris did not follow it (check models.hub_url).")
    assert short_sentence(message)


def test_commas_inside_strings_are_text_not_values():
    """Found in review: the bound on JSON values counted the commas of a string, so an
    /apply-template answer holding a prompt with a pasted CSV (140,400 commas) was refused
    as "too complex", the server blamed. Values outside strings are still bounded."""
    from iris_desktop.runtime.http import MIN_VALUES, AnswerTooComplex, json_answer

    prompt = "id,name,price\n" + '1,"a, b",2.5\n' * 50_000 + 'a " quote, and \\ too'
    answer = json.dumps({"prompt": prompt})
    assert answer.count(",") > MIN_VALUES
    assert json_answer(answer, values=MIN_VALUES) == {"prompt": prompt}
    with pytest.raises(AnswerTooComplex):
        json_answer("[" + ",".join(["{}"] * (MIN_VALUES + 1)) + "]", values=MIN_VALUES)
