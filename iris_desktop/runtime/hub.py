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
proxy; a local model server (``runtime.remote``) stays proxy-free.

A download (:func:`download`) goes to ``<models>/downloads/<org>/<repo>/<file>.gguf``,
where the model library lists it under the source ``download``:

1. the file's size and sha256 come from the hub's tree first;
2. the free space is checked before a byte is written;
3. bytes go to ``<file>.gguf.partial`` (0600) beside a small ``.partial.json`` record
   (repo, revision, size, sha256); Stop, a crash or a lost connection leave it, and the
   next download of the same file resumes it with ``Range`` (a lost connection is resumed
   at once, a few times);
4. the whole file's sha256 must equal the hub's, and its GGUF header must read as any
   opened model's (:func:`~.gguf.read_gguf_info`), before it gets its name (fsynced,
   renamed, the folder fsynced);
5. what was verified is recorded in ``<models>/downloads/.records/<org>/<repo>/<file>.json``
   (the repository path, revision, sha256, size and mtime): a file already there counts
   as downloaded only when its own recorded sha256 (hashed again when the file changed
   or has no record) equals the sha256 the hub lists for that exact path and revision.
   When the hub lists no sha256, the file's is computed and recorded, and the download
   is "not verified by the hub" (:func:`download_record`).

A listing with a size of 0 or less, or a sha256 that is not 64 hexadecimal digits, is
refused before anything is written. Two downloads of one file (two windows, a window
and the command line) never write one ``.partial``: a lock file
(``.records/…/<file>.lock``, ``flock`` on POSIX, ``msvcrt.locking`` on Windows) makes
the second wait, saying so, until the first ends, then find the file there. A search or
file list is read whole within :data:`MAX_LISTING_BYTES` and
:data:`LISTING_TIMEOUT_S` (``runtime.http``), so a broken or hostile hub can neither
fill the memory nor hold the dialog.

Every failure is a :class:`HubError`: one sentence, a ``kind`` (``network``, ``http``,
``auth``, ``not_found``, ``no_space``, ``disk_full``, ``checksum``, ``not_gguf``,
``stopped``, ``write``, ``address``, ``answer``, ``busy``) and the partial file, kept for
the user to resume or remove (:func:`discard_partial`).
"""

from __future__ import annotations

import collections
import contextlib
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
from iris_desktop.files import atomic_write, clean_leftovers, commit_partial
from iris_desktop.keyring_secrets import delete_secret, get_secret, set_secret
from iris_desktop.paths import make_private_dir

from .cpu import system_memory_bytes
from .gguf import GGUFError, GGUFInfo, read_gguf_info
from .http import (
    AnswerError,
    AnswerTooLarge,
    AnswerTooSlow,
    open_following,
    read_answer,
    size_words,
)
from .library import DEFAULT_N_CTX, kv_cache_bytes
from .remote.address import KEYRING_SERVICE, server_address

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
    "download_record",
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
#: a search or one page of a file list, read whole: at most this many bytes (decoded)…
MAX_LISTING_BYTES = 16 << 20
#: …within this long, the whole exchange
LISTING_TIMEOUT_S = 60.0
#: how often a download waiting for another download of the same file tries again
LOCK_POLL_S = 0.2
#: the folder of ``<models>/downloads`` where what was verified is recorded
RECORDS = ".records"

_REPO = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}$")
_SHA256 = re.compile(r"[0-9a-f]{64}")
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
    #: lower-case hex; None when the hub lists none
    sha256: str | None
    revision: str = "main"
    #: what is wrong with the listing ("a size of -5 bytes"), which refuses a download
    problem: str | None = None

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
    try:
        user = _token_user(hub_url)
    except ValueError as exc:
        log.info("keyring: no hub token for %s: %s", hub_url, exc)
        return None
    return get_secret(KEYRING_SERVICE, user, f"the token for {user}")


def set_hub_token(hub_url: str, token: str) -> None:
    """Save ``token`` for the hub (empty: forget it). Raises keyring.errors.KeyringError
    saying why when the keyring refuses, ValueError for an address that is not a URL."""
    user = _token_user(hub_url)
    set_secret(KEYRING_SERVICE, user, token, f"the token for {user}")


def delete_hub_token(hub_url: str) -> None:
    """Forget the hub's token (nothing saved: nothing to do; a keyring that cannot be
    asked is said in the log)."""
    user = _token_user(hub_url)
    delete_secret(KEYRING_SERVICE, user, f"the token for {user}")


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

    def __init__(self, hub_url: str = DEFAULT_HUB_URL, token: str | None = None, *,
                 answer_limit: int = MAX_LISTING_BYTES,
                 answer_timeout_s: float = LISTING_TIMEOUT_S) -> None:
        self.answer_limit = int(answer_limit)
        self.answer_timeout_s = float(answer_timeout_s)
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
        """The JSON answer, read whole within :attr:`answer_limit` bytes and
        :attr:`answer_timeout_s` (``runtime.http``); HubError otherwise."""
        try:
            request = self.client.build_request("GET", url, params=params)
            response = read_answer(self.client, request, limit=self.answer_limit,
                                   timeout_s=self.answer_timeout_s, follow_redirects=True)
        except AnswerTooLarge as exc:
            raise HubError(f"The model hub {self.address} sent more than {size_words(exc.limit)} in "
                           f"its answer about {what or url}, so Iris stopped reading it; check that "
                           "models.hub_url is a Hugging Face hub.", "answer") from None
        except AnswerTooSlow as exc:
            raise HubError(f"The model hub {self.address} did not finish answering about "
                           f"{what or url} within {exc.timeout_s:g} s; try again later, or check "
                           "models.hub_url.", "network") from None
        except AnswerError as exc:
            raise HubError(f"The model hub {self.address} {exc.cause} about {what or url}; check "
                           "models.hub_url.", "answer") from None
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
    """One file of a listing. Its size (the LFS object's, else the entry's) and sha256
    (``lfs.oid``, any case, normalised to lower-case hex) are kept as listed; a size
    that is not a whole number above 0, or a sha256 that is not 64 hexadecimal digits,
    is said in ``problem``, which refuses a download of it."""
    path = item.get("path")
    if not isinstance(path, str):
        return None
    lfs = item.get("lfs") if isinstance(item.get("lfs"), dict) else {}
    raw_size = lfs["size"] if lfs.get("size") is not None else item.get("size")
    size, problem = _int(raw_size), None
    if size is None:
        size, problem = 0, f"a size of {_shown(raw_size)}, which is not a number of bytes"
    elif size <= 0:
        problem = f"a size of {size:,} bytes"
    raw_sha = lfs.get("oid")
    sha = None
    if raw_sha is not None:
        sha = _normal_sha(raw_sha)
        if sha is None:
            problem = problem or f"the sha256 {_shown(raw_sha)}, which is not 64 hexadecimal digits"
    return HubFile(repo, path, size, sha, revision, problem)


def _normal_sha(value: Any) -> str | None:
    """``value`` as 64 lower-case hex digits (any case, an optional ``sha256:``); None when
    it is not a sha256."""
    if not isinstance(value, str):
        return None
    text = value.strip().lower().removeprefix("sha256:")
    return text if _SHA256.fullmatch(text) else None


def _shown(value: Any) -> str:
    """A listed value as a sentence may quote it (short, one line)."""
    text = json.dumps(value, ensure_ascii=True) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 72 else text[:69] + "..."


# ---------------------------------------------------------------------------
# downloading


@dataclass(frozen=True)
class DownloadProgress:
    """How far a download is: ``phase`` is "waiting" (for another download of the same
    file to end), "checking" (hashing a partial file before resuming), "rechecking"
    (hashing a file already there that has no record, or changed since), "downloading"
    or "verifying"."""

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
    #: the hub lists a sha256 for the file (False: it cannot be verified by the hub)
    listed_sha256: bool = True

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 0.0

    def describe(self) -> str:
        if self.phase == "waiting":
            return f"Waiting for another download of {self.file} to end…"
        if self.phase == "checking":
            part = self.done / self.resumed_from if self.resumed_from else 1.0
            return f"Checking the {_mb(self.resumed_from)} downloaded before… {part:.0%}"
        if self.phase == "rechecking":
            return f"Checking the {self.file} already in the models folder (sha256)… {self.fraction:.0%}"
        if self.phase == "verifying":
            if not self.listed_sha256:
                return (f"Checking {self.file} (GGUF header; the hub lists no sha256, so it is "
                        "not verified by the hub)…")
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
    return _read_json(_record(target))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_record(target: Path, data: dict[str, Any]) -> None:
    atomic_write(_record(target), json.dumps(data))


def _records_dir(target: Path) -> Path:
    """``<models>/downloads/.records/<org>/<repo>`` for ``target``
    (``<models>/downloads/<org>/<repo>/<file>``)."""
    return target.parents[2] / RECORDS / target.parent.parent.name / target.parent.name


def _done_record(target: Path) -> Path:
    """What was verified of the downloaded ``target``."""
    return _records_dir(target) / f"{target.name}.json"


def _lock_file(target: Path) -> Path:
    return _records_dir(target) / f"{target.name}.lock"


def _own_sha256(target: Path, record: dict[str, Any]) -> str | None:
    """``target``'s sha256 as recorded when it got its name, if the file is still that
    one (same size and modification time); None otherwise (no record, or changed)."""
    try:
        st = target.stat()
    except OSError:
        return None
    sha = _normal_sha(record.get("sha256"))
    if sha is None or record.get("size") != st.st_size or record.get("mtime_ns") != st.st_mtime_ns:
        return None
    return sha


def _write_done(target: Path, info: HubFile, sha: str) -> None:
    st = target.stat()
    make_private_dir(_records_dir(target))
    atomic_write(_done_record(target), json.dumps({
        "repo": info.repo, "file": info.path, "revision": info.revision, "size": st.st_size,
        "mtime_ns": st.st_mtime_ns, "sha256": sha, "listed_sha256": info.sha256,
        "verified_by_hub": info.sha256 is not None and info.sha256 == sha}))


def download_record(models_dir: str | os.PathLike[str], repo: str, file: str) -> dict[str, Any] | None:
    """What was verified of the downloaded ``file`` of ``repo``, when it is there and
    unchanged since: ``{"path", "repo", "file", "revision", "sha256", "listed_sha256",
    "verified_by_hub"}`` (``verified_by_hub`` False: the hub listed no sha256, so only
    the GGUF header was checked; say "not verified by the hub" rather than "verified").
    None when the file is absent, has no record or changed since."""
    target = download_target(models_dir, repo, file)
    record = _read_json(_done_record(target))
    sha = _own_sha256(target, record)
    if sha is None:
        return None
    return {"path": str(target), "repo": record.get("repo"), "file": record.get("file"),
            "revision": record.get("revision"), "sha256": sha,
            "listed_sha256": record.get("listed_sha256"),
            "verified_by_hub": record.get("verified_by_hub") is True}


def verified_words(record: dict[str, Any] | None) -> str:
    """How a downloaded file was checked, in words for the CLI and the dialog: "verified
    (sha256 and GGUF header)" only when its sha256 equals the hub's listed one."""
    if record is not None and record.get("verified_by_hub"):
        return "verified (sha256 and GGUF header)"
    return ("checked as a GGUF file, not verified by the hub (it lists no sha256 for this "
            "file)")


class _Meter:
    """Speed over the last :data:`SPEED_WINDOW_S` seconds, and progress reports at most
    every :data:`PROGRESS_EVERY_S`."""

    def __init__(self, file: str, total: int, start: int, report: Callable[[DownloadProgress], Any] | None,
                 listed_sha256: bool = True):
        self.file, self.total, self.start, self.report = file, total, start, report
        self.listed_sha256 = listed_sha256
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
        self.report(DownloadProgress(self.file, done, self.total, speed, eta, self.start, phase,
                                     self.listed_sha256))


def _disk_error(exc: OSError, folder: Path, name: str, done: int, total: int, partial: Path) -> HubError:
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return HubError(f"The disk is full: {folder} had no room for the rest of {name} "
                        f"({_mb(done)} of {_mb(total)} written); free some space and download "
                        "again to resume, or remove the partial file.", "disk_full", partial)
    return HubError(f"Cannot write {partial} ({exc.strerror or exc}); check the models folder.",
                    "disk_full" if exc.errno == errno.EROFS else "write", partial)


def _hash_file(path: Path, upto: int, cancel: threading.Event | None, meter: _Meter,
               phase: str = "checking") -> Any:
    digest = hashlib.sha256()
    done = 0
    with open(path, "rb") as handle:
        while done < upto:
            block = handle.read(min(4 * CHUNK, upto - done))
            if not block:
                break
            digest.update(block)
            done += len(block)
            meter(done, phase)
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
             restart: bool = False, margin: int = FREE_SPACE_MARGIN, wait: bool = True) -> Path:
    """Download ``file`` of ``repo`` into the models folder and return its path.

    Resumes a partial file of the same content (same sha256 and size), or starts over
    with ``restart`` or when the hub's file changed. A file already downloaded is
    returned as it is only when its own recorded sha256 equals the one the hub lists for
    this path and revision (with none listed: when it was recorded for this very path
    and revision); :func:`download_record` says whether the hub verified it. While
    another download of the same file runs (another window or process) this one waits,
    reporting the phase "waiting" (``wait`` False: HubError ``busy`` at once).
    ``cancel`` stops within one chunk (the partial is kept); ``progress`` is called with
    :class:`DownloadProgress`. Raises :class:`HubError`.
    """
    info = client.file(repo, file, revision)
    if info.problem is not None:
        raise HubError(f"The model hub {client.address} lists {info.path} of {info.repo} with "
                       f"{info.problem}, which cannot be right; Iris did not download it.", "answer")
    target = download_target(models_dir, repo, file)
    try:
        return _start(client, info, target, revision, cancel, progress, restart, margin, wait)
    except HubError:
        raise
    except OSError as exc:  # the models folder: not writable, gone, read-only...
        partial = _partial(target)
        raise HubError(f"Cannot write the download in {target.parent} ({exc.strerror or exc}); check that "
                       "the models folder is writable.", "write", partial if partial.exists() else None) from None


def _start(client: HubClient, info: HubFile, target: Path, revision: str, cancel: threading.Event | None,
           progress: Callable[[DownloadProgress], Any] | None, restart: bool, margin: int,
           wait: bool) -> Path:
    """With the file's lock held: the file already there, or resume or start over,
    check the free space, then download (:func:`download`)."""
    make_private_dir(target.parent)
    make_private_dir(_records_dir(target))
    meter = _Meter(info.name, info.size, 0, progress, info.sha256 is not None)
    with _download_lock(target, info, cancel, meter, wait):
        if _present(info, target, cancel, meter):
            return target
        for folder in (target.parent, _records_dir(target)):
            clean_leftovers(folder)  # what a killed write of a record left
        _record(target).with_name(_record(target).name + ".tmp").unlink(missing_ok=True)  # older Iris
        return _resume_or_start(client, info, target, revision, cancel, progress, restart, margin)


def _present(info: HubFile, target: Path, cancel: threading.Event | None, meter: _Meter) -> bool:
    """Whether ``target`` is the file the hub lists: its own sha256 (as recorded when it
    got its name, or hashed now when it has no record or changed since) equals the
    listed one; with none listed, it must have been recorded for this very repository
    path and revision. A file that passes without a record gets one."""
    try:
        st = target.stat()
    except OSError:
        return False
    if not target.is_file() or st.st_size != info.size:
        return False
    record = _read_json(_done_record(target))
    own = _own_sha256(target, record)
    same_path = (record.get("repo"), record.get("file"), record.get("revision")) == (
        info.repo, info.path, info.revision)
    if info.sha256 is None:  # nothing to compare with: only this very file's record will do
        return own is not None and same_path
    if own is None:
        try:
            own = _hash_file(target, info.size, cancel, meter, "rechecking").hexdigest()
        except _Stopped:
            raise HubError(f"Stopped while checking the {info.name} already in the models folder; "
                           "download again to check it.", "stopped") from None
    if own != info.sha256:
        log.info("%s: its sha256 %s is not the hub's %s for %s of %s at %s; downloading it again",
                 target, own, info.sha256, info.path, info.repo, info.revision)
        return False
    if not same_path or record.get("sha256") != own or _own_sha256(target, record) is None:
        _write_done(target, info, own)
    return True


@contextlib.contextmanager
def _download_lock(target: Path, info: HubFile, cancel: threading.Event | None, meter: _Meter,
                   wait: bool) -> Any:
    """Hold the lock of ``target``'s download (another process or window downloading the
    same file waits here, reporting "waiting"; ``wait`` False: HubError ``busy``)."""
    path = _lock_file(target)
    waiting = False
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o600)
        try:
            locked = _try_lock(fd)
        except OSError as exc:  # a file system without locks: go on unguarded, as before
            log.warning("%s: cannot lock (%s); downloading without a lock", path, exc)
            locked = True
        if locked and _still_named(fd, path):
            break
        if locked:
            _unlock(fd)
        os.close(fd)
        if locked:
            continue  # the holder removed the name as it finished: lock the new one
        if not wait:
            raise HubError(f"Another download of {info.name} is running (another Iris window or "
                           "command); wait for it to end, or stop it first.", "busy")
        if cancel is not None and cancel.is_set():
            raise HubError(f"Stopped while another download of {info.name} was running; nothing "
                           "of this one was written.", "stopped")
        if not waiting:
            log.info("%s: another download of it is running; waiting", target)
        meter(0, "waiting", force=not waiting)
        waiting = True
        time.sleep(LOCK_POLL_S)
    try:
        yield
    finally:
        if os.name != "nt":  # the name goes while it is locked, so no one locks a stale file
            with contextlib.suppress(OSError):
                path.unlink()
        _unlock(fd)
        os.close(fd)


def _try_lock(fd: int) -> bool:
    """Lock ``fd`` exclusively without waiting; False when another holds it. OSError when
    the file system cannot lock."""
    if os.name == "nt":
        import msvcrt

        os.lseek(fd, 0, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EDEADLK, getattr(errno, "EDEADLOCK", errno.EDEADLK)):
                return False
            raise
        return True
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _unlock(fd: int) -> None:
    with contextlib.suppress(OSError):
        if os.name == "nt":
            import msvcrt

            os.lseek(fd, 0, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        else:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_UN)


def _still_named(fd: int, path: Path) -> bool:
    """Whether ``path`` is still the file ``fd`` locked (POSIX: a finishing holder removes
    the name; Windows keeps it)."""
    if os.name == "nt":
        return True
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:
        return False


def _resume_or_start(client: HubClient, info: HubFile, target: Path, revision: str,
                     cancel: threading.Event | None, progress: Callable[[DownloadProgress], Any] | None,
                     restart: bool, margin: int) -> Path:
    partial = _partial(target)
    record = _read_record(target)
    wanted = {"repo": info.repo, "file": info.path, "revision": revision, "size": info.size,
              "sha256": info.sha256}
    # with no sha256 listed, only the same revision's bytes may be resumed
    keys = ("repo", "file", "size", "sha256") + (("revision",) if info.sha256 is None else ())
    same = all(record.get(k) == wanted[k] for k in keys)
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
    meter = _Meter(info.name, info.size, have, progress, info.sha256 is not None)
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
        # redirects followed without reading their bodies (httpx would read them whole)
        request = client.client.build_request("GET", url, headers=headers)
        with contextlib.closing(open_following(client.client, request)) as response:
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
    commit_partial(partial, target)  # the bytes fsynced, the rename, the folder fsynced
    _write_done(target, info, sha)
    _record(target).unlink(missing_ok=True)
    if info.sha256 is None:
        log.warning("downloaded %s of %s (%d bytes) to %s: the hub lists no sha256, so it is not "
                    "verified by the hub (its sha256 is %s; its GGUF header reads)",
                    info.path, info.repo, info.size, target, sha)
    else:
        log.info("downloaded %s of %s (%d bytes, sha256 %s, as the hub lists) to %s",
                 info.path, info.repo, info.size, sha, target)
    return target
