"""What a turn is, as one value: the four ways to run one, the options every face passes
the same way, and the one protocol for "stop" (the user's Stop, or the model giving way).

The GUI and the CLI build a :class:`Turn` and hand it to ``Host.run``; the host gives it to
``Agent.run_turn``, which dispatches on ``Turn.kind`` with one ``match``. A reader can
follow a send from the composer to the runtime without meeting a lambda.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from iris_desktop.core.attachments import Attachment
from iris_desktop.core.events import PromptProgress
from iris_desktop.stop import GAVE_WAY, Stop, stop_reason

if TYPE_CHECKING:
    from iris_desktop.core.planner import Planner

TurnKind = Literal["send", "regenerate", "edit", "continue"]


class StopOrGiveWay:
    """The after-reply summary's stop: the user's Stop, or someone waiting for the model
    (a send or a draft to prefill). ``reason`` is what the compaction records when the
    model's summary stopped early."""

    def __init__(self, cancel: Stop, give_way: Stop) -> None:
        self.cancel = cancel
        self.give_way = give_way

    def is_set(self) -> bool:
        return self.cancel.is_set() or bool(self.give_way.is_set())

    @property
    def reason(self) -> str:
        if self.cancel.is_set():
            return stop_reason(self.cancel)
        return GAVE_WAY


@dataclass(frozen=True)
class Turn:
    """One turn to run in ``thread_id`` (None: a new thread, send only).

    ``send``: ``text`` (with ``attachments``) as the user's new message; ``regenerate``:
    the newest user message answered again; ``edit``: ``text`` (with ``attachments``) in
    place of the user message ``message_id``; ``continue``: the stopped or cut-off last
    reply goes on."""

    kind: TurnKind
    thread_id: int | None
    text: str = ""
    message_id: int | None = None
    attachments: tuple[Attachment, ...] = ()

    @classmethod
    def send(cls, thread_id: int | None, text: str,
             attachments: Sequence[Attachment] = ()) -> Turn:
        return cls("send", thread_id, text, attachments=tuple(attachments))

    @classmethod
    def regenerate(cls, thread_id: int) -> Turn:
        return cls("regenerate", thread_id)

    @classmethod
    def edit(cls, thread_id: int, message_id: int, text: str,
             attachments: Sequence[Attachment] = ()) -> Turn:
        return cls("edit", thread_id, text, message_id, tuple(attachments))

    @classmethod
    def continue_reply(cls, thread_id: int) -> Turn:
        return cls("continue", thread_id)


@dataclass(frozen=True)
class TurnOptions:
    """How a face runs a turn: the ``planner`` (a settings snapshot and the model; None:
    the host's), who answers a shell command (``confirm_shell``; None: refused), who
    waits for the model (``give_way``: a summary or warm-up after the reply then stops),
    and who hears how far the model has read the prompt (``progress``)."""

    planner: Planner | None = None
    confirm_shell: Callable[[str], bool] | None = None
    give_way: Stop | None = None
    progress: Callable[[PromptProgress], None] | None = None
