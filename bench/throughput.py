"""Prompt evaluation (pp) and generation (tg) tokens/s of the bundled model: Iris's
shipped runtime against llama.cpp at the best flags, side by side in one run.

- **Iris**: the runtime the app builds (``host.load_runtime`` with the default
  settings but ``model.gpu=off``: the CPU column), driven as a turn drives it:
  ``stream()`` from a cold cache for pp (evaluated tokens ÷ time to the first token), a
  reply at the default temperature for tg (its own ``tokens_per_s``: the tokens after
  the first ÷ the time between them).
- **llama.cpp**, through llama-cpp-python's low-level API: one ``llama_model``, one
  ``llama_context`` per configuration (threads, flash attention, ``n_batch`` /
  ``n_ubatch``, KV cache type), the same prompt tokens decoded with ``llama_decode``
  and ``llama_batch_get_one``; tg is a greedy loop, one token per decode.
- **llama-bench** (llama.cpp's own C++ tool) at the best low-level flags, when one is
  found (``--llama-bench``, ``$IRIS_LLAMA_BENCH``, on ``PATH``, or the one
  ``--build-llama-bench`` builds first from the llama.cpp llama-cpp-python vendors, kept
  in ``~/.cache/iris-desktop-tests``); else the column is left out, said so.
- **Iris GPU**, where llama.cpp lists a GPU device (:func:`iris_desktop.runtime.devices.list_devices`,
  the listing the app and ``iris-desktop devices`` use): the same runtime loaded again
  with ``model.gpu=auto`` (the app's own plan, ``runtime/gpu.py``; ``--gpu-layers N`` asks
  for N layers instead), measured in the same run with the same prompts and sizes; its
  line names the device and the layer split, and the GPU ÷ CPU ratios are printed. With
  no GPU listed (a CPU-only build, no driver), with ``--no-gpu``, or where the plan keeps
  the model on the CPU, the column is left out and one line says why. Lavapipe (Mesa's
  CPU Vulkan driver) counts only when ``GGML_VK_VISIBLE_DEVICES`` asks for it, and is
  labelled a CPU-type Vulkan device: it proves the offload path, not a GPU's speed.
  The low-level llama.cpp contexts always stay on the CPU (no layer, no device, no op
  offload), as ``model.gpu=off`` loads.

Every repetition runs every configuration, in an order rotated each time, so a
machine busy with other work slows them alike; the tables show the median and the
spread (min–max). Each low-level configuration is also checked against the first one
(llama.cpp's defaults as llama-cpp-python sets them): does the last prompt token's
most likely next token agree, how far do the logits move, and does the greedy reply
stay the same token for token.

    .venv/bin/python bench/throughput.py [--reps 3] [--sizes 1024,4096] [--tg 64]
        [--configs t2.fa1,t2.fa0.ub256] [--model PATH] [--llama-bench PATH | --build-llama-bench]
        [--gpu-layers N | --no-gpu]

A configuration is dot-separated: ``t2`` (n_threads and n_threads_batch), ``tg1`` /
``tb2`` (one of them), ``fa0``/``fa1`` (flash attention), ``b2048`` (n_batch),
``ub256`` (n_ubatch), ``kvq8_0`` (type_k and type_v: f16, q8_0, q4_0), ``q8w`` (the
model's exact Q8_0 copy of its Q5_0 weights, ``runtime/weights.py``, which Iris loads by
default: ``model.q8_weights``), e.g. ``t2.fa1.ub256.kvq8_0``. ``default`` is what llama-cpp-python picks when nothing is
set (half the logical CPUs for generation, all for prompts, no flash attention).

The last line is one parseable summary: ``throughput: pp_ratio=X tg_ratio=Y …``, Iris
÷ the best configuration; pp_ratio is the lowest over the prompt sizes. ``pp_ratio_fastest``
/ ``tg_ratio_fastest`` compare each configuration's fastest repetition instead of its
median: other work only slows a repetition, so on a shared machine they are the figures
least disturbed by it.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from iris_desktop.generation import GenerationRequest
from iris_desktop.host import GPU_CHECKS_FILE, load_runtime  # noqa: E402
from iris_desktop.paths import app_paths  # noqa: E402
from iris_desktop.runtime.bundled import ensure_bundled_model  # noqa: E402
from iris_desktop.runtime.cpu import physical_cores  # noqa: E402
from iris_desktop.runtime.devices import list_devices  # noqa: E402
from iris_desktop.runtime.gguf import read_gguf_info  # noqa: E402
from iris_desktop.runtime.gpu import Device, GpuPlan  # noqa: E402
from iris_desktop.runtime.loading import plan_device  # noqa: E402
from iris_desktop.runtime.weights import q8_copy  # noqa: E402
from iris_desktop.settings import load_settings  # noqa: E402

#: the n_ctx every context gets (the app's model.n_ctx default), so the KV caches match
N_CTX = 8192
TG_PROMPT = "Count from 1 to 500, one number per line, nothing else."
KV_TYPES = {"f16": 1, "q4_0": 2, "q8_0": 8}


@dataclass
class Flags:
    """One llama.cpp configuration; ``spec`` is how it was written."""

    spec: str
    n_threads: int
    n_threads_batch: int
    flash_attn: bool = False
    n_batch: int = 512
    n_ubatch: int = 512
    kv: str = "f16"
    #: on the exact Q8_0 copy of the model's Q5_0 weights (the file as published otherwise)
    q8_weights: bool = False

    @classmethod
    def parse(cls, spec: str) -> Flags:
        logical = multiprocessing.cpu_count()
        # llama-cpp-python's own defaults (Llama.__init__), which Iris used before issue 29
        flags = cls(spec, max(logical // 2, 1), logical)
        if spec == "default":
            return flags
        for part in spec.split("."):
            if part == "q8w":
                flags.q8_weights = True
                continue
            key = part.rstrip("0123456789_") if not part.startswith("kv") else "kv"
            value = part[len(key):]
            if key == "t":
                flags.n_threads = flags.n_threads_batch = int(value)
            elif key == "tg":
                flags.n_threads = int(value)
            elif key == "tb":
                flags.n_threads_batch = int(value)
            elif key == "fa" and value in ("0", "1"):
                flags.flash_attn = value == "1"
            elif key == "b":
                flags.n_batch = int(value)
            elif key == "ub":
                flags.n_ubatch = int(value)
            elif key == "kv" and value in KV_TYPES:
                flags.kv = value
            else:
                raise argparse.ArgumentTypeError(f"unknown part {part!r} in configuration {spec!r}")
        flags.n_ubatch = min(flags.n_ubatch, flags.n_batch)
        if flags.kv != "f16" and not flags.flash_attn:
            raise argparse.ArgumentTypeError(f"{spec}: a quantized V cache needs flash attention (fa1)")
        return flags

    def describe(self) -> str:
        return (f"threads {self.n_threads}/{self.n_threads_batch}, FA {'on' if self.flash_attn else 'off'}, "
                f"batch {self.n_batch}/{self.n_ubatch}, KV {self.kv}"
                + (", Q5_0 weights as Q8_0" if self.q8_weights else ""))


@dataclass
class Column:
    """What one configuration measured: pp tokens/s per prompt size, tg tokens/s."""

    name: str
    pp: dict[int, list[float]] = field(default_factory=dict)
    tg: list[float] = field(default_factory=list)
    #: against the reference configuration: top-1 agreement, largest logit change, greedy reply
    agree: list[bool] = field(default_factory=list)
    max_delta: list[float] = field(default_factory=list)
    same_reply: list[bool] = field(default_factory=list)


# -- llama.cpp through the low-level API ---------------------------------------------


class LowLevel:
    """One llama_context with ``flags`` on a shared llama_model."""

    def __init__(self, model: Any, flags: Flags, n_vocab: int) -> None:
        import llama_cpp

        self.flags = flags
        self.n_vocab = n_vocab
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = N_CTX
        params.n_batch = flags.n_batch
        params.n_ubatch = flags.n_ubatch
        params.n_seq_max = 1
        params.n_threads = flags.n_threads
        params.n_threads_batch = flags.n_threads_batch
        params.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flags.flash_attn
                                  else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        params.type_k = params.type_v = KV_TYPES[flags.kv]
        params.no_perf = True
        params.op_offload = False  # the CPU column: no big batch is sent to a GPU either
        self.ctx = llama_cpp.llama_init_from_model(model, params)
        if not self.ctx:
            raise SystemExit(f"llama.cpp refused the configuration {flags.spec} ({flags.describe()})")

    def decode(self, tokens: list[int]) -> np.ndarray:
        """Evaluate ``tokens`` from an empty cache, n_batch at a time; the last logits."""
        import llama_cpp

        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.ctx), True)
        array = (llama_cpp.llama_token * len(tokens))(*tokens)
        base = ctypes.addressof(array)
        size = ctypes.sizeof(llama_cpp.llama_token)
        for start in range(0, len(tokens), self.flags.n_batch):
            n = min(self.flags.n_batch, len(tokens) - start)
            at = ctypes.cast(base + start * size, ctypes.POINTER(llama_cpp.llama_token))
            rc = llama_cpp.llama_decode(self.ctx, llama_cpp.llama_batch_get_one(at, n))
            if rc:
                raise SystemExit(f"{self.flags.spec}: llama_decode returned {rc}")
        return self._logits().copy()

    def _logits(self) -> np.ndarray:
        import llama_cpp

        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.ctx, -1), shape=(self.n_vocab,))

    def generate(self, prompt: list[int], n: int) -> tuple[float, list[int]]:
        """Greedy tokens after ``prompt``, one decode each; tokens/s after the first
        (as Iris's ``tokens_per_s``) and the tokens."""
        import llama_cpp

        token = int(self.decode(prompt).argmax())
        out = [token]
        one = (llama_cpp.llama_token * 1)()
        first = time.perf_counter()
        for _ in range(n - 1):
            one[0] = token
            rc = llama_cpp.llama_decode(self.ctx, llama_cpp.llama_batch_get_one(one, 1))
            if rc:
                raise SystemExit(f"{self.flags.spec}: llama_decode returned {rc}")
            token = int(self._logits().argmax())
            out.append(token)
        return (n - 1) / (time.perf_counter() - first), out

    def close(self) -> None:
        import llama_cpp

        llama_cpp.llama_free(self.ctx)


def load_model(path: Path) -> tuple[Any, int]:
    import llama_cpp

    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    # on the CPU only, as model.gpu=off loads (runtime/loading.py's cpu_only_params)
    params.n_gpu_layers = 0
    params.split_mode = llama_cpp.LLAMA_SPLIT_MODE_NONE
    params.main_gpu = -1
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise SystemExit(f"llama.cpp could not load {path}")
    vocab = llama_cpp.llama_model_get_vocab(model)
    return model, int(llama_cpp.llama_vocab_n_tokens(vocab))


# -- Iris --------------------------------------------------------------------------


def iris_settings(model_path: Path | None, gpu: str | int = "off"):
    """The app's default settings, ``model.path`` and ``model.gpu`` aside."""
    cli: dict[str, Any] = {"model.gpu": str(gpu)}
    if model_path:
        cli["model.path"] = str(model_path)
    return load_settings(None, env={}, cli=cli)


def iris_runtime(model_path: Path | None, gpu: str | int = "off"):
    """The runtime the app loads with the default settings (``model.path`` and
    ``model.gpu`` aside: ``off`` for the CPU column, ``auto`` or N for the GPU one)."""
    settings = iris_settings(model_path, gpu)
    return load_runtime(settings, app_paths()), settings


# -- the GPU column ----------------------------------------------------------------

#: the line the report prints where llama.cpp lists no GPU device
NO_GPU = "GPU column: no GPU device found by llama.cpp (CPU-only build or no driver); not measured"
CPU_TYPE_VULKAN = "a CPU-type Vulkan device, not a GPU speed"


def cpu_type_vulkan(device: Device) -> bool:
    """Lavapipe: Mesa's Vulkan driver that runs on the CPU (its device is "llvmpipe ...")."""
    return device.backend == "Vulkan" and "llvmpipe" in device.description.lower()


def gpu_devices(devices: list[Device], env: dict[str, str] | None = None) -> list[Device]:
    """The GPU devices in llama.cpp's listing; lavapipe only when ``GGML_VK_VISIBLE_DEVICES``
    asks for Vulkan devices by number (ggml itself skips CPU-type ones otherwise)."""
    env = os.environ if env is None else env
    return [d for d in devices if d.is_gpu and (not cpu_type_vulkan(d) or "GGML_VK_VISIBLE_DEVICES" in env)]


def gpu_label(plan: GpuPlan) -> str:
    """The GPU column's name: the device, its ggml name and the layer split."""
    device = plan.device
    layers = f"{min(plan.layers, plan.total_layers)}/{plan.total_layers} layers"
    label = f"Iris GPU ({device.name}: {device.label} · {layers})"
    if cpu_type_vulkan(device):
        label += f" [llvmpipe: {CPU_TYPE_VULKAN}]"
    return label


def plan_gpu_column(path: Path, settings: Any, gpu: str | int,
                    env: dict[str, str] | None = None) -> tuple[GpuPlan | None, str]:
    """What the GPU column will measure: the app's plan for ``gpu`` (``auto`` or a layer
    count) on the first-listed GPU devices, from the GGUF header (nothing is loaded), and
    one line for the report. No plan where llama.cpp lists no GPU, or the plan keeps the
    model on the CPU."""
    try:
        devices = list_devices()
    except Exception as exc:  # noqa: BLE001 - a driver that fails to answer: no GPU column
        return None, f"GPU column: llama.cpp's devices could not be listed ({exc}); not measured"
    gpus = gpu_devices(devices, env)
    if not gpus:
        return None, NO_GPU
    # the CPU and the GPUs the user allows; not the disabled ones: the first-use check's
    # record is the app's, kept in its data folder
    keep = [d for d in devices if not d.is_gpu or d in gpus]
    info = read_gguf_info(path)
    n_ctx = settings["model.n_ctx"] or info.context_length or 4096
    checks = app_paths().data_dir / GPU_CHECKS_FILE
    plan = plan_device(info, n_ctx, gpu, keep, checks, swa_full=True,
                       flash_attn=settings["model.flash_attn"])
    listed = ", ".join(f"{d.name} ({d.label})" for d in gpus)
    if not plan.on_gpu:
        return None, f"GPU column: model.gpu={gpu} plans the CPU ({plan.reason}); listed: {listed}; not measured"
    line = f"GPU column: model.gpu={gpu}: {gpu_label(plan).removeprefix('Iris GPU ')}"
    if cpu_type_vulkan(plan.device):
        line += f" (llvmpipe: {CPU_TYPE_VULKAN}; GGML_VK_VISIBLE_DEVICES asked for it)"
    return plan, line


def prompt_of(model, tokens: int, nonce: str) -> list[dict]:
    """A user message whose prompt is at least ``tokens`` long; ``nonce`` first, so
    that no two repetitions share more than the template's first tokens."""
    lines = [f"{nonce}: read these lines."]
    while True:
        for _ in range(20):
            n = len(lines)
            lines.append(f"line {n}: the quick brown fox jumps over the lazy dog, {n * 7919 % 1000} times.")
        messages = [{"role": "user", "content": "\n".join(lines)}]
        if model.count_prompt(messages) >= tokens:
            while model.count_prompt([{"role": "user", "content": "\n".join(lines[:-1])}]) >= tokens:
                lines.pop()
            return [{"role": "user", "content": "\n".join(lines)}]


def iris_pp(model, messages: list[dict], temperature: float) -> float:
    model.llm.reset()  # cold: the whole prompt is evaluated (the nonce makes sure)
    generation = model.stream(GenerationRequest(messages, max_tokens=1, temperature=temperature))
    generation.text()
    stats = generation.stats
    if stats.evaluated_tokens < stats.prompt_tokens - 64:
        raise SystemExit(f"Iris reused {stats.reused_tokens} of {stats.prompt_tokens} tokens: not a cold run")
    return stats.evaluated_tokens / stats.time_to_first_token_s


def iris_tg(model, messages: list[dict], n: int, temperature: float, seed: int) -> tuple[float, int]:
    """A reply at the app's temperature; one that ends before n/2 tokens is asked again
    with the next seed (at most 5 times), so the rate is over a real stretch of tokens."""
    for attempt in range(5):
        generation = model.stream(GenerationRequest(messages, max_tokens=n, temperature=temperature,
                                                    seed=seed * 5 + attempt))
        generation.text()
        if generation.stats.completion_tokens >= max(2, n // 2):
            break
    return generation.stats.tokens_per_s, generation.stats.completion_tokens


# -- llama-bench -------------------------------------------------------------------


#: where ``--build-llama-bench`` puts llama.cpp's tool: one folder per llama-cpp-python version
LLAMA_BENCH_CACHE = Path(os.environ.get("IRIS_TEST_MODEL_CACHE", Path.home() / ".cache" / "iris-desktop-tests"))
#: the llama.cpp llama-cpp-python vendors, with this machine's CPU flags, only the tool, and
#: linked statically: the one binary is kept, the source tree removed
LLAMA_BENCH_CMAKE = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF",
                     "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                     "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TOOLS=ON"]


def cached_llama_bench() -> Path:
    """Where ``--build-llama-bench`` leaves the binary for the installed llama-cpp-python."""
    return LLAMA_BENCH_CACHE / f"llama-bench-{version('llama-cpp-python')}" / "llama-bench"


def find_llama_bench(given: str | None) -> Path | None:
    for candidate in (given, os.environ.get("IRIS_LLAMA_BENCH"), shutil.which("llama-bench"),
                      cached_llama_bench()):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def build_llama_bench() -> Path:
    """Build llama-bench from the llama.cpp the installed llama-cpp-python vendors (its
    sdist, from the package index), so the tool and the library run the same kernels:
    minutes, one compile job per CPU. Returns :func:`cached_llama_bench`."""
    binary = cached_llama_bench()
    if binary.is_file():
        return binary
    work = binary.parent.with_name(binary.parent.name + f".{os.getpid()}.partial")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                        f"llama-cpp-python=={version('llama-cpp-python')}", "-d", str(work)], check=True)
        with tarfile.open(next(work.glob("llama_cpp_python-*.tar.gz"))) as archive:
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            archive.extractall(work, **safe)
        source = next(work.glob("llama_cpp_python-*/vendor/llama.cpp"))
        build = work / "build"
        subprocess.run(["cmake", "-S", str(source), "-B", str(build), *LLAMA_BENCH_CMAKE], check=True)
        subprocess.run(["cmake", "--build", str(build), "--target", "llama-bench",
                        "-j", str(os.cpu_count() or 2)], check=True)
        binary.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(build / "bin" / "llama-bench", binary)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return binary


def llama_bench(binary: Path, model: Path, flags: Flags, sizes: list[int], tg: int) -> dict[str, float]:
    """One llama-bench run (one repetition) at ``flags``: {"pp1024": t/s, …, "tg": t/s}."""
    command = [str(binary), "-m", str(model), "-p", ",".join(map(str, sizes)), "-n", str(tg),
               "-t", str(flags.n_threads_batch), "-fa", "1" if flags.flash_attn else "0",
               "-b", str(flags.n_batch), "-ub", str(flags.n_ubatch), "-ctk", flags.kv, "-ctv", flags.kv,
               "-r", "1", "-o", "jsonl"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if done.returncode:
        raise SystemExit(f"llama-bench failed ({' '.join(command)}):\n{done.stderr[-1500:]}")
    found: dict[str, float] = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            key = f"pp{row['n_prompt']}" if row["n_prompt"] else "tg"
            found[key] = float(row["avg_ts"])
    return found


# -- the run -----------------------------------------------------------------------


def default_configs() -> list[str]:
    cores = physical_cores()
    configs = ["default", f"t{cores}.fa0", f"t{cores}.fa1", f"t{cores}.fa0.q8w", f"t{cores}.fa1.q8w"]
    return list(dict.fromkeys(configs))


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}–{max(values):.1f})"


def load_average() -> str:
    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="repetitions of every configuration")
    parser.add_argument("--sizes", default="1024,4096", help="prompt sizes in tokens, comma-separated")
    parser.add_argument("--tg", type=int, default=64, help="tokens generated per tg measurement")
    parser.add_argument("--configs", default=None,
                        help=f"llama.cpp configurations, comma-separated (default: {','.join(default_configs())})")
    parser.add_argument("--model", type=Path, default=None, help="a GGUF (default: the bundled model)")
    parser.add_argument("--llama-bench", default=None, help="llama.cpp's llama-bench binary, if built")
    parser.add_argument("--build-llama-bench", action="store_true",
                        help="first build llama-bench from the llama.cpp llama-cpp-python vendors "
                             "(cmake and a C++ compiler; minutes), kept in ~/.cache/iris-desktop-tests")
    gpu = parser.add_mutually_exclusive_group()
    gpu.add_argument("--gpu-layers", type=int, default=None, metavar="N",
                     help="the GPU column with N layers offloaded (default: model.gpu=auto, the app's plan)")
    gpu.add_argument("--no-gpu", action="store_true", help="leave the GPU column out even where a GPU is listed")
    args = parser.parse_args()
    if args.gpu_layers is not None and args.gpu_layers < 1:
        parser.error("--gpu-layers must be at least 1 (--no-gpu for none)")
    if args.build_llama_bench and not args.llama_bench:
        args.llama_bench = str(build_llama_bench())
    sizes = [int(s) for s in args.sizes.split(",")]
    if max(sizes) + 64 > N_CTX or args.tg < 2 or args.reps < 1:
        parser.error(f"sizes must stay below {N_CTX - 64}, --tg at least 2, --reps at least 1")
    flags = [Flags.parse(s) for s in (args.configs.split(",") if args.configs else default_configs())]
    if len({f.spec for f in flags}) != len(flags):
        parser.error("a configuration is named twice")
    load_before = load_average()
    started = time.perf_counter()

    path = args.model or ensure_bundled_model(app_paths().models_dir)
    iris, settings = iris_runtime(args.model)
    temperature = settings["model.temperature"]
    gpu_setting: str | int = "auto" if args.gpu_layers is None else args.gpu_layers
    if args.no_gpu:
        gpu_plan, gpu_line = None, "GPU column: left out (--no-gpu); not measured"
    else:
        gpu_plan, gpu_line = plan_gpu_column(path, settings, gpu_setting)
    print(gpu_line, file=sys.stderr, flush=True)
    iris_gpu = iris_runtime(args.model, gpu_setting)[0] if gpu_plan else None
    gpu_col = Column(gpu_label(iris_gpu.gpu) if iris_gpu and iris_gpu.gpu.on_gpu else "Iris GPU")
    if iris_gpu is not None and not iris_gpu.gpu.on_gpu:  # every GPU load failed: it fell back to the CPU
        gpu_line = f"GPU column: the GPU load fell back to the CPU ({iris_gpu.gpu.reason}); not measured"
        iris_gpu.close()
        iris_gpu = None
    elif iris_gpu is not None:
        gpu_line = f"GPU column: model.gpu={gpu_setting}: {gpu_col.name.removeprefix('Iris GPU ')}"
    llama_model, n_vocab = load_model(path)
    q8_path = q8_copy(path, app_paths().weights_dir) if any(f.q8_weights for f in flags) else path
    q8_model = load_model(q8_path)[0] if q8_path != path else llama_model
    contexts = [LowLevel(q8_model if f.q8_weights else llama_model, f, n_vocab) for f in flags]
    bench_binary = find_llama_bench(args.llama_bench)

    iris_col = Column("Iris")
    columns = [Column(f.spec) for f in flags]
    bench_col = Column("llama-bench")
    bench_flags: Flags | None = None
    logits: dict[tuple[int, int, int], np.ndarray] = {}  # (configuration, rep, size)
    replies: dict[tuple[int, int], list[int]] = {}  # (configuration, rep)
    tg_tokens: list[int] = []
    tg_messages = [{"role": "user", "content": TG_PROMPT}]
    tg_prompt = iris.prompt_tokens(tg_messages)
    workers: list[int | str] = (["iris", *range(len(flags))] + (["llama-bench"] if bench_binary else [])
                                + (["iris-gpu"] if iris_gpu else []))
    for rep in range(args.reps):
        prompts = {size: prompt_of(iris, size, f"run {rep} of {os.getpid()}") for size in sizes}
        tokens = {size: iris.prompt_tokens(m) for size, m in prompts.items()}
        # rotated, but llama-bench comes last in the first repetition: it runs at the best flags found
        order = workers[rep % len(workers):] + workers[:rep % len(workers)]
        for who in order:
            if who == "iris":
                for size in sizes:
                    iris_col.pp.setdefault(size, []).append(iris_pp(iris, prompts[size], temperature))
                rate, n = iris_tg(iris, tg_messages, args.tg, temperature, seed=rep)
                iris_col.tg.append(rate)
                tg_tokens.append(n)
            elif who == "iris-gpu":
                for size in sizes:
                    gpu_col.pp.setdefault(size, []).append(iris_pp(iris_gpu, prompts[size], temperature))
                gpu_col.tg.append(iris_tg(iris_gpu, tg_messages, args.tg, temperature, seed=rep)[0])
            elif who == "llama-bench":
                bench_flags = bench_flags or flags[_best_index(columns, sizes)]
                found = llama_bench(bench_binary, q8_path if bench_flags.q8_weights else path,
                                    bench_flags, sizes, args.tg)
                for size in sizes:
                    bench_col.pp.setdefault(size, []).append(found[f"pp{size}"])
                bench_col.tg.append(found["tg"])
                bench_col.name = f"llama-bench ({bench_flags.spec})"
            else:
                ctx, col = contexts[who], columns[who]
                for size in sizes:
                    t0 = time.perf_counter()
                    logits[who, rep, size] = ctx.decode(tokens[size])
                    col.pp.setdefault(size, []).append(len(tokens[size]) / (time.perf_counter() - t0))
                rate, replies[who, rep] = ctx.generate(tg_prompt, args.tg)
                col.tg.append(rate)
        figures = " ".join(f"{c.name}:" + ",".join(f"{c.pp[s][-1]:.1f}" for s in sizes) + f",{c.tg[-1]:.1f}"
                           for c in [iris_col, *columns, *([bench_col] if bench_binary else []),
                                     *([gpu_col] if iris_gpu else [])])
        print(f"rep {rep + 1}/{args.reps} after {time.perf_counter() - started:.0f} s, load {load_average()}: "
              f"{figures}", file=sys.stderr, flush=True)
    for who, col in enumerate(columns):
        for rep in range(args.reps):
            for size in sizes:
                mine, ref = logits[who, rep, size], logits[0, rep, size]
                col.agree.append(int(mine.argmax()) == int(ref.argmax()))
                col.max_delta.append(float(np.abs(mine - ref).max()))
            col.same_reply.append(replies[who, rep] == replies[0, rep])

    for ctx in contexts:
        ctx.close()
    iris.close()
    if iris_gpu is not None:
        iris_gpu.close()
    report(iris_col, columns, flags, bench_col if bench_binary else None, sizes, args, tg_tokens,
           load_before, load_average(), time.perf_counter() - started,
           gpu=gpu_col if iris_gpu else None, gpu_line=gpu_line)


def _best_index(columns: list[Column], sizes: list[int]) -> int:
    """The configuration with the best median pp at the largest size."""
    size = max(sizes)
    return max(range(len(columns)), key=lambda i: statistics.median(columns[i].pp[size]))


def report(iris: Column, columns: list[Column], flags: list[Flags], bench: Column | None, sizes: list[int],
           args: argparse.Namespace, tg_tokens: list[int], load_before: str, load_after: str,
           elapsed: float, gpu: Column | None = None, gpu_line: str = NO_GPU) -> None:
    print(f"{args.reps} repetitions, interleaved; prompt sizes {', '.join(map(str, sizes))} tokens; "
          f"tg: {args.tg} tokens (Iris generated {min(tg_tokens)}–{max(tg_tokens)}); "
          f"physical cores {physical_cores()}, logical {multiprocessing.cpu_count()}; "
          f"load average (1/5/15 min) {load_before} before, {load_after} after; {elapsed:.0f} s\n")
    print(gpu_line + "\n")
    print("tokens/s, median (min–max)\n")
    header = "| configuration | flags | " + " | ".join(f"pp{s}" for s in sizes) + " | tg |"
    print(header)
    print("|---|---|" + "---:|" * (len(sizes) + 1))
    all_columns = [iris, *columns] + ([bench] if bench else [])
    descriptions = ["the app's runtime, default settings, model.gpu=off", *(f.describe() for f in flags)]
    if bench:
        descriptions.append("llama.cpp's C++ tool, best low-level flags")
    if gpu:
        all_columns.append(gpu)
        descriptions.append("the app's runtime, default settings, model.gpu="
                            + ("auto" if args.gpu_layers is None else str(args.gpu_layers)))
    for col, what in zip(all_columns, descriptions):
        cells = " | ".join(spread(col.pp[s]) for s in sizes)
        print(f"| {col.name} | {what} | {cells} | {spread(col.tg)} |")

    print("\nagainst the first configuration: next-token agreement at the prompt's end, "
          "largest logit change, the greedy reply\n")
    print("| configuration | top-1 agrees | max abs logit change | same greedy reply |")
    print("|---|---:|---:|---:|")
    for col in columns[1:]:
        print(f"| {col.name} | {sum(col.agree)}/{len(col.agree)} | "
              f"{max(col.max_delta) if col.max_delta else 0:.3f} | "
              f"{'yes' if all(col.same_reply) else 'no'} |")

    others = columns + ([bench] if bench else [])
    ratios = {}
    best_pp = {}
    for s in sizes:
        best = max(others, key=lambda c: statistics.median(c.pp[s]))
        best_pp[s] = best
        ratios[s] = statistics.median(iris.pp[s]) / statistics.median(best.pp[s])
    best_tg = max(others, key=lambda c: statistics.median(c.tg))
    tg_ratio = statistics.median(iris.tg) / statistics.median(best_tg.tg)
    print()
    for s in sizes:
        print(f"pp{s}: Iris {statistics.median(iris.pp[s]):.1f} t/s, best {best_pp[s].name} "
              f"{statistics.median(best_pp[s].pp[s]):.1f} t/s: {ratios[s]:.3f}×")
    print(f"tg: Iris {statistics.median(iris.tg):.1f} t/s, best {best_tg.name} "
          f"{statistics.median(best_tg.tg):.1f} t/s: {tg_ratio:.3f}×")
    # Other work on the machine only ever slows a repetition, so each configuration's
    # fastest one is its least disturbed (timeit's reasoning): on a shared, noisy machine
    # these ratios say more than the medians; the medians stay the headline.
    fastest = {s: max(iris.pp[s]) / max(max(c.pp[s]) for c in others) for s in sizes}
    fastest_tg = max(iris.tg) / max(max(c.tg) for c in others)
    print("fastest repetitions (the least disturbed): "
          + ", ".join(f"pp{s} {fastest[s]:.3f}×" for s in sizes) + f", tg {fastest_tg:.3f}×")
    gpu_summary = "gpu=no"
    if gpu:
        gpu_pp = {s: statistics.median(gpu.pp[s]) / statistics.median(iris.pp[s]) for s in sizes}
        gpu_tg = statistics.median(gpu.tg) / statistics.median(iris.tg)
        print(f"GPU ÷ CPU (Iris, medians), {gpu.name}: "
              + ", ".join(f"pp{s} {gpu_pp[s]:.2f}×" for s in sizes) + f", tg {gpu_tg:.2f}×")
        if CPU_TYPE_VULKAN in gpu.name:
            print(f"  llvmpipe: {CPU_TYPE_VULKAN} (the offload path works; the ratio says nothing of a GPU)")
        gpu_summary = (f"gpu=yes gpu_pp{max(sizes)}_ratio={gpu_pp[max(sizes)]:.3f} gpu_tg_ratio={gpu_tg:.3f}"
                       + (" gpu_cpu_type=yes" if CPU_TYPE_VULKAN in gpu.name else ""))
    per_size = " ".join(f"pp{s}_ratio={ratios[s]:.3f}" for s in sizes)
    print(f"\nthroughput: pp_ratio={min(ratios.values()):.3f} tg_ratio={tg_ratio:.3f} {per_size} "
          f"pp_ratio_fastest={min(fastest.values()):.3f} tg_ratio_fastest={fastest_tg:.3f} "
          f"pp_best={best_pp[max(sizes)].name.replace(' ', '_')} tg_best={best_tg.name.replace(' ', '_')} "
          f"iris_pp{max(sizes)}={statistics.median(iris.pp[max(sizes)]):.1f} "
          f"iris_tg={statistics.median(iris.tg):.1f} reps={args.reps} llama_bench={'yes' if bench else 'no'} "
          f"load_before={load_before} load_after={load_after} {gpu_summary}")


if __name__ == "__main__":
    main()
