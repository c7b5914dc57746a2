"""One deadline for the whole of a connect (:class:`ConnectClock`): every probe of a
server, and the one-token calibration after them, within :data:`CONNECT_DEADLINE_S`
together, not each on its own (four slow answers, each under the per-request bound,
held "Connecting…" for 107 s). While an answer is awaited, the connecting thread hears
which one and for how long (``on_wait``), and a cancel ends the wait.

The deadline never cuts an answer short of what it may take on its own: a request gets
the per-request bound or what is left of the connect's time, whichever is less, so the
error says which of the two ran out."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from ..errors import ServerError

#: the whole connect (probes and calibration) ends within this long: the per-request bound
#: (``transport.REQUEST_TIMEOUT_S``), which a healthy server's probes, answered in
#: milliseconds, never come near, now bounds them all together
CONNECT_DEADLINE_S = 30.0
#: a connect is said as it goes once it has taken this long (a quick one says nothing)
SAY_WAIT_AFTER_S = 2.0
#: ... and said again this often while an answer is awaited (its seconds go up)
SAY_WAIT_EVERY_S = 1.0
#: how often a wait looks at the caller's cancel
CANCEL_POLL_S = 0.1

#: ``on_wait(path, waited_s)``: the request waited for (``/v1/models``), and for how long
OnWait = Callable[[str, float], object]

T = TypeVar("T")


class ConnectExpired(ServerError):
    """The connect's deadline passed (:data:`CONNECT_DEADLINE_S`); the message names the
    server, the request that was waiting and for how long, and what to do."""


class ConnectCancelled(ServerError):
    """The caller cancelled the connect while it waited for an answer."""


class ConnectClock:
    """The deadline of one connect to the server at ``root`` (``deadline_s`` from now),
    what its caller hears while it waits (``on_wait``) and what cancels it (``cancel``).
    Used by one thread: the one that connects."""

    def __init__(self, root: str, deadline_s: float,
                 on_wait: OnWait | None = None, cancel: threading.Event | None = None) -> None:
        self.root = root
        self.deadline_s = float(deadline_s)
        self.on_wait = on_wait
        self.cancel = cancel
        self.started = time.monotonic()
        self.deadline = self.started + self.deadline_s
        #: the request that waited longest so far, and how long (said when the deadline
        #: passes between two requests)
        self.slowest: tuple[str, float] = ("", 0.0)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def timeout_for(self, path: str, bound: float) -> float:
        """How long the request to ``path`` may take: ``bound`` or what is left, whichever
        is less. Raises :class:`ConnectExpired` when nothing is left (the answers before
        took it all)."""
        left = self.remaining()
        if left <= 0:
            slowest, took = self.slowest
            raise self._expired(f"its answers took all of it, the slowest {took:.0f} s for "
                                f"{slowest}" if slowest else f"before it could ask for {path}")
        return min(bound, left)

    def wait(self, path: str, work: Callable[[], T]) -> T:
        """``work()`` (the request to ``path``), run on a helper thread while this one says
        what it waits for (``on_wait``, once the connect has taken :data:`SAY_WAIT_AFTER_S`)
        and watches ``cancel``; its result or its exception. Without either, ``work`` runs
        here."""
        since = time.monotonic()
        if self.on_wait is None and self.cancel is None:
            try:
                return work()
            finally:
                self._took(path, time.monotonic() - since)
        outcome: list = []
        done = threading.Event()

        def run() -> None:
            try:
                outcome.append((True, work()))
            except BaseException as exc:  # handed to the waiting thread
                outcome.append((False, exc))
            finally:
                done.set()

        threading.Thread(target=run, name="iris-connect-wait", daemon=True).start()
        say_at = max(self.started + SAY_WAIT_AFTER_S, since + min(SAY_WAIT_EVERY_S, SAY_WAIT_AFTER_S))
        if self.on_wait is None:  # a cancel to watch, nothing to say (it spun once say_at passed)
            say_at = math.inf
        while not done.wait(max(0.0, min(say_at - time.monotonic(), CANCEL_POLL_S))):
            if self.cancel is not None and self.cancel.is_set():
                raise ConnectCancelled(f"connecting to {self.root} was cancelled (it was waiting "
                                       f"for {path})")
            now = time.monotonic()
            if self.on_wait is not None and now >= say_at:
                self.on_wait(path, now - since)
                say_at = now + SAY_WAIT_EVERY_S
        self._took(path, time.monotonic() - since)
        ok, value = outcome[0]
        if not ok:
            raise value
        return value

    def _took(self, path: str, seconds: float) -> None:
        if seconds >= self.slowest[1]:
            self.slowest = (path, seconds)

    def expired(self, path: str, waited_s: float) -> ConnectExpired:
        """The sentence for the deadline passing while ``path`` had waited ``waited_s``."""
        waited = f"{waited_s:.0f} s" if waited_s >= 1 else "under a second"
        return self._expired(f"Iris was waiting for its answer to {path}, for {waited}")

    def _expired(self, why: str) -> ConnectExpired:
        return ConnectExpired(
            f"the server at {self.root} did not finish connecting within {self.deadline_s:g} s "
            f"({why}), so Iris stopped connecting; check that the server is running and not "
            "overloaded, then try again")


def connect_clock(root: str, deadline_s: float | None = None, on_wait: OnWait | None = None,
                  cancel: threading.Event | None = None) -> ConnectClock:
    """A :class:`ConnectClock` starting now; ``deadline_s`` None: :data:`CONNECT_DEADLINE_S`
    (read now, so that a test can make it short)."""
    return ConnectClock(root, CONNECT_DEADLINE_S if deadline_s is None else deadline_s,
                        on_wait, cancel)
