"""packaging/windows/check.py's Vulkan module (issue #46): the pure parts, without mingw or Wine.

`make windows-check` cross-compiles ggml's Vulkan backend with mingw-w64 against an import
library for vulkan-1.dll that it makes from the objects' undefined vk* symbols, then reads
every DLL's imports with ``objdump -p``; the installed app must carry ggml-vulkan.dll and no
vulkan-1.dll, and under Wine (no GPU) run on the CPU. These tests hold those parts to their
contracts on sample tool output; the one that runs dlltool skips where mingw is not installed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import load_source

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "packaging" / "windows" / "check.py"


@pytest.fixture(scope="module")
def check():
    return load_source("iris_windows_check_vulkan", CHECK)


#: ``x86_64-w64-mingw32-objdump -p ggml-vulkan.dll``, the import tables (shortened)
OBJDUMP_VULKAN = """
ggml-vulkan.dll:     file format pei-x86-64

The Import Tables (interpreted .idata section contents)
 vma:            Hint    Time      Forward  DLL       First
                 Table   Stamp     Chain    Name      Thunk
 0042c000       0042c078 00000000 00000000 0042c9e4 0042c3d0

\tDLL Name: ggml-base.dll
\tvma:  Hint/Ord Member-Name Bound-To
\t42c728\t   12  ggml_backend_buffer_init
\t42c744\t   96  ggml_nbytes

 0042c014       0042c0f0 00000000 00000000 0042cb20 0042c448

\tDLL Name: KERNEL32.dll
\tvma:  Hint/Ord Member-Name Bound-To
\t42c780\t  274  DeleteCriticalSection
\t42c798\t  310  EnterCriticalSection

 0042c028       0042c140 00000000 00000000 0042cb5c 0042c498

\tDLL Name: msvcrt.dll
\tvma:  Hint/Ord Member-Name Bound-To
\t42c7b0\t   56  __C_specific_handler

 0042c03c       0042c1f0 00000000 00000000 0042cb70 0042c548

\tDLL Name: vulkan-1.dll
\tvma:  Hint/Ord Member-Name Bound-To
\t42c7d0\t    0  vkGetInstanceProcAddr

 0042c050       00000000 00000000 00000000 00000000 00000000

There is an export table in .edata at 0x42b000
"""


def test_objdump_imports_are_read(check):
    imports = check.parse_pe_imports(OBJDUMP_VULKAN)
    assert imports == {"ggml-base.dll": ["ggml_backend_buffer_init", "ggml_nbytes"],
                       "kernel32.dll": ["DeleteCriticalSection", "EnterCriticalSection"],
                       "msvcrt.dll": ["__C_specific_handler"], "vulkan-1.dll": ["vkGetInstanceProcAddr"]}


def test_the_vulkan_module_may_import_the_loader_and_nothing_foreign(check):
    vulkan = check.parse_pe_imports(OBJDUMP_VULKAN)
    wheel = {"ggml-vulkan.dll": vulkan, "ggml-base.dll": {"kernel32.dll": [], "msvcrt.dll": []},
             "ggml-cpu-x64.dll": {"ggml-base.dll": [], "kernel32.dll": []},
             "libllama.dll": {"ggml.dll": [], "ggml-base.dll": [], "api-ms-win-crt-runtime-l1-1-0.dll": []},
             "ggml.dll": {"ggml-base.dll": []}}
    assert check.import_problems(wheel) == []


def test_only_the_vulkan_module_may_import_the_loader(check):
    problems = check.import_problems({"ggml-cpu-x64.dll": {"vulkan-1.dll": [], "kernel32.dll": []}})
    assert len(problems) == 1
    assert problems[0].startswith("ggml-cpu-x64.dll imports vulkan-1.dll (only ggml's Vulkan module")


def test_a_vulkan_module_without_the_loader_or_with_foreign_dlls_fails(check):
    problems = check.import_problems({"ggml-vulkan.dll": {"libstdc++-6.dll": [], "libvulkan.dll": [],
                                                          "kernel32.dll": []}})
    assert any("needs mingw's libstdc++-6.dll" in p and "statically" in p for p in problems)
    assert any("imports libvulkan.dll (neither a Windows system DLL nor one the bundle ships)" in p
               for p in problems)
    assert any("does not import vulkan-1.dll" in p for p in problems)


def test_system_dlls(check):
    assert check.is_system_dll("KERNEL32.dll") and check.is_system_dll("api-ms-win-crt-heap-l1-1-0.dll")
    assert not check.is_system_dll("vulkan-1.dll") and not check.is_system_dll("libgomp-1.dll")


#: ``x86_64-w64-mingw32-nm -u`` over several objects: C++ names, duplicates, dllimport references
NM_UNDEFINED = """
vendor/llama.cpp/ggml/src/ggml-vulkan/CMakeFiles/ggml-vulkan.dir/ggml-vulkan.cpp.obj:
                 U _ZNSt6thread15_M_start_threadESt10unique_ptrINS_6_StateESt14default_deleteIS1_EEPFvvE
                 U ggml_nbytes
                 U vkGetInstanceProcAddr
                 U __imp_vkEnumerateInstanceVersion
                 U memcpy

vendor/llama.cpp/ggml/src/ggml-vulkan/CMakeFiles/ggml-vulkan.dir/ggml-vulkan-buffers.cpp.obj:
                 U vkGetInstanceProcAddr
                 U _Z17vkHelperNotAnApi
                 U vk_instance_t

vendor/llama.cpp/ggml/src/ggml-vulkan/CMakeFiles/ggml-vulkan.dir/add.comp.cpp.obj:
"""


def test_the_def_lists_the_vk_functions_the_objects_call(check):
    functions = check.vulkan_functions(NM_UNDEFINED)
    assert functions == ["vkEnumerateInstanceVersion", "vkGetInstanceProcAddr"]
    text = check.def_text(functions)
    lines = [line for line in text.splitlines() if not line.startswith(";")]
    assert lines == ["LIBRARY vulkan-1.dll", "EXPORTS", "    vkEnumerateInstanceVersion", "    vkGetInstanceProcAddr"]
    with pytest.raises(check.CheckError, match="no function to import from vulkan-1.dll"):
        check.def_text([])


def test_the_module_objects_come_from_ninja(check):
    obj = "vendor/llama.cpp/ggml/src/ggml-vulkan/CMakeFiles/ggml-vulkan.dir/"
    targets = "\n".join([
        f"{obj}ggml-vulkan.cpp.obj: CXX_COMPILER__ggml-vulkan_Release",
        f"{obj}add.comp.cpp.obj: CXX_COMPILER__ggml-vulkan_Release",
        "vendor/llama.cpp/ggml/src/ggml-vulkan/add.comp.cpp: CUSTOM_COMMAND",
        "vendor/llama.cpp/ggml/src/CMakeFiles/ggml-base.dir/ggml.c.obj: C_COMPILER__ggml-base_Release",
        "bin/ggml-vulkan.dll: CXX_MODULE_LIBRARY_LINKER__ggml-vulkan_Release",
    ])
    assert check.object_targets(targets, "ggml-vulkan") == [f"{obj}add.comp.cpp.obj", f"{obj}ggml-vulkan.cpp.obj"]
    assert check.object_targets(targets, "ggml-cuda") == []


@pytest.mark.skipif(shutil.which("x86_64-w64-mingw32-dlltool") is None, reason="needs mingw-w64's dlltool")
def test_dlltool_makes_the_import_library_from_the_def(check, tmp_path):
    definition = tmp_path / "vulkan-1.def"
    definition.write_text(check.def_text(["vkGetInstanceProcAddr"]))
    library = tmp_path / "libvulkan-1.dll.a"
    subprocess.run(["x86_64-w64-mingw32-dlltool", "-d", definition, "-l", library, "-D", "vulkan-1.dll"],
                   check=True)
    symbols = subprocess.run(["x86_64-w64-mingw32-nm", library], capture_output=True, text=True, check=True).stdout
    assert "__imp_vkGetInstanceProcAddr" in symbols and " T vkGetInstanceProcAddr" in symbols
    assert b"vulkan-1.dll" in library.read_bytes()


def test_the_windows_build_asks_for_vulkan(check):
    args = check.windows_cmake_args(None)
    assert args == check.project_build.build_cmake_args("win32")
    assert check.project_build.wants_vulkan(args)
    assert "spirv-headers" in check.DEBIAN_PACKAGES and "glslc" in check.DEBIAN_PACKAGES


def test_the_installed_app_carries_the_module_and_no_loader(check, tmp_path):
    app = tmp_path / "Iris Desktop"
    lib = app / "_internal" / "llama_cpp" / "lib"
    lib.mkdir(parents=True)
    (lib / "ggml-vulkan.dll").write_bytes(b"MZ" + b"\0" * 98)
    (lib / "ggml-base.dll").write_bytes(b"MZ")
    files = sorted(p for p in app.rglob("*") if p.is_file())
    assert check.installed_vulkan(app, files, vulkan=True) == {
        "vulkan_module": "_internal/llama_cpp/lib/ggml-vulkan.dll", "vulkan_module_bytes": 100}
    (app / "_internal" / "Vulkan-1.dll").write_bytes(b"MZ")
    files = sorted(p for p in app.rglob("*") if p.is_file())
    with pytest.raises(check.CheckError, match=r"carries the Vulkan loader \(_internal/Vulkan-1.dll\)"):
        check.installed_vulkan(app, files, vulkan=True)
    (app / "_internal" / "Vulkan-1.dll").unlink()
    (lib / "ggml-vulkan.dll").unlink()
    files = sorted(p for p in app.rglob("*") if p.is_file())
    with pytest.raises(check.CheckError, match="lacks ggml-vulkan.dll"):
        check.installed_vulkan(app, files, vulkan=True)
    assert check.installed_vulkan(app, files, vulkan=False) == {}


SELF_TEST = ("iris-desktop self-test ok: qwen2.5-0.5b-instruct (chatml format, n_ctx 4096, weights read as Q8_0) "
             "loaded in 3.21 s on CPU (llama.cpp found no GPU it can use on this computer); asked 'What is the "
             "capital of France?', replied 'Paris.'; prompt 31 tokens, predicted 31; reranked; next context "
             "40/4096 tokens; 9.80 s")


def test_the_self_test_line_says_where_the_model_ran(check):
    assert check.self_test_device(SELF_TEST) == "CPU (llama.cpp found no GPU it can use on this computer)"
    assert check.self_test_device("iris-desktop self-test ok: something else") == ""


def test_wine_loaddll_lines_tell_what_vulkan_loaded(check):
    loaded_at = "0024:trace:loaddll:build_module Loaded L"
    system32 = "C:\\\\windows\\\\system32\\\\"
    output = "\n".join([
        f'{loaded_at}"{system32}kernel32.dll" at 000000007B600000: builtin',
        f'{loaded_at}"{system32}winevulkan.dll" at 0000000180000000: builtin',
        f'{loaded_at}"{system32}vulkan-1.dll" at 00006FFFFA4A0000: builtin',
        f'{loaded_at}"C:\\\\users\\\\me\\\\AppData\\\\Local\\\\Programs\\\\Iris Desktop\\\\'
        '_internal\\\\llama_cpp\\\\lib\\\\ggml-vulkan.dll" at 0000000340000000: native',
        SELF_TEST,
    ])
    loaded = check.vulkan_dlls_loaded(output)
    assert loaded == {"winevulkan.dll": "builtin", "vulkan-1.dll": "builtin", "ggml-vulkan.dll": "native"}
    assert check.describe_vulkan_loads(loaded) == ("ggml-vulkan.dll loaded, with Wine's builtin vulkan-1.dll; "
                                                    "winevulkan.dll loaded")
    assert check.describe_vulkan_loads({}) == "ggml-vulkan.dll not loaded"


def test_devices_json_among_wine_lines(check):
    output = ('0024:fixme:ntdll:whatever\n{\n  "devices": [{"name": "CPU", "kind": "cpu", "backend": "CPU"}, '
              '{"name": "Vulkan0", "kind": "gpu", "backend": "Vulkan", "description": "llvmpipe (LLVM 15.0.6, '
              '256 bits)"}],\n  "model": null\n}\n')
    assert check.devices_listed(output) == "CPU; Vulkan: llvmpipe (LLVM 15.0.6, 256 bits) (gpu)"
    assert check.devices_listed("no json here") == ""


def test_closing_line_names_the_vulkan_module(check):
    facts = {"setup_bytes": 612_345_678, "installed_files": 900, "installed_bytes": 700_000_000, "answer": "Paris",
             "self_test_seconds": 12.34, "cmake_args": "-DGGML_VULKAN=ON", "weight_copies": 637_000_000,
             "device": "CPU (llama.cpp found no GPU it can use on this computer)",
             "vulkan": {"module": "ggml-vulkan.dll", "module_bytes": 60_100_000,
                        "module_imports": ["ggml-base.dll", "kernel32.dll", "msvcrt.dll", "vulkan-1.dll"],
                        "loaded": {"ggml-vulkan.dll": "native", "vulkan-1.dll": "builtin"}}}
    line = check.closing_line(True, {"setup": 1.0}, facts)
    assert "(8-bit weight copy 637.0 MB) on CPU (llama.cpp found no GPU it can use on this computer); " in line
    assert ("; ggml-vulkan.dll 60.1 MB imports ggml-base.dll, kernel32.dll, msvcrt.dll, vulkan-1.dll, no "
            "vulkan-1.dll installed, under Wine ggml-vulkan.dll loaded, with Wine's builtin vulkan-1.dll; "
            "shortcuts") in line


#: ``iris-desktop.exe -v --self-test`` under Wine with GGML_VK_VISIBLE_DEVICES=0 and lavapipe (shortened)
GPU_SELF_TEST = """INFO iris.runtime: qwen2.5-coder-0.5b-instruct-q4_k_m.gguf: offloaded 25/25 layers to \
llvmpipe (LLVM \
15.0.6, 256 bits), as planned (Vulkan0 294 MiB)
iris-desktop self-test ok: qwen2.5-coder-0.5b-instruct-q4_k_m.gguf (jinja format, n_ctx 2048, weights as published) \
loaded in 54.85 s on GPU: llvmpipe (LLVM 15.0.6, 256 bits) \ufffd 25/25 layers (the whole model fits in the 2.0 GiB \
free on llvmpipe (LLVM 15.0.6, 256 bits) (743 MiB needed)); asked 'What is the capital of France? Answer in one \
word.', replied 'Paris'; prompt 42 tokens, predicted 42; 90.19 s
"""


def test_the_gpu_self_test_under_wine_is_read(check):
    found = check.read_vulkan_self_test(GPU_SELF_TEST)
    assert found["device"].startswith("GPU: llvmpipe (LLVM 15.0.6, 256 bits) \ufffd 25/25 layers")
    assert found["answer"] == "Paris" and found["offloaded"] == "25/25"
    assert check.read_vulkan_self_test("no such line") == {"line": "", "device": "", "answer": "", "offloaded": ""}


def test_no_vulkan_device_under_wine_skips_the_gpu_run(check):
    # nothing is run (no Wine prefix given): the closing line says the run was not checked
    assert check.vulkan_self_test(None, "iris-desktop.exe", ["unshare", "-n"], "CPU") is None
    facts = {"setup_bytes": 1, "installed_files": 1, "installed_bytes": 1, "answer": "Paris", "self_test_seconds": 1,
             "cmake_args": "-DGGML_VULKAN=ON", "weight_copies": 0, "device": "CPU",
             "vulkan": {"module": "ggml-vulkan.dll", "module_bytes": 29_621_651, "module_imports": ["vulkan-1.dll"],
                        "loaded": {}, "run": None}}
    assert "; no Vulkan device under Wine (the module's run on a device not checked)" in check.closing_line(
        True, {"setup": 1.0}, facts)


def test_closing_line_gives_the_gpu_run_under_wine(check):
    run = {**check.read_vulkan_self_test(GPU_SELF_TEST), "seconds": 96.2}
    facts = {"setup_bytes": 1, "installed_files": 1, "installed_bytes": 1, "answer": "Paris", "self_test_seconds": 1,
             "cmake_args": "-DGGML_VULKAN=ON", "weight_copies": 0, "device": "CPU",
             "vulkan": {"module": "ggml-vulkan.dll", "module_bytes": 29_621_651, "module_imports": ["vulkan-1.dll"],
                        "loaded": {"ggml-vulkan.dll": "native"}, "run": run}}
    line = check.closing_line(True, {"setup": 1.0}, facts)
    assert ("; with GGML_VK_VISIBLE_DEVICES=0 on GPU: llvmpipe, offloaded 25/25, answered 'Paris' in 96 s; "
            "shortcuts") in line
