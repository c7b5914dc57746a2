"""``devices``: what llama.cpp can run the model on, and ``model.gpu``'s plan;
``devices --check-again``: forget a GPU's first-use check, so the next load checks it again."""

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
    ``model.n_ctx``: the GGUF header only, nothing is loaded. ``--check-again``:
    :func:`check_again`."""
    from iris_desktop.host import GPU_CHECKS_FILE, ModelError, model_path_for
    from iris_desktop.paths import app_paths
    from iris_desktop.runtime.backends import BackendError
    from iris_desktop.runtime.devices import list_devices
    from iris_desktop.runtime.gguf import GGUFError, read_gguf_info
    from iris_desktop.runtime.gpu import GpuChecks, check_again_command, memory_text, plan_model
    from iris_desktop.settings import load_settings

    paths = app_paths(args.data_dir).ensure()
    checks = GpuChecks(paths.data_dir / GPU_CHECKS_FILE)
    if getattr(args, "check_again", None) is not None:
        return check_again(checks, args.check_again, args.json)
    settings = load_settings(paths.config_path, cli=overrides)
    for problem in settings.problems:
        say(f"iris-desktop: warning: {problem}", file=sys.stderr)
    try:
        found = list_devices()
    except BackendError as exc:
        raise CliError(str(exc), EXIT_FAIL) from None
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
    for device in found:  # off for Iris (not one the next run checks again anyway): the way back
        check = checks.result(device) if device.is_gpu else None
        if check is not None and not check["agrees"]:
            say(f"  '{check_again_command(device)}' has {device.label} checked against the CPU again at the "
                "next load")
    if plan is None:
        say(f"model.gpu {settings['model.gpu']}: {problem}")
        return EXIT_OK
    say(f"model.gpu {settings['model.gpu']}, {model.name} at n_ctx {n_ctx:,}:\n"
        f"  {plan.describe()}: {plan.reason}")
    if plan.all_bytes:
        say(f"  all {plan.total_layers} layers on a GPU would need about {memory_size(plan.all_bytes, 2)} "
            "(weights, the context's KV cache, the compute buffer)")
    return EXIT_OK


# -- devices --check-again ------------------------------------------------------------------


def check_again(checks, name: str | bool, as_json: bool) -> int:
    """Forget what the first-use check recorded of the GPU ``name`` (ggml's name or its
    description, as ``devices`` lists them, or a device only the record still names), or of
    every GPU (``name`` True), so that the next load on it checks it against the CPU again
    (:meth:`.gpu.GpuChecks.forget`), and say what was forgotten and what happens next. A
    name that is no GPU is refused, naming those there are; a missing record has nothing to
    forget; one that cannot be read is said in one sentence, and left as it is."""
    path = checks.path
    try:
        entries, unreadable = checks.entries(), None
    except (OSError, ValueError, RecursionError) as exc:
        entries, unreadable = {}, _why(exc)
    label = None if name is True else _label_for(str(name), entries)
    if unreadable is not None:
        return _report(as_json, path, label, {}, unreadable, (
            f"{path} cannot be read ({unreadable}), so Iris checks every GPU against the CPU again at its next "
            "load anyway; the file is left as it is, and that load writes it anew"))
    try:
        gone = checks.forget(label)
    except (OSError, ValueError, RecursionError) as exc:
        raise CliError(f"cannot forget the first-use check: {path} cannot be written ({_why(exc)}); nothing "
                       "was changed", EXIT_FAIL) from None
    whose = label or "a GPU"
    if not gone:
        return _report(as_json, path, label, {}, None, (
            f"No first-use check of {whose} is recorded: the first load of a model on it checks it against the CPU"))
    lines = [f"Forgot the first-use check of {_entry_words(key, entry)}" for key, entry in gone.items()]
    lines.append(f"The next load of a model on {whose} (the next start of Iris, or Model ▸ Reload in a running "
                 "window) checks it against the CPU again, and uses it if it agrees")
    return _report(as_json, path, label, gone, None, "\n".join(lines))


def _label_for(name: str, entries: dict) -> str:
    """The record's label of the GPU ``name`` (a listed GPU's ggml name or description, or
    a device a record names; case does not matter); a CliError naming those there are."""
    from iris_desktop.runtime.backends import BackendError
    from iris_desktop.runtime.devices import list_devices

    try:
        found = list_devices()
    except BackendError:  # llama.cpp lists nothing: the record's names only
        found = []
    wanted = name.strip().casefold()
    for device in found:
        if wanted in (device.name.casefold(), device.label.casefold()):
            if not device.is_gpu:
                raise CliError(f"{device.name} is not a GPU: the first-use check compares a GPU's answers with "
                               "the CPU's and keeps no record of the CPU; name a GPU, or leave DEVICE out to "
                               "check every GPU again")
            return device.label
    recorded = sorted({key.rpartition("|")[0] for key in entries if "|" in key})
    for label in recorded:
        if wanted == label.casefold():
            return label
    gpus = [f"{d.name} ({d.label})" for d in found if d.is_gpu]
    gone = [label for label in recorded if label not in {d.label for d in found}]
    if not gpus and not gone:
        raise CliError(f"no GPU is named {name!r}: llama.cpp lists no GPU on this computer and no GPU check is "
                       "recorded, so there is nothing to check again")
    there = "; ".join(part for part in (
        f"llama.cpp lists {_words(gpus)}" if gpus else "llama.cpp lists no GPU here",
        f"the record also names {_words(gone)}" if gone else "") if part)
    raise CliError(f"no GPU is named {name!r}: {there}; name one of them as 'iris-desktop devices' lists it, "
                   "or leave DEVICE out to check every GPU again")


def _words(items: list[str]) -> str:
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def _why(exc: BaseException) -> str:
    """Why the record could not be read or written, in a few words."""
    import json

    if isinstance(exc, RecursionError):
        return "it is nested too deep"
    if isinstance(exc, UnicodeDecodeError):
        return "it is not UTF-8 text"
    if isinstance(exc, json.JSONDecodeError):
        return f"it is not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
    from iris_desktop.files import NotAFileError, TooLargeError
    from iris_desktop.runtime.gpu_records import RECORD_LIMIT
    from iris_desktop.units import memory_size

    if isinstance(exc, NotAFileError):
        return f"it is {exc.kind}, not a file"
    if isinstance(exc, TooLargeError):
        return f"it is larger than {memory_size(RECORD_LIMIT)}, more than a GPU record ever is"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def _entry_words(key: str, entry) -> str:
    """One forgotten record, as "Fake Arc (driver Mesa 23.2): <what it found> (<what that did>)"."""
    label, _, driver = key.rpartition("|") if "|" in key else (key, "", "driver unknown")
    device = f"{label} ({driver if driver == 'driver unknown' else f'driver {driver}'})"
    if not isinstance(entry, dict) or not isinstance(entry.get("agrees"), bool):
        return f"{device}: a damaged record"
    detail = entry.get("detail") if isinstance(entry.get("detail"), str) and entry.get("detail") else (
        "it agreed with the CPU" if entry["agrees"] else "it did not agree with the CPU")
    state = ("it was used" if entry["agrees"] else "it was off for the run of Iris that saw it" if "run" in entry
             else "it was off for Iris until its driver changed")
    runs = entry.get("failed_runs")
    count = (f"; its count of runs of Iris in a row that failed in use ({runs}) starts again"
             if isinstance(runs, int) and not isinstance(runs, bool) and runs > 0 else "")
    return f"{device}: {detail} ({state}){count}"


def _report(as_json: bool, path, label: str | None, gone: dict, problem: str | None, said: str) -> int:
    if as_json:
        print(dump_json({"device": label, "record": str(path), "problem": problem,
                         "forgot": [{"key": key, "record": entry} for key, entry in gone.items()],
                         "said": said}, indent=2))
    else:
        say(said)
    return EXIT_OK
