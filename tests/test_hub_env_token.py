"""The token of the Hugging Face tools' environment (``HF_TOKEN``, then
``HUGGING_FACE_HUB_TOKEN``): read when the keyring holds none for the hub, and sent to
``https://huggingface.co`` only, never to another ``models.hub_url`` nor across a redirect
to another host; a refusal names where the token came from.

"https://huggingface.co" is reached for real, by its name, without leaving this machine:
``HTTPS_PROXY`` points at a proxy on loopback that answers ``CONNECT huggingface.co:443``
itself, ends TLS with a certificate for that name (signed by an authority of this test,
which ``SSL_CERT_FILE`` makes the client trust) and passes the requests on to the loopback
hub (``tests/support/hub_server.py``), whose file host stays another origin, over https
too (a certificate for 127.0.0.1 from the same authority; reached directly, ``NO_PROXY``:
an https:// hub's download is never followed to plain http://). No name is looked up and
no address outside loopback is connected to (``connects``)."""

from __future__ import annotations

import datetime
import ipaddress
import select
import socket
import ssl
import threading
from pathlib import Path

import pytest

from iris_desktop.runtime.hub import HubClient, HubError, download, get_hub_token, set_hub_token

from support.helpers import one_sentence, run_cli
from support.hub_server import HubServer, gguf_bytes

LLAMA = "bartowski/Llama-3.2-3B-Instruct-GGUF"
LLAMA_FILE = "Llama-3.2-3B-Instruct-Q4_K_M.gguf"
HF = "https://huggingface.co"

pytestmark = pytest.mark.usefixtures("no_proxy_no_keyring")


@pytest.fixture(autouse=True)
def no_token_variables(monkeypatch):
    """None of the developer's own Hugging Face tokens."""
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def blob(tmp_path_factory):
    return gguf_bytes(tmp_path_factory.mktemp("blobs"), "Llama 3.2 3B Instruct", 16 * 1024)


@pytest.fixture
def hub(blob, tls_files):
    with HubServer({LLAMA: {LLAMA_FILE: blob}}, downloads={LLAMA: 10},
                   files_tls=(tls_files["files_cert"], tls_files["files_key"])) as server:
        server.gated, server.token = {LLAMA}, "hf_env_secret"
        yield server


# -- huggingface.co on loopback ---------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory) -> dict[str, str]:
    """A test certificate authority, and the certificates it signed for huggingface.co and
    for 127.0.0.1 (the file host), with their keys (PEM)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Iris test authority")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(ca_ski, critical=False)
          .sign(ca_key, hashes.SHA256()))
    folder = tmp_path_factory.mktemp("tls")
    pem = serialization.Encoding.PEM
    (folder / "ca.pem").write_bytes(ca.public_bytes(pem))
    for prefix, common, alt in (("", "huggingface.co", x509.DNSName("huggingface.co")),
                                ("files_", "127.0.0.1", x509.IPAddress(ipaddress.ip_address("127.0.0.1")))):
        key = ec.generate_private_key(ec.SECP256R1())
        leaf = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)]))
                .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(days=1))
                .not_valid_after(now + datetime.timedelta(days=30))
                .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
                               critical=False)
                .sign(ca_key, hashes.SHA256()))
        (folder / f"{prefix}cert.pem").write_bytes(leaf.public_bytes(pem))
        (folder / f"{prefix}key.pem").write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                                    serialization.NoEncryption()))
    return {name: str(folder / f"{name}.pem") for name in ("ca", "cert", "key", "files_cert", "files_key")}


class HuggingFaceProxy:
    """An HTTPS proxy on loopback whose every tunnel ends here: TLS with the certificate
    for huggingface.co, the requests passed on to the hub server's port. ``connects``:
    the ``host:port`` of every CONNECT."""

    def __init__(self, hub_port: int, files: dict[str, str]) -> None:
        self.hub_port = hub_port
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(files["cert"], files["key"])
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.connects: list[str] = []
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._tunnel, args=(conn,), daemon=True).start()

    def _tunnel(self, conn: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(4096)
            if not chunk:
                conn.close()
                return
            head += chunk
        self.connects.append(head.split(b"\r\n")[0].decode("latin-1").split()[1])
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        try:
            tls = self.context.wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError):  # the client did not trust it
            conn.close()
            return
        upstream = socket.create_connection(("127.0.0.1", self.hub_port))
        try:
            while True:  # one thread moves both ways: an SSL socket is not shared
                ready = [tls] if tls.pending() else select.select([tls, upstream], [], [], 5)[0]
                if not ready:
                    continue
                for side in ready:
                    data = side.recv(65536)
                    if not data:
                        return
                    (upstream if side is tls else tls).sendall(data)
        except (OSError, ssl.SSLError):
            return
        finally:
            upstream.close()
            tls.close()

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def hugging_face(hub, tls_files, monkeypatch, connects):
    """https://huggingface.co is the loopback hub (through :class:`HuggingFaceProxy`)."""
    proxy = HuggingFaceProxy(hub.hub.server_address[1], tls_files)
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # the file host, over https, directly
    monkeypatch.setenv("SSL_CERT_FILE", tls_files["ca"])
    yield proxy
    proxy.close()
    assert not [c for c in connects if isinstance(c, tuple) and c[0] not in ("lookup", "127.0.0.1")
                or c[:1] == ("lookup",) and c[1] not in ("127.0.0.1", "localhost")], connects


def _sent(hub: HubServer) -> list[str | None]:
    return [r["authorization"] for r in hub.served("hub")]


# -- the environment's token goes to huggingface.co, over HTTPS -----------------------------


def test_hf_token_is_sent_to_hugging_face_and_never_to_its_file_host(hub, hugging_face, tmp_path,
                                                                     monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_env_secret")
    with HubClient.for_settings(HF) as client:
        path = download(client, LLAMA, LLAMA_FILE, tmp_path)  # before: refused (HTTP 401)
    assert client.token.source == "HF_TOKEN" and path.read_bytes() == hub.repos[LLAMA][LLAMA_FILE]
    assert hugging_face.connects and set(hugging_face.connects) == {"huggingface.co:443"}
    assert {r["host_header"] for r in hub.served("hub")} == {"huggingface.co"}  # it was huggingface.co
    assert set(_sent(hub)) == {"Bearer hf_env_secret"}
    assert [r["authorization"] for r in hub.served("files")] == [None]  # the redirect to another host


def test_hugging_face_hub_token_is_read_after_hf_token(hub, hugging_face, monkeypatch):
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", "hf_older_name")
    with HubClient.for_settings(HF) as client:
        client.search("llama")
    monkeypatch.setenv("HF_TOKEN", "hf_env_secret")
    with HubClient.for_settings(HF) as client:
        client.search("llama")
    assert _sent(hub) == ["Bearer hf_older_name", "Bearer hf_env_secret"]


def test_the_keyring_token_is_sent_before_the_environments(hub, hugging_face, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_TOKEN", "hf_stale_env")
    set_hub_token(HF, "hf_env_secret")  # what the user gave Iris, for this hub
    with HubClient.for_settings(HF) as client:
        download(client, LLAMA, LLAMA_FILE, tmp_path)
    assert set(_sent(hub)) == {"Bearer hf_env_secret"}


# -- never elsewhere ------------------------------------------------------------------------


def test_the_environments_token_never_goes_to_another_hub(hub, tmp_path, monkeypatch, capsys):
    """A ``models.hub_url`` of another host (a mirror, a hub of one's own), or huggingface.co
    over plain http (here through ``HTTP_PROXY``, the loopback hub acting as the proxy):
    the token is not sent, and a gated model asks to save one."""
    monkeypatch.setenv("HF_TOKEN", "hf_env_secret")
    with HubClient.for_settings(hub.url) as client, pytest.raises(HubError) as caught:
        download(client, LLAMA, LLAMA_FILE, tmp_path)
    assert caught.value.kind == "auth" and "save a token" in str(caught.value)

    monkeypatch.setenv("HTTP_PROXY", hub.url)
    with HubClient.for_settings("http://huggingface.co") as client:
        assert [r.id for r in client.search("llama")] == [LLAMA]
    assert hub.served("hub")[-1]["host_header"] == "huggingface.co"

    monkeypatch.delenv("HTTP_PROXY")
    monkeypatch.setenv("IRIS_MODELS_HUB_URL", hub.url)
    code, _, err = run_cli(capsys, "--data-dir", tmp_path / "data", "models", "download", LLAMA, LLAMA_FILE)
    assert code == 1 and "save a token" in err and one_sentence(err), err
    assert set(_sent(hub)) == {None} and not list(Path(tmp_path / "data").rglob("*.gguf"))


def test_only_hugging_face_over_https_is_hugging_face():
    from iris_desktop.runtime.hub.token import is_hugging_face

    for url in ("https://huggingface.co", "https://HuggingFace.co/", "https://huggingface.co:443",
                " https://huggingface.co "):
        assert is_hugging_face(url), url
    for url in ("http://huggingface.co", "https://huggingface.co:8443", "https://hf-mirror.com",
                "https://huggingface.co.example.com", "https://user@evil.example/huggingface.co",
                "https://hf.co", "", "not a url"):
        assert not is_hugging_face(url), url


# -- what is said --------------------------------------------------------------------------


def test_a_refused_token_is_named_by_where_it_came_from(hub, hugging_face, tmp_path, monkeypatch, capsys):
    data = ["--data-dir", tmp_path / "data"]
    monkeypatch.setenv("HF_TOKEN", "hf_expired")
    code, _, err = run_cli(capsys, *data, "models", "download", LLAMA, LLAMA_FILE)
    assert code == 1 and one_sentence(err), err
    assert "(HTTP 401) with the token from HF_TOKEN:" in err and "set HF_TOKEN to a valid token" in err
    assert "hf_expired" not in err

    set_hub_token(HF, "hf_also_expired")
    code, _, err = run_cli(capsys, *data, "models", "download", LLAMA, LLAMA_FILE)
    assert code == 1 and one_sentence(err), err
    assert "with the token saved in the keyring for this hub:" in err and "save another token" in err
    assert _sent(hub) == ["Bearer hf_expired", "Bearer hf_also_expired"]

    set_hub_token(HF, "")
    monkeypatch.setenv("HF_TOKEN", "hf_env_secret")
    code, out, err = run_cli(capsys, *data, "models", "download", LLAMA, LLAMA_FILE)
    assert code == 0, err
    assert out.strip().endswith(LLAMA_FILE)


def test_a_variable_that_holds_no_token_is_said_and_nothing_is_sent(hub, hugging_face, tmp_path,
                                                                    monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", "hf_first hf_second")
    code, _, err = run_cli(capsys, "--data-dir", tmp_path / "data", "models", "search", "llama")
    assert code == 2 and one_sentence(err), err
    assert "HF_TOKEN holds something that is not a token" in err and "hf_first" not in err
    assert hub.requests == [] and hugging_face.connects == []

    monkeypatch.setenv("HF_TOKEN", "  hf_env_secret\n")  # as the Hugging Face tools read it
    with HubClient.for_settings(HF) as client:
        client.search("llama")
    assert _sent(hub) == ["Bearer hf_env_secret"]


def test_models_token_says_which_token_is_sent(hub, hugging_face, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", "hf_env_secret")
    data = ["--data-dir", tmp_path / "data"]
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("hf_saved\n"))
    code, _, err = run_cli(capsys, *data, "models", "token")
    assert code == 0 and "saved the token in the keyring for https://huggingface.co" in err
    assert "(it is sent instead of the one in HF_TOKEN)" in err and get_hub_token(HF) == "hf_saved"
    code, _, err = run_cli(capsys, *data, "models", "token", "--remove")
    assert code == 0 and "the token in HF_TOKEN is sent to it instead" in err and get_hub_token(HF) is None
    assert hub.requests == [] and hugging_face.connects == []  # contacts nothing

    monkeypatch.setenv("IRIS_MODELS_HUB_URL", hub.url)  # another hub: HF_TOKEN is not its
    code, _, err = run_cli(capsys, *data, "models", "token", "--remove")
    assert code == 0 and "HF_TOKEN" not in err


@pytest.mark.parametrize("hub", ["https://xn--a.co", "https://xn--huggingface-.co",
                                 "https://\uff48\uff55\uff47\uff47\uff49\uff4e\uff47\uff46\uff41\uff43\uff45.co"])
def test_a_hub_address_no_name_can_be_is_one_sentence(capsys, tmp_path, monkeypatch, hub):
    """An audit: an IDNA name that cannot be one printed only idna's words ("Codepoint
    U+0080 at position 1 …") as if a token variable were bad, and a fullwidth one gave
    "unexpected error (InvalidURL …); this is a bug in Iris". Nothing is sent."""
    monkeypatch.setenv("HF_TOKEN", "hf_never_sent")
    code, out, err = run_cli(capsys, "--data-dir", tmp_path / "d", "--set", f"models.hub_url={hub}",
                             "models", "search", "llama")
    assert code == 2 and out == "" and one_sentence(err), err
    assert err.startswith("iris-desktop: models.hub_url ") and "is not an address Iris can reach (" in err
    assert err.endswith("set it to the hub's https:// address, such as https://huggingface.co.\n")
    assert "hf_never_sent" not in err and "bug" not in err


def token_label(qtbot, hub: str) -> str:
    """What Model ▸ Download…'s Token… dialog says for the hub at ``hub`` (opened, read,
    closed)."""
    from PySide6.QtWidgets import QWidget

    from iris_desktop.ui.hub_worker import token_dialog

    parent = QWidget()
    qtbot.addWidget(parent)
    dialog = token_dialog(parent, hub, lambda _said: None)
    try:
        return dialog.labelText()
    finally:
        dialog.reject()


def test_the_windows_token_dialog_says_when_hf_token_is_sent(qtbot, monkeypatch):
    """The window could not tell that HF_TOKEN was set (Token… showed the keyring's token
    only). The dialog says so for huggingface.co, and not for another hub."""
    monkeypatch.setenv("HF_TOKEN", "hf_in_the_environment")
    label = token_label(qtbot, "https://huggingface.co")
    assert label.endswith(
        "\n\nHF_TOKEN is set in Iris's environment: its token is sent to huggingface.co:443 while "
        "none is saved here; one saved here is sent instead.")
    assert "hf_in_the_environment" not in label
    assert "HF_TOKEN" not in token_label(qtbot, "https://hub.example.org")


def test_a_redirect_to_an_address_no_name_can_be_is_said_as_the_hubs(tmp_path):
    """A review: a hub at a sound address redirecting to ``https://xn--a.co`` was said as
    "models.hub_url … is not an address", and in a download it escaped as a traceback."""
    import http.server
    import json as _json

    from iris_desktop.runtime.hub.downloading import download

    class Redirecting(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if "/tree/" in self.path:  # the file list, then the file: elsewhere
                body = _json.dumps([{"type": "file", "path": "m.gguf", "size": 10, "oid": "x",
                                     "lfs": {"oid": "a" * 64, "size": 10}}]).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_response(302)
            self.send_header("Location", "https://xn--a.co" + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirecting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        hub = f"http://127.0.0.1:{server.server_port}"
        with HubClient(hub, None) as client, pytest.raises(HubError) as searched:
            client.search("qwen")
        assert str(searched.value) == (f"The model hub 127.0.0.1:{server.server_port} redirected the search "
                                       "for 'qwen' to an address that is not one; Iris did not follow it "
                                       "(check models.hub_url).")
        with HubClient(hub, None) as client, pytest.raises(HubError) as fetched:
            download(client, "a/b", "m.gguf", tmp_path)
        assert str(fetched.value).startswith("The file host for m.gguf redirected to an address that is not one")
    finally:
        server.shutdown()
        server.server_close()


def test_the_token_dialog_says_a_variable_that_holds_no_token_is_not_sent(qtbot, monkeypatch):
    """A review: the dialog said HF_TOKEN's token "is sent" where it holds none that can be."""
    monkeypatch.setenv("HF_TOKEN", "hf_with a space")
    label = token_label(qtbot, "https://huggingface.co")
    assert label.endswith(
        "\n\nHF_TOKEN holds something that is not a token (a space or a character outside printable ASCII), "
        "so it was not sent; set it to the token as the hub shows it, or unset it.")
    assert "with a space" not in label
