"""What Iris remembers of the GPUs between runs, in two small JSON files in the data folder:
the first-use check's verdict per device and driver (:class:`GpuChecks`,
``gpu-checks.json``), and the compute buffer llama.cpp measured at a load
(:class:`MeasuredCompute`, ``gpu-compute.json``). The window, ``chat`` and ``devices
--check-again`` may change them at once from several processes: each read-change-write
holds the file's lock (:func:`_changing`; before, one process's record could be lost to
another's write, an audit found 4 runs in 5 losing it under load)."""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from iris_desktop.files import atomic_write, exclusive_lock, read_regular_file

log = logging.getLogger("iris.runtime.gpu")

__all__ = ["COMPUTE_FILE", "FAILED_RUNS_OFF", "THIS_RUN", "GpuChecks", "MeasuredCompute", "check_again_command"]


class Device(Protocol):
    """What a record needs of a device (:class:`.gpu.Device` has it)."""

    name: str
    label: str
    backend: str
    driver: str | None


#: the largest GPU record read: a few hundred bytes a device and driver (a 45 MB one, made
#: by hand, was read whole and listed line by line)
RECORD_LIMIT = 2**20

#: the records this thread holds the lock of (:func:`_changing` nests: a count read and the
#: record written after it are one change)
_held = threading.local()


@contextmanager
def _changing(path: Path) -> Iterator[None]:
    """Hold ``path``'s lock (``.<name>.lock`` beside it) for one read-change-write, across
    processes; within it, this thread takes it again at once. A lock that cannot be made
    (a read-only folder) is logged: the write that follows fails and says why itself."""
    held = _held.__dict__.setdefault("paths", set())
    if path in held:
        yield
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # (not through a link put in its place: an audit saw one create a file elsewhere)
        lock = exclusive_lock(path.with_name(f".{path.name}.lock"), wait=True, follow=False)
        lock.__enter__()
    except OSError as exc:
        log.warning("%s: cannot lock it (%s)", path, exc)
        yield
        return
    held.add(path)
    try:
        yield
    finally:
        held.discard(path)
        lock.__exit__(None, None, None)


def _read_section(path: Path | None, section: str, what: str = "", instead: str = "", *,
                  quiet: bool = True) -> dict[str, Any]:
    """The ``section`` object of the small JSON file ``path`` (empty when there is no file,
    or it holds none); unreadable or malformed: empty, with a warning that says what happens
    ``instead``, or (not ``quiet``) the OSError, ValueError or RecursionError raised."""
    if path is None:
        return {}
    try:  # (a named pipe in its place held every load and `devices` for ever)
        data = json.loads(read_regular_file(path, RECORD_LIMIT).decode("utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nesting too deep
        if not quiet:
            raise
        log.warning("%s: cannot read %s (%s); %s", path, what, exc, instead)
        return {}
    found = data.get(section) if isinstance(data, dict) else None
    return found if isinstance(found, dict) else {}


# -- the first-use check's record --------------------------------------------------------

#: this process, in the record of a GPU that failed while in use (a reply, a warm-up): off
#: for the run that saw it, checked again by the first load of a later one
THIS_RUN = f"{os.getpid()}@{time.time():.6f}"
#: runs of Iris in a row in which a GPU failed in use that switch it off until its driver
#: changes (one may be a one-off; two cost the user a failed reply at every start)
FAILED_RUNS_OFF = 2
#: (run, record, device key) whose success in use this run noted (:meth:`GpuChecks.worked`)
_worked: set[tuple[str, str, str]] = set()


class GpuChecks:
    """What the first-use check found, per device and driver, in a small JSON file in the
    data folder: ``{"checks": {"<description>|<driver>": {"agrees": bool, ...}}}``. A
    device that disagreed stays off for Iris until its driver changes (another key); one
    that failed while in use (``"run"``: :data:`THIS_RUN`) stays off for that run only, as
    such a failure may be a one-off (another app holding its memory), unless it failed in
    use in :data:`FAILED_RUNS_OFF` runs in a row (``"failed_runs"``, kept through the
    first-use check passing again, cleared by a run in which it worked in use and did not fail
    after: :meth:`worked`)."""

    VERSION = 1

    def __init__(self, path: str | os.PathLike[str] | None):
        self.path = Path(path) if path is not None else None

    @staticmethod
    def key(device: Device) -> str:
        return f"{device.label}|{device.driver or 'driver unknown'}"

    def _read(self) -> dict[str, Any]:
        return _read_section(self.path, "checks", "the GPU checks", "checking again")

    def recorded(self, device: Device) -> dict[str, Any] | None:
        """The record of ``device`` with its driver as written, or None (never checked)."""
        entry = self._read().get(self.key(device))
        return entry if isinstance(entry, dict) and isinstance(entry.get("agrees"), bool) else None

    @staticmethod
    def earlier_run(entry: dict[str, Any]) -> bool:
        """Whether ``entry`` is a failure in use that an earlier run of Iris saw (the first
        load of this one checks the GPU again)."""
        return "run" in entry and entry["run"] != THIS_RUN

    def result(self, device: Device) -> dict[str, Any] | None:
        """The recorded check of ``device`` with its driver, or None: never checked, or it
        failed in use in an earlier run only (checked again; before, a one-off failure in a
        reply switched the GPU off until its driver changed, and nothing could bring it
        back); one that failed in use in :data:`FAILED_RUNS_OFF` runs in a row stays off."""
        entry = self.recorded(device)
        return None if entry is None or self.earlier_run(entry) else entry

    def disabled(self, devices: Iterable[Device]) -> dict[str, str]:
        """Description -> why, for the devices that disagreed with this driver."""
        out = {}
        for device in devices:
            entry = self.result(device)
            if entry is not None and not entry["agrees"]:
                reason = entry.get("reason")
                ok = isinstance(reason, str) and reason  # a record written by hand, or damaged
                out[device.label] = reason if ok else "its answers differed from the CPU's"
        return out

    def record(self, device: Device, agrees: bool, detail: str, reason: str | None = None, *,
               this_run: bool = False, failed_runs: int | None = None) -> None:
        """Remember a check's outcome (written atomically; a failure is logged, never raised:
        the check then runs again next time). ``reason``: why a failing device is off, when
        it is not that its answers differed; ``this_run``: off for this run only (a failure
        in use, :func:`.first_use.gpu_failure`); ``failed_runs``: the runs in a row it failed
        in use, this one the last (None: as recorded, a check does not change it)."""
        if self.path is None:
            return
        reason = reason or ("its answers differed from the CPU's in Iris's first-use check "
                            f"({detail}); it stays off until its driver changes")
        with _changing(self.path):
            checks = self._read()
            key = self.key(device)
            streak = _streak(checks.get(key)) if failed_runs is None else (
                {"failed_runs": failed_runs, "last_failed_run": THIS_RUN} if failed_runs else {})
            checks[key] = {"device": device.label, "backend": device.backend,
                           "driver": device.driver, "agrees": agrees, "detail": detail,
                           "reason": None if agrees else reason,
                           "checked": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                           **({"run": THIS_RUN} if this_run else {}), **streak}
            self._write(checks)

    def _write(self, checks: dict[str, Any]) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self.path, json.dumps({"version": self.VERSION, "checks": checks}, indent=2))
        except OSError as exc:
            log.warning("%s: cannot record the GPU check (%s)", self.path, exc)

    def failed_in_use(self, device: Device, during: str, error: str) -> int:
        """Record that ``device`` failed during ``during`` (llama.cpp's ``error``), and
        return in how many runs of Iris in a row it has (this one counted once): below
        :data:`FAILED_RUNS_OFF` it is off for this run only, from it until its driver
        changes, with a reason that says how to check it again (:meth:`again`). The count is
        read and written under one lock: two runs failing at once count two."""
        if self.path is None:
            return 1
        with _changing(self.path):
            return self._failed_in_use(device, during, error)

    def _failed_in_use(self, device: Device, during: str, error: str) -> int:
        entry = self.recorded(device)
        streak = _streak(entry)
        runs = streak.get("failed_runs", 0) + int(streak.get("last_failed_run") != THIS_RUN)
        if runs < FAILED_RUNS_OFF:
            self.record(device, False, f"it failed during {during}: {error}", reason=(
                f"it failed during {during} ({error}); it stays off until Iris restarts, which checks it again"),
                this_run=True, failed_runs=runs)
        else:
            self.record(device, False, f"it failed in use in {runs} runs of Iris in a row, the last during "
                        f"{during}: {error}", reason=(
                            f"it failed in use in {runs} runs of Iris in a row, the last time during {during} "
                            f"({error}); it stays off until its driver changes ({self.again(device)})"),
                        failed_runs=runs)
        return runs

    @staticmethod
    def again(device: Device) -> str:
        """How the user has ``device`` checked again, in a few words: the command that
        forgets its record."""
        return f"run '{check_again_command(device)}' to check it again"

    def entries(self) -> dict[str, Any]:
        """Every record, by key, as written (none: no file); raises OSError, ValueError or
        RecursionError where the file cannot be read (:func:`_read_section`)."""
        return _read_section(self.path, "checks", quiet=False)

    def forget(self, label: str | None = None) -> dict[str, Any]:
        """Forget the records of the device ``label`` (every driver's), or all (None): the
        next load on it runs the first-use check again, and its count of runs that failed in
        use starts again. What was forgotten, by key; the other records are kept as they
        were. A file that cannot be read or written raises (OSError, ValueError,
        RecursionError: :meth:`entries`), and nothing is changed."""
        if self.path is None:
            return {}
        with _changing(self.path):
            checks = self.entries()
            gone = {k: v for k, v in checks.items() if label is None or k.startswith(f"{label}|")}
            if gone:
                kept = {k: v for k, v in checks.items() if k not in gone}
                atomic_write(self.path, json.dumps({"version": self.VERSION, "checks": kept}, indent=2))
        return gone

    def worked(self, device: Device) -> None:
        """A reply or a warm-up completed on ``device``: its count of runs that failed in
        use (:meth:`failed_in_use`) starts again once this run ends without failing in use
        (``"worked_run"``; a failure later in this run continues the count). Read once per
        run and device, written only when there is a count: no write per reply."""
        noted = (THIS_RUN, str(self.path), self.key(device))
        if self.path is None or noted in _worked:
            return
        _worked.add(noted)
        with _changing(self.path):  # (once a run and device: the lock costs nothing per reply)
            checks = self._read()
            entry = checks.get(self.key(device))
            if not isinstance(entry, dict) or "failed_runs" not in entry or entry.get("agrees") is not True:
                return
            streak = _streak(entry)
            if streak.get("last_failed_run") == THIS_RUN:
                return  # it failed in this run: this run counts
            log.info("%s worked in this run: its count of runs that failed in use starts again", device.label)
            kept = {k: v for k, v in entry.items() if k not in _STREAK_KEYS}
            checks[self.key(device)] = {**kept, **streak, "worked_run": THIS_RUN} if streak else kept
            self._write(checks)


def check_again_command(device: Device | None = None) -> str:
    """The command that has ``device`` (None: every GPU) checked again (:meth:`GpuChecks.forget`),
    naming it as its record does (ggml's "Vulkan0" may be another GPU once one is added)."""
    if device is None:
        return "iris-desktop devices --check-again"
    name = device.label if '"' not in device.label else device.name
    return "iris-desktop devices --check-again " + (name if re.fullmatch(r"[\w.+-]+", name) else f'"{name}"')


#: what a record's entry keeps of the runs in a row in which its device failed in use
_STREAK_KEYS = ("failed_runs", "last_failed_run", "worked_run")


def _streak(entry: Any) -> dict[str, Any]:
    """The count of runs in a row that failed in use of a record's ``entry``, the last of
    them, and the run that worked since (``"worked_run"``: this one, or the last one that
    failed); empty: none, a count broken by an earlier run that worked and did not fail
    after, or a record written by hand, or damaged."""
    if not isinstance(entry, dict):
        return {}
    runs, last, worked = (entry.get(k) for k in _STREAK_KEYS)
    if not (isinstance(runs, int) and not isinstance(runs, bool) and runs > 0 and isinstance(last, str)):
        return {}
    if isinstance(worked, str) and worked not in (last, THIS_RUN):
        return {}
    return {"failed_runs": runs, "last_failed_run": last, **({"worked_run": worked} if isinstance(worked, str) else {})}


# -- the measured compute buffer ------------------------------------------------------------


#: the file beside the first-use checks' that keeps the measured compute buffers
COMPUTE_FILE = "gpu-compute.json"


class MeasuredCompute:
    """The compute buffer llama.cpp reserved on a GPU at a load, from its log, per device
    and driver (:meth:`GpuChecks.key`) and :func:`compute_key`, in a small JSON file in the
    data folder: the next plan with the same facts uses it in place of the estimate
    (``plan_gpu(measured_compute=...)``). Unreadable or missing: the estimate is used."""

    VERSION = 1

    def __init__(self, path: str | os.PathLike[str] | None):
        self.path = Path(path) if path is not None else None

    @classmethod
    def beside(cls, gpu_checks: str | os.PathLike[str] | None) -> MeasuredCompute:
        """The record kept beside the first-use checks' file ``gpu_checks``."""
        return cls(Path(gpu_checks).with_name(COMPUTE_FILE) if gpu_checks is not None else None)

    @staticmethod
    def key(device: Device, model_key: str) -> str:
        return f"{GpuChecks.key(device)}|{model_key}"

    def _read(self) -> dict[str, Any]:
        return _read_section(self.path, "compute", "the measured compute buffers", "estimating")

    def get(self, device: Device, model_key: str) -> int | None:
        """The measured bytes for ``device`` and ``model_key``, or None."""
        value = self._read().get(self.key(device, model_key))
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    def record(self, device: Device, model_key: str, nbytes: int) -> None:
        """Remember a measurement (written atomically; a failure is logged, never raised)."""
        if self.path is None or nbytes <= 0 or self.get(device, model_key) == nbytes:
            return
        with _changing(self.path):
            sizes = self._read()
            sizes[self.key(device, model_key)] = nbytes
            try:
                atomic_write(self.path, json.dumps({"version": self.VERSION, "compute": sizes}, indent=2))
            except OSError as exc:
                log.warning("%s: cannot record the measured compute buffer (%s)", self.path, exc)
