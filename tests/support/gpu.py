"""A simulated GPU: there is no GPU here. A "GPU" load is the real bundled model loaded on
this CPU, with the lines llama.cpp's log writes for an offload added to it (so the load's
own check against its plan sees layers and a buffer on the device), and a made-up device
whose free memory is its total less what the open "GPU" models hold. The first-use
check's loads (n_ctx :data:`~iris_desktop.runtime.first_use.CHECK_CTX`) really compute,
so the check passes. Everything but the device is real: the model, llama.cpp's errors as
its log says them, the SQLite history, the window.

:func:`simulate_gpu` sets it up for a test (each test file's ``fake_gpu`` fixture, with
its own device)."""

from __future__ import annotations

import threading
from dataclasses import replace

from iris_desktop.generation import GenerationRequest
from iris_desktop.runtime import llama_binding, loading
from iris_desktop.runtime.first_use import CHECK_CTX
from iris_desktop.runtime.gpu import Device, GiB, MiB
from iris_desktop.runtime.model import LocalModel

__all__ = ["CPU", "HELD_MIB", "SimulatedGpu", "llama_errors", "load_log", "simulate_gpu"]

CPU = Device("CPU", "Test CPU", "cpu", "CPU", 16 * GiB, 16 * GiB, index=0)
#: what an open "GPU" model holds on the device (the bundled model, whole, at n_ctx 1,024)
HELD_MIB = 720
#: what llama_decode's failure after a lost device looks like in llama.cpp's log
DEVICE_LOST = ("ggml_vulkan: vk::Queue::submit: ErrorDeviceLost", "llama_decode: failed to decode, ret = -3")


def llama_errors(*lines: str) -> None:
    """What llama.cpp's log would have said at an error (as ``recent_llama_errors`` reads it)."""
    state = llama_binding._log_state["state"]
    state["errors"] = (state["errors"] + list(lines))[-5:]


def load_log(*lines: str) -> None:
    """Lines of llama.cpp's log during this thread's load (what ``captured_log`` reads)."""
    for thread, captured in llama_binding._log_state["state"]["captures"]:
        if thread == threading.get_ident():
            captured.extend(lines)


class SimulatedGpu:
    """The made-up GPU ``gpu`` beside :data:`CPU`. ``devices()`` lists them, with what the
    open "GPU" models (``open``) leave free; ``loads`` are the layer counts asked for (the
    first-use check's two, then the model's).

    How evaluations fail, as llama_decode does after ErrorDeviceLost: ``failing`` (the
    GPU's models only, never the first-use check's): "all" (every evaluation), "replies"
    (a reply's, not a warm-up's) or None; ``fail_after`` (any model): evaluations of it
    before every next one fails (None: none fails); ``fail_warm_ups`` (any model): every
    evaluation of a prefill (``LocalModel._prefill``: the draft's while the user types,
    the warm-up after a compaction) fails, a reply's do not. ``refused``: n_ctx values
    whose loads fail as an unknown architecture does."""

    def __init__(self, gpu: Device) -> None:
        self.gpu = gpu
        self.open: set[int] = set()
        self.loads: list[int] = []
        self.failing: str | None = None
        self.fail_after: int | None = None
        self.fail_warm_ups = False
        self.refused: set[int] = set()
        self.warming = False  # a prefill is evaluating now

    def devices(self) -> list[Device]:
        return [CPU, replace(self.gpu, free_bytes=self.gpu.total_bytes - len(self.open) * HELD_MIB * MiB)]

    def _fails(self, count: int, on_gpu: bool) -> bool:
        if self.fail_after is not None and count > self.fail_after:
            return True
        if self.fail_warm_ups and self.warming:
            return True
        return on_gpu and (self.failing == "all" or (self.failing == "replies" and not self.warming))

    def _attach(self, llm, on_gpu: bool) -> None:
        real, count = llm.eval, [0]

        def evaluate(tokens):
            count[0] += 1
            if self._fails(count[0], on_gpu):
                llama_errors(*DEVICE_LOST)
                raise RuntimeError("llama_decode returned -3")
            return real(tokens)

        llm.eval = evaluate

    def load(self, real, path, scratch, progress, cancel, device=None, **params):
        """``llama_binding.load_llama`` (``real``) as it would be with this GPU."""
        layers = params["n_gpu_layers"]
        self.loads.append(layers)
        if params["n_ctx"] in self.refused:
            llama_errors("llama_model_load: error loading model: unknown model architecture: 'x'")
            raise ValueError("Failed to load model from file")
        if layers:
            params.update(loading.cpu_only_params())
            device = None
        llm = real(path, scratch, progress, cancel, device=device, **params)
        on_gpu = bool(layers) and params["n_ctx"] != CHECK_CTX  # (the check's model computes)
        self._attach(llm, on_gpu)
        if on_gpu:
            load_log(f"load_tensors: offloaded {layers}/25 layers to GPU",
                     f"load_tensors:      Vulkan0 model buffer size =   {HELD_MIB:.2f} MiB")
            self.open.add(id(llm))
            close = llm.close
            llm.close = lambda: (self.open.discard(id(llm)), close())
        return llm


def simulate_gpu(monkeypatch, gpu: Device) -> SimulatedGpu:
    """For the test that holds ``monkeypatch``: llama.cpp lists :data:`CPU` and ``gpu``
    (:meth:`SimulatedGpu.devices`), has a handle for it, and every load goes through
    :meth:`SimulatedGpu.load`; prefills are told from replies (``warming``)."""
    fake = SimulatedGpu(gpu)
    real = llama_binding.load_llama
    monkeypatch.setattr(llama_binding, "load_llama", lambda *args, **params: fake.load(real, *args, **params))
    prefill = LocalModel._prefill

    def warming(model, *args):
        fake.warming = True
        try:
            yield from prefill(model, *args)
        finally:
            fake.warming = False

    monkeypatch.setattr(LocalModel, "_prefill", warming)
    monkeypatch.setattr("iris_desktop.runtime.devices.device_handle", lambda device: 0xDEAD)
    monkeypatch.setattr("iris_desktop.runtime.devices.list_devices", fake.devices)
    return fake


# -- the made-up GPU of the tests of failing runs and of `devices --check-again` --------------

#: a GPU with room for the whole bundled model, its record's key "Fake Arc|Mesa 23.2"
ARC = Device("Vulkan0", "Fake Arc", "gpu", "Vulkan", 6 * GiB, 6 * GiB, index=1, driver="Mesa 23.2")
#: a short reply to ask for
HI = GenerationRequest([{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0)


def load_on_gpu(model_path, record) -> LocalModel:
    """The model loaded as the app loads it (``model.gpu`` auto), the first-use checks'
    record at ``record`` (the check runs first where it must)."""
    return LocalModel.load(model_path, n_ctx=1024, gpu="auto", gpu_checks=record)


def reply_fails(model_path, record) -> str:
    """Load on :data:`ARC` and fail a reply there; the failure's sentence (the model
    keeps it too)."""
    from iris_desktop.runtime.errors import GpuFailed

    model = load_on_gpu(model_path, record)
    try:
        assert model.gpu.describe() == "GPU: Fake Arc · 25/25 layers"
        try:
            "".join(model.stream(HI))
        except GpuFailed as failed:
            assert model.gpu_failed == str(failed)
            return str(failed)
        raise AssertionError("the reply did not fail on the GPU")
    finally:
        model.close()


def checked_again_on_the_gpu(fake: SimulatedGpu, model_path, record) -> None:
    """The next load runs the first-use check again (CPU, GPU) and then runs on the GPU,
    where a reply comes."""
    loads = len(fake.loads)
    back = load_on_gpu(model_path, record)
    try:
        assert back.gpu.describe() == "GPU: Fake Arc · 25/25 layers" and "".join(back.stream(HI))
    finally:
        back.close()
    assert fake.loads[loads:] == [0, 25, 25]  # the first-use check (CPU, GPU), then the model
