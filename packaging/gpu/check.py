"""``make gpu-check``: llama.cpp's Vulkan backend, compiled as the installers compile it, and
Iris's GPU path (issue #46) checked on Debian with Mesa's lavapipe, a Vulkan driver that runs
on the CPU. Lavapipe proves the offload path works; it says nothing about speed.

    python3 packaging/gpu/check.py            # what `make gpu-check` runs
    python3 packaging/gpu/check.py --help

Phases (each timed; the closing line gives the figures):

 1. setup   Debian packages: mesa-vulkan-drivers (lavapipe), libvulkan-dev, glslc,
            spirv-headers, vulkan-tools
 2. wheel   llama-cpp-python, the version the project's .venv has, compiled from its sdist with
            packaging/build.py's Linux CMAKE_ARGS (the CPU variants and -DGGML_VULKAN=ON), two
            jobs, cached by the sdist's sha256 and the flags (long the first time: ggml-vulkan's
            shaders); with Vulkan headers that lack VK_EXT_layer_settings (Debian 12's
            1.3.239) its own unpacked sdist guards the one block that needs it (the
            validation layer's best-practice switch), which the release build keeps
 3. venv    a venv whose own llama_cpp is that wheel, over the project's .venv for everything
            else (a .pth adds .venv's site-packages after its own)
 4. checks  in that venv, with GGML_VK_VISIBLE_DEVICES=0: ggml leaves Vulkan devices of CPU
            type (lavapipe) out unless they are named there
            - ``iris-desktop devices`` lists lavapipe as a GPU
            - the bundled model loads with every layer offloaded (the load log says
              "offloaded 25/25 layers to GPU", with Vulkan0 buffers), answers "Paris", the
              first-use check agrees, and its first 8 greedy tokens are the CPU's
            - a partial split (a made-up memory budget for 12 layers) loads and answers
            - model.gpu off creates no Vulkan buffer at all
            - without a Vulkan driver (no ICD, and no libvulkan.so.1 at all) the self-test runs
              on the CPU, says why in one sentence, and exits 0
            - the frozen-app path's ``--self-test`` on the GPU, and tests/test_gpu.py (its
              GPU tests run here instead of skipping)

Caches: ~/.cache/iris-gpu-check (or $IRIS_GPU_CHECK_CACHE): the sdist, the wheel, the venv,
the bundled model's copy; the last run's record in last-gpu-check.json there.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))

import build as project_build  # noqa: E402  (packaging/build.py: the CMAKE_ARGS, names)

CACHE = Path(os.environ.get("IRIS_GPU_CHECK_CACHE", Path.home() / ".cache" / "iris-gpu-check"))
DEBIAN_PACKAGES = ["mesa-vulkan-drivers", "libvulkan-dev", "glslc", "spirv-headers", "vulkan-tools"]
PROJECT_VENV = ROOT / ".venv"
#: lavapipe is Vulkan device 0 on a machine without a GPU; ggml skips CPU-type devices unless named
VISIBLE = {"GGML_VK_VISIBLE_DEVICES": "0"}
JOBS = "2"


class CheckError(Exception):
    pass


def say(text: str) -> None:
    print(text, flush=True)


def run(cmd: list, *, env: dict | None = None, timeout: float = 1800, check: bool = True,
        capture: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], env={**os.environ, **(env or {})}, timeout=timeout,
                          capture_output=capture, text=True)
    if check and proc.returncode != 0:
        tail = ((proc.stdout or "") + (proc.stderr or ""))[-3000:]
        raise CheckError(f"{' '.join(map(str, cmd))[:200]} exited {proc.returncode}:\n{tail}")
    return proc


def deb_installed(package: str) -> bool:
    proc = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
    return "install ok installed" in proc.stdout


def phase_setup() -> dict:
    missing = [p for p in DEBIAN_PACKAGES if not deb_installed(p)]
    if missing:
        say(f"      apt-get install {' '.join(missing)}")
        sudo = [] if os.geteuid() == 0 else ["sudo"]
        run([*sudo, "apt-get", "update"], timeout=900)
        run([*sudo, "apt-get", "install", "-y", "--no-install-recommends", *missing], timeout=1800,
            env={"DEBIAN_FRONTEND": "noninteractive"})
    summary = run(["vulkaninfo", "--summary"], check=False, timeout=120)
    names = sorted({line.split("=", 1)[1].strip() for line in (summary.stdout or "").splitlines()
                    if line.strip().startswith("deviceName")})
    return {"installed": missing, "vulkan_devices": names}


def llama_version() -> str:
    proc = run([PROJECT_VENV / "bin" / "python", "-c",
                "import importlib.metadata as m; print(m.version('llama-cpp-python'))"])
    return proc.stdout.strip()


def cmake_args() -> str:
    return project_build.build_cmake_args("linux")


def phase_wheel(rebuild: bool) -> dict:
    version = llama_version()
    sdist_dir = CACHE / "sdist"
    sdists = sorted(sdist_dir.glob(f"llama_cpp_python-{version}.tar.gz"))
    if not sdists:
        sdist_dir.mkdir(parents=True, exist_ok=True)
        run([PROJECT_VENV / "bin" / "python", "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             "-d", sdist_dir, f"llama-cpp-python=={version}"], timeout=1800)
        sdists = sorted(sdist_dir.glob(f"llama_cpp_python-{version}.tar.gz"))
    sdist = sdists[-1]
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    args = cmake_args()
    headers = project_build.vulkan_headers([Path("/usr/include"), Path("/usr/local/include")])
    patch = headers is not None and not headers[2]
    key = hashlib.sha256(json.dumps([digest, args, patch, sys.version_info[:2]]).encode()).hexdigest()[:12]
    out = CACHE / "wheels" / key
    wheels = sorted(out.glob("llama_cpp_python-*.whl"))
    info_file = out / "build-info.json"
    if wheels and info_file.exists() and not rebuild:
        info = json.loads(info_file.read_text())
        say(f"      cached {wheels[-1].name} ({args}; compiled in {info['build_seconds']:.0f} s)")
        return {**info, "cached": True, "wheel": str(wheels[-1])}
    missing = project_build.vulkan_build_tools_missing(args, "linux", old_headers_ok=True)
    if missing:
        raise CheckError("cannot compile the Vulkan backend: needs " + "; ".join(missing))
    src = CACHE / "src" / key
    if not src.is_dir():
        shutil.rmtree(src.parent / f"{key}.partial", ignore_errors=True)
        (src.parent / f"{key}.partial").mkdir(parents=True)
        run(["tar", "-xzf", sdist, "-C", src.parent / f"{key}.partial", "--strip-components=1"], timeout=600)
        (src.parent / f"{key}.partial").rename(src)
    if patch:
        project_build.guard_layer_settings(src)
        say(f"      {headers[0]} is 1.3.{headers[1]}, without VK_EXT_layer_settings: ggml-vulkan.cpp's "
            "validation-layer settings guarded with #ifdef in the unpacked sdist")
    out.mkdir(parents=True, exist_ok=True)
    log = out / "pip-wheel.log"
    say(f"      compiling llama-cpp-python {version} with CMAKE_ARGS={args!r}, {JOBS} jobs (log: {log}; build "
        f"folder kept in {CACHE / 'build' / key}: a second try goes on where this one stopped)")
    t0 = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.run([PROJECT_VENV / "bin" / "python", "-m", "pip", "wheel", "--no-deps", "--no-cache-dir",
                               "-C", f"build-dir={CACHE / 'build' / key}", "-w", out, "-v", src],
                              stdout=fh, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "CMAKE_ARGS": args, "CMAKE_BUILD_PARALLEL_LEVEL": JOBS,
                                   "MAKEFLAGS": f"-j{JOBS}"})
    wheels = sorted(out.glob("llama_cpp_python-*.whl"))
    if proc.returncode != 0 or not wheels:
        raise CheckError(f"compiling llama-cpp-python failed (log: {log}):\n{log.read_text(errors='replace')[-3000:]}")
    info = {"version": version, "sdist_sha256": digest, "cmake_args": args, "jobs": JOBS,
            "vulkan_headers": f"1.3.{headers[1]}" if headers else None, "layer_settings_guarded": patch,
            "build_seconds": round(time.perf_counter() - t0, 1), "wheel_bytes": wheels[-1].stat().st_size}
    info_file.write_text(json.dumps(info, indent=2))
    return {**info, "cached": False, "wheel": str(wheels[-1])}


def phase_venv(wheel: dict) -> Path:
    venv = CACHE / "venv"
    py = venv / "bin" / "python"
    stamp = venv / "iris-wheel.txt"
    if not py.exists():
        run([PROJECT_VENV / "bin" / "python", "-m", "venv", "--without-pip", venv], timeout=300)
    site = Path(run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    project_site = Path(sysconfig.get_paths(vars={"base": str(PROJECT_VENV), "platbase": str(PROJECT_VENV)})["purelib"])
    # .venv's packages (and its editable iris_desktop) come after this venv's own llama_cpp
    (site / "zz-iris-project-venv.pth").write_text(f"import site; site.addsitedir({str(project_site)!r})\n")
    if not stamp.exists() or stamp.read_text() != wheel["wheel"]:
        # --target: into this venv's folder only (a plain install would see .venv's llama_cpp
        # through the .pth and replace it)
        run([PROJECT_VENV / "bin" / "python", "-m", "pip", "install", "--no-deps", "--upgrade",
             "--target", site, wheel["wheel"]], timeout=600)
        stamp.write_text(wheel["wheel"])
    where = run([py, "-c", "import llama_cpp, iris_desktop; print(llama_cpp.__file__); print(iris_desktop.__file__)"])
    llama_at, iris_at = where.stdout.split()
    if not llama_at.startswith(str(site)):
        raise CheckError(f"the venv imports llama_cpp from {llama_at}, not its own {site}")
    say(f"      {venv}: llama_cpp from {Path(llama_at).parent}, iris_desktop from {Path(iris_at).parent}")
    return venv


def probe(venv: Path, what: str, env: dict | None = None) -> dict:
    proc = run([venv / "bin" / "python", HERE / "probe.py", what, CACHE / "models"], env={**VISIBLE, **(env or {})},
               timeout=2400)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def expect(ok: bool, what: str, facts: dict | str) -> None:
    if not ok:
        raise CheckError(f"{what}: {json.dumps(facts, default=str)[:3000] if not isinstance(facts, str) else facts}")


def iris(venv: Path) -> list:
    """The app in the Vulkan venv (iris_desktop comes from the project's checkout)."""
    return [venv / "bin" / "python", "-m", "iris_desktop", "--data-dir", CACHE / "home"]


def check_devices(venv: Path) -> dict:
    proc = run([*iris(venv), "devices", "--json"], env=VISIBLE)
    listed = json.loads(proc.stdout)
    gpus = [d for d in listed["devices"] if d["kind"] in ("gpu", "igpu")]
    expect(any(d["backend"] == "Vulkan" for d in gpus), "no Vulkan device listed", listed)
    say(f"      devices: {', '.join(d['name'] + ' ' + d['description'] for d in listed['devices'])}; "
        f"plan: {listed['plan']['describe']}")
    return {"devices": listed["devices"], "plan": listed["plan"]}


def check_full(venv: Path) -> dict:
    got = probe(venv, "full")
    plan = got["plan"]
    expect(plan["describe"].startswith("GPU: ") and plan["layers"] == plan["total_layers"], "not fully offloaded", got)
    expect(got["offloaded"] == got["total"] == plan["total_layers"], "the load log does not say every layer", got)
    expect(any(name.startswith("Vulkan") for name in got["device_buffers"]), "no Vulkan buffer in the load log", got)
    expect("paris" in got["reply"].lower(), "the reply lacks Paris", got)
    record = got.get("check_record", {}).get("checks", {})
    expect(record and all(entry["agrees"] for entry in record.values()), "the first-use check did not agree", got)
    expect(got["greedy_gpu"] == got["greedy_cpu"], "the GPU's first greedy tokens differ from the CPU's", got)
    say(f"      full: {plan['describe']}; log: offloaded {got['offloaded']}/{got['total']}, "
        f"{', '.join(f'{k} {v:.0f} MiB' for k, v in got['device_buffers'].items())}; reply {got['reply']!r}; "
        f"greedy {''.join(got['greedy_gpu'])!r} on both; first-use check: "
        f"{next(iter(record.values()))['detail']}")
    return got


def check_partial(venv: Path) -> dict:
    got = probe(venv, "partial")
    plan = got["plan"]
    expect(plan["layers"] == 12 and got["offloaded"] == 12, "the budget did not give 12 layers", got)
    expect("paris" in got["reply"].lower(), "the partial split's reply lacks Paris", got)
    say(f"      partial: {plan['describe']} (budget {got['budget_bytes'] / 2**20:.0f} MiB); log: offloaded "
        f"{got['offloaded']}/{got['total']}; reply {got['reply']!r}")
    return got


def check_off(venv: Path) -> dict:
    got = probe(venv, "off")
    vulkan = {k: v for k, v in got["buffers"].items() if "Vulkan" in k}
    expect(got["plan"]["describe"] == "CPU" and not vulkan and not got["device_buffers"],
           "model.gpu off made GPU buffers", got)
    expect("paris" in got["reply"].lower(), "off: the reply lacks Paris", got)
    say(f"      off: buffers {', '.join(sorted(got['buffers']))} (no Vulkan); reply {got['reply']!r}")
    return got


def self_test(venv: Path, env: dict, prefix: list | None = None) -> tuple[int, str]:
    """The app's --self-test, its exit status and its one line (or the end of what it said)."""
    proc = subprocess.run([str(c) for c in [*(prefix or []), *iris(venv), "--self-test"]], env=env,
                          capture_output=True, text=True, timeout=2400)
    out = (proc.stdout + proc.stderr).strip()
    return proc.returncode, next((x for x in out.splitlines() if "self-test" in x), out[-1500:])


def check_self_tests(venv: Path) -> dict:
    code, line = self_test(venv, {**os.environ, **VISIBLE})
    expect(code == 0 and "self-test ok" in line and " on GPU: " in line, "the self-test on the GPU", line)
    say(f"      self-test on the GPU: {line}")
    result = {"gpu": line}
    # no Vulkan driver: the loader finds no ICD (GGML_VK_VISIBLE_DEVICES unset: it would name a device)
    plain = {k: v for k, v in os.environ.items() if k != "GGML_VK_VISIBLE_DEVICES"}
    code, line = self_test(venv, {**plain, "VK_DRIVER_FILES": "/nonexistent.json",
                                  "VK_ICD_FILENAMES": "/nonexistent.json"})
    expect(code == 0 and "self-test ok" in line and " on CPU (" in line, "without a Vulkan driver", line)
    say(f"      no Vulkan driver (no ICD): exit 0, {line[line.index(' on CPU ('):][:160]}")
    result["no_icd"] = line
    # no Vulkan loader at all: libvulkan.so.1 hidden in a mount namespace (ggml's Vulkan module
    # cannot load); needs root and unshare
    found = run(["sh", "-c", "ldconfig -p | awk '/libvulkan.so.1 /{print $NF; exit}'"]).stdout.strip()
    loader = Path(found or "/usr/lib/x86_64-linux-gnu/libvulkan.so.1").resolve()
    hide = ["unshare", "-m", "sh", "-c", f'mount --bind /dev/null "{loader}" && exec "$0" "$@"']
    if os.geteuid() != 0 or not shutil.which("unshare") or not loader.exists():
        say("      no Vulkan loader: not run (needs root, unshare and a libvulkan.so.1 to hide)")
        result["no_loader"] = None
        return result
    code, line = self_test(venv, plain, prefix=hide)
    expect(code == 0 and "self-test ok" in line and " on CPU (" in line, f"without {loader}", line)
    say(f"      no Vulkan loader ({loader} hidden): exit 0, {line[line.index(' on CPU ('):][:160]}")
    result["no_loader"] = line
    return result


def check_tests(venv: Path) -> dict:
    proc = run([venv / "bin" / "python", "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/test_gpu.py"],
               env={**VISIBLE, "QT_QPA_PLATFORM": "offscreen"}, check=False, timeout=3600)
    out = (proc.stdout or "") + (proc.stderr or "")
    summary = out.strip().splitlines()[-1] if out.strip() else ""
    expect(proc.returncode == 0 and "skipped" not in summary, "tests/test_gpu.py in the Vulkan venv", out[-3000:])
    say(f"      tests/test_gpu.py: {summary}")
    return {"summary": summary}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="packaging/gpu/check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rebuild", action="store_true", help="compile the Vulkan wheel again")
    parser.add_argument("--only-build", action="store_true", help="phases 1-3 only")
    opts = parser.parse_args(argv)
    os.chdir(ROOT)
    CACHE.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    facts: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    started = time.perf_counter()
    phases = [("setup", lambda: phase_setup()), ("wheel", lambda: phase_wheel(opts.rebuild))]
    ok = False
    try:
        for name, fn in phases:
            say(f"==> {name}")
            t0 = time.perf_counter()
            facts[name] = fn()
            times[name] = time.perf_counter() - t0
        say("==> venv")
        t0 = time.perf_counter()
        venv = phase_venv(facts["wheel"])
        times["venv"] = time.perf_counter() - t0
        if not opts.only_build:
            for name, fn in (("devices", check_devices), ("full", check_full), ("partial", check_partial),
                             ("off", check_off), ("self-test", check_self_tests), ("tests", check_tests)):
                say(f"==> {name}")
                t0 = time.perf_counter()
                facts[name] = fn(venv)
                times[name] = time.perf_counter() - t0
        ok = True
    except (CheckError, subprocess.TimeoutExpired) as exc:
        facts["failed"] = str(exc)
        say(f"\ngpu-check FAILED: {exc}")
    finally:
        facts["seconds"] = {k: round(v, 1) for k, v in times.items()}
        (CACHE / "last-gpu-check.json").write_text(json.dumps(facts, indent=2, default=str))
    phases_text = ", ".join(f"{k} {v:.0f} s" for k, v in times.items())
    if ok:
        say(f"\ngpu-check ok in {time.perf_counter() - started:.0f} s on {', '.join(facts['setup']['vulkan_devices'])} "
            f"(lavapipe: the offload path, not speed); phases: {phases_text}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
