"""The two long-lived worker threads of the GUI.

* :class:`Background` (Anki's ``QueryOp`` shape): one thread with its own Store runs DB
  work — loading transcripts, building requests for the meter and the inspector, search,
  import and export — and calls back on the GUI thread with the result or the error.
* :class:`ModelWorker` (Open Data Editor's shape, a ``QObject`` moved to a ``QThread``
  instead of subclassing it): the only owner of the model. It loads it and runs
  ``Agent.send``, emitting one signal per ``AgentEvent`` (napari's ``thread_worker``
  shape). Cancel is cooperative (a ``threading.Event``); the thread is never terminated.

Neither ever touches a widget. A sqlite3 connection belongs to the thread that opened it,
so each worker opens its own ``Store`` on the session's database file.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Qt, QThread, Signal, Slot

from iris_desktop.core.store import Store
from iris_desktop.core.views import counter_for
from iris_desktop.settings import BUNDLED, Settings

log = logging.getLogger("iris.ui.workers")


# -- DB work -------------------------------------------------------------------------------


class DbContext:
    """What a background job gets: the worker thread's Store and the session."""

    def __init__(self, session: Any, store: Store):
        self.session = session
        self.store = store
        self._tiktoken = None

    def counter(self, settings: Settings | None = None):
        """The counter for ``settings`` (never loads a model; see views.counter_for)."""
        return counter_for(settings or self.session.settings, self.session.model, self.tiktoken)

    def tiktoken(self):
        if self._tiktoken is None:
            from iris_desktop.core.tokens import TiktokenCounter

            self._tiktoken = TiktokenCounter()
        return self._tiktoken


@dataclass
class Job:
    fn: Callable[[DbContext], Any]
    on_success: Callable[[Any], None] | None
    on_failure: Callable[[BaseException], None] | None
    key: str | None
    seq: int
    result: Any = None
    error: BaseException | None = None
    skipped: bool = False


class _DbRunner(QObject):
    finished = Signal(object)

    def __init__(self, session: Any, latest: dict[str, int]):
        super().__init__()
        self.session = session
        self.latest = latest
        self.context: DbContext | None = None

    @Slot(object)
    def run(self, job: Job) -> None:
        if job.key is not None and self.latest.get(job.key) != job.seq:
            job.skipped = True  # a newer job with the same key is queued: this one is stale
        else:
            try:
                if self.context is None:
                    self.context = DbContext(self.session, Store(self.session.paths.db_path))
                job.result = job.fn(self.context)
            except Exception as exc:  # one place for errors: the job's on_failure
                log.exception("background job failed")
                job.error = exc
        self.finished.emit(job)

    @Slot()
    def stop(self) -> None:
        if self.context is not None:
            self.context.store.close()
            self.context = None
        QThread.currentThread().quit()


class Background(QObject):
    """Run ``fn(ctx)`` on the DB thread; ``on_success(result)`` back on the GUI thread.

    Jobs run one at a time in order. Jobs sharing a ``key`` coalesce: only the newest
    runs (typing in the composer asks for many meter updates; only the last matters).
    """

    _submit = Signal(object)
    _stop = Signal()

    def __init__(self, session: Any, parent: QObject | None = None):
        super().__init__(parent)
        self._latest: dict[str, int] = {}
        self._seq = itertools.count(1)
        self._pending = 0
        self._thread = QThread()
        self._thread.setObjectName("iris-db")
        self._runner = _DbRunner(session, self._latest)
        self._runner.moveToThread(self._thread)
        self._submit.connect(self._runner.run)
        self._stop.connect(self._runner.stop)
        # queued: callbacks always run on the GUI thread, never on the DB thread
        self._runner.finished.connect(self._done, Qt.ConnectionType.QueuedConnection)
        self._thread.start()
        self._closed = False

    @property
    def idle(self) -> bool:
        return self._pending == 0

    def run(
        self,
        fn: Callable[[DbContext], Any],
        on_success: Callable[[Any], None] | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
        key: str | None = None,
    ) -> None:
        if self._closed:
            return
        job = Job(fn, on_success, on_failure, key, next(self._seq))
        if key is not None:
            self._latest[key] = job.seq
        self._pending += 1
        self._submit.emit(job)

    @Slot(object)
    def _done(self, job: Job) -> None:
        self._pending -= 1
        if job.skipped or self._closed:
            return
        if job.key is not None and self._latest.get(job.key) != job.seq:
            return  # superseded while it ran
        if job.error is not None:
            if job.on_failure is not None:
                job.on_failure(job.error)
        elif job.on_success is not None:
            job.on_success(job.result)

    def close(self) -> None:
        """Finish the queued jobs, close the thread's Store and stop the thread."""
        if self._closed:
            return
        self._closed = True
        self._stop.emit()
        self._thread.wait()


# -- the model -----------------------------------------------------------------------------


@dataclass
class SendJob:
    thread_id: int | None  # None: start a new thread
    text: str
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


def model_info(model: Any) -> dict[str, Any]:
    """Plain facts about a loaded model for the status bar and About."""
    info = getattr(model, "info", None)
    path = getattr(model, "path", None)
    chat_format = getattr(model, "chat_format", None)
    return {
        "name": (getattr(info, "name", None) or (Path(path).stem if path else None)
                 or type(model).__name__),
        "file": Path(path).name if path else "",
        "path": str(path) if path else "",
        "n_ctx": int(getattr(model, "n_ctx", 0) or 0),
        "architecture": getattr(info, "architecture", "") or "",
        "file_type": getattr(info, "file_type", "") or "",
        "size_bytes": getattr(info, "size_bytes", 0) or 0,
        "chat_format": getattr(chat_format, "name", "") or "",
        "load_time_s": getattr(model, "load_time_s", None),
    }


class ModelWorker(QObject):
    """Owns the model on its own thread; runs one turn at a time."""

    loading = Signal(str)  # what is happening now, in words
    loaded = Signal(object)  # model_info dict
    loadFailed = Signal(str)
    threadCreated = Signal(int)
    agentEvent = Signal(object)  # core.agent.AgentEvent
    turnFinished = Signal(int)  # thread id
    shellQuestion = Signal(object)  # ShellQuestion
    stopped = Signal()

    def __init__(self, session: Any, runtime: Any = None, compactor_factory: Any = None):
        super().__init__()
        self.session = session
        self._runtime = runtime  # a ready runtime (tests: a ScriptedRuntime)
        self._compactor_factory = compactor_factory
        self._store: Store | None = None
        self._closing = threading.Event()
        self._cancel: threading.Event | None = None

    # -- loading --

    @Slot(object)
    def load(self, settings: Settings) -> None:
        """(Re)load the model for ``settings``; the old one is closed first."""
        session = self.session
        session.settings = settings
        old, session.model = session.model, None
        if old is not None and old is not self._runtime:
            old.close()
        if self._runtime is not None:
            session.model = self._runtime
            self.loaded.emit(model_info(self._runtime))
            return
        try:
            from iris_desktop.runtime.model import LocalModel

            if settings["model.path"] == BUNDLED:
                self.loading.emit("Preparing the bundled model…")
            path = session.model_path()
            self.loading.emit(f"Loading {path.name}…")
            model = LocalModel.load(
                path,
                n_ctx=settings["model.n_ctx"],
                n_threads=settings["model.n_threads"] or None,
                n_gpu_layers=settings["model.n_gpu_layers"],
            )
        except Exception as exc:  # a bad model must never take the app down
            session.model_error = str(exc)
            log.error("model: %s", exc)
            self.loadFailed.emit(str(exc))
            return
        session.model = model
        session.model_error = None
        self.loaded.emit(model_info(model))

    # -- one turn --

    def _db(self) -> Store:
        if self._store is None:
            self._store = Store(self.session.paths.db_path)
        return self._store

    def _confirm_shell(self, command: str) -> bool:
        """Called by the Sandbox on this thread; blocks until the GUI answers."""
        question = ShellQuestion(command)
        self.shellQuestion.emit(question)
        cancel = self._cancel
        while not question.answered.wait(0.05):
            if self._closing.is_set() or (cancel is not None and cancel.is_set()):
                return False
        return question.answer

    def agent(self, settings: Settings):
        from iris_desktop.core.agent import Agent, AgentConfig
        from iris_desktop.core.engine import ContextParams
        from iris_desktop.core.tools import Sandbox

        session = self.session
        model = session.model
        store = self._db()
        window, source = session.window(settings)
        counter = counter_for(settings, model)
        params = ContextParams.from_settings(settings, window, source)
        if self._compactor_factory is not None:
            compactor = self._compactor_factory(store, model, settings, counter)
        else:
            from iris_desktop.core.compaction import CompactionSettings, Compactor

            compactor = Compactor(store, counter, params, CompactionSettings.from_settings(settings),
                                  runtime=model)
        path = getattr(model, "path", None)
        return Agent(
            store,
            model,
            params,
            AgentConfig.from_settings(settings),
            sandbox=Sandbox(settings["tools.allowed_paths"], enabled=settings["tools.enabled"],
                            shell=settings["tools.shell"], confirm_shell=self._confirm_shell),
            compactor=compactor,
            counter=counter,
            model_name=Path(path).name if path else type(model).__name__,
        )

    @Slot(object)
    def send(self, job: SendJob) -> None:
        from iris_desktop.core.agent import AgentEvent

        thread_id = job.thread_id
        self._cancel = job.cancel
        try:
            if self.session.model is None:
                raise RuntimeError("no model is loaded")
            store = self._db()
            if thread_id is None:
                thread_id = store.create_thread("New chat")
                self.threadCreated.emit(thread_id)
            agent = self.agent(job.settings)
            for event in agent.send(thread_id, job.text, job.cancel):
                self.agentEvent.emit(event)
        except Exception as exc:  # the turn failed outside the agent's own handling
            log.exception("turn failed")
            tid = thread_id if thread_id is not None else -1
            self.agentEvent.emit(AgentEvent("error", tid, text=f"The turn failed: {exc}",
                                            data={"kind": "internal"}))
            self.agentEvent.emit(AgentEvent("done", tid, data={"finish_reason": "error"}))
        finally:
            self._cancel = None
        if thread_id is not None:
            self.turnFinished.emit(thread_id)

    @Slot()
    def shutdown(self) -> None:
        """Close the model (model.close()) and the Store, then end this thread's loop."""
        self.release()
        self.stopped.emit()
        QThread.currentThread().quit()

    def release(self) -> None:
        """Close the model and this worker's Store (on the thread that owns them)."""
        self._closing.set()
        model, self.session.model = self.session.model, None
        if model is not None and hasattr(model, "close"):
            try:
                model.close()
            except Exception:
                log.exception("closing the model")
        if self._store is not None:
            self._store.close()
            self._store = None


class ModelThread(QObject):
    """The GUI side of the model worker: starts the thread, forwards requests."""

    _load = Signal(object)
    _send = Signal(object)
    _shutdown = Signal()

    def __init__(self, session: Any, runtime: Any = None, compactor_factory: Any = None,
                 parent: QObject | None = None):
        super().__init__(parent)
        self.worker = ModelWorker(session, runtime, compactor_factory)
        self.thread = QThread()
        self.thread.setObjectName("iris-model")
        self.worker.moveToThread(self.thread)
        self._load.connect(self.worker.load)
        self._send.connect(self.worker.send)
        self._shutdown.connect(self.worker.shutdown)
        self.thread.start()
        self._closed = False

    def load(self, settings: Settings) -> None:
        self._load.emit(settings)

    def send(self, job: SendJob) -> None:
        self._send.emit(job)

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
