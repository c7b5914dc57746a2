"""Old CPUs (issue 27): the installers' llama.cpp carries one CPU backend per x86-64 level and
the frozen app finds them. Fast checks that never run a build (no PyInstaller, no compiler);
the build itself checks the bundle (check_cpu_backends) and, with --emulate-cpu Nehalem, runs
the frozen app on an emulated CPU without AVX (docs/installers.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from support.helpers import cmake_flags

ROOT = Path(__file__).resolve().parent.parent
PACKAGING = ROOT / "packaging"


# build_py and rules: the fixtures in tests/conftest.py


# -- the compile flags --------------------------------------------------------------------------


@pytest.mark.parametrize("platform", ["linux", "win32"])
def test_linux_and_windows_build_every_cpu_variant(build_py, platform):
    flags = cmake_flags(build_py.default_cmake_args(platform))
    assert flags["GGML_NATIVE"].lower() == "off"  # never -march=native
    assert flags["GGML_BACKEND_DL"] == "ON"  # GGML_CPU_ALL_VARIANTS requires it
    assert flags["GGML_CPU_ALL_VARIANTS"] == "ON"
    # ggml installs backend modules into CMAKE_INSTALL_BINDIR: the wheel's llama_cpp/lib, not bin/
    assert flags["CMAKE_INSTALL_BINDIR"] == "llama_cpp/lib"
    assert build_py.wants_cpu_variants(build_py.default_cmake_args(platform))


def test_macos_keeps_its_single_build_with_metal(build_py):
    args = build_py.default_cmake_args("darwin")
    assert cmake_flags(args) == {"GGML_NATIVE": "off"}  # Metal is llama-cpp-python's own default on macOS
    assert not build_py.wants_cpu_variants(args)


def test_linux_platform_names_and_this_machines_default(build_py):
    assert build_py.default_cmake_args("linux2") == build_py.default_cmake_args("linux")
    chosen = build_py.parse_args([]).cmake_args
    assert chosen in (build_py.DEFAULT_CMAKE_ARGS, build_py.os.environ.get("IRIS_CMAKE_ARGS"))
    assert build_py.DEFAULT_CMAKE_ARGS == build_py.build_cmake_args(build_py.sys.platform)


def test_variants_need_bothcmake_flags(build_py):
    assert not build_py.wants_cpu_variants("-DGGML_NATIVE=off")
    assert not build_py.wants_cpu_variants("-DGGML_CPU_ALL_VARIANTS=ON")  # cmake refuses it without DL
    assert not build_py.wants_cpu_variants("-DGGML_BACKEND_DL=ON")
    assert build_py.wants_cpu_variants("-DGGML_BACKEND_DL=on -DGGML_CPU_ALL_VARIANTS=1")


def test_the_wheel_cache_key_holds_the_cmake_args():
    """A wheel compiled with other CMAKE_ARGS (the AVX2-only one) is never reused."""
    source = (PACKAGING / "build.py").read_text()
    assert "key_extra=[opts.cmake_args, *target_key]" in source


# -- the bundle: which files, where ----------------------------------------------------------------


def test_cpu_variant_names(rules):
    assert rules.cpu_variant("libggml-cpu-haswell.so") == "haswell"
    assert rules.cpu_variant("llama_cpp/lib/libggml-cpu-sse42.so") == "sse42"
    assert rules.cpu_variant("llama_cpp\\lib\\ggml-cpu-x64.dll") == "x64"
    assert rules.cpu_variant("libggml-cpu-armv8.2_1.so") == "armv8.2_1"
    # what ggml never loads: the linked backend, a versioned name, other libraries
    for name in ("libggml-cpu.so", "libggml-cpu.so.0", "libggml-cpu-haswell.so.0", "libggml.so",
                 "libggml-base.so.0", "ggml-cpu.dll", "libggml-cpu-haswell.dylib"):
        assert rules.cpu_variant(name) is None, name


def test_missing_cpu_variants(rules, tmp_path):
    installed = [tmp_path / n for n in ("libggml-cpu-x64.so", "libggml-cpu-sse42.so", "libggml-cpu-haswell.so",
                                        "libggml-base.so.0", "libllama.so")]
    toc = [("llama_cpp/lib/libggml-cpu-x64.so", "/x", "BINARY"),
           ("llama_cpp/lib/libggml-cpu-haswell.so", "/x", "BINARY"),
           ("libggml-cpu-sse42.so", "/x", "BINARY")]  # at the top: ggml is never asked to look there
    assert rules.missing_cpu_variants(toc, installed) == ["libggml-cpu-sse42.so"]
    toc.append(("llama_cpp\\lib\\libggml-cpu-sse42.so", "/x", "BINARY"))  # Windows separators
    assert rules.missing_cpu_variants(toc, installed) == []
    assert rules.cpu_variants(toc)["haswell"] == "llama_cpp/lib/libggml-cpu-haswell.so"


def test_pruning_keeps_the_cpu_variants(rules):
    for dest in ("llama_cpp/lib/libggml-cpu-x64.so", "llama_cpp/lib/libggml-cpu-sse42.so",
                 "llama_cpp/lib/ggml-cpu-haswell.dll", "llama_cpp/lib/libggml-cpu-sapphirerapids.so"):
        assert rules.keep_entry(dest, linux=True) and rules.keep_entry(dest), dest
        assert rules.size_part(dest) == "llama_cpp"


def _lib_with(tmp_path: Path, *names: str) -> Path:
    lib = tmp_path / "llama_cpp" / "lib"
    lib.mkdir(parents=True)
    for name in names:
        (lib / name).write_bytes(b"\x7fELF" + name.encode())
    return lib


def test_check_cpu_backends_accepts_a_full_set(build_py, tmp_path):
    lib = _lib_with(tmp_path, "libggml-cpu-x64.so", "libggml-cpu-sse42.so", "libggml-cpu-haswell.so",
                    "libggml-base.so.0", "libllama.so")
    found = build_py.check_cpu_backends(build_py.default_cmake_args("linux"), lib)
    assert set(found["variants"]) == {"x64", "sse42", "haswell"}
    assert found["variants"]["sse42"] == (lib / "libggml-cpu-sse42.so").stat().st_size


def test_check_cpu_backends_refuses_a_set_without_the_old_cpus(build_py, tmp_path, monkeypatch):
    monkeypatch.setattr(build_py, "machine_arch", lambda: "x86_64")  # the x86-64 baseline variants
    lib = _lib_with(tmp_path, "libggml-cpu-haswell.so", "libggml-cpu-skylakex.so")
    with pytest.raises(build_py.BuildError, match="needed at least sse42, x64"):
        build_py.check_cpu_backends(build_py.default_cmake_args("linux"), lib)


def test_check_cpu_backends_refuses_none_and_a_stale_wheel(build_py, tmp_path):
    empty = _lib_with(tmp_path / "a", "libggml-cpu.so", "libllama.so")
    with pytest.raises(build_py.BuildError, match="lacks CPU backend variants"):
        build_py.check_cpu_backends(build_py.default_cmake_args("linux"), empty)
    assert build_py.check_cpu_backends("-DGGML_NATIVE=off", empty) == {"variants": {},
                                                                       "cmake_args": "-DGGML_NATIVE=off"}
    stale = _lib_with(tmp_path / "b", "libggml-cpu-x64.so")
    with pytest.raises(build_py.BuildError, match="stale wheel"):
        build_py.check_cpu_backends("-DGGML_NATIVE=off", stale)


# -- discovery: the hook, the spec, the run-time loader ------------------------------------------


def test_hook_collects_the_variants_into_llama_cpp_lib():
    source = (PACKAGING / "hooks" / "hook-llama_cpp.py").read_text()
    tree = ast.parse(source)
    augmented = [node for node in tree.body if isinstance(node, ast.AugAssign)
                 and isinstance(node.target, ast.Name) and node.target.id == "binaries"]
    assert augmented, "the variants are added to binaries"
    added = ast.unparse(augmented[0].value)
    assert "bundle_rules.cpu_variant" in source and "bundle_rules.LLAMA_LIB_DIR" in added
    assert "missing_cpu_variants" in source and "raise SystemExit" in source


def test_spec_refuses_a_bundle_without_the_installed_variants():
    text = (PACKAGING / "iris-desktop.spec").read_text()
    compile(text, "iris-desktop.spec", "exec")
    check = text.index("bundle_rules.missing_cpu_variants(a.binaries")
    assert text.index("a.binaries = _strip_symbols(a.binaries)") < check < text.index("COLLECT(")


def test_the_loader_looks_where_the_bundle_puts_them(rules):
    """llama_cpp's libraries are at llama_cpp/lib in the bundle (the package's own layout), and
    iris_desktop/runtime/backends.py asks ggml to choose from the folder llama_cpp loaded
    libllama from; both model loaders ask for it before llama.cpp loads anything."""
    assert rules.LLAMA_LIB_DIR == "llama_cpp/lib"
    backends = (ROOT / "iris_desktop" / "runtime" / "backends.py").read_text()
    assert "ggml_backend_load_all_from_path" in backends and "low._base_path" in backends
    for loader in ("llama_binding.py", "embedder.py"):  # the local model loads through llama_binding
        source = (ROOT / "iris_desktop" / "runtime" / loader).read_text()
        assert source.index("load_backends()") < source.index("model_path=str("), loader


def test_self_test_reports_the_cpu_backend(build_py):
    line = ("INFO iris.runtime.backends: llama.cpp CPU backend: libggml-cpu-sse42.so (variant sse42; SSE3 SSSE3 "
            "LLAMAFILE OPENMP REPACK), from /opt/iris-desktop/_internal/llama_cpp/lib")
    assert build_py.cpu_backend_of("noise\n" + line + "\nmore") == (
        "libggml-cpu-sse42.so (variant sse42; SSE3 SSSE3 LLAMAFILE OPENMP REPACK)")
    assert build_py.cpu_backend_of("iris-desktop self-test ok: ...") is None
    opts = build_py.parse_args(["--emulate-cpu", "Nehalem"])
    assert opts.emulate_cpu == "Nehalem" and build_py.parse_args([]).emulate_cpu is None


def test_emulated_run_keeps_the_restarting_bootloader_inside_qemu(build_py, tmp_path):
    """PyInstaller's Linux bootloader sets LD_LIBRARY_PATH and restarts itself with execve, which
    qemu-user does not follow (the restarted app ran natively: a zen4 CPU backend "under
    Nehalem"). --emulate-cpu hands qemu that environment, so there is no restart to escape by."""
    exe = tmp_path / "iris-desktop"
    options = build_py.bootloader_restarted_env(exe)
    assert options[::2] == ["-E"] * 4
    given = dict(option.split("=", 1) for option in options[1::2])
    assert given == {"_PYI_ARCHIVE_FILE": str(exe), "_PYI_PARENT_PROCESS_LEVEL": "-1",
                     "_PYI_LINUX_PROCESS_NAME": "iris-desktop", "LD_LIBRARY_PATH": str(build_py.internal_dir())}
    assert "nehalem" in build_py.CPUS_WITHOUT_AVX  # an AVX backend reported there fails the build
