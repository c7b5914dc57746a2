"""PyInstaller hook for llama-cpp-python (pyinstaller-hooks-contrib has none).

llama_cpp loads its native libraries with ctypes at import time, from
``<package>/lib`` (``llama_cpp/_ctypes_extensions.py``: ``libllama.so`` / ``llama.dll`` /
``libllama.dylib``, and ``libggml``, ``libmtmd``). PyInstaller cannot see ctypes loads,
so the libraries are collected here, keeping the ``llama_cpp/lib`` layout the package
expects. Their own link-time dependencies (``libggml-base.so.0``, ``libggml-cpu.so.0``,
OpenMP's ``libgomp``) are then found by PyInstaller's binary dependency analysis.

On Windows ``ggml-cpu.dll`` also needs the MSVC OpenMP runtime ``vcomp140.dll``, which
PyInstaller does not collect (pyinstaller#9216); packaging/build.py's spec adds it.
"""

from PyInstaller.utils.hooks import collect_data_files, collect_dynamic_libs

# The shared libraries: llama, ggml (+ base, cpu, metal/blas backends when built), mtmd.
binaries = collect_dynamic_libs("llama_cpp")

# Data next to the libraries: Metal shader sources / metallib on macOS when they are not
# embedded into libggml-metal, and nothing else (no headers, no import libraries).
datas = collect_data_files(
    "llama_cpp",
    subdir="lib",
    includes=["*.metal", "*.metallib"],
)

# The OpenAI-compatible server needs fastapi/uvicorn and is not part of the app.
excludedimports = ["llama_cpp.server"]
