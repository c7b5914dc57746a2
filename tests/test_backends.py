"""iris_desktop/runtime/backends.py against the real llama.cpp of this environment.

The developer's llama-cpp-python has its CPU backend linked in, so here load_backends() finds it
registered and loads nothing; the installers' build (GGML_BACKEND_DL, one CPU backend per x86-64
level) is exercised by packaging/build.py's self-test of the frozen app, normally and under
``qemu-x86_64 -cpu Nehalem`` (docs/installers.md)."""

from __future__ import annotations

import platform
import threading

from iris_desktop.runtime.backends import CpuBackend, load_backends


def test_a_cpu_backend_is_there_with_what_it_was_compiled_for():
    backend = load_backends()
    assert "CPU" in backend.registered
    assert backend.library and "ggml-cpu" in backend.library
    assert backend.features  # ggml_backend_get_features of the CPU backend
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert "SSE3" in backend.features
    if not backend.loaded_here:  # linked in: nothing was looked for
        assert backend.lib_dir is None and backend.variant is None


def test_idempotent_and_thread_safe():
    first = load_backends()
    seen: list[CpuBackend] = []
    threads = [threading.Thread(target=lambda: seen.append(load_backends())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 4 and all(b is first for b in seen)


def test_variant_names():
    def named(library):
        return CpuBackend(library=library, features=("SSE3",), loaded_here=True, lib_dir="/x",
                          registered=("CPU",))

    assert named("libggml-cpu-sse42.so").variant == "sse42"
    assert named("ggml-cpu-haswell.dll").variant == "haswell"
    assert named("libggml-cpu-armv8.2_1.so").variant == "armv8.2_1"
    assert named("libggml-cpu.so.0").variant is None
    assert named(None).variant is None
    assert "variant sse42" in named("libggml-cpu-sse42.so").describe()
