"""The model hub client and downloads (``runtime.hub``) against a real hub on loopback
(``tests/support/hub_server.py``: the Hugging Face endpoints, a redirect to a second server acting
as the file host, Range, slow, dropping and failing modes), serving small real GGUF files.
The CLI's ``models search``, ``models files`` and ``models download`` run against it too.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import threading
import time
from pathlib import Path

import pytest

from iris_desktop.cli import main
from iris_desktop.runtime.hub import (
    RECOMMENDED,
    HubClient,
    HubError,
    discard_partial,
    download,
    download_record,
    download_target,
    downloading,
    fits_in_memory,
    get_hub_token,
    partial_state,
    set_hub_token,
    system_memory_bytes,
)
from iris_desktop.runtime.hub import client as hub_client
from iris_desktop.runtime.library import describe_model, discover_models

from support.faults import full_disk
from support.gguf_fixtures import write_gguf
from support.hub_server import HubServer, gguf_bytes

QWEN = "Qwen/Qwen2.5-1.5B-Instruct-GGUF"
QWEN_FILE = "qwen2.5-1.5b-instruct-q4_k_m.gguf"
LLAMA = "bartowski/Llama-3.2-3B-Instruct-GGUF"
LLAMA_FILE = "Llama-3.2-3B-Instruct-Q4_K_M.gguf"


pytestmark = pytest.mark.usefixtures("no_proxy_no_keyring")


@pytest.fixture(scope="module")
def blobs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("blobs")
    return {"qwen": gguf_bytes(folder, "Qwen2.5 1.5B Instruct", 512 * 1024),  # ~2 MB
            "llama": gguf_bytes(folder, "Llama 3.2 3B Instruct", 128 * 1024),  # ~0.5 MB
            "q8": gguf_bytes(folder, "Qwen2.5 1.5B Instruct Q8", 64 * 1024)}


@pytest.fixture
def server(blobs):
    repos = {QWEN: {QWEN_FILE: blobs["qwen"], "qwen2.5-1.5b-instruct-q8_0.gguf": blobs["q8"]},
             LLAMA: {LLAMA_FILE: blobs["llama"], "not-a-model.gguf": b"<html>an error page</html>" * 40},
             "Qwen/Qwen2.5-3B-Instruct-GGUF": {"qwen2.5-3b-instruct-q4_k_m.gguf": blobs["q8"]}}
    with HubServer(repos, downloads={QWEN: 500, "Qwen/Qwen2.5-3B-Instruct-GGUF": 900, LLAMA: 10}) as s:
        yield s


@pytest.fixture
def client(server):
    with HubClient(server.url) as c:
        yield c


@pytest.fixture(autouse=True)
def quick_resume(monkeypatch):
    monkeypatch.setattr(downloading, "RESUME_PAUSE_S", 0.0)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- the hub's API ------------------------------------------------------------------------


def test_search_lists_gguf_repositories_most_downloaded_first(server, client):
    repos = client.search("qwen instruct")
    assert [r.id for r in repos] == ["Qwen/Qwen2.5-3B-Instruct-GGUF", QWEN]
    assert repos[1].downloads == 500 and repos[1].gated is False
    asked = server.served("hub")[-1]
    assert asked["path"] == "/api/models"
    assert asked["query"]["filter"] == ["gguf"] and asked["query"]["search"] == ["qwen instruct"]
    assert client.search("no such model") == []


def test_files_come_with_sizes_and_sha256_across_pages(server, client, blobs):
    server.page_size = 1  # one file a page: Link: next is followed
    files = {f.path: f for f in client.files(QWEN)}
    assert files[QWEN_FILE].size == len(blobs["qwen"])
    assert files[QWEN_FILE].sha256 == hashlib.sha256(blobs["qwen"]).hexdigest()
    assert files[QWEN_FILE].quantization == "Q4_K_M" and files[QWEN_FILE].is_gguf
    assert files["README.md"].sha256 is None and not files["README.md"].is_gguf
    assert "extra" not in files  # a folder is no file
    assert len([r for r in server.served("hub") if "/tree/" in r["path"]]) == 4


def test_bad_names_are_refused_before_anything_is_sent(server, client, tmp_path):
    for repo, file in (("no-slash", QWEN_FILE), ("../etc/x", QWEN_FILE), (QWEN, "../../x.gguf"),
                       (QWEN, "/abs.gguf"), (QWEN, "README.md"),
                       # a repository id the hub would not give; a name no file system keeps as it is
                       ("Org/.", QWEN_FILE), ("Org/name.", QWEN_FILE), ("Org/-x", QWEN_FILE),
                       (QWEN, ".hidden/x.gguf"), (QWEN, "a/con.gguf"), (QWEN, "a:b.gguf"),
                       (QWEN, "m\u202efgg.exe-q4.gguf"), (QWEN, "dir./x.gguf"), (QWEN, "a/b/c/d/e/f/g/h/i/x.gguf")):
        with pytest.raises(HubError) as caught:
            download(client, repo, file, tmp_path)
        assert caught.value.kind == "address" and str(caught.value).endswith(".")
    assert server.requests == []


# -- downloading ----------------------------------------------------------------------------


def test_download_follows_the_redirect_verifies_and_joins_the_library(server, client, tmp_path):
    seen = []
    path = download(client, QWEN, QWEN_FILE, tmp_path / "models", progress=seen.append)
    assert path == tmp_path / "models" / "downloads" / "Qwen" / "Qwen2.5-1.5B-Instruct-GGUF" / QWEN_FILE
    assert sha(path) == server.sha256(QWEN, QWEN_FILE)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == [QWEN_FILE]  # no .partial, no record
    resolve = [r for r in server.served("hub") if "/resolve/" in r["path"]]
    assert resolve and resolve[0]["path"] == f"/{QWEN}/resolve/main/{QWEN_FILE}"
    assert [r["range"] for r in server.served("files")] == [None]
    assert seen[-1].phase == "verifying" and seen[-1].done == seen[-1].total == path.stat().st_size
    assert any(p.phase == "downloading" for p in seen)

    entries = discover_models(home=tmp_path / "home", models_dir=tmp_path / "models", env={})
    downloaded = [e for e in entries if e.source == "download"]
    assert len(downloaded) == 1 and downloaded[0].path == path and downloaded[0].repo == QWEN
    assert downloaded[0].name == "Qwen2.5 1.5B Instruct" and downloaded[0].error is None
    assert entries[0].source == "bundled" and entries[1].source == "download"

    # again: already there, nothing fetched
    before = len(server.served("files"))
    assert download(client, QWEN, QWEN_FILE, tmp_path / "models") == path
    assert len(server.served("files")) == before


def test_a_dropped_connection_is_resumed_with_range(server, client, tmp_path, blobs):
    server.drop_at = [300_000, 1_200_000]
    path = download(client, QWEN, QWEN_FILE, tmp_path)
    assert sha(path) == server.sha256(QWEN, QWEN_FILE)
    ranges = [r["range"] for r in server.served("files")]
    assert ranges[0] is None and len(ranges) == 3
    assert ranges[1] == "bytes=300000-" and ranges[2] == "bytes=1200000-"


def test_a_connection_that_keeps_dropping_keeps_the_partial_for_the_next_run(server, client, tmp_path):
    server.drop_every = 200_000
    with pytest.raises(HubError) as caught:
        download(client, QWEN, QWEN_FILE, tmp_path)
    error = caught.value
    assert error.kind == "network" and error.resumable and "download again to resume" in str(error)
    assert error.partial.name == QWEN_FILE + ".partial" and error.partial.stat().st_size == 800_000
    assert not download_target(tmp_path, QWEN, QWEN_FILE).exists()
    state = partial_state(tmp_path, QWEN, QWEN_FILE)
    assert state["done"] == 800_000 and state["total"] == len(server.repos[QWEN][QWEN_FILE])

    server.drop_every = None  # the network is back: a new run resumes (a crash leaves the same)
    before = len(server.served("files"))
    path = download(client, QWEN, QWEN_FILE, tmp_path)
    assert sha(path) == server.sha256(QWEN, QWEN_FILE)
    assert [r["range"] for r in server.served("files")[before:]] == ["bytes=800000-"]


def test_stop_keeps_the_partial_and_a_second_run_resumes(server, client, tmp_path):
    server.delay_s = 0.02
    cancel = threading.Event()

    def progress(p):
        if p.done >= 256 * 1024:
            cancel.set()

    with pytest.raises(HubError) as caught:
        download(client, QWEN, QWEN_FILE, tmp_path, cancel=cancel, progress=progress)
    assert caught.value.kind == "stopped" and caught.value.resumable
    assert str(caught.value).startswith("Stopped at ")
    done = caught.value.partial.stat().st_size
    assert 0 < done < len(server.repos[QWEN][QWEN_FILE])

    server.delay_s = 0.0
    phases = []
    path = download(client, QWEN, QWEN_FILE, tmp_path, progress=lambda p: phases.append(p.phase))
    assert sha(path) == server.sha256(QWEN, QWEN_FILE)
    assert server.served("files")[-1]["range"] == f"bytes={done}-"
    assert phases[0] == "checking"  # the bytes from before are hashed first


def test_a_checksum_mismatch_is_refused_and_the_file_never_gets_its_name(server, client, tmp_path):
    server.wrong_checksum = True
    with pytest.raises(HubError) as caught:
        download(client, QWEN, QWEN_FILE, tmp_path)
    error = caught.value
    assert error.kind == "checksum" and not error.resumable
    assert "is not the file the hub lists" in str(error) and "sha256" in str(error)
    assert not download_target(tmp_path, QWEN, QWEN_FILE).exists()
    assert error.partial.exists() and partial_state(tmp_path, QWEN, QWEN_FILE)["mismatch"]
    entries = discover_models(home=tmp_path / "home", models_dir=tmp_path, env={})
    assert not [e for e in entries if e.source == "download"]

    # the next run starts over rather than resuming a wrong file
    server.wrong_checksum = False
    path = download(client, QWEN, QWEN_FILE, tmp_path)
    assert sha(path) == server.sha256(QWEN, QWEN_FILE)
    assert server.served("files")[-1]["range"] is None


def test_the_user_may_remove_the_partial_file(server, client, tmp_path):
    server.drop_every = 100_000
    with pytest.raises(HubError):
        download(client, QWEN, QWEN_FILE, tmp_path)
    assert discard_partial(tmp_path, QWEN, QWEN_FILE)
    assert partial_state(tmp_path, QWEN, QWEN_FILE) is None
    assert list(download_target(tmp_path, QWEN, QWEN_FILE).parent.iterdir()) == []
    assert not discard_partial(tmp_path, QWEN, QWEN_FILE)


def test_a_models_folder_that_cannot_be_written_is_one_sentence(server, client, tmp_path):
    blocked = tmp_path / "models"
    blocked.write_text("a file where the folder should be")
    with pytest.raises(HubError) as caught:
        download(client, QWEN, QWEN_FILE, blocked)
    assert caught.value.kind == "write" and str(caught.value).startswith("Cannot write the download in ")
    assert server.served("files") == []


def test_a_file_that_is_not_a_gguf_is_refused(server, client, tmp_path):
    with pytest.raises(HubError) as caught:  # its first bytes are not GGUF: nothing is written
        download(client, LLAMA, "not-a-model.gguf", tmp_path)
    assert caught.value.kind == "not_gguf" and "is not a GGUF file for not-a-model.gguf" in str(caught.value)
    assert caught.value.partial is None and not list(tmp_path.rglob("*.partial"))
    assert not download_target(tmp_path, LLAMA, "not-a-model.gguf").exists()

    server.repos[LLAMA]["broken.gguf"] = b"GGUF" + b"\xff" * 2000  # starts as one, does not read as one
    with pytest.raises(HubError) as caught:
        download(client, LLAMA, "broken.gguf", tmp_path)
    assert caught.value.kind == "not_gguf" and "is not a usable GGUF file" in str(caught.value)
    assert not download_target(tmp_path, LLAMA, "broken.gguf").exists()


def test_http_failures_say_what_happened(server, client, tmp_path):
    with pytest.raises(HubError) as caught:
        download(client, QWEN, "missing-q4_k_m.gguf", tmp_path)
    assert caught.value.kind == "not_found" and "has no file missing-q4_k_m.gguf" in str(caught.value)
    with pytest.raises(HubError) as caught:
        client.files("nobody/nothing-GGUF")
    assert caught.value.kind == "not_found" and "HTTP 404" in str(caught.value)

    server.file_status = 503
    with pytest.raises(HubError) as caught:
        download(client, LLAMA, LLAMA_FILE, tmp_path)
    assert caught.value.kind == "http" and "HTTP 503" in str(caught.value)
    assert caught.value.partial is None and not list(tmp_path.rglob("*.partial"))

    with HubClient("http://127.0.0.1:9") as nowhere, pytest.raises(HubError) as caught:
        nowhere.search("qwen")
    assert caught.value.kind == "network" and "cannot be reached" in str(caught.value)
    with pytest.raises(HubError) as caught:
        HubClient("")
    assert caught.value.kind == "address"


def test_a_gated_repository_needs_the_token_which_never_reaches_the_file_host(server, tmp_path):
    server.gated, server.token = {LLAMA}, "hf_secret"
    with HubClient.for_settings(server.url) as anonymous, pytest.raises(HubError) as caught:
        download(anonymous, LLAMA, LLAMA_FILE, tmp_path)
    assert caught.value.kind == "auth" and "save a token" in str(caught.value)

    set_hub_token(server.url, "hf_secret")  # the OS keyring, as a server's API key
    with HubClient.for_settings(server.url) as client:
        path = download(client, LLAMA, LLAMA_FILE, tmp_path)
    assert sha(path) == server.sha256(LLAMA, LLAMA_FILE)
    assert server.served("hub")[-1]["authorization"] == "Bearer hf_secret"
    assert [r["authorization"] for r in server.served("files")] == [None]


def test_proxy_variables_are_honoured_for_the_hub_only(server, monkeypatch):
    """The hub client goes through HTTP_PROXY (here the loopback hub, acting as the proxy
    for a host name that does not resolve); a model server's client never does."""
    from iris_desktop.runtime.remote import ServerError, test_connection

    monkeypatch.setenv("HTTP_PROXY", server.url)
    with HubClient("http://hub.iris-test.invalid") as client:
        assert [r.id for r in client.search("llama")] == [LLAMA]
    assert server.served("hub")[-1]["proxied"] and server.served("hub")[-1]["host_header"] == "hub.iris-test.invalid"

    before = len(server.requests)
    with pytest.raises(ServerError):
        test_connection("http://llm.iris-test.invalid:8080/v1")
    assert len(server.requests) == before  # not through the proxy

    monkeypatch.setenv("HTTP_PROXY", "http://proxy:bad-port")  # one sentence, not a traceback
    with pytest.raises(HubError) as caught:
        HubClient("http://hub.iris-test.invalid")
    assert caught.value.kind == "address" and "The proxy set in the environment" in str(caught.value)


# -- disk space ------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs (tests/support/faults.py; skipped, with the reason, where mounting is not allowed)."""
    with full_disk(tmp_path, "1m") as disk:
        yield disk.path


def test_free_space_is_checked_before_a_byte_is_written(server, client, small_disk):
    with pytest.raises(HubError) as caught:
        download(client, QWEN, QWEN_FILE, small_disk, margin=0)  # ~2 MB into 1 MiB
    assert caught.value.kind == "no_space" and "Not enough free space" in str(caught.value)
    assert server.served("files") == [] and not list(small_disk.rglob("*.partial"))


def test_a_full_disk_mid_download_is_reported_and_the_partial_resumes(server, client, small_disk):
    server.delay_s = 0.02
    filler = small_disk / "filler"

    def fill_the_disk(p):
        if p.phase == "downloading" and not filler.exists():
            try:
                with open(filler, "wb", buffering=0) as handle:  # everything left, until the disk says no
                    while True:
                        handle.write(b"\0" * 4096)
            except OSError:
                pass

    with pytest.raises(HubError) as caught:
        download(client, LLAMA, LLAMA_FILE, small_disk, margin=0, progress=fill_the_disk)
    error = caught.value
    assert error.kind == "disk_full" and error.resumable and str(error).startswith("The disk is full")
    done = error.partial.stat().st_size
    assert 0 < done < len(server.repos[LLAMA][LLAMA_FILE])

    filler.unlink()
    server.delay_s = 0.0
    path = download(client, LLAMA, LLAMA_FILE, small_disk, margin=0)
    assert sha(path) == server.sha256(LLAMA, LLAMA_FILE)
    assert server.served("files")[-1]["range"] == f"bytes={done}-"


# -- the recommended models -------------------------------------------------------------------


def test_recommended_models_are_estimated_as_the_library_estimates_an_opened_model(tmp_path):
    assert len(RECOMMENDED) >= 4
    sizes = [r.size_bytes for r in RECOMMENDED]
    assert sizes == sorted(sizes), "small to larger"
    for rec in RECOMMENDED:
        assert rec.quantization == "Q4_K_M" and rec.file.endswith(".gguf")
        assert hub_client._REPO.match(rec.repo)
        a = rec.architecture
        gguf = write_gguf(tmp_path / rec.file, {
            "general.architecture": a, "general.type": "model", "general.name": rec.title,
            f"{a}.context_length": rec.context_length, f"{a}.block_count": rec.block_count,
            f"{a}.embedding_length": rec.embedding_length, f"{a}.attention.head_count": rec.head_count,
            f"{a}.attention.head_count_kv": rec.head_count_kv, "tokenizer.chat_template": "{{ x }}"})
        for n_ctx in (2048, 8192, 0):
            entry = describe_model(gguf, n_ctx=n_ctx)
            assert rec.kv_cache_bytes(n_ctx) == entry.kv_cache_bytes
    qwen3b = next(r for r in RECOMMENDED if r.repo == "Qwen/Qwen2.5-3B-Instruct-GGUF")
    # 36 layers × 2 KV heads × (128 + 128) × 2 bytes × 8192 tokens
    assert qwen3b.kv_cache_bytes(8192) == 36 * 2 * 256 * 2 * 8192
    assert qwen3b.memory_estimate_bytes(8192) == qwen3b.size_bytes + 36 * 2 * 256 * 2 * 8192
    total = system_memory_bytes()
    assert total and total > 2**28
    assert fits_in_memory(2**30, 64 * 2**30) is True and fits_in_memory(60 * 2**30, 8 * 2**30) is False
    assert fits_in_memory(None, total) is None


# -- the command line --------------------------------------------------------------------------


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_search_files_and_download_against_the_hub(server, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("IRIS_MODELS_HUB_URL", server.url)
    data = ["--data-dir", str(tmp_path / "data")]
    code, out, err = run_cli(capsys, *data, "models", "search", "qwen", "--json")
    assert code == 0 and [r["id"] for r in json.loads(out)] == ["Qwen/Qwen2.5-3B-Instruct-GGUF", QWEN]
    code, out, _ = run_cli(capsys, *data, "models", "search", "qwen", "instruct")
    assert code == 0 and out.splitlines()[1].startswith(QWEN + "  (500 downloads")

    code, out, _ = run_cli(capsys, *data, "models", "files", QWEN)
    assert code == 0 and QWEN_FILE in out and "Q4_K_M" in out and "README" not in out

    code, out, err = run_cli(capsys, *data, "models", "download", QWEN, QWEN_FILE, "--json")
    assert code == 0, err
    result = json.loads(out)
    path = Path(result["path"])
    assert path.is_file() and sha(path) == server.sha256(QWEN, QWEN_FILE)
    assert result["model"]["source"] == "download" and result["model"]["repo"] == QWEN
    assert result["model"]["quantization"] and result["model"]["error"] is None

    code, out, _ = run_cli(capsys, *data, "models", "--json")
    listed = [e for e in json.loads(out) if e["source"] == "download"]
    assert code == 0 and [e["path"] for e in listed] == [str(path)]


def test_cli_download_failures_are_one_line_and_keep_the_partial(server, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("IRIS_MODELS_HUB_URL", server.url)
    data = ["--data-dir", str(tmp_path / "data")]
    server.drop_every = 300_000
    code, out, err = run_cli(capsys, *data, "models", "download", QWEN, QWEN_FILE)
    assert code == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 2 and "kept breaking off" in lines[0] and "the partial file is kept at" in lines[1]
    assert "Traceback" not in err

    code, _, err = run_cli(capsys, *data, "models", "download", QWEN, QWEN_FILE, "--remove-partial")
    assert code == 0 and "removed the partial download" in err
    assert not list((tmp_path / "data").rglob("*.partial"))

    server.drop_every = None
    code, _, err = run_cli(capsys, *data, "models", "download", "not-a-repo", QWEN_FILE)
    assert code == 2 and "is not a repository name" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(capsys, *data, "--set", "models.hub_url=http://127.0.0.1:9", "models", "search", "x")
    assert code == 1 and "cannot be reached" in err


def test_cli_token_goes_to_the_keyring_and_opens_a_gated_repository(server, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("IRIS_MODELS_HUB_URL", server.url)
    server.gated, server.token = {LLAMA}, "hf_from_the_cli"
    data = ["--data-dir", str(tmp_path / "data")]
    code, _, err = run_cli(capsys, *data, "models", "download", LLAMA, LLAMA_FILE)
    assert code == 1 and "save a token" in err and len(err.strip().splitlines()) == 1

    asked = len(server.requests)
    monkeypatch.setattr("sys.stdin", io.StringIO("hf_from_the_cli\n"))
    code, _, err = run_cli(capsys, *data, "models", "token")
    assert code == 0 and "saved the token" in err and len(server.requests) == asked  # contacts nothing
    assert get_hub_token(server.url) == "hf_from_the_cli"
    code, out, err = run_cli(capsys, *data, "models", "download", LLAMA, LLAMA_FILE)
    assert code == 0, err
    assert [r["authorization"] for r in server.served("files")] == [None]  # never to the file host

    code, _, err = run_cli(capsys, *data, "models", "token", "--remove")
    assert code == 0 and get_hub_token(server.url) is None


# -- a silent file host, Stop, and the pause before a resume ---------------------------------------


def _download_in_thread(client, tmp_path, cancel, **kwargs):
    result: dict = {}

    def run():
        try:
            result["path"] = download(client, QWEN, QWEN_FILE, tmp_path, cancel=cancel, **kwargs)
        except HubError as exc:
            result["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    return worker, result


def test_stop_ends_a_download_at_once_while_the_file_host_sends_nothing(server, client, tmp_path):
    """The file host stops sending mid-file, the connection open: Stop ends the download
    within a moment (it waited for the 60 s read timeout, then three more tries: 4 min),
    as the same "Stopped at" a Stop of a flowing download gives; the next run resumes."""
    server.stall_at, server.hold_s = [300_000], 60
    cancel = threading.Event()
    worker, result = _download_in_thread(client, tmp_path, cancel)
    assert server.stalled.wait(10)
    time.sleep(0.3)
    stopped_at = time.monotonic()
    cancel.set()
    worker.join(5)
    assert not worker.is_alive() and time.monotonic() - stopped_at < 1.5
    error = result["error"]
    assert error.kind == "stopped" and error.resumable and str(error).startswith("Stopped at ")
    assert error.partial.stat().st_size == 300_000
    assert len(server.served("files")) == 1  # no retry after a Stop

    path = download(client, QWEN, QWEN_FILE, tmp_path)
    assert sha(path) == server.sha256(QWEN, QWEN_FILE)
    assert server.served("files")[-1]["range"] == "bytes=300000-"


def test_a_stall_with_no_stop_is_named_after_stall_s(server, client, tmp_path, monkeypatch):
    monkeypatch.setattr(downloading, "STALL_S", 1.0)
    server.stall_at, server.hold_s = [300_000], 30
    began = time.monotonic()
    with pytest.raises(HubError) as caught:
        download(client, QWEN, QWEN_FILE, tmp_path)
    assert time.monotonic() - began < 5
    error = caught.value
    assert error.kind == "network" and error.resumable and error.partial.stat().st_size == 300_000
    assert str(error).startswith(f"The file host for {QWEN_FILE} sent nothing for 1 s at ")
    assert str(error).endswith("download again to resume.")
    assert len(server.served("files")) == 1  # named, not retried


def test_stop_during_the_pause_before_a_resume_ends_at_once(server, client, tmp_path, monkeypatch):
    monkeypatch.setattr(downloading, "RESUME_PAUSE_S", 30.0)
    server.drop_every = 200_000
    cancel = threading.Event()
    worker, result = _download_in_thread(client, tmp_path, cancel)
    target = download_target(tmp_path, QWEN, QWEN_FILE)
    partial = target.with_name(target.name + ".partial")
    end = time.monotonic() + 10
    while not (partial.exists() and partial.stat().st_size == 200_000) and time.monotonic() < end:
        time.sleep(0.02)
    time.sleep(0.3)  # in the pause now
    stopped_at = time.monotonic()
    cancel.set()
    worker.join(5)
    assert not worker.is_alive() and time.monotonic() - stopped_at < 1.5
    assert result["error"].kind == "stopped" and len(server.served("files")) == 1


# -- what the hub's answers may not do ---------------------------------------------------------------


def test_the_token_never_follows_a_next_page_to_another_address(server, tmp_path):
    server.page_size = 1
    server.next_url = f"{server.files_url}/api/models/{QWEN}/tree/main"  # another port: another origin
    with HubClient(server.url, token="hf_secret") as client, pytest.raises(HubError) as caught:
        client.files(QWEN)
    message = str(caught.value)
    assert caught.value.kind == "answer" and "to another address" in message and "token stays" in message
    assert server.served("files") == []
    assert [r["authorization"] for r in server.served("hub")] == ["Bearer hf_secret"]

    server.next_url = f"{server.url}/api/models/{QWEN}/tree/main"  # the hub itself: followed
    with HubClient(server.url, token="hf_secret") as client:
        assert QWEN_FILE in {f.path for f in client.files(QWEN)}


def test_a_deeply_nested_answer_is_said_as_not_json(server, client):
    server.answer_fault, server.answer_match = "deep", "/api/models"
    for ask in (lambda: client.search("qwen"), lambda: client.files(QWEN)):
        with pytest.raises(HubError) as caught:
            ask()
        assert caught.value.kind == "answer" and "did not answer JSON" in str(caught.value)


def test_a_file_list_is_bounded_across_its_pages_and_a_search_by_its_limit(server, client, monkeypatch):
    monkeypatch.setattr(hub_client, "MAX_LIST_ENTRIES", 6)
    server.extra_entries = [{"type": "file", "path": f"many/f{i}.gguf", "size": 10} for i in range(40)]
    server.page_size = 5
    files = client.files(QWEN)
    assert len(files) == 6 and files.cut is not None
    assert "so the list was cut there" in files.cut and files.cut.endswith(".")
    assert len([r for r in server.served("hub") if "/tree/" in r["path"]]) == 2
    with pytest.raises(HubError) as caught:  # a file after the cut: said, not "no such file"
        download(client, QWEN, "many/f39.gguf", Path("/nonexistent"))
    assert "the list was cut" in str(caught.value)

    monkeypatch.setattr(hub_client, "MAX_LIST_ENTRIES", 50_000)
    monkeypatch.setattr(hub_client, "MAX_LIST_BYTES", 1500)  # all pages together
    files = client.files(QWEN)
    assert files.cut is not None and 0 < len(files) < 45

    assert len(client.search("qwen", limit=1)) == 1  # the hub sent two


# -- a login page, a redirect loop, a file host that sends too much -------------------------------


def test_a_login_page_never_becomes_the_partial_file(server, client, tmp_path):
    server.portal = "text/html; charset=utf-8"
    with pytest.raises(HubError) as caught:
        download(client, QWEN, QWEN_FILE, tmp_path)
    assert caught.value.kind == "network" and "answered with a web page (a login page?)" in str(caught.value)
    assert caught.value.partial is None and not list(tmp_path.rglob("*.partial"))
    server.portal = "application/octet-stream"  # a portal that does not say it is a page
    with pytest.raises(HubError) as caught:
        download(client, QWEN, QWEN_FILE, tmp_path)
    assert caught.value.kind == "not_gguf" and not list(tmp_path.rglob("*.partial"))

    # a partial from before is left as it was, and resumed once the network is back
    server.portal, server.drop_every = None, 300_000
    with pytest.raises(HubError):
        download(client, QWEN, QWEN_FILE, tmp_path)
    server.drop_every = None
    partial = download_target(tmp_path, QWEN, QWEN_FILE).with_name(QWEN_FILE + ".partial")
    have = partial.stat().st_size
    assert 0 < have < len(server.repos[QWEN][QWEN_FILE])
    for portal in ("text/html", "application/octet-stream"):  # 200 to a Range: it was taken as a restart
        server.portal = portal
        with pytest.raises(HubError) as caught:
            download(client, QWEN, QWEN_FILE, tmp_path)
        assert caught.value.resumable and partial.stat().st_size == have, str(caught.value)
        assert "download again to resume" in str(caught.value)
    server.portal = None
    path = download(client, QWEN, QWEN_FILE, tmp_path)
    assert sha(path) == server.sha256(QWEN, QWEN_FILE)
    assert server.served("files")[-1]["range"] == f"bytes={have}-"


def test_a_partial_file_that_is_not_the_start_of_a_gguf_is_not_resumed(server, client, tmp_path):
    """A login page an older Iris kept as the start of the partial file: started over
    (it was resumed, the whole rest downloaded before the sha256 failed)."""
    server.drop_every = 300_000
    with pytest.raises(HubError):
        download(client, QWEN, QWEN_FILE, tmp_path)
    server.drop_every = None
    partial = download_target(tmp_path, QWEN, QWEN_FILE).with_name(QWEN_FILE + ".partial")
    with open(partial, "r+b") as handle:
        handle.write(b"<html>")
    path = download(client, QWEN, QWEN_FILE, tmp_path)
    assert sha(path) == server.sha256(QWEN, QWEN_FILE)
    assert server.served("files")[-1]["range"] is None


@pytest.mark.parametrize("where, words", [("loop", "kept redirecting (more than 10 times, last to "),
                                          ("file:///etc/passwd", "redirected to 'file:///etc/passwd', which is "
                                                                 "not an http:// or https:// address")])
def test_a_redirect_loop_or_elsewhere_is_one_sentence_not_retried(server, client, tmp_path, monkeypatch,
                                                                   where, words):
    monkeypatch.setattr(downloading, "RESUME_PAUSE_S", 5.0)  # a retry would show in the time taken
    server.resolve_to = where
    began = time.monotonic()
    with pytest.raises(HubError) as caught:
        download(client, QWEN, QWEN_FILE, tmp_path)
    assert time.monotonic() - began < 3
    message = str(caught.value)
    assert caught.value.kind == "http" and words in message and "resume" not in message, message
    assert len([r for r in server.served("hub") if "/resolve/" in r["path"]]) <= 11


def test_a_file_host_that_sends_too_much_makes_the_next_download_start_over(server, client, tmp_path):
    """With no length said (a length unlike the hub's is refused before a byte is written:
    ``test_hub_hostile_more``), the bytes are counted as they arrive."""
    server.blob_extra, server.no_length = 100, True
    with pytest.raises(HubError) as caught:
        download(client, QWEN, QWEN_FILE, tmp_path)
    error = caught.value
    assert "sent more than the" in str(error) and "start over" in str(error) and not error.resumable
    assert partial_state(tmp_path, QWEN, QWEN_FILE)["mismatch"]  # Download, not Resume
    server.blob_extra, server.no_length = 0, False
    path = download(client, QWEN, QWEN_FILE, tmp_path)
    assert sha(path) == server.sha256(QWEN, QWEN_FILE) and server.served("files")[-1]["range"] is None


def test_an_error_status_says_the_standard_words_not_the_hosts(server, client, tmp_path):
    server.file_status, server.file_reason = 502, '<a href="https://evil.example/">Sign in again</a>'
    with pytest.raises(HubError) as caught:
        download(client, QWEN, QWEN_FILE, tmp_path)
    message = str(caught.value)
    assert "HTTP 502 (Bad Gateway)" in message and "<a" not in message and "Sign in" not in message


# -- two files of one name in two folders ---------------------------------------------------------


def test_two_files_of_one_name_in_two_folders_are_two_files(server, client, tmp_path, blobs):
    server.repos[QWEN].update({"a/model.gguf": blobs["llama"], "b/model.gguf": blobs["q8"]})
    first = download(client, QWEN, "a/model.gguf", tmp_path)
    second = download(client, QWEN, "b/model.gguf", tmp_path)
    root = tmp_path / "downloads" / "Qwen" / "Qwen2.5-1.5B-Instruct-GGUF"
    assert (first, second) == (root / "a" / "model.gguf", root / "b" / "model.gguf")
    assert first.read_bytes() == blobs["llama"] and second.read_bytes() == blobs["q8"]
    assert download_record(tmp_path, QWEN, "a/model.gguf")["file"] == "a/model.gguf"
    assert download_record(tmp_path, QWEN, "b/model.gguf", "main")["verified_by_hub"] is True
    assert download_record(tmp_path, QWEN, "b/model.gguf", "v2") is None  # another revision
    assert download_record(tmp_path, QWEN, "model.gguf") is None  # not downloaded at the top
    fetched = len(server.served("files"))
    assert download(client, QWEN, "a/model.gguf", tmp_path) == first
    assert len(server.served("files")) == fetched


def test_a_file_of_a_folder_an_older_iris_kept_by_its_name_is_moved_not_fetched_again(
        server, client, tmp_path, blobs):
    """A review: an older Iris kept ``a/model.gguf`` as ``<org>/<repo>/model.gguf``; kept
    now under ``a/``, the finished file was fetched again (many GB) and a half-finished
    one started over, the old copy left beside. Its record names the file: it moves."""
    import shutil

    server.repos[QWEN].update({"a/model.gguf": blobs["llama"], "b/part.gguf": blobs["q8"]})
    new = download(client, QWEN, "a/model.gguf", tmp_path)
    root = tmp_path / "downloads" / "Qwen" / "Qwen2.5-1.5B-Instruct-GGUF"
    records = tmp_path / "downloads" / ".records" / "Qwen" / "Qwen2.5-1.5B-Instruct-GGUF"
    shutil.move(new, root / "model.gguf")  # where the older Iris kept it, with its record
    shutil.move(records / "a" / "model.gguf.json", records / "model.gguf.json")
    fetched = len(server.served("files"))
    assert download_record(tmp_path, QWEN, "a/model.gguf")["path"] == str(new)
    assert download(client, QWEN, "a/model.gguf", tmp_path) == new
    assert len(server.served("files")) == fetched and not (root / "model.gguf").exists()
    half = root / "part.gguf.partial"  # a half download of the older layout
    half.write_bytes(blobs["q8"][:1000])
    (root / "part.gguf.partial.json").write_text(json.dumps(
        {"repo": QWEN, "file": "b/part.gguf", "revision": "main", "size": len(blobs["q8"])}))
    assert partial_state(tmp_path, QWEN, "b/part.gguf")["done"] == 1000  # resumed, not anew
    assert download(client, QWEN, "b/part.gguf", tmp_path).read_bytes() == blobs["q8"]
    assert not half.exists()
    (root / "model.gguf.partial").write_bytes(b"GGUF")  # another file's: left alone
    (root / "model.gguf.partial.json").write_text(json.dumps({"repo": QWEN, "file": "model.gguf"}))
    assert partial_state(tmp_path, QWEN, "c/model.gguf") is None
    assert (root / "model.gguf.partial").exists()


def test_a_download_of_an_older_iris_is_still_found(server, client, tmp_path, blobs):
    """The old layout: every file directly under <org>/<repo>/. A file at the top of the
    repository is where it always was; a file of a folder kept there is not taken for
    the file of that name at the top."""
    path = download(client, QWEN, QWEN_FILE, tmp_path)
    assert path.parent.name == "Qwen2.5-1.5B-Instruct-GGUF"
    fetched = len(server.served("files"))
    assert download(client, QWEN, QWEN_FILE, tmp_path) == path and len(server.served("files")) == fetched
    assert download_record(tmp_path, QWEN, QWEN_FILE)["file"] == QWEN_FILE

    record = tmp_path / "downloads" / ".records" / "Qwen" / "Qwen2.5-1.5B-Instruct-GGUF" / f"{QWEN_FILE}.json"
    data = json.loads(record.read_text())
    record.write_text(json.dumps({**data, "file": f"sub/{QWEN_FILE}"}))  # an older Iris kept sub/… here
    assert download_record(tmp_path, QWEN, QWEN_FILE) is None
