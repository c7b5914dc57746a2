"""Model downloads against a hub that misleads (an audit of ``runtime.hub``, round two):
a file host whose file is not as long as the hub lists it, a file host that cannot be
reached (its certificate, its port), a hub whose answer redirects in a loop, and an
https:// hub that sends the download to plain http://.

Against the real hub and file host on 127.0.0.1 (``tests/support/hub_server.py``, https
with a self-signed certificate where it says so), real files; what is counted is the file
host's requests and the partial file's bytes, never the time taken.
"""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path

import pytest

from iris_desktop.runtime.hub import HubClient, HubError, download, download_target, downloading
from iris_desktop.runtime.hub.records import _write_record

from support.hub_server import HubServer, gguf_bytes, self_signed

REPO = "iris-test/Tiny-GGUF"
FILE = "tiny-q4_k_m.gguf"

pytestmark = pytest.mark.usefixtures("no_proxy_no_keyring")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return gguf_bytes(tmp_path_factory.mktemp("blobs"), "Tiny Hostile", 256 * 1024)  # about 1 MiB


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    pytest.importorskip("cryptography")
    return self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def server(data):
    with HubServer({REPO: {FILE: data}}) as s:
        s.hold_s = 20.0
        yield s


@pytest.fixture
def client(server):
    with HubClient(server.url) as c:
        yield c


@pytest.fixture(autouse=True)
def quick_resume(monkeypatch):
    monkeypatch.setattr(downloading, "RESUME_PAUSE_S", 0.0)


def partial_of(models: Path) -> Path:
    target = download_target(models, REPO, FILE)
    return target.with_name(target.name + ".partial")


def hub_port(server: HubServer) -> int:
    return server.hub.server_address[1]


def failure(client: HubClient, models) -> HubError:
    with pytest.raises(HubError) as raised:
        download(client, REPO, FILE, models)
    return raised.value


# -- 1. a file host whose file is not as long as the hub lists it -----------------------------------


@pytest.mark.parametrize("more", [1000, -1000])
def test_a_file_of_another_size_than_listed_is_asked_for_once_and_both_sizes_named(server, client, tmp_path,
                                                                                   data, more):
    """Before (listed 1,000 bytes longer): the whole file was downloaded, found short, its
    resume refused (416), the partial emptied, and all of it downloaded again: four
    requests a run, ending with "kept breaking off (the file host refused to resume) at 0
    bytes", each run again. Listed shorter: all but the last block was downloaded first.
    Now: one request, both sizes named, nothing written."""
    server.listed = {FILE: {"size": len(data) + more}}
    for run in (1, 2):
        error = failure(client, tmp_path)
        message = str(error)
        assert message == (f"The file host serves {len(data):,} bytes for {FILE} where the model hub "
                           f"127.0.0.1:{hub_port(server)} lists {len(data) + more:,}, so one of them is "
                           "wrong; Iris did not download it: try again later, or choose another file.")
        assert error.kind == "answer" and error.partial is None
        assert [r["range"] for r in server.served("files")] == [None] * run  # the whole file: once a run
        assert not partial_of(tmp_path).exists()


def test_a_partial_file_is_kept_as_it_is_when_the_file_host_says_another_size(server, client, tmp_path, data):
    """A partial file from before (its record as the hub lists the file now) and a file
    host whose Content-Range says another total: the partial is not added to, emptied or
    downloaded again."""
    listed = len(data) + 1000
    server.listed = {FILE: {"size": listed}}
    partial, have = partial_of(tmp_path), 300_000
    partial.parent.mkdir(parents=True)
    partial.write_bytes(data[:have])
    _write_record(download_target(tmp_path, REPO, FILE),
                  {"repo": REPO, "file": FILE, "revision": "main", "size": listed,
                   "sha256": hashlib.sha256(data).hexdigest()})
    error = failure(client, tmp_path)
    assert f"serves {len(data):,} bytes for {FILE}" in str(error) and f"lists {listed:,}" in str(error)
    assert error.partial == partial and partial.read_bytes() == data[:have]
    assert [r["range"] for r in server.served("files")] == [f"bytes={have}-"]


def test_a_refused_resume_for_all_the_bytes_held_does_not_empty_them(server, client, tmp_path, data):
    """A file host that says no length: the whole file arrives, shorter than listed; the
    resume is refused with ``bytes */N``, N the bytes held. Before: the partial was
    emptied and the file downloaded again (twice a run). Now: the partial is kept, both
    sizes named, and the file host asked twice in all."""
    server.no_length = True
    server.listed = {FILE: {"size": len(data) + 1000}}
    error = failure(client, tmp_path)
    assert f"serves {len(data):,} bytes for {FILE}" in str(error), str(error)
    assert f"lists {len(data) + 1000:,}" in str(error)
    assert partial_of(tmp_path).read_bytes() == data and error.partial == partial_of(tmp_path)
    assert [r["range"] for r in server.served("files")] == [None, f"bytes={len(data)}-"]


# -- 2. a file host that cannot be reached: which one, and why ---------------------------------


def test_a_file_host_with_an_untrusted_certificate_is_named_with_the_cause(data, certificate, tmp_path):
    """Before: "The file host for tiny-q4_k_m.gguf cannot be reached (cannot connect); check
    the network." (the hub with the same certificate was said as one this computer does not
    trust). Now: the file host's address and the cause."""
    with HubServer({REPO: {FILE: data}}, files_tls=certificate) as server, HubClient(server.url) as client:
        error = failure(client, tmp_path)
        files_port = server.files.server_address[1]
        message = str(error)
        assert message.startswith(
            f"The file host 127.0.0.1:{files_port} that the model hub 127.0.0.1:{hub_port(server)} sends "
            f"{FILE} from has a self-signed certificate, which this computer does not trust, so Iris "
            "did not connect; "), message
        assert error.kind == "network" and "\n" not in message and "[SSL" not in message
        assert not partial_of(tmp_path).exists()


def test_a_file_host_that_refuses_the_connection_is_named(server, client, tmp_path):
    with socket.socket() as spare:  # a port nothing listens on
        spare.bind(("127.0.0.1", 0))
        port = spare.getsockname()[1]
    server.resolve_to = f"http://127.0.0.1:{port}/blob/x"
    error = failure(client, tmp_path)
    assert str(error) == (f"The file host 127.0.0.1:{port} that the model hub 127.0.0.1:{hub_port(server)} "
                          f"sends {FILE} from cannot be reached (cannot connect); check the network, and "
                          f"that a firewall or proxy lets 127.0.0.1:{port} through as it does the hub.")
    assert error.kind == "network"


# -- 3. a hub whose answer redirects in a loop -----------------------------------------------------


def test_a_hub_answer_that_keeps_redirecting_is_said_so_not_unreachable(server, client):
    """Before: "The model hub … cannot be reached (the request failed: Exceeded maximum
    allowed redirects.)": it was reached, many times."""
    server.answer_fault = "redirect"
    server.redirect_location = f"{server.url}/api/models/{REPO}/tree/main?recursive=true"
    with pytest.raises(HubError) as raised:
        client.files(REPO)
    assert str(raised.value) == (
        f"The model hub 127.0.0.1:{hub_port(server)} kept redirecting {REPO} at main (more than 20 "
        f"times, last to {server.url}/api/models/{REPO}/tree/main); Iris stopped following it: try "
        "again later, or check models.hub_url.")
    assert raised.value.kind == "answer" and len(server.served("hub")) <= 21


# -- 4. an https:// hub that sends the download to plain http:// ---------------------------------


def test_an_https_hub_that_sends_the_file_to_plain_http_is_not_followed(data, certificate, tmp_path,
                                                                        monkeypatch):
    """Before: followed without a word; with no sha256 listed the file came over plain
    http and was only "not verified by the hub" in the log."""
    monkeypatch.setenv("SSL_CERT_FILE", certificate[0])  # this computer trusts the hub
    with HubServer({REPO: {FILE: data}}, hub_tls=certificate) as server, HubClient(server.url) as client:
        server.listed = {FILE: {"sha256": None}}
        error = failure(client, tmp_path)
        files_port = server.files.server_address[1]
        assert str(error) == (
            f"The model hub 127.0.0.1:{hub_port(server)} redirected the download of {FILE} from https:// "
            f"to plain http:// (127.0.0.1:{files_port}), where it could be read or changed on the way; "
            "Iris did not follow it (check models.hub_url, or the network's proxy).")
        assert server.served("files") == [] and not partial_of(tmp_path).exists()
        assert server.url.startswith("https://")


def test_an_https_hub_and_file_host_still_download(data, certificate, tmp_path, monkeypatch):
    monkeypatch.setenv("SSL_CERT_FILE", certificate[0])
    with HubServer({REPO: {FILE: data}}, hub_tls=certificate, files_tls=certificate) as server, \
            HubClient(server.url) as client:
        server.drop_at = [400_000]  # and a resume over https
        path = download(client, REPO, FILE, tmp_path)
        assert path.read_bytes() == data
        assert [r["range"] for r in server.served("files")] == [None, "bytes=400000-"]
