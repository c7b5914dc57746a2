"""The llama.cpp binding: loading ``llama_cpp``, the ``Llama`` subclass Iris evaluates
with (it counts what it evaluates and stops a prompt part-way), the hooks a load needs
(progress, cancel, the one GPU, a scratch sequence) and llama.cpp's log, captured once.

:mod:`.model` and :mod:`.embedder` share it; nothing else touches ``llama_cpp.Llama``'s
construction.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .backends import load_backends


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


def counting_llama_class() -> Any:
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

            #: DRY's multiplier for the next generation (0: off); set per request
            iris_dry = 0.0

            def _init_sampler(self, *args: Any, **kwargs: Any) -> Any:
                """llama-cpp-python's sampler chain with llama.cpp's DRY sampler right
                after the penalties, where llama.cpp's own order puts it: its
                ``generate`` has no parameter for DRY."""
                sampler = super()._init_sampler(*args, **kwargs)
                if self.iris_dry > 0:
                    with_dry(sampler, self._model, self.iris_dry)
                return sampler

        _llama_class = CountingLlama
    return _llama_class


#: DRY ("don't repeat yourself", p-e-w's sampler in llama.cpp) with llama.cpp's defaults
#: but a look-back of 1,024 tokens (its default is the whole context): a repeat longer
#: than 2 tokens is held back by multiplier × 1.75^(length − 2), a match never running
#: across a line end, a colon, a quote or an asterisk
DRY_BASE, DRY_ALLOWED_LENGTH, DRY_LAST_N = 1.75, 2, 1024
DRY_BREAKERS = ["\n", ":", "\"", "*"]


def with_dry(sampler: Any, model: Any, multiplier: float) -> None:
    """Put DRY into ``sampler`` (a ``LlamaSampler`` chain) after its penalties."""
    import llama_cpp

    chain = sampler.sampler
    # a sampler its values make a no-op is named with a "?" ("?penalties" at 1.0)
    names = [llama_cpp.llama_sampler_name(llama_cpp.llama_sampler_chain_get(chain, i)).lstrip(b"?")
             for i in range(llama_cpp.llama_sampler_chain_n(chain))]
    after = names.index(b"penalties") + 1 if b"penalties" in names else 0
    rest = [llama_cpp.llama_sampler_chain_remove(chain, after) for _ in range(len(names) - after)]
    sampler.add_dry(model, multiplier, DRY_BASE, DRY_ALLOWED_LENGTH, DRY_LAST_N, DRY_BREAKERS)
    for each in rest:  # the chain owns them again
        llama_cpp.llama_sampler_chain_add(chain, each)


_load_lock = threading.Lock()
_context_lock = threading.Lock()


def load_llama(path: Path, scratch: bool, progress: Any, cancel: threading.Event | None,
                device: int | None = None, **params: Any) -> Any:
    load_backends()  # the installers' llama.cpp loads its CPU backend (the variant this CPU runs)
    with load_progress(progress, cancel, device), scratch_sequence(scratch):
        return counting_llama_class()(model_path=str(path), verbose=False, **params)


@contextlib.contextmanager
def load_progress(progress: Any, cancel: threading.Event | None, device: int | None = None) -> Iterator[None]:
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
def scratch_sequence(wanted: bool) -> Iterator[None]:
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


def install_llama_logging() -> None:
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
    state: dict[str, Any] = {"buf": "", "level": logging.DEBUG, "errors": [], "captures": []}

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
                for thread, lines in state["captures"]:
                    if thread == threading.get_ident():
                        lines.append(line)
                llama_log.log(level, "%s", line)
        except Exception:  # never raise into C
            pass

    _log_state["state"] = state
    _log_state["callback"] = llama_cpp.llama_log_callback(callback)  # keep a reference
    llama_cpp.llama_log_set(_log_state["callback"], ctypes.c_void_p(0))


@contextlib.contextmanager
def captured_log() -> Iterator[list[str]]:
    """The lines llama.cpp logs on this thread meanwhile (a load's: what it offloaded)."""
    install_llama_logging()
    captures = _log_state["state"]["captures"]
    entry: tuple[int, list[str]] = (threading.get_ident(), [])
    captures.append(entry)  # a capture inside another: both get the lines
    try:
        yield entry[1]
    finally:  # by identity: two captures of one load hold equal lists
        captures[:] = [other for other in captures if other is not entry]


def _aborting() -> bool:
    """A decode on this thread is being aborted on purpose (its stop check says so)."""
    stopping = getattr(_decoding, "stopping", None)
    try:
        return bool(stopping is not None and stopping())
    except Exception:  # called from C: never raise
        return False


def recent_llama_errors() -> list[str]:
    state = _log_state.get("state")
    if not state:
        return []
    errors, state["errors"] = state["errors"], []
    return errors


# ---------------------------------------------------------------------------
