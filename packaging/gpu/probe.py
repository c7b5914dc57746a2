"""One GPU check of ``make gpu-check``, run by packaging/gpu/check.py inside the venv whose
llama_cpp is the Vulkan build. Prints one JSON object on its last line.

    probe.py full      the bundled model with model.gpu auto: the plan, llama.cpp's load log
                       (offloaded N/M, the buffers), the reply to "capital of France", the
                       first-use check's record, and 8 greedy steps on the GPU and the CPU
    probe.py partial   a made-up memory budget on the same device that fits 12 of 25 layers
    probe.py off       model.gpu off: the buffers llama.cpp made
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
PARTIAL_LAYERS = 12


def main(what: str) -> int:
    from iris_desktop.generation import GenerationRequest
    from iris_desktop.runtime import first_use, llama_binding
    from iris_desktop.runtime.bundled import ensure_bundled_model
    from iris_desktop.runtime.devices import list_devices
    from iris_desktop.runtime.gguf import read_gguf_info
    from iris_desktop.runtime.gpu import cpu_plan, layer_costs, margin, offload_from_log
    from iris_desktop.runtime.model import LocalModel

    path = ensure_bundled_model(Path(sys.argv[2]))
    devices = list_devices()
    out: dict = {"devices": [d.as_json() for d in devices]}
    checks = Path(tempfile.mkdtemp(prefix="iris-gpu-check-")) / "gpu-checks.json"
    kwargs: dict = {"gpu": "auto", "gpu_checks": checks}
    if what == "partial":
        gpu = next(d for d in devices if d.is_gpu)
        costs = layer_costs(read_gguf_info(path), 2048)
        budget = costs.gpu_bytes(PARTIAL_LAYERS) + margin(gpu)
        kwargs["devices"] = [replace(d, free_bytes=budget) if d == gpu else d for d in devices]
        out["budget_bytes"] = budget
    elif what == "off":
        kwargs = {"gpu": "off"}
    lines: list[str] = []
    real = llama_binding.load_llama

    def logged(*args, **params):  # the load log of the model itself (not of the check's runs)
        with llama_binding.captured_log() as captured:
            try:
                return real(*args, **params)
            finally:
                if params.get("n_ctx") != first_use.CHECK_CTX:
                    lines[:] = captured

    llama_binding.load_llama = logged
    model = LocalModel.load(path, n_ctx=2048, **kwargs)
    llama_binding.load_llama = real
    try:
        offload = offload_from_log(lines)
        out.update(plan=model.gpu.as_json(), offloaded=offload.layers, total=offload.total,
                   buffers=offload.buffers, device_buffers=offload.device_buffers(),
                   log=[line for line in lines if "offload" in line or "buffer size" in line
                        or "using device" in line])
        request = GenerationRequest(QUESTION, max_tokens=8, temperature=0)
        out["reply"] = "".join(model.stream(request)).strip()
    finally:
        model.close()
    if checks.exists():
        out["check_record"] = json.loads(checks.read_text())
    if what == "full" and model.gpu.on_gpu:
        cpu = first_use.greedy_steps(path, cpu_plan(model.gpu.total_layers, "reference"), 2, True)
        gpu = first_use.greedy_steps(path, model.gpu, 2, True)  # free-running: its own choices
        out["greedy_cpu"] = [s.text for s in cpu]
        out["greedy_gpu"] = [s.text for s in gpu]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
