"""The hub's HTTP API (a search, a repository's files, a file's address) with the hub's
token (:mod:`.token`), and what a listing says, checked: a repository or file name that
cannot be one, a size or sha256 that cannot be right. Every failure of the package is a
:class:`HubError`."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import quote

import httpx

from iris_desktop import __version__

from ..http import (
    MAX_REDIRECTS,
    AnswerError,
    AnswerTooComplex,
    AnswerTooLarge,
    AnswerTooSlow,
    RedirectRefused,
    failure_cause,
    json_answer,
    read_answer,
    short_reason,
    shown_address,
    size_words,
)
from ..remote.address import server_address
from .token import HubToken, hub_token

log = logging.getLogger("iris.runtime.hub")

DEFAULT_HUB_URL = "https://huggingface.co"
CONNECT_TIMEOUT_S = 10.0
#: an answer (or the next bytes of a download) may take this long
READ_TIMEOUT_S = 60.0
#: tree pages followed at most (Hugging Face pages 1,000 files a time)
MAX_TREE_PAGES = 20
SEARCH_LIMIT = 30
#: a search's answer, read whole: at most this many bytes (decoded). Hugging Face's answer
#: for 30 repositories is some 10 to 50 KiB (a repository's id, counts, dates and tags)
MAX_SEARCH_BYTES = 1 << 20
#: a search or one page of a file list, read whole: at most this many bytes (decoded)…
MAX_LISTING_BYTES = 16 << 20
#: …within this long, the whole exchange
LISTING_TIMEOUT_S = 60.0
#: a file list, all its pages together: at most this many bytes and entries (the rest is
#: left out, and :attr:`HubFiles.cut` says so)
MAX_LIST_BYTES = 16 << 20
MAX_LIST_ENTRIES = 50_000

_REPO = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}$")
#: a part of a repository id may not start or end with "." or "-" (the hub's own rule)
_REPO_PART_EDGE = re.compile(r"(^[.-])|([.-]$)")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_QUANT = re.compile(r"(?<![A-Za-z0-9])(I?Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32)(?![A-Za-z0-9])", re.IGNORECASE)


class HubError(RuntimeError):
    """A search, listing or download failed. The message is one sentence that says what
    to do; ``kind`` says what failed; ``partial`` is the partial file left for resuming
    (None when there is none)."""

    def __init__(self, message: str, kind: str = "http", partial: Path | None = None,
                 status: int | None = None, start_over: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.partial = partial
        self.status = status
        #: the partial file cannot be resumed (the next download starts over)
        self.start_over = start_over

    @property
    def resumable(self) -> bool:
        """Downloading the same file again goes on from the partial file."""
        return (self.partial is not None and self.kind not in ("checksum", "not_gguf")
                and not self.start_over)


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
    #: what the hub says the model is for ("text-generation", "feature-extraction"), if it says
    pipeline_tag: str | None = None

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


class _TooLarge(HubError):
    """An answer larger than it may be (a HubError of kind ``answer``)."""


class HubFiles(list):
    """A repository's files (:meth:`HubClient.files`); ``cut`` is the sentence that says
    the hub's list was longer than Iris reads (None: the whole list)."""

    cut: str | None = None


# ---------------------------------------------------------------------------
# the client


def _is_repo(repo: str) -> bool:
    """``owner/name`` as the hub allows it: no ".." and no part that starts or ends with
    "." or "-" (``Org/.``, ``Org/name.`` are none)."""
    return bool(_REPO.match(repo)) and ".." not in repo and not any(
        _REPO_PART_EDGE.search(part) for part in repo.split("/"))


def _check_repo(repo: str) -> str:
    repo = repo.strip()
    if not _is_repo(repo):
        raise HubError(f"{repo!r} is not a repository name; expected owner/name, such as "
                       "Qwen/Qwen2.5-3B-Instruct-GGUF.", "address")
    return repo


def _tag(value: Any) -> str | None:
    """The hub's pipeline tag of a model when it is one ("text-generation"); None otherwise."""
    if isinstance(value, str) and 0 < len(value) <= 64 and all(c.isascii() and (c.isalnum() or c == "-")
                                                               for c in value):
        return value.lower()
    return None


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
        return f"the proxy refused ({short_reason(exc)})"
    if isinstance(exc, httpx.UnsupportedProtocol):  # a redirect to file:// and the like
        return "an address that is not http:// or https://"
    return f"the request failed: {short_reason(exc)}"  # before: httpx's class name alone


class HubClient:
    """Requests to one hub: its address, the token (when given: a string, or a
    :class:`~.token.HubToken` that says where it came from) and the environment's
    proxies (``trust_env=True``: unlike a model server's client, the hub needs them
    behind a corporate proxy). Redirects are followed (the file host is another origin,
    and httpx does not send it the token)."""

    def __init__(self, hub_url: str = DEFAULT_HUB_URL, token: str | HubToken | None = None, *,
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
        #: the token sent, and where it came from (the sentence of a refusal names it)
        self.token = HubToken(token) if isinstance(token, str) else token
        if self.token is not None and not self.token.value:
            self.token = None
        headers = {"User-Agent": f"iris-desktop/{__version__}"}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token.value}"
        try:
            self.client = httpx.Client(
                headers=headers, trust_env=True, follow_redirects=True,
                timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S))
        except (ImportError, ValueError, httpx.InvalidURL) as exc:  # SOCKS without socksio, a bad proxy URL
            raise HubError(f"The proxy set in the environment cannot be used ({exc}); fix HTTPS_PROXY, "
                           "HTTP_PROXY or ALL_PROXY, or unset it.", "address") from None

    @classmethod
    def for_settings(cls, hub_url: str) -> HubClient:
        """A client for ``models.hub_url`` with its token, if any (:func:`~.token.hub_token`:
        the keyring's for it, else HF_TOKEN or HUGGING_FACE_HUB_TOKEN for the Hugging Face
        hub over HTTPS only); HubError (``address``) for a variable that holds no token."""
        try:
            token = hub_token(hub_url)
        except ValueError as exc:
            raise HubError(f"{exc}.", "address") from None
        return cls(hub_url, token)

    # -- JSON --

    def _get_json(self, url: str, params: dict | None = None, what: str = "", *,
                  limit: int | None = None, hook: Callable[[list], Any] | None = None
                  ) -> tuple[Any, httpx.Response]:
        """The JSON answer, read whole within :attr:`answer_limit` bytes (or ``limit``) and
        :attr:`answer_timeout_s` (``runtime.http``), its objects made by ``hook`` (json's
        ``object_pairs_hook``) when given; HubError otherwise."""
        limit = self.answer_limit if limit is None else limit
        try:
            request = self.client.build_request("GET", url, params=params)
            response = read_answer(self.client, request, limit=limit,
                                   timeout_s=self.answer_timeout_s, follow_redirects=True)
        except AnswerTooLarge as exc:
            said = f"sent more than {size_words(exc.limit)} in" if exc.announced is None else \
                f"announced {size_words(exc.announced)} (Content-Length), more than the " \
                f"{size_words(exc.limit)} Iris reads, for"  # (a 60-byte body "sent more than 8 MiB")
            raise _TooLarge(f"The model hub {self.address} {said} its answer about {what or url}, so "
                            "Iris stopped reading it; check that models.hub_url is a Hugging Face "
                            "hub.", "answer") from None
        except RedirectRefused as exc:  # before: "cannot be reached (UnsupportedProtocol)"
            raise HubError(f"The model hub {self.address} redirected {what or 'its answer'} to "
                           f"{shown_address(exc.location, 80)}, which is not an http:// or https:// "
                           "address; Iris did not follow it (check models.hub_url).", "answer") from None
        except AnswerTooSlow as exc:
            raise HubError(f"The model hub {self.address} did not finish answering about "
                           f"{what or url} within {exc.timeout_s:g} s; try again later, or check "
                           "models.hub_url.", "network") from None
        except AnswerError as exc:
            raise HubError(f"The model hub {self.address} {exc.cause} about {what or url}; check "
                           "models.hub_url.", "answer") from None
        except (httpx.InvalidURL, UnicodeError) as exc:  # a host no DNS name can be (was "a bug")
            if _reachable_name(self.root):  # then a redirect named it
                raise HubError(f"The model hub {self.address} redirected {what or 'its answer'} to an "
                               "address that is not one; Iris did not follow it (check models.hub_url).",
                               "answer") from None
            raise HubError(f"models.hub_url {self.address} is not an address Iris can reach ({exc}); "
                           "set it to the hub's https:// address, such as https://huggingface.co.",
                           "address") from None
        except httpx.TooManyRedirects as exc:  # before: "cannot be reached (the request failed: …)"
            last = _url_of(exc)
            raise HubError(f"The model hub {self.address} kept redirecting {what or 'its answer'} (more "
                           f"than {MAX_REDIRECTS} times"
                           + (f", last to {shown_address(str(last), 80)}" if last is not None else "")
                           + "); Iris stopped following it: try again later, or check models.hub_url.",
                           "answer") from None
        except httpx.HTTPError as exc:
            raise self.unreached(exc) from None
        if response.status_code >= 400:
            raise self._status_error(response, what)
        try:  # its values bounded by its size (16 MiB of [] took 450 MB), its text valid
            return json_answer(response.content, limit, hook), response
        except AnswerTooComplex as exc:
            raise _TooLarge(f"The model hub {self.address} sent more than {exc.values:,} JSON values "
                            f"in its answer about {what or url}, more than a real one holds, so Iris "
                            "did not read it; check that models.hub_url is a Hugging Face hub.",
                            "answer") from None
        except (ValueError, RecursionError):  # RecursionError: nested deeper than Python recurses
            raise HubError(f"The model hub {self.address} did not answer JSON for {what or url}; "
                           "is models.hub_url a Hugging Face hub?", "answer") from None

    def unreached(self, exc: httpx.HTTPError) -> HubError:
        """The hub itself could not be reached: why, when it is something to put right (a
        certificate this computer does not trust, TLS at the wrong port), in a sentence."""
        cause = failure_cause(exc, "models.hub_url", tls_probe=False)  # maybe by a proxy
        if cause:
            return HubError(f"The model hub {self.address} {cause}.", "network")
        return HubError(f"The model hub {self.address} cannot be reached ({_describe(exc)}); "
                        "check the network or models.hub_url.", "network")

    def _status_error(self, response: httpx.Response, what: str, partial: Path | None = None) -> HubError:
        status = response.status_code
        if status in (401, 403) and self.token is not None:  # which token, and what to do about it
            return HubError(f"The model hub {self.address} refused access to {what} (HTTP {status}) "
                            f"with {self.token.words}: the token may be wrong or expired, or the "
                            "model gated and its license not accepted with that account; accept "
                            f"it on the hub's page, or {self.token.fix}.", "auth", partial, status)
        if status in (401, 403):
            return HubError(f"The model hub {self.address} refused access to {what} (HTTP {status}): "
                            "the model may be gated or private; accept its license on the hub's "
                            "page and save a token.", "auth", partial, status)
        if status == 404 and what.startswith("the search"):  # (it read "has no the search for")
            return HubError(f"The model hub {self.address} answered HTTP 404 (Not Found) to {what}; "
                            "check that models.hub_url is a Hugging Face hub.", "not_found", partial, status)
        if status == 404:
            return HubError(f"The model hub {self.address} has no {what} (HTTP 404); check the "
                            "name and the revision.", "not_found", partial, status)
        if status == 429:
            return HubError(f"The model hub {self.address} asks to slow down (HTTP 429); try "
                            "again in a few minutes.", "http", partial, status)
        # the standard words for the status: the server's own reason phrase is not shown
        reason = httpx.codes.get_reason_phrase(status) or "error"
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
                                 f"the search for {text!r}",
                                 limit=min(self.answer_limit, MAX_SEARCH_BYTES))
        if not isinstance(data, list):
            raise HubError(f"The model hub {self.address} answered the search with something "
                           "other than a list.", "answer")
        repos: list[HubRepo] = []
        for item in data:
            if len(repos) >= limit:  # no more than asked for, whatever the hub sends
                break
            if not isinstance(item, dict):
                continue
            rid = item.get("id") or item.get("modelId")
            if not isinstance(rid, str) or not _is_repo(rid):
                continue
            repos.append(HubRepo(rid, _int(item.get("downloads")), _int(item.get("likes")),
                                 item.get("lastModified") if isinstance(item.get("lastModified"), str) else None,
                                 item.get("gated") if isinstance(item.get("gated"), (bool, str)) else False,
                                 _tag(item.get("pipeline_tag"))))
        return repos

    def files(self, repo: str, revision: str = "main") -> HubFiles:
        """Every file of ``repo`` at ``revision`` with its size and sha256 (LFS files): the
        pages that ``Link: next`` names on the hub's own address (another address is
        refused: the token goes to the hub only), within :data:`MAX_LIST_BYTES` and
        :data:`MAX_LIST_ENTRIES` in all (``cut`` says when the list was longer)."""
        repo = _check_repo(repo)
        url: str | None = f"{self.root}/api/models/{repo}/tree/{quote(revision, safe='')}"
        params: dict | None = {"recursive": "true"}
        out = HubFiles()
        what = f"{repo} at {revision}"
        read = 0
        kept = _Entries(MAX_LIST_ENTRIES)
        for page in range(MAX_TREE_PAGES):
            if url is None:
                break
            if read >= MAX_LIST_BYTES or kept.full:
                out.cut = self._cut(repo, what)
                break
            try:
                data, response = self._get_json(url, params, what, hook=kept,
                                                 limit=min(self.answer_limit, MAX_LIST_BYTES - read))
            except _TooLarge:
                if page == 0:
                    raise
                out.cut = self._cut(repo, what)  # the pages read so far are kept
                break
            read += len(response.content)
            if not isinstance(data, list):
                raise HubError(f"The model hub {self.address} listed {repo} as something other "
                               "than a list of files.", "answer")
            for item in data:
                if isinstance(item, dict) and item.get("type") == "file":
                    entry = _hub_file(repo, revision, item)
                    if entry is not None:
                        out.append(entry)
            if kept.full:
                out.cut = self._cut(repo, what)
                break
            url = self._next_page(response, repo)
            params = None
        return out

    def _cut(self, repo: str, what: str) -> str:
        log.warning("%s: the file list of %s was cut at %d entries or %d bytes", self.address, what,
                    MAX_LIST_ENTRIES, MAX_LIST_BYTES)
        return (f"The model hub {self.address} lists more files in {repo} than Iris reads "
                f"({MAX_LIST_ENTRIES:,} entries or {size_words(MAX_LIST_BYTES)}), so the list was cut "
                "there; a file after that cannot be chosen.")

    def _next_page(self, response: httpx.Response, repo: str) -> str | None:
        """The ``Link: next`` page, when it is on the hub's own scheme, host and port;
        HubError when it names another address (the token would go there)."""
        link = response.links.get("next", {}).get("url")
        if not link:
            return None
        try:
            url = response.url.join(link)
        except (httpx.InvalidURL, ValueError, TypeError):
            url = None
        if url is None or _origin(url) != _origin(httpx.URL(self.root)):
            raise HubError(f"The model hub {self.address} sent the rest of the file list of {repo} "
                           f"to another address ({_shown(link)}); Iris did not follow it, so your "
                           "token stays with the hub; check models.hub_url.", "answer")
        return str(url)

    def file(self, repo: str, path: str, revision: str = "main") -> HubFile:
        """One file's size and sha256; HubError (``not_found``) when the repo lacks it."""
        path = _check_file(path)
        files = self.files(repo, revision)
        for entry in files:
            if entry.path == path:
                return entry
        if files.cut is not None:
            raise HubError(files.cut, "answer")
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


def _reachable_name(url: str) -> bool:
    """Whether ``url``'s host can be a DNS name at all (an IDNA name that cannot be one,
    "xn--a.co", raises from httpx only when it is used)."""
    try:
        httpx.URL(url).host  # noqa: B018 (decoding it is the check)
    except (httpx.InvalidURL, UnicodeError, ValueError):
        return False
    return True


def _url_of(exc: httpx.HTTPError) -> httpx.URL | None:
    """The address of the request that failed (the last redirect's), when it is known."""
    try:
        return exc.request.url
    except RuntimeError:  # an exception made without its request
        return None


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    """Scheme, host and port (the default one written out)."""
    default = {"http": 80, "https": 443}.get(url.scheme)
    try:
        host = url.host.lower()
    except UnicodeError:  # (an IDNA name that cannot be one: no origin matches it)
        host = url.netloc.decode("ascii", "replace")
    return url.scheme, host, url.port or default


class _Entries:
    """json's ``object_pairs_hook`` for a file list: a file entry is kept while fewer than
    ``limit`` were, an object that is no entry (a folder) is dropped as it is parsed, so a
    huge list holds no more than that in memory."""

    def __init__(self, limit: int) -> None:
        self.left = limit
        self.parts_left = 4 * limit
        self.full = False

    def __call__(self, pairs: list) -> Any:
        value = dict(pairs)
        kind = value.get("type")
        if kind is None:  # an entry's part (its "lfs"), or an answer of another shape
            self.parts_left -= 1
            if self.parts_left < 0:
                self.full = True
                return None
            return value
        if kind != "file":
            return None
        if self.left <= 0:
            self.full = True
            return None
        self.left -= 1
        return value


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
