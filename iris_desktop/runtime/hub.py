"""The model hub: find a GGUF on Hugging Face (or a hub that speaks its HTTP API) and
download it so that nothing half-written or altered is ever loaded.

Only when the user asks (Model ▸ Download…, ``iris-desktop models search`` and
``models download``) does Iris contact the hub, at the setting ``models.hub_url``
(default https://huggingface.co). Three endpoints are used, with httpx:

* ``GET /api/models?search=TEXT&filter=gguf`` — repositories that hold GGUF files;
* ``GET /api/models/{repo}/tree/{revision}?recursive=true`` — a repository's files, with
  their sizes and, for LFS files, their sha256 (``lfs.oid``); pages follow ``Link: next``;
* ``GET /{repo}/resolve/{revision}/{file}`` — the file, after a redirect to the file host
  (Hugging Face's CDN), with ``Range`` to resume.

What is sent: the search text, the repository and file names, and the token when the user
saved one (OS keyring, like a server's API key; it goes to the hub only: httpx drops it
when the redirect leaves the hub's origin). The usual proxy variables (``HTTPS_PROXY``,
``HTTP_PROXY``, ``ALL_PROXY``, ``NO_PROXY``) are honoured here, for people behind a
proxy; a local model server (``remote.py``) stays proxy-free.

A download (:func:`download`) goes to ``<models>/downloads/<org>/<repo>/<file>.gguf``,
where the model library lists it under the source ``download``:

1. the file's size and sha256 come from the hub's tree first;
2. the free space is checked before a byte is written;
3. bytes go to ``<file>.gguf.partial`` (0600) beside a small ``.partial.json`` record
   (repo, revision, size, sha256); Stop, a crash or a lost connection leave it, and the
   next download of the same file resumes it with ``Range`` (a lost connection is resumed
   at once, a few times);
4. the whole file's sha256 must equal the hub's, and its GGUF header must read as any
   opened model's (:func:`~.gguf.read_gguf_info`), before it gets its name.

Every failure is a :class:`HubError`: one sentence, a ``kind`` (``network``, ``http``,
``auth``, ``not_found``, ``no_space``, ``disk_full``, ``checksum``, ``not_gguf``,
``stopped``, ``write``, ``address``, ``answer``) and the partial file, kept for the user
to resume or remove (:func:`discard_partial`).
"""

from __future__ import annotations

import collections
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import quote

import httpx

from iris_desktop import __version__
from iris_desktop.paths import make_private_dir

from .cpu import system_memory_bytes
from .gguf import GGUFError, GGUFInfo, read_gguf_info
from .library import DEFAULT_N_CTX, kv_cache_bytes
from .remote import KEYRING_SERVICE, server_address

log = logging.getLogger("iris.runtime.hub")

__all__ = [
    "DEFAULT_HUB_URL",
    "RECOMMENDED",
    "DownloadProgress",
    "HubClient",
    "HubError",
    "HubFile",
    "HubRepo",
    "Recommended",
    "delete_hub_token",
    "discard_partial",
    "download",
    "download_target",
    "fits_in_memory",
    "get_hub_token",
    "partial_state",
    "set_hub_token",
    "system_memory_bytes",
]

DEFAULT_HUB_URL = "https://huggingface.co"
CONNECT_TIMEOUT_S = 10.0
#: an answer (or the next bytes of a download) may take this long
READ_TIMEOUT_S = 60.0
#: a lost connection is resumed at once this many times before the download fails
RESUME_TRIES = 3
#: the pause before the first resume (doubling, at most 4× this)
RESUME_PAUSE_S = 1.0
#: free space left over after a download, on top of the file
FREE_SPACE_MARGIN = 64 * 2**20
CHUNK = 1 << 20
#: how often progress is reported at most
PROGRESS_EVERY_S = 0.1
#: the speed is measured over this many seconds
SPEED_WINDOW_S = 5.0
#: tree pages followed at most (Hugging Face pages 1,000 files a time)
MAX_TREE_PAGES = 20
SEARCH_LIMIT = 30
#: what the computer's memory must keep free beside a model (the OS, the app, Qt)
MEMORY_HEADROOM = 2**30

_REPO = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}$")
_QUANT = re.compile(r"(?<![A-Za-z0-9])(I?Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32)(?![A-Za-z0-9])", re.IGNORECASE)


class HubError(RuntimeError):
    """A search, listing or download failed. The message is one sentence that says what
    to do; ``kind`` says what failed; ``partial`` is the partial file left for resuming
    (None when there is none)."""

    def __init__(self, message: str, kind: str = "http", partial: Path | None = None,
                 status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.partial = partial
        self.status = status

    @property
    def resumable(self) -> bool:
        """Downloading the same file again goes on from the partial file."""
        return self.partial is not None and self.kind not in ("checksum", "not_gguf")


# ---------------------------------------------------------------------------
# what the hub says


def quantization_of(file_name: str) -> str | None:
    """"qwen2.5-3b-instruct-q4_k_m.gguf" -> "Q4_K_M"."""
    match = _QUANT.search(PurePosixPath(file_name).name)
    return match.group(1).upper() if match else None


@dataclass(frozen=True)
class HubRepo:
    """A repository a search found."""

    id: str
    downloads: int | None = None
    likes: int | None = None
    last_modified: str | None = None
    #: False, or how access is gated ("auto", "manual"): a token is needed
    gated: bool | str = False

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class HubFile:
    """One file of a repository: its path, size and (LFS files) sha256."""

    repo: str
    path: str
    size: int
    sha256: str | None
    revision: str = "main"

    @property
    def name(self) -> str:
        return PurePosixPath(self.path).name

    @property
    def quantization(self) -> str | None:
        return quantization_of(self.path)

    @property
    def is_gguf(self) -> bool:
        name = self.name.lower()
        return name.endswith(".gguf") and not name.startswith("mmproj")

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "quantization": self.quantization}


@dataclass(frozen=True)
class Recommended:
    """A chat model Iris suggests, described from local data (nothing is contacted to
    show it): what the hub's file and the model's config say, so that the memory a model
    needs at a chosen ``n_ctx`` is the library's estimate (weights + KV cache)."""

    title: str
    repo: str
    file: str
    parameters: str
    #: the file's size as published (the hub's tree gives the exact one when asked)
    size_bytes: int
    context_length: int
    license: str
    architecture: str
    block_count: int
    head_count: int
    head_count_kv: int
    embedding_length: int
    note: str = ""

    @property
    def quantization(self) -> str | None:
        return quantization_of(self.file)

    def kv_cache_bytes(self, n_ctx: int) -> int:
        a = self.architecture
        info = GGUFInfo(path=Path(self.file), size_bytes=self.size_bytes, architecture=a, name=self.title,
                        file_type=self.quantization, context_length=self.context_length, chat_template=None,
                        metadata={f"{a}.block_count": self.block_count, f"{a}.attention.head_count": self.head_count,
                                  f"{a}.attention.head_count_kv": self.head_count_kv,
                                  f"{a}.embedding_length": self.embedding_length})
        return kv_cache_bytes(info, self._ctx(n_ctx)) or 0

    def _ctx(self, n_ctx: int) -> int:
        return n_ctx if n_ctx > 0 else self.context_length  # 0: the trained context, as the library

    def memory_estimate_bytes(self, n_ctx: int = DEFAULT_N_CTX, size_bytes: int | None = None) -> int:
        """Weights (the file) plus the KV cache at ``n_ctx``, as the library estimates an
        opened model (llama.cpp's compute buffers come on top)."""
        return (size_bytes or self.size_bytes) + self.kv_cache_bytes(n_ctx)

    def as_json(self, n_ctx: int = DEFAULT_N_CTX) -> dict[str, Any]:
        data = asdict(self)
        data.update(quantization=self.quantization, n_ctx=self._ctx(n_ctx),
                    memory_estimate_bytes=self.memory_estimate_bytes(n_ctx))
        return data


_QWEN2 = "qwen2"
#: small to larger; every file is a single-part Q4_K_M GGUF with a chat template
RECOMMENDED: tuple[Recommended, ...] = (
    Recommended("Llama 3.2 1B Instruct", "bartowski/Llama-3.2-1B-Instruct-GGUF",
                "Llama-3.2-1B-Instruct-Q4_K_M.gguf", "1.2B", 807_694_464, 131_072,
                "Llama 3.2 Community", "llama", 16, 32, 8, 2048,
                "the smallest: fast on any computer, simple chats"),
    Recommended("Qwen2.5 1.5B Instruct", "Qwen/Qwen2.5-1.5B-Instruct-GGUF",
                "qwen2.5-1.5b-instruct-q4_k_m.gguf", "1.5B", 1_117_320_736, 32_768,
                "Apache-2.0", _QWEN2, 28, 12, 2, 1536,
                "a good first step up from the bundled model"),
    Recommended("Llama 3.2 3B Instruct", "bartowski/Llama-3.2-3B-Instruct-GGUF",
                "Llama-3.2-3B-Instruct-Q4_K_M.gguf", "3.2B", 2_019_377_696, 131_072,
                "Llama 3.2 Community", "llama", 28, 24, 8, 3072,
                "good English chat and summaries"),
    Recommended("Qwen2.5 3B Instruct", "Qwen/Qwen2.5-3B-Instruct-GGUF",
                "qwen2.5-3b-instruct-q4_k_m.gguf", "3.1B", 2_104_932_768, 32_768,
                "Qwen Research (non-commercial)", _QWEN2, 36, 16, 2, 2048,
                "clearly better at chat; 8 GB of memory is enough"),
    Recommended("Phi-3.5 mini instruct", "bartowski/Phi-3.5-mini-instruct-GGUF",
                "Phi-3.5-mini-instruct-Q4_K_M.gguf", "3.8B", 2_393_232_672, 131_072,
                "MIT", "phi3", 32, 32, 32, 3072,
                "strong reasoning for its size; a large KV cache per token"),
    Recommended("Qwen2.5 7B Instruct", "bartowski/Qwen2.5-7B-Instruct-GGUF",
                "Qwen2.5-7B-Instruct-Q4_K_M.gguf", "7.6B", 4_683_073_504, 32_768,
                "Apache-2.0", _QWEN2, 28, 28, 4, 3584,
                "the best here; needs 16 GB of memory to be comfortable"),
)


# ---------------------------------------------------------------------------
# this computer's memory


def fits_in_memory(estimate: int | None, total: int | None) -> bool | None:
    """Whether a model needing ``estimate`` bytes leaves the computer's ``total`` enough
    room (:data:`MEMORY_HEADROOM`); None when either is unknown."""
    if not estimate or not total:
        return None
    return estimate + MEMORY_HEADROOM <= total


# ---------------------------------------------------------------------------
# the token


def _token_user(hub_url: str) -> str:
    return f"hub {server_address(hub_url)}"


def get_hub_token(hub_url: str) -> str | None:
    """The token saved for the hub at ``hub_url``; None when there is none or no usable
    keyring (said in the log)."""
    import keyring
    from keyring.errors import KeyringError

    try:
        return keyring.get_password(KEYRING_SERVICE, _token_user(hub_url))
    except (KeyringError, ValueError) as exc:
        log.info("keyring: no hub token for %s: %s", hub_url, exc)
        return None


def set_hub_token(hub_url: str, token: str) -> None:
    """Save ``token`` for the hub (empty: forget it). Raises keyring.errors.KeyringError."""
    import keyring

    if not token:
        delete_hub_token(hub_url)
        return
    keyring.set_password(KEYRING_SERVICE, _token_user(hub_url), token)


def delete_hub_token(hub_url: str) -> None:
    import keyring
    from keyring.errors import PasswordDeleteError

    try:
        keyring.delete_password(KEYRING_SERVICE, _token_user(hub_url))
    except PasswordDeleteError:
        pass


# ---------------------------------------------------------------------------
# the client


def _check_repo(repo: str) -> str:
    repo = repo.strip()
    if not _REPO.match(repo) or ".." in repo:
        raise HubError(f"{repo!r} is not a repository name; expected owner/name, such as "
                       "Qwen/Qwen2.5-3B-Instruct-GGUF.", "address")
    return repo


def _check_file(file: str) -> str:
    file = file.strip()
    parts = PurePosixPath(file).parts
    if (not file or file.startswith("/") or "\\" in file or any(p in ("..", ".") for p in parts)
            or any(ord(c) < 32 for c in file)):
        raise HubError(f"{file!r} is not a file name in a repository.", "address")
    if not file.lower().endswith(".gguf"):
        raise HubError(f"{file} is not a GGUF file; only .gguf files can be downloaded.", "address")
    return file


def _describe(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.ConnectError):
        return "cannot connect"
    if isinstance(exc, httpx.TimeoutException):
        return "no answer in time"
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError)):
        return "the connection was lost"
    if isinstance(exc, httpx.ProxyError):
        return f"the proxy refused ({exc})"
    return f"{type(exc).__name__}"


class HubClient:
    """Requests to one hub: its address, the token (when given) and the environment's
    proxies (``trust_env=True``: unlike a model server's client, the hub needs them
    behind a corporate proxy). Redirects are followed (the file host is another origin,
    and httpx does not send it the token)."""

    def __init__(self, hub_url: str = DEFAULT_HUB_URL, token: str | None = None) -> None:
        url = (hub_url or "").strip().rstrip("/")
        if not url:
            raise HubError("No model hub is set; set models.hub_url (for example "
                           "https://huggingface.co).", "address")
        try:
            self.address = server_address(url)
        except ValueError:
            raise HubError(f"models.hub_url {hub_url!r} is not an http:// or https:// address.",
                           "address") from None
        self.root = url
        headers = {"User-Agent": f"iris-desktop/{__version__}"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            self.client = httpx.Client(
                headers=headers, trust_env=True, follow_redirects=True,
                timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S))
        except (ImportError, ValueError, httpx.InvalidURL) as exc:  # SOCKS without socksio, a bad proxy URL
            raise HubError(f"The proxy set in the environment cannot be used ({exc}); fix HTTPS_PROXY, "
                           "HTTP_PROXY or ALL_PROXY, or unset it.", "address") from None

    @classmethod
    def for_settings(cls, hub_url: str) -> HubClient:
        """A client for ``models.hub_url`` with the token saved for it, if any."""
        return cls(hub_url, get_hub_token(hub_url) if (hub_url or "").strip() else None)

    # -- JSON --

    def _get_json(self, url: str, params: dict | None = None, what: str = "") -> tuple[Any, httpx.Response]:
        try:
            response = self.client.get(url, params=params)
        except httpx.HTTPError as exc:
            raise HubError(f"The model hub {self.address} cannot be reached ({_describe(exc)}); "
                           "check the network or models.hub_url.", "network") from None
        if response.status_code >= 400:
            raise self._status_error(response, what)
        try:
            return response.json(), response
        except ValueError:
            raise HubError(f"The model hub {self.address} did not answer JSON for {what or url}; "
                           "is models.hub_url a Hugging Face hub?", "answer") from None

    def _status_error(self, response: httpx.Response, what: str, partial: Path | None = None) -> HubError:
        status = response.status_code
        if status in (401, 403):
            return HubError(f"The model hub {self.address} refused access to {what} (HTTP {status}): "
                            "the model may be gated or private; accept its license on the hub's "
                            "page and save a token.", "auth", partial, status)
        if status == 404:
            return HubError(f"The model hub {self.address} has no {what} (HTTP 404); check the "
                            "name and the revision.", "not_found", partial, status)
        if status == 429:
            return HubError(f"The model hub {self.address} asks to slow down (HTTP 429); try "
                            "again in a few minutes.", "http", partial, status)
        reason = response.reason_phrase or "error"
        return HubError(f"The model hub {self.address} answered HTTP {status} ({reason}) for {what}; "
                        "try again later.", "http", partial, status)

    # -- the three endpoints --

    def search(self, text: str, limit: int = SEARCH_LIMIT) -> list[HubRepo]:
        """Repositories holding GGUF files whose name matches ``text``, most downloaded
        first."""
        text = text.strip()
        if not text:
            raise HubError("Type what to search for, such as qwen2.5 instruct.", "address")
        data, _ = self._get_json(f"{self.root}/api/models",
                                 {"search": text, "filter": "gguf", "sort": "downloads",
                                  "direction": "-1", "limit": str(limit)},
                                 f"the search for {text!r}")
        if not isinstance(data, list):
            raise HubError(f"The model hub {self.address} answered the search with something "
                           "other than a list.", "answer")
        repos = []
        for item in data:
            if not isinstance(item, dict):
                continue
            rid = item.get("id") or item.get("modelId")
            if not isinstance(rid, str) or not _REPO.match(rid):
                continue
            repos.append(HubRepo(rid, _int(item.get("downloads")), _int(item.get("likes")),
                                 item.get("lastModified") if isinstance(item.get("lastModified"), str) else None,
                                 item.get("gated") if isinstance(item.get("gated"), (bool, str)) else False))
        return repos

    def files(self, repo: str, revision: str = "main") -> list[HubFile]:
        """Every file of ``repo`` at ``revision`` with its size and sha256 (LFS files)."""
        repo = _check_repo(repo)
        url: str | None = f"{self.root}/api/models/{repo}/tree/{quote(revision, safe='')}"
        params: dict | None = {"recursive": "true"}
        out: list[HubFile] = []
        for _ in range(MAX_TREE_PAGES):
            if url is None:
                break
            data, response = self._get_json(url, params, f"{repo} at {revision}")
            if not isinstance(data, list):
                raise HubError(f"The model hub {self.address} listed {repo} as something other "
                               "than a list of files.", "answer")
            for item in data:
                if isinstance(item, dict) and item.get("type") == "file":
                    entry = _hub_file(repo, revision, item)
                    if entry is not None:
                        out.append(entry)
            url = response.links.get("next", {}).get("url")
            params = None
        return out

    def file(self, repo: str, path: str, revision: str = "main") -> HubFile:
        """One file's size and sha256; HubError (``not_found``) when the repo lacks it."""
        path = _check_file(path)
        for entry in self.files(repo, revision):
            if entry.path == path:
                return entry
        raise HubError(f"{repo} has no file {path} at revision {revision}; "
                       f"'iris-desktop models search' lists the repositories and files.", "not_found")

    def resolve_url(self, repo: str, path: str, revision: str = "main") -> str:
        return (f"{self.root}/{_check_repo(repo)}/resolve/{quote(revision, safe='')}/"
                f"{quote(_check_file(path), safe='/')}")

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> HubClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _hub_file(repo: str, revision: str, item: dict) -> HubFile | None:
    path, size = item.get("path"), _int(item.get("size"))
    if not isinstance(path, str) or size is None:
        return None
    lfs = item.get("lfs") if isinstance(item.get("lfs"), dict) else {}
    sha = lfs.get("oid") if isinstance(lfs.get("oid"), str) else None
    if sha is not None and not re.fullmatch(r"[0-9a-f]{64}", sha):
        sha = None
    return HubFile(repo, path, _int(lfs.get("size")) or size, sha, revision)


# ---------------------------------------------------------------------------
# downloading


@dataclass(frozen=True)
class DownloadProgress:
    """How far a download is: ``phase`` is "checking" (hashing a partial file before
    resuming), "downloading" or "verifying"."""

    file: str
    done: int
    total: int
    #: bytes per second over the last few seconds (0 before it is known)
    speed: float = 0.0
    #: seconds left at that speed (None before it is known)
    eta_s: float | None = None
    #: bytes already there when this run started (a resumed download)
    resumed_from: int = 0
    phase: str = "downloading"

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 0.0

    def describe(self) -> str:
        if self.phase == "checking":
            part = self.done / self.resumed_from if self.resumed_from else 1.0
            return f"Checking the {_mb(self.resumed_from)} downloaded before… {part:.0%}"
        if self.phase == "verifying":
            return f"Verifying {self.file} (sha256 and GGUF header)…"
        text = f"{_mb(self.done)} of {_mb(self.total)}"
        if self.speed > 0:
            text += f" · {self.speed / 1e6:.1f} MB/s"
        if self.eta_s is not None:
            text += f" · {_duration(self.eta_s)} left"
        return text


def _mb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:,.1f} MB"


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def download_target(models_dir: str | os.PathLike[str], repo: str, file: str) -> Path:
    """Where ``file`` of ``repo`` is kept: ``<models>/downloads/<org>/<repo>/<name>``."""
    owner, name = _check_repo(repo).split("/")
    return Path(models_dir) / "downloads" / owner / name / PurePosixPath(_check_file(file)).name


def _partial(target: Path) -> Path:
    return target.with_name(target.name + ".partial")


def _record(target: Path) -> Path:
    return target.with_name(target.name + ".partial.json")


def partial_state(models_dir: str | os.PathLike[str], repo: str, file: str) -> dict[str, Any] | None:
    """The partial download of ``file``, if any: ``{"path", "done", "total", "sha256",
    "mismatch"}`` (``mismatch``: the last run found a wrong checksum)."""
    target = download_target(models_dir, repo, file)
    partial = _partial(target)
    if not partial.is_file():
        return None
    record = _read_record(target)
    return {"path": str(partial), "done": partial.stat().st_size, "total": record.get("size"),
            "sha256": record.get("sha256"), "mismatch": bool(record.get("mismatch"))}


def discard_partial(models_dir: str | os.PathLike[str], repo: str, file: str) -> bool:
    """Remove the partial download of ``file`` (and its record); True when one was there."""
    return _discard(download_target(models_dir, repo, file))


def _discard(target: Path) -> bool:
    found = False
    for path in (_partial(target), _record(target)):
        try:
            path.unlink()
            found = True
        except FileNotFoundError:
            pass
    return found


def _read_record(target: Path) -> dict[str, Any]:
    try:
        data = json.loads(_record(target).read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_record(target: Path, data: dict[str, Any]) -> None:
    path = _record(target)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
    os.replace(tmp, path)


class _Meter:
    """Speed over the last :data:`SPEED_WINDOW_S` seconds, and progress reports at most
    every :data:`PROGRESS_EVERY_S`."""

    def __init__(self, file: str, total: int, start: int, report: Callable[[DownloadProgress], Any] | None):
        self.file, self.total, self.start, self.report = file, total, start, report
        self.samples: collections.deque[tuple[float, int]] = collections.deque()
        self.last = 0.0

    def __call__(self, done: int, phase: str = "downloading", force: bool = False) -> None:
        if self.report is None:
            return
        now = time.monotonic()
        if phase == "downloading":
            self.samples.append((now, done))
            while len(self.samples) > 2 and now - self.samples[0][0] > SPEED_WINDOW_S:
                self.samples.popleft()
        if not force and now - self.last < PROGRESS_EVERY_S:
            return
        self.last = now
        speed, eta = 0.0, None
        if phase == "downloading" and len(self.samples) >= 2:
            (t0, d0), (t1, d1) = self.samples[0], self.samples[-1]
            if t1 - t0 >= 0.2:
                speed = (d1 - d0) / (t1 - t0)
                eta = (self.total - done) / speed if speed > 0 else None
        self.report(DownloadProgress(self.file, done, self.total, speed, eta, self.start, phase))


def _disk_error(exc: OSError, folder: Path, name: str, done: int, total: int, partial: Path) -> HubError:
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return HubError(f"The disk is full: {folder} had no room for the rest of {name} "
                        f"({_mb(done)} of {_mb(total)} written); free some space and download "
                        "again to resume, or remove the partial file.", "disk_full", partial)
    return HubError(f"Cannot write {partial} ({exc.strerror or exc}); check the models folder.",
                    "disk_full" if exc.errno == errno.EROFS else "write", partial)


def _hash_file(path: Path, upto: int, cancel: threading.Event | None, meter: _Meter) -> Any:
    digest = hashlib.sha256()
    done = 0
    with open(path, "rb") as handle:
        while done < upto:
            block = handle.read(min(4 * CHUNK, upto - done))
            if not block:
                break
            digest.update(block)
            done += len(block)
            meter(done, "checking")
            if cancel is not None and cancel.is_set():
                raise _Stopped
    return digest


class _Stopped(Exception):
    pass


class _Lost(Exception):
    """The connection broke mid-file (a retry resumes)."""


def download(client: HubClient, repo: str, file: str, models_dir: str | os.PathLike[str], *,
             revision: str = "main", cancel: threading.Event | None = None,
             progress: Callable[[DownloadProgress], Any] | None = None,
             restart: bool = False, margin: int = FREE_SPACE_MARGIN) -> Path:
    """Download ``file`` of ``repo`` into the models folder and return its path.

    Resumes a partial file of the same content (same sha256 and size), or starts over
    with ``restart`` or when the hub's file changed. A file already downloaded is
    returned as it is. ``cancel`` stops within one chunk (the partial is kept);
    ``progress`` is called with :class:`DownloadProgress`. Raises :class:`HubError`.
    """
    info = client.file(repo, file, revision)
    target = download_target(models_dir, repo, file)
    try:
        return _start(client, info, target, revision, cancel, progress, restart, margin)
    except HubError:
        raise
    except OSError as exc:  # the models folder: not writable, gone, read-only...
        partial = _partial(target)
        raise HubError(f"Cannot write the download in {target.parent} ({exc.strerror or exc}); check that "
                       "the models folder is writable.", "write", partial if partial.exists() else None) from None


def _start(client: HubClient, info: HubFile, target: Path, revision: str, cancel: threading.Event | None,
           progress: Callable[[DownloadProgress], Any] | None, restart: bool, margin: int) -> Path:
    """Resume or start over, check the free space, then download (:func:`download`)."""
    if target.is_file() and target.stat().st_size == info.size:
        return target  # checked before it got its name
    make_private_dir(target.parent)
    partial = _partial(target)
    record = _read_record(target)
    wanted = {"repo": info.repo, "file": info.path, "revision": revision, "size": info.size,
              "sha256": info.sha256}
    same = all(record.get(k) == wanted[k] for k in ("repo", "file", "size", "sha256"))
    if restart or not same or record.get("mismatch"):
        _discard(target)
    have = partial.stat().st_size if partial.is_file() else 0
    if have > info.size:
        _discard(target)
        have = 0
    free = shutil.disk_usage(target.parent).free
    if free < info.size - have + margin:
        raise HubError(f"Not enough free space for {info.name}: it needs {_mb(info.size - have)} "
                       f"more (and {_mb(margin)} to spare) but {target.parent} has {_mb(free)} free.",
                       "no_space", partial if have else None)
    _write_record(target, wanted)
    try:
        return _download(client, info, target, wanted, have, cancel, progress)
    except HubError:
        if not partial.exists():  # nothing arrived: no record of it either
            _record(target).unlink(missing_ok=True)
        raise


def _download(client: HubClient, info: HubFile, target: Path, wanted: dict[str, Any], have: int,
              cancel: threading.Event | None, progress: Callable[[DownloadProgress], Any] | None) -> Path:
    partial = _partial(target)
    meter = _Meter(info.name, info.size, have, progress)
    state = _State(have, hashlib.sha256())
    try:
        if have:
            state.digest = _hash_file(partial, have, cancel, meter)
        tries = 0
        while state.have < info.size:
            try:
                _fetch(client, info, partial, state, cancel, meter, target.parent)
            except _Lost as exc:
                tries += 1
                if tries > RESUME_TRIES:
                    raise HubError(f"The download of {info.name} kept breaking off ({exc}) at "
                                   f"{_mb(state.have)} of {_mb(info.size)}; download again to "
                                   "resume.", "network", partial) from None
                log.info("%s: connection lost at %d bytes (%s); resuming", info.name, state.have, exc)
                time.sleep(RESUME_PAUSE_S * min(2 ** (tries - 1), 4))
    except _Stopped:
        done = partial.stat().st_size if partial.is_file() else 0
        raise HubError(f"Stopped at {_mb(done)} of {_mb(info.size)}; download again to resume, "
                       "or remove the partial file.", "stopped", partial) from None
    meter(info.size, "verifying", force=True)
    return _finish(info, partial, target, state.digest.hexdigest(), wanted)


@dataclass
class _State:
    """The bytes in the partial file and their running sha256 (always in step)."""

    have: int
    digest: Any

    def restart(self, partial: Path, why: str) -> None:
        log.info("%s: starting over (%s)", partial, why)
        with open(partial, "wb"):
            pass
        self.have, self.digest = 0, hashlib.sha256()


def _fetch(client: HubClient, info: HubFile, partial: Path, state: _State,
           cancel: threading.Event | None, meter: _Meter, folder: Path) -> None:
    """One request for the rest of the file, appended to ``partial``; raises _Lost when
    the connection breaks (``state`` then says what arrived)."""
    headers = {"Accept-Encoding": "identity"}
    if state.have:
        headers["Range"] = f"bytes={state.have}-"
    url = client.resolve_url(info.repo, info.path, info.revision)
    try:
        with client.client.stream("GET", url, headers=headers) as response:
            if response.status_code == 416 and state.have:
                state.restart(partial, "a refused range")
                raise _Lost("the file host refused to resume")
            if response.status_code >= 400:
                response.read()
                raise client._status_error(response, f"{info.path} of {info.repo}",
                                           partial if state.have else None)
            if state.have and response.status_code == 200:
                state.restart(partial, "a host that ignored Range")
            elif state.have and not response.headers.get("content-range", "").startswith(
                    f"bytes {state.have}-"):
                state.restart(partial, "an unexpected Content-Range")
                raise _Lost("the file host resumed at another place")
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                for block in response.iter_raw():  # as it arrives: a cut loses nothing received
                    if state.have + len(block) > info.size:
                        raise HubError(f"The file host sent more than the {info.size:,} bytes the "
                                       f"hub lists for {info.name}; download again to start over.",
                                       "answer", partial)
                    _write_all(fd, block, folder, info, state.have, partial)
                    state.digest.update(block)
                    state.have += len(block)
                    meter(state.have)
                    if cancel is not None and cancel.is_set():
                        raise _Stopped
            finally:
                os.close(fd)
    except httpx.HTTPError as exc:
        if isinstance(exc, httpx.ConnectError) and state.have == 0:
            raise HubError(f"The file host for {info.name} cannot be reached ({_describe(exc)}); "
                           "check the network.", "network") from None
        raise _Lost(_describe(exc)) from None
    if state.have < info.size:
        raise _Lost("the file host closed the connection early")


def _write_all(fd: int, block: bytes, folder: Path, info: HubFile, have: int, partial: Path) -> None:
    view = memoryview(block)
    try:
        while view:
            n = os.write(fd, view)
            view = view[n:]
    except OSError as exc:
        raise _disk_error(exc, folder, info.name, have, info.size, partial) from None


def _finish(info: HubFile, partial: Path, target: Path, sha: str, wanted: dict[str, Any]) -> Path:
    if info.sha256 is not None and sha != info.sha256:
        _write_record(target, {**wanted, "mismatch": True})
        raise HubError(f"{info.name} is not the file the hub lists: its sha256 is {sha[:12]}…, "
                       f"the hub's {info.sha256[:12]}…; it was not used (download again to "
                       "start over, or remove the partial file).", "checksum", partial)
    if partial.stat().st_size != info.size:
        raise HubError(f"{info.name} has {partial.stat().st_size:,} bytes, the hub lists "
                       f"{info.size:,}; download again to resume.", "network", partial)
    try:
        read_gguf_info(partial)
    except GGUFError as exc:
        _write_record(target, {**wanted, "mismatch": True})
        raise HubError(f"{info.name} is not a usable GGUF file ({exc.reason}); it was not used.",
                       "not_gguf", partial) from None
    with open(partial, "rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(partial, target)
    try:
        _record(target).unlink()
    except FileNotFoundError:
        pass
    log.info("downloaded %s of %s (%d bytes, sha256 %s) to %s", info.path, info.repo, info.size, sha, target)
    return target
