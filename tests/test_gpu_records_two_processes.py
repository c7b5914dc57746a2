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


def _fails_in_use(path: str, run: str, both_read, counted) -> None:
    """One run of Iris whose reply fails on the GPU: it reads the count, waits (at most
    2 s) for the other run to have read it too, then writes its own."""
    import threading

    from iris_desktop.runtime import gpu_records

    gpu_records.THIS_RUN = run
    real = GpuChecks.recorded

    def recorded(self, device):
        entry = real(self, device)
        try:
            both_read.wait(2)
        except threading.BrokenBarrierError:  # the other run waits for the lock meanwhile
            pass
        return entry

    GpuChecks.recorded = recorded
    counted.put(GpuChecks(path).failed_in_use(_device(1), "a reply", "ErrorDeviceLost"))


def test_two_runs_failing_at_once_count_two(tmp_path):
    """A review: the count of runs that failed was read outside the lock, so two runs
    failing on one GPU at once both counted one, and it was never switched off."""
    path = tmp_path / "gpu-checks.json"
    context = multiprocessing.get_context("spawn")
    both_read, counted = context.Barrier(2), context.Queue()
    runs = [context.Process(target=_fails_in_use, args=(str(path), f"run {n}", both_read, counted))
            for n in (1, 2)]
    for run in runs:
        run.start()
    for run in runs:
        run.join(60)
        assert run.exitcode == 0
    assert sorted(counted.get(timeout=5) for _ in runs) == [1, 2]
    assert json.loads(path.read_text())["checks"][GpuChecks.key(_device(1))]["failed_runs"] == 2


def test_a_link_in_the_locks_place_is_not_followed(tmp_path):
    """An audit: a link at ``.gpu-checks.json.lock`` made `devices --check-again` create an
    empty file where it pointed. The lock refuses a link; the record is still written."""
    elsewhere = tmp_path / "elsewhere" / "planted"
    elsewhere.parent.mkdir()
    path = tmp_path / "gpu-checks.json"
    (tmp_path / ".gpu-checks.json.lock").symlink_to(elsewhere)
    GpuChecks(path).record(_device(1), True, "agreed")
    assert not elsewhere.exists()
    assert list(json.loads(path.read_text())["checks"]) == [GpuChecks.key(_device(1))]
