"""The settings each part of a turn reads, as plain frozen values: one dataclass per
part, each made from the typed settings (``iris_desktop.settings``) by its
``from_settings``. The planner holds one of each; nothing here changes after it is made.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ContextParams:
    """The settings the engine reads."""

    window: int
    token_budget_ratio: float = 0.70
    compaction_threshold: float = 0.75
    prune_protect_turns: int = 2
    compaction_min_turns: int = 20
    system_prompt: str = ""
    window_source: str = "config"
    recall_max_tokens: int = 0

    @classmethod
    def from_settings(cls, settings: Any, window: int, window_source: str) -> ContextParams:
        return cls(
            window=window,
            token_budget_ratio=settings["context.token_budget_ratio"],
            compaction_threshold=settings["context.compaction_threshold"],
            prune_protect_turns=settings["context.prune_protect_turns"],
            compaction_min_turns=settings["context.compaction_min_turns"],
            system_prompt=settings["chat.system_prompt"],
            window_source=window_source,
            recall_max_tokens=settings["context.recall_max_tokens"],
        )


@dataclass(frozen=True)
class CompactionSettings:
    """What the compactor reads."""

    keep_recent_ratio: float = 0.5
    summary_max_tokens: int = 768
    timeout_s: float = 180.0
    #: auto | model | extractive (``context.summarizer``)
    summarizer: str = "auto"
    #: the model reads at most this many windows of old turns in one compaction; older
    #: ones get the extractive summary (0: no limit) (``context.summary_max_parts``)
    max_parts: int = 2

    @classmethod
    def from_settings(cls, settings: Any) -> CompactionSettings:
        return cls(
            keep_recent_ratio=settings["context.keep_recent_ratio"],
            summary_max_tokens=settings["context.summary_max_tokens"],
            timeout_s=settings["context.summary_timeout_s"],
            summarizer=settings["context.summarizer"],
            max_parts=settings["context.summary_max_parts"],
        )


@dataclass(frozen=True)
class AgentConfig:
    """What the agent's turn loop reads."""

    max_tokens: int = 1024
    temperature: float = 0.7
    #: sampling besides the temperature (``GenerationRequest``'s)
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.1
    dry_multiplier: float = 0.8
    max_calls_per_turn: int = 8
    #: a streaming reply is saved at least this often, so a crash loses at most this much
    save_interval_s: float = 1.0

    @classmethod
    def from_settings(cls, settings: Any) -> AgentConfig:
        return cls(
            max_tokens=settings["model.max_tokens"],
            temperature=settings["model.temperature"],
            top_k=settings["model.top_k"],
            top_p=settings["model.top_p"],
            min_p=settings["model.min_p"],
            repeat_penalty=settings["model.repeat_penalty"],
            dry_multiplier=settings["model.dry_multiplier"],
            max_calls_per_turn=settings["tools.max_calls_per_turn"],
        )


@dataclass(frozen=True)
class ToolsConfig:
    """The tool settings."""

    enabled: tuple[str, ...] = ("read_file", "list_directory", "search_files")
    allowed_paths: tuple[str, ...] = ()
    shell: bool = False
    max_calls_per_turn: int = 8
    #: the longest a ``run_shell`` command may run
    shell_timeout_s: float = 60.0

    @classmethod
    def from_settings(cls, settings: Any) -> ToolsConfig:
        return cls(
            enabled=tuple(settings["tools.enabled"]),
            allowed_paths=tuple(settings["tools.allowed_paths"]),
            shell=settings["tools.shell"],
            max_calls_per_turn=settings["tools.max_calls_per_turn"],
            shell_timeout_s=float(settings["tools.shell_timeout_s"]),
        )
