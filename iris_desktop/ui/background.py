"""The DB thread (Anki's ``QueryOp`` shape): one long-lived thread with its own Store
runs DB work — loading transcripts, planning requests for the meter and the inspector,
search, import and export — and calls back on the GUI thread with the result or the
error. It never touches a widget, and a job never touches the model: requests come from
the planner a job was given (its counting methods are safe from any thread).

A sqlite3 connection belongs to the thread that opened it, so this thread has its own
``Store``, from the host's connections (``core.store.Stores``): the one owner of the
process's connections opens it on this thread and closes it when the thread stops.
"""

from __future__ import annotations

import itertools
import logging
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QObject, Qt, QThread, Signal, Slot

from iris_desktop.core.attachments import AttachmentError, NotTextError
from iris_desktop.core.conversation import ConversationFormatError
from iris_desktop.core.store import Store, StoreError, Stores, ThreadGone, explain

log = logging.getLogger("iris.ui.background")

#: what a job raises when it refuses the user's file (not a conversation, not text, gone,
#: not readable, a folder): the job's on_failure says it, and the log keeps one line, not
#: a traceback (before, an import of a Markdown file logged "ERROR background job failed"
#: and 20 lines as if Iris had a bug); any other error keeps its traceback
REFUSALS: tuple[type[BaseException], ...] = (ConversationFormatError, AttachmentError,
                                            NotTextError, FileNotFoundError, PermissionError,
                                            IsADirectoryError)
#: keys of jobs that only read: a newer job of the same key stops one of them mid-query
#: (a search for "a" ran seconds after the box said "ab", holding every job behind it)
CANCELLABLE = frozenset({"search"})
#: SQLite VM steps between two looks at whether a cancellable job is stale
CHECK_EVERY = 1_000


@dataclass
class Job:
    fn: Callable[[Store], Any]
    on_success: Callable[[Any], None] | None
    on_failure: Callable[[BaseException], None] | None
    key: str | None
    seq: int
    result: Any = None
    error: BaseException | None = None
    skipped: bool = False


class _DbRunner(QObject):
    finished = Signal(object)

    def __init__(self, stores: Stores, latest: dict[str, int]):
        super().__init__()
        self.stores = stores
        self.latest = latest

    @Slot(object)
    def run(self, job: Job) -> None:
        if job.key is not None and self.latest.get(job.key) != job.seq:
            job.skipped = True  # a newer job with the same key is queued: this one is stale
        else:
            try:
                job.result = self._call(job)
            except ThreadGone as exc:  # deleted since the job was asked for: no fault here
                log.info("background job skipped: %s (deleted meanwhile)", exc)
                job.error = exc
            except sqlite3.Error as exc:  # said here: explaining may read the file
                if isinstance(exc, sqlite3.OperationalError) and self._stale(job):
                    job.skipped = True  # stopped by its progress handler: a newer one is asked for
                else:
                    log.exception("background job failed")
                    job.error = StoreError(explain(exc, self.stores.path))
            except REFUSALS as exc:  # the user's file or input refused, said by on_failure:
                log.warning("background job refused: %s", exc)  # not logged as a bug
                job.error = exc
            except Exception as exc:  # one place for errors: the job's on_failure
                log.exception("background job failed")
                job.error = exc
        self.finished.emit(job)

    def _stale(self, job: Job) -> bool:
        return job.key in CANCELLABLE and self.latest.get(job.key) != job.seq

    def _call(self, job: Job) -> Any:
        """``job.fn`` on this thread's Store; a CANCELLABLE job with a progress handler
        that stops its query once a newer job of its key is asked for."""
        store = self.stores.current()
        if job.key not in CANCELLABLE:
            return job.fn(store)
        with store.stopping_when(lambda: self._stale(job), CHECK_EVERY):
            return job.fn(store)

    @Slot()
    def stop(self) -> None:
        self.stores.release()
        QThread.currentThread().quit()


class Background(QObject):
    """Run ``fn(store)`` on the DB thread; ``on_success(result)`` back on the GUI thread.

    Jobs run one at a time in order. Jobs sharing a ``key`` coalesce: only the newest
    runs (typing in the composer asks for many meter updates; only the last matters); a
    running job of a CANCELLABLE key ("search") is stopped mid-query by a newer one.
    """

    _submit = Signal(object)
    _stop = Signal()

    def __init__(self, stores: Stores, parent: QObject | None = None, name: str = "iris-db"):
        super().__init__(parent)
        self.stores = stores
        self._latest: dict[str, int] = {}
        self._seq = itertools.count(1)
        self._pending = 0
        #: queued or running jobs per key (the semantic indexer chains its batches)
        self._pending_by_key: dict[str, int] = {}
        self._thread = QThread()
        self._thread.setObjectName(name)
        self._runner = _DbRunner(stores, self._latest)
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

    def idle_except(self, *keys: str) -> bool:
        """No job is queued or running but those under ``keys`` (for example the
        background embedding of a long thread, which may go on for minutes)."""
        return self._pending == sum(self._pending_by_key.get(k, 0) for k in keys)

    def run(
        self,
        fn: Callable[[Store], Any],
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
        if key is not None:
            self._pending_by_key[key] = self._pending_by_key.get(key, 0) + 1
        self._submit.emit(job)

    @Slot(object)
    def _done(self, job: Job) -> None:
        self._pending -= 1
        if job.key is not None:
            self._pending_by_key[job.key] -= 1
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
