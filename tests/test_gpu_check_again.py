"""``iris-desktop devices --check-again [DEVICE]``: a GPU switched off for Iris (its
first-use check disagreed, or it failed in use in two runs in a row) is checked against
the CPU again at the next load, without deleting ``gpu-checks.json`` by hand (before: the
only way, and the sentences said so).

There is no GPU here (:mod:`support.gpu`: the real bundled model loaded on this CPU, a
made-up device); every command runs through the real CLI on a real data folder."""

from __future__ import annotations

import json

import pytest

from iris_desktop.paths import app_paths
from iris_desktop.runtime import gpu_records as gpu
from iris_desktop.runtime.gpu import GpuChecks

from support.faults import full_disk
from support.gpu import ARC, CPU, SimulatedGpu, checked_again_on_the_gpu, simulate_gpu
from support.gpu import load_on_gpu as _load
from support.gpu import reply_fails as _reply_fails
from support.helpers import one_sentence, run_cli

GPU = ARC
KEY = "Fake Arc|Mesa 23.2"
ERROR = "the driver lost the device; llama_decode returned -3"
COMMAND = 'iris-desktop devices --check-again "Fake Arc"'
NEXT = ("The next load of a model on Fake Arc (the next start of Iris, or Model ▸ Reload in a running window) "
        "checks it against the CPU again, and uses it if it agrees")
#: a record of another GPU, not listed now (another computer's card, an old driver)
OTHER = {"device": "Old Card", "backend": "Vulkan", "driver": "1.0", "agrees": False, "detail": "step 2 of 8",
         "reason": "its answers differed", "checked": "2025-01-01T00:00:00+0000"}


@pytest.fixture
def fake_gpu(monkeypatch) -> SimulatedGpu:
    return simulate_gpu(monkeypatch, GPU)


def _records(data, *entries: tuple[str, dict]) -> bytes:
    """gpu-checks.json in ``data`` with these records; its bytes."""
    data.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"version": 1, "checks": dict(entries)}, indent=2).encode()
    (data / "gpu-checks.json").write_bytes(text)
    return text


def _checks(data) -> dict:
    return json.loads((data / "gpu-checks.json").read_text())["checks"]


def test_a_gpu_off_after_two_failing_runs_is_checked_again_after_the_command(
        capsys, model_path, tmp_path, fake_gpu, monkeypatch):
    """Before: the sentence said "delete <data folder>/gpu-checks.json to check it again",
    and there was no command. Now: the sentence, the plan's reason and ``devices`` name the
    command; it says what it forgot and what happens next; the next load runs the first-use
    check again and uses the GPU; and the count of failing runs starts again (a failure
    after is a first one, off for its run only)."""
    record = tmp_path / "gpu-checks.json"
    fake_gpu.failing = "all"
    for run in ("run 1", "run 2"):
        monkeypatch.setattr(gpu, "THIS_RUN", run)
        said = _reply_fails(model_path, record)
    assert said.endswith(f"until the GPU's driver changes (run '{COMMAND}' to check it again)")
    assert "gpu-checks.json" not in said and "delete" not in said

    monkeypatch.setattr(gpu, "THIS_RUN", "run 3")
    fake_gpu.failing = None
    off = _load(model_path, record)
    off.close()
    assert off.gpu.describe() == "CPU" and off.gpu.reason.endswith(f"(run '{COMMAND}' to check it again)")
    code, out, err = run_cli(capsys, "--data-dir", tmp_path, "--set", f"model.path={model_path}", "devices")
    assert code == 0 and f"  '{COMMAND}' has Fake Arc checked against the CPU again at the next load\n" in out

    code, out, err = run_cli(capsys, "--data-dir", tmp_path, "devices", "--check-again", "Fake Arc")
    assert (code, err) == (0, "")
    assert out == (f"Forgot the first-use check of Fake Arc (driver Mesa 23.2): it failed in use in 2 runs of Iris "
                   f"in a row, the last during a reply: {ERROR} (it was off for Iris until its driver changed); its "
                   f"count of runs of Iris in a row that failed in use (2) starts again\n{NEXT}\n")
    assert KEY not in _checks(tmp_path)
    code, out, _ = run_cli(capsys, "--data-dir", tmp_path, "--set", f"model.path={model_path}", "devices")
    assert "— not checked against the CPU yet (the first load on it does)" in out
    assert "--check-again" not in out

    checked_again_on_the_gpu(fake_gpu, model_path, record)

    monkeypatch.setattr(gpu, "THIS_RUN", "run 4")
    fake_gpu.failing = "all"
    assert _reply_fails(model_path, record).endswith("Iris runs the model on the CPU until it restarts, and "
                                                     "checks the GPU again then")  # a first failure again
    assert _checks(tmp_path)[KEY]["failed_runs"] == 1


def test_a_gpu_named_by_ggml_name_forgets_its_records_and_keeps_the_others(capsys, tmp_path, fake_gpu):
    """A GPU named as ``devices`` lists it (ggml's name, any case) forgets its records with
    every driver; another GPU's record is kept as it was, and can be named too though
    llama.cpp no longer lists it; a record that agreed is said as such."""
    data = tmp_path / "d"
    _records(data, (KEY, {"agrees": True, "detail": "the same top token at all 8 steps"}),
             ("Fake Arc|Mesa 22.0", {"agrees": False, "detail": "step 3 of 8: the GPU's top token ' Rome' is not "
                                     "the CPU's ' Paris'"}),
             ("Old Card|1.0", OTHER))
    code, out, err = run_cli(capsys, "--data-dir", data, "devices", "--check-again", "vulkan0")
    assert (code, err) == (0, "")
    assert out == ("Forgot the first-use check of Fake Arc (driver Mesa 23.2): the same top token at all 8 steps "
                   "(it was used)\n"
                   "Forgot the first-use check of Fake Arc (driver Mesa 22.0): step 3 of 8: the GPU's top token "
                   "' Rome' is not the CPU's ' Paris' (it was off for Iris until its driver changed)\n"
                   f"{NEXT}\n")
    assert _checks(data) == {"Old Card|1.0": OTHER}

    code, out, err = run_cli(capsys, "--data-dir", data, "devices", "--check-again", "Old Card", "--json")
    assert (code, err) == (0, "")
    said = json.loads(out)
    assert said["device"] == "Old Card" and said["problem"] is None
    assert said["forgot"] == [{"key": "Old Card|1.0", "record": OTHER}]
    assert said["record"] == str(data / "gpu-checks.json") and _checks(data) == {}


def test_check_again_without_a_device_forgets_every_record(capsys, tmp_path, fake_gpu):
    data = tmp_path / "d"
    _records(data, (KEY, {"agrees": False, "detail": "it failed during a reply: x", "run": "run 1"}),
             ("Old Card|1.0", OTHER), ("Broken|?", "not a record"))
    code, out, err = run_cli(capsys, "--data-dir", data, "devices", "--check-again")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "Forgot the first-use check of Fake Arc (driver Mesa 23.2): it failed during a reply: x (it was off for "
        "the run of Iris that saw it)",
        "Forgot the first-use check of Old Card (driver 1.0): step 2 of 8 (it was off for Iris until its driver "
        "changed)",
        "Forgot the first-use check of Broken (driver ?): a damaged record",
        "The next load of a model on a GPU (the next start of Iris, or Model ▸ Reload in a running window) checks "
        "it against the CPU again, and uses it if it agrees"]
    assert _checks(data) == {}


def test_an_unknown_device_or_the_cpu_is_refused_and_nothing_changes(capsys, tmp_path, fake_gpu):
    """One sentence that names the GPUs there are (llama.cpp's and the record's), exit 2,
    the record untouched."""
    data = tmp_path / "d"
    before = _records(data, (KEY, {"agrees": False, "detail": "x"}), ("Old Card|1.0", OTHER))
    code, out, err = run_cli(capsys, "--data-dir", data, "devices", "--check-again", "Fake GeForce")
    assert code == 2 and out == "" and one_sentence(err)
    assert err == ("iris-desktop: no GPU is named 'Fake GeForce': llama.cpp lists Vulkan0 (Fake Arc); the record "
                   "also names Old Card; name one of them as 'iris-desktop devices' lists it, or leave DEVICE out "
                   "to check every GPU again\n")
    code, out, err = run_cli(capsys, "--data-dir", data, "devices", "--check-again", "CPU")
    assert code == 2 and out == "" and one_sentence(err)
    assert err.startswith("iris-desktop: CPU is not a GPU: the first-use check compares a GPU's answers with the "
                          "CPU's and keeps no record of the CPU")
    assert (data / "gpu-checks.json").read_bytes() == before
    (data / "gpu-checks.json").unlink()
    code, out, err = run_cli(capsys, "--data-dir", data, "devices", "--check-again", "Old Card")
    assert code == 2 and one_sentence(err) and "llama.cpp lists Vulkan0 (Fake Arc); name one of them" in err


def test_no_record_has_nothing_to_forget(capsys, tmp_path, fake_gpu):
    data = tmp_path / "d"
    for argv, whose in ((["--check-again"], "a GPU"), (["--check-again", "Fake Arc"], "Fake Arc")):
        code, out, err = run_cli(capsys, "--data-dir", data, "devices", *argv)
        assert (code, err) == (0, "")
        assert out == (f"No first-use check of {whose} is recorded: the first load of a model on it checks it "
                       "against the CPU\n")
    assert not (data / "gpu-checks.json").exists()
    _records(data, ("Old Card|1.0", OTHER))
    code, out, err = run_cli(capsys, "--data-dir", data, "devices", "--check-again", "Fake Arc")
    assert code == 0 and out.startswith("No first-use check of Fake Arc is recorded")
    assert _checks(data) == {"Old Card|1.0": OTHER}


@pytest.mark.parametrize(("damage", "why"), [
    (b'{"checks": {"Fake Arc|Mesa 23.2": {"agrees": fal', "it is not JSON: Expecting value at line 1, column 46"),
    (b"[" * 100_000, "it is nested too deep"),
    (b"\xff\xfe{}", "it is not UTF-8 text"),
])
def test_a_damaged_record_is_said_in_one_sentence_and_left_as_it_is(capsys, tmp_path, fake_gpu, damage, why):
    """Nothing can be forgotten from a file that cannot be read, and nothing needs to be:
    Iris already checks every GPU again at the next load then. One sentence, exit 0, the
    file's bytes kept."""
    data = tmp_path / "d"
    data.mkdir()
    (data / "gpu-checks.json").write_bytes(damage)
    code, out, err = run_cli(capsys, "--data-dir", data, "devices", "--check-again", "Fake Arc")
    assert (code, err) == (0, "")
    assert out == (f"{data / 'gpu-checks.json'} cannot be read ({why}), so Iris checks every GPU against the CPU "
                   "again at its next load anyway; the file is left as it is, and that load writes it anew\n")
    assert (data / "gpu-checks.json").read_bytes() == damage
    assert GpuChecks(data / "gpu-checks.json").result(GPU) is None  # as the sentence says: checked again


def test_a_record_that_cannot_be_written_changes_nothing(capsys, tmp_path, fake_gpu):
    """On a full disk: one sentence naming the file and the cause, exit 1, the record as
    it was (the GPU stays as it was recorded)."""
    with full_disk(tmp_path) as disk:
        data = disk.path / "d"
        app_paths(data).ensure()
        before = _records(data, (KEY, {"agrees": False, "detail": "x"}))
        disk.fill()
        code, out, err = run_cli(capsys, "--data-dir", data, "devices", "--check-again", "Fake Arc")
        assert code == 1 and out == "" and one_sentence(err)
        assert err == (f"iris-desktop: cannot forget the first-use check: {data / 'gpu-checks.json'} cannot be "
                       "written (No space left on device); nothing was changed\n")
        assert (data / "gpu-checks.json").read_bytes() == before


def test_a_device_named_where_there_is_no_gpu_at_all_says_so(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("iris_desktop.runtime.devices.list_devices", lambda: [CPU])
    code, out, err = run_cli(capsys, "--data-dir", tmp_path / "d", "devices", "--check-again", "Vulkan0")
    assert code == 2 and out == "" and one_sentence(err)
    assert err == ("iris-desktop: no GPU is named 'Vulkan0': llama.cpp lists no GPU on this computer and no GPU "
                   "check is recorded, so there is nothing to check again\n")


def test_a_named_pipe_or_a_huge_file_in_the_records_place_holds_nothing_up(tmp_path):
    """An audit: a named pipe (FIFO) at gpu-checks.json held `chat`, `devices` and
    `devices --check-again` for ever (reading it waited for a writer); a 45 MB record was
    read whole. Real processes, so that a wait fails the test instead of holding it."""
    import os
    import subprocess
    import sys

    data = tmp_path / "d"
    data.mkdir()
    os.mkfifo(data / "gpu-checks.json")
    env = {**os.environ, "IRIS_HOME": str(data)}
    command = [sys.executable, "-m", "iris_desktop", "--data-dir", str(data), "devices"]
    listed = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    again = subprocess.run([*command, "--check-again"], capture_output=True, text=True, timeout=120, env=env)
    assert again.returncode == 0 and again.stdout == (
        f"{data / 'gpu-checks.json'} cannot be read (it is a named pipe (FIFO), not a file), so Iris checks "
        "every GPU against the CPU again at its next load anyway; the file is left as it is, and that load "
        "writes it anew\n"), again.stderr
    assert GpuChecks(data / "gpu-checks.json").disabled([GPU]) == {}  # a load's read: nothing, at once

    (data / "gpu-checks.json").unlink()
    (data / "gpu-checks.json").write_bytes(b" " * (2**20 + 1))
    again = subprocess.run([*command, "--check-again"], capture_output=True, text=True, timeout=120, env=env)
    assert "cannot be read (it is larger than 1 MB, more than a GPU record ever is)" in again.stdout
