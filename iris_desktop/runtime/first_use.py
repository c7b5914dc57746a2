"""The first-use check of a GPU: a few greedy steps on it against the CPU's, so that a
driver that computes wrong answers is left off (and remembered, :class:`.gpu.GpuChecks`)."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from . import llama_binding
from .errors import GpuFailed
from .gpu import FAILED_RUNS_OFF, GpuChecks, GpuPlan, cpu_plan, short_error
from .loading import DeviceGone, device_params

log = logging.getLogger("iris.runtime")
T = TypeVar("T")

#: a plain-text prompt every model continues (no chat template: the check is about numbers)
CHECK_PROMPT = "The capital of France is Paris. The capital of Italy is"
CHECK_STEPS = 8
CHECK_CTX = 128
#: a swap of the top two tokens this close (in the CPU's logits) is a near tie, not a fault
TIE_LOGITS = 0.5


class ComputeFailed(Exception):
    """The GPU loaded the check's model, then failed to evaluate it (llama.cpp's error,
    :func:`.gpu.short_error`)."""


@dataclass(frozen=True)
class Step:
    """One greedy step: the top token and its text, and the five best (token, logit)."""

    token: int
    text: str
    top: tuple[tuple[int, float], ...]


def greedy_steps(path: Path, plan: GpuPlan, threads: int, flash_attn: bool,
                  forced: list[int] | None = None, steps: int = CHECK_STEPS) -> list[Step]:
    """``steps`` greedy steps after :data:`CHECK_PROMPT` with ``plan``'s device and layers;
    ``forced``: feed these tokens instead of the top ones (the CPU's: both runs then see
    the same text, so their steps compare one to one). On a GPU, an error after the load
    is :class:`ComputeFailed`; a GPU llama.cpp no longer has is :class:`.loading.DeviceGone`."""
    llm = llama_binding.load_llama(path, False, None, None, n_ctx=CHECK_CTX, n_batch=CHECK_CTX, n_threads=threads,
                      n_threads_batch=threads, flash_attn=flash_attn, seed=0, **device_params(plan))
    try:
        return _run_steps(llm, forced, steps)
    except Exception as exc:
        if not plan.on_gpu:
            raise
        raise ComputeFailed(short_error(llama_binding.recent_llama_errors(), str(exc))) from exc
    finally:
        llm.close()


def _run_steps(llm: Any, forced: list[int] | None, steps: int) -> list[Step]:
    import llama_cpp
    import numpy as np

    llm.eval(llm.tokenize(CHECK_PROMPT.encode("utf-8"), add_bos=True, special=False))
    n_vocab = llm.n_vocab()
    out = []
    for i in range(steps):
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,)).copy()
        best = np.argsort(logits)[-5:][::-1]
        token = int(best[0])
        out.append(Step(token, llm.detokenize([token]).decode("utf-8", "replace"),
                        tuple((int(t), float(logits[t])) for t in best)))
        llm.eval([forced[i] if forced is not None else token])
    return out


def compare_steps(cpu: list[Step], gpu: list[Step]) -> tuple[bool, str]:
    """Whether the GPU's greedy steps agree with the CPU's: the same top token at every
    step, or a near tie the CPU also saw (the GPU's choice within :data:`TIE_LOGITS` of
    the CPU's top); and what was found, in words."""
    if len(cpu) != len(gpu) or not cpu:
        return False, f"the runs gave {len(cpu)} and {len(gpu)} steps"
    ties = 0
    for i, (c, g) in enumerate(zip(cpu, gpu, strict=True)):
        if c.token == g.token:
            continue
        cpu_logits = dict(c.top)
        if g.token in cpu_logits and cpu_logits[c.token] - cpu_logits[g.token] <= TIE_LOGITS:
            ties += 1
            continue
        return False, (f"step {i + 1} of {len(cpu)}: the GPU's top token {g.text!r} is not the "
                       f"CPU's {c.text!r}")
    return True, f"the same top token at all {len(cpu)} steps" + (f" ({ties} near ties)" if ties else "")


def first_use_check(path: Path, plan: GpuPlan, threads: int, flash_attn: bool = True) -> tuple[bool, str]:
    """Run :data:`CHECK_STEPS` greedy steps on the CPU, then the same text on ``plan``'s
    GPU, and compare (:func:`compare_steps`)."""
    cpu = greedy_steps(path, cpu_plan(plan.total_layers, "the first-use check's reference"), threads,
                        flash_attn)
    gpu = greedy_steps(path, plan, threads, flash_attn, forced=[s.token for s in cpu])
    return compare_steps(cpu, gpu)


def checked_plan(path: Path, plan: GpuPlan, checks: GpuChecks, threads: int, stage: Any,
             cancel: threading.Event | None, flash_attn: bool = True) -> GpuPlan:
    """``plan``, or the CPU when its GPU, with this driver, disagrees with the CPU in the
    first-use check (run now when it has not been, and remembered in ``checks``)."""
    if checks.result(plan.device) is not None:
        return plan  # checked with this driver, and it agreed (plan_gpu left out one that did not)
    if stage is not None:
        stage("checking")
    try:
        agrees, detail = first_use_check(path, plan, threads, flash_attn)
    except DeviceGone as gone:  # nothing was checked: nothing recorded
        return gone.cpu()
    except ComputeFailed as exc:
        log.warning("%s: %s loaded the first-use check's model but failed to compute (%s)", path.name,
                    plan.device.label, exc)
        checks.record(plan.device, False, f"it failed to compute: {exc}", reason=(
            f"it failed to compute in Iris's first-use check ({exc}); it stays off until its driver changes"))
        return cpu_plan(plan.total_layers, f"{plan.device.label} failed to compute in Iris's first-use check "
                        f"({exc}); it stays off for Iris until its driver changes", notice=True,
                        all_bytes=plan.all_bytes)
    except Exception as exc:  # a failure to load: the load below tries the GPU again, and says why
        log.warning("%s: the first-use check on %s could not run (%s)", path.name, plan.device.label, exc)
        return plan
    finally:
        if stage is not None:
            stage("loading")
    checks.record(plan.device, agrees, detail)
    log.log(logging.INFO if agrees else logging.WARNING, "first-use check of %s (driver %s): %s",
            plan.device.label, plan.device.driver or "unknown", detail)
    if agrees:
        return plan
    return cpu_plan(plan.total_layers, f"{plan.device.label} gave other answers than the CPU in Iris's "
                    f"first-use check ({detail}); it stays off for Iris until its driver changes",
                    notice=True, all_bytes=plan.all_bytes)



#: how llama-cpp-python says llama_decode failed; -2 (a buffer could not be allocated) and
#: -3 (the computation failed) are the device's failures, 1 (no room in the KV cache) and 2
#: (aborted on purpose: Stop, a send preempting a prefill) are not
_DECODE_FAILED = re.compile(r"llama_decode returned (-?\d+)")


def gpu_failure(model: Any, exc: BaseException, during: str = "a reply") -> GpuFailed | None:
    """What to raise for ``exc``, raised while ``model`` (a :class:`.model.LocalModel`)
    computed ``during`` (a reply, or a warm-up: :data:`WARM_UP`): :class:`~.errors.GpuFailed`
    when it is llama.cpp's decode failing on the model's GPU, which is then recorded off in
    its ``gpu_checks`` (:meth:`.gpu.GpuChecks.failed_in_use`: for this run, as the failure
    may be a one-off, another app holding its memory, and the first load of a later run
    checks the GPU again; until its driver changes once it failed in use in
    :data:`.gpu.FAILED_RUNS_OFF` runs in a row) and said in ``gpu_failed``; None otherwise
    (``exc`` as it is: the CPU's failures, a prompt too long, a closed model)."""
    plan: GpuPlan = model.gpu
    match = _DECODE_FAILED.search(str(exc)) if plan.on_gpu and isinstance(exc, RuntimeError) else None
    if match is None or int(match[1]) > -2:
        return None
    said = short_error(llama_binding.recent_llama_errors(), str(exc))
    error = said if said == str(exc) else f"{said}; {exc}"
    checks = GpuChecks(model.gpu_checks)
    runs = checks.failed_in_use(plan.device, during, error)
    log.error("%s failed during %s (%s); switched off %s", plan.device.label, during, error,
              "for this run of Iris" if runs < FAILED_RUNS_OFF else f"until its driver changes ({runs} runs in a row)")
    failed = GpuFailed(plan.device.label, error, "the reply" if during == "a reply" else during,
                       runs=runs if runs >= FAILED_RUNS_OFF else 1, again=checks.again(plan.device))
    model.gpu_failed = str(failed)
    return failed


def gpu_worked(model: Any, finish: str = "stop") -> None:
    """A reply (``finish``: how it ended) or a warm-up of ``model`` completed: on a GPU, its
    count of runs that failed in use starts again (:meth:`.gpu.GpuChecks.worked`: once per
    run, a write only when there was a count). A stopped or failed one proves nothing."""
    plan: GpuPlan = model.gpu
    if plan.on_gpu and model.gpu_checks is not None and not model.gpu_failed and finish in ("stop", "length"):
        GpuChecks(model.gpu_checks).worked(plan.device)


#: what a prefill is, in :func:`gpu_failure`'s words: the draft's while the user types, or
#: the one after a compaction
WARM_UP = "a warm-up"


def gpu_failures(model: Any, steps: Iterator[T], during: str = WARM_UP) -> Iterator[T]:
    """``steps`` (a prefill's, of ``model``), with llama.cpp's decode failing on its GPU
    recorded off and raised as :class:`~.errors.GpuFailed` (:func:`gpu_failure`), as a
    reply's failure is (before: a warm-up's was only logged, and the next reply failed
    on the same GPU); one that evaluated something and ended is noted (:func:`gpu_worked`)."""
    evaluated = False
    try:
        for step in steps:
            evaluated = True
            yield step
    except Exception as exc:
        if (failed := gpu_failure(model, exc, during)) is not None:
            raise failed from exc
        raise
    if evaluated:
        gpu_worked(model)
