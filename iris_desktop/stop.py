"""The one protocol for "stop", shared by every layer: the user's Stop, a deadline's
end, or the model giving way to the user's next message. A long operation (streaming,
prompt evaluation, a prefill, a summary, a download) polls ``is_set()`` between two steps."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol, runtime_checkable


@runtime_checkable
class Stop(Protocol):
    """Set when the operation that polls it should stop. ``reason``, where there is
    one, says why in words (:func:`stop_reason`)."""

    def is_set(self) -> bool: ...


#: Why a stop was set, in words: the user's Stop, and a background job (a warm-up, a
#: prefill, an after-reply summary) making way for the user's next message.
USER_STOP = "stopped by the user"
GAVE_WAY = "it gave way to your next message"
#: the window is closing: work that would only be kept for later is left undone
CLOSING = "Iris is closing"


class StopEvent(threading.Event):
    """The user's Stop: a ``threading.Event`` that says why it was set."""

    reason = USER_STOP


def stop_reason(stop: Stop | None, default: str = USER_STOP) -> str:
    """Why ``stop`` was set, in words."""
    return str(getattr(stop, "reason", default) or default)


def closing(stop: Stop | None) -> bool:
    """Was ``stop`` set because Iris is closing (:data:`CLOSING`)?"""
    return stop is not None and stop.is_set() and stop_reason(stop) == CLOSING


class WhenClosing:
    """``stop`` seen only when it is set because Iris is closing: what the user's Stop
    must not end (the summary Iris makes itself after a Stop) still ends at a close."""

    reason = CLOSING

    def __init__(self, stop: Stop | None) -> None:
        self.stop = stop

    def is_set(self) -> bool:
        return closing(self.stop)


class Stopped(Exception):
    """A step gave up because the stop it polls was set."""


#: the stop of the operation under way on this thread, for steps no parameter reaches
#: (recall's cross-encoder, deep inside the planner): :func:`stopping`, :func:`active_stop`
_ACTIVE: ContextVar[Stop | None] = ContextVar("iris_active_stop", default=None)


@contextmanager
def stopping(stop: Stop | None) -> Iterator[None]:
    """Within this block, :func:`active_stop` is ``stop``: a step that takes long and is
    called from deep inside (the cross-encoder reading a send's candidates for a second
    or more) stops when it is set, rather than making the user's Stop wait for it."""
    token = _ACTIVE.set(stop)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active_stop() -> Stop | None:
    """The stop of the :func:`stopping` block this runs in (None outside one)."""
    return _ACTIVE.get()
