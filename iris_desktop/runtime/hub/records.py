"""Where a download goes (``<models>/downloads/<org>/<repo>/<file>``), its partial file
and that file's record, and what was verified of a downloaded file
(``<models>/downloads/.records/…``): the one place that reads and writes them."""

from __future__ import annotations

import json
import os
from pathlib import Path, PurePosixPath
from typing import Any

from iris_desktop.files import atomic_write, read_json_object
from iris_desktop.paths import make_private_dir

from .client import HubFile, _check_file, _check_repo, _normal_sha

#: the folder of ``<models>/downloads`` where what was verified is recorded
RECORDS = ".records"


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
    return read_json_object(_record(target))


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
    record = read_json_object(_done_record(target))
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
