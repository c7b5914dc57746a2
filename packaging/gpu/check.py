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
            - the app's ``--self-test`` on the GPU, and tests/test_gpu.py (its
              GPU tests run here instead of skipping)
 5. frozen-build  the frozen Linux app and its .deb: packaging/build.py (what `make dist` runs)
            on a copy of this checkout in the cache (frozen/src: its build/ and dist/ stay
            there, never this checkout's), handed the wheel of phase 2 (``--llama-wheel``),
            with numpy's PyPI wheel (``--stock-numpy``, as windows-check: nothing compiled
            here), no .tar.gz and a gzip .deb; build.py's own checks and smoke tests run (the
            Vulkan module there and no loader, the --self-test on the CPU: ggml leaves
            lavapipe out, the GUI starts). Reused while the files it is made from, the wheel
            and the options are the same (--rebuild-frozen builds anew)
 6. frozen  the bundle has llama_cpp/lib/libggml-vulkan.so, which NEEDs libvulkan.so.1 and finds
            the system's (ldd); no libvulkan.so* in the bundle nor in the .deb (dpkg-deb -c),
            whose control says Recommends: libvulkan1 and never Depends on it (dpkg-deb -f);
            the frozen app's ``-v --self-test``, offline (unshare -n) with its own HOME, XDG
            folders and IRIS_HOME: on lavapipe every layer offloaded (the self-test's line
            and the load log's "offloaded 25/25 layers to llvmpipe ..., as planned (Vulkan0
            ...)") and "Paris"; without a Vulkan driver and without a Vulkan loader, the CPU
            with one sentence, "Paris", exit 0
 7. windows ``make windows-check`` (packaging/windows/check.py, run by this interpreter from the
            repo root; its output shown as it comes and kept in windows-check.log): the Windows
            installer with ggml-vulkan.dll, cross-compiled with mingw-w64, the DLL's imports read
            with ``objdump -p`` (vulkan-1.dll, never shipped, besides system and bundled DLLs),
            installed under Wine, where the app's offline self-test runs on the CPU (no Vulkan
            driver for the app: it falls back) and passes, and again on lavapipe through Wine's
            vulkan-1.dll where Wine lists it. It must close with "windows-check ok in N s: ..."
            naming ggml-vulkan.dll importing vulkan-1.dll; that line's figures go into the record
            and the closing line, and its FAILED line is this check's reason when it fails

--only-build: phases 1-3; --no-frozen: without 5-6; --no-windows: without 7; --only-windows:
7 alone (nothing else set up or built: a check of the Windows part by itself).

Caches: ~/.cache/iris-gpu-check (or $IRIS_GPU_CHECK_CACHE): the sdist, the wheel, the venv,
the bundled model's copy, the frozen app's checkout copy (frozen/src, with build.py's build/
and dist/; frozen/build.log), windows-check's output (windows-check.log; its own caches are in
~/.cache/iris-windows-check); the last run's record in last-gpu-check.json there.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))

import build as project_build  # noqa: E402  (packaging/build.py: the CMAKE_ARGS, names)
from windows import check as windows_check  # noqa: E402  (its copy of the checkout for build.py)

CACHE = Path(os.environ.get("IRIS_GPU_CHECK_CACHE", Path.home() / ".cache" / "iris-gpu-check"))
DEBIAN_PACKAGES = ["mesa-vulkan-drivers", "libvulkan-dev", "glslc", "spirv-headers", "vulkan-tools"]
PROJECT_VENV = ROOT / ".venv"
#: lavapipe is Vulkan device 0 on a machine without a GPU; ggml skips CPU-type devices unless named
VISIBLE = {"GGML_VK_VISIBLE_DEVICES": "0"}
JOBS = "2"
#: the frozen app: packaging/build.py run on a copy of this checkout (its build/ and dist/ kept
#: there between runs, never this checkout's), with the Vulkan wheel
FROZEN = CACHE / "frozen"
#: build.py's options for it: the wheel above (--llama-wheel), numpy's PyPI wheel as
#: windows-check does (nothing compiled here), the .deb quickly compressed and no .tar.gz (the
#: folder it would hold is checked as it is)
FROZEN_BUILD_ARGS = ["--stock-numpy", "--no-tar", "--deb-compression", "gzip"]
#: what a Linux build.py never reads (this check, the Windows and macOS installers' files)
NOT_FROZEN_INPUTS = ("packaging/gpu/", "packaging/windows/", "packaging/macos/")


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


#: the self-test's line (iris_desktop/selftest.py): where the model ran and what it replied
SELF_TEST_GPU = re.compile(r" on GPU: (?P<device>.+?) · (?P<layers>\d+)/(?P<total>\d+) layers \(")
SELF_TEST_CPU = re.compile(r" on CPU \((?P<reason>.*?)\); asked ")
SELF_TEST_REPLY = re.compile(r"replied '(?P<reply>[^']*)'")
#: what the app logs with -v once the load log agrees with the plan (runtime/loading.py: as_loaded)
AS_PLANNED = re.compile(r"offloaded (?P<layers>\d+)/(?P<total>\d+) layers to (?P<device>.+), as planned "
                        r"\((?P<buffers>[^)]*)\)")


def read_self_test(output: str) -> dict:
    """The facts of a ``--self-test`` run's output: its line, ok, the GPU and its layers or the
    CPU and why, the reply, and (with -v) the load log's "offloaded N/M layers ..., as planned"."""
    lines = output.strip().splitlines()
    line = next((x for x in lines if "self-test" in x and ("self-test ok" in x or "FAILED" in x)),
                output.strip()[-1500:])
    gpu, cpu, reply = SELF_TEST_GPU.search(line), SELF_TEST_CPU.search(line), SELF_TEST_REPLY.search(line)
    planned = next((m for m in map(AS_PLANNED.search, lines) if m), None)
    return {"line": line, "ok": "self-test ok" in line, "device": gpu["device"] if gpu else None,
            "layers": int(gpu["layers"]) if gpu else None, "total_layers": int(gpu["total"]) if gpu else None,
            "cpu_reason": cpu["reason"] if cpu else None, "reply": reply["reply"] if reply else None,
            "load_log": planned[0] if planned else None}


def on_whole_gpu(facts: dict) -> bool:
    """The self-test ran every layer on a GPU and answered."""
    return bool(facts["ok"] and facts["device"] and facts["layers"] == facts["total_layers"]
                and "paris" in (facts["reply"] or "").lower())


def on_cpu_in_one_sentence(facts: dict) -> bool:
    """The self-test ran on the CPU, said why in one sentence, and answered."""
    reason = (facts["cpu_reason"] or "").strip()
    return bool(facts["ok"] and not facts["device"] and reason and reason.count(". ") == 0
                and "paris" in (facts["reply"] or "").lower())


def self_test(cmd: list, env: dict, prefix: list | None = None) -> tuple[int, dict]:
    """``cmd --self-test``: its exit status and :func:`read_self_test`'s facts."""
    proc = subprocess.run([str(c) for c in [*(prefix or []), *cmd, "--self-test"]], env=env,
                          capture_output=True, text=True, timeout=2400)
    return proc.returncode, read_self_test(proc.stdout + proc.stderr)


def vulkan_loader() -> Path:
    found = run(["sh", "-c", "ldconfig -p | awk '/libvulkan.so.1 /{print $NF; exit}'"]).stdout.strip()
    return Path(found or "/usr/lib/x86_64-linux-gnu/libvulkan.so.1").resolve()


def three_self_tests(cmd: list, env: dict, prefix: list | None = None, verbose_log: bool = False) -> dict:
    """``cmd --self-test`` on lavapipe (every layer), with no Vulkan driver and with no Vulkan
    loader at all (the CPU, one sentence, exit 0). ``env``: the environment, without
    GGML_VK_VISIBLE_DEVICES; ``prefix``: what runs it (offline); ``verbose_log``: ``cmd`` has
    -v, and the load log must say every layer was offloaded as planned."""
    prefix = list(prefix or [])
    code, facts = self_test(cmd, {**env, **VISIBLE}, prefix)
    expect(code == 0 and on_whole_gpu(facts), "the self-test on the GPU", facts)
    if verbose_log:
        logged = AS_PLANNED.search(facts["load_log"] or "")
        expect(logged is not None and logged["layers"] == logged["total"] == str(facts["total_layers"])
               and "Vulkan" in logged["buffers"], "the load log does not say every layer went to Vulkan", facts)
        say(f"      load log: {facts['load_log']}")
    say(f"      self-test on the GPU: {facts['line']}")
    result = {"gpu": facts["line"], "gpu_load_log": facts["load_log"]}
    # no Vulkan driver: the loader finds no ICD (GGML_VK_VISIBLE_DEVICES unset: it would name a device)
    code, facts = self_test(cmd, {**env, "VK_DRIVER_FILES": "/nonexistent.json",
                                  "VK_ICD_FILENAMES": "/nonexistent.json"}, prefix)
    expect(code == 0 and on_cpu_in_one_sentence(facts), "without a Vulkan driver", facts)
    say(f"      no Vulkan driver (no ICD): exit 0, on CPU ({facts['cpu_reason']}), replied {facts['reply']!r}")
    result["no_icd"] = facts["line"]
    # no Vulkan loader at all: libvulkan.so.1 hidden in a mount namespace (ggml's Vulkan module
    # cannot load); needs root and unshare
    loader = vulkan_loader()
    hide = ["unshare", "-m", "sh", "-c", f'mount --bind /dev/null "{loader}" && exec "$0" "$@"']
    if os.geteuid() != 0 or not shutil.which("unshare") or not loader.exists():
        say("      no Vulkan loader: not run (needs root, unshare and a libvulkan.so.1 to hide)")
        result["no_loader"] = None
        return result
    code, facts = self_test(cmd, env, [*hide, *prefix])
    expect(code == 0 and on_cpu_in_one_sentence(facts), f"without {loader}", facts)
    say(f"      no Vulkan loader ({loader} hidden): exit 0, on CPU ({facts['cpu_reason']}), "
        f"replied {facts['reply']!r}")
    result["no_loader"] = facts["line"]
    return result


def check_self_tests(venv: Path) -> dict:
    plain = {k: v for k, v in os.environ.items() if k != "GGML_VK_VISIBLE_DEVICES"}
    return three_self_tests(iris(venv), plain)


def check_tests(venv: Path) -> dict:
    proc = run([venv / "bin" / "python", "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/test_gpu.py"],
               env={**VISIBLE, "QT_QPA_PLATFORM": "offscreen"}, check=False, timeout=3600)
    out = (proc.stdout or "") + (proc.stderr or "")
    summary = out.strip().splitlines()[-1] if out.strip() else ""
    expect(proc.returncode == 0 and "skipped" not in summary, "tests/test_gpu.py in the Vulkan venv", out[-3000:])
    say(f"      tests/test_gpu.py: {summary}")
    return {"summary": summary}


# -- the frozen Linux app ------------------------------------------------------------------------


def frozen_paths(src: Path) -> dict:
    version = project_build.project_metadata()["version"]
    dist = src / "dist"
    return {"app": dist / project_build.APP_NAME, "exe": dist / project_build.APP_NAME / project_build.APP_NAME,
            "deb": dist / f"{project_build.APP_NAME}_{version}_{project_build.deb_arch()}.deb",
            "record_file": src / "build" / "last-build.json", "stamp": dist / "iris-gpu-check-build.json"}


def phase_frozen_build(wheel: dict, rebuild: bool) -> dict:
    """packaging/build.py, as `make dist` runs it, on a copy of this checkout in FROZEN/src with
    the Vulkan wheel: the one-folder app and the .deb (with build.py's own checks and smoke
    tests: the Vulkan module there, no loader, the --self-test on the CPU, the GUI). Reused
    while what they are made from (windows_check.BUILD_INPUTS), the wheel and the options are
    the same."""
    src = FROZEN / "src"
    copied = windows_check.sync_checkout(src)
    say(f"      checkout copied to {src} ({copied} files changed)")
    args = ["--llama-wheel", wheel["wheel"], f"--cmake-args={wheel['cmake_args']}", *FROZEN_BUILD_ARGS]
    paths = frozen_paths(src)
    inputs = [f for f in windows_check.checkout_files()
              if f.startswith(windows_check.BUILD_INPUTS) and not f.startswith(NOT_FROZEN_INPUTS)]
    key = windows_check.key_of(windows_check.tree_digest(src, inputs), wheel["sdist_sha256"], wheel["wheel"],
                               Path(wheel["wheel"]).stat().st_size, args)
    built = paths["stamp"].exists() and json.loads(paths["stamp"].read_text()).get("key") == key
    if built and not rebuild and paths["exe"].is_file() and paths["deb"].is_file() and paths["record_file"].exists():
        record = json.loads(paths["record_file"].read_text())
        say(f"      cached: {paths['app']} and {paths['deb'].name} (checkout and wheel unchanged; "
            "--rebuild-frozen builds anew)")
        return {"args": args, "cached": True, "record": record, **{k: str(v) for k, v in paths.items()}}
    paths["stamp"].unlink(missing_ok=True)
    log = FROZEN / "build.log"
    say(f"      {PROJECT_VENV / 'bin' / 'python'} packaging/build.py {' '.join(map(str, args))} (in {src}; log: {log})")
    t0 = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.Popen([str(PROJECT_VENV / "bin" / "python"), "-u", str(src / "packaging" / "build.py"),
                                 *map(str, args)], cwd=src, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env={**os.environ, "CMAKE_BUILD_PARALLEL_LEVEL": JOBS})
        for line in proc.stdout:
            fh.write(line)
            if line.startswith("==> "):
                say("      " + line[4:].rstrip())
        code = proc.wait()
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise CheckError(f"packaging/build.py failed (exit {code}; log: {log}):\n{tail}")
    for what in ("exe", "deb", "record_file"):
        expect(paths[what].is_file(), f"build.py finished without its {what}", str(paths[what]))
    record = json.loads(paths["record_file"].read_text())
    paths["stamp"].write_text(json.dumps({"key": key}))
    say(f"      built in {time.perf_counter() - t0:.0f} s")
    return {"args": args, "cached": False, "record": record, **{k: str(v) for k, v in paths.items()}}


def bundle_vulkan(app: Path) -> dict:
    """The one-folder app's Vulkan parts: ggml's module in llama_cpp/lib (its size) and every
    Vulkan loader (``libvulkan.so*``) anywhere in it, which must be none."""
    module = app / "_internal" / "llama_cpp" / "lib" / project_build.VULKAN_MODULES["linux"]
    loaders = sorted(p.relative_to(app).as_posix() for p in app.rglob("*")
                     if p.name.startswith("libvulkan.so"))
    return {"module": module.relative_to(app).as_posix() if module.is_file() else None,
            "module_bytes": module.stat().st_size if module.is_file() else None, "loaders": loaders}


def deb_vulkan(listing: str, fields: str) -> dict:
    """The .deb's Vulkan parts from ``dpkg-deb -c`` (``listing``) and ``dpkg-deb -f`` (``fields``):
    the module's path, every ``libvulkan.so*`` it would install, its Depends and Recommends."""
    paths = [line.split()[5] for line in listing.splitlines() if len(line.split()) >= 6]
    control: dict[str, str] = {}
    for line in fields.splitlines():
        if ":" in line and not line.startswith(" "):
            name, value = line.split(":", 1)
            control[name.strip()] = value.strip()
    module = project_build.VULKAN_MODULES["linux"]
    return {"module": next((p for p in paths if p.endswith(f"/llama_cpp/lib/{module}")), None),
            "loaders": [p for p in paths if p.rsplit("/", 1)[-1].startswith("libvulkan.so")],
            "depends": control.get("Depends", ""), "recommends": control.get("Recommends", ""),
            "files": len(paths)}


def packages(field: str) -> set[str]:
    """The package names of a Depends/Recommends field (alternatives and versions included)."""
    return {part.strip().split()[0] for alt in field.split(",") for part in alt.split("|") if part.strip()}


def ldd_resolved(output: str) -> dict[str, str | None]:
    """``ldd``'s lines: soname -> the file it resolves to (None: not found)."""
    found: dict[str, str | None] = {}
    for line in output.splitlines():
        match = re.match(r"\s*(\S+) => (?:(not found)|(\S+))", line)
        if match:
            found[match[1]] = None if match[2] else match[3]
    return found


def check_frozen(build: dict) -> dict:
    app, deb, exe = Path(build["app"]), Path(build["deb"]), Path(build["exe"])
    record = build["record"]
    # the bundle: ggml's Vulkan module, no Vulkan loader
    bundle = bundle_vulkan(app)
    expect(bundle["module"] == "_internal/llama_cpp/lib/libggml-vulkan.so", "the bundle lacks libggml-vulkan.so",
           bundle)
    expect(not bundle["loaders"], "the bundle carries a Vulkan loader", bundle)
    # the module needs the system's libvulkan.so.1, and finds it outside the bundle
    module = app / bundle["module"]
    needed = project_build.elf_needed(module) or []
    expect("libvulkan.so.1" in needed, "libggml-vulkan.so does not need libvulkan.so.1", needed)
    resolved = ldd_resolved(run(["ldd", module]).stdout)
    loader = resolved.get("libvulkan.so.1")
    expect(loader is not None and not Path(loader).resolve().is_relative_to(app.resolve()),
           "libvulkan.so.1 does not resolve to the system's", resolved)
    say(f"      bundle: {bundle['module']} ({bundle['module_bytes'] / 1e6:.1f} MB), NEEDED "
        f"{', '.join(n for n in needed if 'vulkan' in n or 'ggml' in n)} (ldd: libvulkan.so.1 => {loader}); "
        "no libvulkan.so* in the bundle")
    # the .deb: the same, and Recommends: libvulkan1 (never Depends)
    listing = run(["dpkg-deb", "-c", deb]).stdout
    fields = run(["dpkg-deb", "-f", deb, "Package", "Version", "Depends", "Recommends"]).stdout
    in_deb = deb_vulkan(listing, fields)
    expect(in_deb["module"] is not None and not in_deb["loaders"], "the .deb's Vulkan parts", in_deb)
    expect("libvulkan1" in packages(in_deb["recommends"]) and "libvulkan1" not in packages(in_deb["depends"]),
           "the .deb does not recommend libvulkan1 (or depends on it)", in_deb)
    say(f"      .deb {deb.name} ({deb.stat().st_size / 1e6:.1f} MB, {in_deb['files']} entries): "
        f"{in_deb['module']}, no libvulkan.so*; Recommends: {in_deb['recommends']}")
    # the frozen app's --self-test: offline, its own HOME, on lavapipe, then without a driver or loader
    offline = project_build.offline_prefix()
    with tempfile.TemporaryDirectory(prefix="iris-gpu-check-frozen-") as tmp:
        home = Path(tmp)
        env = {k: v for k, v in os.environ.items() if k != "GGML_VK_VISIBLE_DEVICES"}
        env.update({"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
                    "XDG_DATA_HOME": str(home / ".local/share"), "XDG_CACHE_HOME": str(home / ".cache"),
                    "XDG_STATE_HOME": str(home / ".local/state"), "IRIS_HOME": str(home / "iris"),
                    "QT_QPA_PLATFORM": "offscreen"})
        where = f"offline ({' '.join(offline)})" if offline else "WITH network (no permitted unshare -n here)"
        say(f"      the frozen app's --self-test, {where}, HOME={home}")
        tests = three_self_tests([exe, "-v"], env, offline, verbose_log=True)
    sizes = record.get("sizes", {})
    smoke = record.get("smoke", {}).get("self_test", {})
    return {"bundle": bundle, "needed": needed, "libvulkan": loader, "deb": {**in_deb, "bytes": deb.stat().st_size},
            "self_tests": tests, "offline": " ".join(offline) or None,
            "bundle_bytes": sizes.get("total_bytes"), "without_models_bytes": sizes.get("without_models_bytes"),
            "build_self_test": smoke.get("line"), "build_seconds": record.get("build_seconds"),
            "gpu_backends": record.get("gpu_backends")}


# -- the Windows installer with ggml-vulkan.dll (make windows-check) -----------------------------

#: ``make windows-check``, run as it is by the windows phase
WINDOWS_CHECK = ROOT / "packaging" / "windows" / "check.py"
#: a cold cache compiles llama.cpp with mingw-w64 (11 minutes here) and freezes the app under Wine
WINDOWS_TIMEOUT = 3 * 3600
WINDOWS_OK = "windows-check ok in "
#: the figures of windows-check's closing line (packaging/windows/check.py: closing_line, device_part)
WINDOWS_FIGURES = {
    "seconds": re.compile(r"^windows-check ok in (?P<v>\d+) s"),
    "setup_exe": re.compile(r": setup\.exe (?P<v>[\d,.]+ MB)"),
    "installed": re.compile(r"installed (?P<v>\d+ files \([\d,.]+ MB\))"),
    "answer": re.compile(r"self-test offline under Wine answered '(?P<v>[^']*)'"),
    "self_test_seconds": re.compile(r"self-test offline under Wine answered '[^']*' in (?P<v>[\d.]+) s"),
    "device": re.compile(r"\(8-bit weight copy [^)]*\) on (?P<v>[^;]+);"),
    "module": re.compile(r"; (?P<v>ggml-vulkan\.dll) [\d,.]+ MB imports "),
    "module_size": re.compile(r"; ggml-vulkan\.dll (?P<v>[\d,.]+ MB) imports "),
    "module_imports": re.compile(r"; ggml-vulkan\.dll [\d,.]+ MB imports (?P<v>.+?), no vulkan-1\.dll installed"),
    "under_wine": re.compile(r"no vulkan-1\.dll installed, under Wine (?P<v>.+?); (?:with GGML|no Vulkan device|"
                             r"shortcuts)"),
    "lavapipe": re.compile(r"; with GGML_VK_VISIBLE_DEVICES=0 on (?P<v>[^;]+?, answered '[^']*' in \d+ s)"),
    "phases": re.compile(r"; phases: (?P<v>.*)$"),
}


def read_windows_line(line: str) -> dict:
    """windows-check's closing line, ``windows-check ok in N s: ...``, as figures: the installer,
    the installed app's CPU self-test under Wine, ggml-vulkan.dll's size and imports (objdump -p),
    what Wine loaded, and the run on lavapipe through Wine's vulkan-1.dll where there was one
    (``lavapipe``: None when windows-check found no Vulkan device under Wine, or did not say)."""
    found = {name: (m["v"] if (m := rx.search(line)) else None) for name, rx in WINDOWS_FIGURES.items()}
    found["seconds"] = int(found["seconds"]) if found["seconds"] else None
    found["self_test_seconds"] = float(found["self_test_seconds"]) if found["self_test_seconds"] else None
    found["module_imports"] = found["module_imports"].split(", ") if found["module_imports"] else []
    found["no_vulkan_device"] = "no Vulkan device under Wine" in line
    return {"line": line, **found}


def windows_clause(win: dict) -> str:
    """gpu-check's closing line's words on windows-check."""
    device = (win["device"] or "CPU").split(" (")[0]
    said = (f"Windows (windows-check ok in {win['seconds']} s): {win['module']} {win['module_size']} imports "
            f"{', '.join(win['module_imports'])}; setup.exe {win['setup_exe']}; under Wine the installed app's "
            f"self-test on {'the CPU' if device == 'CPU' else device} {win['answer']!r} in "
            f"{win['self_test_seconds']} s")
    if win["lavapipe"]:
        said += f", with GGML_VK_VISIBLE_DEVICES=0 on {win['lavapipe']}"
    elif win["no_vulkan_device"]:
        said += ", no Vulkan device under Wine (lavapipe not run)"
    return said


def phase_windows(script: Path | None = None, timeout: float | None = None) -> dict:
    """``make windows-check`` (packaging/windows/check.py, by this interpreter, from the repo
    root): its output shown as it comes and kept in CACHE/windows-check.log; it must close with
    ``windows-check ok in N s: ...`` naming ggml-vulkan.dll with vulkan-1.dll among its imports.
    Its figures are this phase's record."""
    script = script or WINDOWS_CHECK
    timeout = timeout or WINDOWS_TIMEOUT
    log = CACHE / "windows-check.log"
    cmd = [sys.executable, "-u", str(script)]
    say(f"      {' '.join(cmd)} (log: {log}; windows-check's own log and cache: "
        f"{windows_check.CACHE})")
    lines: list[str] = []
    timed_out = []
    with log.open("w", encoding="utf-8") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)

        def kill() -> None:
            timed_out.append(True)
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                line = line.rstrip("\n")
                lines.append(line)
                fh.write(line + "\n")
                fh.flush()
                say("      | " + line)
            code = proc.wait()
        finally:
            timer.cancel()
    own_log = next((m[1] for m in map(re.compile(r"\(log: (.+)\)$").search, lines[:3]) if m), None)
    closing = next((x for x in reversed(lines) if x.startswith(WINDOWS_OK)), None)
    if timed_out:
        raise CheckError(f"windows-check timed out after {timeout:.0f} s (log: {log})")
    if code != 0 or closing is None:
        failed = next((x for x in reversed(lines) if x.startswith("windows-check FAILED")), None)
        last = next((x for x in reversed(lines) if x.strip()), "no output")
        raise CheckError(failed if failed else
                         f"windows-check exited {code} without 'windows-check ok in' (log: {log}); last line: {last}")
    facts = {**read_windows_line(closing), "exit": code, "log": str(log), "windows_check_log": own_log}
    expect(facts["module"] is not None and "vulkan-1.dll" in facts["module_imports"],
           "windows-check ok, but its line names no ggml-vulkan.dll importing vulkan-1.dll", closing)
    return facts


def closing_line(ok: bool, facts: dict, times: dict[str, float], total: float, opts) -> str:
    """gpu-check's last line: what ran on what, the frozen app's and windows-check's figures."""
    phases_text = ", ".join(f"{k} {v:.0f} s" for k, v in times.items())
    if not ok:
        return f"gpu-check FAILED after {total:.0f} s ({phases_text}): {facts['failed'].splitlines()[0]}"
    win = facts.get("windows")
    windows_text = f"; {windows_clause(win)}" if win else (
        "; Windows not run (--no-windows)" if opts.no_windows and not opts.only_build else "")
    if opts.only_windows:
        return (f"gpu-check ok in {total:.0f} s (--only-windows: phases 1-6 not run){windows_text}; "
                f"phases: {phases_text}")
    frozen = facts.get("frozen")
    frozen_text = (f"; frozen app {frozen['bundle_bytes'] / 1e6:.1f} MB with libggml-vulkan.so "
                   f"{frozen['bundle']['module_bytes'] / 1e6:.1f} MB, no libvulkan.so*, .deb "
                   f"{frozen['deb']['bytes'] / 1e6:.1f} MB (Recommends: {frozen['deb']['recommends']})"
                   if frozen else "")
    return (f"gpu-check ok in {total:.0f} s on {', '.join(facts['setup']['vulkan_devices'])} "
            f"(lavapipe: the offload path, not speed){frozen_text}{windows_text}; phases: {phases_text}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="packaging/gpu/check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rebuild", action="store_true", help="compile the Vulkan wheel again")
    parser.add_argument("--only-build", action="store_true", help="phases 1-3 only")
    parser.add_argument("--rebuild-frozen", action="store_true",
                        help="run packaging/build.py again even if nothing the frozen app is made from changed")
    parser.add_argument("--no-frozen", action="store_true", help="leave out the frozen app (phases 5-6)")
    parser.add_argument("--no-windows", action="store_true",
                        help="leave out phase 7, make windows-check (the Windows installer with ggml-vulkan.dll)")
    parser.add_argument("--only-windows", action="store_true",
                        help="phase 7 alone: make windows-check and its figures, without phases 1-6")
    opts = parser.parse_args(argv)
    if opts.only_windows and (opts.no_windows or opts.only_build):
        parser.error("--only-windows runs phase 7 alone: not with --no-windows or --only-build")
    os.chdir(ROOT)
    CACHE.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    facts: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if opts.only_windows:
        facts["only_windows"] = True
    started = time.perf_counter()
    phases = [("setup", lambda: phase_setup()), ("wheel", lambda: phase_wheel(opts.rebuild))]
    ok = False
    current = ""

    def step(name: str, fn) -> None:
        nonlocal current
        current = name
        say(f"==> {name}")
        t0 = time.perf_counter()
        try:
            facts[name] = fn()
        finally:
            times[name] = time.perf_counter() - t0

    try:
        if not opts.only_windows:
            for name, fn in phases:
                step(name, fn)
            step("venv", lambda: phase_venv(facts["wheel"]))
            venv = facts.pop("venv")
            if not opts.only_build:
                for name, check in (("devices", check_devices), ("full", check_full), ("partial", check_partial),
                                    ("off", check_off), ("self-test", check_self_tests), ("tests", check_tests)):
                    step(name, lambda check=check: check(venv))
                if not opts.no_frozen:
                    step("frozen-build", lambda: phase_frozen_build(facts["wheel"], opts.rebuild_frozen))
                    step("frozen", lambda: check_frozen(facts["frozen-build"]))
        if opts.only_windows or not (opts.only_build or opts.no_windows):
            step("windows", lambda: phase_windows())
        ok = True
    except (CheckError, subprocess.TimeoutExpired) as exc:
        facts["failed"] = str(exc)
        facts["failed_at"] = current
        say(f"\ngpu-check FAILED at {current}: {exc}")
    finally:
        facts["seconds"] = {k: round(v, 1) for k, v in times.items()}
        (CACHE / "last-gpu-check.json").write_text(json.dumps(facts, indent=2, default=str))
    line = closing_line(ok, facts, times, time.perf_counter() - started, opts)
    say("\n" + line if ok else line)
    return 0 if ok else 1

if __name__ == "__main__":
    sys.exit(main())
