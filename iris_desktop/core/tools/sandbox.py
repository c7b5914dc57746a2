"""The :class:`Sandbox`: the user's tool settings, the definitions of the tools usable now,
and one call run from its name and arguments to a :class:`.limits.ToolResult`."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from iris_desktop.core.tools import files, search
from iris_desktop.core.tools.limits import (
    NO_ROOTS,
    SHELL_DISABLED,
    ToolError,
    ToolResult,
    check_cancel,
)
from iris_desktop.core.tools.safe_files import folders
from iris_desktop.core.tools.shell import check_command, run_shell
from iris_desktop.core.tools.specs import (
    DEFAULT_ENABLED,
    FILE_TOOLS,
    SPECS,
    TOOL_NAMES,
    parse_arguments,
)


class Sandbox:
    """The local tools, confined to the user's allowed folders.

    ``allowed_paths`` may use ``~``; ones that do not exist (or are not folders) are
    ignored and re-checked on every call, so a folder created later starts to count.
    Unknown names in ``enabled`` are ignored. ``confirm_shell(command)`` is called before
    every shell command (possibly from a worker thread) and must return ``True`` to run it.
    """

    def __init__(
        self,
        allowed_paths: Sequence[str | Path],
        enabled: Sequence[str] = DEFAULT_ENABLED,
        shell: bool = False,
        confirm_shell: Callable[[str], bool] | None = None,
        shell_timeout_s: float = 60.0,
    ) -> None:
        if isinstance(allowed_paths, (str, Path)):  # a bare string would iterate by character
            allowed_paths = [allowed_paths]
        if isinstance(enabled, str):
            enabled = [enabled]
        if not shell_timeout_s > 0:
            raise ValueError(f"shell_timeout_s must be positive, got {shell_timeout_s!r}")
        self._allowed = tuple(allowed_paths)
        self._enabled = frozenset(enabled) & frozenset(TOOL_NAMES)
        self._shell = bool(shell)
        self._confirm = confirm_shell
        self._timeout = float(shell_timeout_s)

    @classmethod
    def from_config(cls, config: Any, confirm_shell: Callable[[str], bool] | None = None
                    ) -> Sandbox:
        """The sandbox the tool settings describe (a ``core.config.ToolsConfig``; one
        without ``shell_timeout_s`` gives commands the 60 s default)."""
        return cls(list(config.allowed_paths), enabled=list(config.enabled),
                   shell=config.shell, confirm_shell=confirm_shell,
                   shell_timeout_s=getattr(config, "shell_timeout_s", 60.0))

    @property
    def roots(self) -> list[Path]:
        """The allowed folders, resolved, deduplicated, in order; missing ones left out."""
        roots: list[Path] = []
        for raw in self._allowed:
            try:
                root = Path(raw).expanduser().resolve()
                if root.is_dir() and root not in roots:
                    roots.append(root)
            except (OSError, RuntimeError, ValueError):  # bad path, loop, no home dir
                continue
        return roots

    def definitions(self) -> list[dict[str, Any]]:
        """OpenAI ``tools`` entries for the tools usable right now.

        A file tool is usable when enabled and at least one allowed folder exists;
        ``run_shell`` when enabled and ``shell=True``.
        """
        roots = self.roots
        definitions = []
        for name in TOOL_NAMES:
            if not self._usable(name, roots):
                continue
            spec = SPECS[name]
            description = spec.description
            if name in FILE_TOOLS:
                # Tell the model where it may look, or it guesses paths that get refused.
                description += f" Allowed folders: {folders(roots)}."
            definitions.append(spec.definition(description))
        return definitions

    def run(
        self, name: str, arguments: dict[str, Any] | str, cancel: threading.Event | None = None
    ) -> ToolResult:
        """Run tool ``name``; ``arguments`` is a dict or its JSON text. Never raises.

        Setting ``cancel`` (from another thread, e.g. the turn's Stop) ends a file tool at
        its next file, line or entry, with ``error: stopped by the user before it finished``.
        """
        try:
            ok, content = True, self._dispatch(name, arguments, cancel or threading.Event())
        except ToolError as exc:
            ok, content = False, f"error: {exc}"
        except Exception as exc:  # noqa: BLE001 - a tool bug must not take the chat down
            ok, content = False, f"error: {name} failed: {type(exc).__name__}: {exc}"
        # Undecodable file names arrive as lone surrogates, which JSON and SQLite reject.
        return ToolResult(ok, content.encode("utf-8", "replace").decode("utf-8"))

    # -- plumbing --

    def _usable(self, name: str, roots: Sequence[Path]) -> bool:
        if name not in self._enabled:
            return False
        return bool(roots) if name in FILE_TOOLS else self._shell

    def _dispatch(self, name: str, arguments: Any, cancel: threading.Event) -> str:
        spec = SPECS.get(name) if isinstance(name, str) else None
        if spec is None:
            raise ToolError(f"unknown tool {name!r}; known tools: {', '.join(TOOL_NAMES)}")
        if name == "run_shell" and not self._shell:
            raise ToolError(SHELL_DISABLED)
        if name not in self._enabled:
            raise ToolError(f"tool {name} is not enabled")
        kwargs = parse_arguments(spec, arguments)
        if name in FILE_TOOLS or name == "run_shell":
            kwargs["cancel"] = cancel
        handler: Callable[..., str] = getattr(self, f"_tool_{name}")
        return handler(**kwargs)

    def _require_roots(self) -> list[Path]:
        roots = self.roots
        if not roots:
            raise ToolError(NO_ROOTS)
        return roots

    # -- tools --

    def _tool_read_file(self, path: str, offset: int, limit: int, cancel: threading.Event) -> str:
        return files.read_file(self._require_roots(), path, offset, limit, cancel)

    def _tool_list_directory(self, path: str, cancel: threading.Event) -> str:
        return files.list_directory(self._require_roots(), path, cancel)

    def _tool_search_files(self, pattern: str, path: str, cancel: threading.Event) -> str:
        return search.search_files(self._require_roots(), pattern, path, cancel)

    def _tool_run_shell(self, command: str, cancel: threading.Event) -> str:
        check_command(command, self._confirm)
        check_cancel(cancel)  # Stop while the question was open: nothing runs
        roots = self.roots
        # With no allowed folder yet, the home folder is the least surprising place.
        return run_shell(command, roots[0] if roots else Path.home(), self._timeout, cancel)
