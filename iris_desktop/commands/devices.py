"""``devices``: what llama.cpp can run the model on, and ``model.gpu``'s plan."""

from __future__ import annotations

import sys

from iris_desktop.commands.common import (
    EXIT_FAIL,
    EXIT_OK,
    CliError,
    dump_json,
    say,
)
from iris_desktop.units import memory_size

# -- devices --------------------------------------------------------------------------------


def devices(args, overrides) -> int:
    """What llama.cpp can run the model on (each device with its free and total memory and
    its first-use check), and the plan ``model.gpu`` makes for the configured model at
    ``model.n_ctx``: the GGUF header only, nothing is loaded."""
    from iris_desktop.host import GPU_CHECKS_FILE, ModelError, model_path_for
    from iris_desktop.paths import app_paths
    from iris_desktop.runtime.backends import BackendError
    from iris_desktop.runtime.devices import list_devices
    from iris_desktop.runtime.gguf import GGUFError, read_gguf_info
    from iris_desktop.runtime.gpu import GpuChecks, memory_text, plan_model
    from iris_desktop.settings import load_settings

    paths = app_paths(args.data_dir).ensure()
    settings = load_settings(paths.config_path, cli=overrides)
    for problem in settings.problems:
        say(f"iris-desktop: warning: {problem}", file=sys.stderr)
    try:
        found = list_devices()
    except BackendError as exc:
        raise CliError(str(exc), EXIT_FAIL) from None
    checks = GpuChecks(paths.data_dir / GPU_CHECKS_FILE)
    plan, model, n_ctx, problem = None, None, settings["model.n_ctx"], None
    if settings["model.backend"] != "local":
        problem = "model.backend is openai: the server runs the model"
    else:
        try:
            model = model_path_for(settings, paths.models_dir)
            info = read_gguf_info(model)
            plan, n_ctx = plan_model(info, n_ctx, found, settings["model.gpu"],
                                     disabled=checks.disabled(found), flash_attn=settings["model.flash_attn"],
                                     gpu_checks=checks.path)
        except (GGUFError, ModelError) as exc:
            problem = f"no plan: {exc}"
    rows = [{**d.as_json(), "check": checks.recorded(d) if d.is_gpu else None} for d in found]
    if args.json:
        print(dump_json({"devices": rows, "model": str(model) if model else None, "n_ctx": n_ctx,
                         "model.gpu": settings["model.gpu"], "plan": plan.as_json() if plan else None,
                         "problem": problem}, indent=2))
        return EXIT_OK
    print("Devices llama.cpp can use:")
    for device, row in zip(found, rows, strict=True):
        memory = memory_text(device)
        driver = f", driver {row['driver']}" if row["driver"] else ""
        check = row["check"]
        if row["kind"] not in ("gpu", "igpu"):
            checked = ""
        elif check is None:
            checked = " — not checked against the CPU yet (the first load on it does)"
        else:
            detail = check.get("detail")
            if not isinstance(detail, str) or not detail:  # a record written by hand, or damaged
                detail = "it agreed with the CPU" if check["agrees"] else "it did not agree with the CPU"
            checked = (f" — {detail} (off for the run of Iris that saw it; the first load of a later run "
                       "checks it against the CPU again)" if "run" in check else
                       f" — first-use check: {detail}" + (
                           "" if check["agrees"] else " (off for Iris until its driver changes)"))
        kind = row["kind"] if row["kind"] == "cpu" else f"{row['kind']}, {row['backend']}{driver}"
        say(f"  {row['name']:<8} {row['description']} ({kind}): {memory}{checked}")
    if plan is None:
        say(f"model.gpu {settings['model.gpu']}: {problem}")
        return EXIT_OK
    say(f"model.gpu {settings['model.gpu']}, {model.name} at n_ctx {n_ctx:,}:\n"
        f"  {plan.describe()}: {plan.reason}")
    if plan.all_bytes:
        say(f"  all {plan.total_layers} layers on a GPU would need about {memory_size(plan.all_bytes, 2)} "
            "(weights, the context's KV cache, the compute buffer)")
    return EXIT_OK
