"""The local model: loading, exact token counting, streaming generation.

One :class:`LocalModel` owns one ``llama_cpp.Llama`` (one context, one KV cache).
Every request goes through that instance, so consecutive requests whose prompts share
a prefix only evaluate the new suffix: llama-cpp-python's ``Llama.generate`` keeps the
longest common prefix of the tokens already in the context and removes the rest from
the KV cache. The chat formats (see :mod:`.chat_format`) make a conversation's prompt
grow by appending, so turn N+1 reuses all of turn N.

Prompts are built at token level: template text is tokenized with control tokens
recognized, message content as plain text (a user who types ``<end_of_turn>`` gets the
literal text, not a turn boundary). The token list llama.cpp evaluates is exactly
``prefix + message tokens... + generation prompt``, the same tokens the counter counts.

Generation drives ``Llama.generate`` directly rather than ``create_completion``: the
KV-prefix reuse is the same (it lives in ``generate``), and we get the token ids, so
completion-token counts are exact, control tokens like ``<start_of_turn>`` stop
generation, and ``cancel`` is checked between every two tokens.

Sliding-window attention (Gemma 2/3): by default llama.cpp keeps only the last
``n_swa + n_ubatch`` positions of the SWA layers. Removing the tail of the cache and
continuing from an earlier position then silently loses the window the SWA layers need
(llama-cpp-python does not check; llama-server does). ``load(swa_full=True)`` (the
default, and llama.cpp's own default for ``llama_context_default_params``) keeps a
full-size SWA cache, so any prefix can be reused. With ``swa_full=False`` we apply
llama-server's rule and fall back to a full re-evaluation when the cache no longer
holds the window the reused prefix needs.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import hashlib
import json
import logging
import os
import re
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from iris_desktop.generation import GenerationRequest, GenerationStats
from iris_desktop.stop import Stop
from iris_desktop.tokens import Message, continues_reply

from .backends import load_backends
from .chat_format import ChatFormat, select_chat_format
from .cpu import physical_cores
from .errors import ModelError, PromptTooLongError
from .gguf import GGUFError, GGUFInfo, read_gguf_info
from .gpu import OFF, Device, GpuChecks, GpuPlan, cpu_plan, fewer, offload_from_log, plan_gpu
from .library import is_base_model
from .protocol import (
    Capabilities,
    Generation,
    KVState,
    ModelFacts,
    Prefill,
    PrefillStats,
)
from .weights import Cancelled as CopyCancelled
from .weights import WeightsError, q8_copy
from .weights import discard as discard_q8_copy

log = logging.getLogger("iris.runtime")
#: the one sequence of a context: its KV cache is what a KV state holds
_SEQ_ID = 0

__all__ = [
    "ModelError",
    "PromptTooLongError",
    "LocalModel",
    "ModelTokenCounter",
]


# ---------------------------------------------------------------------------
# llama.cpp plumbing


class EvalStopped(Exception):
    """A prompt evaluation was stopped between two chunks (cancel, deadline or close)."""

    def __init__(self, evaluated: int, total: int) -> None:
        super().__init__(f"stopped after {evaluated} of {total} prompt tokens")
        self.evaluated = evaluated


_llama_class: Any = None
_log_state: dict[str, Any] = {}
#: ``stopping``: the stop check of the decode running on this thread, if any
_decoding = threading.local()
llama_log = logging.getLogger("iris.runtime.llama")


def _counting_llama_class() -> Any:
    """``llama_cpp.Llama`` that counts the tokens it evaluates (``iris_evaluated``), so
    the statistics report what llama.cpp actually evaluated, not a prediction."""
    global _llama_class
    if _llama_class is None:
        import llama_cpp

        class CountingLlama(llama_cpp.Llama):
            """Counts the tokens it evaluates, and stops a long prompt part-way when
            ``iris_should_stop`` says so: llama.cpp's abort callback asks it between two
            nodes of the compute graph, so Stop, a timeout or a closing app act within a
            fraction of a second while batches stay full size (small batches would make
            every prompt slower). The ubatches already computed stay in the KV cache up
            to ``n_tokens``; the next evaluation clears the rest and reuses that part."""

            iris_evaluated = 0
            iris_should_stop: Any = None
            iris_progress: Any = None  # called with (evaluated, to evaluate) after each batch

            def eval(self, tokens):  # type: ignore[override]
                tokens = list(tokens)
                for start in range(0, len(tokens), self.n_batch):
                    part = tokens[start:start + self.n_batch]
                    if start and self._iris_stopping():
                        raise EvalStopped(start, len(tokens))
                    _decoding.stopping = self._iris_stopping  # what llama's log asks
                    try:
                        super().eval(part)
                    except RuntimeError as exc:
                        if "returned 2" in str(exc):  # llama_decode: aborted by the callback
                            raise EvalStopped(start, len(tokens)) from None
                        raise
                    finally:
                        _decoding.stopping = None
                    self.iris_evaluated += len(part)
                    if self.iris_progress is not None:
                        self.iris_progress(start + len(part), len(tokens))

            def iris_decode_at(self, tokens, step=None):
                """Evaluate ``tokens`` at positions ``n_tokens``… as :meth:`eval` does, but
                without first clearing the cache from ``n_tokens`` on (``Llama.eval``
                does): :meth:`LocalModel._shift_reuse` keeps cells at later positions on
                its scratch sequence meanwhile."""
                tokens = list(tokens)
                step = step or self.n_batch
                for start in range(0, len(tokens), step):
                    part = tokens[start:start + step]
                    if start and self._iris_stopping():
                        raise EvalStopped(start, len(tokens))
                    n_past = self.n_tokens
                    _decoding.stopping = self._iris_stopping
                    try:
                        self._batch.set_batch(batch=part, n_past=n_past, logits_all=False)
                        self._ctx.decode(self._batch)
                    except RuntimeError as exc:
                        if "returned 2" in str(exc):
                            raise EvalStopped(start, len(tokens)) from None
                        raise
                    finally:
                        _decoding.stopping = None
                    self.input_ids[n_past:n_past + len(part)] = part
                    self.n_tokens += len(part)
                    self.iris_evaluated += len(part)

            def _iris_stopping(self) -> bool:
                check = self.iris_should_stop
                return bool(check is not None and check())

        _llama_class = CountingLlama
    return _llama_class


_load_lock = threading.Lock()
_context_lock = threading.Lock()


def _load_llama(path: Path, scratch: bool, progress: Any, cancel: threading.Event | None,
                device: int | None = None, **params: Any) -> Any:
    load_backends()  # the installers' llama.cpp loads its CPU backend (the variant this CPU runs)
    with _load_progress(progress, cancel, device), _scratch_sequence(scratch):
        return _counting_llama_class()(model_path=str(path), verbose=False, **params)


def _device_params(plan: GpuPlan) -> dict[str, Any]:
    """llama.cpp's parameters for ``plan``. The CPU: no layer offloaded and no device at
    all (split mode none with main_gpu -1 leaves the model without devices, and op_offload
    off keeps big batches from being sent to a GPU), so no GPU buffer is created. A GPU:
    its layers, on that one device (``device``: ggml's handle, for the ``devices`` list)."""
    import llama_cpp

    if not plan.on_gpu:
        return dict(n_gpu_layers=0, split_mode=llama_cpp.LLAMA_SPLIT_MODE_NONE, main_gpu=-1,
                    op_offload=False, device=None)
    from .devices import device_handle

    return dict(n_gpu_layers=plan.layers, split_mode=llama_cpp.LLAMA_SPLIT_MODE_LAYER, main_gpu=0,
                op_offload=True, device=device_handle(plan.device))


def _q8_weights(source: Path, info: GGUFInfo, folder: Path, progress: Any,
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


def _plan(info: GGUFInfo, n_ctx: int, gpu: str | int, devices: list[Device] | None,
          gpu_checks: str | os.PathLike[str] | None, *, swa_full: bool, flash_attn: bool) -> GpuPlan:
    """The device and layers for ``model.gpu`` (:func:`.gpu.plan_gpu`), leaving out a GPU
    the first-use check switched off. No device is looked for with ``off``."""
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
    plan = plan_gpu(info, n_ctx, devices, gpu, disabled=disabled, swa_full=swa_full, flash_attn=flash_attn)
    log.info("%s at n_ctx %d, model.gpu %s: %s (%s)", info.path.name, n_ctx, gpu, plan.describe(), plan.reason)
    return plan


def _load_planned(path: Path, plan: GpuPlan, scratch: bool, progress: Any, cancel: threading.Event | None,
                  params: dict[str, Any]) -> tuple[Any, GpuPlan]:
    """Load with ``plan``; a load that fails on a GPU is tried with half the layers, then
    on the CPU (:func:`.gpu.fewer`). Returns the Llama and the plan as llama.cpp's log
    says it loaded (:func:`_as_loaded`)."""
    tried = 0
    while True:
        with _captured_log() as lines:
            try:
                llm = _load_llama(path, scratch, progress, cancel, **params, **_device_params(plan))
            except Exception as exc:
                after = fewer(plan, tried)
                tried += 1
                if after is None or (cancel is not None and cancel.is_set()):
                    raise
                why = "; ".join(_recent_llama_errors()) or str(exc)
                log.warning("%s: %d layers on %s did not load (%s); now: %s", path.name, plan.layers,
                            plan.device.label, why, after.describe())
                plan = after
                continue
        return llm, _as_loaded(path, plan, offload_from_log(lines))


def _load_weights(source: Path, load_path: Path, weights: str, weights_dir: Any, plan: GpuPlan,
                  scratch: bool, progress: Any, cancel: threading.Event | None,
                  params: dict[str, Any]) -> tuple[Any, GpuPlan, Path, str]:
    """:func:`_load_planned` on ``load_path``; when that is the Q8_0 copy and it does not
    load, the copy is discarded and ``source`` loaded as it is. Returns the Llama, the
    plan it loaded with, the file and how its weights were read."""
    try:
        llm, plan = _load_planned(load_path, plan, scratch, progress, cancel, params)
        return llm, plan, load_path, weights
    except Exception:
        if load_path == source or (cancel is not None and cancel.is_set()):
            raise
    # the copy is at fault (the source loads below, or says why not)
    why = "; ".join(_recent_llama_errors())
    log.warning("%s: llama.cpp could not load the Q8_0 copy %s (%s); loading the file as it is",
                source, load_path, why)
    discard_q8_copy(source, Path(weights_dir))
    llm, plan = _load_planned(source, plan, scratch, progress, cancel, params)
    return llm, plan, source, "as published (the 8-bit copy did not load)"


def _as_loaded(path: Path, plan: GpuPlan, offload: Any) -> GpuPlan:
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
    if layers != min(plan.layers, plan.total_layers) or (offload.total and offload.total != plan.total_layers):
        return replace(plan, layers=layers, total_layers=offload.total or plan.total_layers, notice=True,
                       reason=f"{plan.reason}; llama.cpp offloaded {layers}/{offload.total}")
    log.info("%s: offloaded %d/%d layers to %s, as planned (%s)", path.name, layers, offload.total,
             plan.device.label, ", ".join(f"{k} {v:.0f} MiB" for k, v in on_device.items()))
    return plan


# -- the first-use check: the GPU's greedy tokens against the CPU's --------------------------

#: a plain-text prompt every model continues (no chat template: the check is about numbers)
CHECK_PROMPT = "The capital of France is Paris. The capital of Italy is"
CHECK_STEPS = 8
CHECK_CTX = 128
#: a swap of the top two tokens this close (in the CPU's logits) is a near tie, not a fault
TIE_LOGITS = 0.5


@dataclass(frozen=True)
class Step:
    """One greedy step: the top token and its text, and the five best (token, logit)."""

    token: int
    text: str
    top: tuple[tuple[int, float], ...]


def _greedy_steps(path: Path, plan: GpuPlan, threads: int, flash_attn: bool,
                  forced: list[int] | None = None, steps: int = CHECK_STEPS) -> list[Step]:
    """``steps`` greedy steps after :data:`CHECK_PROMPT` with ``plan``'s device and layers;
    ``forced``: feed these tokens instead of the top ones (the CPU's: both runs then see
    the same text, so their steps compare one to one)."""
    import llama_cpp
    import numpy as np

    llm = _load_llama(path, False, None, None, n_ctx=CHECK_CTX, n_batch=CHECK_CTX, n_threads=threads,
                      n_threads_batch=threads, flash_attn=flash_attn, seed=0, **_device_params(plan))
    try:
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
    finally:
        llm.close()


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
    cpu = _greedy_steps(path, cpu_plan(plan.total_layers, "the first-use check's reference"), threads,
                        flash_attn)
    gpu = _greedy_steps(path, plan, threads, flash_attn, forced=[s.token for s in cpu])
    return compare_steps(cpu, gpu)


def _checked(path: Path, plan: GpuPlan, checks: GpuChecks, threads: int, stage: Any,
             cancel: threading.Event | None, flash_attn: bool = True) -> GpuPlan:
    """``plan``, or the CPU when its GPU, with this driver, disagrees with the CPU in the
    first-use check (run now when it has not been, and remembered in ``checks``)."""
    if checks.result(plan.device) is not None:
        return plan  # checked with this driver, and it agreed (plan_gpu left out one that did not)
    if stage is not None:
        stage("checking")
    try:
        agrees, detail = first_use_check(path, plan, threads, flash_attn)
    except Exception as exc:  # the load below tries the GPU again, and says why it cannot
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


@contextlib.contextmanager
def _load_progress(progress: Any, cancel: threading.Event | None, device: int | None = None) -> Iterator[None]:
    """Give llama.cpp a progress callback for one load (it returns False to abort the
    load when ``cancel`` is set), and the one GPU (``device``, ggml's handle) it may use.
    llama-cpp-python has no parameter for either, so the model parameters it starts from
    are wrapped for the duration of this load; the lock keeps two loads from sharing the
    wrapper."""
    if progress is None and cancel is None and device is None:
        yield
        return
    import llama_cpp.llama_cpp as low

    # llama.cpp's NULL-terminated list of devices; referenced until the load is over
    devices = (ctypes.c_void_p * 2)(device, None) if device is not None else None

    def report(fraction: float, _data: Any) -> bool:
        try:
            if progress is not None:
                progress(float(fraction))
        except Exception:  # never raise into C
            pass
        return not (cancel is not None and cancel.is_set())

    callback = low.llama_progress_callback(report)
    with _load_lock:
        original = low.llama_model_default_params

        def with_progress() -> Any:
            params = original()
            if progress is not None or cancel is not None:
                params.progress_callback = callback
            if devices is not None:
                params.devices = ctypes.cast(devices, ctypes.c_void_p).value
            return params

        low.llama_model_default_params = with_progress
        try:
            yield
        finally:
            low.llama_model_default_params = original


@contextlib.contextmanager
def _scratch_sequence(wanted: bool) -> Iterator[None]:
    """Create the next context with room for a second sequence in one shared (unified)
    KV cache: :meth:`LocalModel._shift_reuse` parks the cells it keeps on that scratch
    sequence while it evaluates what goes before them. The cache's size and what sequence
    0 can hold are unchanged (unified: both sequences share the same ``n_ctx`` cells).
    Only when ``wanted`` (``kv_shift`` on a model without sliding-window layers, whose
    window cache llama.cpp would size for two sequences)."""
    import llama_cpp.llama_cpp as low

    if not wanted:
        yield
        return

    with _context_lock:
        original = low.llama_context_default_params

        def with_scratch() -> Any:
            params = original()
            params.n_seq_max = 2
            params.kv_unified = True
            return params

        low.llama_context_default_params = with_scratch
        try:
            yield
        finally:
            low.llama_context_default_params = original


def _install_llama_logging() -> None:
    """Route llama.cpp's log into the ``iris.runtime.llama`` logger.

    llama-cpp-python 0.3.x maps ggml's log levels with an outdated enum (it prints
    warnings to stderr even with ``verbose=False`` and hides errors). ggml's levels:
    NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5. The last error lines are kept so
    that a failed load can say why. A decode that Iris aborts on purpose (Stop, a send
    preempting a draft's prefill: the abort callback said so) makes llama.cpp complain
    ("llama_decode: failed to decode, ret = 2"); those lines are expected, and logged at
    DEBUG.
    """
    if _log_state:
        return
    import ctypes

    import llama_cpp

    levels = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR}
    state: dict[str, Any] = {"buf": "", "level": logging.DEBUG, "errors": [], "capture": None}

    def callback(level: int, text: bytes, user_data: Any) -> None:
        try:
            if level != 5:
                state["level"] = levels.get(level, logging.DEBUG)
            state["buf"] += text.decode("utf-8", errors="replace")
            while "\n" in state["buf"]:
                line, state["buf"] = state["buf"].split("\n", 1)
                if not line.strip():
                    continue
                level = state["level"]
                if level > logging.DEBUG and _aborting():
                    level = logging.DEBUG
                if level >= logging.ERROR:
                    state["errors"] = (state["errors"] + [line.strip()])[-5:]
                capture = state["capture"]
                if capture is not None and capture[0] == threading.get_ident():
                    capture[1].append(line)
                llama_log.log(level, "%s", line)
        except Exception:  # never raise into C
            pass

    _log_state["state"] = state
    _log_state["callback"] = llama_cpp.llama_log_callback(callback)  # keep a reference
    llama_cpp.llama_log_set(_log_state["callback"], ctypes.c_void_p(0))


@contextlib.contextmanager
def _captured_log() -> Iterator[list[str]]:
    """The lines llama.cpp logs on this thread meanwhile (a load's: what it offloaded)."""
    _install_llama_logging()
    state = _log_state["state"]
    lines: list[str] = []
    previous, state["capture"] = state["capture"], (threading.get_ident(), lines)
    try:
        yield lines
    finally:
        state["capture"] = previous


def _aborting() -> bool:
    """A decode on this thread is being aborted on purpose (its stop check says so)."""
    stopping = getattr(_decoding, "stopping", None)
    try:
        return bool(stopping is not None and stopping())
    except Exception:  # called from C: never raise
        return False


def _recent_llama_errors() -> list[str]:
    state = _log_state.get("state")
    if not state:
        return []
    errors, state["errors"] = state["errors"], []
    return errors


# ---------------------------------------------------------------------------
# generation


class _StopMatcher:
    """Holds back text that could be the start of a stop string."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Return (text safe to emit, a stop string was found)."""
        self.pending += text
        if not self.stops:
            out, self.pending = self.pending, ""
            return out, False
        first = -1
        for s in self.stops:
            i = self.pending.find(s)
            if i != -1 and (first == -1 or i < first):
                first = i
        if first != -1:
            out, self.pending = self.pending[:first], ""
            return out, True
        keep = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.pending)), 0, -1):
                if self.pending.endswith(s[:n]):
                    keep = max(keep, n)
                    break
        cut = len(self.pending) - keep
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


#: a prefill (work done while the user reads and types) evaluates this many tokens at a
#: time: a send or a new draft stops it part-way, and llama.cpp drops the whole batch it
#: was evaluating, so smaller pieces keep more of the work. Sends evaluate ``n_batch`` at
#: a time. bench/throughput.py measures what the smaller pieces cost.
PREFILL_CHUNK_TOKENS = 128
#: the shortest run of cached tokens worth moving (below it, evaluating is as cheap)
SHIFT_MIN_TOKENS = 64
#: a k-gram of this many tokens finds candidate runs; each is then extended
_SHIFT_KEY = 16


def moved_run(cached: list[int], tokens: list[int], start: int,
              min_length: int = SHIFT_MIN_TOKENS) -> tuple[int, int, int] | None:
    """The longest run ``tokens[at:at+length] == cached[was:was+length]`` with ``at`` and
    ``was`` both at or after ``start`` (where the two first differ) and ``length`` at
    least ``min_length``, as ``(at, was, length)``; None when there is none. Ties go to
    the earliest ``at``. Linear in practice: candidates come from an index of the
    cache's k-grams, a match skips ahead by its length, and each k-gram keeps at most a
    few positions (a chat's repeated template text is short)."""
    key = min(_SHIFT_KEY, min_length)
    if key < 1 or len(cached) - start < min_length or len(tokens) - start < min_length:
        return None
    index: dict[tuple[int, ...], list[int]] = {}
    for was in range(start, len(cached) - key + 1):
        spots = index.setdefault(tuple(cached[was:was + key]), [])
        if len(spots) < 8:
            spots.append(was)
    best: tuple[int, int, int] | None = None
    at = start
    while at <= len(tokens) - key:
        longest = 0
        for was in index.get(tuple(tokens[at:at + key]), ()):
            length = key
            while (at + length < len(tokens) and was + length < len(cached)
                   and tokens[at + length] == cached[was + length]):
                length += 1
            if length >= min_length and (best is None or length > best[2]):
                best = (at, was, length)
            longest = max(longest, length)
        at += longest if longest >= min_length else 1
    return best


class LocalModel:
    """One loaded GGUF model (a :class:`~.protocol.Runtime`). Create with :meth:`load`;
    call :meth:`close` when done.

    Threads: generation is serialized by ``_lock`` (one KV cache), normally on the model
    thread. Tokenizing and counting are safe from any thread, also while a generation
    runs (llama.cpp's vocabulary is read-only after loading): they hold ``_life``, which
    :meth:`close` takes before it frees anything, so a model closed during a meter
    refresh raises a clean ``RuntimeError("... closed")`` instead of using freed memory.
    """

    #: the window is the context llama.cpp allocated for this model
    window_source = "model"
    where = "local"
    base_url: str | None = None
    is_loopback = True
    warning: str | None = None

    def __init__(
        self,
        llm: Any,
        info: GGUFInfo,
        chat_format: ChatFormat,
        *,
        identity: str,
        swa_full: bool,
        seed: int,
        kv_shift: bool = False,
    ) -> None:
        self._llm = llm
        self.info = info
        self.path = info.path
        self.chat_format = chat_format
        #: a base (pretrained-only) model: it continues text instead of following
        #: instructions, so the UI marks it and compaction skips the LLM summary
        self.base_model = is_base_model(info, info.path.name)
        self.identity = identity
        self.swa_full = swa_full
        self.seed = seed
        #: reuse a moved part of the cache (the verbatim tail after a compaction) by
        #: shifting its positions instead of evaluating it again (see _shift_reuse)
        self.kv_shift = kv_shift
        #: (at, was, run): a shift stopped part-way left ``run`` on the scratch sequence
        self._parked: tuple[int, int, list[int]] | None = None
        self.model_name = info.path.name
        self._lock = threading.Lock()
        self._life = threading.RLock()
        self._closing = threading.Event()
        self._closed = False
        self._grammars: dict[str, Any] = {}
        import llama_cpp

        self._n_ctx = int(llm.n_ctx())
        # llama.cpp asks this between graph nodes; a ctypes callback must stay referenced
        self._abort_callback = llama_cpp.ggml_abort_callback(
            lambda _data: llm._iris_stopping())
        llama_cpp.llama_set_abort_callback(llm.ctx, self._abort_callback, None)
        self._n_swa = int(llama_cpp.llama_model_n_swa(llm.model))
        # the model's own BOS rule (llama.cpp's add_bos_token) wins over the format's text
        bos = int(llm.token_bos())
        self._bos_id = bos if bos >= 0 and llm._model.add_bos_token() else None
        self._prefix_tokens = self._with_bos(self._parts_tokens([(chat_format.prefix(), True)]))
        self._generation_tokens = self._parts_tokens([(chat_format.generation_prompt(), True)])
        self._stop_ids, self._stop_strings = self._split_stops(chat_format.stop())
        # close the context before interpreter teardown even if close() is never called
        # (Llama.__del__ at exit raises a TypeError from half-destroyed modules)
        self._finalizer = weakref.finalize(self, llm.close)

    # -- loading -----------------------------------------------------------

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        n_ctx: int = 8192,
        n_threads: int | None = None,
        gpu: str | int = OFF,
        seed: int = 0,
        *,
        swa_full: bool = True,
        n_batch: int = 512,
        flash_attn: bool = True,
        kv_shift: bool = False,
        weights_dir: str | os.PathLike[str] | None = None,
        progress: Any = None,
        cancel: threading.Event | None = None,
        stage: Any = None,
        gpu_checks: str | os.PathLike[str] | None = None,
        devices: list[Device] | None = None,
    ) -> LocalModel:
        """Validate the GGUF header, then load the model with llama.cpp.

        ``n_ctx=0`` uses the model's trained context length. ``n_threads`` is for
        generation and prompt evaluation alike; None: the physical cores this process may
        use (llama-cpp-python's own default is half the logical CPUs for generation, which
        leaves half of a machine without SMT idle). ``flash_attn``: llama.cpp's flash
        attention, which evaluates prompts faster on CPUs too (``bench/throughput.py``);
        a KV state saved without it is refused by a model with it, and the other way
        round (the V cache is laid out differently). ``weights_dir``: keep an exact Q8_0
        copy of the file's Q5_0 weights there and load that (:mod:`.weights`: the same
        values, prompts read ~25% faster on CPUs; written once, ~3 s for the bundled
        model); only for a model on the CPU; None loads the file as it is, as does a copy
        that cannot be made or loaded. ``progress(fraction)`` follows the copy and the
        weights' loading, and ``stage`` is told ``"copying"`` when a copy is being written,
        ``"checking"`` during a GPU's first-use check and ``"loading"`` after them (a first
        load takes longer); setting ``cancel`` stops it (:class:`ModelError` "loading was
        cancelled"). Raises :class:`ModelError` for a missing, truncated or non-GGUF file
        and for anything llama.cpp refuses.

        ``gpu`` is ``model.gpu`` ("auto", "off" or a layer count): :func:`.gpu.plan_gpu`
        chooses the device and the layers from ``devices`` (default: what llama.cpp finds,
        :func:`.devices.list_devices`; none are looked for with "off"). ``gpu_checks``: the
        record of the first-use check (:class:`.gpu.GpuChecks`); a GPU not checked yet with
        its driver first runs a short greedy generation against the CPU's, and one that
        disagrees is left off (None: no check). The load's log must show the planned
        layers on the device; a load that fails is tried again with half the layers, then
        on the CPU. :attr:`gpu` holds the plan that loaded.
        """
        p = Path(path)
        try:
            info = read_gguf_info(p)
        except GGUFError as exc:
            raise ModelError(p, exc.reason) from None
        if n_ctx < 0:
            raise ValueError(f"n_ctx must be >= 0, not {n_ctx}")
        if n_ctx == 0:
            n_ctx = info.context_length or 4096
        elif info.context_length and n_ctx > info.context_length:
            log.warning("%s: n_ctx %d is larger than the trained context length %d",
                        p, n_ctx, info.context_length)
        chat_format = select_chat_format(info)

        _install_llama_logging()
        _recent_llama_errors()
        threads = n_threads or physical_cores()
        t0 = time.perf_counter()
        plan = _plan(info, n_ctx, gpu, devices, gpu_checks, swa_full=swa_full, flash_attn=flash_attn)
        if plan.on_gpu and gpu_checks is not None:
            plan = _checked(p, plan, GpuChecks(gpu_checks), threads, stage, cancel, flash_attn)
        load_path, weights = p, "as published"
        if weights_dir is not None and not plan.on_gpu:
            load_path, weights, progress = _q8_weights(p, info, Path(weights_dir), progress, cancel, stage)
        scratch = kv_shift and not info.sliding_window
        params = dict(n_ctx=n_ctx, n_batch=n_batch, n_threads=threads, n_threads_batch=threads,
                      flash_attn=flash_attn, seed=seed, swa_full=swa_full)
        try:
            llm, plan, load_path, weights = _load_weights(p, load_path, weights, weights_dir, plan,
                                                          scratch, progress, cancel, params)
        except Exception as exc:  # llama-cpp-python raises ValueError/RuntimeError
            if cancel is not None and cancel.is_set():
                raise ModelError(p, "loading was cancelled") from None
            why = "; ".join(_recent_llama_errors()) or str(exc)
            raise ModelError(p, f"llama.cpp could not load the model ({why})") from None
        load_s = time.perf_counter() - t0
        # the copy's header names its tensor types: a KV state saved with the other
        # weights is read again rather than trusted
        identity = _header_identity(info if load_path == p else read_gguf_info(load_path))
        model = cls(llm, info, chat_format, identity=identity, swa_full=swa_full, seed=seed,
                    kv_shift=kv_shift)
        model.weights = weights
        model.gpu = plan
        log.info(
            "%s: loaded %s %s (%s, %.0f MB) in %.2f s; n_ctx %d, chat format %s, "
            "sliding window %d (swa_full=%s); %d threads, flash attention %s; weights %s; "
            "device %s (%s)",
            p, info.architecture, info.name or "", info.file_type or "?",
            info.size_bytes / 1e6, load_s, model.n_ctx, chat_format.name, model._n_swa, swa_full,
            threads, "on" if flash_attn else "off", weights, plan.describe(), plan.reason,
        )
        model.load_time_s = load_s
        return model

    load_time_s: float = 0.0
    #: how the weights were loaded: "as published", or "Q5_0 read as Q8_0 (…)" (:mod:`.weights`)
    weights: str = "as published"
    #: where it runs: the device and layers llama.cpp loaded it with, and why (:mod:`.gpu`)
    gpu: GpuPlan = cpu_plan(0, "loaded without a plan")

    # -- basics ------------------------------------------------------------

    @property
    def llm(self) -> Any:
        """The underlying ``llama_cpp.Llama`` (for diagnostics; do not generate with it
        directly while a :meth:`stream` is running)."""
        self._check_open()
        return self._llm

    @property
    def n_ctx(self) -> int:
        """The context size llama.cpp allocated (fixed at load; readable after close)."""
        return self._n_ctx

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self.path}: the model is closed")

    def tokenize(self, text: str, special: bool = True) -> list[int]:
        """Tokens of ``text``, without BOS. ``special``: recognize control-token text
        such as ``<start_of_turn>`` (template text) or not (user content)."""
        if not text:
            return []
        with self._life:
            self._check_open()
            return self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)

    def detokenize(self, tokens: list[int]) -> str:
        with self._life:
            self._check_open()
            return self._llm.detokenize(list(tokens)).decode("utf-8", errors="replace")

    def _parts_tokens(self, parts: list[tuple[str, bool]]) -> list[int]:
        out: list[int] = []
        for text, template in parts:
            out.extend(self.tokenize(text, special=template))
        return out

    def _with_bos(self, tokens: list[int]) -> list[int]:
        if self._bos_id is not None and (not tokens or tokens[0] != self._bos_id):
            return [self._bos_id, *tokens]
        return tokens

    def message_tokens(self, message: Message, index: int = 1) -> list[int]:
        """The exact tokens ``message`` contributes to a prompt."""
        return self._parts_tokens(self.chat_format.message_parts(message, index))

    @property
    def native_tools(self) -> bool:
        """The chat template renders tool definitions itself."""
        return bool(getattr(self.chat_format, "supports_tools", False))

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(exact_counts=True, native_tools=self.native_tools, prefill=True,
                            kv_state=True)

    def tool_tokens(self, tools: list[dict]) -> int:
        """What passing ``tools`` to the template adds to a prompt (0 without native tools)."""
        if not tools or not self.native_tools:
            return 0
        # Iris always sends a system message first; templates fold the tools into it
        probe = [{"role": "system", "content": "."}, {"role": "user", "content": "."}]
        return len(self.prompt_tokens(probe, tools)) - len(self.prompt_tokens(probe))

    def prompt_tokens(self, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
        """The exact token list :meth:`stream` evaluates for ``messages``. A trailing
        assistant message marked ``"prefix": True`` is continued, not closed: the prompt
        ends inside it (a stopped reply goes on from there)."""
        if continues_reply(messages):
            return self._continuation_tokens(list(messages), tools)
        if tools and self.native_tools:
            text = self.chat_format.render_prompt(list(messages), tools=tools)
            return self._with_bos(self.tokenize(text, special=True))
        if self.chat_format.additive:
            tokens = list(self._prefix_tokens)
            for i, m in enumerate(messages):
                tokens.extend(self.message_tokens(m, i))
            tokens.extend(self._generation_tokens)
            return tokens
        return self._with_bos(self.tokenize(self.chat_format.render_prompt(list(messages)), special=True))

    def _continuation_tokens(self, messages: list[Message], tools: list[dict] | None) -> list[int]:
        """The prompt that ends inside the trailing assistant message: its closing
        template text and the generation prompt left out."""
        if (tools and self.native_tools) or not self.chat_format.additive:
            text = self.chat_format.render_continuation(
                messages, tools=tools if self.native_tools else None)
            return self._with_bos(self.tokenize(text, special=True))
        tokens = list(self._prefix_tokens)
        for i, m in enumerate(messages[:-1]):
            tokens.extend(self.message_tokens(m, i))
        parts = self.chat_format.message_parts(messages[-1], len(messages) - 1)
        while parts and parts[-1][1]:  # the template's closing text after the content
            parts.pop()
        tokens.extend(self._parts_tokens(parts))
        return tokens

    def count_prompt(self, messages: list[Message], tools: list[dict] | None = None) -> int:
        """The exact number of prompt tokens :meth:`stream` evaluates for ``messages``."""
        return len(self.prompt_tokens(messages, tools))

    def render_prompt(self, messages: list[Message]) -> str:
        """The prompt as text (for display and debugging; generation uses
        :meth:`prompt_tokens`, which tokenizes message content as plain text)."""
        return self.chat_format.render_prompt(list(messages))

    def describe(self) -> ModelFacts:
        info = self.info
        return ModelFacts(
            name=display_name(self.path.name) or info.name or self.path.stem,
            file=self.path.name, path=str(self.path),
            n_ctx=self.n_ctx, context_length=info.context_length, base_model=self.base_model,
            architecture=info.architecture or "", file_type=info.file_type or "",
            size_bytes=info.size_bytes or 0, chat_format=self.chat_format.name,
            load_time_s=self.load_time_s, license=_license(self.path, info.metadata or {}),
            device=self.gpu.describe(), device_reason=self.gpu.reason,
            device_notice=self.gpu.reason if self.gpu.notice else "")

    def counter(self) -> ModelTokenCounter:
        return ModelTokenCounter(self)

    def _split_stops(self, stops: list[str]) -> tuple[set[int], list[str]]:
        """Stop strings that are one control token become token ids (control tokens
        detokenize to nothing, so they can never match as text)."""
        import llama_cpp

        ids: set[int] = set()
        strings: list[str] = []
        vocab = self._llm._model.vocab
        for s in stops:
            if not s:
                continue
            toks = self.tokenize(s, special=True)
            if len(toks) == 1 and llama_cpp.llama_vocab_is_control(vocab, toks[0]):
                ids.add(toks[0])
            else:
                strings.append(s)
        return ids, strings

    # -- generation --------------------------------------------------------

    def _grammar(self, json_schema: dict | None, response_format: dict | None,
                 grammar: Any) -> Any:
        from llama_cpp import LlamaGrammar

        if grammar is not None:
            if isinstance(grammar, str):
                key = "gbnf:" + grammar
                if key not in self._grammars:
                    self._grammars[key] = LlamaGrammar.from_string(grammar, verbose=False)
                return self._grammars[key]
            return grammar
        schema = json_schema
        if schema is None and response_format:
            kind = response_format.get("type")
            if kind == "json_schema":
                spec = response_format.get("json_schema") or {}
                schema = spec.get("schema", spec)
            elif kind == "json_object":
                schema = response_format.get("schema") or {"type": "object"}
        if schema is None:
            return None
        # not sort_keys: the grammar keeps the schema's property order (the order the
        # model writes the fields in), so differently ordered schemas are different keys
        key = json.dumps(schema)
        if key not in self._grammars:
            self._grammars[key] = LlamaGrammar.from_json_schema(key, verbose=False)
        return self._grammars[key]

    def _shift_reuse(self, tokens: list[int], step: int | None = None) -> tuple[int, bool]:
        """Reuse a run of cached tokens that sits at another position in ``tokens``.

        After a compaction the prompt is ``system + new summary + tail`` while the cache
        holds ``system + old summary + compacted turns + tail``: the longest common
        prefix ends after the system prompt, so a plain reuse evaluates the whole tail
        again. When :attr:`kv_shift` is on, the tail's cells are kept instead: parked on
        the scratch sequence, the cells in between dropped, what is new (the summary)
        evaluated at its positions, and the tail's positions shifted after it
        (``llama_memory_seq_add``; llama.cpp rotates the keys' RoPE). Only the new part
        and what follows the moved run are evaluated.

        This is not exact: the moved cells' keys and values were computed while the old
        summary and the compacted turns stood before them (llama-server's
        ``--cache-reuse`` makes the same trade). So it is a setting (``model.kv_shift``).
        Models with a sliding window or a cache that cannot shift always re-evaluate.

        Returns (tokens evaluated, stopped part-way). The cache then holds a prefix of
        ``tokens`` (through the moved run), and the usual prefix reuse goes on from it.
        """
        import llama_cpp

        llm = self._llm
        parked, self._parked = self._parked, None
        n = int(llm.n_tokens)
        if not self.kv_shift or self._n_swa > 0 or n == 0 or len(tokens) < 2:
            if parked is not None:  # the cache was reset meanwhile: the run is not wanted
                llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(llm.ctx), _SEQ_ID + 1, -1, -1)
            return 0, False
        if int(llm.context_params.n_seq_max) < 2:  # loaded without the scratch sequence
            return 0, False
        mem = llama_cpp.llama_get_memory(llm.ctx)
        if not llama_cpp.llama_memory_can_shift(mem):
            return 0, False
        start = self._common_prefix(tokens)
        if parked is not None:  # a shift stopped part-way: its run waits on the scratch sequence
            at, was, run = parked
            same = 0  # how much of the run this prompt has at ``at`` (its end may differ)
            for a, b in zip(run, tokens[at:len(tokens) - 1]):
                if a != b:
                    break
                same += 1
            if (start == n and at >= n and same >= SHIFT_MIN_TOKENS
                    and llama_cpp.llama_memory_seq_pos_min(mem, _SEQ_ID + 1) == was
                    and llama_cpp.llama_memory_seq_pos_max(mem, _SEQ_ID + 1) == was + len(run) - 1):
                return self._move_run(tokens, n, at, was, run[:same], step)
            llama_cpp.llama_memory_seq_rm(mem, _SEQ_ID + 1, -1, -1)  # not this prompt's: dropped
        if start >= n:  # the cache is a prefix of the prompt: nothing moved
            return 0, False
        cached = [int(t) for t in llm.input_ids[:n]]
        # keep the prompt's last token for the evaluation that produces the logits
        found = moved_run(cached, tokens[:-1], start, SHIFT_MIN_TOKENS)
        if found is None:
            return 0, False
        at, was, length = found  # tokens[at:at+length] == cached[was:was+length]
        run = cached[was:was + length]
        if at == start:  # only removed before the run: drop those cells, move it back
            llama_cpp.llama_memory_seq_rm(mem, _SEQ_ID, start, was)
            llama_cpp.llama_memory_seq_rm(mem, _SEQ_ID, was + length, -1)
            llama_cpp.llama_memory_seq_add(mem, _SEQ_ID, was, was + length, at - was)
            llm.input_ids[at:at + length] = run
            llm.n_tokens = at + length
            llm._requires_eval = True
            return 0, False
        llama_cpp.llama_memory_seq_cp(mem, _SEQ_ID, _SEQ_ID + 1, was, was + length)
        llama_cpp.llama_memory_seq_rm(mem, _SEQ_ID, start, -1)
        llm.n_tokens = start
        return self._move_run(tokens, start, at, was, run, step)

    def _move_run(self, tokens: list[int], start: int, at: int, was: int,
                  run: list[int], step: int | None = None) -> tuple[int, bool]:
        """The second half of :meth:`_shift_reuse`: with ``run`` parked on the scratch
        sequence at ``was`` and the cache holding ``tokens[:start]``, evaluate
        ``tokens[start:at]``, then move the run to ``at`` after it. Stopped part-way, the
        run stays parked (``_parked``) and the next request goes on from there."""
        import llama_cpp

        llm = self._llm
        mem = llama_cpp.llama_get_memory(llm.ctx)
        scratch, length = _SEQ_ID + 1, len(run)
        before = int(llm.iris_evaluated)
        try:
            llm.iris_decode_at(tokens[start:at], step)
        except EvalStopped:
            self._parked = (at, was, list(run))
            llm._requires_eval = True
            return int(llm.iris_evaluated) - before, True
        except BaseException:
            llama_cpp.llama_memory_seq_rm(mem, scratch, -1, -1)
            llm.reset()
            llama_cpp.llama_memory_clear(mem, True)
            raise
        evaluated = int(llm.iris_evaluated) - before
        llama_cpp.llama_memory_seq_add(mem, scratch, was, was + length, at - was)
        llama_cpp.llama_memory_seq_cp(mem, scratch, _SEQ_ID, at, at + length)
        llama_cpp.llama_memory_seq_rm(mem, scratch, -1, -1)
        llm.input_ids[at:at + length] = run
        llm.n_tokens = at + length
        llm._requires_eval = True  # the logits are not the moved run's last token's
        log.debug("KV shift: kept %d cached tokens moved from %d to %d; evaluated %d before them",
                  length, was, at, evaluated)
        return evaluated, False

    def _common_prefix(self, tokens: list[int]) -> int:
        """How many of ``tokens`` the KV cache holds at their start."""
        import numpy as np

        llm = self._llm
        m = min(int(llm.n_tokens), len(tokens))
        cached = llm.input_ids[:m]
        diff = np.nonzero(cached != np.asarray(tokens[:m], dtype=cached.dtype))[0]
        return int(diff[0]) if len(diff) else m

    def _plan_reuse(self, tokens: list[int]) -> int:
        """How many prompt tokens ``Llama.generate`` will keep from the KV cache.

        Mirrors ``Llama.generate``: the longest common prefix of the context and the
        prompt; when the whole prompt is already there, the last token is evaluated
        again to refresh the logits (unless the context is exactly the prompt and its
        logits are live). With ``swa_full=False`` this also applies llama-server's
        sliding-window rule and resets the context when the reuse would be wrong.
        """
        import llama_cpp

        llm = self._llm
        n = int(llm.n_tokens)
        if n == 0 or not tokens:
            return 0
        common = self._common_prefix(tokens)
        consumed = common == len(tokens)
        if consumed and n == len(tokens) and not llm._requires_eval:
            reuse = len(tokens)
        else:
            reuse = common - 1 if consumed else common
        if reuse > 0 and self._n_swa > 0 and not self.swa_full:
            mem = llama_cpp.llama_get_memory(llm.ctx)
            pos_min = llama_cpp.llama_memory_seq_pos_min(mem, 0)
            if pos_min > max(0, reuse - self._n_swa):
                log.info("prefix of %d tokens not reusable: the sliding-window cache starts "
                         "at position %d (swa_full=False); re-evaluating the prompt",
                         reuse, pos_min)
                llm.reset()
                return 0
        return max(reuse, 0)

    def stream(self, request: GenerationRequest, grammar: Any = None) -> Generation:
        """Generate the reply ``request`` asks for, yielding text pieces as they come.

        Its ``tools`` (OpenAI definitions) are passed to a chat template that renders
        tools itself (:attr:`native_tools`); other formats get them in the system prompt
        from the caller, and ignore them.

        Its ``cancel`` is checked between tokens and between chunks of the prompt's
        evaluation; when set, or once ``time.monotonic()`` passes its ``deadline``,
        generation stops with ``finish_reason == "cancelled"`` (closing the iterator
        early counts as a cancel too). Its ``json_schema`` (or ``response_format``, or a
        GBNF ``grammar``, this runtime's own) constrains the output. ``temperature=0`` is
        greedy. Once the :class:`~.protocol.Generation` ends, its ``stats`` hold the
        :class:`~iris_desktop.generation.GenerationStats`.

        Raises :class:`PromptTooLongError` (at the first ``next``) when the prompt
        leaves no room in the context window.
        """
        self._check_open()
        r = request
        options = dict(
            max_tokens=r.max_tokens, temperature=r.temperature, cancel=r.cancel,
            grammar=self._grammar(r.json_schema, r.response_format, grammar),
            sampling=dict(top_k=r.top_k, top_p=r.top_p, min_p=r.min_p,
                          repeat_penalty=r.repeat_penalty),
            seed=self.seed if r.seed is None else r.seed, extra_stop=r.stop or [],
            tools=r.tools if self.native_tools else None, deadline=r.deadline,
            progress=r.progress,
        )
        return Generation(lambda result: self._stream(result, list(r.messages), **options))

    def _stream(self, result: Generation, messages: list[Message], *, max_tokens: int,
                temperature: float,
                cancel: threading.Event | None, grammar: Any, sampling: dict,
                seed: int, extra_stop: list[str], tools: list[dict] | None = None,
                deadline: float | None = None, progress: Any = None) -> Iterator[str]:
        import llama_cpp

        with self._lock:
            self._check_open()
            llm = self._llm
            t0 = time.perf_counter()
            tokens = self.prompt_tokens(messages, tools)
            n_prompt = len(tokens)
            n_ctx = int(llm.n_ctx())
            if n_prompt >= n_ctx:
                raise PromptTooLongError(n_prompt, n_ctx)
            max_tokens = min(max_tokens, n_ctx - n_prompt)
            stop_ids = set(self._stop_ids)
            stop_strings = list(self._stop_strings)
            if extra_stop:
                more_ids, more_strings = self._split_stops(extra_stop)
                stop_ids |= more_ids
                stop_strings += more_strings
            matcher = _StopMatcher(stop_strings)
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            vocab = llm._model.vocab

            def should_stop() -> bool:
                return (self._closing.is_set() or (cancel is not None and cancel.is_set())
                        or (deadline is not None and time.monotonic() > deadline))

            predicted_reuse = 0
            evaluated = 0
            completion = 0
            t_first = t_last = None
            finish = "length"
            gen = None
            try:
                if cancel is not None and cancel.is_set():
                    finish = "cancelled"
                    return
                llm.iris_evaluated = 0
                llm.iris_should_stop = should_stop
                shifted, stopped = self._shift_reuse(tokens)
                if stopped:
                    evaluated = int(llm.iris_evaluated)
                    finish = "cancelled"
                    return
                predicted_reuse = self._plan_reuse(tokens) - shifted
                llm.set_seed(seed)
                if progress is not None:  # what is cached already, then batch by batch
                    progress(predicted_reuse, n_prompt)
                    llm.iris_progress = lambda done, _todo: progress(predicted_reuse + done, n_prompt)
                gen = llm.generate(tokens, temp=temperature, grammar=grammar, **sampling)
                while True:
                    if should_stop():
                        finish = "cancelled"
                        break
                    try:
                        token = next(gen)
                    except StopIteration:
                        finish = "stop"
                        break
                    except EvalStopped as stopped:
                        evaluated = int(llm.iris_evaluated)
                        log.info("prompt evaluation %s", stopped)
                        finish = "cancelled"
                        break
                    now = time.perf_counter()
                    if t_first is None:
                        t_first = now
                        # only the prompt has been evaluated so far
                        evaluated = int(llm.iris_evaluated)
                        llm.iris_progress = None  # what follows is one token at a time
                    if token in stop_ids or llama_cpp.llama_vocab_is_eog(vocab, token):
                        finish = "stop"
                        break
                    completion += 1
                    t_last = now
                    text = decoder.decode(llm.detokenize([token]))
                    out, hit = matcher.feed(text)
                    if out:
                        yield out
                    if hit:
                        finish = "stop"
                        break
                    if completion >= max_tokens:
                        finish = "length"
                        break
                rest, hit = matcher.feed(decoder.decode(b"", final=True))
                tail = rest + ("" if hit else matcher.flush())
                if tail:
                    yield tail
            except GeneratorExit:
                finish = "cancelled"
                raise
            except BaseException:
                finish = "error"
                raise
            finally:
                llm.iris_should_stop = llm.iris_progress = None
                if gen is not None:
                    gen.close()
                t_end = time.perf_counter()
                if t_first is None:
                    reused = 0 if gen is None else predicted_reuse
                    # stopped during the prompt: what llama.cpp really evaluated
                    # (before generate: what a part-way shift evaluated, or nothing)
                    evaluated = evaluated if gen is None else int(llm.iris_evaluated)
                else:
                    reused = n_prompt - evaluated
                    if reused != predicted_reuse:
                        log.debug("KV reuse: predicted %d, llama.cpp evaluated %d of %d",
                                  predicted_reuse, evaluated, n_prompt)
                rate = 0.0
                if completion > 1 and t_first is not None and t_last is not None and t_last > t_first:
                    rate = (completion - 1) / (t_last - t_first)
                result.stats = GenerationStats(
                    prompt_tokens=n_prompt,
                    reused_tokens=reused,
                    evaluated_tokens=evaluated,
                    completion_tokens=completion,
                    time_to_first_token_s=(t_first - t0) if t_first is not None else 0.0,
                    tokens_per_s=rate,
                    duration_s=t_end - t0,
                    finish_reason=finish,
                )
                log.debug("generation: %s", result.stats)

    def prefill(self, messages: list[Message], tools: list[dict] | None = None, *,
                cancel: Stop | None = None) -> Prefill:
        """Evaluate the prompt of ``messages`` into the KV cache without generating, so
        that a request for them (or for them and more) starts at once. Only what differs
        from the cache is evaluated, ``PREFILL_CHUNK_TOKENS`` at a time; the
        :class:`~.protocol.Prefill` yields ``(evaluated, total)`` after each. ``cancel``
        (anything with ``is_set()``) stops it between two graph nodes (a send preempts a
        warm-up this way), and so does closing the Prefill; what was evaluated stays
        cached. Raises PromptTooLongError (at the first ``next``)."""
        self._check_open()
        return Prefill(lambda result: self._prefill(result, list(messages), tools, cancel))

    def _prefill(self, result: Prefill, messages: list[Message], tools: list[dict] | None,
                 cancel: Stop | None) -> Iterator[tuple[int, int]]:
        with self._lock:
            self._check_open()
            llm = self._llm
            tokens = self.prompt_tokens(messages, tools)
            if len(tokens) >= self.n_ctx:
                raise PromptTooLongError(len(tokens), self.n_ctx)
            llm.iris_evaluated = 0

            def stopping() -> bool:
                return self._closing.is_set() or bool(cancel is not None and cancel.is_set())

            llm.iris_should_stop = stopping
            shifted, stopped = self._shift_reuse(tokens, PREFILL_CHUNK_TOKENS)
            if stopped:
                llm.iris_should_stop = None
                result.stats = PrefillStats(len(tokens), 0, shifted, True)
                return
            reuse = self._plan_reuse(tokens)
            todo = tokens[reuse:]
            llm.n_tokens = reuse
            reuse -= shifted  # evaluated just now, not reused
            step = max(1, min(llm.n_batch, PREFILL_CHUNK_TOKENS))
            try:
                for start in range(0, len(todo), step):
                    if start and stopping():
                        stopped = True
                        break
                    part = todo[start:start + step]
                    try:
                        llm.eval(part)
                    except EvalStopped:
                        stopped = True
                        break
                    yield reuse + shifted + start + len(part), len(tokens)
            except GeneratorExit:
                stopped = True
                raise
            finally:
                llm.iris_should_stop = None
                result.stats = PrefillStats(len(tokens), reuse, int(llm.iris_evaluated), stopped)

    def kv_tokens(self) -> list[int]:
        """The tokens whose keys and values are in the KV cache, in order."""
        with self._life:
            self._check_open()
            return [int(t) for t in self._llm.input_ids[: self._llm.n_tokens]]

    def kv_state(self) -> KVState | None:
        """A copy of the KV cache: its tokens and llama.cpp's per-sequence copy of their
        keys and values (``llama_state_seq_get_data``: no logits). None when empty."""
        import llama_cpp

        with self._lock:
            self._check_open()
            tokens = self.kv_tokens()
            if not tokens:
                return None
            ctx = self._llm.ctx
            size = llama_cpp.llama_state_seq_get_size(ctx, _SEQ_ID)
            buffer = (ctypes.c_uint8 * size)()
            written = llama_cpp.llama_state_seq_get_data(ctx, buffer, size, _SEQ_ID)
            return KVState(tokens, bytes(buffer)[:written])

    def restore_kv_state(self, state: KVState) -> bool:
        """Put a checked state into the (cleared) cache; False if llama.cpp refuses it (the
        cache is then empty). The next request computes the logits it did not save."""
        import llama_cpp

        tokens = list(state.tokens)
        if len(tokens) >= self.n_ctx:
            return False
        with self._lock:
            self._check_open()
            llm = self._llm
            llm.reset()
            memory = llama_cpp.llama_get_memory(llm.ctx)
            llama_cpp.llama_memory_clear(memory, True)
            buffer = (ctypes.c_uint8 * len(state.data)).from_buffer_copy(state.data)
            if llama_cpp.llama_state_seq_set_data(llm.ctx, buffer, len(state.data), _SEQ_ID) == 0:
                llama_cpp.llama_memory_clear(memory, True)
                return False
            llm.input_ids[: len(tokens)] = tokens
            llm.n_tokens = len(tokens)
            llm._requires_eval = True  # no logits were saved
            return True

    def close(self) -> None:
        """Free the model and its context. Idempotent. A generation running in another
        thread is stopped at its next token first."""
        self._closing.set()
        with self._lock, self._life:  # no generation, no tokenizing while it is freed
            if self._closed:
                return
            self._closed = True
            self._finalizer()  # runs llm.close() once

    def __enter__(self) -> LocalModel:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"n_ctx={self._llm.n_ctx()}"
        return f"<LocalModel {self.path.name} {self.chat_format.name} {state}>"


#: a quantization (Q4_K_M, IQ4_XS, Q8_0, F16, BF16) or a split part (-00001-of-00003)
#: at the end of a GGUF file's name
_NAME_TAIL = re.compile(r"[-_.](?:i?q\d+(?:_[a-z0-9]+)*|f16|f32|bf16|fp16|\d{5}-of-\d{5})$", re.I)
#: a parameter count ("0.5b", "270m", "8x7b"), its unit written in capitals
_PARAMETERS = re.compile(r"(?:\d+x)?\d+(?:\.\d+)?[bmk]", re.I)


def display_name(file_name: str) -> str:
    """A model's name from its file name, as model names are written: the quantization
    dropped (the file type says it), each part capitalized, a size in capitals
    ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" → "Qwen2.5-Coder-0.5B-Instruct"). The
    GGUF header's ``general.name`` is often a converter's leftover (the bundled Q4_K_M
    file says "… Instruct AWQ"). Empty when the name has nothing left."""
    stem = file_name[:-5] if file_name.lower().endswith(".gguf") else file_name
    while (shorter := _NAME_TAIL.sub("", stem)) != stem:
        stem = shorter
    parts = []
    for part in stem.split("-"):
        if part.lower() != part or re.fullmatch(r"v\d.*|it", part):
            parts.append(part)  # already written as its authors write it
        elif _PARAMETERS.fullmatch(part):
            parts.append(part[:-1] + part[-1].upper())
        else:
            parts.append(part[:1].upper() + part[1:])
    return "-".join(p for p in parts if p)


def _license(path: Path, metadata: dict[str, Any]) -> str:
    """The model's license: the bundled model's is known; another file's is what its
    GGUF header says (``general.license``), if anything."""
    from .bundled import BUNDLED_MODEL

    if path.name == BUNDLED_MODEL.file_name:
        return f"{BUNDLED_MODEL.license} ({BUNDLED_MODEL.license_url})"
    named = metadata.get("general.license")
    return str(named) if named else "not stated in the file; see where it came from"


def _header_identity(info: GGUFInfo) -> str:
    """sha256 of the GGUF header (metadata + tensor infos): it contains the whole
    tokenizer and chat template, so it changes whenever tokenization could, and costs
    milliseconds instead of hashing the whole file."""
    digest = hashlib.sha256()
    with open(info.path, "rb") as fh:
        remaining = info.header_size or info.size_bytes
        while remaining > 0:
            block = fh.read(min(remaining, 4 * 1024 * 1024))
            if not block:
                break
            digest.update(block)
            remaining -= len(block)
    return digest.hexdigest()


#: how messages are rendered for counting; 2: Jinja messages measured after a system
#: message, so a template's default system prompt is not counted with every message
COUNT_SCHEME = 2


class ModelTokenCounter:
    """Exact token counts for one model and chat format (``iris_desktop.tokens.TokenCounter``).

    ``count_message(m)`` is the number of tokens ``m`` adds to a prompt;
    ``prompt_overhead()`` the BOS/prefix plus the generation prompt. For the additive
    formats (gemma, chatml) ``prompt_overhead() + sum(count_message(m))`` is exactly the
    number of tokens llama.cpp evaluates; for an embedded Jinja template it is an
    estimate from rendering each message alone (``exact`` is then False).
    Nothing is cached here (the store caches per message and counter name).
    """

    def __init__(self, model: LocalModel) -> None:
        self._model = model
        # the scheme number changes whenever the way messages are counted changes, so the
        # store's cached counts from an older scheme are never mixed in
        self.name = f"model:{model.identity[:12]}:{COUNT_SCHEME}:{model.chat_format.name}"
        self.exact = bool(model.chat_format.additive)

    def count_text(self, text: str) -> int:
        return len(self._model.tokenize(text, special=False))

    def count_message(self, message: Message) -> int:
        return len(self._model.message_tokens(message))

    def prompt_overhead(self) -> int:
        return len(self._model._prefix_tokens) + len(self._model._generation_tokens)

    def __repr__(self) -> str:
        return f"<ModelTokenCounter {self.name}>"
