"""PyInstaller hook for llama-cpp-python (pyinstaller-hooks-contrib has none).

llama_cpp loads its native libraries with ctypes at import time, from
``<package>/lib`` (``llama_cpp/_ctypes_extensions.py``: ``libllama.so`` / ``llama.dll`` /
``libllama.dylib``, and ``libggml``, ``libmtmd``). PyInstaller cannot see ctypes loads,
so the libraries are collected here, keeping the ``llama_cpp/lib`` layout the package
expects. Their own link-time dependencies (``libggml-base.so.0``, OpenMP's ``libgomp``) are
then found by PyInstaller's binary dependency analysis.

The installers' build (packaging/build.py, Linux and Windows) has no CPU backend linked in:
it is ``GGML_BACKEND_DL`` with ``GGML_CPU_ALL_VARIANTS``, one ``libggml-cpu-<variant>.so`` /
``ggml-cpu-<variant>.dll`` per x86-64 level. Nothing links them, so no dependency analysis
finds them: they are collected here by name, into ``llama_cpp/lib`` under their own names,
where iris_desktop/runtime/backends.py asks ggml to choose (``ggml_backend_load_all_from_path``).
The hook fails the build if one of the installed variants would be left out.

On Windows ``ggml-cpu*.dll`` also needs the MSVC OpenMP runtime ``vcomp140.dll``, which
PyInstaller does not collect (pyinstaller#9216); packaging/build.py's spec adds it.
"""

import os
import sys
from pathlib import Path

from PyInstaller.utils.hooks import collect_data_files, collect_dynamic_libs, get_package_paths

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # packaging/, for bundle_rules

import bundle_rules  # noqa: E402

# The shared libraries: llama, ggml (+ base, cpu or its variants, metal/blas backends when
# built), mtmd. ``lib*.so`` / ``*.dll`` / ``*.dylib`` anywhere in the package, at their place.
binaries = collect_dynamic_libs("llama_cpp")

# the CPU backend variants, by name (the patterns above match them today; this keeps it so)
_lib_dir = Path(get_package_paths("llama_cpp")[1]) / "lib"
_variants = sorted(p for p in _lib_dir.iterdir() if bundle_rules.cpu_variant(p.name)) if _lib_dir.is_dir() else []
_collected = {(os.path.basename(src), dest.replace("\\", "/")) for src, dest in binaries}
binaries += [(str(p), bundle_rules.LLAMA_LIB_DIR) for p in _variants
             if (p.name, bundle_rules.LLAMA_LIB_DIR) not in _collected]
_missing = bundle_rules.missing_cpu_variants([(f"{dest}/{os.path.basename(src)}", src, "BINARY")
                                              for src, dest in binaries], _variants)
if _missing:
    raise SystemExit("hook-llama_cpp: CPU backend variants not collected into "
                     f"{bundle_rules.LLAMA_LIB_DIR}: {', '.join(_missing)}")

# Data next to the libraries: Metal shader sources / metallib on macOS when they are not
# embedded into libggml-metal, and nothing else (no headers, no import libraries).
datas = collect_data_files(
    "llama_cpp",
    subdir="lib",
    includes=["*.metal", "*.metallib"],
)

# The OpenAI-compatible server needs fastapi/uvicorn and is not part of the app.
excludedimports = ["llama_cpp.server"]
