"""Which device runs the model, and how many of its layers (``model.gpu``).

llama.cpp offloads a model from the top: with ``n_gpu_layers = k`` the output layer and
the last ``k - 1`` repeating layers (blocks) live on the GPU, the rest and the input
embeddings on the CPU, and each offloaded block's KV cache lives with it. So a model of
``n`` blocks has ``n + 1`` layers to offload, and "28/29" means all but one block.

:func:`plan_gpu` is the one place that decides, from facts only: the GGUF header (every
tensor's size, so the weights of each block and of the output layer; the attention
geometry, so the KV cache per token at ``n_ctx``, sliding-window layers counted as the
cache llama.cpp allocates for them), a compute-buffer estimate (replaced by the size
llama.cpp reserved at the last load of the same model, settings and device:
:class:`MeasuredCompute`), and the devices with their free memory. It reads no file and
touches no driver: :mod:`.devices` lists the devices, :class:`GpuChecks` remembers a
device whose answers differed from the CPU's (the first-use check in :mod:`.model`), and
:mod:`.model` loads with the plan, checks
llama.cpp's load log against it (:func:`offload_from_log`) and retries with fewer layers.

``auto`` takes a discrete GPU (the one with the most free memory) and as many layers as
fit its free memory with a margin; an integrated GPU shares the computer's memory and
bandwidth with the CPU and is rarely faster, so ``auto`` takes one only on a Mac (Apple
silicon's GPU is integrated and fast), or when the user gives a layer count. ``off``
plans the CPU only: :mod:`.model` then loads with no device at all, so llama.cpp creates
no GPU buffer. Never imports PySide6.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from iris_desktop.units import memory_size

from .gguf import GGUFInfo, per_layer
from .gpu_records import (  # (what Iris remembers of the GPUs; kept here for its users)
    COMPUTE_FILE,
    FAILED_RUNS_OFF,
    THIS_RUN,
    GpuChecks,
    MeasuredCompute,
    check_again_command,
)

log = logging.getLogger("iris.runtime.gpu")

__all__ = [
    "COMPUTE_FILE",
    "FAILED_RUNS_OFF",
    "THIS_RUN",
    "Device",
    "MeasuredCompute",
    "GpuChecks",
    "GpuPlan",
    "LayerCosts",
    "check_again_command",
    "cpu_plan",
    "device_line",
    "devices_report",
    "fit_text",
    "hold",
    "layer_costs",
    "let_go",
    "memory_text",
    "offload_from_log",
    "plan_gpu",
    "plan_line",
    "plan_model",
    "with_held",
]

AUTO = "auto"
OFF = "off"
#: device kinds, as ggml names them (``ggml_backend_dev_type``)
DEVICE_KINDS = ("cpu", "gpu", "igpu", "accel", "meta")
MiB = 2**20
GiB = 2**30
#: what is kept free on the device besides the plan: the driver, the display, other apps,
#: and the estimate's error; the larger of the two
MARGIN_BYTES = 512 * MiB
MARGIN_FRACTION = 0.08
#: the KV cache's bytes per element (llama.cpp's default f16 K and V)
KV_BYTES = 2
#: llama.cpp's default physical batch (``n_ubatch``): the compute buffer is sized for it
N_UBATCH = 512
#: sliding-window layout where the GGUF does not state it: architecture -> (period,
#: dense first), as llama.cpp's ``load_swa_pattern`` calls for it (gemma3: 5 of every 6
#: layers slide, the 6th attends to everything)
SWA_PATTERNS = {"gemma2": (2, False), "gemma3": (6, False), "cohere2": (4, False),
                "cohere2moe": (4, True), "llama4": (4, False)}


@dataclass(frozen=True)
class Device:
    """A compute device llama.cpp (ggml) knows."""

    #: ggml's name: "Vulkan0", "CUDA0", "Metal", "CPU"
    name: str
    #: what it is: "NVIDIA GeForce RTX 4070", "llvmpipe (LLVM 15.0.6, 256 bits)"
    description: str
    #: "cpu", "gpu" (its own memory), "igpu" (the computer's memory), "accel"
    kind: str
    #: the ggml backend it belongs to: "Vulkan", "CUDA", "Metal", "CPU"
    backend: str = ""
    free_bytes: int = 0
    total_bytes: int = 0
    #: its index among ggml's devices (``ggml_backend_dev_get``); -1 for a made-up one
    index: int = -1
    #: the driver's version where it can be told ("" where not)
    driver: str = ""
    #: of ``free_bytes``, what this process's own open models hold there, counted back as
    #: free (:func:`with_held`: a load that replaces them gets it back); 0: none counted
    held_bytes: int = 0

    @property
    def is_gpu(self) -> bool:
        return self.kind in ("gpu", "igpu")

    @property
    def label(self) -> str:
        return self.description or self.name

    @property
    def memory_known(self) -> bool:
        return self.total_bytes > 0

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LayerCosts:
    """What each layer of a model needs on the device it runs on, in bytes."""

    #: the weights of each repeating layer (block), first to last
    weights: tuple[int, ...]
    #: the KV cache of each block at the planned ``n_ctx``
    kv: tuple[int, ...]
    #: the output layer: its matrix (a tied model's copy of the embeddings) and norm
    output: int
    #: the GPU's compute buffer (mostly the logits of one batch), an estimate
    compute: int

    @property
    def blocks(self) -> int:
        return len(self.weights)

    @property
    def total_layers(self) -> int:
        return self.blocks + 1

    def gpu_bytes(self, layers: int) -> int:
        """What ``layers`` offloaded layers need on the GPU: the output layer, the last
        ``layers - 1`` blocks with their KV cache, the compute buffer (and, for a partial
        split, room to stage one CPU block's weights for a batch)."""
        layers = max(0, min(layers, self.total_layers))
        if layers == 0:
            return 0
        top = range(self.blocks - (layers - 1), self.blocks)
        staged = max(self.weights, default=0) if layers < self.total_layers else 0
        return self.output + sum(self.weights[i] + self.kv[i] for i in top) + self.compute + staged

    def fitting(self, budget: int) -> int:
        """The most layers whose :meth:`gpu_bytes` stay within ``budget``."""
        best = 0
        for layers in range(1, self.total_layers + 1):
            if self.gpu_bytes(layers) > budget:
                break
            best = layers
        return best


def sliding_layers(info: GGUFInfo, blocks: int) -> list[bool]:
    """Which blocks attend within the sliding window only (all False without one):
    ``<arch>.attention.sliding_window_pattern`` when the file states it (a list, or a
    period), else llama.cpp's pattern for the architecture; an unknown layout counts every
    layer as full (more memory, never less)."""
    if not info.sliding_window:
        return [False] * blocks
    stated = info.arch_key("attention.sliding_window_pattern")
    if isinstance(stated, list) and len(stated) == blocks:
        return [bool(v) for v in stated]
    period, dense_first = SWA_PATTERNS.get(info.architecture, (None, False))
    if isinstance(stated, int) and not isinstance(stated, bool):
        period = stated
    if period is None:
        return [False] * blocks
    if period == 0:
        return [True] * blocks
    if dense_first:
        return [i % period != 0 for i in range(blocks)]
    return [i % period < period - 1 for i in range(blocks)]


def layer_costs(info: GGUFInfo, n_ctx: int, *, swa_full: bool = True, flash_attn: bool = True,
                n_ubatch: int = N_UBATCH, kv_bytes: int = KV_BYTES) -> LayerCosts | None:
    """Each layer's bytes from the header, at ``n_ctx`` (as :class:`~.model.LocalModel`
    loads: ``swa_full`` keeps a full-size cache for sliding-window layers too; without it
    llama.cpp keeps ``sliding_window + n_ubatch`` cells of them). None when the header
    lacks the block count or a tensor's size (an unknown quantization)."""
    blocks = info.arch_key("block_count")
    if not isinstance(blocks, int) or blocks <= 0 or not info.tensors:
        return None
    weights = [0] * blocks
    output = embeddings = 0
    tied = True
    pattern = re.compile(r"^blk\.(\d+)\.")
    for tensor in info.tensors:
        size = tensor.nbytes
        if size is None:
            return None
        match = pattern.match(tensor.name)
        if match and int(match[1]) < blocks:
            weights[int(match[1])] += size
        elif tensor.name == "token_embd.weight":
            embeddings = size
        elif tensor.name.startswith("output"):
            output += size
            tied = tied and tensor.name != "output.weight"
    if tied:  # llama.cpp loads a copy of the embeddings as the output matrix, on its device
        output += embeddings
    kv = _kv_per_block(info, blocks, n_ctx, swa_full, n_ubatch, kv_bytes)
    vocab = _vocab(info)
    heads = per_layer(info.arch_key("attention.head_count"), blocks) or [0]
    embd = info.arch_key("embedding_length")
    ff = per_layer(info.arch_key("feed_forward_length"), blocks) or [0]
    hidden = (embd if isinstance(embd, int) else 0) * 4 + max(ff)
    # the logits of a whole batch dominate (llama.cpp reserves them: 300 MiB for Qwen2.5's
    # 151,936 tokens); attention scores without flash attention; the activations
    compute = n_ubatch * (vocab + hidden) * 4 + 32 * MiB
    if not flash_attn:
        compute += n_ctx * n_ubatch * max(heads) * 4
    return LayerCosts(tuple(weights), tuple(kv), output, compute)


def _vocab(info: GGUFInfo) -> int:
    for tensor in info.tensors:
        if tensor.name in ("output.weight", "token_embd.weight") and len(tensor.dims) == 2:
            return int(tensor.dims[1])
    return 0


def _kv_per_block(info: GGUFInfo, blocks: int, n_ctx: int, swa_full: bool, n_ubatch: int,
                  kv_bytes: int) -> list[int]:
    heads = per_layer(info.arch_key("attention.head_count"), blocks)
    if heads is None:
        return [0] * blocks
    kv_heads = per_layer(info.arch_key("attention.head_count_kv"), blocks) or heads
    embd = info.arch_key("embedding_length")
    key_length = info.arch_key("attention.key_length")
    value_length = info.arch_key("attention.value_length")
    sliding = sliding_layers(info, blocks)
    window_cells = min(n_ctx, info.sliding_window + n_ubatch)
    out = []
    for n_heads, n_kv, swa in zip(heads, kv_heads, sliding, strict=True):
        if n_heads <= 0 or n_kv <= 0:  # a recurrent layer of a hybrid model: no KV cache
            out.append(0)
            continue
        head = embd // n_heads if isinstance(embd, int) else 0
        k = key_length if isinstance(key_length, int) else head
        v = value_length if isinstance(value_length, int) else head
        cells = window_cells if swa and not swa_full else n_ctx
        out.append(n_kv * (k + v) * kv_bytes * cells)
    return out


@dataclass(frozen=True)
class GpuPlan:
    """Where a model runs: ``device`` (None: the CPU) and how many of its
    ``total_layers`` layers are offloaded to it, and why, in one sentence."""

    device: Device | None
    layers: int
    total_layers: int
    reason: str
    #: what the plan's layers need on the device (an estimate; 0 on the CPU)
    needed_bytes: int = 0
    #: the reason is worth telling the user: a GPU was wanted, or found, and is not used
    #: (fully); False when the CPU is simply all there is, or what was asked for
    notice: bool = False
    #: what a full offload would need (0 when the header does not tell)
    all_bytes: int = 0
    #: the compute buffer llama.cpp reserved on the device at this load, from its log (0:
    #: not loaded yet, or on the CPU); :class:`MeasuredCompute` keeps it for the next plan
    measured_compute: int = 0
    #: the plan's compute buffer came from such a measurement, not the estimate
    compute_measured: bool = False
    #: what llama.cpp put on the device at this load, from its log (0: not loaded yet, or on
    #: the CPU): what the model gives back when it is closed (:func:`hold`)
    device_bytes: int = field(default=0, compare=False)

    @property
    def on_gpu(self) -> bool:
        return self.device is not None and self.layers > 0

    def describe(self) -> str:
        """"GPU: NVIDIA GeForce RTX 4070 · 28/29 layers", or "CPU"."""
        if not self.on_gpu:
            return "CPU"
        return f"GPU: {self.device.label} · {min(self.layers, self.total_layers)}/{self.total_layers} layers"

    def as_json(self) -> dict[str, Any]:
        return {"device": self.device.as_json() if self.device else None, "layers": self.layers,
                "total_layers": self.total_layers, "reason": self.reason, "notice": self.notice,
                "needed_bytes": self.needed_bytes, "all_bytes": self.all_bytes,
                "compute_measured": self.compute_measured, "describe": self.describe()}


def cpu_plan(total_layers: int, reason: str, notice: bool = False, **extra: Any) -> GpuPlan:
    return GpuPlan(None, 0, total_layers, reason, notice=notice, **extra)


def margin(device: Device) -> int:
    """What a plan leaves free on ``device``."""
    return max(MARGIN_BYTES, int(device.total_bytes * MARGIN_FRACTION))


def plan_gpu(info: GGUFInfo, n_ctx: int, devices: Sequence[Device], setting: str | int, *,
             platform: str | None = None, disabled: Mapping[str, str] | None = None,
             swa_full: bool = True, flash_attn: bool = True, n_ubatch: int = N_UBATCH,
             measured_compute: Callable[[Device], int | None] | None = None) -> GpuPlan:
    """The device and the number of layers for ``setting`` (``model.gpu``: "auto", "off"
    or a layer count). ``devices``: what llama.cpp found (the CPU among them, or not);
    ``disabled``: device descriptions the first-use check switched off, with why;
    ``platform``: ``sys.platform`` (an integrated GPU is taken by ``auto`` on "darwin"
    only); ``measured_compute``: the compute buffer llama.cpp reserved on a device at an
    earlier load with the same model and settings (:class:`MeasuredCompute`), used in
    place of the estimate. Pure: the same facts give the same plan."""
    platform = platform or sys.platform
    disabled = dict(disabled or {})
    costs = layer_costs(info, n_ctx, swa_full=swa_full, flash_attn=flash_attn, n_ubatch=n_ubatch)
    blocks = info.arch_key("block_count")
    total = costs.total_layers if costs else (blocks + 1 if isinstance(blocks, int) and blocks > 0 else 1)
    all_bytes = costs.gpu_bytes(total) if costs else 0
    if setting == OFF:
        return cpu_plan(total, "model.gpu is off: the CPU only", all_bytes=all_bytes)
    gpus = [d for d in devices if d.is_gpu]
    usable = [d for d in gpus if d.label not in disabled]
    off_for_iris = [d for d in gpus if d.label in disabled]
    discrete = [d for d in usable if d.kind == "gpu"]
    integrated = [d for d in usable if d.kind == "igpu"]
    asked = None if setting == AUTO else int(setting)
    if asked is None and platform == "darwin":
        candidates = discrete or integrated
    elif asked is None:
        candidates = discrete
    else:
        candidates = discrete or integrated
    if not candidates:
        if off_for_iris:
            d = off_for_iris[0]
            return cpu_plan(total, f"{d.label} is off for Iris: {disabled[d.label]}", notice=True,
                            all_bytes=all_bytes)
        if integrated:
            d = integrated[0]
            return cpu_plan(total, f"only an integrated GPU was found ({d.label}); it shares this "
                            "computer's memory and is rarely faster than the CPU, so model.gpu auto "
                            "leaves it unused (set model.gpu to a number of layers to try it)",
                            all_bytes=all_bytes)
        return cpu_plan(total, "llama.cpp found no GPU it can use on this computer"
                        + ("" if asked is None else f" (model.gpu asks for {asked} layers)"),
                        notice=asked is not None, all_bytes=all_bytes)
    device = max(candidates, key=lambda d: d.free_bytes)
    budget = device.free_bytes - margin(device)
    measured = measured_compute(device) if measured_compute is not None and costs is not None else None
    if measured:
        costs = replace(costs, compute=measured)
        all_bytes = costs.gpu_bytes(total)
    plan = _plan_on(device, budget, costs, total, all_bytes, asked)
    return replace(plan, compute_measured=bool(measured)) if measured and plan.on_gpu else plan


def _plan_on(device: Device, budget: int, costs: LayerCosts | None, total: int, all_bytes: int,
             asked: int | None) -> GpuPlan:
    """:func:`plan_gpu` once the device is chosen."""
    if asked is not None:
        layers = min(asked, total)
        fit = costs.fitting(budget) if costs and device.memory_known else layers
        note = ("" if layers <= fit else
                f"; the estimate says {fit} fit in its {memory_size(device.free_bytes)} free: if the load "
                "fails, fewer are tried")
        return GpuPlan(device, layers, total, f"model.gpu asks for {asked} layers{note}",
                       needed_bytes=costs.gpu_bytes(layers) if costs else 0, notice=layers > fit,
                       all_bytes=all_bytes)
    if costs is None:
        return cpu_plan(total, "the model's header does not tell its layers' sizes, so model.gpu "
                        "auto cannot plan a split (set a number of layers to offload)", notice=True)
    if not device.memory_known:
        return GpuPlan(device, total, total, f"{device.label} does not report its memory: every "
                       "layer is tried, fewer if the load fails", needed_bytes=all_bytes,
                       all_bytes=all_bytes)
    layers = costs.fitting(budget)
    if layers == total:
        return GpuPlan(device, total, total, f"the whole model fits in the {memory_size(device.free_bytes)} free "
                       f"on {device.label} ({memory_size(all_bytes)} needed)",
                       needed_bytes=all_bytes, all_bytes=all_bytes)
    if layers == 0:
        return cpu_plan(total, f"the model does not fit on {device.label}: even one layer needs "
                        f"{memory_size(costs.gpu_bytes(1))} and {memory_size(device.free_bytes)} is free, "
                        f"{memory_size(margin(device))} of it kept for the rest of the computer",
                        notice=True, all_bytes=all_bytes)
    return GpuPlan(device, layers, total, f"{layers} of {total} layers fit in the {memory_size(device.free_bytes)} "
                   f"free on {device.label} (all would need {memory_size(all_bytes)}); the rest run on the CPU",
                   needed_bytes=costs.gpu_bytes(layers), notice=True,
                   all_bytes=all_bytes)


def plan_model(info: GGUFInfo, n_ctx: int, devices: Sequence[Device], setting: str | int, *,
               disabled: Mapping[str, str] | None = None, flash_attn: bool = True, swa_full: bool = True,
               gpu_checks: str | os.PathLike[str] | None = None) -> tuple[GpuPlan, int]:
    """:func:`plan_gpu` at ``model.n_ctx`` as a load would use it (0: the model's trained
    context, else 4,096), and that n_ctx: what ``iris-desktop devices`` and the dialogs show;
    with the compute buffer measured at an earlier load where one is kept beside
    ``gpu_checks`` (:class:`MeasuredCompute`), as the loader plans."""
    n_ctx = n_ctx or info.context_length or 4096
    measured = None
    if gpu_checks is not None:
        record, key = MeasuredCompute.beside(gpu_checks), compute_key(info, n_ctx, flash_attn)
        measured = lambda device: record.get(device, key)  # noqa: E731
    return plan_gpu(info, n_ctx, devices, setting, disabled=disabled, flash_attn=flash_attn, swa_full=swa_full,
                    measured_compute=measured), n_ctx


# -- what is shown: ``iris-desktop devices``, Preferences ▸ Model, Model ▸ Models… ------------


def memory_text(device: Device) -> str:
    """"7.5 GB free of 8 GB" (memory as it is sold: ``units.memory_size``), with "(with the
    loaded model's 700 MB)" where that is counted as free (:func:`with_held`), or "memory
    not reported"."""
    if not device.memory_known:
        return "memory not reported"
    held = f" (with the loaded model's {memory_size(device.held_bytes)})" if device.held_bytes else ""
    return f"{memory_size(device.free_bytes)} free of {memory_size(device.total_bytes)}{held}"


def device_line(device: Device) -> str:
    """"Fake GeForce (gpu, Vulkan): 7.5 GB free of 8 GB"; the CPU as "Test CPU (cpu): ..."."""
    kind = device.kind if device.kind == "cpu" or not device.backend else f"{device.kind}, {device.backend}"
    return f"{device.label} ({kind}): {memory_text(device)}"


NO_GPU = "No GPU found: the model runs on the CPU."


def plan_line(plan: GpuPlan, devices: Sequence[Device]) -> str:
    """The plan in one line: "GPU: llvmpipe · 25/25 layers: <reason>", "CPU: <reason>", or
    :data:`NO_GPU` where llama.cpp found no GPU at all."""
    if not any(d.is_gpu for d in devices) and not plan.on_gpu:
        return NO_GPU
    return f"{plan.describe()}: {plan.reason}"


def devices_report(devices: Sequence[Device] | None, plan: GpuPlan | None, *, model: str = "",
                   n_ctx: int = 0, setting: str | int = AUTO, problem: str | None = None) -> list[str]:
    """Preferences ▸ Model's "Devices" block, line by line: each device llama.cpp found
    (:func:`device_line`), then the plan for ``model`` at ``n_ctx`` and ``setting``
    (:func:`plan_line`), or ``problem`` where there is no plan. ``devices`` None: not
    listed yet."""
    if devices is None:
        return ["Asking llama.cpp for its devices…"]
    lines = [device_line(d) for d in devices] or ["llama.cpp listed no device"]
    if plan is None:
        if not any(d.is_gpu for d in devices):
            lines.append(NO_GPU)
        lines.append(f"model.gpu {setting}: {problem or 'no plan'}")
        return lines
    lines.append(f"Plan for {model} at n_ctx {n_ctx:,}, model.gpu {setting}:")
    lines.append(plan_line(plan, devices))
    return lines


def fit_text(plan: GpuPlan | None, devices: Sequence[Device]) -> str:
    """Whether a model fits on the GPU, in a few words: "all 25 layers on GPU", "12/29
    layers on GPU", "CPU only: no GPU", "CPU only: model.gpu off", "CPU only: does not
    fit"; "–" without a plan (an unreadable header)."""
    if plan is None:
        return "–"
    if plan.on_gpu:
        if plan.layers >= plan.total_layers:
            return f"all {plan.total_layers} layers on GPU"
        return f"{plan.layers}/{plan.total_layers} layers on GPU"
    if not any(d.is_gpu for d in devices):
        return "CPU only: no GPU"
    if plan.reason.startswith("model.gpu is off"):
        return "CPU only: model.gpu off"
    if "does not fit" in plan.reason:
        return "CPU only: does not fit"
    return "CPU only: " + plan.reason.split(":")[0].split(";")[0].split(" (")[0]


# -- what this process's own models hold on each GPU ------------------------------------------

#: id of an open model -> (its GPU's label, the bytes it holds there): a free figure read
#: while it is open leaves them out, though loading another model in its place gets them back
_held: dict[int, tuple[str, int]] = {}


def hold(model: object, plan: GpuPlan) -> None:
    """Count what ``model`` holds on ``plan``'s GPU (what llama.cpp's log said it put there,
    else the plan's estimate) until :func:`let_go`, or until ``model`` is gone."""
    if plan.on_gpu:
        _held[id(model)] = (plan.device.label, plan.device_bytes or plan.needed_bytes)
        weakref.finalize(model, _held.pop, id(model), None)


def let_go(model: object) -> None:
    """``model`` is closed: what it held is free again."""
    _held.pop(id(model), None)


def with_held(devices: Iterable[Device]) -> list[Device]:
    """``devices`` with what this process's open models hold on each counted back as free
    (``held_bytes`` says how much): the memory a model loaded in their place could have, as
    a reload plans it (:class:`.loading.GpuRoom`). For Preferences, Model ▸ Models… and the
    recommendation: read while a model is loaded, the driver's figure left its buffers out."""
    held: dict[str, int] = {}
    for label, nbytes in list(_held.values()):
        held[label] = held.get(label, 0) + nbytes
    return [replace(d, free_bytes=min(d.free_bytes + held[d.label], d.total_bytes), held_bytes=held[d.label])
            if held.get(d.label) and d.memory_known else d for d in devices]


#: a load that fails on a GPU is tried again with half the layers this many times, then
#: on the CPU (each try loads the weights again)
GPU_RETRIES = 2


_PREFIX = re.compile(r"^[\w:.]+:\s+")


def short_error(lines: Sequence[str], fallback: str = "") -> str:
    """llama.cpp's first error line (or ``fallback``) in a few words: out of device memory
    and a lost device said plainly, otherwise the message without its source prefixes
    ("" when there is neither)."""
    texts = [t.strip() for t in [*lines, fallback] if t and t.strip()]
    joined = " ".join(texts).lower()
    if any(w in joined for w in ("outofdevicememory", "out of memory", "outofmemory", "out of device memory")):
        return "out of device memory"
    if "devicelost" in joined or "device lost" in joined:
        return "the driver lost the device"
    if not texts:
        return ""
    text = texts[0]
    while (match := _PREFIX.match(text)) and match.end() < len(text):
        text = text[match.end():]
    return text if len(text) <= 80 else text[:79].rstrip() + "…"


def layer_counts(counts: Sequence[int]) -> str:
    """``[25, 12, 6]`` -> "25, 12 and 6 layers"; ``[1]`` -> "1 layer"."""
    words = [str(n) for n in counts]
    head = ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else "".join(words)
    return f"{head} layer" + ("" if list(counts) == [1] else "s")


def fewer(plan: GpuPlan, tried: int = 0, failed: Sequence[int] = (), why: str = "") -> GpuPlan | None:
    """The plan to try after ``plan`` failed to load (``tried``: retries so far): half the
    layers, up to :data:`GPU_RETRIES` times, then the CPU; None when ``plan`` was the CPU.
    The CPU's reason names ``why`` (llama.cpp's first error, :func:`short_error`) and the
    layer counts ``failed`` (those tried; ``plan``'s alone when not given)."""
    if not plan.on_gpu:
        return None
    layers = min(plan.layers, plan.total_layers) // 2 if tried < GPU_RETRIES else 0
    if layers == 0:
        counts = layer_counts(list(failed) or [plan.layers])
        said = f"{why} at {counts}" if why else f"tried with {counts}"
        return cpu_plan(plan.total_layers, f"the model did not load on {plan.device.label} "
                        f"({said}), so it runs on the CPU", notice=True,
                        all_bytes=plan.all_bytes)
    return replace(plan, layers=layers, notice=True,
                   reason=f"{plan.layers} layers did not load on {plan.device.label}; trying {layers}")


_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_BUFFER = re.compile(r"^\S+:\s+(\S+)\s+(model|KV|compute|output|RS) buffer size\s*=\s*([\d.]+) MiB")


@dataclass(frozen=True)
class Offload:
    """What llama.cpp's load log says it did."""

    #: ("offloaded N/M layers to GPU"); None when the log has no such line (a build
    #: without GPU offload says nothing)
    layers: int | None
    total: int | None
    #: MiB per buffer name ("Vulkan0", "CUDA0", "CPU_Mapped", "Vulkan_Host", ...)
    buffers: dict[str, float]
    #: of those, the compute buffers' MiB per buffer name
    compute: dict[str, float] = field(default_factory=dict)

    def device_buffers(self, cpu_names: Iterable[str] = ("CPU",)) -> dict[str, float]:
        """The buffers that are not in the computer's memory (``CPU``, ``CPU_Mapped``,
        ``CPU_REPACK``, a backend's ``*_Host`` pinned memory are)."""
        return _on_device(self.buffers, tuple(cpu_names))

    def device_compute_bytes(self, cpu_names: Iterable[str] = ("CPU",)) -> int:
        """The compute buffer llama.cpp reserved on the GPU, in bytes (0: none)."""
        return int(sum(_on_device(self.compute, tuple(cpu_names)).values()) * MiB)


def _on_device(buffers: Mapping[str, float], cpu_prefixes: tuple[str, ...]) -> dict[str, float]:
    return {name: mib for name, mib in buffers.items()
            if not name.startswith(cpu_prefixes) and not name.endswith("_Host")}


def offload_from_log(lines: Iterable[str]) -> Offload:
    """Read a load's log: the "offloaded N/M layers to GPU" line and the buffers."""
    layers = total = None
    buffers: dict[str, float] = {}
    compute: dict[str, float] = {}
    for line in lines:
        line = line.strip()
        match = _OFFLOADED.search(line)
        if match:
            layers, total = int(match[1]), int(match[2])
            continue
        match = _BUFFER.match(line)
        if match:
            buffers[match[1]] = buffers.get(match[1], 0.0) + float(match[3])
            if match[2] == "compute":
                compute[match[1]] = compute.get(match[1], 0.0) + float(match[3])
    return Offload(layers, total, buffers, compute)


# -- the measured compute buffer ------------------------------------------------------------


def compute_key(info: GGUFInfo, n_ctx: int, flash_attn: bool, n_ubatch: int = N_UBATCH) -> str:
    """What a compute buffer's size depends on, besides the device: the model file (its
    name and size), ``n_ctx``, flash attention and the physical batch."""
    try:
        size = info.path.stat().st_size
    except OSError:
        size = 0
    return f"{info.path.name}|{size}|n_ctx {n_ctx}|flash_attn {flash_attn}|n_ubatch {n_ubatch}"
