"""Start the desktop app: ``run_gui(data_dir, overrides)`` (what the CLI calls with no
command, and what ``make run`` runs)."""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Mapping
from typing import Any

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication, QMessageBox

from iris_desktop import __version__
from iris_desktop.logfile import PrivateLogFile
from iris_desktop.ui.main_window import MainWindow, main_window
from iris_desktop.ui.theme import app_icon

__all__ = ["run_gui", "main_window", "MainWindow", "setup_logging"]

def setup_logging(log_path) -> logging.Handler:
    """Log to the data folder's rotating file (once per process; the CLI's when it
    started the app), at INFO also then (before, the app started as users start it,
    through ``iris-desktop``, kept the CLI's WARNING: no start, load or exit line);
    folder 0700, files 0600."""
    root = logging.getLogger()
    if root.level == logging.NOTSET or root.level > logging.INFO:
        root.setLevel(logging.INFO)
    quiet_http_logs()
    for handler in root.handlers:
        if getattr(handler, "_iris", False):
            return handler
    handler = PrivateLogFile(log_path)
    root.addHandler(handler)
    return handler


def quiet_http_logs() -> None:
    """httpx and httpcore log every request's URL at INFO (a server's address, a model
    search's words): the log keeps their warnings only."""
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)


def application(argv: list[str] | None = None) -> QApplication:
    # the GUI thread gets the GIL back within 1 ms (not 5) while a worker runs Python code
    sys.setswitchinterval(0.001)
    app = QApplication.instance()
    if app is None:
        # fractional scaling (125%, 150%, 175%) as the system asks, not rounded to 100/200%
        QGuiApplication.setHighDpiScaleFactorRoundingPolicy(
            Qt.HighDpiScaleFactorRoundingPolicy.PassThrough)
        app = QApplication(argv if argv is not None else sys.argv[:1])
    app.setApplicationName("Iris Desktop")
    app.setApplicationVersion(__version__)
    app.setOrganizationName("Iris")
    app.setDesktopFileName("iris-desktop")
    app.setWindowIcon(app_icon())
    return app


def _tell_recovery(host: Any, log: logging.Logger) -> None:
    """The history encrypted or decrypted now, a database salvaged now, and databases set
    aside earlier that the user was not shown yet: a message box each, before the window
    (then they count as shown)."""
    from iris_desktop.core.store.recovery import acknowledge, announce, unacknowledged

    db = host.paths.db_path
    if host.storage_note:
        log.info("%s", host.storage_note)
        QMessageBox.information(None, "Iris Desktop", host.storage_note)
    if host.recovery is not None:
        log.warning("%s", host.recovery.describe())
        QMessageBox.warning(None, host.recovery.title, host.recovery.describe())
        acknowledge(db, [host.recovery.set_aside], app=True)
    pending = unacknowledged(db, app=True)
    if pending:
        text = announce(db, pending)
        log.warning("%s", text)
        QMessageBox.warning(None, "Iris Desktop set a database aside", text[0].upper() + text[1:] + ".")
        acknowledge(db, pending, app=True)


def _tell_settings(host: Any, log: logging.Logger) -> str | None:
    """The settings' problems, in a message box before the window, each with its own
    outcome (the box said "Iris uses the defaults for these" of an older key that is
    used, and of a bad variable whose file value is). A key of a newer Iris is only
    logged: a box on every start would be too much. Returns what the status bar says of
    those."""
    from iris_desktop.settings import NOT_KNOWN

    problems = host.settings.problems
    for problem in problems:
        log.warning("settings: %s", problem)
    unknown = [p for p in problems if NOT_KNOWN in p]
    shown = [p for p in problems if p not in unknown]
    if shown:  # said, as the CLI says them (they were only in the log)
        every = all(p.endswith("using the default") for p in shown)  # only when true
        QMessageBox.warning(None, "Iris Desktop: settings to check", "\n\n".join(
            [*shown, ("Iris uses the defaults for these. " if every else "") + "Fix them in "
             f"Edit ▸ Preferences, or in {host.paths.config_path}."]))
    if not unknown:
        return None
    keys = [p[:p.index(f" {NOT_KNOWN}")].rsplit(": ", 1)[-1] for p in unknown]
    return (f"The settings file has {', '.join(keys)}, not known to this version of Iris; "
            "ignored (see the log)")


def _quit_on_interrupt(window: Any) -> tuple[Any, QTimer]:
    """Ctrl+C in the terminal that started the window quits as File ▸ Quit does (it left a
    traceback and the window running). Python sees a signal only when it runs: a timer
    gives it a turn while Qt's loop waits. Returns the handler it replaced, and the timer."""
    turn = QTimer()
    turn.timeout.connect(lambda: None)
    turn.start(200)
    def quit_now() -> None:  # every loop ends: a message box open (a model that failed) too
        window.quit_now()
        QApplication.quit()

    # in the loop: a Ctrl+C before it runs would close the window before it, and the loop
    # would then wait for a window to close that is gone
    return signal.signal(signal.SIGINT, lambda *_: QTimer.singleShot(0, quit_now)), turn


def _start_failure(exc: BaseException) -> str:
    """One sentence for what stopped the start: StoreError and DataDirError say it
    themselves; an OSError (a place the history or the data folder cannot be) says
    which file and why, not ``[Errno 21] …``."""
    if not isinstance(exc, OSError):
        return str(exc)
    where = f"{exc.filename} " if exc.filename else ""
    return (f"Iris Desktop cannot use {where}({exc.strerror or exc}); move it away or fix "
            "it, and start again")


def run_gui(data_dir: Any = None, overrides: Mapping[str, str] | None = None) -> int:
    """Open the main window on ``data_dir`` (default: IRIS_HOME / platform folders). A
    database that had to be salvaged is reported in a message box before the window.
    File ▸ Change history passphrase… closes the window; the key is changed here, between
    two windows (no connection to the history open), and a new window opens."""
    from iris_desktop.core.store import StoreError
    from iris_desktop.host import Host
    from iris_desktop.paths import DataDirError
    from iris_desktop.ui.passphrase_dialog import ask_passphrase

    app = application()
    try:
        # an encrypted history's passphrase is asked in a dialog when no keyring holds its key
        host = Host(data_dir, dict(overrides or {}), ask_passphrase=ask_passphrase)
    except (StoreError, DataDirError, OSError) as exc:  # (a launcher shows no stderr)
        QMessageBox.critical(None, "Iris Desktop cannot start", _start_failure(exc))
        return 1
    setup_logging(host.paths.log_path)
    log = logging.getLogger("iris.ui")
    log.info("Iris Desktop %s starting; data dir %s", __version__, host.paths.data_dir)
    said = _tell_settings(host, log)
    _tell_recovery(host, log)
    while True:
        code, request = _window_on(app, host, said, log)
        if request is None:
            break
        reopened = _change_key_between_windows(host, request, data_dir, overrides)
        del request  # (its passphrases: not kept for the second window's life)
        if reopened is None:
            return 1
        host, said = reopened
        _tell_recovery(host, log)
    log.info("Iris Desktop exited (%s)", code)
    return code


def _window_on(app: QApplication, host: Any, said: str | None, log: logging.Logger
               ) -> tuple[int, Any]:
    """The main window on ``host`` until it closes (``said``: a passing word in its status
    bar); then the window and the host are closed. Returns the exit code, and the key
    change the window asked for (None: it quit)."""
    window = main_window(host)
    window.show()
    if said and getattr(window, "app_state", None) is not None:  # a passing word, no box
        window.app_state.show_message(said, 30_000)
    before, turn = _quit_on_interrupt(window)
    log.info("window shown (Ctrl+C in this terminal quits)")
    try:
        code = app.exec()
    finally:
        signal.signal(signal.SIGINT, before)
        turn.stop()
        window.shutdown()  # closes the model (model.close()) on its own thread
        host.close()
    change = getattr(window, "key_change", None)
    request = getattr(change, "request", None)
    if request is not None:
        change.request = None  # (the caller holds it until the change is done)
        window.deleteLater()  # a new one opens
    return code, request


def _change_key_between_windows(host: Any, request: Any, data_dir: Any,
                                overrides: Mapping[str, str] | None) -> tuple[Any, str] | None:
    """Change the history's key (``host`` closed), then open a new host on it: with the
    new key, or on a failure (said in a message box; nothing changed) with the current
    one, neither asked again. Returns (the host, what the window says of it), or None
    when the history cannot be opened again (said)."""
    from iris_desktop.core.store import StoreError
    from iris_desktop.host import Host
    from iris_desktop.paths import DataDirError
    from iris_desktop.storage_key import PASSPHRASE_ENV
    from iris_desktop.ui.passphrase_dialog import ask_passphrase
    from iris_desktop.ui.rekey_dialog import change_key_now, reopening

    outcome = change_key_now(host.paths, request)
    if outcome is not None:
        QMessageBox.warning(None, "The chat history's key was not changed",
                            outcome[:1].upper() + outcome[1:].rstrip(".") + ".")
    ask, said = reopening(request, outcome, ask_passphrase)
    # the passphrase is handed to the start (an IRIS_STORAGE_PASSPHRASE of the old one
    # would be refused, and asked no more)
    env = {name: value for name, value in os.environ.items() if name != PASSPHRASE_ENV}
    try:
        return Host(data_dir, dict(overrides or {}), env=env, ask_passphrase=ask), said
    except (StoreError, DataDirError) as exc:
        QMessageBox.critical(None, "Iris Desktop cannot start", str(exc))
        return None
    finally:
        ask.forget()  # the passphrase not used (the other one) is not kept
