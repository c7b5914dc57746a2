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
from pathlib import Path

import pytest

from iris_desktop.cli import main
from iris_desktop.runtime.hub import (
    RECOMMENDED,
    HubClient,
    HubError,
    discard_partial,
    download,
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
                       (QWEN, "/abs.gguf"), (QWEN, "README.md")):
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
    with pytest.raises(HubError) as caught:
        download(client, LLAMA, "not-a-model.gguf", tmp_path)
    assert caught.value.kind == "not_gguf" and "is not a usable GGUF file (not a GGUF file" in str(caught.value)
    assert not download_target(tmp_path, LLAMA, "not-a-model.gguf").exists()


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
