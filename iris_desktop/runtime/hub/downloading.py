"""Download a file of a repository (:func:`download`): the file already there, or resume
or start over, the free space, the bytes as they arrive, then the sha256 and the GGUF
header before it gets its name.

Stop (``cancel``) is heard at once, even while the file host sends nothing: a helper
shuts the exchange's socket from this side (as ``runtime.http`` does at a deadline), which
wakes the blocked read, and the pause before a resume waits on ``cancel`` too. A file
host that sends nothing for :data:`STALL_S` is named in a sentence (not retried: the next
download resumes). The hub's redirects are followed here, at most :data:`MAX_REDIRECTS`,
to http(s) addresses only, and never from an https:// hub to a plain http:// address.
A file host whose size for the file is not the one the hub lists is named before a byte
is written (a partial file from before is kept as it is). A web page (``text/html``: a
network's login page) or bytes that do not start with ``GGUF`` never become the start
of a partial file, and a partial file that does not start with ``GGUF`` is not resumed."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from iris_desktop.files import clean_leftovers, commit_partial, read_json_object
from iris_desktop.paths import make_private_dir

from ..gguf import GGUFError, read_gguf_info
from ..http import _Watch, tls_trouble
from ..remote.address import server_address
from .client import CONNECT_TIMEOUT_S, HubClient, HubError, HubFile, _describe, _origin, _shown, _url_of
from .lock import _download_lock
from .progress import DownloadProgress, _mb, _Meter
from .records import (
    _discard,
    _done_record,
    _own_sha256,
    _partial,
    _Place,
    _place,
    _read_record,
    _record,
    _records_dir,
    _write_done,
    _write_record,
)

log = logging.getLogger("iris.runtime.hub")

#: a lost connection is resumed at once this many times before the download fails
RESUME_TRIES = 3
#: the pause before the first resume (doubling, at most 4× this)
RESUME_PAUSE_S = 1.0
#: free space left over after a download, on top of the file
FREE_SPACE_MARGIN = 64 * 2**20
CHUNK = 1 << 20
#: the file host may send nothing for this long; then the download stops, said in a
#: sentence (a stall is not retried; the next download resumes)
STALL_S = 30.0
#: how soon Stop reaches a read blocked on a silent file host (seconds)
STOP_POLL_S = 0.05
#: redirects followed from the hub to the file host at most
MAX_REDIRECTS = 10
#: what every GGUF file starts with
GGUF_MAGIC = b"GGUF"
#: the whole file's size in a Content-Range: ``bytes 0-9/10`` or ``bytes */10``
_RANGE_TOTAL = re.compile(r"^\s*bytes\s+(?:\*|\d+-\d+)\s*/\s*(\d+)\s*$", re.IGNORECASE)


def _disk_error(exc: OSError, folder: Path, name: str, done: int, total: int, partial: Path) -> HubError:
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return HubError(f"The disk is full: {folder} had no room for the rest of {name} "
                        f"({_mb(done)} of {_mb(total)} written); free some space and download "
                        "again to resume, or remove the partial file.", "disk_full", partial)
    return HubError(f"Cannot write {partial} ({exc.strerror or exc}); check the models folder.",
                    "disk_full" if exc.errno == errno.EROFS else "write", partial)


def _vanished(name: str) -> HubError:
    """The partial file was removed while its download ran (not a folder that cannot be
    written): another window or command, or a person, removed it."""
    return HubError(f"The partial file of {name} was removed while it was downloading (by another "
                    "window or command, or by hand), so what arrived is lost; download again to "
                    "start over.", "write")


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
    ``cancel`` stops at once, a silent file host or not (the partial is kept);
    ``progress`` is called with :class:`DownloadProgress`. Raises :class:`HubError`.
    """
    place = _place(models_dir, repo, file)  # a name that cannot be a path here: nothing is sent
    info = client.file(repo, file, revision)
    if info.problem is not None:
        raise HubError(f"The model hub {client.address} lists {info.path} of {info.repo} with "
                       f"{info.problem}, which cannot be right; Iris did not download it.", "answer")
    try:
        return _start(client, info, place, revision, cancel, progress, restart, margin, wait)
    except HubError:
        raise
    except OSError as exc:  # the models folder: not writable, gone, read-only...
        partial = _partial(place.target)
        if isinstance(exc, FileNotFoundError) and place.target.parent.is_dir() and not partial.exists():
            raise _vanished(info.name) from None
        raise HubError(f"Cannot write the download in {place.target.parent} ({exc.strerror or exc}); check "
                       "that the models folder is writable.", "write", partial if partial.exists() else None) from None


def _start(client: HubClient, info: HubFile, place: _Place, revision: str, cancel: threading.Event | None,
           progress: Callable[[DownloadProgress], Any] | None, restart: bool, margin: int,
           wait: bool) -> Path:
    """With the file's lock held: the file already there, or resume or start over,
    check the free space, then download (:func:`download`)."""
    target = place.target
    make_private_dir(target.parent)
    make_private_dir(_records_dir(place))
    meter = _Meter(info.name, info.size, 0, progress, info.sha256 is not None)
    with _download_lock(place, info.name, cancel, meter, wait):
        if _present(info, place, cancel, meter):
            return target
        for folder in (target.parent, _records_dir(place)):
            clean_leftovers(folder)  # what a killed write of a record left
        _record(target).with_name(_record(target).name + ".tmp").unlink(missing_ok=True)  # older Iris
        return _resume_or_start(client, info, place, revision, cancel, progress, restart, margin)


def _present(info: HubFile, place: _Place, cancel: threading.Event | None, meter: _Meter) -> bool:
    """Whether the file is there as the hub lists it: its own sha256 (as recorded when it
    got its name, or hashed now when it has no record or changed since) equals the
    listed one; with none listed, it must have been recorded for this very repository
    path and revision. A file that passes without a record gets one."""
    target = place.target
    try:
        st = target.stat()
    except OSError:
        return False
    if not target.is_file() or st.st_size != info.size:
        return False
    record = read_json_object(_done_record(place))
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
        _write_done(place, info, own)
    return True


def _starts_as_gguf(partial: Path, have: int) -> bool:
    """Whether the partial file's first bytes are a GGUF's (a web page is not resumed)."""
    try:
        with open(partial, "rb") as handle:
            head = handle.read(len(GGUF_MAGIC))
    except OSError:
        return False
    return head == GGUF_MAGIC[:min(have, len(GGUF_MAGIC))]


def _resume_or_start(client: HubClient, info: HubFile, place: _Place, revision: str,
                     cancel: threading.Event | None, progress: Callable[[DownloadProgress], Any] | None,
                     restart: bool, margin: int) -> Path:
    target = place.target
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
    if have > info.size or (have and not _starts_as_gguf(partial, have)):
        log.info("%s: not the start of a GGUF file (or too long); starting over", partial)
        _discard(target)
        have = 0
    free = shutil.disk_usage(target.parent).free
    if free < info.size - have + margin:
        raise HubError(f"Not enough free space for {info.name}: it needs {_mb(info.size - have)} "
                       f"more (and {_mb(margin)} to spare) but {target.parent} has {_mb(free)} free.",
                       "no_space", partial if have else None)
    _write_record(target, wanted)
    try:
        return _download(client, info, place, wanted, have, cancel, progress)
    except HubError as exc:
        if exc.start_over and partial.exists():  # the next download starts over
            _write_record(target, {**wanted, "mismatch": True})
        if not partial.exists():  # nothing arrived: no record of it either
            _record(target).unlink(missing_ok=True)
        raise


def _pause(cancel: threading.Event | None, seconds: float) -> None:
    """Wait before a resume; raises _Stopped as soon as Stop comes."""
    if cancel is None:
        time.sleep(seconds)
    elif cancel.wait(seconds):
        raise _Stopped


def _download(client: HubClient, info: HubFile, place: _Place, wanted: dict[str, Any], have: int,
              cancel: threading.Event | None, progress: Callable[[DownloadProgress], Any] | None) -> Path:
    partial = _partial(place.target)
    meter = _Meter(info.name, info.size, have, progress, info.sha256 is not None)
    state = _State(have, hashlib.sha256())
    try:
        if have:
            state.digest = _hash_file(partial, have, cancel, meter)
        tries = 0
        while state.have < info.size:
            try:
                _fetch(client, info, partial, state, cancel, meter, place.target.parent)
            except _Lost as exc:
                tries += 1
                if tries > RESUME_TRIES:
                    raise HubError(f"The download of {info.name} kept breaking off ({exc}) at "
                                   f"{_mb(state.have)} of {_mb(info.size)}; download again to "
                                   "resume.", "network", partial if partial.exists() else None) from None
                log.info("%s: connection lost at %d bytes (%s); resuming", info.name, state.have, exc)
                _pause(cancel, RESUME_PAUSE_S * min(2 ** (tries - 1), 4))
    except _Stopped:
        done = partial.stat().st_size if partial.is_file() else 0
        raise HubError(f"Stopped at {_mb(done)} of {_mb(info.size)}; download again to resume, "
                       "or remove the partial file.", "stopped", partial if partial.exists() else None) from None
    meter(info.size, "verifying", force=True)
    return _finish(info, partial, place, state.digest.hexdigest(), wanted)


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


@contextlib.contextmanager
def _watched(cancel: threading.Event | None, watch: _Watch, meter: _Meter) -> Any:
    """While inside, a helper thread shuts the exchange's socket from this side on Stop
    (``cancel`` set), which wakes a read blocked on a file host that sends nothing, and
    sends the progress the meter held back (the count reached before a stall)."""
    over = threading.Event()

    def keep_watch() -> None:
        while not over.is_set():
            if cancel is not None and cancel.wait(STOP_POLL_S):
                watch.expire()
                return
            if cancel is None:
                over.wait(STOP_POLL_S)
            meter.flush()

    threading.Thread(target=keep_watch, name="iris-hub-watch", daemon=True).start()
    try:
        yield
    finally:
        over.set()


def _fetch(client: HubClient, info: HubFile, partial: Path, state: _State,
           cancel: threading.Event | None, meter: _Meter, folder: Path) -> None:
    """One request for the rest of the file, appended to ``partial``; raises _Lost when
    the connection breaks (``state`` then says what arrived), _Stopped on Stop."""
    headers = {"Accept-Encoding": "identity"}
    if state.have:
        headers["Range"] = f"bytes={state.have}-"
    url = client.resolve_url(info.repo, info.path, info.revision)
    watch = _Watch()
    try:
        with _watched(cancel, watch, meter):
            request = client.client.build_request("GET", url, headers=headers)
            request.extensions = {**request.extensions, "trace": watch.trace, "timeout": {
                "connect": CONNECT_TIMEOUT_S, "read": STALL_S, "write": STALL_S, "pool": STALL_S}}
            with contextlib.closing(_open(client, request, watch, info, partial, state)) as response:
                _receive(client, response, info, partial, state, cancel, meter, folder)
    except httpx.HTTPError as exc:
        if cancel is not None and cancel.is_set():
            raise _Stopped from None
        kept = partial if partial.exists() else None
        if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)) and state.have == 0:
            raise _unreached(client, info, exc) from None
        if isinstance(exc, httpx.TimeoutException):
            where = f" at {_mb(state.have)} of {_mb(info.size)}" if state.have else ""
            raise HubError(f"The file host for {info.name} sent nothing for {STALL_S:g} s{where}; "
                           "check the network, then download again"
                           + (" to resume." if kept else "."), "network", kept) from None
        raise _Lost(_describe(exc)) from None
    if cancel is not None and cancel.is_set():
        raise _Stopped
    if state.have < info.size:
        raise _Lost("the file host closed the connection early")


def _unreached(client: HubClient, info: HubFile, exc: httpx.HTTPError) -> HubError:
    """No connection could be made: to the hub (the file's address on it) said as the hub's
    listing says it; to the file host naming it and why (before: "The file host for x.gguf
    cannot be reached (cannot connect)" for a certificate this computer does not trust as
    for anything else, and no host: a firewall or proxy often lets the hub through but not
    the host it sends downloads to)."""
    url = _url_of(exc)
    if url is None or _origin(url) == _origin(httpx.URL(client.root)):
        return client.unreached(exc)
    host = server_address(str(url))
    trouble = tls_trouble(exc)
    if trouble is not None:
        said = trouble[1]
        return HubError(f"The file host {host} that the model hub {client.address} sends {info.name} "
                        f"from {said}, so Iris did not connect; check the network (a proxy or firewall "
                        "that inspects https?), then download again.", "network")
    return HubError(f"The file host {host} that the model hub {client.address} sends {info.name} from "
                    f"cannot be reached ({_describe(exc)}); check the network, and that a firewall or "
                    f"proxy lets {host} through as it does the hub.", "network")


def _open(client: HubClient, request: httpx.Request, watch: _Watch, info: HubFile, partial: Path,
          state: _State) -> httpx.Response:
    """The file host's response, its headers read and its body not, after the hub's
    redirects (their bodies unread, which httpx would read whole): at most
    :data:`MAX_REDIRECTS`, to http(s) addresses only; HubError otherwise (not retried)."""
    kept = partial if state.have and partial.exists() else None
    where = ""
    for _ in range(MAX_REDIRECTS + 1):
        try:
            response = client.client.send(request, stream=True, follow_redirects=False)
            watch.attach(response.extensions.get("network_stream"))
            following = response.next_request
        except (httpx.InvalidURL, httpx.RemoteProtocolError, UnicodeError) as exc:  # (an IDNA name
            # that cannot be one escaped as "a bug")
            if isinstance(exc, httpx.RemoteProtocolError) and "location" not in str(exc).lower():
                raise
            raise HubError(f"The file host for {info.name} redirected to an address that is not one; "
                           "Iris did not follow it: try again later, or check models.hub_url.",
                           "http", kept) from None
        if following is None:
            return response
        where = _shown(response.headers.get("location", ""))
        response.close()
        if following.url.scheme not in ("http", "https"):
            raise HubError(f"The file host for {info.name} redirected to {where}, which is not an "
                           "http:// or https:// address; Iris did not follow it (check models.hub_url).",
                           "http", kept)
        if following.url.scheme == "http" and httpx.URL(client.root).scheme == "https":
            raise HubError(f"The model hub {client.address} redirected the download of {info.name} from "
                           f"https:// to plain http:// ({server_address(str(following.url))}), where it "
                           "could be read or changed on the way; Iris did not follow it (check "
                           "models.hub_url, or the network's proxy).", "http", kept)
        request = following
    raise HubError(f"The file host for {info.name} kept redirecting (more than {MAX_REDIRECTS} times, "
                   f"last to {where}); Iris stopped following it: try again later, or check "
                   "models.hub_url.", "http", kept)


def _whole_size(response: httpx.Response) -> int | None:
    """The whole file's size as the file host says it: a Content-Range's (a 206, a 416),
    else a 200's Content-Length (not when the body is encoded); None when it does not say."""
    match = _RANGE_TOTAL.match(response.headers.get("content-range", ""))
    if match:
        return int(match.group(1))
    length = response.headers.get("content-length", "").strip()
    if response.status_code == 200 and length.isdigit() \
            and response.headers.get("content-encoding", "identity").strip().lower() == "identity":
        return int(length)
    return None


def _size_differs(client: HubClient, info: HubFile, size: int, partial: Path, state: _State) -> HubError:
    """The file host's file is not as long as the hub lists it: said before a byte of it is
    written (before: it was all downloaded, found short, its resume refused, the partial
    file emptied and the whole file downloaded again, each run, ending with nothing)."""
    kept = partial if state.have and partial.exists() else None
    return HubError(f"The file host serves {size:,} bytes for {info.name} where the model hub "
                    f"{client.address} lists {info.size:,}, so one of them is wrong; Iris did not "
                    "download it: try again later, or choose another file.", "answer", kept)


def _not_gguf(info: HubFile, partial: Path, state: _State, web_page: bool) -> HubError:
    """The network (a login page) or the file host sent something that is no GGUF file:
    nothing of it is written; a partial file from before stays as it was."""
    kept = partial if state.have and partial.exists() else None
    then = "download again to resume" if kept else "download again"
    if web_page:
        return HubError(f"The network answered with a web page (a login page?) instead of {info.name}; "
                        f"nothing of it was kept: sign in to the network, or check the proxy, then "
                        f"{then}.", "network", kept)
    return HubError(f"The file host sent something that is not a GGUF file for {info.name} (it does not "
                    f"start with GGUF: a network's login page?); nothing of it was kept: sign in to the "
                    f"network if it asks, then {then}.", "network" if kept else "not_gguf", kept)


def _receive(client: HubClient, response: httpx.Response, info: HubFile, partial: Path, state: _State,
             cancel: threading.Event | None, meter: _Meter, folder: Path) -> None:
    """The response's bytes, as they arrive, appended to ``partial`` (the first ones only
    once they read ``GGUF``)."""
    size = _whole_size(response)
    if response.status_code == 416 and state.have:
        if size is not None and size != info.size:  # (the bytes held may be all it has)
            raise _size_differs(client, info, size, partial, state)
        state.restart(partial, "a refused range")
        raise _Lost("the file host refused to resume")
    if response.status_code >= 400:  # its body is not read: the status says it
        raise client._status_error(response, f"{info.path} of {info.repo}",
                                   partial if state.have else None)
    media = response.headers.get("content-type", "").split(";")[0].strip().lower()
    if media in ("text/html", "application/xhtml+xml"):
        raise _not_gguf(info, partial, state, web_page=True)
    # another size than the hub's: said before a byte is written (after the first bytes
    # read GGUF, when they must: a login page is said as one)
    differs = size is not None and size != info.size and response.status_code in (200, 206)
    fresh = bool(state.have) and response.status_code == 200  # a host that ignored Range
    head, checking = b"", state.have == 0 or fresh
    if differs and not checking:
        raise _size_differs(client, info, size, partial, state)
    if state.have and not fresh and not response.headers.get("content-range", "").startswith(
            f"bytes {state.have}-"):
        state.restart(partial, "an unexpected Content-Range")
        raise _Lost("the file host resumed at another place")
    fd = None
    try:
        for block in response.iter_raw():  # as it arrives: a cut loses nothing received
            if checking:  # the first bytes must read GGUF before anything is written
                head += block
                if len(head) < len(GGUF_MAGIC):
                    continue
                if not head.startswith(GGUF_MAGIC):
                    raise _not_gguf(info, partial, state, web_page=False)
                if differs:
                    raise _size_differs(client, info, size, partial, state)
                if fresh:
                    state.restart(partial, "a host that ignored Range")
                block, head, checking = head, b"", False
            if state.have + len(block) > info.size:
                raise HubError(f"The file host sent more than the {info.size:,} bytes the hub lists "
                               f"for {info.name}; what arrived cannot be resumed, so download again to "
                               "start over.", "answer", partial if partial.exists() else None,
                               start_over=True)
            if fd is None:
                # (resuming: the partial file must still be there; created again, it would be
                # the end of the file without its start)
                fd = os.open(partial, os.O_WRONLY | os.O_APPEND | (0 if state.have else os.O_CREAT), 0o600)
            _write_all(fd, block, folder, info, state.have, partial)
            state.digest.update(block)
            state.have += len(block)
            meter(state.have)
            if cancel is not None and cancel.is_set():
                raise _Stopped
    finally:
        if fd is not None:
            os.close(fd)


def _write_all(fd: int, block: bytes, folder: Path, info: HubFile, have: int, partial: Path) -> None:
    view = memoryview(block)
    try:
        while view:
            n = os.write(fd, view)
            view = view[n:]
    except OSError as exc:
        raise _disk_error(exc, folder, info.name, have, info.size, partial) from None


def _finish(info: HubFile, partial: Path, place: _Place, sha: str, wanted: dict[str, Any]) -> Path:
    target = place.target
    if not partial.is_file():
        raise _vanished(info.name)
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
    _write_done(place, info, sha)
    _record(target).unlink(missing_ok=True)
    if info.sha256 is None:
        log.warning("downloaded %s of %s (%d bytes) to %s: the hub lists no sha256, so it is not "
                    "verified by the hub (its sha256 is %s; its GGUF header reads)",
                    info.path, info.repo, info.size, target, sha)
    else:
        log.info("downloaded %s of %s (%d bytes, sha256 %s, as the hub lists) to %s",
                 info.path, info.repo, info.size, sha, target)
    return target
