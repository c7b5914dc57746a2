"""One model to suggest for this computer, from Model ▸ Download…'s list (``hub.RECOMMENDED``).

:func:`recommend` is pure: it decides from a :class:`Machine` (the computer's memory, its
physical cores, and the GPU ``model.gpu auto`` would use, with its free memory) and the
models' published facts. Nothing is contacted; :meth:`Machine.this_computer` reads the
facts from this computer (:mod:`.cpu`, :mod:`.devices`). How it decides:

1. **Fits with headroom.** A model needs its file plus its KV cache at ``n_ctx`` (the
   library's estimate, :meth:`.hub.Recommended.memory_estimate_bytes`). On the CPU that
   must be at most half the computer's memory (:data:`MEMORY_SHARE`: the other half is
   for the system, the app and whatever else runs). On a GPU the whole model, plus
   llama.cpp's compute buffer (:data:`COMPUTE_BYTES` allowed), must fit the GPU's free
   memory less the margin a GPU plan keeps (:func:`.gpu.margin`), and the computer's
   memory must still hold the model with 1 GiB to spare (:func:`.hub.fits_in_memory`), so
   that it runs on the CPU if the GPU cannot. A model that fits a GPU only in part is
   judged as on the CPU.
2. **Speed class** (a rule, no tokens/s claimed). On the GPU: ``fast`` (not said: the GPU
   has not run it yet; the sentence says it fits, and that the first use checks it). On the CPU a
   token reads every weight once, the physical cores sharing the work: up to
   :data:`FAST_BYTES_PER_CORE` (0.3 GB) of file per core is ``fast``, up to
   :data:`USABLE_BYTES_PER_CORE` (0.8 GB) ``usable``, more ``slow``; a file over
   :data:`CPU_FAST_MAX_BYTES` (3 GB) is at best ``usable`` on a CPU, where memory
   bandwidth rather than cores bounds it.
3. **The pick.** The first model of :data:`PREFERENCE` (better first) that fits and is not
   ``slow``. When none fits, or every one that fits would be slow, the answer is to keep
   the bundled model, and ``why`` says which.

Sizes in the sentences: memory in GB of 2**30 (as memory is sold), files in GB of 10**9
(as the download dialog shows them). Never imports PySide6.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from iris_desktop.units import file_size, memory_size

from .cpu import physical_cores, system_memory_bytes
from .gpu import AUTO, OFF, Device, GpuChecks, margin, with_held
from .hub import RECOMMENDED, Recommended, fits_in_memory

log = logging.getLogger("iris.runtime.recommend")

__all__ = ["PREFERENCE", "Machine", "Recommendation", "recommend", "speed_class", "usable_gpu"]

GiB = 2**30
#: on the CPU a model may need at most this share of the computer's memory
MEMORY_SHARE = 0.5
#: llama.cpp's compute buffer on a GPU, allowed for every model of the list (Qwen2.5 7B's
#: 152,064-token vocabulary needs about 410 MiB at the default batch)
COMPUTE_BYTES = 512 * 2**20
FAST_BYTES_PER_CORE = 300_000_000
USABLE_BYTES_PER_CORE = 800_000_000
CPU_FAST_MAX_BYTES = 3_000_000_000
SPEEDS = ("fast", "usable", "slow")
#: the recommended models, better first (by repository). Llama 3.2 3B comes before
#: Qwen2.5 3B, whose license forbids commercial use; Phi-3.5 mini's large KV cache per
#: token keeps it out of reach wherever Qwen2.5 7B does not fit in memory
PREFERENCE = (
    "bartowski/Qwen2.5-7B-Instruct-GGUF",
    "bartowski/Phi-3.5-mini-instruct-GGUF",
    "bartowski/Llama-3.2-3B-Instruct-GGUF",
    "Qwen/Qwen2.5-3B-Instruct-GGUF",
    "Qwen/Qwen2.5-1.5B-Instruct-GGUF",
    "bartowski/Llama-3.2-1B-Instruct-GGUF",
)


@dataclass(frozen=True)
class Machine:
    """What the recommendation reads of a computer. ``memory_bytes`` None: unknown;
    ``gpu``: the GPU a model would run on (None: the CPU only)."""

    memory_bytes: int | None
    cores: int
    gpu: Device | None = None

    @classmethod
    def this_computer(cls, gpu_setting: str | int = AUTO, gpu_checks: str | os.PathLike[str] | None = None,
                      platform: str = sys.platform) -> Machine:
        """This computer: its memory, its physical cores, and unless ``gpu_setting``
        (``model.gpu``) is off, the GPU :func:`usable_gpu` finds among llama.cpp's devices
        (leaving out one the first-use check in ``gpu_checks`` switched off). Contacts
        nothing; a device list that fails means no GPU."""
        gpu = None
        if gpu_setting != OFF:
            try:
                from .devices import list_devices

                devices = with_held(list_devices())  # the loaded model's GPU memory is the new one's
            except Exception as exc:  # a driver that does not answer: the CPU is judged alone
                log.info("no device list for the recommendation: %s", exc)
                devices = []
            disabled = GpuChecks(gpu_checks).disabled(devices) if gpu_checks is not None else {}
            gpu = usable_gpu(devices, disabled, platform)
        return cls(system_memory_bytes(), physical_cores(), gpu)

    def as_json(self) -> dict[str, Any]:
        return {"memory_bytes": self.memory_bytes, "cores": self.cores,
                "gpu": self.gpu.as_json() if self.gpu else None}


def usable_gpu(devices: Sequence[Device], disabled: Mapping[str, str] | None = None,
               platform: str = sys.platform) -> Device | None:
    """The GPU ``model.gpu auto`` would take (:func:`.gpu.plan_gpu`): the discrete one with
    the most free memory, an integrated one on a Mac only; one that does not report its
    memory, or that is off for Iris, does not count."""
    disabled = disabled or {}
    kinds = ("gpu", "igpu") if platform == "darwin" else ("gpu",)
    found = [d for d in devices if d.kind in kinds and d.label not in disabled and d.free_bytes > 0]
    for kind in kinds:  # a discrete GPU first
        of_kind = [d for d in found if d.kind == kind]
        if of_kind:
            return max(of_kind, key=lambda d: d.free_bytes)
    return None


@dataclass(frozen=True)
class Recommendation:
    """The model to download (None: keep the bundled one), why in one sentence, and how
    fast it should run (``fast``, ``usable``, ``slow``; None without a model)."""

    model: Recommended | None
    why: str
    n_ctx: int
    speed: str | None = None
    on_gpu: bool = False
    #: what the model needs: weights plus KV cache at ``n_ctx`` (0 without a model)
    memory_bytes: int = 0

    @property
    def size_bytes(self) -> int:
        return self.model.size_bytes if self.model else 0

    @property
    def file(self) -> tuple[str, str] | None:
        """(repository, file) of the model, or None."""
        return (self.model.repo, self.model.file) if self.model else None

    @property
    def button_text(self) -> str:
        """"Download Llama 3.2 3B Instruct (2.0 GB)"; "" without a model."""
        return f"Download {self.model.title} ({file_gb(self.size_bytes)})" if self.model else ""

    def as_json(self) -> dict[str, Any]:
        return {"repo": self.model.repo if self.model else None, "file": self.model.file if self.model else None,
                "title": self.model.title if self.model else None, "size_bytes": self.size_bytes,
                "speed": self.speed, "on_gpu": self.on_gpu, "n_ctx": self.n_ctx,
                "memory_bytes": self.memory_bytes, "why": self.why}


def file_gb(n: int) -> str:
    return file_size(n, gb_digits=1)


def speed_class(size_bytes: int, cores: int, on_gpu: bool = False) -> str:
    """"fast", "usable" or "slow" for a file of ``size_bytes`` on ``cores`` physical cores
    (or on a GPU that holds it whole); the rule is in the module's docstring."""
    if on_gpu:
        return "fast"
    per_core = size_bytes / max(1, cores)
    if per_core <= FAST_BYTES_PER_CORE and size_bytes <= CPU_FAST_MAX_BYTES:
        return "fast"
    return "usable" if per_core <= USABLE_BYTES_PER_CORE else "slow"


def _window(n_ctx: int) -> str:
    text = f"{n_ctx:,}"
    return f"{'an' if text.startswith(('8', '11,', '18,')) else 'a'} {text}-token window"


def _fits_gpu(rec: Recommended, estimate: int, machine: Machine) -> bool:
    gpu = machine.gpu
    if gpu is None or gpu.free_bytes <= 0:
        return False
    return (estimate + COMPUTE_BYTES <= gpu.free_bytes - margin(gpu)
            and bool(fits_in_memory(estimate, machine.memory_bytes)))


def _ordered(models: Sequence[Recommended]) -> list[Recommended]:
    rank = {repo: i for i, repo in enumerate(PREFERENCE)}
    return sorted(models, key=lambda m: (rank.get(m.repo, len(rank)), -m.size_bytes))


def recommend(machine: Machine, n_ctx: int = 8192,
              models: Sequence[Recommended] = RECOMMENDED) -> Recommendation:
    """The model of ``models`` to suggest for ``machine`` at ``n_ctx`` (``model.n_ctx``; 0:
    each model's trained context), or None with the reason to keep the bundled model.
    Pure; the rule is in the module's docstring."""
    memory = machine.memory_bytes
    if not memory:
        return Recommendation(None, "Iris cannot tell how much memory this computer has, so it "
                              "suggests no download: the bundled model stays.", n_ctx)
    fitting, slow = [], []
    for rec in _ordered(models):
        ctx = n_ctx if n_ctx > 0 else rec.context_length
        estimate = rec.memory_estimate_bytes(ctx)
        on_gpu = _fits_gpu(rec, estimate, machine)
        if not on_gpu and estimate > memory * MEMORY_SHARE:
            continue
        speed = speed_class(rec.size_bytes, machine.cores, on_gpu)
        (slow if speed == "slow" else fitting).append((rec, ctx, estimate, on_gpu, speed))
    if fitting:
        rec, ctx, estimate, on_gpu, speed = fitting[0]
        return Recommendation(rec, _why(machine, ctx, on_gpu, speed), ctx, speed, on_gpu, estimate)
    cores = f"{machine.cores} CPU core" + ("s" if machine.cores != 1 else "")
    if slow:
        return Recommendation(None, f"Every larger model that fits in your {memory_size(memory)} of memory "
                              f"would be slow on your {cores}, so the bundled model stays the better "
                              "choice here.", n_ctx)
    need = ""
    if models:
        smallest = min(models, key=lambda m: m.memory_estimate_bytes(n_ctx if n_ctx > 0 else m.context_length))
        ctx = n_ctx if n_ctx > 0 else smallest.context_length
        need = (f" (the smallest, {smallest.title}, needs {memory_size(smallest.memory_estimate_bytes(ctx))} "
                f"with {_window(ctx)}: more than half of it)")
    return Recommendation(None, f"Your {memory_size(memory)} of memory leaves no room for a larger model"
                          f"{need}, so keep the bundled model.", n_ctx)


def _why(machine: Machine, n_ctx: int, on_gpu: bool, speed: str) -> str:
    start = f"It fits in your {memory_size(machine.memory_bytes or 0)} of memory with room for {_window(n_ctx)}"
    if on_gpu:  # what is known is its memory: how fast it runs there is not (it has not run yet)
        gpu = machine.gpu
        return (f"{start}; it fits whole in the {memory_size(gpu.free_bytes)} free on your GPU ({gpu.label}), "
                "where Iris checks its answers against the CPU's at the first use.")
    cores = f"{machine.cores} CPU core" + ("s" if machine.cores != 1 else "")
    pace = "fast" if speed == "fast" else "at a usable speed"
    return f"{start}; on your {cores} it runs {pace}."
