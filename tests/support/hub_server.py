"""A model hub on loopback that speaks the Hugging Face HTTP API Iris uses, for the
download tests (``tests/test_hub.py``, ``tests/test_download_dialog.py``) and for trying
Model ▸ Download… and ``iris-desktop models download`` by hand.

Two real HTTP servers on 127.0.0.1, each on a free port:

* the **hub**: ``GET /api/models?search=…&filter=gguf`` (repositories whose id holds
  every word), ``GET /api/models/{repo}/tree/{revision}`` (files with ``size`` and, for
  ``.gguf`` files, ``lfs.oid`` = sha256; ``page_size`` pages it with ``Link: next``) and
  ``GET /{repo}/resolve/{revision}/{file}`` (302 to the file host); a request in absolute
  form (``GET http://host/…``) is served too, as a forward proxy, and marked ``proxied``;
* the **file host**: ``GET /blob/{sha256}`` with ``Range: bytes=N-`` (206, or 416).

Modes, set on the :class:`HubServer` at any time: ``delay_s`` (a pause before each 64 KiB
chunk: a slow download), ``drop_at`` (byte offsets where the file host cuts the
connection, each once), ``drop_every`` (cut every response after that many bytes),
``wrong_checksum`` (the tree lists another sha256), ``ignore_range``, ``file_status``
(the file host answers this status instead; ``file_reason``: with that reason phrase),
``token`` (repositories in ``gated`` need ``Authorization: Bearer <token>``). ``requests`` records every request.

For the hostile-peer tests (``tests/test_hostile_peers.py``):

* ``answer_fault`` makes every hub answer whose path holds ``answer_match`` (default
  ``/tree/``) ``endless`` (a body with no length that never ends), a ``gzip_bomb``
  (``Content-Encoding: gzip``, inflating to ``bomb_bytes``) or a ``trickle`` (one byte
  every ``trickle_delay_s``);
* ``listed`` overrides what the tree lists of a file (``{"a.gguf": {"size": -5}}``,
  ``{"sha256": "ABC…"}``; ``{"sha256": None}``: no ``lfs`` entry at all);
* ``revisions`` serves other bytes at another revision (``{"v2": {repo: {file: bytes}}}``;
  the file host serves them too);
* ``redirect_junk`` sends that many bytes of body with the 302 of ``resolve``;
* ``gate``, when set to an Event, makes the file host wait for it (at most 30 s) before
  sending a file's bytes, so that a download is under way for as long as a test needs;
* ``stall_at`` (byte offsets, each once): the file host stops sending there and holds the
  connection open, sending nothing, until ``hold_s`` or :meth:`stop` (``stalled`` is set);
* ``portal`` (a Content-Type): the file host answers every request with a login page
  (200, that type), as a captive portal does;
* ``blob_extra``: the file host sends that many bytes more than the file (its length says so);
* ``resolve_to``: the 302 of ``resolve`` points there (``"loop"``: back at itself);
* ``next_url``: the tree's ``Link: next`` names this address (with the page's cursor);
* ``extra_entries``: more entries the tree lists (dicts as the hub writes them);
* ``answer_fault = "deep"``: the answer is JSON nested ``deep_levels`` deep;
* ``answer_fault = "empties"``: the answer is a list of about ``bomb_bytes`` of empty lists
  (``[[], [], …]``), with its length;
* ``answer_fault = "redirect"``: the answer is a 302 to ``redirect_location``;
* ``no_length``: the file host sends no Content-Length (the body ends when it closes the
  connection), so only the bytes say how long the file is;
* ``HubServer(..., hub_tls=(cert, key), files_tls=(cert, key))``: the hub, the file host
  or both speak https (:func:`self_signed` makes a certificate for 127.0.0.1; a client
  trusts it with ``SSL_CERT_FILE``).

Every fault is bounded: it stops when the client leaves, after ``max_fault_bytes`` or
after ``hold_s``.

    python tests/support/hub_server.py [--delay 0.05] [--serve REPO FILE.gguf]

serves a few small real GGUF files (from ``gguf_fixtures``), and any real GGUF given with
``--serve``, until Ctrl+C, and prints ``IRIS_MODELS_HUB_URL=…`` to use it.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import json
import socket
import ssl
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for support.*

import keyring.backend  # noqa: E402
from keyring.errors import PasswordDeleteError  # noqa: E402

from support.gguf_fixtures import tiny_metadata, write_gguf  # noqa: E402

CHUNK = 64 * 1024


class MemoryKeyring(keyring.backend.KeyringBackend):
    """A keyring in a dict: the tests never touch the system's."""

    priority = 1

    def __init__(self) -> None:
        super().__init__()
        self.passwords: dict[tuple[str, str], str] = {}

    def get_password(self, service, username):
        return self.passwords.get((service, username))

    def set_password(self, service, username, password):
        self.passwords[(service, username)] = password

    def delete_password(self, service, username):
        if self.passwords.pop((service, username), None) is None:
            raise PasswordDeleteError(username)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: Any, tls: tuple[str, str] | None = None) -> None:
        self.context = None
        if tls is not None:
            self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.context.load_cert_chain(*tls)
        super().__init__(address, handler)

    def get_request(self) -> tuple[Any, Any]:
        sock, address = super().get_request()
        if self.context is None:
            return sock, address
        sock.settimeout(5)  # a handshake the client refuses (a certificate it does not trust)
        try:
            wrapped = self.context.wrap_socket(sock, server_side=True)
        except OSError:
            sock.close()
            raise
        wrapped.settimeout(None)
        return wrapped, address

    def handle_error(self, request: Any, client_address: Any) -> None:  # a cut connection: expected
        pass


def self_signed(folder: Path) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 and its key (PEM files in ``folder``)."""
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
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return str(folder / "cert.pem"), str(folder / "key.pem")


def gguf_bytes(folder: Path, name: str = "Tiny Chat", tensor_floats: int = 256 * 1024) -> bytes:
    """A small valid GGUF (a llama-shaped header, F32 zeros) of about ``4 × tensor_floats``
    bytes."""
    path = write_gguf(folder / f"{name.replace(' ', '-')}.gguf", tiny_metadata(name),
                      tensors=(("token_embd.weight", (64, 16)), ("blk.0.ffn_up.weight", (tensor_floats // 256, 256))))
    data = path.read_bytes()
    path.unlink()
    return data


class HubServer:
    """The hub and its file host. ``repos``: ``{"org/name": {"file.gguf": bytes}}``."""

    def __init__(self, repos: dict[str, dict[str, bytes]], *, downloads: dict[str, int] | None = None,
                 hub_tls: tuple[str, str] | None = None, files_tls: tuple[str, str] | None = None) -> None:
        self.repos = repos
        self.downloads = downloads or {}
        self.revisions: dict[str, dict[str, dict[str, bytes]]] = {}
        self.answer_fault: str | None = None
        self.answer_match = "/tree/"
        self.trickle_delay_s = 0.2
        self.bomb_bytes = 256 << 20
        self.max_fault_bytes = 256 << 20
        self.hold_s = 30.0
        self.listed: dict[str, dict[str, Any]] = {}
        self.redirect_junk = 0
        self.gate: threading.Event | None = None
        self.fault_bytes_sent = 0
        self.stall_at: list[int] = []
        self.stalled = threading.Event()  # set when a stall began
        self.released = threading.Event()  # set by stop(): every stall ends
        self.portal: str | None = None
        self.blob_extra = 0
        self.no_length = False
        self.resolve_to: str | None = None
        self.next_url: str | None = None
        self.extra_entries: list[dict[str, Any]] = []
        self.deep_levels = 100_000
        self.redirect_location = "file:///etc/passwd"
        self.requests: list[dict[str, Any]] = []
        self.delay_s = 0.0
        self.drop_at: list[int] = []
        self.drop_every: int | None = None
        self.wrong_checksum = False
        self.ignore_range = False
        self.file_status: int | None = None
        self.file_reason: str | None = None
        self.token: str | None = None
        self.gated: set[str] = set()
        self.page_size: int | None = None
        self.lock = threading.Lock()
        self.hub = _Server(("127.0.0.1", 0), _handler(self, "hub"), hub_tls)
        self.files = _Server(("127.0.0.1", 0), _handler(self, "files"), files_tls)
        self.threads = [threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
                        for s in (self.hub, self.files)]
        for thread in self.threads:
            thread.start()

    @property
    def url(self) -> str:
        scheme = "https" if self.hub.context is not None else "http"
        return f"{scheme}://127.0.0.1:{self.hub.server_address[1]}"

    @property
    def files_url(self) -> str:
        scheme = "https" if self.files.context is not None else "http"
        return f"{scheme}://127.0.0.1:{self.files.server_address[1]}"

    @property
    def blobs(self) -> dict[str, bytes]:
        every = [self.repos, *self.revisions.values()]
        return {hashlib.sha256(data).hexdigest(): data
                for repos in every for files in repos.values() for data in files.values()}

    def files_at(self, repo: str, revision: str) -> dict[str, bytes] | None:
        """The files of ``repo`` at ``revision`` (``revisions`` first, else ``repos``)."""
        return self.revisions.get(revision, {}).get(repo, self.repos.get(repo))

    def sha256(self, repo: str, file: str, revision: str = "main") -> str:
        return hashlib.sha256(self.files_at(repo, revision)[file]).hexdigest()

    def served(self, host: str = "files") -> list[dict[str, Any]]:
        return [r for r in self.requests if r["host"] == host]

    def stop(self) -> None:
        self.released.set()
        for server in (self.hub, self.files):
            server.shutdown()
            server.server_close()

    def __enter__(self) -> HubServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _handler(hub: HubServer, role: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def do_GET(self) -> None:  # noqa: N802
            target = self.path
            proxied = target.startswith(("http://", "https://"))
            if proxied:  # a forward proxy's absolute form
                parts = urlsplit(target)
                target = parts.path + (f"?{parts.query}" if parts.query else "")
            parts = urlsplit(target)
            with hub.lock:
                hub.requests.append({"host": role, "path": parts.path, "query": parse_qs(parts.query),
                                     "range": self.headers.get("Range"), "proxied": proxied,
                                     "authorization": self.headers.get("Authorization"),
                                     "host_header": self.headers.get("Host")})
            try:
                if role == "files":
                    self._blob(parts.path)
                else:
                    self._hub(parts.path, parse_qs(parts.query))
            except (BrokenPipeError, ConnectionResetError):
                pass

        # -- the hub --

        def _hub(self, path: str, query: dict[str, list[str]]) -> None:
            if path == "/api/models":
                words = query.get("search", [""])[0].lower().split()
                found = [{"id": repo, "modelId": repo, "downloads": hub.downloads.get(repo, 0), "likes": 1,
                          "lastModified": "2024-09-19T00:00:00.000Z", "tags": ["gguf"],
                          "gated": "manual" if repo in hub.gated else False}
                         for repo in hub.repos if all(w in repo.lower() for w in words)]
                found.sort(key=lambda r: -r["downloads"])
                self._json(found)
                return
            segments = [unquote(s) for s in path.strip("/").split("/")]
            if segments[:2] == ["api", "models"] and len(segments) >= 6 and segments[4] == "tree":
                repo = "/".join(segments[2:4])
                if not self._allowed(repo):
                    return
                self._tree(repo, segments[5], query)
                return
            if len(segments) >= 5 and segments[2] == "resolve":
                repo, file = "/".join(segments[:2]), "/".join(segments[4:])
                if not self._allowed(repo):
                    return
                data = (hub.files_at(repo, segments[3]) or {}).get(file)
                if data is None:
                    self._json({"error": "Entry not found"}, 404)
                    return
                sha = hashlib.sha256(data).hexdigest()
                location = f"{hub.files_url}/blob/{sha}?name={quote(file)}"
                if hub.resolve_to is not None:
                    location = f"{hub.url}{path}" if hub.resolve_to == "loop" else hub.resolve_to
                self.send_response(302)
                self.send_header("Location", location)
                self.send_header("X-Linked-Size", str(len(data)))
                self.send_header("Content-Length", str(hub.redirect_junk))
                self.end_headers()
                self._junk(hub.redirect_junk)
                return
            self._json({"error": "not found"}, 404)

        def _allowed(self, repo: str) -> bool:
            if repo not in hub.repos:
                self._json({"error": "Repository not found"}, 404)
                return False
            if repo in hub.gated and self.headers.get("Authorization") != f"Bearer {hub.token}":
                self._json({"error": "Access to this model is restricted"}, 401)
                return False
            return True

        def _tree(self, repo: str, revision: str, query: dict[str, list[str]]) -> None:
            entries = [{"type": "file", "oid": "0" * 40, "size": 12, "path": "README.md"},
                       {"type": "directory", "oid": "1" * 40, "size": 0, "path": "extra"}]
            for name, data in (hub.files_at(repo, revision) or {}).items():
                sha = hashlib.sha256(b"something else" if hub.wrong_checksum else data).hexdigest()
                listed = {"size": len(data), "sha256": sha, **hub.listed.get(name, {})}
                entry: dict[str, Any] = {"type": "file", "oid": "2" * 40, "size": listed["size"], "path": name}
                if listed["sha256"] is not None:
                    entry["lfs"] = {"oid": listed["sha256"], "size": listed["size"], "pointerSize": 134}
                entries.append(entry)
            entries += hub.extra_entries
            start = int(query.get("cursor", ["0"])[0])
            size = hub.page_size or len(entries)
            page = entries[start:start + size]
            headers = {}
            if start + size < len(entries):
                base = hub.next_url or f'{hub.url}{self.path.split("?")[0]}'
                headers["Link"] = f'<{base}?recursive=true&cursor={start + size}>; rel="next"'
            self._json(page, headers=headers)

        def _json(self, value: Any, status: int = 200, headers: dict[str, str] | None = None,
                  reason: str | None = None) -> None:
            body = json.dumps(value).encode()
            if hub.answer_fault is not None and hub.answer_match in self.path:
                self._misbehave(status, body)
                return
            self.send_response(status, reason)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for key, val in (headers or {}).items():
                self.send_header(key, val)
            self.end_headers()
            self.wfile.write(body)

        # -- a hostile hub --

        def _misbehave(self, status: int, body: bytes) -> None:
            self.close_connection = True
            deadline = time.monotonic() + hub.hold_s
            if hub.answer_fault == "redirect":
                self.send_response(302)
                self.send_header("Location", hub.redirect_location)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            if hub.answer_fault == "empties":  # a piece at a time: little memory of its own
                piece = b"[], " * 16384
                pieces = hub.bomb_bytes // len(piece)
                self.send_header("Content-Length", str(1 + pieces * len(piece) + 3))
                self.end_headers()
                self._out(b"[")
                for _ in range(pieces):
                    self._out(piece)
                self._out(b"[]]")
            elif hub.answer_fault == "deep":
                deep = b"[" * hub.deep_levels + b"]" * hub.deep_levels
                self.send_header("Content-Length", str(len(deep)))
                self.end_headers()
                self._out(deep)
            elif hub.answer_fault == "trickle":
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                for i in range(len(body)):
                    if time.monotonic() > deadline:
                        return
                    time.sleep(hub.trickle_delay_s)
                    self._out(body[i:i + 1])
            elif hub.answer_fault == "endless":  # no length, no chunks: it ends when the server closes
                self.end_headers()
                self._out(b"[")
                piece = b'{"type": "file", "path": "x.gguf", "size": 1}, ' * 1024
                while time.monotonic() < deadline:
                    self._out(piece)
            elif hub.answer_fault == "gzip_bomb":
                packer = zlib.compressobj(1, zlib.DEFLATED, zlib.MAX_WBITS | 16)
                parts, block, left = [], b"\0" * (1 << 20), hub.bomb_bytes
                while left > 0:
                    parts.append(packer.compress(block[:left]))
                    left -= len(block)
                bomb = b"".join(parts) + packer.flush()
                self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(len(bomb)))
                self.end_headers()
                self._out(bomb)

        def _out(self, data: bytes) -> None:
            """Send ``data``, within ``max_fault_bytes``; raises BrokenPipeError when the
            client left or the bound is reached."""
            with hub.lock:
                if hub.fault_bytes_sent >= hub.max_fault_bytes:
                    raise BrokenPipeError("max_fault_bytes sent")
                hub.fault_bytes_sent += len(data)
            self.wfile.write(data)
            self.wfile.flush()

        def _junk(self, size: int) -> None:
            piece = b"<html>moved</html>" * 3641  # about 64 KiB
            while size > 0:
                self._out(piece[:size])
                size -= len(piece)

        # -- the file host --

        def _blob(self, path: str) -> None:
            data = hub.blobs.get(path.rsplit("/", 1)[-1])
            if data is None:
                self._json({"error": "no such blob"}, 404)
                return
            if hub.file_status is not None:
                self._json({"error": "the file host says no"}, hub.file_status, reason=hub.file_reason)
                return
            if hub.gate is not None:
                hub.gate.wait(30)
            if hub.portal is not None:
                page = b"<html><body><h1>Sign in to the network</h1><form>...</form></body></html>"
                self.send_response(200)
                self.send_header("Content-Type", hub.portal)
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)
                return
            data = data + b"\0" * hub.blob_extra
            start = 0
            wanted = self.headers.get("Range")
            if wanted and not hub.ignore_range:
                start = int(wanted.removeprefix("bytes=").split("-")[0])
                if start >= len(data):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            if hub.no_length:  # the body ends when the connection does
                self.close_connection = True
            else:
                self.send_header("Content-Length", str(len(data) - start))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            with hub.lock:
                drops = [d for d in hub.drop_at if d > start]
                cut = min(drops) if drops else None
                if cut is not None:
                    hub.drop_at.remove(cut)
                if hub.drop_every is not None:
                    cut = min(cut or len(data), start + hub.drop_every)
                stalls = [d for d in hub.stall_at if d > start]
                stall = min(stalls) if stalls else None
                if stall is not None:
                    hub.stall_at.remove(stall)
            pos = start
            while pos < len(data):
                if hub.delay_s:
                    time.sleep(hub.delay_s)
                if stall is not None and pos >= stall:  # nothing more, the connection held open
                    hub.stalled.set()
                    self.close_connection = True
                    hub.released.wait(hub.hold_s)
                    return
                end = min(pos + CHUNK, len(data), cut if cut is not None else len(data),
                          stall if stall is not None else len(data))
                self.wfile.write(data[pos:end])
                self.wfile.flush()
                pos = end
                if cut is not None and pos >= cut and pos < len(data):
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return

    return Handler


def main() -> int:
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each 64 KiB chunk")
    parser.add_argument("--serve", nargs=2, action="append", default=[], metavar=("REPO", "GGUF"),
                        help="serve this real GGUF file in REPO as well (held in memory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        repos = {
            "Qwen/Qwen2.5-1.5B-Instruct-GGUF": {
                "qwen2.5-1.5b-instruct-q4_k_m.gguf": gguf_bytes(folder, "Qwen2.5 1.5B Instruct", 2**20),
                "qwen2.5-1.5b-instruct-q8_0.gguf": gguf_bytes(folder, "Qwen2.5 1.5B Instruct Q8", 2 * 2**20)},
            "Qwen/Qwen2.5-3B-Instruct-GGUF": {
                "qwen2.5-3b-instruct-q4_k_m.gguf": gguf_bytes(folder, "Qwen2.5 3B Instruct", 3 * 2**20)},
            "bartowski/Llama-3.2-3B-Instruct-GGUF": {
                "Llama-3.2-3B-Instruct-Q4_K_M.gguf": gguf_bytes(folder, "Llama 3.2 3B Instruct", 2**20)},
        }
        for repo, gguf in args.serve:
            repos.setdefault(repo, {})[Path(gguf).name] = Path(gguf).read_bytes()
        server = HubServer(repos, downloads={"Qwen/Qwen2.5-1.5B-Instruct-GGUF": 120_000,
                                             "Qwen/Qwen2.5-3B-Instruct-GGUF": 90_000})
        server.delay_s = args.delay
        print(f"IRIS_MODELS_HUB_URL={server.url}", flush=True)
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
