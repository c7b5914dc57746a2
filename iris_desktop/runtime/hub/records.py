"""Where a download goes (``<models>/downloads/<org>/<repo>/<path in the repo>``: two
files of one name in two folders of a repository are two files here too), its partial
file and that file's record, and what was verified of a downloaded file
(``<models>/downloads/.records/<org>/<repo>/<path>.json``): the one place that reads and
writes them. Every part of the path is checked to be a plain name that any file system
keeps as it is (no ``..``, no hidden or reserved names, no characters that Windows
refuses or that draw text in another order)."""

from __future__ import annotations

import json
import os
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from iris_desktop.files import atomic_write, move_file, read_json_object
from iris_desktop.paths import make_private_dir

from .client import HubError, HubFile, _check_file, _check_repo, _normal_sha

#: the folder of ``<models>/downloads`` where what was verified is recorded
RECORDS = ".records"
#: folders of a repository kept at most (``a/b/c/model.gguf``)
MAX_FOLDERS = 8
#: what no part of a kept path may hold: Windows' reserved characters
_RESERVED_CHARS = re.compile(r'[<>:"|?*\\]')
_RESERVED_NAMES = re.compile(r"^(con|prn|aux|nul|com\d|lpt\d)(\..*)?$", re.IGNORECASE)


def _unsafe_part(part: str) -> str | None:
    """Why ``part`` (a folder or file name of a repository) cannot be a name here; None
    when it can."""
    if part in ("", ".", ".."):
        return "an empty, . or .. part"
    if part.startswith("."):
        return "a hidden name (starting with .)"
    if part.endswith((".", " ")):
        return "a name ending with a dot or a space"
    if _RESERVED_CHARS.search(part) or _RESERVED_NAMES.match(part):
        return "a character or name that Windows reserves"
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn") for c in part):
        return "an invisible or direction-changing character"
    if len(part.encode("utf-8", "surrogatepass")) > 200:
        return "a name longer than 200 bytes"
    return None


def _parts(file: str) -> tuple[str, ...]:
    """``file``'s folders and name, each one checked; HubError (``address``) otherwise."""
    parts = PurePosixPath(_check_file(file)).parts
    if len(parts) > MAX_FOLDERS + 1:
        raise HubError(f"{file!r} is in more than {MAX_FOLDERS} folders of its repository, which "
                       "Iris does not keep.", "address")
    for part in parts:
        why = _unsafe_part(part)
        if why is not None:
            raise HubError(f"{file!r} cannot be kept as a file here: it has {why}; Iris did not "
                           "download it.", "address")
    return parts


def name_problem(file: str) -> str | None:
    """Why ``file`` (a path in a repository) cannot be kept as a file here, in a sentence;
    None when it can. The rule of :func:`download_target`, for lists of the hub's files
    (the dialog's table and ``models files`` leave such a name out)."""
    try:
        _parts(file)
    except HubError as exc:
        return str(exc)
    return None


def download_target(models_dir: str | os.PathLike[str], repo: str, file: str) -> Path:
    """Where ``file`` of ``repo`` is kept: ``<models>/downloads/<org>/<repo>/<path>``, its
    folders in the repository kept (a file at the top: ``<org>/<repo>/<name>``, as
    always). HubError (``address``) for a name that cannot be a path here."""
    return _place(models_dir, repo, file).target


@dataclass(frozen=True)
class _Place:
    """Where a file of a repository goes, and where its records go (``records``: the
    path of its record without the suffix, under ``.records/<org>/<repo>/``)."""

    target: Path
    records: Path


def _place(models_dir: str | os.PathLike[str], repo: str, file: str) -> _Place:
    owner, name = _check_repo(repo).split("/")
    parts = _parts(file)
    downloads = Path(models_dir) / "downloads"
    place = _Place(downloads.joinpath(owner, name, *parts), downloads.joinpath(RECORDS, owner, name, *parts))
    if len(parts) > 1:
        _adopt_flat(place, _Place(downloads.joinpath(owner, name, parts[-1]),
                                  downloads.joinpath(RECORDS, owner, name, parts[-1])),
                    repo.strip(), file.strip())
    return place


def _adopt_flat(place: _Place, flat: _Place, repo: str, file: str) -> None:
    """A file in a folder of its repository that an earlier Iris kept by its name alone
    (``<org>/<repo>/<name>``), downloaded or half-downloaded, moves to where it is kept
    now, with its record, when that record names this very file and nothing is there yet
    (otherwise it was downloaded again, many GB, and the old copy stayed beside it)."""
    if place.target.exists() or _partial(place.target).exists():
        return
    moves: list[tuple[Path, Path]] = []
    done = read_json_object(_done_record(flat))
    if flat.target.is_file() and (done.get("repo"), done.get("file")) == (repo, file):
        moves = [(flat.target, place.target), (_done_record(flat), _done_record(place))]
    partial = read_json_object(_record(flat.target))
    if not moves and _partial(flat.target).is_file() \
            and (partial.get("repo"), partial.get("file")) == (repo, file):
        moves = [(_partial(flat.target), _partial(place.target)),
                 (_record(flat.target), _record(place.target))]
    try:
        for source, destination in moves:
            make_private_dir(destination.parent)
            move_file(source, destination)  # (a rename keeps the time the record checks)
    except OSError:  # another process moved it first, or a folder cannot be made: as before
        pass


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


def _records_dir(place: _Place) -> Path:
    """The folder of ``place``'s records (``<models>/downloads/.records/<org>/<repo>``,
    and the file's folders in the repository)."""
    return place.records.parent


def _done_record(place: _Place) -> Path:
    """What was verified of the downloaded file."""
    return place.records.with_name(place.records.name + ".json")


def _lock_file(place: _Place) -> Path:
    return place.records.with_name(place.records.name + ".lock")


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


def _write_done(place: _Place, info: HubFile, sha: str) -> None:
    st = place.target.stat()
    make_private_dir(_records_dir(place))
    atomic_write(_done_record(place), json.dumps({
        "repo": info.repo, "file": info.path, "revision": info.revision, "size": st.st_size,
        "mtime_ns": st.st_mtime_ns, "sha256": sha, "listed_sha256": info.sha256,
        "verified_by_hub": info.sha256 is not None and info.sha256 == sha}))


def download_record(models_dir: str | os.PathLike[str], repo: str, file: str,
                    revision: str | None = None) -> dict[str, Any] | None:
    """What was verified of the downloaded ``file`` of ``repo`` (at ``revision``, when
    given), when it is there and unchanged since: ``{"path", "repo", "file", "revision",
    "sha256", "listed_sha256", "verified_by_hub"}`` (``verified_by_hub`` False: the hub
    listed no sha256, so only the GGUF header was checked; say "not verified by the hub"
    rather than "verified"). None when the file is absent, has no record, changed since,
    or its record is of another repository, path or revision (a file of an older Iris
    kept there under the same name)."""
    place = _place(models_dir, repo, file)
    target = place.target
    record = read_json_object(_done_record(place))
    sha = _own_sha256(target, record)
    if sha is None or record.get("repo") != repo.strip() or record.get("file") != file.strip():
        return None
    if revision is not None and record.get("revision") != revision:
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
