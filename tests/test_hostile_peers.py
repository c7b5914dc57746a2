"""A broken or hostile model server or model hub (issue #44, items 8 and 9, and part of 13).

A server or hub must not fill the memory or hold Iris: an answer read whole (the probes
and the one-token calibration of ``connect``, a hub's file list) that never ends, a gzip
bomb, an answer trickled a byte at a time, a redirect with a huge body, a compressed
stream, each ends within its bounds with one sentence naming the peer and the cause.
Absurd usage numbers are ignored, and the server stays usable. A download is called
present only when its own recorded sha256 equals the one the hub lists for that exact
path and revision; an impossible listing is refused in one sentence; two processes
downloading one file take turns.

Against real HTTP servers on 127.0.0.1 (``tests/support/misbehaving_server.py``,
``tests/support/hub_server.py``), which stop by themselves; the bounds are passed small, as
parameters, so that no test waits long.
"""

from __future__ import annotations

import hashlib
import os
import queue
import subprocess
import sys
import threading
import time
import tracemalloc
import uuid
from pathlib import Path

import pytest

from iris_desktop.core.config import AgentConfig, ContextParams
from iris_desktop.core.events import TurnFailed
from iris_desktop.core.planner import Planner
from iris_desktop.generation import GenerationRequest
from iris_desktop.host import build_agent
from iris_desktop.runtime import remote  # remote.test_connection: pytest would collect the name
from iris_desktop.runtime.hub import HubClient, HubError, download, download_record, download_target, downloading
from iris_desktop.runtime.hub import records as hub_records
from iris_desktop.runtime.remote import MAX_LINE_BYTES, RemoteRuntime, ServerError

from support.hub_server import HubServer, gguf_bytes
from support.misbehaving_server import MisbehavingServer

REPO_ROOT = Path(__file__).resolve().parent.parent
#: the bounds the tests pass (the defaults are 8 MiB and 30 s for a server, 16 MiB and
#: 60 s for a hub)
LIMIT = 64 << 10
TIMEOUT_S = 1.0
#: nothing here may take longer (generous for a loaded machine; the faults last longer)
CEILING_S = 8.0
#: what a bounded read may hold at its peak (the faults send 64 MiB and more)
PEAK_BYTES = 12 << 20
BOMB = 64 << 20

pytestmark = pytest.mark.usefixtures("no_proxy_no_keyring")


def one_sentence(text: str) -> bool:
    """What the user reads: one line, one sentence, no traceback or Python repr."""
    return ("\n" not in text and "Traceback" not in text and ". " not in text.rstrip(".")
            and "Error(" not in text)


class Peak:
    """The most memory Python allocated while the block ran."""

    def __enter__(self) -> Peak:
        tracemalloc.start()
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bytes = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        self.elapsed = time.monotonic() - self.started



@pytest.fixture(autouse=True)
def quick_resume(monkeypatch):
    monkeypatch.setattr(downloading, "RESUME_PAUSE_S", 0.0)


# ---------------------------------------------------------------------------
# a model server: answers read whole


def misbehaving(**options) -> MisbehavingServer:
    """A server of its own model name, so no calibration learned by another test counts."""
    return MisbehavingServer(model=f"hostile-{uuid.uuid4().hex[:8]}", **options)


BOUNDS = {"answer_limit_bytes": LIMIT, "answer_timeout_s": TIMEOUT_S}


@pytest.mark.parametrize("fault, words", [
    ("endless", "sent more than 64 KiB for its model list (/v1/models)"),
    ("gzip_bomb", "sent more than 64 KiB for its model list (/v1/models)"),
    ("trickle", "did not finish answering /v1/models within 1 s"),
    ("trickle_headers", "did not finish answering /v1/models within 1 s"),
])
def test_a_hostile_probe_answer_ends_connect_within_its_bounds(fault, words):
    """An endless body, a gzip bomb (counted after inflating) and a byte-a-second answer
    (the body or the headers) end the probe at the cap or the deadline, whichever the
    fault meets, with one sentence naming the server."""
    with misbehaving(answer_fault=fault, bomb_bytes=BOMB, max_bytes=BOMB, hold_s=20,
                     trickle_delay_s=0.3) as server:
        for attempt in (lambda: remote.test_connection(server.base_url, **BOUNDS),
                        lambda: RemoteRuntime.connect(server.base_url, **BOUNDS)):
            with Peak() as peak, pytest.raises(ServerError) as raised:
                attempt()
            message = str(raised.value)
            assert message.startswith(f"the server at http://127.0.0.1:{server.port} "), message
            assert words in message and one_sentence(message), message
            assert peak.elapsed < CEILING_S, (fault, peak.elapsed)
            assert peak.bytes < PEAK_BYTES, (fault, peak.bytes)


def test_the_default_bounds_are_what_the_errors_say():
    with misbehaving(answer_fault="endless", max_bytes=32 << 20, hold_s=20) as server, \
            pytest.raises(ServerError) as raised:
        remote.test_connection(server.base_url)
    assert f"sent more than {remote.MAX_ANSWER_BYTES >> 20} MiB for its model list" in str(raised.value)


def test_a_calibration_that_trickles_does_not_hold_connect(caplog):
    """The one-token calibration ``connect`` sends is an optimisation: when it trickles,
    connect gives up on it at the deadline and the server is used as it is."""
    with misbehaving(answer_fault="trickle", answer_path="/v1/chat/completions",
                     trickle_delay_s=0.3, hold_s=20) as server:
        started = time.monotonic()
        with RemoteRuntime.connect(server.base_url, answer_timeout_s=TIMEOUT_S) as runtime:
            elapsed = time.monotonic() - started
            assert elapsed < TIMEOUT_S + 3, elapsed
            assert runtime.counter().factor == remote.UNCALIBRATED_FACTOR
            hi = GenerationRequest([{"role": "user", "content": "hi"}], max_tokens=8)
            assert runtime.stream(hi).text() == "Hello, world"
    assert "could not calibrate the token estimate" in caplog.text
    assert "did not finish answering /v1/chat/completions within 1 s" in caplog.text


def test_a_compressed_stream_cannot_balloon_past_the_line_limit():
    """A reply streamed as Content-Encoding: gzip is inflated a step at a time: a line
    that inflates to 64 MiB is refused at the line limit, never held whole or in one
    piece."""
    with misbehaving(mode="gzip_bomb", bomb_bytes=BOMB, max_bytes=BOMB, hold_s=20) as server, \
            RemoteRuntime.connect(server.base_url, idle_timeout_s=2.0, start_timeout_s=4.0) as runtime:
        with Peak() as peak, pytest.raises(ServerError) as raised:
            runtime.stream(GenerationRequest([{"role": "user", "content": "hi"}], max_tokens=8)).text()
    message = str(raised.value)
    assert f"sent a line longer than {MAX_LINE_BYTES >> 20} MiB" in message and one_sentence(message)
    assert peak.elapsed < CEILING_S and peak.bytes < PEAK_BYTES, (peak.elapsed, peak.bytes)


# ---------------------------------------------------------------------------
# a model server: absurd usage numbers


def planner_on(runtime: RemoteRuntime) -> Planner:
    params = ContextParams(window=runtime.n_ctx, system_prompt="You are Iris.", recall_max_tokens=0)
    return Planner(params, runtime.counter(), runtime=runtime,
                   agent=AgentConfig(max_tokens=16, temperature=0.0))


@pytest.mark.parametrize("usage", [
    {"prompt_tokens": -5, "completion_tokens": -1, "prompt_tokens_details": {"cached_tokens": -3}},
    {"prompt_tokens": 10**12, "completion_tokens": 10**15},
    {"prompt_tokens": 1e300, "completion_tokens": [1], "prompt_tokens_details": {"cached_tokens": 1e300}},
    {"prompt_tokens": 12.5, "completion_tokens": "many"},
    {"prompt_tokens": 50_000_000, "completion_tokens": 3},  # a count, but no tokenizer's
    {"prompt_tokens": 3, "completion_tokens": 3},  # nor this: every prompt would look tiny
], ids=["negative", "huge", "float-huge", "fractions", "absurd-ratio", "too-few"])
def test_absurd_usage_numbers_are_ignored_and_the_server_stays_usable(usage, fresh_store, caplog):
    with misbehaving(usage=usage) as server, \
            RemoteRuntime.connect(server.base_url, fallback_window=8192) as runtime:
        # nothing learned from the calibration's broken report
        assert runtime.counter().factor == remote.UNCALIBRATED_FACTOR
        thread = fresh_store.create_thread("t")
        for _ in range(2):  # the second turn: the server is as usable as before
            events = list(build_agent(planner_on(runtime), fresh_store, compact=False).send(thread, "hi"))
            assert not [e for e in events if isinstance(e, TurnFailed)], events
        assert runtime.counter().factor == remote.UNCALIBRATED_FACTOR
    rows = fresh_store.requests(thread)
    assert len(rows) == 2
    for row in rows:
        for key in ("prompt_tokens", "completion_tokens", "reused_tokens", "evaluated_tokens"):
            assert row[key] is None or 0 <= row[key] <= remote.MAX_REPORTED_TOKENS, (key, row)
        assert row["reused_tokens"] <= row["prompt_tokens"] and row["evaluated_tokens"] <= row["prompt_tokens"]
    assert "ignored" in caplog.text  # said in the log


# ---------------------------------------------------------------------------
# a model hub: listings read whole

QWEN = "Qwen/Qwen2.5-1.5B-Instruct-GGUF"
QWEN_FILE = "qwen2.5-1.5b-instruct-q4_k_m.gguf"
TWINS = "iris-test/Twins-GGUF"


@pytest.fixture(scope="module")
def blobs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("blobs")
    made = {"qwen": gguf_bytes(folder, "Qwen2.5 1.5B Instruct", 128 * 1024),
            "a": gguf_bytes(folder, "Tiny A", 64 * 1024),
            "b": gguf_bytes(folder, "Tiny B", 64 * 1024)}
    assert len(made["a"]) == len(made["b"]) and made["a"] != made["b"]
    return made


@pytest.fixture
def server(blobs):
    repos = {QWEN: {QWEN_FILE: blobs["qwen"]},
             TWINS: {"twin.gguf": blobs["a"], "other/twin.gguf": blobs["b"]}}
    with HubServer(repos) as s:
        s.bomb_bytes = s.max_fault_bytes = BOMB
        s.hold_s = 20.0
        s.trickle_delay_s = 0.3
        yield s


@pytest.fixture
def client(server):
    with HubClient(server.url) as c:
        yield c


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("fault, words, kind", [
    ("endless", "sent more than 64 KiB in its answer about", "answer"),
    ("gzip_bomb", "sent more than 64 KiB in its answer about", "answer"),
    ("trickle", "did not finish answering about", "network"),
])
def test_a_hostile_file_list_is_refused_within_its_bounds(server, tmp_path, fault, words, kind):
    server.answer_fault = fault
    with HubClient(server.url, answer_limit=LIMIT, answer_timeout_s=TIMEOUT_S) as client:
        for attempt in (lambda: client.files(QWEN), lambda: download(client, QWEN, QWEN_FILE, tmp_path)):
            with Peak() as peak, pytest.raises(HubError) as raised:
                attempt()
            message = str(raised.value)
            assert raised.value.kind == kind and message.startswith(
                f"The model hub 127.0.0.1:{server.hub.server_address[1]} "), message
            assert words in message and f"{QWEN} at main" in message and one_sentence(message), message
            assert peak.elapsed < CEILING_S and peak.bytes < PEAK_BYTES, (fault, peak.elapsed, peak.bytes)
    assert server.served("files") == [] and not list(tmp_path.rglob("*.partial"))


def test_a_redirect_body_is_never_read(server, client, tmp_path, blobs):
    """httpx reads a redirect's whole body before following it; the hub's 302 to the file
    host is followed without reading a byte of it."""
    server.redirect_junk = BOMB
    with Peak() as peak:
        path = download(client, QWEN, QWEN_FILE, tmp_path)
    assert path.read_bytes() == blobs["qwen"]
    assert peak.bytes < PEAK_BYTES and peak.elapsed < CEILING_S, (peak.bytes, peak.elapsed)
    assert server.fault_bytes_sent < BOMB // 4


# ---------------------------------------------------------------------------
# a model hub: what a listing says, and what counts as verified


@pytest.mark.parametrize("listed, words", [
    ({"size": 0}, "with a size of 0 bytes"),
    ({"size": -5}, "with a size of -5 bytes"),
    ({"size": "big"}, "with a size of 'big', which is not a number of bytes"),
    ({"sha256": "xyz"}, "with the sha256 'xyz', which is not 64 hexadecimal digits"),
    ({"sha256": "a" * 63}, "which is not 64 hexadecimal digits"),
    ({"sha256": "g" * 64}, "which is not 64 hexadecimal digits"),
])
def test_an_impossible_listing_is_refused_in_one_sentence(server, client, tmp_path, listed, words):
    server.listed = {QWEN_FILE: listed}
    with pytest.raises(HubError) as raised:
        download(client, QWEN, QWEN_FILE, tmp_path)
    message = str(raised.value)
    assert raised.value.kind == "answer" and words in message, message
    assert message.startswith(f"The model hub 127.0.0.1:{server.hub.server_address[1]} lists {QWEN_FILE} of {QWEN}")
    assert "Cannot write" not in message and "writable" not in message and one_sentence(message)
    assert server.served("files") == [] and not list(tmp_path.rglob("*.partial"))
    assert not download_target(tmp_path, QWEN, QWEN_FILE).exists()


def test_an_upper_case_sha256_is_compared_not_ignored(server, client, tmp_path, blobs):
    server.listed = {QWEN_FILE: {"sha256": sha(b"another file").upper()}}
    with pytest.raises(HubError) as raised:
        download(client, QWEN, QWEN_FILE, tmp_path)
    assert raised.value.kind == "checksum" and not download_target(tmp_path, QWEN, QWEN_FILE).exists()

    server.listed = {QWEN_FILE: {"sha256": sha(blobs["qwen"]).upper()}}
    path = download(client, QWEN, QWEN_FILE, tmp_path)
    assert path.read_bytes() == blobs["qwen"]
    record = download_record(tmp_path, QWEN, QWEN_FILE)
    assert record["verified_by_hub"] is True and record["sha256"] == sha(blobs["qwen"])
    assert record["file"] == QWEN_FILE and record["revision"] == "main"


def test_without_a_listed_sha256_the_file_is_not_verified_by_the_hub(server, client, tmp_path, blobs):
    server.listed = {QWEN_FILE: {"sha256": None}}
    seen = []
    path = download(client, QWEN, QWEN_FILE, tmp_path, progress=seen.append)
    assert path.read_bytes() == blobs["qwen"]
    said = seen[-1].describe()
    assert seen[-1].phase == "verifying" and "not verified by the hub" in said and "Verifying" not in said
    record = download_record(tmp_path, QWEN, QWEN_FILE)
    assert record["verified_by_hub"] is False and record["listed_sha256"] is None
    assert record["sha256"] == sha(blobs["qwen"])  # computed and recorded

    fetched = len(server.served("files"))
    assert download(client, QWEN, QWEN_FILE, tmp_path) == path  # this path and revision: recorded
    assert len(server.served("files")) == fetched
    # another revision with nothing to compare: downloaded again, not taken unchecked
    download(client, QWEN, QWEN_FILE, tmp_path, revision="v2")
    assert len(server.served("files")) == fetched + 1
    assert download_record(tmp_path, QWEN, QWEN_FILE)["revision"] == "v2"


def test_the_same_name_in_another_folder_of_the_repo_is_not_taken_for_it(server, client, tmp_path, blobs):
    first = download(client, TWINS, "twin.gguf", tmp_path)
    assert first.read_bytes() == blobs["a"]
    second = download(client, TWINS, "other/twin.gguf", tmp_path)  # same name, same size
    assert second != first and second.read_bytes() == blobs["b"]  # two files: neither replaced
    assert first.read_bytes() == blobs["a"]
    assert len(server.served("files")) == 2
    assert download_record(tmp_path, TWINS, "other/twin.gguf")["file"] == "other/twin.gguf"
    assert download(client, TWINS, "twin.gguf", tmp_path).read_bytes() == blobs["a"]
    assert len(server.served("files")) == 2  # there already, verified: not fetched again


def test_another_revision_of_the_same_size_is_downloaded_not_returned_unchecked(server, client, tmp_path, blobs):
    server.revisions = {"v2": {TWINS: {"twin.gguf": blobs["b"]}}}
    assert download(client, TWINS, "twin.gguf", tmp_path).read_bytes() == blobs["a"]
    path = download(client, TWINS, "twin.gguf", tmp_path, revision="v2")
    assert path.read_bytes() == blobs["b"] and len(server.served("files")) == 2
    record = download_record(tmp_path, TWINS, "twin.gguf")
    assert (record["revision"], record["sha256"], record["verified_by_hub"]) == ("v2", sha(blobs["b"]), True)


def test_a_file_changed_since_or_without_a_record_is_hashed_again(server, client, tmp_path, blobs):
    path = download(client, TWINS, "twin.gguf", tmp_path)
    fetched = len(server.served("files"))
    path.write_bytes(blobs["b"])  # altered on disk: same size, a new modification time
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert download_record(tmp_path, TWINS, "twin.gguf") is None  # no longer the file recorded
    assert download(client, TWINS, "twin.gguf", tmp_path).read_bytes() == blobs["a"]
    assert len(server.served("files")) == fetched + 1

    # a file of an older Iris (no record) with the listed sha256: hashed, kept, recorded
    records = tmp_path / "downloads" / hub_records.RECORDS
    for entry in records.rglob("*.json"):
        entry.unlink()
    phases = []
    assert download(client, TWINS, "twin.gguf", tmp_path, progress=lambda p: phases.append(p.phase)) == path
    assert "rechecking" in phases and len(server.served("files")) == fetched + 1
    assert download_record(tmp_path, TWINS, "twin.gguf")["verified_by_hub"] is True


# ---------------------------------------------------------------------------
# two downloads of one file at once

DOWNLOADER = r"""
import sys
from iris_desktop.runtime.hub import HubClient, download

url, repo, file, models = sys.argv[1:5]
seen = []


def progress(p):
    if p.phase not in seen:
        seen.append(p.phase)
        print("phase", p.phase, flush=True)


with HubClient(url) as client:
    path = download(client, repo, file, models, progress=progress)
print("done", path, flush=True)
"""


def start_downloader(server: HubServer, models: Path) -> tuple[subprocess.Popen, queue.Queue]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    process = subprocess.Popen([sys.executable, "-c", DOWNLOADER, server.url, QWEN, QWEN_FILE, str(models)],
                               cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for line in process.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return process, lines


def wait_for(lines: queue.Queue, wanted: str, timeout_s: float = 30.0) -> list[str]:
    seen: list[str] = []
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            line = lines.get(timeout=0.1)
        except queue.Empty:
            continue
        if line is None:
            break
        seen.append(line)
        if line.startswith(wanted):
            return seen
    raise AssertionError(f"no {wanted!r} within {timeout_s} s; said: {seen}")


def test_two_processes_downloading_one_file_take_turns(server, tmp_path, blobs):
    """The second process waits for the first (saying so) and then finds the file there:
    one request to the file host, one ``.partial`` written by one process."""
    server.gate = threading.Event()  # the file host holds the first download's bytes
    models = tmp_path / "models"
    first, first_lines = start_downloader(server, models)
    second = None
    try:
        end = time.monotonic() + 30
        while not server.served("files") and time.monotonic() < end:
            time.sleep(0.05)
        assert server.served("files"), "the first download never reached the file host"
        second, second_lines = start_downloader(server, models)
        said = wait_for(second_lines, "phase waiting")
        assert "phase downloading" not in said
        server.gate.set()
        first_said = wait_for(first_lines, "done")
        second_said = said + wait_for(second_lines, "done")
    finally:
        server.gate.set()
        for process in (first, second):
            if process is not None:
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
    assert first.returncode == 0 and second.returncode == 0, (first_said, second_said)
    target = download_target(models, QWEN, QWEN_FILE)
    assert first_said[-1] == second_said[-1] == f"done {target}"
    assert target.read_bytes() == blobs["qwen"]
    assert [r["range"] for r in server.served("files")] == [None]  # fetched once
    assert "phase downloading" not in second_said
    assert sorted(p.name for p in target.parent.iterdir()) == [QWEN_FILE]  # no lock, no partial left


def test_a_download_that_may_not_wait_says_another_is_running(server, client, tmp_path, blobs):
    server.gate = threading.Event()
    results: list = []
    worker = threading.Thread(target=lambda: results.append(download(client, QWEN, QWEN_FILE, tmp_path)))
    worker.start()
    try:
        end = time.monotonic() + 20
        while not server.served("files") and time.monotonic() < end:
            time.sleep(0.02)
        with HubClient(server.url) as other:
            with pytest.raises(HubError) as raised:
                download(other, QWEN, QWEN_FILE, tmp_path, wait=False)
            assert raised.value.kind == "busy" and one_sentence(str(raised.value))
            assert str(raised.value).startswith(f"Another download of {QWEN_FILE} is running")

            cancel, seen = threading.Event(), []

            def progress(p):
                seen.append(p)
                cancel.set()  # Stop, while it waits

            with pytest.raises(HubError) as raised:
                download(other, QWEN, QWEN_FILE, tmp_path, cancel=cancel, progress=progress)
            assert raised.value.kind == "stopped" and raised.value.partial is None
            assert seen[0].phase == "waiting" and seen[0].describe().startswith("Waiting for another download")
    finally:
        server.gate.set()
        worker.join(30)
    assert results and results[0].read_bytes() == blobs["qwen"]
    assert len(server.served("files")) == 1


def test_only_a_file_whose_sha256_matched_the_hub_s_is_called_verified():
    from iris_desktop.runtime.hub import verified_words

    assert verified_words({"verified_by_hub": True}) == "verified (sha256 and GGUF header)"
    for record in (None, {"verified_by_hub": False}, {}):
        assert "not verified by the hub" in verified_words(record)
