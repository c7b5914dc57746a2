"""The host: the one place that runs Iris, for the command line and the desktop app.

A :class:`Host` owns what a turn needs around the engine: the data folder and the
settings, the database's connections (one Store per thread, ``core.store.Stores``), the
runtime (a local model or a server, ``runtime``), the embedder for recall by meaning, the
threads' saved KV states and the thread lifecycle (open, leave, delete). Its operations
are generators of the typed events of ``core.events``:

* :meth:`Host.send` runs one turn (the agent: plan → compact if due → stream → store),
  then warms the new prefix up after a compaction; :meth:`Host.regenerate`,
  :meth:`Host.edit` and :meth:`Host.continue_reply` run the other kinds of turn (a new
  alternative reply, a new branch, a stopped reply going on);
* :meth:`Host.compact` compacts a thread now;
* :meth:`Host.prefill` evaluates a draft's request while the user types.

How far the model has read a prompt the user waits for cannot be yielded while it reads:
``PromptProgress`` events arrive through the operations' ``progress`` callback instead,
on the same thread.

Which runtime the settings name, and making it (the bundled model's first set-up, a
server's connect), is :mod:`iris_desktop.host_models`; what a load is doing goes to its
``stage`` and ``progress`` callbacks, in the same words for both faces.

The CLI (``commands``) is a print loop over them; the GUI's model thread
(``ui.model_thread``) runs them on its thread and turns each event into a signal. Neither
loads a model, an embedder or a KV store itself.

Layers: the host imports ``core`` and ``runtime``; they never import each other (a test
checks it). No Qt here.

Threads: make a Host on any thread. Everything that touches the runtime (loading, the
turn operations, opening and leaving threads) runs on one thread, the *model thread*
(the CLI's main thread, the GUI's model thread); ``store`` is the calling thread's own
Store; ``settings`` may be replaced between operations (each turn gets its planner).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from iris_desktop.core.agent import DEFAULT_TITLE, Agent
from iris_desktop.core.attachments import Attachment
from iris_desktop.core.compaction import Compactor
from iris_desktop.core.engine import ContextRequest
from iris_desktop.core.events import (
    CacheStatus,
    CompactionFinished,
    PromptProgress,
    ReplySaved,
    ReplyStarted,
    ThreadCreated,
    TurnDone,
    TurnEvent,
    TurnFailed,
)
from iris_desktop.core.planner import Planner, n_ctx_to_load
from iris_desktop.core.ports import ChatModel
from iris_desktop.core.semantic import BATCH
from iris_desktop.core.store import Store, StoreError, ThreadGone, explain, open_stores
from iris_desktop.core.store.cipher import is_encrypted, no_conversion, salt
from iris_desktop.core.store.messages import unwritten_ends
from iris_desktop.core.tools import Sandbox
from iris_desktop.core.turns import Turn, TurnOptions
from iris_desktop.files import clean_leftovers
from iris_desktop.host_models import (
    GPU_CHECKS_FILE,
    LOAD_STAGES,
    StageWords,
    bundled_model_path,
    connect_server,
    connect_words,
    load_runtime,
    load_time_words,
    model_path_for,
    model_problems,
    stage_words,
)
from iris_desktop.host_storage import prepare_privately
from iris_desktop.paths import AppPaths, app_paths
from iris_desktop.reasons import plain_reason as plain_reason
from iris_desktop.runtime.kv_store import KVStateStore, ThreadCache, can_seal
from iris_desktop.runtime.loading import GpuRoom
from iris_desktop.runtime.model import ModelError
from iris_desktop.runtime.protocol import Runtime
from iris_desktop.settings import SETTINGS, Settings, SettingsError, load_settings
from iris_desktop.stop import Stop, StopEvent
from iris_desktop.storage_key import (
    AskPassphrase,
    Prepared,
    follow_history,
    keep_key,
    kv_key,
)
from iris_desktop.untrusted import show_untrusted

if TYPE_CHECKING:  # loaded lazily: numpy and the embedding model only when recall wants them
    from iris_desktop.core.semantic import TextEmbedder
    from iris_desktop.runtime.reranker import CrossEncoder

#: recall's embedding models, by their ``context.recall_embedder`` names
EMBEDDERS = SETTINGS["context.recall_embedder"].choices
#: planners kept by :meth:`Host.planner` (the settings in use and a few previews)
PLANNERS_KEPT = 8

log = logging.getLogger("iris.host")

__all__ = [
    "GPU_CHECKS_FILE",
    "Host",
    "LOAD_STAGES",
    "ModelError",
    "build_agent",
    "build_compactor",
    "build_sandbox",
    "bundled_model_path",
    "connect_server",
    "connect_words",
    "load_runtime",
    "load_time_words",
    "model_path_for",
    "model_problems",
    "StageWords",
    "stage_words",
]


# -- what a turn is made of ----------------------------------------------------------------


def build_sandbox(planner: Planner, confirm_shell: Callable[[str], bool] | None = None) -> Sandbox:
    """The tools of ``planner``'s settings; ``confirm_shell(command)`` asks the user
    before every shell command (None: every one is refused)."""
    return Sandbox.from_config(planner.tools, confirm_shell)


def summarizer_for(planner: Planner) -> ChatModel | None:
    """The runtime that writes summaries, or None for the extractive summarizer: a base
    model cannot follow the summary instructions, so ``auto`` skips it."""
    choice = planner.compaction.summarizer
    runtime = planner.runtime
    if choice == "extractive" or runtime is None:
        return None
    if choice == "auto" and runtime.base_model:
        return None
    return runtime


def build_compactor(planner: Planner, store: Store, runtime: ChatModel | None = None,
                    progress: Callable[[PromptProgress], None] | None = None) -> Compactor:
    """A Compactor on ``store``: the LLM path on ``runtime`` (default: the planner's, as
    ``context.summarizer`` allows), else only the extractive summarizer."""
    return Compactor(store, planner, runtime=runtime if runtime is not None else summarizer_for(planner),
                     progress=progress)


def build_agent(planner: Planner, store: Store, *, confirm_shell: Callable[[str], bool] | None = None,
                compact: bool = True, progress: Callable[[PromptProgress], None] | None = None,
                give_way: Stop | None = None) -> Agent:
    """An Agent on ``store`` and the planner's runtime (which must be loaded: RuntimeError).
    ``compact=False``: no compaction at all (a scripted runtime writes no summary).
    ``progress`` is told how far the model has read each prompt, as it reads;
    ``give_way`` stops a model-written summary after a reply when the user waits for the
    model (the extractive summary is used)."""
    return Agent(store, planner, sandbox=build_sandbox(planner, confirm_shell),
                 compactor=build_compactor(planner, store, progress=progress) if compact else None,
                 progress=progress, give_way=give_way)


# -- the host ------------------------------------------------------------------------------


class Host:
    """One user's Iris: folders, settings, the database and, on the model thread, the
    runtime, the embedder and the threads' KV states.

    ``runtime``: a ready runtime to use instead of loading one (the tests' scripted
    runtime; it is never closed here); ``compact`` False: turns never compact (a scripted
    runtime writes no summary). ``ask_passphrase``: how to ask the user for the passphrase
    of an encrypted history (``storage_key.AskPassphrase``; None: nobody to ask). Raises
    paths.DataDirError (a folder that cannot be made or written) and store.StoreError (a
    database that cannot be used, or a wrong key), each saying what to do.
    """

    def __init__(
        self,
        data_dir: str | Path | None = None,
        overrides: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        settings: Settings | None = None,
        *,
        runtime: Runtime | None = None,
        compact: bool = True,
        ask_passphrase: AskPassphrase | None = None,
    ):
        self.paths: AppPaths = app_paths(data_dir).ensure()
        # settings problems are the caller's to show (the CLI prints, the GUI logs), once
        self.settings = settings or load_settings(self.paths.config_path, env, overrides)
        # recovery: what salvaging a damaged database saved (None: it was sound); the CLI
        # and the GUI tell the user
        # storage.encrypt: the key decided (and the database converted) before it opens
        # left at its default, the setting follows the file: a start that lacks it (a
        # launcher without the shell's IRIS_STORAGE_ENCRYPT) never decrypts the history
        wanted = (bool(self.settings["storage.encrypt"])
                  if self.settings.source("storage.encrypt") != "default" else None)
        # memory kept private while encrypted, decided again once a put-back cut off is finished
        self.storage: Prepared = prepare_privately(self.paths, wanted, env, ask_passphrase)
        db = self.paths.db_path
        with no_conversion(db):  # none starts until this connection (and its -wal) is open
            state = is_encrypted(db)
            if (state is True and self.storage.key is None) or (
                    state is False and self.storage.key is not None):
                raise StoreError(f"another Iris process encrypted or decrypted {db} while this "
                                 "one started; start Iris again")
            self.stores, self.recovery = open_stores(db, self.storage.key)
        self.follow_history(self.settings)  # the dialog shows what the history is
        if self.recovery is not None:  # the salvaged copy has a salt of its own
            keep_key(self.paths.db_path, self.storage.key, salt(self.store.conn))
        self._kv_secret: bytes | None = None
        try:  # (a full disk or a read-only file leaves them unmarked: read as interrupted)
            interrupted = self.store.mark_interrupted_streams()
            #: (thread id, title) of the chats whose reply this start found cut off by a crash
            self.cut_by_crash = self.store.chats_of(interrupted)
            first = self.store.messages_by_id(interrupted[:1]).get(interrupted[0]) \
                if interrupted else None
        except sqlite3.Error as exc:
            self.stores.close()
            raise StoreError(explain(exc, self.paths.db_path)) from None
        if interrupted:
            log.warning("%d reply(ies) cut off by an earlier crash marked interrupted",
                        len(interrupted))
        #: the first cut-off reply has no text yet (cut before its first token): it can be
        #: answered again, not continued
        self.cut_empty = first is not None and not first.get("content")
        #: replies of this process's turns that ended without their last save (a full
        #: disk): marked when the turn ends, or at the latest when the host is released
        self._unended: dict[int, str] = {}
        # a KV save killed mid-write leaves a copy of a chat's tokens: gone at start, not
        # only when a model loads (encryption may have been turned on since)
        clean_leftovers(self.paths.kv_cache_dir, ".*.tmp")
        # and a killed `config set` or other whole-file write in the data folder (a copy
        # of config.toml outlived every later start)
        clean_leftovers(self.paths.data_dir)
        self._ready = runtime
        #: a server on another machine gets nothing of the chat until the face says so
        #: (the window: once the user agreed): set before the runtime is in use, so no
        #: planner made meanwhile counts through it. The CLI sends only on its commands.
        self.hold_remote = False
        self.compacts = compact
        self.runtime: Runtime | None = None
        self.model_error: str | None = None
        self.embedder: TextEmbedder | None = None
        #: the embedder the stored vectors came from before :attr:`embedder` (all-MiniLM-L6-v2),
        #: searched while they are re-embedded (:meth:`reembed_for_recall`); None once done
        self.previous_embedder: TextEmbedder | None = None
        #: every embedder loaded so far, by its ``context.recall_embedder`` name (None: failed)
        self._embedders: dict[str, TextEmbedder | None] = {}
        self.reranker: CrossEncoder | None = None
        #: why recall does not rerank although ``context.recall_rerank`` asks (one sentence)
        self.reranker_problem: str | None = None
        #: why recall by meaning does not use the embedder ``context.recall_embedder``
        #: names (its files missing or damaged), in one sentence; None when it does
        self.embedder_problem: str | None = None
        #: why each of recall's embedders that failed to load did not, by name (the
        #: loader's sentence: the file, the sha256 it should have, how to reinstall)
        self.embedder_errors: dict[str, str] = {}
        self.cache: ThreadCache | None = None
        #: planner memo: settings key → (runtime, embedder, planner) (see :meth:`planner`)
        self._planners: dict[tuple, tuple[Any, Any, Planner]] = {}
        self._planners_lock = threading.Lock()

    @property
    def encrypted(self) -> bool:
        """Whether the history is encrypted (``storage.encrypt``)."""
        return self.storage.key is not None

    def kv_secret(self) -> bytes | None:
        """The KV states' key while the history is encrypted (derived once, when first
        needed: a passphrase's KDF takes a moment); None when plain, or when the
        ``cryptography`` package is missing (then no KV state is saved at all)."""
        if self.storage.key is None or not can_seal():
            return None
        if self._kv_secret is None:
            self._kv_secret = kv_key(self.storage.key, salt(self.store.conn))
        return self._kv_secret

    @property
    def store(self) -> Store:
        """The calling thread's Store (a sqlite3 connection belongs to one thread)."""
        return self.stores.current()

    def release(self) -> None:
        """Close what the model thread owns: the runtime (the open thread's KV state is
        saved first), the embedder and the calling thread's Store. Idempotent."""
        self.close_model()
        self._mark_ended()
        for embedder in self._embedders.values():
            if embedder is not None:
                embedder.close()
        self._embedders.clear()
        self.embedder = self.previous_embedder = None
        if self.reranker is not None:
            self.reranker.close()
            self.reranker = None
        self.stores.release()

    def _mark_ended(self) -> None:
        """Mark the replies this process knows ended but could not mark (a full disk):
        its turns' (:meth:`end_replies`) and earlier processes' (the start's). Never
        raises: the next start marks them otherwise (as cut off)."""
        if not self._unended and not unwritten_ends(self.paths.db_path):
            return  # (no Store opened for nothing: release may run after close)
        try:
            self.store.end_streams(self._unended)
        except Exception as exc:  # noqa: BLE001 - best effort, said in the log
            log.warning("replies that ended without their last save stay unmarked: %s", exc)
        self._unended.clear()

    def follow_history(self, settings: Settings) -> Settings:
        """``settings`` with storage.encrypt, when nothing sets it, as the history is
        (:func:`~iris_desktop.storage_key.follow_history`): for every load of them. Known
        from the key it was opened with, never by reading the file again: closing any
        descriptor of the database file drops this process's POSIX locks on it, which
        SQLite's open connection holds (another process then saw none of its writes)."""
        return follow_history(settings, encrypted=self.storage.key is not None)

    @property
    def crash_note(self) -> str | None:
        """What an earlier crash (a kill, a power cut) cut off, said once, by the start
        that found it: the window and the CLI said nothing, and the reply looked stopped
        by the user. Worded for what this start cannot tell apart: a kill, and a turn
        whose last save a full disk refused (whose process could not mark it either).
        Said again by each start while a full disk keeps it from being marked. None when
        nothing was. :meth:`crash_message` adds how to go on."""
        if not self.cut_by_crash:
            return None
        thread_id, title = self.cut_by_crash[0]
        more = len(self.cut_by_crash) - 1
        where = f"“{show_untrusted(title)}” (chat {thread_id})" + (
            f" and {more} other chat{'s' if more > 1 else ''}" if more else "")
        # not "a crash": a reply whose last save a full disk refused looks the same
        kept = "nothing of it was written yet" if self.cut_empty else "what it had written is kept"
        return (f"The reply in {where} was cut off before it was finished (Iris was closed or "
                f"killed, or the disk was full); {kept}")

    def crash_message(self, face: str = "cli") -> str | None:
        """:attr:`crash_note` with how to go on, in the words of ``face`` ("cli": the
        command; "window": the context menu): continue the reply, or (none of it was
        written) answer again (Continue refuses an empty reply). None when nothing was cut."""
        note = self.crash_note
        if note is None:
            return None
        if face == "window":
            return note + ("; open it and click Regenerate on the reply to answer again"
                           if self.cut_empty else
                           "; open it and click Continue on the reply to go on")
        thread_id = self.cut_by_crash[0][0]
        return note + (f"; 'iris-desktop chat --thread {thread_id} --regenerate' answers again"
                       if self.cut_empty else
                       f"; 'iris-desktop chat --thread {thread_id} --continue' goes on with it")

    @property
    def storage_note(self) -> str | None:
        """What this start did to the history's encryption, in a sentence the CLI and
        the window show (a history decrypted silently was the audit's finding); None when
        it did nothing (:func:`~iris_desktop.storage_key.storage_note`)."""
        from iris_desktop.storage_key import storage_note

        return storage_note(self.storage, self.paths.db_path, self.paths.config_path,
                            self.settings.source("storage.encrypt"))

    def close(self) -> None:
        """:meth:`release`, then close every Store of this process. Idempotent."""
        self.release()
        self.stores.close()

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the model ------------------------------------------------------------------------

    def model_path(self) -> Path:
        """The GGUF to load; the bundled one is assembled into the data dir on first use."""
        return model_path_for(self.settings, self.paths.models_dir)

    def load_model(self, settings: Settings | None = None, *,
                   progress: Callable[[float], Any] | None = None,
                   cancel: threading.Event | None = None,
                   stage: Callable[[str], Any] | None = None) -> Runtime:
        """Load the runtime ``settings`` (default: the host's) name and make it the one in
        use. The runtime in use keeps running until the new one has loaded, so a load that
        fails or is cancelled changes nothing (for a moment both are in memory), unless the
        new one's plan needs the GPU memory it holds: it is closed first then, and loaded
        again if the new one fails (``runtime.loading.GpuRoom``). Raises
        runtime.model.ModelError, runtime.remote.ServerError or SettingsError."""
        settings = settings or self.settings
        room = GpuRoom.of(self.runtime, self.close_model)
        try:
            runtime = self._ready if self._ready is not None else load_runtime(
                settings, self.paths, progress=progress, cancel=cancel, stage=stage, room=room)
        except Exception as exc:
            if room is not None and room.released:  # closed to make room: loaded again, or why not
                self._use(room.restore(exc, lambda: load_runtime(self._in_use, self.paths)), self._in_use)
            raise
        self._use(runtime, settings)
        return runtime

    def _use(self, runtime: Runtime, settings: Settings) -> None:
        if self.hold_remote and hasattr(runtime, "conversation_allowed") \
                and not getattr(runtime, "is_loopback", True):
            runtime.conversation_allowed = False  # the window lets it go once agreed to
        self.close_model()
        self.runtime, self._in_use = runtime, settings  # (the settings it was loaded with)
        self.model_error = None
        self.cache = ThreadCache(KVStateStore(self.paths.kv_cache_dir, self._kv_limit(settings),
                                              self.kv_secret()), runtime, owner_of=self._thread_owner)

    @property
    def settings(self) -> Settings:
        return self._settings

    @settings.setter
    def settings(self, settings: Settings) -> None:
        """New settings in force; ``model.kv_cache_mb`` at once (0 deletes the saved
        states: it used to wait for the next model load, and the next save still wrote)."""
        self._settings = settings
        cache = getattr(self, "cache", None)
        if cache is not None:
            cache.store.set_limit(self._kv_limit(settings))

    def _kv_limit(self, settings: Settings) -> int:
        if self.encrypted and self.kv_secret() is None:
            return 0  # no way to encrypt a KV state: none is written (it holds the conversation)
        return settings["model.kv_cache_mb"] * 2**20

    def try_load_model(self, stage: Callable[[str], Any] | None = None, *,
                       settings_errors: bool = False,
                       progress: Callable[[float], Any] | None = None) -> Runtime | None:
        """:meth:`load_model` (``stage`` hears its stages, ``progress`` their fractions), or
        remember why not in ``model_error`` and return None (the caller stays usable
        without a model). With ``settings_errors``, settings the model refuses
        (``model.n_ctx`` beyond what it was trained for) raise SettingsError instead: the
        CLI's usage error."""
        try:
            return self.runtime or self.load_model(stage=stage, progress=progress)
        except Exception as exc:  # a bad model must never take the app down
            if settings_errors and isinstance(exc, SettingsError):
                raise
            self.model_error = plain_reason(exc, self.paths.log_path)
            log.error("model: %s", exc)
            return None

    def close_model(self) -> None:
        """Save the open thread's KV state and close the runtime (a ready one stays open)."""
        if self.cache is not None:
            self.cache.leave()  # each thread keeps its KV state across a reload or quit
            self.cache = None
        runtime, self.runtime = self.runtime, None
        if runtime is not None and runtime is not self._ready:
            try:
                runtime.close()
            except Exception:
                log.exception("closing the model")

    def load_embedder(self, settings: Settings | None = None) -> TextEmbedder | None:
        """The small embedding model for recall by meaning (``context.recall_semantic``),
        the one ``context.recall_embedder`` names: all-MiniLM-L6-v2 (``minilm``) or
        bge-small-en-v1.5 (``bge-small``), each loaded once (they do not depend on the chat
        model); the other one where the named one's files are missing or damaged; None when
        recall by meaning is off or neither loads (recall then matches words only, and the
        log says why). Where the history holds the other model's vectors (from before a
        change), that model is :attr:`previous_embedder` until they are re-embedded
        (:meth:`reembed_for_recall`)."""
        settings = settings or self.settings
        self.load_reranker(settings)  # recall's models load together
        self.embedder_problem = None  # (a problem of settings since changed is no news)
        if not settings["context.recall_semantic"]:
            return None
        wanted = settings["context.recall_embedder"]
        other = next(name for name in EMBEDDERS if name != wanted)
        embedder = self._embedder_named(wanted)
        if embedder is None:
            embedder = self._embedder_named(other)
            why = self.embedder_errors.get(wanted, "it did not load")
            self.embedder_problem = (
                f"recall by meaning uses {embedder.identity.split('@')[0]}, not {wanted}: {why}"
                if embedder is not None else
                f"recall matches words only: neither embedding model loaded ({wanted}: {why})")
            log.warning("%s", self.embedder_problem)
        previous = None
        if embedder is not None and embedder is not self.embedder:
            stale = set(self.store.other_vector_models(embedder.identity))
            candidate = self._embedder_named(other) if stale else None
            if candidate is not None and candidate is not embedder and candidate.identity in stale:
                previous = candidate
        elif embedder is not None:
            previous = self.previous_embedder
        self.embedder, self.previous_embedder = embedder, previous
        return embedder

    def _embedder_named(self, name: str) -> TextEmbedder | None:
        """Recall's embedder ``name`` (one of :data:`EMBEDDERS`), loaded the first time it is
        asked for and kept until :meth:`close` (a background job may still be using it after
        a change); None, with the reason logged, where it cannot load."""
        if name not in self._embedders:
            try:
                from iris_desktop.runtime.embedder import load_recall_embedder

                self._embedders[name] = load_recall_embedder(name, self.paths.models_dir)
            except Exception as exc:  # recall by words still works: say why, go on
                log.warning("recall's embedding model %s did not load: %s", name, exc)
                self._embedders[name] = None
                self.embedder_errors[name] = plain_reason(exc, self.paths.log_path)
        return self._embedders[name]

    def load_reranker(self, settings: Settings | None = None) -> CrossEncoder | None:
        """The cross-encoder that reorders recall's candidates (``context.recall_rerank``),
        loaded once from its pinned files; None when that is off or it cannot load (a
        missing or damaged file: recall keeps its own order, and ``reranker_problem`` and
        the log say why in one sentence)."""
        settings = settings or self.settings
        if not settings["context.recall_rerank"]:
            return None
        if self.reranker is None and self.reranker_problem is None:
            from iris_desktop.runtime.reranker import CrossEncoder

            try:
                self.reranker = CrossEncoder.load()
            except Exception as exc:  # recall still works in its own order: say why, go on
                self.reranker_problem = f"recall is not reranked: {exc}"
                log.warning("%s", self.reranker_problem)
        return self.reranker

    def planner(self, settings: Settings | None = None, *, fallback: bool = False) -> Planner:
        """The request planner for ``settings`` (default: the host's) on the runtime in
        use (if any) and the embedder: the one constructor both faces use, memoised per
        settings, runtime and embedder, so the CLI's chat, the GUI's views and its turns
        share one planner and its plan cache. A ``context.window`` the model cannot hold
        raises SettingsError, or with ``fallback`` (the GUI: the settings may come from a
        file or the environment) uses the model's n_ctx, and ``planner.warning`` says so."""
        settings = settings or self.settings
        key = (tuple(sorted((k, repr(v)) for k, v in settings.values.items())), fallback)
        runtime, embedder, reranker = self.runtime, self.embedder, self.reranker
        previous = self.previous_embedder
        with self._planners_lock:
            hit = self._planners.get(key)
            if hit is not None and hit[0] is runtime and hit[1] is embedder and hit[2].reranker is (
                    reranker if settings["context.recall_rerank"] else None) and (
                    hit[2].previous_embedder is previous):
                return hit[2]
        try:
            planner = Planner.from_settings(settings, runtime, embedder=embedder, reranker=reranker,
                                            previous_embedder=previous)
        except SettingsError as exc:
            if not fallback:
                raise
            planner = Planner.from_settings(settings.with_overrides({"context.window": "auto"}),
                                            runtime, embedder=embedder, reranker=reranker,
                                            previous_embedder=previous)
            planner.warning = f"{exc} — using the model's n_ctx"
        with self._planners_lock:
            self._planners[key] = (runtime, embedder, planner)
            while len(self._planners) > PLANNERS_KEPT:  # settings previews come and go
                self._planners.pop(next(iter(self._planners)))
        return planner

    def candidate_planner(self, settings: Settings, current: Settings) -> Planner:
        """The planner candidate ``settings`` would make (the settings dialog's preview,
        ``current`` being the settings in use): with this model, unless they change what
        loading it would give (another file: no model; another ``model.n_ctx``: that
        window)."""
        same_file = settings["model.path"] == current["model.path"]
        if same_file and settings["model.n_ctx"] == current["model.n_ctx"]:
            return self.planner(settings)
        # as the load will (0 read as "not given" previewed 8,192)
        n_ctx = n_ctx_to_load(settings, getattr(getattr(self.runtime, "info", None),
                                                "context_length", None))
        return Planner.from_settings(settings, self.runtime if same_file else None,
                                     n_ctx=n_ctx if same_file else None,
                                     embedder=self.embedder, reranker=self.reranker,
                                     previous_embedder=self.previous_embedder)

    # -- threads --------------------------------------------------------------------------

    def create_thread(self, title: str = DEFAULT_TITLE) -> int:
        return self.store.create_thread(title)

    def open_thread(self, thread_id: int | None) -> int:
        """Make ``thread_id`` the thread in the KV cache: the one there before is saved,
        this one's saved state restored. Returns the prompt tokens restored (0: none)."""
        return self.cache.enter(thread_id) if self.cache is not None else 0

    def leave_thread(self) -> None:
        """Save the open thread's KV state (for the next process, or the next visit)."""
        if self.cache is not None:
            self.cache.leave()

    def _thread_owner(self, thread_id: int) -> str | None:
        """Who a saved KV state of ``thread_id`` belongs to: the chat with that id now (its
        id and creation time: a new chat given a deleted one's id is another owner), or
        None when there is no such chat (deleted, by this process or another)."""
        try:
            return f"{thread_id}@{self.store.thread(thread_id)['created_at']!r}"
        except KeyError:
            return None

    def delete_thread(self, thread_id: int) -> bool:
        """Delete a thread, on the user's explicit request only: its messages, summaries
        and requests with no readable trace left in the database files
        (``Store.delete_thread``: False while another program reading the history keeps
        its text in the file), and every saved KV state of it (a KV state holds the
        conversation's tokens). An open thread is left without saving. Raises KeyError
        for an unknown thread."""
        try:
            wiped = self.store.delete_thread(thread_id)
        except sqlite3.Error:
            try:
                self.store.thread(thread_id)
            except ThreadGone:  # committed, then its checkpoint refused (a full disk): the
                self._forget_kv(thread_id)  # chat is gone, and so go its KV states
            raise
        self._forget_kv(thread_id)
        return wiped

    def _forget_kv(self, thread_id: int) -> None:
        """The KV states of a deleted thread (a KV state holds its tokens)."""
        if self.cache is not None and self.cache.thread_id == thread_id:  # (once it is gone:
            self.cache.thread_id = None  # a delete that failed leaves the chat cached)
        KVStateStore.forget_in(self.paths.kv_cache_dir, thread_id)  # a store made applies its limit

    def drop_empty_thread(self, thread_id: int) -> bool:
        """Delete a chat made for a message that was never stored (refused, or a full
        disk): only while it holds no message, with its KV state; True when it went. Light
        enough for a full disk (nothing of a conversation to wipe)."""
        dropped = self.store.drop_empty_thread(thread_id)
        if dropped:
            self._forget_kv(thread_id)
        return dropped

    def pending_for_recall(self, thread_id: int, planner: Planner | None = None) -> int:
        """How many of the thread's summarized messages recall by meaning has no vector
        for yet (0 without an embedder or a summary)."""
        planner = planner or self.planner()
        summary = self.store.latest_summary(thread_id)
        if planner.embedder is None or summary is None:
            return 0
        return self.store.count_without_vector(thread_id, summary.covers_through_id,
                                               planner.embedder.identity)

    def index_for_recall(self, thread_id: int, planner: Planner | None = None, *,
                         store: Store | None = None, limit: int | None = None,
                         progress: Callable[[int], None] | None = None,
                         until: float | None = None) -> int:
        """Embed the thread's summarized messages that have no vector yet (recall only
        searches those), oldest first, with the planner's embedder (none: nothing);
        returns how many (never one past the summary: they were counted as summarized).
        The one indexing rule of both faces, on whichever thread calls it with that
        thread's ``store`` (default: the calling thread's): the CLI before it plans, the
        GUI's DB thread after each turn, ``limit`` messages a call, or (``until``, a
        ``time.monotonic()``) until then, a batch at least; ``progress`` is told the count
        after each batch."""
        store = store or self.store
        planner = planner or self.planner()
        summary = store.latest_summary(thread_id)
        if planner.embedder is None or summary is None:
            return 0
        index = planner.index(store)
        done = 0
        while (limit is None or done < limit) and not (
                until is not None and done and time.monotonic() >= until):
            step = BATCH if limit is None else min(BATCH, limit - done)
            embedded = index.index_pending(limit=step, thread_id=thread_id,
                                           through_id=summary.covers_through_id)
            if not embedded:
                break
            done += embedded
            if progress is not None:
                progress(done)
        return done

    def reembed_for_recall(self, planner: Planner | None = None, *, store: Store | None = None,
                           limit: int | None = None) -> tuple[int, int, int]:
        """After a change of embedder: give up to ``limit`` (None: all) messages that only
        have the previous model's vector one from the current model, oldest first, on
        whichever thread calls it with that thread's ``store``; once none is left, drop
        the old vectors and the previous model (recall searched them meanwhile). Returns
        (re-embedded now, messages with the current model's vector, messages still
        waiting). Nothing to do without a previous embedder: (0, 0, 0)."""
        store = store or self.store
        planner = planner or self.planner()
        if planner.embedder is None or planner.previous_embedder is None:
            return 0, 0, 0
        index = planner.index(store)
        done = index.reembed(limit)
        current, waiting = index.change_progress()
        if not waiting:
            dropped = index.finish_change()
            log.info("recall by meaning: %d messages re-embedded with %s, %d old vectors dropped",
                     current, planner.embedder.identity, dropped)
            if self.previous_embedder is planner.previous_embedder:
                self.previous_embedder = None  # the next planner searches the new vectors only
        return done, current, waiting

    # -- turns ----------------------------------------------------------------------------

    def run(self, turn: Turn, cancel: Stop | None = None,
            options: TurnOptions | None = None) -> Iterator[TurnEvent]:
        """Run ``turn`` (send, regenerate, edit, continue; ``Agent.run_turn``): a new
        thread first when it names none (announced by ThreadCreated), the thread's KV
        state restored, the agent's events, and after a compaction the new prefix
        evaluated at once so that the next message starts fast (CacheStatus; the options'
        ``give_way``, default ``cancel``, preempts that warm-up). A failure outside the
        agent's own handling ends the turn with TurnFailed ("internal") and TurnDone."""
        cancel = cancel or StopEvent()
        options = options or TurnOptions()
        tid = turn.thread_id
        writing: set[int] = set()  # replies started and not saved yet
        try:
            planner = self._turn_planner(options.planner)
            self._mark_ended()  # (what a full disk left unmarked, now that it may have room)
            if tid is None:
                tid = self.create_thread()
                yield ThreadCreated(tid)
            restored = self.open_thread(tid)
            if restored:
                yield CacheStatus(tid, "restored", restored)
            # the summary after the reply gives way to the user's next message, as the
            # warm-up does
            agent = build_agent(planner, self.store, confirm_shell=options.confirm_shell,
                                compact=self.compacts, progress=options.progress,
                                give_way=options.give_way)
            compacted = False
            for event in agent.run_turn(turn, tid, cancel):
                compacted = compacted or isinstance(event, CompactionFinished)
                if isinstance(event, ReplyStarted):
                    writing.add(event.message_id)
                elif isinstance(event, ReplySaved):
                    writing.discard(event.message_id)
                elif isinstance(event, TurnDone):  # (the model failed, and so did its save)
                    self.end_replies(writing, "error")
                yield event
                if (isinstance(event, TurnDone) and compacted and event.next_request is not None
                        and not cancel.is_set()):
                    yield from self.warm(tid, event.next_request, options.give_way or cancel)
        except Exception as exc:  # the turn failed outside the agent's own handling
            self.end_replies(writing, "error")  # (its save failed: a full disk)
            yield from self._failed(tid, exc, "The turn failed")
        finally:  # left mid-reply (the caller closed the turn): stopped there
            self.end_replies(writing, "interrupted")

    def end_replies(self, message_ids: set[int], status: str) -> None:
        """Replies a turn of this process started and will not save (their last save
        failed: a full disk; or the turn was left) that are still 'streaming' end as
        ``status`` (the text as last saved), so that the next start does not take them
        for a crash's; where the disk refuses even that, this process reads them so and
        marks them at its next turn or its release (before: marked at the next start,
        which said Iris had closed unexpectedly). Empties ``message_ids``; never raises."""
        if not message_ids:
            return
        ended = dict.fromkeys(message_ids, status)
        message_ids.clear()
        try:
            self.store.end_streams(ended)  # (refused by a full disk: it keeps them itself)
        except Exception as exc:  # noqa: BLE001 - the turn's own failure is what counts
            log.warning("replies left unfinished by a failed turn stay unmarked: %s", exc)
            self._unended.update(ended)

    def _turn_planner(self, planner: Planner | None) -> Planner:
        """The planner a turn runs with: the face's snapshot, or the host's; it must plan
        for the loaded model."""
        planner = planner or self.planner()
        if self.runtime is None or planner.runtime is not self.runtime:
            raise RuntimeError("no model is loaded")
        return planner

    def send(self, thread_id: int | None, text: str, cancel: Stop | None = None,
             options: TurnOptions | None = None, attachments: Sequence[Attachment] = ()
             ) -> Iterator[TurnEvent]:
        """``run(Turn.send(thread_id, text, attachments), …)``: answer ``text``."""
        return self.run(Turn.send(thread_id, text, attachments), cancel, options)

    def regenerate(self, thread_id: int, cancel: Stop | None = None,
                   options: TurnOptions | None = None) -> Iterator[TurnEvent]:
        """``run(Turn.regenerate(thread_id), …)``: the newest user message answered again,
        a new reply beside the old ones, from the cached prompt."""
        return self.run(Turn.regenerate(thread_id), cancel, options)

    def edit(self, thread_id: int, message_id: int, text: str, cancel: Stop | None = None,
             options: TurnOptions | None = None) -> Iterator[TurnEvent]:
        """``run(Turn.edit(…), …)``: ``text`` in place of the user message ``message_id``,
        a new branch from there, the old one kept."""
        return self.run(Turn.edit(thread_id, message_id, text), cancel, options)

    def continue_reply(self, thread_id: int, cancel: Stop | None = None,
                       options: TurnOptions | None = None) -> Iterator[TurnEvent]:
        """``run(Turn.continue_reply(thread_id), …)``: the stopped or cut-off last reply
        goes on."""
        return self.run(Turn.continue_reply(thread_id), cancel, options)

    def switch_branch(self, thread_id: int, message_id: int, step: int) -> int:
        """Make the alternative ``step`` places from ``message_id`` (a reply, a user
        message) active, with the newest branch below it; returns that alternative.
        Raises ValueError when there is none there."""
        return self.store.switch_to_alternative(thread_id, message_id, step)

    def compact(self, thread_id: int, cancel: Stop | None = None, *,
                planner: Planner | None = None, trigger: str = "manual", force: bool = True,
                progress: Callable[[PromptProgress], None] | None = None) -> Iterator[TurnEvent]:
        """Compact ``thread_id`` now (Compact now; ``force``: whatever the triggers and the
        circuit breaker say), reported as CompactionStarted, CompactionFinished and a
        TurnDone with the request the thread sends next. Stop (``cancel``) ends a
        model-written summary early (the extractive one is used)."""
        try:
            planner = planner or self.planner()
            store = self.store
            compactor = build_compactor(planner, store, progress=progress)
            yield from compactor.run_events(thread_id, trigger, cancel, force=force)
            planned = planner.plan_or_error(store, thread_id)
            yield TurnDone(thread_id, "stop", next_request=planned
                           if isinstance(planned, ContextRequest) else None)
        except Exception as exc:  # a compaction bug must not take the app down
            yield from self._failed(thread_id, exc, "Compaction failed")

    def _failed(self, thread_id: int | None, exc: Exception, what: str) -> Iterator[TurnEvent]:
        log.exception("%s", what)
        text = (explain(exc, self.paths.db_path) if isinstance(exc, sqlite3.Error)
                else f"{what}: {plain_reason(exc, self.paths.log_path)}")
        tid = thread_id if thread_id is not None else -1
        yield TurnFailed(tid, text, "internal")
        yield TurnDone(tid, "error")

    # -- work done while the user reads and types -----------------------------------------

    def prefill(self, thread_id: int, request: ContextRequest, cancel: Stop | None = None
                ) -> Iterator[CacheStatus]:
        """Evaluate the draft's planned ``request`` while the user types, so that sending
        it evaluates only what is new. ``cancel`` makes it
        give way (a newer draft, a send)."""
        restored = self.open_thread(thread_id)
        if restored:
            yield CacheStatus(thread_id, "restored", restored)
        yield from self.warm(thread_id, request, cancel, state="prefilling")

    def warm(self, thread_id: int | None, request: ContextRequest, cancel: Stop | None = None,
             state: str = "warming") -> Iterator[CacheStatus]:
        """Evaluate ``request``'s prompt into the KV cache now, at idle, reporting its
        progress (``state`` warming or prefilling), then warmed or prefilled; "stopped"
        when it gave way or failed after its progress was said (before: nothing, and the
        window kept "Prefilling… 74%" until the next send). Nothing happens on a runtime
        that cannot prefill (a server caches on its own); a failure is logged, never
        raised: it is an optimisation."""
        runtime = self.runtime
        if runtime is None or not runtime.capabilities.prefill:
            return
        try:
            first: tuple[int, float] | None = None  # the pace is measured from the first batch on
            with runtime.prefill(request.messages, request.tool_definitions or None,
                                 cancel=cancel) as work:
                for done, total in work:
                    first = first or (done, time.monotonic())
                    yield CacheStatus(thread_id, state, done, total, first[0],
                                      time.monotonic() - first[1])
            stats = work.stats
        except Exception as exc:  # an optimisation: never a failure
            log.info("warm-up skipped: %s", exc)
            stats = None
        if stats is not None and not stats.stopped:  # what the cache held, the runtime's count
            yield CacheStatus(thread_id, "prefilled" if state == "prefilling" else "warmed",
                              stats.reused_tokens, stats.prompt_tokens)
        elif first is not None:
            yield CacheStatus(thread_id, "stopped")
