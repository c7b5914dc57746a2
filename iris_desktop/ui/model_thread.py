"""The model thread (Open Data Editor's shape: a ``QObject`` moved to a ``QThread``
instead of subclassing it). :class:`ModelWorker` is the only owner of the model: it
loads and closes it and runs every generation. A turn runs ``Agent.send`` from the
planner the GUI handed over with the message, and each typed event (``core.events``) is
emitted as one signal (napari's ``thread_worker`` shape). Cancel is cooperative (a
``threading.Event``); the thread is never terminated.

The GUI thread keeps a reference to the loaded runtime only inside its planner, which
calls the runtime's counting methods; those are safe from any thread and fail cleanly
once the model is closed (see ``runtime.model.LocalModel``).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot

from iris_desktop.core.events import CompactionFinished, TurnDone, TurnFailed
from iris_desktop.core.planner import Planner
from iris_desktop.core.session import load_model
from iris_desktop.core.store import Store
from iris_desktop.paths import AppPaths
from iris_desktop.runtime.embedder import Embedder, embedding_model_path
from iris_desktop.runtime.kv_store import KVStateStore, ThreadCache
from iris_desktop.settings import BUNDLED, Settings

log = logging.getLogger("iris.ui.model")


@dataclass(frozen=True)
class SendJob:
    """One message to answer: the thread (None: a new one), the text, and the planner
    (settings snapshot and model) it is planned with."""

    thread_id: int | None
    text: str
    planner: Planner
    cancel: threading.Event = field(default_factory=threading.Event)
    #: a prefill's planned request (the draft's)
    request: Any = None


@dataclass(frozen=True)
class LoadJob:
    """A model to load for ``settings``; setting ``cancel`` stops the load."""

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


class Waiting:
    """How many jobs are queued for the model thread (counted across threads). A warm-up
    polls ``is_set()`` as its cancel: true as soon as anything else waits."""

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
    """What the GUI learns of a loaded model: the runtime and the embedder (for its
    planner), and facts."""

    runtime: Any
    info: dict[str, Any]
    embedder: Any = None


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
        "context_length": getattr(info, "context_length", None),
        "base_model": bool(getattr(model, "base_model", False)),
        "architecture": getattr(info, "architecture", "") or "",
        "file_type": getattr(info, "file_type", "") or "",
        "size_bytes": getattr(info, "size_bytes", 0) or 0,
        "chat_format": getattr(chat_format, "name", "") or "",
        "load_time_s": getattr(model, "load_time_s", None),
        # where the conversation goes: "local", or "server: host:port" (and its address)
        "where": getattr(model, "where", "local"),
        "base_url": getattr(model, "base_url", None),
        "license": model_license(path, getattr(info, "metadata", None) or {}),
    }


def model_license(path: Any, metadata: dict[str, Any]) -> str:
    """The model's license: the bundled model's is known; another file's is what its
    GGUF header says (``general.license``), if anything."""
    from iris_desktop.runtime.bundled import BUNDLED_MODEL

    if path and Path(path).name == BUNDLED_MODEL.file_name:
        return f"{BUNDLED_MODEL.license} ({BUNDLED_MODEL.license_url})"
    named = metadata.get("general.license")
    return str(named) if named else "not stated in the file; see where it came from"


class ModelWorker(QObject):
    """Owns the model on its own thread; runs one turn at a time."""

    loading = Signal(str)  # what is happening now, in words
    loaded = Signal(object)  # LoadedModel
    loadProgress = Signal(float)  # 0..1 of the weights loaded
    loadFailed = Signal(str)
    threadCreated = Signal(int)
    turnEvent = Signal(object)  # a core.events TurnEvent
    turnFinished = Signal(int)  # thread id
    shellQuestion = Signal(object)  # ShellQuestion
    cacheStatus = Signal(str)  # "Warming up… 40%", "Prefilled", "Restored from cache"

    def __init__(self, paths: AppPaths, runtime: Any = None, compact: bool = True):
        super().__init__()
        self.paths = paths
        self._scripted = runtime  # a ready runtime (tests: a ScriptedRuntime)
        self.compacts = compact  # False: no compaction in turns (a scripted runtime)
        self.model: Any = None
        self.embedder: Any = None
        self.cache: ThreadCache | None = None
        self._store: Store | None = None
        self._closing = threading.Event()
        self._cancel: threading.Event | None = None
        #: jobs queued behind the one running: a warm-up or a prefill under way stops
        #: between two graph nodes as soon as anything else is waiting
        self.waiting = Waiting()

    # -- loading --

    @Slot(object)
    def load(self, job: LoadJob) -> None:
        """Load the model for ``job.settings``. The model in use keeps running until the
        new one has loaded, so a load that fails or is cancelled changes nothing (for a
        moment both are in memory)."""
        self.waiting.started()
        settings = job.settings
        if self._scripted is not None:
            self._close_model()
            self.model = self._scripted
            self.loaded.emit(LoadedModel(self.model, model_info(self.model)))
            return
        try:
            if settings["model.path"] == BUNDLED:
                self.loading.emit("Preparing the bundled model…")
            self.loading.emit("Loading the model…")
            model = load_model(settings, self.paths, progress=self.loadProgress.emit,
                               cancel=job.cancel)
        except Exception as exc:  # a bad model must never take the app down
            log.error("model: %s", exc)
            self.loadFailed.emit(str(exc))
            return
        self._close_model()
        self.model = model
        limit = settings["model.kv_cache_mb"] * 2**20
        self.cache = ThreadCache(KVStateStore(self.paths.kv_cache_dir, limit), model)
        self.loaded.emit(LoadedModel(model, model_info(model), self._load_embedder(settings)))

    def _load_embedder(self, settings: Settings) -> Any:
        """The small embedding model for recall by meaning, loaded once (it does not
        depend on the chat model); None when semantic recall is off or cannot load."""
        if not settings["context.recall_semantic"]:
            return None
        if self.embedder is None:
            try:
                self.embedder = Embedder.load(embedding_model_path(self.paths.models_dir))
            except Exception as exc:  # recall by words still works: say why, go on
                log.warning("semantic recall is off: %s", exc)
        return self.embedder

    def _close_model(self) -> None:
        if self.cache is not None:
            self.cache.leave()  # each thread keeps its KV state across a reload or quit
            self.cache = None
        model, self.model = self.model, None
        if model is not None and model is not self._scripted and hasattr(model, "close"):
            try:
                model.close()
            except Exception:
                log.exception("closing the model")

    # -- one turn --

    def _db(self) -> Store:
        if self._store is None:
            self._store = Store(self.paths.db_path)
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

    @Slot(object)
    def send(self, job: SendJob) -> None:
        self.waiting.started()
        thread_id = job.thread_id
        self._cancel = job.cancel
        try:
            if self.model is None or job.planner.runtime is not self.model:
                raise RuntimeError("no model is loaded")
            store = self._db()
            if thread_id is None:
                thread_id = store.create_thread("New chat")
                self.threadCreated.emit(thread_id)
            self._enter(thread_id)
            agent = job.planner.agent(store, confirm_shell=self._confirm_shell,
                                      compact=self.compacts)
            compacted = False
            for event in agent.send(thread_id, job.text, job.cancel):
                compacted = compacted or isinstance(event, CompactionFinished)
                self.turnEvent.emit(event)
                if isinstance(event, TurnDone) and compacted and event.next_request:
                    self._warm(event.next_request)
        except Exception as exc:  # the turn failed outside the agent's own handling
            log.exception("turn failed")
            tid = thread_id if thread_id is not None else -1
            self.turnEvent.emit(TurnFailed(tid, f"The turn failed: {exc}", "internal"))
            self.turnEvent.emit(TurnDone(tid, "error"))
        finally:
            self._cancel = None
        if thread_id is not None:
            self.turnFinished.emit(thread_id)

    # -- work done while the user reads and types --

    def _enter(self, thread_id: int | None) -> None:
        if self.cache is not None and self.cache.enter(thread_id):
            self.cacheStatus.emit("Restored from cache")

    def _warm(self, request: Any, label: str = "Warming up") -> None:
        """Evaluate ``request``'s prompt now, at idle (after a compaction, or for a draft),
        so that the next send evaluates only what is new. Gives way to any queued job."""
        prefill = getattr(self.model, "prefill", None)
        if prefill is None:
            return
        try:
            stats = prefill(request.messages, request.tool_definitions or None,
                            cancel=self.waiting, progress=lambda done, total: self.cacheStatus
                            .emit(f"{label}… {100 * done // max(total, 1)}%"))
        except Exception as exc:  # a warm-up is an optimisation: never a failure
            log.info("warm-up skipped: %s", exc)
            return
        if not stats.stopped:
            self.cacheStatus.emit("Prefilled" if label == "Prefilling" else "Ready (warmed up)")

    @Slot(object)
    def prefill(self, job: SendJob) -> None:
        """Evaluate the request planned for the draft while the user types."""
        self.waiting.started()
        if self.waiting.is_set():
            return  # a newer draft or a send is queued: this draft is stale
        if self.model is None or job.planner.runtime is not self.model or job.request is None:
            return
        self._enter(job.thread_id)
        self._warm(job.request, "Prefilling")

    @Slot(object)
    def compact(self, job: SendJob) -> None:
        """Compact ``job.thread_id`` now (Compact now), whatever the triggers and the
        circuit breaker say; reported like a turn, ending with TurnDone."""
        self.waiting.started()
        thread_id = job.thread_id
        self._cancel = job.cancel
        try:
            store = self._db()
            compactor = job.planner.compactor(store)
            for event in compactor.run_events(thread_id, "manual", job.cancel, force=True):
                self.turnEvent.emit(event)
            planned = job.planner.plan_or_error(store, thread_id)
            self.turnEvent.emit(TurnDone(thread_id, "stop", next_request=None
                                         if isinstance(planned, Exception) else planned))
        except Exception as exc:  # a compaction bug must not take the app down
            log.exception("compaction failed")
            self.turnEvent.emit(TurnFailed(thread_id, f"Compaction failed: {exc}", "internal"))
            self.turnEvent.emit(TurnDone(thread_id, "error"))
        finally:
            self._cancel = None
        self.turnFinished.emit(thread_id)

    @Slot()
    def shutdown(self) -> None:
        """Close the model and the Store, then end this thread's loop."""
        self.release()
        QThread.currentThread().quit()

    def release(self) -> None:
        """Close the model and this worker's Store (on the thread that owns them)."""
        self._closing.set()
        self._close_model()
        if self.embedder is not None:
            self.embedder.close()
            self.embedder = None
        if self._store is not None:
            self._store.close()
            self._store = None


class ModelThread(QObject):
    """The GUI side of the model worker: starts the thread, forwards requests."""

    _load = Signal(object)
    _send = Signal(object)
    _compact = Signal(object)
    _prefill = Signal(object)
    _shutdown = Signal()

    def __init__(self, worker: ModelWorker, parent: QObject | None = None):
        super().__init__(parent)
        self.worker = worker
        self.thread = QThread()
        self.thread.setObjectName("iris-model")
        self.worker.moveToThread(self.thread)
        self._load.connect(self.worker.load)
        self._send.connect(self.worker.send)
        self._compact.connect(self.worker.compact)
        self._prefill.connect(self.worker.prefill)
        self._shutdown.connect(self.worker.shutdown)
        self.thread.start()
        self._closed = False

    def load(self, settings: Settings) -> LoadJob:
        """Queue a load; the returned job's ``cancel`` stops it."""
        job = LoadJob(settings)
        self.worker.waiting.queued()
        self._load.emit(job)
        return job

    def send(self, job: SendJob) -> None:
        """A send never waits for a warm-up: the one under way stops at once."""
        self.worker.waiting.queued()
        self._send.emit(job)

    def compact(self, job: SendJob) -> None:
        self.worker.waiting.queued()
        self._compact.emit(job)

    def prefill(self, job: SendJob) -> None:
        self.worker.waiting.queued()  # a prefill for an older draft gives way to this one
        self._prefill.emit(job)

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
