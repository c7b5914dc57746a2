"""What one turn reports, as one frozen dataclass per kind, and the one dispatcher.

The agent yields these; the CLI and the GUI both consume them through
:func:`dispatch`, which calls the matching ``on_*`` method of a :class:`TurnListener`.
A listener overrides only what it shows. Nothing travels in loose dicts: a compaction
carries a :class:`~iris_desktop.core.compaction.CompactionEvent`, a request the
:class:`~iris_desktop.core.engine.ContextRequest` that was sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported for the annotations only: engine and compaction import us
    from iris_desktop.core.compaction import CompactionEvent
    from iris_desktop.core.engine import ContextRequest


@dataclass(frozen=True)
class UserSaved:
    """The user's message is committed."""

    thread_id: int
    message_id: int
    text: str


@dataclass(frozen=True)
class RequestSent:
    """The request that goes to the model now: the meter and the states draw from it."""

    thread_id: int
    request: ContextRequest


@dataclass(frozen=True)
class CompactionStarted:
    thread_id: int
    trigger: str


@dataclass(frozen=True)
class CompactionFinished:
    thread_id: int
    event: CompactionEvent

    @property
    def text(self) -> str:
        return self.event.describe()


@dataclass(frozen=True)
class ReplyStarted:
    """An empty assistant row exists; tokens follow."""

    thread_id: int
    message_id: int


@dataclass(frozen=True)
class ReplyToken:
    thread_id: int
    message_id: int
    text: str


@dataclass(frozen=True)
class ReplySaved:
    """The reply is committed (complete, or interrupted by Stop)."""

    thread_id: int
    message_id: int
    text: str
    status: str  # complete | interrupted
    stats: Any = None  # runtime GenerationStats, None when the runtime gives none
    tool_calls: tuple[dict, ...] = ()


@dataclass(frozen=True)
class ToolFinished:
    """A tool ran (or was refused) and its full result is committed."""

    thread_id: int
    message_id: int
    name: str
    arguments: Any
    ok: bool
    text: str
    tool_call_id: str


@dataclass(frozen=True)
class TurnFailed:
    """The turn cannot go on. ``kind``: too_large | model | internal."""

    thread_id: int
    text: str
    kind: str
    message_id: int | None = None
    needed: int | None = None
    allowed: int | None = None


@dataclass(frozen=True)
class TurnDone:
    """The last event of every turn.

    ``next_request`` is the request the thread would send next (built once, after the
    reply and any background compaction); views draw from it instead of building again.
    """

    thread_id: int
    finish_reason: str  # stop | length | cancelled | error
    stats: Any = None
    next_request: ContextRequest | None = None


TurnEvent = (UserSaved | RequestSent | CompactionStarted | CompactionFinished | ReplyStarted
             | ReplyToken | ReplySaved | ToolFinished | TurnFailed | TurnDone)


class TurnListener:
    """Override the ``on_*`` methods you need; the rest do nothing."""

    def on_user(self, event: UserSaved) -> None: ...
    def on_request(self, event: RequestSent) -> None: ...
    def on_compaction_started(self, event: CompactionStarted) -> None: ...
    def on_compaction_finished(self, event: CompactionFinished) -> None: ...
    def on_reply_started(self, event: ReplyStarted) -> None: ...
    def on_token(self, event: ReplyToken) -> None: ...
    def on_reply(self, event: ReplySaved) -> None: ...
    def on_tool(self, event: ToolFinished) -> None: ...
    def on_failed(self, event: TurnFailed) -> None: ...
    def on_done(self, event: TurnDone) -> None: ...


def dispatch(event: TurnEvent, listener: TurnListener) -> None:
    """Call the listener method for ``event``'s type (the one dispatcher of CLI and GUI)."""
    match event:
        case UserSaved():
            listener.on_user(event)
        case RequestSent():
            listener.on_request(event)
        case CompactionStarted():
            listener.on_compaction_started(event)
        case CompactionFinished():
            listener.on_compaction_finished(event)
        case ReplyStarted():
            listener.on_reply_started(event)
        case ReplyToken():
            listener.on_token(event)
        case ReplySaved():
            listener.on_reply(event)
        case ToolFinished():
            listener.on_tool(event)
        case TurnFailed():
            listener.on_failed(event)
        case TurnDone():
            listener.on_done(event)
        case _:
            raise TypeError(f"not a turn event: {event!r}")
