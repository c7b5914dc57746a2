"""How far a download is (:class:`DownloadProgress`, in words for the dialog and the CLI)
and the meter that measures its speed and reports it."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from iris_desktop.units import file_size

#: how often progress is reported at most
PROGRESS_EVERY_S = 0.1
#: the speed is measured over this many seconds
SPEED_WINDOW_S = 5.0


@dataclass(frozen=True)
class DownloadProgress:
    """How far a download is: ``phase`` is "waiting" (for another download of the same
    file to end), "checking" (hashing a partial file before resuming), "rechecking"
    (hashing a file already there that has no record, or changed since), "downloading"
    or "verifying"."""

    file: str
    done: int
    total: int
    #: bytes per second over the last few seconds (0 before it is known)
    speed: float = 0.0
    #: seconds left at that speed (None before it is known)
    eta_s: float | None = None
    #: bytes already there when this run started (a resumed download)
    resumed_from: int = 0
    phase: str = "downloading"
    #: the hub lists a sha256 for the file (False: it cannot be verified by the hub)
    listed_sha256: bool = True

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 0.0

    def describe(self) -> str:
        if self.phase == "waiting":
            return f"Waiting for another download of {self.file} to end…"
        if self.phase == "checking":
            part = self.done / self.resumed_from if self.resumed_from else 1.0
            return f"Checking the {_mb(self.resumed_from)} downloaded before… {part:.0%}"
        if self.phase == "rechecking":
            return f"Checking the {self.file} already in the models folder (sha256)… {self.fraction:.0%}"
        if self.phase == "verifying":
            if not self.listed_sha256:
                return (f"Checking {self.file} (GGUF header; the hub lists no sha256, so it is "
                        "not verified by the hub)…")
            return f"Verifying {self.file} (sha256 and GGUF header)…"
        text = f"{_mb(self.done)} of {_mb(self.total)}"
        if self.speed > 0:
            text += f" · {self.speed / 1e6:.1f} MB/s"
        if self.eta_s is not None:
            text += f" · {_duration(self.eta_s)} left"
        return text


def _mb(n: int) -> str:
    return file_size(n, mb_digits=1)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class _Meter:
    """Speed over the last :data:`SPEED_WINDOW_S` seconds, and progress reports at most
    every :data:`PROGRESS_EVERY_S`; a report held back by that is sent by :meth:`flush`
    (called from another thread while the download waits for bytes, so that the count
    shown is the one reached, not one from before a stall)."""

    def __init__(self, file: str, total: int, start: int, report: Callable[[DownloadProgress], Any] | None,
                 listed_sha256: bool = True):
        self.file, self.total, self.start, self.report = file, total, start, report
        self.listed_sha256 = listed_sha256
        self.samples: collections.deque[tuple[float, int]] = collections.deque()
        self.last = 0.0
        self.held: tuple[int, str] | None = None
        self.lock = threading.Lock()

    def __call__(self, done: int, phase: str = "downloading", force: bool = False) -> None:
        if self.report is None:
            return
        with self.lock:
            now = time.monotonic()
            if phase == "downloading":
                self.samples.append((now, done))
                while len(self.samples) > 2 and now - self.samples[0][0] > SPEED_WINDOW_S:
                    self.samples.popleft()
            if not force and now - self.last < PROGRESS_EVERY_S:
                self.held = (done, phase)
                return
            self._send(now, done, phase)

    def flush(self) -> None:
        """Send the report held back, if any (and :data:`PROGRESS_EVERY_S` has passed)."""
        if self.report is None:
            return
        with self.lock:
            now = time.monotonic()
            if self.held is not None and now - self.last >= PROGRESS_EVERY_S:
                self._send(now, *self.held)

    def _send(self, now: float, done: int, phase: str) -> None:
        self.last, self.held = now, None
        speed, eta = 0.0, None
        if phase == "downloading" and len(self.samples) >= 2:
            (t0, d0), (t1, d1) = self.samples[0], self.samples[-1]
            if t1 - t0 >= 0.2:
                speed = (d1 - d0) / (t1 - t0)
                eta = (self.total - done) / speed if speed > 0 else None
        self.report(DownloadProgress(self.file, done, self.total, speed, eta, self.start, phase,
                                     self.listed_sha256))
