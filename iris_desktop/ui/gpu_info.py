"""The devices llama.cpp found and ``model.gpu``'s plan, for Preferences ▸ Model and
Model ▸ Models… (the wording is :mod:`iris_desktop.runtime.gpu`'s, as ``iris-desktop
devices`` prints it).

Listing the devices initialises ggml's backends (a GPU driver may take a second or more),
so it runs once per run of the app, off the GUI thread, and is kept; a model's GGUF
header is read off the GUI thread too and kept per file (path, size, mtime). The plan
itself is pure and quick, so the dialog recomputes it on the GUI thread whenever
``model.gpu`` or ``model.n_ctx`` changes there.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QGroupBox, QLabel, QPushButton, QVBoxLayout

from iris_desktop.runtime.gguf import GGUFInfo
from iris_desktop.runtime.gpu import Device, GpuChecks, devices_report, fit_text, plan_model, with_held
from iris_desktop.settings import BUNDLED, Settings
from iris_desktop.ui.hub_worker import HubCalls

log = logging.getLogger("iris.ui.gpu_info")

_lock = threading.Lock()
_devices: list[Device] | None = None
_headers: dict[tuple[str, int, int], GGUFInfo | None] = {}


def forget() -> None:
    """Drop what is kept (tests; a driver change needs a restart otherwise)."""
    global _devices
    with _lock:
        _devices = None
        _headers.clear()


def cached_devices() -> list[Device]:
    """What llama.cpp found, listed the first time (blocks then: call it off the GUI
    thread), with what Iris's own loaded model held on a GPU then counted back as free
    (``runtime.gpu.with_held``: a load in its place gets it back; the driver's figure left
    it out, and the plans said less fitted than a reload had). A list that fails is taken
    as no device besides what is said in the log."""
    global _devices
    with _lock:
        if _devices is None:
            from iris_desktop.runtime import devices

            try:
                _devices = with_held(devices.list_devices())
            except Exception as exc:  # a driver that does not answer: the CPU alone
                log.info("no device list: %s", exc)
                _devices = []
        return list(_devices)


def cached_header(path: str | Path) -> GGUFInfo | None:
    """The GGUF header of ``path`` (None: unreadable), read once per version of the file."""
    from iris_desktop.runtime.gguf import read_gguf_info

    path = Path(path)
    try:
        st = path.stat()
    except OSError:
        return None
    key = (str(path), st.st_size, st.st_mtime_ns)
    with _lock:
        if key in _headers:
            return _headers[key]
    try:
        info = read_gguf_info(path)
    except Exception as exc:  # GGUFError, OSError: no plan for it
        log.info("%s: no header for the GPU plan (%s)", path, exc)
        info = None
    with _lock:
        _headers[key] = info
    return info


def current_model_file(settings: Settings, models_dir: Path) -> Path | None:
    """The file ``model.path`` names, where it exists: the bundled model only once
    assembled (this never assembles it), else the configured path."""
    from iris_desktop.runtime.bundled import BUNDLED_MODEL

    configured = settings["model.path"]
    if configured != BUNDLED:
        return Path(configured).expanduser()
    frozen_root = getattr(sys, "_MEIPASS", None)
    for candidate in ([Path(frozen_root) / "models" / BUNDLED_MODEL.file_name] if frozen_root else []) + [
            models_dir / BUNDLED_MODEL.file_name]:
        if candidate.is_file():
            return candidate
    return None


def fit_for(path: str | Path, n_ctx: int, devices: list[Device], settings: Settings,
            disabled: dict[str, str], checks_path: Path | None = None) -> str:
    """Model ▸ Models…'s GPU column for one file (blocks on its header: not on the GUI thread)."""
    info = cached_header(path)
    if info is None:
        return "–"
    plan, _ = plan_model(info, n_ctx, devices, settings["model.gpu"], disabled=disabled,
                         flash_attn=settings["model.flash_attn"], gpu_checks=checks_path)
    return fit_text(plan, devices)


class GpuFacts(QObject):
    """The devices, the first-use check's verdicts and the current model's header, read
    on a worker thread (``request``); ``ready`` when they are in. :meth:`lines` then plans
    for any candidate settings at once."""

    ready = Signal()

    def __init__(self, models_dir: Path, checks_path: Path | None, parent: QObject | None = None):
        super().__init__(parent)
        self.models_dir = Path(models_dir)
        self.checks_path = checks_path
        self.devices: list[Device] | None = None
        self.disabled: dict[str, str] = {}
        self.model: Path | None = None
        self.info: GGUFInfo | None = None
        self.calls = HubCalls(self)

    def request(self, settings: Settings) -> None:
        model = None if settings["model.backend"] != "local" else current_model_file(settings, self.models_dir)
        checks = self.checks_path

        def read() -> tuple[list[Device], dict[str, str], Path | None, GGUFInfo | None]:
            found = cached_devices()
            disabled = GpuChecks(checks).disabled(found) if checks is not None else {}
            return found, disabled, model, cached_header(model) if model is not None else None

        self.calls.run(read, self._read)

    def _read(self, result: Any, error: BaseException | None) -> None:
        if result is None:
            log.info("no device facts: %s", error)
            self.devices = []
        else:
            self.devices, self.disabled, self.model, self.info = result
        self.ready.emit()

    def lines(self, settings: Settings) -> list[str]:
        """The "Devices" block for ``settings`` (the dialog's candidate values)."""
        setting = settings["model.gpu"]
        if self.devices is None:
            return devices_report(None, None)
        if settings["model.backend"] != "local":
            return devices_report(self.devices, None, setting=setting,
                                  problem="model.backend is openai: the server runs the model")
        if self.info is None:
            problem = ("the bundled model is not assembled yet (its first load does)" if self.model is None
                       else f"{self.model.name}: its header cannot be read")
            return devices_report(self.devices, None, setting=setting, problem=problem)
        plan, n_ctx = plan_model(self.info, settings["model.n_ctx"], self.devices, setting,
                                 disabled=self.disabled, flash_attn=settings["model.flash_attn"],
                                 gpu_checks=self.checks_path)
        return devices_report(self.devices, plan, model=self.model.name, n_ctx=n_ctx, setting=setting)


class DevicesBox(QGroupBox):
    """Preferences ▸ Model's "Devices" block: :meth:`GpuFacts.lines` for the settings
    ``candidate()`` gives (None: keep the last text), drawn again when the facts are in
    and whenever :meth:`refresh` is called (the dialog's values changed); under it, for
    each GPU that is off for Iris, a "Check … again" button, the window's
    ``iris-desktop devices --check-again``."""

    def __init__(self, facts: GpuFacts, candidate: Callable[[], Settings | None], parent=None):
        super().__init__("Devices", parent)
        self.setObjectName("gpu-devices-box")
        self.facts, self._candidate = facts, candidate
        self.label = QLabel()
        self.label.setObjectName("gpu-devices")
        self.label.setWordWrap(True)
        self.label.setTextFormat(Qt.TextFormat.PlainText)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.label.setAccessibleName("Devices and the GPU plan")
        self.note = QLabel()  # what a "Check … again" did
        self.note.setObjectName("gpu-check-again-note")
        self.note.setTextFormat(Qt.TextFormat.PlainText)  # (a path is shown as it is)
        self.note.setWordWrap(True)
        self.note.hide()
        self.buttons: dict[str, QPushButton] = {}
        self._layout = layout = QVBoxLayout(self)
        layout.addWidget(self.label)
        layout.addWidget(self.note)
        facts.ready.connect(self.refresh)
        self.refresh()

    def refresh(self) -> None:
        candidate = self._candidate()
        if candidate is not None:
            self.label.setText("\n".join(self.facts.lines(candidate)))
        off = set(self.facts.disabled) if self.facts.checks_path is not None else set()
        for label in set(self.buttons) - off:
            self.buttons.pop(label).deleteLater()
        for label in sorted(off - set(self.buttons)):
            button = self.buttons[label] = QPushButton(f"Check {label} again")
            button.setObjectName("gpu-check-again")
            button.setToolTip(f"Forget what the first-use check recorded of {label}: the next load of "
                              "a model checks it against the CPU again, and uses it if it agrees "
                              "(iris-desktop devices --check-again)")
            button.clicked.connect(lambda _=False, label=label: self.check_again(label))
            self._layout.insertWidget(self._layout.indexOf(self.note), button)

    def check_again(self, label: str) -> None:
        """Forget ``label``'s first-use check off the GUI thread (a file write), then say
        what happens next and read the facts again (its button goes with its record)."""
        path = self.facts.checks_path
        for button in self.buttons.values():
            button.setEnabled(False)

        def done(gone: Any, error: BaseException | None) -> None:
            for button in self.buttons.values():
                button.setEnabled(True)
            if error is not None:
                why = error.strerror if isinstance(error, OSError) and error.strerror else error
                self.note.setText(f"{label} cannot be checked again: {path} cannot be read or written "
                                  f"({why}); nothing was changed.")
            else:  # (nothing left to forget: another process had it checked again meanwhile)
                what = (f"Forgot the first-use check of {label}" if gone else
                        f"No first-use check of {label} is recorded any more (another Iris process "
                        "forgot it)")
                self.note.setText(f"{what}: the next load of a model (Model ▸ Reload, or the next start) "
                                  "checks it against the CPU again, and uses it if it agrees.")
                settings = self._candidate()
                if settings is not None:
                    self.facts.request(settings)
            self.note.show()

        self.facts.calls.run(lambda: GpuChecks(path).forget(label), done)
