"""Loading a GGUF into llama.cpp on the device its plan chose: llama.cpp's device
parameters, the exact Q8_0 copy of Q5_0 weights, and the retries: a load that fails on a
GPU is tried with fewer layers, then on the CPU, and the plan is checked against what
llama.cpp's log says it loaded."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from iris_desktop.units import memory_size

from . import llama_binding
from .errors import ModelError
from .gguf import GGUFInfo
from .gpu import (
    OFF,
    Device,
    GpuChecks,
    GpuPlan,
    MeasuredCompute,
    MiB,
    compute_key,
    cpu_plan,
    fewer,
    margin,
    offload_from_log,
    plan_gpu,
    plan_model,
    short_error,
)
from .llama_binding import captured_log, recent_llama_errors
from .weights import Cancelled as CopyCancelled
from .weights import WeightsError, q8_copy
from .weights import discard as discard_q8_copy

log = logging.getLogger("iris.runtime")


def cpu_only_params() -> dict[str, Any]:
    """``Llama`` keywords that keep a model off every GPU: no layer offloaded, no device
    (split mode none with main_gpu -1), and op_offload off, so no big batch is sent to a
    GPU either. For ``model.gpu=off``, and for the embedder, which stays on the CPU (a
    chat message embeds in 5–10 ms on one thread; a GPU would only add a second copy of
    its buffers beside the chat model's)."""
    import llama_cpp

    return dict(n_gpu_layers=0, split_mode=llama_cpp.LLAMA_SPLIT_MODE_NONE, main_gpu=-1, op_offload=False)


class DeviceGone(Exception):
    """``plan``'s GPU was listed, yet llama.cpp has no handle for it now (unplugged, or the
    list changed): the CPU runs the model (:meth:`cpu`), and no check is recorded for it."""

    def __init__(self, plan: GpuPlan):
        super().__init__(f"{plan.device.label} is no longer among llama.cpp's devices")
        self.plan = plan

    def cpu(self) -> GpuPlan:
        return cpu_plan(self.plan.total_layers, f"{self}, so the CPU runs the model", notice=True,
                        all_bytes=self.plan.all_bytes)


def device_params(plan: GpuPlan) -> dict[str, Any]:
    """llama.cpp's parameters for ``plan``. The CPU: no layer offloaded and no device at
    all (split mode none with main_gpu -1 leaves the model without devices, and op_offload
    off keeps big batches from being sent to a GPU), so no GPU buffer is created. A GPU:
    its layers, on that one device (``device``: ggml's handle, for the ``devices`` list);
    :class:`DeviceGone` when llama.cpp has no handle for it."""
    import llama_cpp

    cpu = {**cpu_only_params(), "device": None}
    if not plan.on_gpu:
        return cpu
    from .devices import device_handle

    handle = device_handle(plan.device)
    if handle is None:  # gone, or never one of ggml's: never "every device" in its place
        log.warning("%s is not among llama.cpp's devices", plan.device.label)
        raise DeviceGone(plan)
    return dict(n_gpu_layers=plan.layers, split_mode=llama_cpp.LLAMA_SPLIT_MODE_LAYER, main_gpu=0,
                op_offload=True, device=handle)


def q8_weights(source: Path, info: GGUFInfo, folder: Path, progress: Any,
                cancel: threading.Event | None, stage: Any = None) -> tuple[Path, str, Any]:
    """The file to load (``source``'s exact Q8_0 copy when it has Q5_0 weights), what
    it is, and the progress callback for the load after it: when a copy is written,
    ``stage("copying")`` says so first and ``stage("loading")`` after it, and the copy
    takes the first 80% of ``progress``, the load the rest."""
    wrote = False

    def copying(fraction: float) -> None:
        nonlocal wrote
        if not wrote and stage is not None:
            stage("copying")
        wrote = True
        if progress is not None:
            progress(0.8 * fraction)

    try:
        path = q8_copy(source, folder, info=info, progress=copying, cancel=cancel)
    except CopyCancelled:
        raise ModelError(source, "loading was cancelled") from None
    except WeightsError as exc:
        log.warning("%s: loading the file as it is, without the 8-bit copy: %s", source, exc)
        return source, f"as published (no 8-bit copy: {exc})", progress
    if path == source:
        return source, "as published (no Q5_0 weights)", progress
    if wrote and stage is not None:
        stage("loading")
    after = (lambda f: progress(0.8 + 0.2 * f)) if wrote and progress is not None else progress
    return path, f"Q5_0 read as Q8_0 (the same values; {path})", after


@dataclass
class GpuRoom:
    """What the model in use holds on its GPU when another is loaded in its place (a reload:
    the driver's free figure leaves those bytes out, so the new plan counted them as taken
    and a model that fits went to the CPU), and how to give them back: ``release`` closes
    the model in use (the host saves its chat's KV state first). :func:`plan_device` counts
    them as free, and releases them before anything is loaded only when the plan needs them;
    a load that then fails loads the model in use again (:meth:`restore`)."""

    device: str
    held: int
    release: Callable[[], None]
    #: the model in use's file (named when it does not load again)
    path: Path
    released: bool = False

    @classmethod
    def of(cls, runtime: Any, release: Callable[[], None]) -> GpuRoom | None:
        """The room the model in use ``runtime`` gives back (None: none is loaded, a server,
        or it runs on the CPU)."""
        plan = getattr(runtime, "gpu", None)
        if not isinstance(plan, GpuPlan) or not plan.on_gpu or getattr(runtime, "closed", True):
            return None
        return cls(plan.device.label, plan.device_bytes or plan.needed_bytes, release, Path(runtime.path))

    def counted(self, devices: list[Device]) -> list[Device]:
        """``devices`` with the held bytes counted as free on their device."""
        return [replace(d, free_bytes=d.free_bytes + self.held, held_bytes=d.held_bytes + self.held)
                if d.label == self.device and d.memory_known else d for d in devices]

    def make(self, plan: GpuPlan) -> GpuPlan:
        """``plan`` (made with :meth:`counted` devices), the model in use closed first when the
        plan needs what it holds (it does not fit beside it, or the device's memory is not
        known); the plan's reason then says what was given back."""
        device = plan.device
        if not plan.on_gpu or device.label != self.device:
            return plan
        if device.memory_known and plan.needed_bytes + margin(device) <= device.free_bytes - self.held:
            return plan  # it fits beside the model in use, which answers until the swap
        log.info("closing the model in use first: the plan for %s needs the %d bytes it holds", device.label,
                 self.held)
        self.release()
        self.released = True
        return replace(plan, reason=f"{plan.reason}, counting the {memory_size(self.held)} the model "
                       "in use gave back")

    def restore(self, failed: BaseException, load: Callable[[], Any]) -> Any:
        """The model in use, closed to make room for one that ``failed`` to load, loaded again
        (``load``); ModelError saying both when it does not load either."""
        try:
            return load()
        except Exception as exc:
            raise ModelError(self.path, f"it was closed to make room on {self.device} for a model that did "
                             f"not load ({failed}), and it did not load again ({exc}); no model is loaded; "
                             "Model ▸ Reload tries again") from None


def plan_device(info: GGUFInfo, n_ctx: int, gpu: str | int, devices: list[Device] | None,
          gpu_checks: str | os.PathLike[str] | None, *, swa_full: bool, flash_attn: bool,
          room: GpuRoom | None = None) -> GpuPlan:
    """The device and layers for ``model.gpu`` (:func:`.gpu.plan_gpu`), leaving out a GPU
    the first-use check switched off, with the compute buffer measured at an earlier load of
    the same model and settings on that device where there was one (kept beside
    ``gpu_checks``). No device is looked for with ``off``. ``room``: the model being
    replaced's GPU memory, counted as free (and given back when the plan needs it,
    :meth:`GpuRoom.make`)."""
    if gpu == OFF:
        return plan_gpu(info, n_ctx, [], OFF)
    if devices is None:
        from .devices import list_devices

        try:
            devices = list_devices()
        except Exception as exc:  # a driver that fails to answer never keeps the CPU from running
            log.warning("cannot list llama.cpp's devices (%s); the CPU runs the model", exc)
            devices = []
    disabled = GpuChecks(gpu_checks).disabled(devices) if gpu_checks is not None else {}
    if room is not None:
        devices = room.counted(devices)
    plan, _ = plan_model(info, n_ctx, devices, gpu, disabled=disabled, swa_full=swa_full, flash_attn=flash_attn,
                         gpu_checks=gpu_checks)
    if room is not None:
        plan = room.make(plan)
    log.info("%s at n_ctx %d, model.gpu %s: %s (%s)", info.path.name, n_ctx, gpu, plan.describe(), plan.reason)
    return plan


def load_planned(path: Path, plan: GpuPlan, scratch: bool, progress: Any, cancel: threading.Event | None,
                  params: dict[str, Any]) -> tuple[Any, GpuPlan]:
    """Load with ``plan``; a load that fails on a GPU is tried with half the layers, then
    on the CPU (:func:`.gpu.fewer`). Returns the Llama and the plan as llama.cpp's log
    says it loaded (:func:`as_loaded`)."""
    failed: list[int] = []
    first = ""
    while True:
        try:
            device = device_params(plan)
        except DeviceGone as gone:
            plan = gone.cpu()
            continue
        with captured_log() as lines:
            try:
                llm = llama_binding.load_llama(path, scratch, progress, cancel, **params, **device)
            except Exception as exc:
                if not plan.on_gpu or (cancel is not None and cancel.is_set()):
                    raise  # llama.cpp's errors stay for the caller's sentence
                errors = recent_llama_errors()
                first = first or short_error(errors, "" if str(exc).startswith("Failed to load model") else str(exc))
                failed.append(plan.layers)
                after = fewer(plan, len(failed) - 1, failed, first)
                assert after is not None  # a GPU plan always has a next one
                log.warning("%s: %d layers on %s did not load (%s); now: %s", path.name, plan.layers,
                            plan.device.label, "; ".join(errors) or str(exc), after.describe())
                plan = after
                continue
        return llm, as_loaded(path, plan, offload_from_log(lines))


def load_weights(source: Path, load_path: Path, weights: str, weights_dir: Any, plan: GpuPlan,
                  scratch: bool, progress: Any, cancel: threading.Event | None,
                  params: dict[str, Any]) -> tuple[Any, GpuPlan, Path, str]:
    """:func:`load_planned` on ``load_path``; when that is the Q8_0 copy and it does not
    load, the copy is discarded and ``source`` loaded as it is. Returns the Llama, the
    plan it loaded with, the file and how its weights were read."""
    try:
        llm, plan = load_planned(load_path, plan, scratch, progress, cancel, params)
        return llm, plan, load_path, weights
    except Exception:
        if load_path == source or (cancel is not None and cancel.is_set()):
            raise
    # the copy is at fault (the source loads below, or says why not)
    why = "; ".join(recent_llama_errors())
    log.warning("%s: llama.cpp could not load the Q8_0 copy %s (%s); loading the file as it is",
                source, load_path, why)
    discard_q8_copy(source, Path(weights_dir))
    llm, plan = load_planned(source, plan, scratch, progress, cancel, params)
    return llm, plan, source, "as published (the 8-bit copy did not load)"


def remember_compute(plan: GpuPlan, info: GGUFInfo, n_ctx: int, flash_attn: bool,
                     gpu_checks: str | os.PathLike[str] | None) -> None:
    """Keep the compute buffer llama.cpp reserved at this load beside ``gpu_checks``: the
    next plan with these facts uses it, not the estimate (:class:`.gpu.MeasuredCompute`)."""
    if plan.on_gpu and plan.measured_compute and gpu_checks is not None:
        MeasuredCompute.beside(gpu_checks).record(plan.device, compute_key(info, n_ctx, flash_attn),
                                                  plan.measured_compute)


def as_loaded(path: Path, plan: GpuPlan, offload: Any) -> GpuPlan:
    """``plan`` checked against the load log (``offload``: :func:`.gpu.offload_from_log`):
    the layers llama.cpp says it offloaded, and the CPU when it made no buffer on a GPU."""
    on_device = offload.device_buffers()
    if not plan.on_gpu:
        if on_device:  # never expected: the CPU plan loads with no device at all
            log.error("%s: planned for the CPU, yet llama.cpp made GPU buffers: %s", path.name, on_device)
        return plan
    layers = offload.layers or 0
    if not on_device or layers == 0:
        return cpu_plan(plan.total_layers, f"llama.cpp put no layer on {plan.device.label} (its load "
                        "log shows no buffer there), so the CPU runs the model", notice=True,
                        all_bytes=plan.all_bytes)
    if offload.total and offload.total != plan.total_layers:
        log.warning("%s: llama.cpp counts %d layers, the plan %d", path.name, offload.total, plan.total_layers)
    device_bytes = int(sum(on_device.values()) * MiB)  # what closing the model gives back
    if layers != min(plan.layers, plan.total_layers) or (offload.total and offload.total != plan.total_layers):
        return replace(plan, layers=layers, total_layers=offload.total or plan.total_layers, notice=True,
                       reason=f"{plan.reason}; llama.cpp offloaded {layers}/{offload.total}",
                       measured_compute=offload.device_compute_bytes(), device_bytes=device_bytes)
    log.info("%s: offloaded %d/%d layers to %s, as planned (%s)", path.name, layers, offload.total,
             plan.device.label, ", ".join(f"{k} {v:.0f} MiB" for k, v in on_device.items()))
    return replace(plan, measured_compute=offload.device_compute_bytes(), device_bytes=device_bytes)

