"""Download a file of a repository (:func:`download`): the file already there, or resume
or start over, the free space, the bytes as they arrive, then the sha256 and the GGUF
header before it gets its name."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
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
from ..http import open_following
from .client import HubClient, HubError, HubFile, _describe
from .lock import _download_lock
from .progress import DownloadProgress, _mb, _Meter
from .records import (
    _discard,
    _done_record,
    _own_sha256,
    _partial,
    _read_record,
    _record,
    _records_dir,
    _write_done,
    _write_record,
    download_target,
)

log = logging.getLogger("iris.runtime.hub")

#: a lost connection is resumed at once this many times before the download fails
RESUME_TRIES = 3
#: the pause before the first resume (doubling, at most 4× this)
RESUME_PAUSE_S = 1.0
#: free space left over after a download, on top of the file
FREE_SPACE_MARGIN = 64 * 2**20
CHUNK = 1 << 20


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
    record = read_json_object(_done_record(target))
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
