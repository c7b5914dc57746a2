"""Every folder Iris uses, resolved in one place.

``IRIS_HOME`` (or the CLI's ``--data-dir``) overrides the root: the database, the
settings file, models and logs then all live under it. Otherwise platformdirs gives the
platform's usual folders.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs

APP_NAME = "iris-desktop"


@dataclass(frozen=True)
class AppPaths:
    data_dir: Path
    config_dir: Path
    log_dir: Path

    @property
    def db_path(self) -> Path:
        return self.data_dir / "iris.db"

    @property
    def config_path(self) -> Path:
        return self.config_dir / "config.toml"

    @property
    def models_dir(self) -> Path:
        return self.data_dir / "models"

    @property
    def recent_models_path(self) -> Path:
        """GGUF files opened before (the model library lists them)."""
        return self.data_dir / "recent-models.json"

    @property
    def log_path(self) -> Path:
        return self.log_dir / "iris.log"

    def ensure(self) -> AppPaths:
        for folder in (self.data_dir, self.config_dir, self.log_dir):
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        return self


def app_paths(root: str | os.PathLike[str] | None = None) -> AppPaths:
    """Resolve the folders; ``root`` (``--data-dir``) beats ``IRIS_HOME`` beats platformdirs."""
    if root is None:
        root = os.environ.get("IRIS_HOME") or None
    if root is not None:
        base = Path(root).expanduser().resolve()
        return AppPaths(data_dir=base, config_dir=base, log_dir=base / "logs")
    return AppPaths(
        data_dir=Path(platformdirs.user_data_dir(APP_NAME, appauthor=False)),
        config_dir=Path(platformdirs.user_config_dir(APP_NAME, appauthor=False)),
        log_dir=Path(platformdirs.user_log_dir(APP_NAME, appauthor=False)),
    )
