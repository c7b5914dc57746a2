"""Two processes changing the GPU records at once (an audit: a window recording one GPU's
first-use check while ``devices --check-again`` forgot another's lost the window's record
in 4 runs of 5 under load). Each read-change-write now holds the file's lock."""

from __future__ import annotations

import json
import multiprocessing

from iris_desktop.runtime.gpu import Device, GiB
from iris_desktop.runtime.gpu_records import GpuChecks, MeasuredCompute

ROUNDS = 150


def _device(n: int) -> Device:
    return Device(f"Vulkan{n}", f"GPU {n}", "gpu", "Vulkan", GiB, 2 * GiB, index=n, driver="1.0")


def _writer(path: str, n: int, start) -> None:
    start.wait()
    checks = GpuChecks(path)
    measured = MeasuredCompute.beside(path)
    for i in range(ROUNDS):
        checks.record(_device(n * ROUNDS + i), True, "agreed")
        measured.record(_device(n), f"model|{i}", 1 + i)


def _forgetter(path: str, start) -> None:
    start.wait()
    checks = GpuChecks(path)
    for i in range(ROUNDS):
        checks.record(_device(10_000 + i), False, "failed")
        checks.forget(f"GPU {10_000 + i}")


def test_two_processes_changing_the_records_lose_nothing(tmp_path):
    path = tmp_path / "gpu-checks.json"
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    workers = [context.Process(target=_writer, args=(str(path), n, start)) for n in (1, 2)]
    workers.append(context.Process(target=_forgetter, args=(str(path), start)))
    for worker in workers:
        worker.start()
    start.set()
    for worker in workers:
        worker.join(120)
        assert worker.exitcode == 0
    kept = json.loads(path.read_text())["checks"]
    written = {GpuChecks.key(_device(n * ROUNDS + i)) for n in (1, 2) for i in range(ROUNDS)}
    assert set(kept) == written  # each writer's every record, the forgotten ones gone
    compute = json.loads(path.with_name("gpu-compute.json").read_text())["compute"]
    assert len(compute) == 2 * ROUNDS
