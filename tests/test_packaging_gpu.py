"""The installers' GPU backend (issue #46): llama.cpp compiled with Vulkan on Linux and Windows,
its module shipped, the Vulkan loader never bundled, the .deb recommending libvulkan1 (never
depending on it). Fast checks that compile nothing; ``make gpu-check`` compiles the Vulkan build
and runs it on Mesa's lavapipe (docs/installers.md)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from support.helpers import cmake_flags

ROOT = Path(__file__).resolve().parent.parent
PACKAGING = ROOT / "packaging"

# build_py and rules: the fixtures in tests/conftest.py


@pytest.mark.parametrize("platform", ["linux", "win32"])
def test_linux_and_windows_add_the_vulkan_backend_to_the_cpu_variants(build_py, platform):
    flags = cmake_flags(build_py.build_cmake_args(platform))
    assert flags["GGML_VULKAN"] == "ON"
    assert flags["GGML_BACKEND_DL"] == "ON" and flags["GGML_CPU_ALL_VARIANTS"] == "ON"  # a module beside them
    assert build_py.wants_vulkan(build_py.build_cmake_args(platform))
    # the CPU part alone is what windows-check cross-compiles (mingw-w64 has no Vulkan SDK)
    assert "GGML_VULKAN" not in cmake_flags(build_py.default_cmake_args(platform))


def test_macos_keeps_metal_and_no_vulkan(build_py):
    assert build_py.build_cmake_args("darwin") == build_py.default_cmake_args("darwin")
    assert not build_py.wants_vulkan(build_py.build_cmake_args("darwin"))


def test_this_machines_default_is_the_installerscmake_flags(build_py):
    assert build_py.DEFAULT_CMAKE_ARGS == build_py.build_cmake_args(build_py.sys.platform)
    assert not build_py.wants_vulkan("-DGGML_VULKAN=OFF") and build_py.wants_vulkan("-DGGML_VULKAN=on")


def test_compiling_vulkan_says_what_is_missing_first(build_py, tmp_path, monkeypatch):
    args = build_py.build_cmake_args("linux")
    assert build_py.vulkan_build_tools_missing(build_py.default_cmake_args("linux"), "linux") == []
    monkeypatch.setattr(build_py.shutil, "which", lambda name: None)
    monkeypatch.setattr(build_py, "Path", _NoSystemHeaders)
    monkeypatch.delenv("VULKAN_SDK", raising=False)
    missing = build_py.vulkan_build_tools_missing(args, "linux")
    assert missing[0] == "glslc, the shader compiler"
    assert missing[1].startswith("the Vulkan headers (vulkan/vulkan.h)")
    assert "apt-get install libvulkan-dev glslc spirv-headers" in missing[1]
    assert "without -DGGML_VULKAN=ON" in missing[1]
    sdk = tmp_path / "sdk"
    (sdk / "bin").mkdir(parents=True)
    (sdk / "bin" / "glslc").write_text("")
    (sdk / "include" / "vulkan").mkdir(parents=True)
    (sdk / "include" / "vulkan" / "vulkan.h").write_text("")
    monkeypatch.setenv("VULKAN_SDK", str(sdk))
    assert build_py.vulkan_build_tools_missing(args, "linux") == []


class _NoSystemHeaders(type(Path())):
    """Path, with /usr/include and /usr/local/include empty."""

    def is_file(self):
        return not str(self).startswith(("/usr/include", "/usr/local/include")) and super().is_file()


def test_a_wheel_is_not_compiled_when_a_tool_is_missing(build_py, tmp_path, monkeypatch):
    monkeypatch.setattr(build_py, "ROOT", tmp_path)
    with pytest.raises(build_py.BuildError, match="needs glslc"):
        build_py.cached_wheel(Path("python"), "llama-cpp-python", "llama-cpp-python==0.3.36", env={}, settings=[],
                              describe="CMAKE_ARGS='-DGGML_VULKAN=ON'", key_extra=["x"], rebuild=False, skip=False,
                              missing=["glslc, the shader compiler"])
    assert not (tmp_path / "build" / "wheels").exists() or not any((tmp_path / "build" / "wheels").iterdir())


# -- the bundle ------------------------------------------------------------------------------------


def test_the_vulkan_loader_is_never_bundled(rules):
    for name in ("libvulkan.so.1", "libvulkan.so.1.3.239", "libvulkan.so"):
        assert not rules.keep_entry(name, linux=True), name
    assert not rules.keep_entry("vulkan-1.dll")
    assert not rules.keep_entry("VULKAN-1.DLL")
    # ggml's Vulkan module is shipped where backends.py asks ggml to load from
    assert rules.keep_entry("llama_cpp/lib/libggml-vulkan.so", linux=True)
    assert rules.keep_entry("llama_cpp/lib/ggml-vulkan.dll")
    toc = [("libvulkan.so.1", "/usr/lib/x86_64-linux-gnu/libvulkan.so.1", "BINARY"),
           ("llama_cpp/lib/libggml-vulkan.so", "/venv/llama_cpp/lib/libggml-vulkan.so", "BINARY")]
    assert [e[0] for e in rules.prune(toc, linux=True)] == ["llama_cpp/lib/libggml-vulkan.so"]


def _bundle(root: Path, *files: str) -> Path:
    for rel in files:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\x7fELF" + bytes(60))
    return root


def test_check_gpu_backends(build_py, tmp_path):
    args = build_py.build_cmake_args("linux")
    root = _bundle(tmp_path / "app", "_internal/llama_cpp/lib/libggml-vulkan.so", "_internal/libpython3.11.so.1.0")
    lib = root / "_internal" / "llama_cpp" / "lib"
    found = build_py.check_gpu_backends(args, root, lib, "linux")
    assert found["vulkan"] == "llama_cpp/lib/libggml-vulkan.so"
    # a CPU-only build needs no module
    assert build_py.check_gpu_backends(build_py.default_cmake_args("linux"), root, lib, "linux") == {"vulkan": None}
    (lib / "libggml-vulkan.so").unlink()
    with pytest.raises(build_py.BuildError, match="asks for Vulkan, but"):
        build_py.check_gpu_backends(args, root, lib, "linux")
    _bundle(root, "_internal/llama_cpp/lib/libggml-vulkan.so", "_internal/libvulkan.so.1")
    with pytest.raises(build_py.BuildError, match="carries a Vulkan loader"):
        build_py.check_gpu_backends(args, root, lib, "linux")
    windows = _bundle(tmp_path / "win", "_internal/llama_cpp/lib/ggml-vulkan.dll", "_internal/vulkan-1.dll")
    with pytest.raises(build_py.BuildError, match="vulkan-1.dll"):
        build_py.check_gpu_backends(args, windows, windows / "_internal/llama_cpp/lib", "win32")


def test_the_deb_recommends_libvulkan1_and_never_depends_on_it(build_py, tmp_path):
    app = _bundle(tmp_path / "app", "_internal/llama_cpp/lib/libggml-vulkan.so")
    libs = {"libvulkan.so.1", "libz.so.1"}
    depends, unknown = build_py.deb_depends(app, libs)
    assert "libvulkan1" not in depends and "zlib1g" in depends and unknown == []
    assert build_py.deb_recommends(app, libs) == "libvulkan1"
    # the module alone says so (readelf may be missing), and a CPU-only bundle recommends nothing
    assert build_py.deb_recommends(app, set()) == "libvulkan1"
    assert build_py.deb_recommends(_bundle(tmp_path / "cpu", "_internal/llama_cpp/lib/libllama.so"), set()) == ""


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb not installed (Debian's dpkg)")
def test_the_deb_control_file_has_the_recommends(build_py, tmp_path, monkeypatch):
    app = _bundle(tmp_path / "dist" / "iris-desktop", "_internal/llama_cpp/lib/libggml-vulkan.so")
    (app / "iris-desktop").write_text("#!/bin/sh\n")
    icons = tmp_path / "icons"
    icons.mkdir()
    for size in (16, 32, 48, 64, 128, 256, 512):
        (icons / f"iris-{size}.png").write_bytes(b"png")
    license_file = tmp_path / "LICENSE-model.txt"
    license_file.write_text("license")
    model = {"display_name": "Model", "file": "m.gguf", "license": "Apache-2.0", "license_file": license_file.name,
             "license_path": str(license_file)}
    monkeypatch.setattr(build_py, "ROOT", tmp_path)
    monkeypatch.setattr(build_py, "app_dir", lambda: app)
    monkeypatch.setattr(build_py, "system_libraries", lambda _app: {"libvulkan.so.1"})
    deb, info = build_py.build_deb("0.0.1", icons, "gzip", model)
    fields = subprocess.run(["dpkg-deb", "-f", str(deb), "Depends", "Recommends"], capture_output=True,
                            text=True, check=True).stdout
    assert "Recommends: libvulkan1" in fields and "libvulkan1" not in fields.split("Recommends:")[0]
    assert info["recommends"] == "libvulkan1"


# -- make gpu-check ------------------------------------------------------------------------------


def test_gpu_check_is_wired_and_compiles_with_the_installerscmake_flags(build_py):
    makefile = (ROOT / "Makefile").read_text()
    assert "gpu-check:" in makefile and "packaging/gpu/check.py" in makefile
    # `make test` compiles no GPU build
    test_target = makefile[makefile.index("\ntest:"):].split("\n\n", 1)[0]
    assert "gpu" not in test_target
    source = (PACKAGING / "gpu" / "check.py").read_text()
    assert 'build_cmake_args("linux")' in source and 'JOBS = "2"' in source
    assert '"GGML_VK_VISIBLE_DEVICES": "0"' in source
    for package in ("mesa-vulkan-drivers", "libvulkan-dev", "glslc", "spirv-headers", "vulkan-tools"):
        assert package in source
    help_text = subprocess.run(["python3", str(PACKAGING / "gpu" / "check.py"), "--help"], capture_output=True,
                               text=True, check=True).stdout
    assert "--only-build" in help_text


def test_the_release_workflow_installs_what_compiling_vulkan_needs():
    workflow = (ROOT / ".github" / "workflows" / "release.yml").read_text()
    assert "libvulkan-dev glslc spirv-headers" in workflow
    assert "VULKAN_SDK=" in workflow and "runner.os == 'Windows'" in workflow


def test_vulkan_headers_too_old_for_this_llama_cpp(build_py, tmp_path, monkeypatch):
    sdk = tmp_path / "sdk"
    (sdk / "bin").mkdir(parents=True)
    (sdk / "bin" / "glslc").write_text("")
    (sdk / "include" / "vulkan").mkdir(parents=True)
    (sdk / "include" / "vulkan" / "vulkan.h").write_text("")
    core = sdk / "include" / "vulkan" / "vulkan_core.h"
    core.write_text("#define VK_HEADER_VERSION 239\n")  # Debian 12's
    monkeypatch.setenv("VULKAN_SDK", str(sdk))
    args = build_py.build_cmake_args("linux")
    assert build_py.vulkan_headers([sdk / "include"]) == (core, 239, False)
    (missing,) = build_py.vulkan_build_tools_missing(args, "linux")
    assert missing.startswith(f"newer Vulkan headers: {core} is version 1.3.239 and lacks VK_EXT_layer_settings")
    assert build_py.vulkan_build_tools_missing(args, "linux", old_headers_ok=True) == []
    core.write_text("#define VK_HEADER_VERSION 309\n#define VK_EXT_layer_settings 1\n")
    assert build_py.vulkan_build_tools_missing(args, "linux") == []


def test_older_headers_get_the_layer_settings_block_guarded(build_py, tmp_path):
    start, end = build_py.LAYER_SETTINGS_BLOCK
    source = tmp_path / "vendor" / "llama.cpp" / "ggml" / "src" / "ggml-vulkan" / "ggml-vulkan.cpp"
    source.parent.mkdir(parents=True)
    source.write_text("    VkBool32 enable_best_practice = layer_settings;\n" + start
                      + "\n        {...},\n    };\n    vk::LayerSettingsCreateInfoEXT layer_setting_info(settings);\n"
                      + end + "\n    next();\n")
    assert build_py.guard_layer_settings(tmp_path)
    text = source.read_text()
    guarded = text[text.index("#ifdef VK_EXT_layer_settings"):text.index("#endif")]
    assert start in guarded and "#else\n    vk::InstanceCreateInfo instance_create_info(" in guarded
    assert text.endswith("#endif\n    next();\n")
    assert build_py.guard_layer_settings(tmp_path) and source.read_text() == text  # once only
    source.write_text("something else")
    with pytest.raises(build_py.BuildError, match="not where it was"):
        build_py.guard_layer_settings(tmp_path)
    # make dist and make gpu-check guard the same way
    assert "project_build.guard_layer_settings(src)" in (PACKAGING / "gpu" / "check.py").read_text()


# -- make gpu-check's frozen Linux app --------------------------------------------------------------


@pytest.fixture(scope="module")
def gpu_check():
    from conftest import load_source

    return load_source("iris_gpu_check", PACKAGING / "gpu" / "check.py")


GPU_LINE = ("iris-desktop self-test ok: qwen2.5-coder-0.5b-instruct-q4_k_m.gguf (jinja format, n_ctx 2048, weights as "
            "published) loaded in 39.44 s on GPU: llvmpipe (LLVM 15.0.6, 256 bits) · 25/25 layers (the whole model "
            "fits in llvmpipe (LLVM 15.0.6, 256 bits)'s 2.0 GiB free (743 MiB needed)); asked 'What is the capital "
            "of France? Answer in one word.', replied 'Paris'; prompt 42 tokens, predicted 42; reranker x scored 2 "
            "passages in 0.1 s, the better first; next context 48/2048 tokens; 82.33 s")
CPU_LINE = ("iris-desktop self-test ok: qwen2.5-coder-0.5b-instruct-q4_k_m.gguf (jinja format, n_ctx 2048, weights "
            "Q5_0 read as Q8_0) loaded in 1.47 s on CPU (llama.cpp found no GPU it can use on this computer); asked "
            "'What is the capital of France? Answer in one word.', replied 'Paris'; prompt 42 tokens, predicted 42; "
            "next context 48/2048 tokens; 9.36 s")
AS_PLANNED = ("INFO iris.runtime.loading: qwen.gguf: offloaded 25/25 layers to llvmpipe (LLVM 15.0.6, 256 bits), as "
              "planned (Vulkan0 390 MiB, Vulkan_Host 120 MiB)")


def test_the_self_test_line_is_read_for_the_device_layers_and_reply(gpu_check):
    facts = gpu_check.read_self_test(f"loading...\n{AS_PLANNED}\n{GPU_LINE}\n")
    assert facts["ok"] and facts["device"] == "llvmpipe (LLVM 15.0.6, 256 bits)"
    assert (facts["layers"], facts["total_layers"], facts["reply"]) == (25, 25, "Paris")
    assert facts["cpu_reason"] is None and facts["load_log"].startswith("offloaded 25/25 layers to llvmpipe")
    assert gpu_check.on_whole_gpu(facts) and not gpu_check.on_cpu_in_one_sentence(facts)
    # a partial split is not the whole GPU, and a reply without Paris is not an answer
    assert not gpu_check.on_whole_gpu(gpu_check.read_self_test(GPU_LINE.replace("25/25", "12/25")))
    assert not gpu_check.on_whole_gpu(gpu_check.read_self_test(GPU_LINE.replace("'Paris'", "'Lyon'")))

    cpu = gpu_check.read_self_test(CPU_LINE)
    assert cpu["device"] is None and cpu["cpu_reason"] == "llama.cpp found no GPU it can use on this computer"
    assert gpu_check.on_cpu_in_one_sentence(cpu) and not gpu_check.on_whole_gpu(cpu)
    two = CPU_LINE.replace("this computer)", "this computer. Vulkan said nothing)")
    assert not gpu_check.on_cpu_in_one_sentence(gpu_check.read_self_test(two))
    failed = gpu_check.read_self_test("Traceback ...\niris-desktop self-test FAILED: the model file is damaged\n")
    assert not failed["ok"] and failed["line"].endswith("damaged")
    assert not gpu_check.on_cpu_in_one_sentence(failed)


def test_the_frozen_bundle_is_searched_for_the_module_and_any_vulkan_loader(gpu_check, tmp_path):
    app = _bundle(tmp_path / "iris-desktop", "_internal/llama_cpp/lib/libggml-vulkan.so",
                  "_internal/llama_cpp/lib/libggml-cpu-x64.so", "_internal/libpython3.11.so.1.0")
    found = gpu_check.bundle_vulkan(app)
    assert found == {"module": "_internal/llama_cpp/lib/libggml-vulkan.so", "module_bytes": 64, "loaders": []}
    _bundle(app, "_internal/PySide6/Qt/lib/libvulkan.so.1.3.239")
    (app / "_internal" / "libvulkan.so.1").symlink_to("PySide6/Qt/lib/libvulkan.so.1.3.239")
    assert gpu_check.bundle_vulkan(app)["loaders"] == ["_internal/PySide6/Qt/lib/libvulkan.so.1.3.239",
                                                       "_internal/libvulkan.so.1"]
    (app / "_internal" / "llama_cpp" / "lib" / "libggml-vulkan.so").unlink()
    assert gpu_check.bundle_vulkan(app)["module"] is None


DPKG_LISTING = """\
drwxr-xr-x root/root         0 2026-12-05 06:00 ./
drwxr-xr-x root/root         0 2026-12-05 06:00 ./opt/iris-desktop/_internal/llama_cpp/lib/
-rw-r--r-- root/root  52000000 2026-12-05 06:00 ./opt/iris-desktop/_internal/llama_cpp/lib/libggml-vulkan.so
-rw-r--r-- root/root   1000000 2026-12-05 06:00 ./opt/iris-desktop/_internal/llama_cpp/lib/libggml-base.so
lrwxrwxrwx root/root         0 2026-12-05 06:00 ./usr/bin/iris-desktop -> /opt/iris-desktop/iris-desktop
"""
DPKG_FIELDS = """\
Package: iris-desktop
Version: 0.1.0
Depends: libc6, libegl1, libglib2.0-0t64 | libglib2.0-0, libgl1
Recommends: libvulkan1
"""


def test_the_deb_is_read_for_the_module_loaders_and_recommends(gpu_check):
    found = gpu_check.deb_vulkan(DPKG_LISTING, DPKG_FIELDS)
    assert found["module"] == "./opt/iris-desktop/_internal/llama_cpp/lib/libggml-vulkan.so"
    assert found["loaders"] == [] and found["files"] == 5
    assert found["recommends"] == "libvulkan1" and "libvulkan1" not in gpu_check.packages(found["depends"])
    assert gpu_check.packages(found["depends"]) == {"libc6", "libegl1", "libglib2.0-0t64", "libglib2.0-0", "libgl1"}
    assert gpu_check.packages("libvulkan1 (>= 1.2), libfoo") == {"libvulkan1", "libfoo"}
    bad = DPKG_LISTING + ("-rw-r--r-- root/root    400000 2026-12-05 06:00 "
                          "./opt/iris-desktop/_internal/libvulkan.so.1\n")
    assert gpu_check.deb_vulkan(bad, "Package: x\n")["loaders"] == ["./opt/iris-desktop/_internal/libvulkan.so.1"]
    assert gpu_check.deb_vulkan(bad, "Package: x\n")["recommends"] == ""


def test_ldd_lines_say_where_each_library_comes_from(gpu_check):
    out = ("\tlinux-vdso.so.1 (0x00007ffd)\n"
           "\tlibggml-base.so => /opt/iris-desktop/_internal/llama_cpp/lib/libggml-base.so (0x00007f)\n"
           "\tlibvulkan.so.1 => /lib/x86_64-linux-gnu/libvulkan.so.1 (0x00007f)\n"
           "\tlibmissing.so.2 => not found\n"
           "\t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n")
    assert gpu_check.ldd_resolved(out) == {
        "libggml-base.so": "/opt/iris-desktop/_internal/llama_cpp/lib/libggml-base.so",
        "libvulkan.so.1": "/lib/x86_64-linux-gnu/libvulkan.so.1", "libmissing.so.2": None}


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb not installed (Debian's dpkg)")
def test_a_deb_build_py_made_reads_as_the_check_expects(build_py, gpu_check, tmp_path, monkeypatch):
    app = _bundle(tmp_path / "dist" / "iris-desktop", "_internal/llama_cpp/lib/libggml-vulkan.so")
    (app / "iris-desktop").write_text("#!/bin/sh\n")
    icons = tmp_path / "icons"
    icons.mkdir()
    for size in (16, 32, 48, 64, 128, 256, 512):
        (icons / f"iris-{size}.png").write_bytes(b"png")
    license_file = tmp_path / "LICENSE-model.txt"
    license_file.write_text("license")
    model = {"display_name": "Model", "file": "m.gguf", "license": "Apache-2.0", "license_file": license_file.name,
             "license_path": str(license_file)}
    monkeypatch.setattr(build_py, "ROOT", tmp_path)
    monkeypatch.setattr(build_py, "app_dir", lambda: app)
    monkeypatch.setattr(build_py, "system_libraries", lambda _app: {"libvulkan.so.1", "libz.so.1"})
    deb, _ = build_py.build_deb("0.0.1", icons, "gzip", model)
    run = [["dpkg-deb", "-c", str(deb)], ["dpkg-deb", "-f", str(deb), "Package", "Version", "Depends", "Recommends"]]
    listing, fields = (subprocess.run(cmd, capture_output=True, text=True, check=True).stdout for cmd in run)
    found = gpu_check.deb_vulkan(listing, fields)
    assert found["module"] == "./opt/iris-desktop/_internal/llama_cpp/lib/libggml-vulkan.so"
    assert found["loaders"] == [] and found["recommends"] == "libvulkan1"
    assert "zlib1g" in gpu_check.packages(found["depends"])


def test_build_py_takes_a_prebuilt_llama_wheel(build_py, tmp_path):
    version = build_py.installed_version("llama-cpp-python") or "0.3.36"
    requirement = f"llama-cpp-python=={version}"
    wheel = tmp_path / f"llama_cpp_python-{version}-py3-none-linux_x86_64.whl"
    with pytest.raises(build_py.BuildError, match="no such file"):
        build_py.prebuilt_wheel(wheel, "llama-cpp-python", requirement, "CMAKE_ARGS='-DGGML_VULKAN=ON'")
    wheel.write_bytes(b"PK")
    got = build_py.prebuilt_wheel(wheel, "llama-cpp-python", requirement, "CMAKE_ARGS='-DGGML_VULKAN=ON'")
    assert got["wheel"] == wheel.name and got["wheel_path"] == str(wheel) and got["prebuilt"]
    assert got["how"] == "prebuilt, CMAKE_ARGS='-DGGML_VULKAN=ON'" and len(got["sha256"]) == 64
    other = tmp_path / "llama_cpp_python-0.0.1-py3-none-linux_x86_64.whl"
    other.write_bytes(b"PK")
    with pytest.raises(build_py.BuildError, match="is not a wheel of"):
        build_py.prebuilt_wheel(other, "llama-cpp-python", requirement, "")
    numpy = tmp_path / f"numpy-{version}-cp311-cp311-linux_x86_64.whl"
    numpy.write_bytes(b"PK")
    with pytest.raises(build_py.BuildError, match="is not a wheel of"):
        build_py.prebuilt_wheel(numpy, "llama-cpp-python", requirement, "")
    opts = build_py.parse_args(["--llama-wheel", str(wheel)])
    assert opts.llama_wheel == wheel.resolve() and build_py.parse_args([]).llama_wheel is None


def test_gpu_check_builds_the_frozen_app_with_its_vulkan_wheel(gpu_check):
    # build.py on a copy of the checkout (never this checkout's dist/), the Vulkan wheel handed over
    assert gpu_check.FROZEN.is_relative_to(gpu_check.CACHE)
    source = (PACKAGING / "gpu" / "check.py").read_text()
    assert '"--llama-wheel", wheel["wheel"]' in source and "windows_check.sync_checkout(src)" in source
    help_text = subprocess.run(["python3", str(PACKAGING / "gpu" / "check.py"), "--help"], capture_output=True,
                               text=True, check=True).stdout
    assert "--rebuild-frozen" in help_text and "--no-frozen" in help_text


# -- make gpu-check's phase 7: make windows-check ---------------------------------------------------

WINDOWS_OK_LINE = (
    "windows-check ok in 429 s: setup.exe 607.8 MB, installed 853 files (813.7 MB); self-test offline under Wine "
    "answered 'Paris' in 17.7 s (8-bit weight copy 636.9 MB) on CPU (llama.cpp found no GPU it can use on this "
    "computer); ggml-vulkan.dll 29.6 MB imports ggml-base.dll, kernel32.dll, msvcrt.dll, vulkan-1.dll, no "
    "vulkan-1.dll installed, under Wine ggml-vulkan.dll loaded, with Wine's builtin vulkan-1.dll; winevulkan.dll "
    "loaded; with GGML_VK_VISIBLE_DEVICES=0 on GPU: llvmpipe, offloaded 25/25, answered 'Paris' in 56 s; "
    "shortcuts, uninstall key, uninstall: ok, nothing left but the user's data; llama.cpp: mingw-w64, "
    "-DGGML_NATIVE=off -DGGML_VULKAN=ON; phases: setup 0 s, downloads 0 s, llama 0 s (cached), prefix 1 s, "
    "build 316 s, install 30 s, self-test 78 s, checks 0 s, uninstall 4 s")
WINDOWS_NO_DEVICE_LINE = WINDOWS_OK_LINE.replace(
    "with GGML_VK_VISIBLE_DEVICES=0 on GPU: llvmpipe, offloaded 25/25, answered 'Paris' in 56 s",
    "no Vulkan device under Wine (the module's run on a device not checked)")
WINDOWS_FAILED_LINE = ("windows-check FAILED at build after 40 s (setup 0 s, downloads 0 s, llama 0 s (cached), "
                       "prefix 1 s, build 39 s): exit 1: wine C:\\iris\\py\\Scripts\\python.exe build.py")


def _windows_script(tmp_path: Path, *lines: str, code: int = 0, sleep: float = 0) -> Path:
    """A stand-in for packaging/windows/check.py: prints ``lines`` and exits with ``code``."""
    script = tmp_path / "fake_windows_check.py"
    script.write_text("import sys, time\n"
                      "print('windows-check: the Windows installer built, installed and tested under Wine "
                      "(log: /tmp/wc.log)')\n"
                      f"time.sleep({sleep})\n"
                      + "".join(f"print({line!r})\n" for line in lines) + f"sys.exit({code})\n")
    return script


def test_windows_checks_closing_line_is_read_for_its_figures(gpu_check):
    win = gpu_check.read_windows_line(WINDOWS_OK_LINE)
    assert win["seconds"] == 429 and win["setup_exe"] == "607.8 MB" and win["installed"] == "853 files (813.7 MB)"
    assert win["answer"] == "Paris" and win["self_test_seconds"] == 17.7
    assert win["device"] == "CPU (llama.cpp found no GPU it can use on this computer)"
    assert win["module"] == "ggml-vulkan.dll" and win["module_size"] == "29.6 MB"
    assert win["module_imports"] == ["ggml-base.dll", "kernel32.dll", "msvcrt.dll", "vulkan-1.dll"]
    assert win["under_wine"] == "ggml-vulkan.dll loaded, with Wine's builtin vulkan-1.dll; winevulkan.dll loaded"
    assert win["lavapipe"] == "GPU: llvmpipe, offloaded 25/25, answered 'Paris' in 56 s"
    assert win["phases"].startswith("setup 0 s") and not win["no_vulkan_device"]
    clause = gpu_check.windows_clause(win)
    assert clause.startswith("Windows (windows-check ok in 429 s): ggml-vulkan.dll 29.6 MB imports ggml-base.dll, "
                             "kernel32.dll, msvcrt.dll, vulkan-1.dll; setup.exe 607.8 MB; under Wine the installed "
                             "app's self-test on the CPU 'Paris' in 17.7 s")
    assert clause.endswith("with GGML_VK_VISIBLE_DEVICES=0 on GPU: llvmpipe, offloaded 25/25, answered 'Paris' in 56 s")
    # no Vulkan device under Wine: no lavapipe run, and the clause says so
    win = gpu_check.read_windows_line(WINDOWS_NO_DEVICE_LINE)
    assert win["lavapipe"] is None and win["no_vulkan_device"]
    assert win["under_wine"].startswith("ggml-vulkan.dll loaded")
    assert gpu_check.windows_clause(win).endswith("no Vulkan device under Wine (lavapipe not run)")


@pytest.fixture
def gpu_phases(gpu_check, tmp_path, monkeypatch):
    """gpu-check with phases 1-6 replaced by stand-ins that record their calls, its cache in
    tmp_path; phase 7 runs a stand-in windows check (set ``WINDOWS_CHECK``)."""
    called: list[str] = []

    def fake(name, result=None):
        def phase(*args, **kwargs):
            called.append(name)
            return {} if result is None else result
        return phase

    monkeypatch.setattr(gpu_check, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(gpu_check, "phase_setup", fake("setup", {"installed": [], "vulkan_devices": ["llvmpipe"]}))
    monkeypatch.setattr(gpu_check, "phase_wheel", fake("wheel"))
    monkeypatch.setattr(gpu_check, "phase_venv", fake("venv", tmp_path / "venv"))
    for name in ("check_devices", "check_full", "check_partial", "check_off", "check_self_tests", "check_tests",
                 "phase_frozen_build", "check_frozen"):
        monkeypatch.setattr(gpu_check, name, fake(name))
    real_windows = gpu_check.phase_windows
    monkeypatch.setattr(gpu_check, "phase_windows", lambda: (called.append("windows"), real_windows())[1])
    monkeypatch.setattr(gpu_check, "WINDOWS_CHECK", _windows_script(tmp_path, WINDOWS_OK_LINE))
    return called


def _record(gpu_check) -> dict:
    import json

    return json.loads((gpu_check.CACHE / "last-gpu-check.json").read_text())


def test_gpu_check_runs_windows_check_last_and_keeps_its_figures(gpu_check, gpu_phases, capsys):
    assert gpu_check.main([]) == 0
    assert gpu_phases[-3:] == ["phase_frozen_build", "check_frozen", "windows"] and gpu_phases[0] == "setup"
    out = capsys.readouterr().out
    assert "==> windows" in out and "      | " + WINDOWS_OK_LINE in out  # streamed
    closing = out.strip().splitlines()[-1]
    assert closing.startswith("gpu-check ok in ") and "; Windows (windows-check ok in 429 s): ggml-vulkan.dll 29.6 MB" \
        in closing and closing.endswith("windows 0 s")
    record = _record(gpu_check)
    assert record["windows"]["module_imports"][-1] == "vulkan-1.dll" and record["windows"]["exit"] == 0
    assert record["windows"]["line"] == WINDOWS_OK_LINE and record["windows"]["windows_check_log"] == "/tmp/wc.log"
    assert WINDOWS_OK_LINE in Path(record["windows"]["log"]).read_text()
    assert "windows" in record["seconds"]


def test_only_windows_runs_phase_7_alone(gpu_check, gpu_phases, capsys):
    assert gpu_check.main(["--only-windows"]) == 0
    assert gpu_phases == ["windows"]
    closing = capsys.readouterr().out.strip().splitlines()[-1]
    assert closing.startswith("gpu-check ok in ") and "(--only-windows: phases 1-6 not run); Windows (windows-check" \
        in closing and closing.endswith("; phases: windows 0 s")
    assert _record(gpu_check)["only_windows"] is True
    for other in (["--only-windows", "--no-windows"], ["--only-windows", "--only-build"]):
        with pytest.raises(SystemExit):
            gpu_check.main(other)


def test_no_windows_and_only_build_leave_windows_check_out(gpu_check, gpu_phases, capsys):
    assert gpu_check.main(["--no-windows"]) == 0
    assert "windows" not in gpu_phases and gpu_phases[-1] == "check_frozen"
    assert capsys.readouterr().out.strip().splitlines()[-1].split("; phases:")[0].endswith(
        "; Windows not run (--no-windows)")
    gpu_phases.clear()
    assert gpu_check.main(["--only-build"]) == 0
    assert gpu_phases == ["setup", "wheel", "venv"]
    assert "Windows" not in capsys.readouterr().out.strip().splitlines()[-1]
    gpu_phases.clear()
    assert gpu_check.main(["--no-frozen"]) == 0  # the frozen Linux app left out, Windows not
    assert "phase_frozen_build" not in gpu_phases and gpu_phases[-1] == "windows"


def test_a_failed_windows_check_fails_gpu_check_with_its_line(gpu_check, gpu_phases, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "WINDOWS_CHECK", _windows_script(tmp_path, "==> build: ...", WINDOWS_FAILED_LINE,
                                                                    code=1))
    assert gpu_check.main(["--only-windows"]) == 1
    closing = capsys.readouterr().out.strip().splitlines()[-1]
    assert closing.startswith("gpu-check FAILED after ") and closing.endswith(": " + WINDOWS_FAILED_LINE)
    record = _record(gpu_check)
    assert record["failed"] == WINDOWS_FAILED_LINE and record["failed_at"] == "windows" and "windows" not in record


@pytest.mark.parametrize("lines, code, reason", [
    (["Traceback (most recent call last):", "KeyError: 'x'"], 1, "exited 1 without 'windows-check ok in'"),
    (["windows-check stopped after llama (--until llama) in 4 s"], 0, "exited 0 without 'windows-check ok in'"),
    ([WINDOWS_OK_LINE.replace("ggml-vulkan.dll 29.6 MB imports", "module")], 0,
     "names no ggml-vulkan.dll importing vulkan-1.dll"),
])
def test_windows_check_without_its_ok_line_fails(gpu_check, gpu_phases, tmp_path, monkeypatch, lines, code, reason):
    monkeypatch.setattr(gpu_check, "WINDOWS_CHECK", _windows_script(tmp_path, *lines, code=code))
    assert gpu_check.main(["--only-windows"]) == 1
    assert reason in _record(gpu_check)["failed"]


def test_windows_check_is_stopped_at_its_time_limit(gpu_check, tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "CACHE", tmp_path)
    with pytest.raises(gpu_check.CheckError, match="timed out after 1 s"):
        gpu_check.phase_windows(_windows_script(tmp_path, WINDOWS_OK_LINE, sleep=60), timeout=1)


def test_gpu_check_windows_phase_is_wired(gpu_check):
    assert gpu_check.WINDOWS_CHECK == PACKAGING / "windows" / "check.py"
    source = (PACKAGING / "gpu" / "check.py").read_text()
    assert "[sys.executable, \"-u\", str(script)]" in source and "cwd=ROOT" in source
    help_text = subprocess.run(["python3", str(PACKAGING / "gpu" / "check.py"), "--help"], capture_output=True,
                               text=True, check=True).stdout
    assert "--no-windows" in help_text and "--only-windows" in help_text
    assert "7. windows" in gpu_check.__doc__
