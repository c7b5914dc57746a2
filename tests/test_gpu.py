"""model.gpu (issue #46): the setting, the planner on GGUF headers of several shapes and
made-up device memory, llama.cpp's load log, the first-use check and its record, the
load's retries, and ``iris-desktop devices``.

Everything here runs on this CPU-only llama.cpp. The tests marked ``needs_gpu`` load the
bundled model on a real GPU: they skip, saying why, where llama.cpp finds none, and run
under ``make gpu-check`` (a Vulkan build on Mesa's lavapipe, packaging/gpu/check.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from iris_desktop import settings as S
from iris_desktop.cli import main
from iris_desktop.generation import GenerationRequest
from iris_desktop.runtime import first_use, llama_binding, loading
from iris_desktop.runtime.first_use import Step, compare_steps
from iris_desktop.runtime.gguf import read_gguf_info
from iris_desktop.runtime.gpu import (
    Device,
    GiB,
    GpuChecks,
    MeasuredCompute,
    MiB,
    compute_key,
    cpu_plan,
    fewer,
    layer_costs,
    margin,
    offload_from_log,
    plan_gpu,
    sliding_layers,
)
from iris_desktop.runtime.model import LocalModel

from support.gguf_fixtures import tiny_metadata, write_gguf

FAKE_GPU = Device("Vulkan0", "Fake GeForce", "gpu", "Vulkan", 8 * GiB, 8 * GiB, index=7, driver="550.1")


def gpu(free_gib: float, kind: str = "gpu", name: str = "Fake GeForce", total_gib: float = 8.0,
        index: int = 7) -> Device:
    return Device(f"Vulkan{index}", name, kind, "Vulkan", int(free_gib * GiB), int(total_gib * GiB),
                  index=index, driver="1.0")


CPU = Device("CPU", "Test CPU", "cpu", "CPU", 16 * GiB, 16 * GiB, index=0)


# -- the setting ---------------------------------------------------------------------------


def test_model_gpu_is_auto_by_default_and_takes_off_or_a_layer_count():
    setting = S.SETTINGS["model.gpu"]
    assert S.defaults()["model.gpu"] == "auto" and setting.needs_reload
    assert "model.n_gpu_layers" not in S.SETTINGS
    for raw, value in [("auto", "auto"), ("OFF", "off"), ("0", "off"), (0, "off"), ("12", 12), (33, 33),
                       ("1000", 1000)]:
        assert setting.parse(raw) == value
    for bad in ("x", "-1", -3, 1001, True, 2.5):
        with pytest.raises(S.SettingsError, match="'auto', 'off' or a number of layers"):
            setting.parse(bad)
    assert setting.to_text(12) == "12" and setting.to_text("auto") == "auto"


def test_an_older_configs_n_gpu_layers_is_read_as_model_gpu_and_said(tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_text("[model]\nn_gpu_layers = 20\n")
    s = S.load_settings(cfg, {})
    assert s["model.gpu"] == 20 and s.source("model.gpu") == "file"
    assert any("model.n_gpu_layers = 20 is read as model.gpu = 20" in p and "config set model.gpu 20" in p
               for p in s.problems)
    cfg.write_text("[model]\nn_gpu_layers = 0\n")  # the old "CPU only"
    assert S.load_settings(cfg, {})["model.gpu"] == "off"
    cfg.write_text("[model]\nn_gpu_layers = -1\n")  # the old "all"
    assert S.load_settings(cfg, {})["model.gpu"] == 1000
    s = S.load_settings(None, {"IRIS_MODEL_N_GPU_LAYERS": "8"})
    assert s["model.gpu"] == 8 and s.source("model.gpu") == "env"
    assert any("IRIS_MODEL_GPU=8" in p for p in s.problems)
    # the new key wins where both are set, and the old one is named as ignored
    cfg.write_text("[model]\nn_gpu_layers = 20\ngpu = \"off\"\n")
    s = S.load_settings(cfg, {})
    assert s["model.gpu"] == "off" and any("is ignored" in p for p in s.problems)
    # 'config set model.gpu' writes the new key and drops the old line
    cfg.write_text("[model]\nn_gpu_layers = 20\nn_ctx = 4096\n")
    S.write_config_value(cfg, "model.gpu", "auto")
    text = cfg.read_text()
    assert "n_gpu_layers" not in text and 'gpu = "auto"' in text and "n_ctx = 4096" in text
    with pytest.raises(S.SettingsError, match="model.n_gpu_layers is now model.gpu"):
        S.parse_assignments(["model.n_gpu_layers=5"])


def test_the_dialog_edits_model_gpu(qtbot):
    from iris_desktop.ui.settings_editors import GpuEditor, make_editor

    setting = S.SETTINGS["model.gpu"]
    editor = make_editor(setting, 12)
    qtbot.addWidget(editor)
    assert isinstance(editor, GpuEditor) and editor.raw() == "12" and editor.spin.isEnabled()
    editor.set_value("auto")
    assert editor.raw() == "auto" and not editor.spin.isEnabled()
    editor.mode.setCurrentText(GpuEditor.LAYERS)
    editor.spin.setValue(30)
    assert setting.parse(editor.raw()) == 30
    editor.mode.setCurrentText("off")
    assert setting.parse(editor.raw()) == "off"


# -- layer costs from GGUF headers -----------------------------------------------------------


def test_layer_costs_of_the_bundled_model_match_what_llama_cpp_allocates(model_path):
    info = read_gguf_info(model_path)
    costs = layer_costs(info, 8192)
    assert costs.blocks == 24 and costs.total_layers == 25
    # Qwen2.5 0.5B's KV cache at 8192 tokens: llama.cpp logs "CPU KV buffer size = 96.00 MiB"
    assert sum(costs.kv) == 96 * MiB and len(set(costs.kv)) == 1
    # its separate output matrix (Q6_K) and norm are the output layer; the embeddings stay on the CPU
    out = {t.name: t.nbytes for t in info.tensors}
    assert costs.output == out["output.weight"] + out["output_norm.weight"]
    assert sum(costs.weights) + costs.output + out["token_embd.weight"] <= info.tensor_data_size
    # the compute buffer: llama.cpp reserves 300.25 MiB (a batch of 512 tokens' logits); the
    # estimate is above it, never far off
    assert 300 * MiB < costs.compute < 400 * MiB
    assert costs.gpu_bytes(0) == 0 and costs.gpu_bytes(25) > costs.gpu_bytes(24) > costs.gpu_bytes(1)
    # at a quarter of the context, a quarter of the cache
    assert sum(layer_costs(info, 2048).kv) == 24 * MiB


def test_layer_costs_of_gemma3_count_its_sliding_window_layers(base_model_path):
    info = read_gguf_info(base_model_path)
    assert info.sliding_window == 512
    assert sliding_layers(info, 18) == [i % 6 != 5 for i in range(18)]  # 5 of every 6 slide
    full = layer_costs(info, 8192)
    # llama.cpp at n_ctx 8192 with swa_full: "KV buffer size = 24.00 MiB" (3 global layers) and
    # "120.00 MiB" (15 sliding ones, kept full size so any prefix can be reused)
    assert sum(full.kv) == 144 * MiB
    windowed = layer_costs(info, 8192, swa_full=False)  # the window + a batch: 1024 cells each
    assert sum(windowed.kv) == 24 * MiB + 15 * MiB
    # gemma3 ties its output to the embeddings: llama.cpp puts a copy of them on the output device
    out = {t.name: t.nbytes for t in info.tensors}
    assert "output.weight" not in out and full.output == out["token_embd.weight"] + out["output_norm.weight"]


def _model(tmp_path: Path, name: str, blocks: int, *, embd: int = 64, heads=4, kv_heads=2,
           vocab: int = 1000, tied: bool = False, **extra) -> Path:
    metadata = tiny_metadata(name, **{})
    arch = "llama"
    metadata.update({f"{arch}.block_count": blocks, f"{arch}.embedding_length": embd,
                     f"{arch}.attention.head_count": heads, f"{arch}.attention.head_count_kv": kv_heads,
                     f"{arch}.feed_forward_length": embd * 2})
    metadata.update(extra)
    tensors = [("token_embd.weight", (embd, vocab))]
    for i in range(blocks):
        tensors += [(f"blk.{i}.attn_q.weight", (embd, embd)), (f"blk.{i}.ffn_up.weight", (embd, embd * 2))]
    if not tied:
        tensors.append(("output.weight", (embd, vocab)))
    tensors.append(("output_norm.weight", (embd,)))
    return write_gguf(tmp_path / f"{name}.gguf", metadata, tensors)


def test_layer_costs_of_synthetic_shapes(tmp_path):
    # F32 tensors: a block is (64*64 + 64*128) * 4 bytes; a separate output matrix 64*1000*4
    separate = read_gguf_info(_model(tmp_path, "separate", 6))
    costs = layer_costs(separate, 1024)
    assert costs.weights == ((64 * 64 + 64 * 128) * 4,) * 6
    assert costs.output == 64 * 1000 * 4 + 64 * 4
    assert costs.kv == (2 * (16 + 16) * 2 * 1024,) * 6  # 2 KV heads of 16, K and V, f16
    tied = read_gguf_info(_model(tmp_path, "tied", 6, tied=True))
    assert layer_costs(tied, 1024).output == costs.output  # the embeddings' copy instead
    # a hybrid model: layers without attention heads hold no KV cache
    hybrid = read_gguf_info(_model(tmp_path, "hybrid", 4, heads=[4, 0, 4, 0], kv_heads=[2, 0, 2, 0]))
    assert layer_costs(hybrid, 1024).kv == (2 * 32 * 2 * 1024, 0, 2 * 32 * 2 * 1024, 0)
    # a sliding-window model whose file states its pattern
    swa = read_gguf_info(_model(tmp_path, "swa", 4, **{"llama.attention.sliding_window": 128,
                                                       "llama.attention.sliding_window_pattern":
                                                       [True, False, True, False]}))
    assert sliding_layers(swa, 4) == [True, False, True, False]
    windowed = layer_costs(swa, 4096, swa_full=False)
    assert windowed.kv[0] == 2 * 32 * 2 * (128 + 512) and windowed.kv[1] == 2 * 32 * 2 * 4096
    # an unknown architecture's window counts as full (never less memory than llama.cpp takes)
    assert layer_costs(swa, 4096, swa_full=True).kv[0] == windowed.kv[1]
    # without flash attention the attention scores of a batch are on top
    assert layer_costs(separate, 1024, flash_attn=False).compute == costs.compute + 1024 * 512 * 4 * 4
    # a header without a block count cannot be planned
    assert layer_costs(read_gguf_info(write_gguf(tmp_path / "x.gguf", {"general.architecture": "x"})), 512) is None


# -- the planner -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen(model_path):
    return read_gguf_info(model_path)


def test_auto_puts_the_whole_model_on_a_discrete_gpu_that_holds_it(qwen):
    plan = plan_gpu(qwen, 8192, [CPU, FAKE_GPU], "auto", platform="linux")
    assert plan.device == FAKE_GPU and plan.layers == plan.total_layers == 25
    assert plan.describe() == "GPU: Fake GeForce · 25/25 layers" and not plan.notice
    assert plan.needed_bytes == layer_costs(qwen, 8192).gpu_bytes(25) == plan.all_bytes


def test_auto_splits_when_only_some_layers_fit(qwen):
    costs = layer_costs(qwen, 8192)
    small = Device("Vulkan0", "Fake GeForce", "gpu", "Vulkan", 0, 2 * GiB, index=7)
    for want in (1, 6, 24):
        # free memory for exactly ``want`` layers and the margin
        free = costs.gpu_bytes(want) + margin(small)
        plan = plan_gpu(qwen, 8192, [replace(small, free_bytes=free)], "auto", platform="linux")
        assert plan.layers == want, (want, plan)
        assert plan.describe() == f"GPU: Fake GeForce · {want}/25 layers" and plan.notice
        assert f"{want} of 25 layers fit" in plan.reason
    # a larger context leaves room for fewer layers on the same device
    device = gpu(1.2, total_gib=2.0)
    assert plan_gpu(qwen, 32768, [device], "auto").layers < plan_gpu(qwen, 2048, [device], "auto").layers


def test_a_model_that_does_not_fit_at_all_runs_on_the_cpu_saying_why(qwen):
    plan = plan_gpu(qwen, 8192, [CPU, gpu(0.6, total_gib=2.0)], "auto", platform="linux")
    assert plan.describe() == "CPU" and plan.layers == 0 and plan.notice
    assert plan.reason.startswith("the model does not fit on Fake GeForce: even one layer needs")


def test_auto_takes_an_integrated_gpu_only_on_a_mac(qwen):
    igpu = gpu(6.0, kind="igpu", name="Intel Iris Xe", total_gib=16.0)
    plan = plan_gpu(qwen, 8192, [CPU, igpu], "auto", platform="linux")
    assert plan.describe() == "CPU" and not plan.notice
    assert "only an integrated GPU was found (Intel Iris Xe)" in plan.reason
    assert plan_gpu(qwen, 8192, [CPU, igpu], "auto", platform="win32").describe() == "CPU"
    mac = Device("MTL0", "Apple M2", "igpu", "Metal", 10 * GiB, 16 * GiB, index=1)
    assert plan_gpu(qwen, 8192, [CPU, mac], "auto", platform="darwin").describe() == "GPU: Apple M2 · 25/25 layers"
    # a layer count is the user's choice: an integrated GPU is taken
    assert plan_gpu(qwen, 8192, [CPU, igpu], 10, platform="linux").describe() == "GPU: Intel Iris Xe · 10/25 layers"
    # a discrete GPU comes first, and of two, the one with the most free memory
    small, large = gpu(2.0, name="Small", index=1), gpu(6.0, name="Large", index=2)
    assert plan_gpu(qwen, 8192, [igpu, small, large], "auto").device == large
    assert plan_gpu(qwen, 8192, [igpu, small, large], 5).device == large


def test_a_layer_count_is_taken_as_asked(qwen):
    plan = plan_gpu(qwen, 8192, [FAKE_GPU], 12)
    assert plan.describe() == "GPU: Fake GeForce · 12/25 layers" and plan.reason == "model.gpu asks for 12 layers"
    assert plan_gpu(qwen, 8192, [FAKE_GPU], 1000).describe() == "GPU: Fake GeForce · 25/25 layers"
    crowded = plan_gpu(qwen, 8192, [gpu(0.9, total_gib=2.0)], 25)
    assert crowded.layers == 25 and crowded.notice and "the estimate says" in crowded.reason
    none = plan_gpu(qwen, 8192, [CPU], 12)
    assert none.describe() == "CPU" and none.notice and "model.gpu asks for 12 layers" in none.reason


def test_off_and_no_gpu(qwen):
    off = plan_gpu(qwen, 8192, [CPU, FAKE_GPU], "off")
    assert off.describe() == "CPU" and off.reason == "model.gpu is off: the CPU only" and not off.notice
    alone = plan_gpu(qwen, 8192, [CPU], "auto")
    assert alone.describe() == "CPU" and "found no GPU" in alone.reason and not alone.notice
    assert plan_gpu(qwen, 8192, [], "auto").describe() == "CPU"


def test_a_device_that_does_not_report_memory_is_tried_whole(qwen):
    silent = Device("RPC0", "Remote", "gpu", "RPC", 0, 0, index=3)
    plan = plan_gpu(qwen, 8192, [silent], "auto")
    assert plan.layers == 25 and "does not report its memory" in plan.reason


def test_a_device_switched_off_by_the_check_is_left_out(qwen):
    disabled = {FAKE_GPU.label: "its answers differed from the CPU's"}
    plan = plan_gpu(qwen, 8192, [CPU, FAKE_GPU], "auto", disabled=disabled)
    assert plan.describe() == "CPU" and plan.notice
    assert plan.reason == "Fake GeForce is off for Iris: its answers differed from the CPU's"
    other = gpu(8.0, name="Other", index=2)
    assert plan_gpu(qwen, 8192, [FAKE_GPU, other], "auto", disabled=disabled).device == other


def test_fewer_halves_then_gives_up_for_the_cpu(qwen):
    plan = plan_gpu(qwen, 8192, [FAKE_GPU], "auto")
    tried = [plan]
    while (after := fewer(tried[-1], len(tried) - 1)) is not None:
        tried.append(after)
    assert [p.layers for p in tried] == [25, 12, 6, 0]
    assert tried[-1].describe() == "CPU" and "did not load on Fake GeForce" in tried[-1].reason
    assert fewer(cpu_plan(25, "x")) is None


# -- the load log ------------------------------------------------------------------------------

VULKAN_LOG = """\
load_tensors: offloading output layer to GPU
load_tensors: offloading 24 repeating layers to GPU
load_tensors: offloaded 25/25 layers to GPU
load_tensors:      Vulkan0 model buffer size =   373.71 MiB
load_tensors:   CPU_Mapped model buffer size =    89.26 MiB
llama_context: Vulkan_Host  output buffer size =     0.58 MiB
llama_kv_cache:    Vulkan0 KV buffer size =    96.00 MiB
sched_reserve:    Vulkan0 compute buffer size =   300.25 MiB
sched_reserve: Vulkan_Host compute buffer size =    12.01 MiB
"""

CPU_LOG = """\
load_tensors:   CPU_Mapped model buffer size =   462.96 MiB
load_tensors:   CPU_REPACK model buffer size =    28.05 MiB
llama_context:        CPU  output buffer size =     0.58 MiB
llama_kv_cache:        CPU KV buffer size =    96.00 MiB
sched_reserve:        CPU compute buffer size =   300.25 MiB
"""


def test_the_load_log_says_what_was_offloaded():
    gpu_log = offload_from_log(VULKAN_LOG.splitlines())
    assert (gpu_log.layers, gpu_log.total) == (25, 25)
    assert gpu_log.device_buffers() == {"Vulkan0": 373.71 + 96.0 + 300.25}
    cpu_log = offload_from_log(CPU_LOG.splitlines())
    assert cpu_log.layers is None and cpu_log.device_buffers() == {}
    assert set(cpu_log.buffers) == {"CPU_Mapped", "CPU_REPACK", "CPU"}
    assert gpu_log.device_compute_bytes() == int(300.25 * MiB) and cpu_log.device_compute_bytes() == 0


def test_the_measured_compute_buffer_replaces_the_estimate_in_the_next_plan(tmp_path):
    """Issue #46: the compute buffer is an estimate until a load measured it; then the plan
    for the same model, settings and device uses what llama.cpp reserved."""
    info = read_gguf_info(_model(tmp_path, "m", 24))
    device = gpu(1.0)
    estimate = plan_gpu(info, 1024, [device], "auto")
    assert not estimate.compute_measured
    base = estimate.all_bytes - layer_costs(info, 1024).compute
    # a device just big enough for the model with a small compute buffer, not with the estimate
    tight = replace(device, free_bytes=base + 8 * MiB + margin(device))  # the margin goes by the total
    assert plan_gpu(info, 1024, [tight], "auto").layers < estimate.total_layers
    measured = plan_gpu(info, 1024, [tight], "auto", measured_compute=lambda d: 8 * MiB)
    assert measured.layers == measured.total_layers and measured.compute_measured
    assert measured.all_bytes == base + 8 * MiB
    # a larger measurement than the estimate lowers the split just as well
    big = plan_gpu(info, 1024, [device], "auto", measured_compute=lambda d: device.free_bytes)
    assert not big.on_gpu and "does not fit" in big.reason


def test_measured_compute_buffers_are_kept_per_device_driver_and_settings(tmp_path):
    checks = tmp_path / "data" / "gpu-checks.json"
    record = MeasuredCompute.beside(checks)
    assert record.path == tmp_path / "data" / "gpu-compute.json"
    info = read_gguf_info(_model(tmp_path, "m", 24))
    key = compute_key(info, 2048, True)
    assert record.get(FAKE_GPU, key) is None
    record.record(FAKE_GPU, key, 300 * MiB)
    assert MeasuredCompute.beside(checks).get(FAKE_GPU, key) == 300 * MiB
    assert record.get(FAKE_GPU, compute_key(info, 4096, True)) is None  # another n_ctx
    assert record.get(replace(FAKE_GPU, driver="551.0"), key) is None  # another driver
    # the loader's plan reads it
    plan = loading.plan_device(info, 2048, "auto", [FAKE_GPU], checks, swa_full=True, flash_attn=True)
    assert plan.compute_measured and plan.on_gpu
    record.path.write_text("{not json")
    assert record.get(FAKE_GPU, key) is None  # unreadable: the estimate again
    plan = loading.plan_device(info, 2048, "auto", [FAKE_GPU], checks, swa_full=True, flash_attn=True)
    assert not plan.compute_measured and plan.on_gpu


def test_a_capture_inside_another_sees_the_load_log_too(model_path):
    """A caller's capture around a load (packaging/gpu/probe.py's) and the load's own both
    get llama.cpp's lines: the load's check against its plan must never read an empty log."""
    from iris_desktop.runtime import llama_binding

    with llama_binding.captured_log() as outer:
        model = LocalModel.load(model_path, n_ctx=512, gpu="off")
        model.close()
    assert any("CPU KV buffer size" in line for line in outer)


def test_driver_versions_as_vendors_write_them():
    from iris_desktop.runtime.devices import driver_version_text

    assert driver_version_text(0x10DE, (550 << 22) | (54 << 14) | (14 << 6)) == "550.54.14.0"  # NVIDIA
    assert driver_version_text(0x1002, (2 << 22) | (0 << 12) | 301) == "2.0.301"  # AMD's Vulkan version
    assert driver_version_text(0x10005, 1) == "0.0.1"  # lavapipe: hence Mesa's driverInfo in the key too


def test_a_plan_is_checked_against_the_log(tmp_path):
    plan = plan_gpu(read_gguf_info(_model(tmp_path, "m", 24)), 1024, [FAKE_GPU], "auto")
    assert plan.layers == 25
    loaded = loading.as_loaded(tmp_path, plan, offload_from_log(VULKAN_LOG.splitlines()))
    assert loaded == replace(plan, measured_compute=int(300.25 * MiB))  # Vulkan_Host's is in RAM
    fewer_log = VULKAN_LOG.replace("offloaded 25/25", "offloaded 20/25")
    partial = loading.as_loaded(tmp_path, plan, offload_from_log(fewer_log.splitlines()))
    assert partial.layers == 20 and partial.describe() == "GPU: Fake GeForce · 20/25 layers"
    nothing = loading.as_loaded(tmp_path, plan, offload_from_log(CPU_LOG.splitlines()))
    assert nothing.describe() == "CPU" and "llama.cpp put no layer on Fake GeForce" in nothing.reason


# -- the first-use check -------------------------------------------------------------------------


def _steps(tokens, logits=None) -> list[Step]:
    logits = logits or [10.0] * len(tokens)
    return [Step(t, f"<{t}>", ((t, lg), (t + 100, lg - 0.3), (t + 200, lg - 5))) for t, lg in zip(tokens, logits)]


def test_compare_steps():
    cpu = _steps([1, 2, 3, 4])
    assert compare_steps(cpu, _steps([1, 2, 3, 4])) == (True, "the same top token at all 4 steps")
    # the CPU's second choice, 0.3 below its first: a near tie, not a fault
    assert compare_steps(cpu, _steps([1, 102, 3, 4]))[0]
    agrees, detail = compare_steps(cpu, _steps([1, 2, 203, 4]))  # 5 logits below: a wrong answer
    assert not agrees and detail == "step 3 of 4: the GPU's top token '<203>' is not the CPU's '<3>'"
    assert not compare_steps(cpu, _steps([1, 2]))[0]


def test_gpu_checks_remember_per_device_and_driver(tmp_path):
    record = GpuChecks(tmp_path / "gpu-checks.json")
    assert record.result(FAKE_GPU) is None and record.disabled([FAKE_GPU]) == {}
    record.record(FAKE_GPU, False, "step 2 of 8: the GPU's top token 'x' is not the CPU's 'y'")
    assert record.result(FAKE_GPU)["agrees"] is False
    assert "until its driver changes" in record.disabled([FAKE_GPU])[FAKE_GPU.label]
    updated = replace(FAKE_GPU, driver="560.0")  # a new driver: checked again
    assert record.result(updated) is None and record.disabled([updated]) == {}
    data = json.loads((tmp_path / "gpu-checks.json").read_text())
    assert list(data["checks"]) == ["Fake GeForce|550.1"]
    (tmp_path / "gpu-checks.json").write_text("{not json")
    assert record.result(FAKE_GPU) is None  # a damaged record: checked again, never a crash


@pytest.fixture
def fake_runs(monkeypatch):
    """The first-use check's two runs, made up: the GPU's answer is wrong at step 3 unless
    ``agree`` is set. Counts the checks."""
    calls = {"cpu": 0, "gpu": 0, "agree": False}

    def steps(path, plan, threads, flash_attn, forced=None, steps=8):
        if not plan.on_gpu:
            calls["cpu"] += 1
            return _steps([11, 12, 13, 14, 15, 16, 17, 18])
        calls["gpu"] += 1
        return _steps([11, 12, 13 if calls["agree"] else 999, 14, 15, 16, 17, 18])

    monkeypatch.setattr(first_use, "greedy_steps", steps)
    return calls


def test_a_gpu_that_disagrees_with_the_cpu_is_switched_off_and_remembered(model_path, tmp_path, fake_runs):
    record = tmp_path / "gpu-checks.json"
    stages = []
    model = LocalModel.load(model_path, n_ctx=1024, gpu="auto", gpu_checks=record, devices=[CPU, FAKE_GPU],
                            stage=stages.append)
    try:
        assert model.gpu.describe() == "CPU" and model.gpu.notice
        assert model.gpu.reason.startswith("Fake GeForce gave other answers than the CPU in Iris's first-use "
                                           "check (step 3 of 8: the GPU's top token '<999>' is not the CPU's "
                                           "'<13>'); it stays off for Iris until its driver changes")
        assert model.describe().device == "CPU" and model.describe().device_notice == model.gpu.reason
        assert "checking" in stages and fake_runs == {"cpu": 1, "gpu": 1, "agree": False}
        assert "Paris" in "".join(model.stream(GenerationRequest(
            [{"role": "user", "content": "What is the capital of France? "
                                                 "One word."}], max_tokens=8, temperature=0)))
    finally:
        model.close()
    assert json.loads(record.read_text())["checks"]["Fake GeForce|550.1"]["agrees"] is False
    # the next load believes the record: no check, the CPU, the same sentence's reason
    again = LocalModel.load(model_path, n_ctx=1024, gpu="auto", gpu_checks=record, devices=[CPU, FAKE_GPU])
    again.close()
    assert fake_runs["gpu"] == 1 and again.gpu.describe() == "CPU"
    assert again.gpu.reason.startswith("Fake GeForce is off for Iris: its answers differed")
    # a new driver is checked again; this time it agrees
    fake_runs["agree"] = True
    newer = replace(FAKE_GPU, driver="560.0")
    third = LocalModel.load(model_path, n_ctx=1024, gpu="auto", gpu_checks=record, devices=[CPU, newer])
    third.close()
    assert fake_runs["gpu"] == 2
    assert json.loads(record.read_text())["checks"]["Fake GeForce|560.0"]["agrees"] is True
    # it was planned on the GPU; this llama.cpp has none: said before the load (it loaded
    # on the CPU, and the load log said "no layer" of a device it never had)
    assert third.gpu.describe() == "CPU"
    assert "Fake GeForce is no longer among llama.cpp's devices" in third.gpu.reason


def test_off_loads_without_a_device_and_without_a_check(model_path, tmp_path, fake_runs, monkeypatch):
    seen = {}
    real = llama_binding.load_llama

    def spy(path, scratch, progress, cancel, device=None, **params):
        seen.update(params, device=device)
        return real(path, scratch, progress, cancel, device=device, **params)

    monkeypatch.setattr(llama_binding, "load_llama", spy)
    monkeypatch.setattr("iris_desktop.runtime.devices.list_devices", lambda: pytest.fail("off lists no device"))
    model = LocalModel.load(model_path, n_ctx=1024, gpu="off", gpu_checks=tmp_path / "c.json")
    model.close()
    assert model.gpu.describe() == "CPU" and model.gpu.reason == "model.gpu is off: the CPU only"
    assert seen["n_gpu_layers"] == 0 and seen["main_gpu"] == -1 and seen["op_offload"] is False
    assert seen["device"] is None and fake_runs["gpu"] == fake_runs["cpu"] == 0
    assert not (tmp_path / "c.json").exists()


def test_a_load_that_fails_on_the_gpu_is_retried_with_fewer_layers_then_the_cpu(model_path, monkeypatch):
    tried = []
    real = llama_binding.load_llama

    def flaky(path, scratch, progress, cancel, device=None, **params):
        tried.append(params["n_gpu_layers"])
        if params["n_gpu_layers"]:
            raise ValueError("Failed to load model from file")  # what llama-cpp-python raises
        return real(path, scratch, progress, cancel, device=device, **params)

    monkeypatch.setattr(llama_binding, "load_llama", flaky)
    # a handle for the made-up GPU (flaky never hands it to llama.cpp)
    monkeypatch.setattr("iris_desktop.runtime.devices.device_handle", lambda device: 0xDEAD)
    model = LocalModel.load(model_path, n_ctx=1024, gpu="auto", devices=[CPU, FAKE_GPU])
    model.close()
    assert tried == [25, 12, 6, 0]
    assert model.gpu.describe() == "CPU"
    assert model.gpu.reason == ("the model did not load on Fake GeForce (tried with 25, 12 and 6 "
                                "layers), so it runs on the CPU")


def test_host_passes_model_gpu_and_the_record(tmp_path, model_path, monkeypatch):
    from iris_desktop.host import GPU_CHECKS_FILE, Host

    seen = {}
    real = LocalModel.load.__func__

    def load(cls, path, **kw):
        seen.update(kw)
        return real(cls, path, **kw)

    monkeypatch.setattr(LocalModel, "load", classmethod(load))
    with Host(tmp_path / "data", {"model.path": str(model_path), "model.n_ctx": "1024", "model.gpu": "off",
                                  "model.q8_weights": "false"}, env={}) as host:
        runtime = host.load_model()
        assert runtime.describe().device == "CPU"
    assert seen["gpu"] == "off" and seen["gpu_checks"] == tmp_path / "data" / GPU_CHECKS_FILE


# -- the devices command -----------------------------------------------------------------------


def test_devices_command_lists_the_cpu_and_the_plan(capsys, tmp_path, model_path):
    code = main(["--data-dir", str(tmp_path / "d"), "--set", f"model.path={model_path}", "devices", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert any(d["kind"] == "cpu" for d in out["devices"]) and out["model.gpu"] == "auto"
    assert out["plan"]["total_layers"] == 25 and out["n_ctx"] == 8192
    code = main(["--data-dir", str(tmp_path / "d"), "--set", f"model.path={model_path}", "--set",
                 "model.gpu=off", "devices"])
    text = capsys.readouterr().out
    assert code == 0 and "Devices llama.cpp can use:" in text
    assert "CPU: model.gpu is off: the CPU only" in text and "all 25 layers on a GPU would need about" in text


# -- on a real GPU (make gpu-check) --------------------------------------------------------------


def _real_gpus() -> list[Device]:
    from iris_desktop.runtime.devices import list_devices

    return [d for d in list_devices() if d.is_gpu]


needs_gpu = pytest.mark.skipif(not _real_gpus(), reason="this llama.cpp finds no GPU (a CPU-only build, or no "
                               "driver); `make gpu-check` runs these on a Vulkan build with Mesa's lavapipe")


def _capital_of_france(model) -> str:
    return "".join(model.stream(GenerationRequest(
        [{"role": "user", "content": "What is the capital of France? One word."}], max_tokens=8,
        temperature=0)))


@needs_gpu
def test_the_bundled_model_runs_on_the_gpu_and_answers(model_path, tmp_path):
    model = LocalModel.load(model_path, n_ctx=2048, gpu="auto", gpu_checks=tmp_path / "checks.json")
    try:
        assert model.gpu.describe().startswith("GPU: ") and model.gpu.layers == model.gpu.total_layers
        assert "Paris" in _capital_of_france(model)
    finally:
        model.close()
    assert json.loads((tmp_path / "checks.json").read_text())["checks"]
    # the compute buffer llama.cpp reserved is kept, and the next plan uses it
    measured = json.loads((tmp_path / "gpu-compute.json").read_text())["compute"]
    assert len(measured) == 1 and next(iter(measured.values())) > 0
    again = LocalModel.load(model_path, n_ctx=2048, gpu="auto", gpu_checks=tmp_path / "checks.json")
    try:
        assert again.gpu.compute_measured and again.gpu.layers == again.gpu.total_layers
    finally:
        again.close()


@needs_gpu
def test_a_partial_split_loads_and_answers(model_path):
    model = LocalModel.load(model_path, n_ctx=2048, gpu=10)
    try:
        assert model.gpu.describe().endswith("· 10/25 layers")
        assert "Paris" in _capital_of_france(model)
    finally:
        model.close()


def test_the_embedder_makes_no_gpu_buffer():
    """The embedder stays on the CPU (issue #46): its load log names CPU buffers only. Here on
    a CPU build; under ``make gpu-check`` the same test runs on a Vulkan build, where
    llama.cpp's defaults would put the embedder's buffers on the GPU."""
    from iris_desktop.runtime.embedder import Embedder, ensure_embedding_model

    from conftest import MODEL_CACHE

    with llama_binding.captured_log() as lines:
        embedder = Embedder.load(ensure_embedding_model(MODEL_CACHE / "models"))
    try:
        assert embedder.embed("What pets does she have?").shape == (384,)
    finally:
        embedder.close()
    buffers = offload_from_log(lines)
    assert buffers.buffers and all(name.startswith("CPU") for name in buffers.buffers), buffers.buffers
    assert buffers.device_buffers() == {}
