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
