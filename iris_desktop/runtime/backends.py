"""llama.cpp's compute backends: the CPU backend this computer can run, loaded before a model.

The installers' llama.cpp (``packaging/build.py``, Linux and Windows) is built with
``GGML_BACKEND_DL`` and ``GGML_CPU_ALL_VARIANTS``: ggml's CPU backend is not linked into
libggml but shipped once per x86-64 level (``libggml-cpu-x64.so``, ``-sse42``, ``-sandybridge``,
``-haswell``, ``-skylakex``, ... or ``ggml-cpu-<variant>.dll``) beside libllama, and no model
loads until one of them is loaded. llama.cpp looks for them by itself only in the executable's
folder and the working directory (``ggml_backend_load_all``), which is neither ``llama_cpp/lib``
in a virtualenv nor ``_internal/llama_cpp/lib`` in the frozen app, and llama-cpp-python 0.3.x
never asks (abetlen/llama-cpp-python#2069). :func:`load_backends` calls
``ggml_backend_load_all_from_path`` on llama_cpp's own library folder: ggml asks every variant
for its score on this CPU (``cpuid``; 0 for one that would not run) and loads the best, so a CPU
without AVX2 gets the SSE4.2 build instead of an illegal instruction.

The same call loads the GPU backend modules that lie beside them (the installers' Linux and
Windows builds add ``libggml-vulkan.so`` / ``ggml-vulkan.dll``). One whose driver library is
missing (no ``libvulkan.so.1``, no ``vulkan-1.dll``) fails to load, ggml says so in its log
and goes on without it: the CPU runs the model (:mod:`.devices` lists what was found).

A llama.cpp with the CPU backend linked in (a developer's ``pip install``, macOS) has it
registered already: then nothing is loaded. Never imports PySide6.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("iris.runtime.backends")

__all__ = ["BackendError", "CpuBackend", "ggml_function", "ggml_library", "load_backends"]


class BackendError(RuntimeError):
    """llama.cpp has no CPU backend this computer can run."""


@dataclass(frozen=True)
class CpuBackend:
    """The CPU backend llama.cpp computes with."""

    #: the library it lives in (``libggml-cpu-sse42.so``, ``ggml-cpu-haswell.dll``; the linked
    #: ``libggml-cpu.so`` of a build without variants), or None where that cannot be told
    library: str | None
    #: what that library was compiled for, as ggml reports it (``SSE3``, ``AVX2``, ``OPENMP``, ...)
    features: tuple[str, ...]
    #: True when :func:`load_backends` loaded it from ``lib_dir``; False when it was there already
    loaded_here: bool
    #: the folder the variants were looked for in (None when nothing had to be loaded)
    lib_dir: str | None
    #: every backend llama.cpp has registered, by name (``CPU``, ``Metal``, ...)
    registered: tuple[str, ...]

    @property
    def variant(self) -> str | None:
        """``sse42`` for ``libggml-cpu-sse42.so``; None for a CPU backend without variants."""
        match = re.match(r"^(?:lib)?ggml-cpu-(.+)\.(?:so|dll)$", self.library or "")
        return match[1] if match else None

    def describe(self) -> str:
        what = f"variant {self.variant}" if self.variant else "linked in" if not self.loaded_here else "loaded"
        return f"{self.library or 'CPU backend'} ({what}; {' '.join(self.features) or 'no SIMD features'})"


class _Feature(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_char_p)]


_lock = threading.Lock()
_loaded: CpuBackend | None = None


def load_backends(lib_dir: str | os.PathLike[str] | None = None) -> CpuBackend:
    """Make sure llama.cpp has a CPU backend, loading the best variant for this CPU from
    ``lib_dir`` (default: the folder llama_cpp loaded libllama from) when it has none yet.
    Call it before the first ``llama_cpp.Llama``. Idempotent and thread-safe: the first
    answer is kept. Raises :class:`BackendError` when no CPU backend can be loaded."""
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        import llama_cpp.llama_cpp as low

        folder = Path(lib_dir) if lib_dir is not None else Path(low._base_path)
        ggml = _ggml(low._lib, folder)
        loaded_here = False
        if _cpu_reg(ggml) is None:
            # ggml takes the folder as UTF-8 (fs::u8path), on every OS
            _fn(ggml, "ggml_backend_load_all_from_path", None, ctypes.c_char_p)(os.fsdecode(folder).encode("utf-8"))
            loaded_here = True
        reg = _cpu_reg(ggml)
        if reg is None:
            found = sorted(p.name for p in folder.glob("*ggml-cpu*")) if folder.is_dir() else []
            raise BackendError(
                f"no CPU backend of llama.cpp runs on this computer: none loaded from {folder} "
                f"({', '.join(found) if found else 'it holds no ggml-cpu library'})")
        features, address = _features(ggml, reg)
        _loaded = CpuBackend(library=_library_of(address), features=features, loaded_here=loaded_here,
                             lib_dir=str(folder) if loaded_here else None, registered=_reg_names(ggml))
        log.info("llama.cpp CPU backend: %s%s", _loaded.describe(), f", from {folder}" if loaded_here else "")
        return _loaded


def ggml_library() -> ctypes.CDLL:
    """The libggml llama_cpp's libllama is linked with: ggml's registry of backends and
    devices (:mod:`.devices` reads it)."""
    import llama_cpp.llama_cpp as low

    return _ggml(low._lib, Path(low._base_path))


def ggml_function(lib: ctypes.CDLL, name: str, restype, *argtypes):
    """ggml's function ``name`` with its C types (found in ggml-base.dll on Windows)."""
    return _fn(lib, name, restype, *argtypes)


def _ggml(llama: ctypes.CDLL, folder: Path) -> ctypes.CDLL:
    """The libggml libllama is linked with. On Linux and macOS ``dlsym`` on libllama's handle
    also searches its dependencies, so that is exactly the one; Windows' GetProcAddress does
    not: there ggml.dll is loaded by its path in ``folder``, the copy llama.dll was given."""
    try:
        llama["ggml_backend_reg_count"]
        return llama
    except AttributeError:
        from llama_cpp._ctypes_extensions import load_shared_library

        return load_shared_library("ggml", folder)


def _fn(lib: ctypes.CDLL, name: str, restype, *argtypes):
    try:
        fn = lib[name]  # a new function object: never the cached attribute llama_cpp may use
    except AttributeError:
        if sys.platform != "win32":
            raise
        # Windows' GetProcAddress sees ggml.dll's own exports only: the registry's accessors
        # (ggml_backend_reg_name, ggml_backend_reg_get_proc_address) are ggml-base.dll's
        fn = ctypes.CDLL(str(Path(lib._name).with_name("ggml-base.dll")))[name]
    fn.restype = restype
    fn.argtypes = list(argtypes)
    return fn


def _reg_names(ggml: ctypes.CDLL) -> tuple[str, ...]:
    count = _fn(ggml, "ggml_backend_reg_count", ctypes.c_size_t)()
    get = _fn(ggml, "ggml_backend_reg_get", ctypes.c_void_p, ctypes.c_size_t)
    name = _fn(ggml, "ggml_backend_reg_name", ctypes.c_char_p, ctypes.c_void_p)
    return tuple((name(get(i)) or b"").decode("utf-8", "replace") for i in range(count))


def _cpu_reg(ggml: ctypes.CDLL) -> int | None:
    reg = _fn(ggml, "ggml_backend_reg_by_name", ctypes.c_void_p, ctypes.c_char_p)(b"CPU")
    return reg or None


def _features(ggml: ctypes.CDLL, reg: int) -> tuple[tuple[str, ...], int | None]:
    """The CPU backend's ``ggml_backend_get_features`` (``AVX2`` for ``AVX2=1``, ``NAME=value``
    otherwise) and the address of that function, which lies in the backend's library."""
    proc = _fn(ggml, "ggml_backend_reg_get_proc_address", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
        reg, b"ggml_backend_get_features")
    if not proc:
        return (), None
    get = ctypes.CFUNCTYPE(ctypes.POINTER(_Feature), ctypes.c_void_p)(proc)
    found = []
    table = get(reg)
    for i in range(256):
        feature = table[i]
        if not feature.name:
            break
        name = feature.name.decode("ascii", "replace")
        value = (feature.value or b"").decode("ascii", "replace")
        found.append(name if value == "1" else f"{name}={value}")
    return tuple(found), proc


def _library_of(address: int | None) -> str | None:
    """The file name of the shared library that holds ``address``; None where it cannot be told."""
    if not address:
        return None
    try:
        if sys.platform == "win32":
            kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
            handle = ctypes.c_void_p()
            # GET_MODULE_HANDLE_EX_FLAG_FROM_ADDRESS | GET_MODULE_HANDLE_EX_FLAG_UNCHANGED_REFCOUNT
            if not kernel32.GetModuleHandleExW(0x4 | 0x2, ctypes.c_void_p(address), ctypes.byref(handle)):
                return None
            buffer = ctypes.create_unicode_buffer(32768)
            if not kernel32.GetModuleFileNameW(handle, buffer, len(buffer)):
                return None
            return Path(buffer.value).name

        class DlInfo(ctypes.Structure):
            _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                        ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]

        dladdr = ctypes.CDLL(None).dladdr
        dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
        dladdr.restype = ctypes.c_int
        info = DlInfo()
        if not dladdr(ctypes.c_void_p(address), ctypes.byref(info)) or not info.dli_fname:
            return None
        return Path(os.fsdecode(info.dli_fname)).name
    except (OSError, AttributeError, ValueError):
        return None
