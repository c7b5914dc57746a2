"""A GPU that passes the first-use check but fails in use (a reply, a warm-up) at every
start: the first failure is off for that run only (a one-off, another app holding its
memory, must not switch a GPU off for good), the second run in a row that fails keeps
it off until its driver changes, saying how to check it again; a run in which it worked
starts the count again.

There is no GPU here (:mod:`support.gpu`: the real bundled model loaded on this CPU, a
made-up device); a "run" of Iris is :data:`iris_desktop.runtime.gpu_records.THIS_RUN`, set as a
new process would have it."""

from __future__ import annotations

import json

import pytest

from iris_desktop.cli import main
from iris_desktop.runtime import gpu_records as gpu
from iris_desktop.runtime.errors import GpuFailed
from iris_desktop.runtime.gpu import Device, GiB, GpuChecks

from support.gpu import ARC, CPU, HI, SimulatedGpu, checked_again_on_the_gpu, simulate_gpu
from support.gpu import load_on_gpu as _load
from support.gpu import reply_fails as _reply_fails

GPU = ARC
KEY = "Fake Arc|Mesa 23.2"
ERROR = "the driver lost the device; llama_decode returned -3"
#: what the first run's failure says: off until Iris restarts (as before)
ONCE = (f"Fake Arc, the GPU it runs on, failed during the reply ({ERROR}); Iris runs the model on the "
        "CPU until it restarts, and checks the GPU again then")
ONCE_OFF = (f"Fake Arc is off for Iris: it failed during a reply ({ERROR}); it stays off until Iris "
            "restarts, which checks it again")


#: how the user has it checked again (before: "delete <data folder>/gpu-checks.json")
AGAIN = "run 'iris-desktop devices --check-again \"Fake Arc\"' to check it again"


def twice(record) -> str:
    """What the second run in a row's failure says."""
    return (f"Fake Arc, the GPU it runs on, failed during the reply ({ERROR}), in 2 runs of Iris in a row; "
            f"Iris runs the model on the CPU until the GPU's driver changes ({AGAIN})")


def off_for_good(record, last: str = "a reply") -> str:
    """Why the GPU is off at the next load (the plan's reason, the status bar's notice)."""
    return (f"Fake Arc is off for Iris: it failed in use in 2 runs of Iris in a row, the last time during {last} "
            f"({ERROR}); it stays off until its driver changes ({AGAIN})")


@pytest.fixture
def fake_gpu(monkeypatch) -> SimulatedGpu:
    return simulate_gpu(monkeypatch, GPU)


def _start(monkeypatch, run: str) -> None:
    """Iris starts again: another process, another :data:`~iris_desktop.runtime.gpu_records.THIS_RUN`."""
    monkeypatch.setattr(gpu, "THIS_RUN", run)


def _entry(record) -> dict:
    return json.loads(record.read_text())["checks"][KEY]


def test_a_gpu_that_fails_in_use_in_two_runs_in_a_row_stays_off_until_its_driver_changes(
        capsys, model_path, tmp_path, fake_gpu, monkeypatch):
    """Before: every start checked the GPU again, it passed, and the first reply failed on
    it: one failed reply per start, forever. Now: the first run's failure is off for that
    run only, as before; the second run in a row that fails keeps the GPU off until its
    driver changes, in a sentence that says how to check it again; the third run plans
    the CPU at once (no check, no failed reply), and `devices` says so."""
    record = tmp_path / "gpu-checks.json"
    fake_gpu.failing = "all"
    _start(monkeypatch, "run 1")
    assert _reply_fails(model_path, record) == ONCE
    assert fake_gpu.loads == [0, 25, 25]  # the first-use check (CPU, GPU), then the model
    assert _entry(record)["failed_runs"] == 1 and _entry(record)["run"] == "run 1"
    again = _load(model_path, record)  # a reload in the same run: the CPU, until Iris restarts
    try:
        assert again.gpu.describe() == "CPU" and again.gpu.reason == ONCE_OFF
    finally:
        again.close()

    _start(monkeypatch, "run 2")
    loads = len(fake_gpu.loads)
    assert _reply_fails(model_path, record) == twice(record)  # checked again (it passes), on, fails
    assert fake_gpu.loads[loads:] == [0, 25, 25]
    entry = _entry(record)
    assert entry["failed_runs"] == 2 and entry["agrees"] is False and "run" not in entry

    _start(monkeypatch, "run 3")
    loads = len(fake_gpu.loads)
    fake_gpu.failing = None
    third = _load(model_path, record)
    try:
        assert third.gpu.describe() == "CPU" and third.gpu.notice
        assert third.gpu.reason == off_for_good(record)
        assert "".join(third.stream(HI))  # the reply comes, on the CPU
    finally:
        third.close()
    assert fake_gpu.loads[loads:] == [0]  # no first-use check, no GPU load
    assert main(["--data-dir", str(tmp_path), "--set", f"model.path={model_path}", "devices"]) == 0
    assert (f"— first-use check: it failed in use in 2 runs of Iris in a row, the last during a reply: {ERROR} "
            "(off for Iris until its driver changes)") in capsys.readouterr().out

    newer = Device("Vulkan0", "Fake Arc", "gpu", "Vulkan", 6 * GiB, 6 * GiB, index=1, driver="Mesa 24.0")
    monkeypatch.setattr("iris_desktop.runtime.devices.list_devices", lambda: [CPU, newer])
    updated = _load(model_path, record)  # a new driver: checked again, and used
    try:
        assert updated.gpu.describe() == "GPU: Fake Arc · 25/25 layers"
    finally:
        updated.close()
    monkeypatch.setattr("iris_desktop.runtime.devices.list_devices", lambda: [CPU, GPU])
    record.unlink()  # the record deleted by hand: the GPU is checked again (the command: test_gpu_check_again.py)
    checked_again_on_the_gpu(fake_gpu, model_path, record)


def test_a_run_in_which_the_gpu_worked_starts_the_count_again(model_path, tmp_path, fake_gpu, monkeypatch):
    """A failure, then a run whose replies on the GPU came, then a failure: the last is a
    first failure again, off for its run only (a one-off must not switch a GPU off for
    good). The run that worked read the record once and wrote it once, not per reply."""
    record = tmp_path / "gpu-checks.json"
    fake_gpu.failing = "all"
    _start(monkeypatch, "run 1")
    assert _reply_fails(model_path, record) == ONCE

    _start(monkeypatch, "run 2")
    fake_gpu.failing = None
    model = _load(model_path, record)  # checked again: it passes, the count is kept
    assert _entry(record)["failed_runs"] == 1 and _entry(record)["agrees"] is True
    reads, writes = [], []
    real_read, real_write = GpuChecks._read, GpuChecks._write
    monkeypatch.setattr(GpuChecks, "_read", lambda self: reads.append(1) or real_read(self))
    monkeypatch.setattr(GpuChecks, "_write", lambda self, checks: writes.append(1) or real_write(self, checks))
    try:
        assert model.gpu.describe() == "GPU: Fake Arc · 25/25 layers"
        for _ in range(3):
            assert "".join(model.stream(HI))
    finally:
        model.close()
    assert (len(reads), len(writes)) == (1, 1)  # once in the run, not once per reply
    monkeypatch.setattr(GpuChecks, "_read", real_read)
    monkeypatch.setattr(GpuChecks, "_write", real_write)
    assert _entry(record)["worked_run"] == "run 2"

    _start(monkeypatch, "run 3")
    fake_gpu.failing = "all"
    assert _reply_fails(model_path, record) == ONCE  # a first failure again
    entry = _entry(record)
    assert entry["failed_runs"] == 1 and entry["run"] == "run 3" and "worked_run" not in entry
    same = _load(model_path, record)
    try:
        assert same.gpu.describe() == "CPU" and same.gpu.reason == ONCE_OFF
    finally:
        same.close()

    _start(monkeypatch, "run 4")
    fake_gpu.failing = None
    later = _load(model_path, record)  # checked again, and used
    try:
        assert later.gpu.describe() == "GPU: Fake Arc · 25/25 layers"
    finally:
        later.close()


def test_a_run_whose_warm_up_worked_but_whose_reply_failed_still_counts(model_path, tmp_path, fake_gpu,
                                                                        monkeypatch):
    """A GPU on which the prefill while the user types works but every reply fails: the
    warm-up that worked does not start the count again, as the run's reply failed after
    it, so the second such run keeps the GPU off."""
    record = tmp_path / "gpu-checks.json"
    fake_gpu.failing = "replies"
    for run in ("run 1", "run 2"):
        _start(monkeypatch, run)
        model = _load(model_path, record)
        try:
            assert model.gpu.describe() == "GPU: Fake Arc · 25/25 layers"
            assert list(model.prefill([{"role": "user", "content": "What is the capital of France?"}]))
            assert _entry(record).get("worked_run") == (None if run == "run 1" else run)
            with pytest.raises(GpuFailed) as failed:
                "".join(model.stream(HI))
        finally:
            model.close()
    assert str(failed.value) == twice(record)
    _start(monkeypatch, "run 3")
    third = _load(model_path, record)
    try:
        assert third.gpu.describe() == "CPU" and third.gpu.reason == off_for_good(record)
    finally:
        third.close()


def test_two_failures_in_one_run_count_as_one_run(model_path, tmp_path, fake_gpu, monkeypatch):
    """A warm-up that fails, then the send queued behind it failing on the same GPU: one
    run, so the GPU is off for this run only, and the next run checks it again and uses it."""
    record = tmp_path / "gpu-checks.json"
    fake_gpu.failing = "all"
    _start(monkeypatch, "run 1")
    model = _load(model_path, record)
    try:
        with pytest.raises(GpuFailed):
            list(model.prefill([{"role": "user", "content": "What is the capital of France?"}]))
        with pytest.raises(GpuFailed) as failed:
            "".join(model.stream(HI))
        assert str(failed.value) == ONCE
    finally:
        model.close()
    assert _entry(record)["failed_runs"] == 1
    fake_gpu.failing = None
    for run in ("run 2", "run 3"):
        _start(monkeypatch, run)
        later = _load(model_path, record)
        try:
            assert later.gpu.describe() == "GPU: Fake Arc · 25/25 layers" and "".join(later.stream(HI))
        finally:
            later.close()
    assert "failed_runs" not in _entry(record)  # run 2 worked and did not fail after: cleared by run 3
