"""What the CLI works with: folders, settings, the store and (lazily) the model.

No Qt here. Requests, agents and compactors come from :meth:`Session.planner`, the one
place that computes windows, counters and tool prompts. The GUI does not use a Session's
model: its model thread owns the model (``ui.model_thread``).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from iris_desktop.core.store import StoreError, explain, open_store
from iris_desktop.paths import AppPaths, app_paths
from iris_desktop.settings import BUNDLED, Settings, SettingsError, load_settings

log = logging.getLogger("iris.session")


def bundled_model_path(models_dir: Path) -> Path:
    """The bundled GGUF (Qwen2.5-Coder-0.5B-Instruct): shipped inside a frozen app, else
    assembled into ``models_dir`` from its pinned parts on first use, size- and
    sha256-checked. Raises runtime.model.ModelError naming the package at fault."""
    import sys

    from iris_desktop.runtime.bundled import (
        BUNDLED_MODEL,
        BundledModelError,
        ensure_bundled_model,
    )
    from iris_desktop.runtime.model import ModelError

    frozen_root = getattr(sys, "_MEIPASS", None)
    if frozen_root:
        shipped = Path(frozen_root) / "models" / BUNDLED_MODEL.file_name
        if shipped.is_file():
            return shipped
    try:
        return ensure_bundled_model(models_dir)
    except BundledModelError as exc:
        raise ModelError(exc.path or models_dir / BUNDLED_MODEL.file_name, str(exc)) from None


def model_path_for(settings: Settings, models_dir: Path) -> Path:
    """The GGUF ``model.path`` names; the bundled one is assembled on first use."""
    configured = settings["model.path"]
    if configured == BUNDLED:
        return bundled_model_path(models_dir)
    return Path(configured).expanduser()


def load_model(settings: Settings, paths: AppPaths, *, progress=None, cancel=None):
    """Load the model the settings name (the CLI's session and the GUI's model thread
    both load through here); a file of the user's own joins the library's recent list.
    ``progress(fraction)`` follows the load and setting ``cancel`` stops it. Raises
    runtime.model.ModelError."""
    if settings["model.backend"] == "openai":
        return connect_server(settings)
    from iris_desktop.core.planner import limit_problems
    from iris_desktop.runtime.gguf import GGUFError, read_gguf_info
    from iris_desktop.runtime.library import remember_recent
    from iris_desktop.runtime.model import LocalModel

    path = model_path_for(settings, paths.models_dir)
    try:
        trained = read_gguf_info(path).context_length
    except GGUFError:
        trained = None  # LocalModel.load says what is wrong with the file
    problem = limit_problems(settings, None, trained).get("model.n_ctx")
    if problem:
        raise SettingsError(problem)
    model = LocalModel.load(
        path,
        n_ctx=settings["model.n_ctx"],
        n_threads=settings["model.n_threads"] or None,
        n_gpu_layers=settings["model.n_gpu_layers"],
        progress=progress,
        cancel=cancel,
    )
    if settings["model.path"] != BUNDLED:
        try:
            remember_recent(paths.recent_models_path, path)
        except OSError as exc:  # a convenience: never a reason to fail a load
            log.warning("could not remember %s: %s", path, exc)
    return model


def connect_server(settings: Settings):
    """The OpenAI-compatible server ``model.base_url`` names (``model.backend`` openai),
    with the API key from the OS keyring. Its window is the server's when it tells, else
    ``model.n_ctx``. Raises SettingsError (no address) or runtime.remote.ServerError."""
    from iris_desktop.core.planner import FALLBACK_WINDOW
    from iris_desktop.runtime.remote import RemoteRuntime, get_api_key

    base_url = settings["model.base_url"]
    if not base_url:
        raise SettingsError("model.base_url: model.backend is openai but no server address "
                            "is set; set model.base_url (for example "
                            "http://127.0.0.1:8080/v1), or model.backend to local")
    return RemoteRuntime.connect(base_url, settings["model.name"], get_api_key(base_url),
                                 fallback_window=settings["model.n_ctx"] or FALLBACK_WINDOW)


class Session:
    """One user's Iris: data dir, settings, database and (lazily) the model.

    Raises paths.DataDirError (a folder that cannot be made or written) and
    store.StoreError (a database that cannot be used), each saying what to do.
    """

    def __init__(
        self,
        data_dir: str | Path | None = None,
        overrides: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        settings: Settings | None = None,
    ):
        self.paths: AppPaths = app_paths(data_dir).ensure()
        # settings problems are the caller's to show (the CLI prints, the GUI logs), once
        self.settings = settings or load_settings(self.paths.config_path, env, overrides)
        # recovery: what salvaging a damaged database saved (None: it was sound); the CLI
        # and the GUI tell the user
        self.store, self.recovery = open_store(self.paths.db_path)
        try:
            interrupted = self.store.mark_interrupted_streams()
        except sqlite3.Error as exc:
            self.store.close()
            raise StoreError(explain(exc, self.paths.db_path)) from None
        if interrupted:
            log.warning("%d reply(ies) cut off by an earlier crash marked interrupted",
                        interrupted)
        self.model: Any = None  # runtime.model.LocalModel once loaded
        self.model_error: str | None = None
        self.embedder: Any = None  # runtime.embedder.Embedder once loaded

    def close(self) -> None:
        if self.model is not None:
            self.model.close()
            self.model = None
        if self.embedder is not None:
            self.embedder.close()
            self.embedder = None
        self.store.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- model ------------------------------------------------------------------------------

    def model_path(self) -> Path:
        """The GGUF to load; the bundled one is assembled into the data dir on first use."""
        return model_path_for(self.settings, self.paths.models_dir)

    def load_model(self):
        """Load the configured model once; raises runtime.model.ModelError."""
        if self.model is None:
            self.model = load_model(self.settings, self.paths)
            self.model_error = None
        return self.model

    def try_load_model(self):
        """Load the model, or remember why not and return None (the caller stays usable)."""
        try:
            return self.load_model()
        except Exception as exc:  # a bad model must never take the app down
            self.model_error = str(exc)
            log.error("model: %s", exc)
            return None

    # -- the planner ----------------------------------------------------------------------

    def load_embedder(self):
        """The small embedding model for recall by meaning (``context.recall_semantic``),
        loaded once; None when that is off or it cannot load (recall then matches words
        only, and the log says why)."""
        if self.embedder is None and self.settings["context.recall_semantic"]:
            from iris_desktop.runtime.embedder import Embedder, embedding_model_path

            try:
                self.embedder = Embedder.load(embedding_model_path(self.paths.models_dir))
            except Exception as exc:  # recall by words still works
                log.warning("semantic recall is off: %s", exc)
        return self.embedder

    def index_for_recall(self, thread_id: int) -> int:
        """Embed the thread's summarized messages that have no vector yet (recall only
        searches those), with the embedder if it is loaded; returns how many. The GUI
        does this in the background after each turn; the CLI before it plans."""
        summary = self.store.latest_summary(thread_id)
        if self.embedder is None or summary is None:
            return 0
        from iris_desktop.core.semantic import BATCH

        index = self.planner().index(self.store)
        done = 0
        while True:  # oldest first: stop once the summarized ones are done
            first = index.pending(thread_id, limit=1)
            if not first or first[0] > summary.covers_through_id:
                return done
            done += index.index_pending(limit=BATCH, thread_id=thread_id)

    def thread_cache(self):
        """The loaded model's per-thread KV states (runtime.kv_store), saved in the data
        folder and bounded by ``model.kv_cache_mb``."""
        from iris_desktop.runtime.kv_store import KVStateStore, ThreadCache

        limit = self.settings["model.kv_cache_mb"] * 2**20
        return ThreadCache(KVStateStore(self.paths.kv_cache_dir, limit), self.model)

    def planner(self):
        """The request planner for the current settings on the loaded model (if any)."""
        from iris_desktop.core.planner import Planner

        return Planner.from_settings(self.settings, self.model, embedder=self.embedder)

    @property
    def chat_format(self) -> str | None:
        return self.model.chat_format.name if self.model is not None else None
