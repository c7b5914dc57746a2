"""The thread count Iris gives llama.cpp: the physical cores this process may use
(iris_desktop/runtime/cpu.py), read from a sysfs tree laid out as Linux lays it out."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from iris_desktop.runtime import cpu
from iris_desktop.runtime.cpu import physical_cores


def fake_sysfs(root: Path, siblings: dict[int, str], name: str = "core_cpus_list") -> Path:
    """/sys with one topology file per CPU: ``siblings[cpu]`` is its core's CPU list."""
    for number, cpus in siblings.items():
        topology = root / "devices" / "system" / "cpu" / f"cpu{number}" / "topology"
        topology.mkdir(parents=True)
        (topology / name).write_text(cpus + "\n")
    return root


def test_smt_siblings_count_once(tmp_path):
    # 4 cores with 2 threads each, numbered as Linux numbers them (0-3 first threads, 4-7 second)
    sysfs = fake_sysfs(tmp_path, {n: f"{n % 4},{n % 4 + 4}" for n in range(8)})
    assert physical_cores(sysfs, set(range(8)), "linux") == 4


def test_ranges_and_lists_name_the_same_core(tmp_path):
    # "0-1" and "0,1" are one core; older kernels only have thread_siblings_list
    sysfs = fake_sysfs(tmp_path, {0: "0-1", 1: "0,1", 2: "2-3", 3: "2,3"}, name="thread_siblings_list")
    assert physical_cores(sysfs, {0, 1, 2, 3}, "linux") == 2


def test_no_smt_every_cpu_is_a_core(tmp_path):
    # a VM's vCPUs (this development machine: 2 vCPUs, one thread per core)
    sysfs = fake_sysfs(tmp_path, {0: "0", 1: "1"})
    assert physical_cores(sysfs, {0, 1}, "linux") == 2


def test_only_the_cpus_this_process_may_run_on(tmp_path):
    sysfs = fake_sysfs(tmp_path, {n: f"{n % 4},{n % 4 + 4}" for n in range(8)})
    assert physical_cores(sysfs, {0, 4}, "linux") == 1  # taskset to one core's two threads
    assert physical_cores(sysfs, {0, 1, 5}, "linux") == 2


def test_a_cpu_without_topology_counts_as_a_core(tmp_path):
    sysfs = fake_sysfs(tmp_path, {0: "0,2", 2: "0,2"})
    assert physical_cores(sysfs, {0, 1, 2}, "linux") == 2


@pytest.mark.parametrize("cgroups,files,expected", [
    ("0::/\n", {"cpu.max": "200000 100000"}, 2),  # cgroup v2: docker --cpus 2
    ("0::/user.slice\n", {"user.slice/cpu.max": "150000 100000"}, 2),  # 1.5 CPUs: rounded up
    ("0::/\n", {"cpu.max": "max 100000"}, None),  # no quota
    ("3:cpu,cpuacct:/job\n", {"cpu,cpuacct/job/cpu.cfs_quota_us": "100000",
                              "cpu,cpuacct/job/cpu.cfs_period_us": "100000"}, 1),  # cgroup v1
    ("3:cpu,cpuacct:/\n", {"cpu,cpuacct/cpu.cfs_quota_us": "-1",
                           "cpu,cpuacct/cpu.cfs_period_us": "100000"}, None),  # v1, no quota
    ("0::/\n", {}, None),  # nothing readable
])
def test_cgroup_quota(tmp_path, cgroups, files, expected):
    for name, text in files.items():
        path = tmp_path / "fs" / "cgroup" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    assert cpu._cgroup_cpu_limit(tmp_path, cgroups) == expected


def test_a_quota_caps_the_cores(tmp_path, monkeypatch):
    sysfs = fake_sysfs(tmp_path, {n: str(n) for n in range(8)})
    monkeypatch.setattr(cpu, "_cgroup_cpu_limit", lambda _root: 3)
    assert physical_cores(sysfs, set(range(8)), "linux") == 3


def test_unknown_topology_falls_back_as_llama_cpp_does(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert physical_cores(platform="plan9") == 8  # more than 4 logical CPUs: half
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert physical_cores(platform="plan9") == 3
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert physical_cores(platform="plan9") == 4


def test_a_failing_probe_never_stops_a_load(tmp_path, monkeypatch):
    def broken(*_args):
        raise RuntimeError("no sysctl here")

    monkeypatch.setattr(cpu, "_macos_cores", broken)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert physical_cores(platform="darwin") == 2


def test_this_machine_has_at_least_one_core_and_no_more_than_its_cpus():
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert 1 <= physical_cores() <= allowed
