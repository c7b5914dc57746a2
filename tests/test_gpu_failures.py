"""Simulated GPU failures (audit a12): a GPU that loads but fails to compute, a damaged
gpu-checks.json, a GPU that is gone by the time the model loads, and a GPU load that
fails. There is no GPU here: the devices, their handles and llama.cpp's errors are made
up, and every model really loads on this CPU."""

from __future__ import annotations

import json

import pytest

from iris_desktop.cli import main
from iris_desktop.generation import GenerationRequest
from iris_desktop.runtime import llama_binding, loading
from iris_desktop.runtime.gguf import read_gguf_info
from iris_desktop.runtime.gpu import Device, GiB, GpuChecks, cpu_plan, fewer
from iris_desktop.runtime.model import LocalModel

from support.gpu import CPU, llama_errors

GPU = Device("Vulkan0", "Fake Arc", "gpu", "Vulkan", 6 * GiB, 6 * GiB, index=1, driver="Mesa 23.2")
HI = GenerationRequest([{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0)


@pytest.fixture
def gpu_that_cannot_compute(monkeypatch):
    """Loads asked for the GPU load (on the CPU, for real) and then fail at every eval,
    as llama_decode does after ErrorDeviceLost. Counts the loads asked for the GPU."""
    real = llama_binding.load_llama
    seen = {"gpu_loads": 0}

    def load(path, scratch, progress, cancel, device=None, **params):
        on_gpu = params["n_gpu_layers"] > 0
        if on_gpu:
            seen["gpu_loads"] += 1
            params.update(loading.cpu_only_params())
            device = None
        llm = real(path, scratch, progress, cancel, device=device, **params)
        if on_gpu:
            def eval_fails(tokens):
                llama_errors("ggml_vulkan: vk::Queue::submit: ErrorDeviceLost",
                             "llama_decode: failed to decode, ret = -3")
                raise RuntimeError("llama_decode returned -3")

            llm.eval = eval_fails
        return llm

    monkeypatch.setattr(llama_binding, "load_llama", load)
    monkeypatch.setattr("iris_desktop.runtime.devices.device_handle", lambda device: 0xDEAD)
    return seen


def test_a_gpu_that_fails_to_compute_in_the_check_is_switched_off_and_remembered(
        model_path, tmp_path, gpu_that_cannot_compute):
    """Before: the first-use check only logged "could not run" and kept the GPU plan, so
    every reply failed, at every start, and nothing was recorded. Now: the GPU is recorded
    as failing, the CPU runs the model, and the sentence names the cause."""
    record = tmp_path / "gpu-checks.json"
    model = LocalModel.load(model_path, n_ctx=1024, gpu="auto", devices=[CPU, GPU], gpu_checks=record)
    try:
        assert model.gpu.describe() == "CPU" and model.gpu.notice
        assert model.gpu.reason == ("Fake Arc failed to compute in Iris's first-use check (the driver lost the "
                                    "device); it stays off for Iris until its driver changes")
        assert "".join(model.stream(HI))  # the reply runs on the CPU
    finally:
        model.close()
    entry = json.loads(record.read_text())["checks"]["Fake Arc|Mesa 23.2"]
    assert entry["agrees"] is False and entry["detail"] == "it failed to compute: the driver lost the device"
    assert gpu_that_cannot_compute["gpu_loads"] == 1  # the check's, never the model's
    # the next start believes the record: no check, no GPU load, the CPU
    again = LocalModel.load(model_path, n_ctx=1024, gpu="auto", devices=[CPU, GPU], gpu_checks=record)
    again.close()
    assert gpu_that_cannot_compute["gpu_loads"] == 1 and again.gpu.describe() == "CPU"
    assert again.gpu.reason.startswith("Fake Arc is off for Iris: it failed to compute in Iris's first-use check")


@pytest.mark.parametrize("entry", [{"agrees": False}, {"agrees": True}, {"agrees": False, "detail": 3}])
def test_the_devices_command_reads_a_check_without_its_detail(capsys, tmp_path, model_path, monkeypatch,
                                                               entry):
    """Before: an entry without ``detail`` crashed ``iris-desktop devices`` ("unexpected
    error (KeyError: 'detail'); this is a bug in Iris"). Now: the entry's outcome is said."""
    monkeypatch.setattr("iris_desktop.runtime.devices.list_devices", lambda: [CPU, GPU])
    data = tmp_path / "d"
    data.mkdir()
    (data / "gpu-checks.json").write_text(json.dumps({"checks": {"Fake Arc|Mesa 23.2": entry}}))
    code = main(["--data-dir", str(data), "--set", f"model.path={model_path}", "devices"])
    out = capsys.readouterr().out
    assert code == 0
    said = "it agreed with the CPU" if entry["agrees"] else "it did not agree with the CPU (off for Iris"
    assert f"first-use check: {said}" in out


def test_a_deeply_nested_checks_record_is_unreadable_not_a_crash(capsys, tmp_path, model_path, monkeypatch):
    """Before: a gpu-checks.json of 100,000 ``[`` raised RecursionError out of ``devices``
    and out of the model's load (its plan is made before the load's own error handling).
    Now: it is read as unreadable, as garbage already was: checked again."""
    monkeypatch.setattr("iris_desktop.runtime.devices.list_devices", lambda: [CPU, GPU])
    data = tmp_path / "d"
    data.mkdir()
    (data / "gpu-checks.json").write_bytes(b"[" * 100_000)
    assert GpuChecks(data / "gpu-checks.json").result(GPU) is None
    code = main(["--data-dir", str(data), "--set", f"model.path={model_path}", "devices"])
    assert code == 0 and "not checked against the CPU yet" in capsys.readouterr().out
    plan = loading.plan_device(read_gguf_info(model_path), 1024, "auto", [CPU, GPU], data / "gpu-checks.json",
                               swa_full=False, flash_attn=True)
    assert plan.device == GPU


def test_a_gpu_gone_before_the_load_runs_on_the_cpu_and_records_nothing(model_path, tmp_path, monkeypatch):
    """Before: a GPU listed but without a llama.cpp handle at load time was "checked" on the
    CPU twice, recorded as agreeing, and the sentence blamed llama.cpp ("llama.cpp put no
    layer on …"). Now: the CPU runs the model, the sentence says the GPU is gone, and no
    check is recorded."""
    real = llama_binding.load_llama
    layers = []

    def spy(path, scratch, progress, cancel, device=None, **params):
        layers.append(params["n_gpu_layers"])
        return real(path, scratch, progress, cancel, device=device, **params)

    monkeypatch.setattr(llama_binding, "load_llama", spy)
    monkeypatch.setattr("iris_desktop.runtime.devices.device_handle", lambda device: None)
    record = tmp_path / "gpu-checks.json"
    model = LocalModel.load(model_path, n_ctx=1024, gpu="auto", devices=[CPU, GPU], gpu_checks=record)
    model.close()
    assert model.gpu.describe() == "CPU" and model.gpu.notice
    assert model.gpu.reason == "Fake Arc is no longer among llama.cpp's devices, so the CPU runs the model"
    assert not record.exists() or "Fake Arc" not in record.read_text()
    assert not any(layers)  # nothing was asked of the GPU


def test_a_load_that_fails_on_the_gpu_says_why_and_the_layers_tried(model_path, monkeypatch):
    """Before: "the model did not load on Fake Arc (6 layers), so it runs on the CPU": the
    cause (out of device memory) and the earlier tries were only in the log. Now: the first
    llama.cpp error, in plain words, and every layer count tried."""
    real = llama_binding.load_llama
    tried = []

    def flaky(path, scratch, progress, cancel, device=None, **params):
        tried.append(params["n_gpu_layers"])
        if params["n_gpu_layers"]:
            llama_errors("ggml_vulkan: Device memory allocation of size 1073741824 failed. "
                         "vk::Device::allocateMemory: ErrorOutOfDeviceMemory",
                         "llama_model_load: error loading model: unable to allocate Vulkan0 buffer")
            raise ValueError("Failed to load model from file")
        return real(path, scratch, progress, cancel, device=device, **params)

    monkeypatch.setattr(llama_binding, "load_llama", flaky)
    monkeypatch.setattr("iris_desktop.runtime.devices.device_handle", lambda device: 0xDEAD)
    model = LocalModel.load(model_path, n_ctx=1024, gpu="auto", devices=[CPU, GPU])
    model.close()
    assert tried == [25, 12, 6, 0] and model.gpu.describe() == "CPU"
    assert model.gpu.reason == ("the model did not load on Fake Arc (out of device memory at 25, 12 and 6 "
                                "layers), so it runs on the CPU")


def test_a_one_layer_load_that_fails_says_layer_not_layers(model_path):
    """Before: "(1 layers)". Now: "1 layer"; and an error without a known cause is said
    without its source prefixes."""
    info = read_gguf_info(model_path)
    plan = loading.plan_gpu(info, 1024, [CPU, GPU], 1)
    assert plan.layers == 1
    after = fewer(plan, 0)
    assert after is not None and after.reason == ("the model did not load on Fake Arc (tried with 1 layer), "
                                                  "so it runs on the CPU")
    assert fewer(cpu_plan(25, "x")) is None
    from iris_desktop.runtime.gpu import short_error

    assert short_error(["llama_model_load: error loading model: unable to allocate Vulkan0 buffer"]) == \
        "error loading model: unable to allocate Vulkan0 buffer"
    assert short_error([], "Failed to load model from file") == "Failed to load model from file"
    assert short_error([]) == ""
