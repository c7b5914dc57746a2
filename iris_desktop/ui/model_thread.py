"""The model thread: a thin Qt adapter that runs the host (``iris_desktop.host``) on a
thread of its own and turns what it reports into signals.

Open Data Editor's shape: a ``QObject`` moved to a ``QThread`` instead of subclassing it.
:class:`ModelWorker` is the only caller of the host's model operations, so the runtime,
the embedder and the threads' KV states live on this one thread. Each job is a slot; each
typed event (``core.events``) the host yields becomes one signal (napari's
``thread_worker`` shape). Cancel is cooperative (a ``threading.Event``); the thread is
never terminated.

The GUI thread holds facts about the loaded model (``LoadedModel``), not the runtime: its
planners come from the host (``Host.planner``), and their counters call the runtime's
counting methods, which are safe from any thread and fail cleanly once the model is
closed (see ``runtime.protocol``).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from dataclasses import asdict, dataclass, field
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot

from iris_desktop.core.engine import ContextRequest
from iris_desktop.core.events import CacheStatus, ThreadCreated, TurnEvent
from iris_desktop.core.planner import Planner
from iris_desktop.core.store import StoreError, ThreadGone, explain
from iris_desktop.core.store.messages import held_back
from iris_desktop.core.tools import ToolError
from iris_desktop.core.turns import Turn, TurnOptions
from iris_desktop.host import LOAD_STAGES, Host, stage_words
from iris_desktop.settings import Settings
from iris_desktop.stop import GAVE_WAY, StopEvent
from iris_desktop.ui.boxes import failure

log = logging.getLogger("iris.ui.model")


@dataclass(frozen=True)
class TurnJob:
    """One turn to run (``core.turns.Turn``) and the planner (settings snapshot and
    model) it is planned with; setting ``cancel`` is Stop."""

    turn: Turn
    planner: Planner
    cancel: StopEvent = field(default_factory=StopEvent)


@dataclass(frozen=True)
class CompactJob:
    """Compact ``thread_id`` now (Compact now); setting ``cancel`` stops a model-written
    summary early (the extractive one is used)."""

    thread_id: int
    planner: Planner
    cancel: StopEvent = field(default_factory=StopEvent)


@dataclass(frozen=True)
class PrefillJob:
    """Evaluate the draft's planned ``request`` in ``thread_id`` while the user types."""

    thread_id: int
    planner: Planner
    request: ContextRequest


@dataclass(frozen=True, eq=False)
class LoadJob:
    """A model to load for ``settings``; setting ``cancel`` stops the load. What the load
    comes to (``loaded``, ``loadFailed``) carries its job, so the window can tell the
    result of the load it waits for from one it has since replaced (compared by
    identity: two picks of the same file are two jobs)."""

    settings: Settings
    cancel: threading.Event = field(default_factory=threading.Event)


@dataclass
class ShellQuestion:
    """A shell command waiting for the user's yes or no (asked from the model thread)."""

    command: str
    answer: bool = False
    answered: threading.Event = field(default_factory=threading.Event)

    def reply(self, answer: bool) -> None:
        self.answer = bool(answer)
        self.answered.set()


class GiveWay:
    """How many jobs are queued for the model thread (counted across threads): a
    ``core.turns.Stop`` that a warm-up, a prefill or an after-reply summary polls, set as
    soon as anything else waits for the model."""

    reason = GAVE_WAY

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._interrupted = False

    def queued(self) -> None:
        with self._lock:
            self._count += 1

    def interrupt(self) -> None:
        """Stop the warm-up under way although nothing is queued yet (the draft changed:
        its prefill will follow)."""
        self._interrupted = True

    def started(self) -> None:
        with self._lock:
            self._count = max(0, self._count - 1)
            self._interrupted = False

    def is_set(self) -> bool:
        return self._count > 0 or self._interrupted


@dataclass(frozen=True)
class LoadedModel:
    """What the GUI learns of a loaded model: its facts (``runtime.protocol.ModelFacts``
    as a dict) and whether recall by meaning has its embedder. The runtime itself stays
    with the host, which makes every planner (``Host.planner``)."""

    info: dict[str, Any]
    recall_by_meaning: bool = False
    #: the load that brought it (None: not from a LoadJob)
    job: LoadJob | None = field(default=None, compare=False, repr=False)
    #: the model in use, loaded again after a load that closed it for its GPU memory failed
    #: (the window's newer load, if any, goes on; nothing is saved for it)
    restored: bool = False


class ModelWorker(QObject):
    """Runs the host's jobs on the model thread, one at a time."""

    loading = Signal(str)  # what is happening now, in words
    loaded = Signal(object)  # LoadedModel
    loadProgress = Signal(float)  # 0..1 of the weights loaded
    loadFailed = Signal(str, object)  # why, in one sentence; the LoadJob
    threadCreated = Signal(int)
    threadDeleted = Signal(int)
    deleteFailed = Signal(int, str)  # thread id; why it is still there, in one sentence
    turnEvent = Signal(object)  # a core.events TurnEvent
    turnFinished = Signal(int)  # thread id
    shellQuestion = Signal(object)  # ShellQuestion
    cacheStatus = Signal(str)  # CacheStatus.describe(): "Warming up… 1,536 of 4,096 tokens (37%)…"
    cacheEvent = Signal(object)  # the CacheStatus itself, with its numbers (the status bar's)
    gpuFailed = Signal()  # the runtime's GPU failed (a reply, a warm-up): recorded off for Iris

    def __init__(self, host: Host):
        super().__init__()
        self.host = host
        host.hold_remote = True  # a server on another machine: held back until agreed to
        self._closing = threading.Event()
        self._cancel: threading.Event | None = None
        #: jobs queued behind the one running: a warm-up or a prefill under way stops
        #: between two graph nodes as soon as anything else waits for the model
        self.give_way = GiveWay()

    # -- loading --

    @Slot(object)
    def load(self, job: LoadJob) -> None:
        """Load the model for ``job.settings``; a load that fails or is cancelled leaves
        the model in use as it was (see ``Host.load_model``). A job cancelled before it
        starts (a newer choice replaced it while it waited) loads nothing."""
        self.give_way.started()
        if job.cancel.is_set():
            self.loadFailed.emit("loading was cancelled", job)
            return
        before = self.host.runtime
        try:
            self.loading.emit(LOAD_STAGES["loading"])
            runtime = self.host.load_model(job.settings, progress=self.loadProgress.emit,
                                           cancel=job.cancel, stage=self._stage)
        except Exception as exc:  # a bad model must never take the app down
            log.error("model: %s", exc)
            self.loadFailed.emit(str(exc), job)
            again = self.host.runtime
            if again is not None and again is not before:  # the model in use, closed to make
                # room on its GPU for this one, loaded again: the window plans for it anew
                self.loaded.emit(LoadedModel(asdict(again.describe()), self.host.embedder is not None,
                                             restored=True))
            return
        embedder = self.host.load_embedder(job.settings)
        self.loaded.emit(LoadedModel(asdict(runtime.describe()), embedder is not None, job))

    def _stage(self, stage: str) -> None:
        """The load's stage (``LocalModel.load``), in words for the status bar."""
        self.loading.emit(stage_words(stage))

    # -- jobs --

    def _confirm_shell(self, command: str) -> bool:
        """Called by the Sandbox on this thread; blocks until the GUI answers."""
        question = ShellQuestion(command)
        self.shellQuestion.emit(question)
        cancel = self._cancel
        while not question.answered.wait(0.05):
            if self._closing.is_set():
                raise ToolError("Iris was closed before the question was answered, so it "
                                f"did not run: {command}")
            if cancel is not None and cancel.is_set():
                raise ToolError(f"stopped by the user before it ran: {command}")
        return question.answer

    def _emit(self, event: TurnEvent) -> None:
        if isinstance(event, ThreadCreated):
            self.threadCreated.emit(event.thread_id)
        elif isinstance(event, CacheStatus):
            self.cacheStatus.emit(event.describe())
            self.cacheEvent.emit(event)
        else:
            self.turnEvent.emit(event)

    @Slot(object)
    def run_turn(self, job: TurnJob) -> None:
        """Run one turn (``Host.run``), each event it yields emitted as a signal."""
        self.give_way.started()
        self._cancel = job.cancel
        thread_id = job.turn.thread_id
        # PromptProgress comes from inside an evaluation: emitted at once, drawn queued
        options = TurnOptions(planner=job.planner, confirm_shell=self._confirm_shell,
                              give_way=self.give_way, progress=self.turnEvent.emit)
        try:
            for event in self.host.run(job.turn, job.cancel, options):
                if isinstance(event, ThreadCreated):
                    thread_id = event.thread_id
                self._emit(event)
        finally:
            self._cancel = None
        if thread_id is not None:
            self.turnFinished.emit(thread_id)
        self._say_gpu_failed()  # the warm-up after a compaction runs after the turn's TurnDone

    @Slot(object)
    def prefill(self, job: PrefillJob) -> None:
        """Evaluate the request planned for the draft while the user types."""
        self.give_way.started()
        if self.give_way.is_set():
            return  # a newer draft or a send is queued: this draft is stale
        host = self.host
        if host.runtime is None or job.planner.runtime is not host.runtime:
            return
        for event in host.prefill(job.thread_id, job.request, self.give_way):
            self._emit(event)
        self._say_gpu_failed()

    def _say_gpu_failed(self) -> None:
        """``gpuFailed`` when the runtime's GPU failed: a warm-up's failure is only logged
        by the host (it is an optimisation), and the window loads the model again on the
        CPU once it is seen (before: the next reply failed on that GPU first)."""
        if getattr(self.host.runtime, "gpu_failed", None):
            self.gpuFailed.emit()

    @Slot(object)
    def compact(self, job: CompactJob) -> None:
        """Compact ``job.thread_id`` now (Compact now), whatever the triggers and the
        circuit breaker say; reported like a turn, ending with TurnDone."""
        self.give_way.started()
        self._cancel = job.cancel
        try:
            for event in self.host.compact(job.thread_id, job.cancel, planner=job.planner,
                                           progress=self.turnEvent.emit):
                self._emit(event)
        finally:
            self._cancel = None
        self.turnFinished.emit(job.thread_id)

    @Slot(int)
    def delete(self, thread_id: int) -> None:
        """Delete a thread and its saved KV states (``Host.delete_thread``):
        ``threadDeleted``, also for a chat deleted meanwhile (by another window or a
        command); ``deleteFailed`` with why when it is still there (another process
        writing, a full disk). Before, every failure was only logged and reported as
        deleted: the chat stayed listed, and nothing said why."""
        self.give_way.started()
        try:
            if not self.host.delete_thread(thread_id):  # said as a delete that left a trace
                self.deleteFailed.emit(thread_id, held_back(self.host.paths.db_path))
                return
        except ThreadGone:
            log.info("thread %s was already deleted (by another window or a command)", thread_id)
        except sqlite3.Error as exc:
            log.warning("deleting thread %s failed: %s", thread_id, exc)
            self.deleteFailed.emit(thread_id, explain(exc, self.host.paths.db_path))
            return
        except (StoreError, OSError) as exc:  # the history could not be opened, a KV file
            log.warning("deleting thread %s failed: %s", thread_id, exc)
            self.deleteFailed.emit(thread_id, failure(exc))
            return
        except Exception as exc:
            log.exception("deleting thread %s failed: %s", thread_id, exc)
            self.deleteFailed.emit(thread_id, failure(exc))
            return
        self.threadDeleted.emit(thread_id)

    @Slot()
    def shutdown(self) -> None:
        """Close what this thread owns, then end this thread's loop."""
        self.release()
        QThread.currentThread().quit()

    def release(self) -> None:
        """Close the runtime, the embedder and this thread's Store (``Host.release``)."""
        self._closing.set()
        self.host.release()


class ModelThread(QObject):
    """The GUI side of the model worker: starts the thread, forwards requests."""

    _load = Signal(object)
    _turn = Signal(object)
    _compact = Signal(object)
    _prefill = Signal(object)
    _delete = Signal(int)
    _shutdown = Signal()

    def __init__(self, worker: ModelWorker, parent: QObject | None = None):
        super().__init__(parent)
        self.worker = worker
        self.thread = QThread()
        self.thread.setObjectName("iris-model")
        self.worker.moveToThread(self.thread)
        self._load.connect(self.worker.load)
        self._turn.connect(self.worker.run_turn)
        self._compact.connect(self.worker.compact)
        self._prefill.connect(self.worker.prefill)
        self._delete.connect(self.worker.delete)
        self._shutdown.connect(self.worker.shutdown)
        self.thread.start()
        self._closed = False

    def load(self, settings: Settings) -> LoadJob:
        """Queue a load; the returned job's ``cancel`` stops it."""
        job = LoadJob(settings)
        self.worker.give_way.queued()
        self._load.emit(job)
        return job

    def run_turn(self, job: TurnJob) -> None:
        """A turn never waits for a warm-up: the one under way stops at once."""
        self.worker.give_way.queued()
        self._turn.emit(job)

    def compact(self, job: CompactJob) -> None:
        self.worker.give_way.queued()
        self._compact.emit(job)

    def prefill(self, job: PrefillJob) -> None:
        self.worker.give_way.queued()  # a prefill for an older draft gives way to this one
        self._prefill.emit(job)

    def delete(self, thread_id: int) -> None:
        """Queue the deletion of a thread; ``worker.threadDeleted`` follows."""
        self.worker.give_way.queued()
        self._delete.emit(thread_id)

    def close(self, cancel: threading.Event | None = None) -> None:
        """Stop at the next token, close the model, and wait for the thread to end."""
        if self._closed:
            return
        self._closed = True
        if cancel is not None:
            cancel.set()
        self.worker._closing.set()
        self._shutdown.emit()
        self.thread.wait()
