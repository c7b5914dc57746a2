"""Every folder Iris uses, resolved in one place.

``IRIS_HOME`` (or the CLI's ``--data-dir``) overrides the root: the database, the
settings file, models and logs then all live under it. Otherwise platformdirs gives the
platform's usual folders.

Every folder Iris creates is private (0700, whatever the umask), as the XDG base
directory spec asks of missing folders; folders that already exist are left as they are.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs

APP_NAME = "iris-desktop"


class DataDirError(OSError):
    """A folder Iris needs cannot be created or written; the message says what to do."""


def make_private_dir(folder: Path) -> None:
    """Create ``folder`` and its missing parents, each 0700. Raises DataDirError when a
    path on the way is a file or cannot be created."""
    missing: list[Path] = []
    probe = folder
    try:
        while not probe.is_dir():
            # (a folder another process made since the look above is no file in the way)
            if (probe.exists() or probe.is_symlink()) and not probe.is_dir():
                raise DataDirError(f"{probe} is not a folder; move it away or choose another "
                                   "--data-dir (or IRIS_HOME)")
            missing.append(probe)
            probe = probe.parent
    except DataDirError:
        raise
    except OSError as exc:  # a name too long, a folder that cannot be looked into
        raise DataDirError(f"cannot use the folder {folder} ({exc.strerror or exc}); choose "
                           "another --data-dir (or IRIS_HOME)") from None
    for path in reversed(missing):
        try:
            path.mkdir(mode=0o700, exist_ok=True)
            if os.name == "posix":
                os.chmod(path, 0o700)  # mkdir's mode is reduced by the umask
        except OSError as exc:
            raise DataDirError(f"cannot create the folder {path} ({exc.strerror or exc}); "
                               "choose another --data-dir (or IRIS_HOME)") from None


def check_writable_dir(folder: Path) -> None:
    """Raise DataDirError unless files can be created in ``folder``."""
    if not os.access(folder, os.W_OK | os.X_OK):
        raise DataDirError(f"cannot write to the folder {folder}; make it writable (for "
                           "example chmod u+w) or choose another --data-dir (or IRIS_HOME)")


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
    def kv_cache_dir(self) -> Path:
        """Each thread's saved KV state (runtime.kv_store), bounded by model.kv_cache_mb."""
        return self.data_dir / "kv-cache"

    @property
    def weights_dir(self) -> Path:
        """Exact Q8_0 copies of models' Q5_0 weights (runtime.weights, model.q8_weights);
        ``IRIS_WEIGHTS_DIR`` puts them elsewhere (the tests share one per machine)."""
        override = os.environ.get("IRIS_WEIGHTS_DIR")
        return Path(override).expanduser() if override else self.data_dir / "weights"

    @property
    def log_path(self) -> Path:
        return self.log_dir / "iris.log"

    def ensure(self) -> AppPaths:
        """Create the folders (private) and check that they are writable; raises
        DataDirError with what to do."""
        for folder in (self.data_dir, self.config_dir, self.log_dir):
            make_private_dir(folder)
            check_writable_dir(folder)
        return self


def app_paths(root: str | os.PathLike[str] | None = None) -> AppPaths:
    """Resolve the folders; ``root`` (``--data-dir``) beats ``IRIS_HOME`` beats platformdirs."""
    if root is None:
        root = os.environ.get("IRIS_HOME") or None
    if root is not None:
        try:
            base = Path(root).expanduser().resolve()
        except (OSError, RuntimeError) as exc:  # a folder on the way cannot be looked into
            what = getattr(exc, "strerror", None) or exc  # (before: a raw traceback, twice)
            raise DataDirError(f"cannot use the folder {root} ({what}); choose another "
                               "--data-dir (or IRIS_HOME)") from None
        return AppPaths(data_dir=base, config_dir=base, log_dir=base / "logs")
    return AppPaths(
        data_dir=Path(platformdirs.user_data_dir(APP_NAME, appauthor=False)),
        config_dir=Path(platformdirs.user_config_dir(APP_NAME, appauthor=False)),
        log_dir=Path(platformdirs.user_log_dir(APP_NAME, appauthor=False)),
    )
