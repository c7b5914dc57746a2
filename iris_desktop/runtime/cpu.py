"""How many threads llama.cpp should use: the physical cores this process may run on.

llama-cpp-python's own default is half the logical CPUs for generation and all of them
for prompt evaluation. On a machine without SMT (most VMs: 2 vCPUs are 2 cores) that
leaves half the cores idle while a reply is generated; on one with SMT the second thread
of a core adds little to matrix work and its spin-waits cost. llama.cpp's own tools
default to the physical cores (``cpu_get_num_physical_cores``), and so does Iris:

- Linux: the distinct cores (``topology/core_cpus_list``, or ``thread_siblings_list``)
  of the CPUs in this process's affinity mask, capped by a cgroup CPU quota
  (``cpu.max``), so a container limited to 2 CPUs on a 64-core host uses 2 threads;
- macOS: the performance cores (``hw.perflevel0.physicalcpu``, else ``hw.physicalcpu``);
- Windows: the processor cores ``GetLogicalProcessorInformation`` lists;
- anywhere it cannot be told: llama.cpp's fallback, the logical CPUs up to 4, else half.

Never raises; the result is at least 1.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import sys
from pathlib import Path

log = logging.getLogger("iris.runtime.cpu")

__all__ = ["physical_cores", "system_memory_bytes"]


def physical_cores(sys_root: Path = Path("/sys"), affinity: set[int] | None = None,
                   platform: str = sys.platform) -> int:
    """Physical cores this process may use (see the module docstring); at least 1.
    ``sys_root`` and ``affinity`` are for tests (Linux)."""
    try:
        if platform.startswith("linux"):
            found = _linux_cores(sys_root, affinity)
        elif platform == "darwin":
            found = _macos_cores()
        elif platform == "win32":
            found = _windows_cores()
        else:
            found = None
    except Exception as exc:  # a probe must never stop a model from loading
        log.debug("physical core detection failed: %s", exc)
        found = None
    if found is None or found < 1:
        found = _fallback(os.cpu_count())
    return max(1, found)


def _fallback(logical: int | None) -> int:
    """llama.cpp's ``cpu_get_num_physical_cores`` when the topology cannot be read."""
    if not logical or logical < 1:
        return 4
    return logical if logical <= 4 else logical // 2


def _linux_cores(sys_root: Path, affinity: set[int] | None) -> int | None:
    if affinity is None:
        affinity = set(os.sched_getaffinity(0))
    cores: set[str] = set()
    for cpu in sorted(affinity):
        topology = sys_root / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
        for name in ("core_cpus_list", "thread_siblings_list"):
            try:
                cores.add(_normalized(topology.joinpath(name).read_text()))
                break
            except OSError:
                continue
        else:  # no topology for this CPU (some containers hide it): count it as a core
            cores.add(f"cpu{cpu}")
    if not cores:
        return None
    quota = _cgroup_cpu_limit(sys_root)
    return min(len(cores), quota) if quota else len(cores)


def _normalized(cpu_list: str) -> str:
    """One spelling of a CPU list ("0-1" and "0,1" are the same core)."""
    cpus: set[int] = set()
    for part in cpu_list.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return ",".join(map(str, sorted(cpus)))


def _cgroup_cpu_limit(sys_root: Path, cgroups: str | None = None) -> int | None:
    """CPUs a cgroup quota allows this process, rounded up: v2 ``cpu.max`` ("quota
    period"), else v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``. None when there is
    no quota or it cannot be read. ``cgroups``: the text of /proc/self/cgroup (tests)."""
    if cgroups is None:
        try:
            cgroups = Path("/proc/self/cgroup").read_text()
        except OSError:
            cgroups = ""
    mount = sys_root / "fs" / "cgroup"
    for line in cgroups.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        path = path.strip().lstrip("/")
        if hierarchy == "0" and not controllers:
            found = _quota(_read(mount / path / "cpu.max"))
        elif "cpu" in controllers.split(","):
            found = _quota(f"{_read(mount / controllers / path / 'cpu.cfs_quota_us')} "
                           f"{_read(mount / controllers / path / 'cpu.cfs_period_us')}")
        else:
            continue
        if found:
            return found
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _quota(text: str) -> int | None:
    """CPUs of a "quota period" pair; None for "max", -1 (v1's no quota) or nonsense."""
    try:
        quota, period = (int(x) for x in text.split())
    except ValueError:
        return None
    return max(1, math.ceil(quota / period)) if quota > 0 and period > 0 else None


def _macos_cores() -> int | None:
    libc = ctypes.CDLL("/usr/lib/libSystem.B.dylib")
    for name in (b"hw.perflevel0.physicalcpu", b"hw.physicalcpu"):
        value = ctypes.c_int(0)
        size = ctypes.c_size_t(ctypes.sizeof(value))
        if libc.sysctlbyname(name, ctypes.byref(value), ctypes.byref(size), None, ctypes.c_size_t(0)) == 0:
            if value.value > 0:
                return value.value
    return None


def _windows_cores() -> int | None:
    class _Info(ctypes.Structure):  # SYSTEM_LOGICAL_PROCESSOR_INFORMATION
        _fields_ = [("mask", ctypes.c_size_t), ("relationship", ctypes.c_int),
                    ("union", ctypes.c_ulonglong * 2)]

    kernel32 = ctypes.windll.kernel32  # type: ignore[attr-defined]
    size = ctypes.c_ulong(0)
    kernel32.GetLogicalProcessorInformation(None, ctypes.byref(size))
    count = size.value // ctypes.sizeof(_Info)
    if not count:
        return None
    buffer = (_Info * count)()
    if not kernel32.GetLogicalProcessorInformation(buffer, ctypes.byref(size)):
        return None
    relation_processor_core = 0
    return sum(1 for info in buffer[: size.value // ctypes.sizeof(_Info)]
               if info.relationship == relation_processor_core) or None


def system_memory_bytes() -> int | None:
    """The computer's physical memory (None when it cannot be told)."""
    if sys.platform.startswith("win"):
        class _Status(ctypes.Structure):
            _fields_ = [("length", ctypes.c_ulong), ("load", ctypes.c_ulong),
                        ("total", ctypes.c_ulonglong), ("avail", ctypes.c_ulonglong),
                        ("page_total", ctypes.c_ulonglong), ("page_avail", ctypes.c_ulonglong),
                        ("virtual_total", ctypes.c_ulonglong), ("virtual_avail", ctypes.c_ulonglong),
                        ("extended", ctypes.c_ulonglong)]

        status = _Status()
        status.length = ctypes.sizeof(_Status)
        try:
            if ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(status)):  # type: ignore[attr-defined]
                return int(status.total)
        except (AttributeError, OSError):
            return None
        return None
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
