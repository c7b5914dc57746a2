"""What each ``iris-desktop`` command does; ``cli`` parses the arguments and calls these.

Every command works through one :class:`~iris_desktop.host.Host`, as the desktop app
does: ``chat`` is a print loop over the events of ``Host.send``, ``compact`` over those
of ``Host.compact``. Every request shown or sent comes from the host's planner
(``core.planner``), so ``context --draft`` predicts what ``chat`` then sends.
Exit codes: 0 success; 1 a runtime failure (for example a model that will not load);
2 bad usage, invalid settings or a malformed file; 3 ConversationTooLargeException.
"""

from __future__ import annotations

from iris_desktop.commands.chat import chat, compact
from iris_desktop.commands.common import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_TOO_LARGE,
    EXIT_USAGE,
    CliError,
    gone_sentence,
    say,
    stdout_gone,
)
from iris_desktop.commands.config import config
from iris_desktop.commands.context import context
from iris_desktop.commands.conversations import delete, export, import_, switch, threads
from iris_desktop.commands.devices import devices
from iris_desktop.commands.models import models
from iris_desktop.commands.recover import recover
from iris_desktop.commands.rekey import rekey

__all__ = ["COMMANDS", "EXIT_FAIL", "EXIT_OK", "EXIT_TOO_LARGE", "EXIT_USAGE", "CliError", "gone_sentence",
           "say", "stdout_gone"]


def gui(args, overrides) -> int:
    import os
    import sys

    problem = display_problem(os.environ, sys.platform)
    if problem:  # Qt would abort with its own lines (and a core dump), not one sentence
        raise CliError(problem, EXIT_FAIL)
    from iris_desktop.ui.app import run_gui

    return run_gui(args.data_dir, overrides)


#: the libraries Qt's xcb platform plugin needs beside Qt's own (the NEEDED entries of
#: PySide6's libQt6XcbQpa.so.6), with Debian's package names
XCB_LIBRARIES = {
    "xcb-cursor": "libxcb-cursor0", "xcb-icccm": "libxcb-icccm4", "xcb-util": "libxcb-util1",
    "xcb-image": "libxcb-image0", "xcb-keysyms": "libxcb-keysyms1", "xcb-randr": "libxcb-randr0",
    "xcb-render": "libxcb-render0", "xcb-render-util": "libxcb-render-util0",
    "xcb-shape": "libxcb-shape0", "xcb-shm": "libxcb-shm0", "xcb-sync": "libxcb-sync1",
    "xcb": "libxcb1", "xcb-xfixes": "libxcb-xfixes0", "xcb-xkb": "libxcb-xkb1",
    "xkbcommon": "libxkbcommon0", "X11-xcb": "libx11-xcb1", "X11": "libx11-6",
    "xkbcommon-x11": "libxkbcommon-x11-0"}


def display_problem(env, platform: str, find_library=None, load_xcb=None,
                    x_answers=None) -> str | None:
    """Why the window cannot open on Linux, in one sentence, before Qt aborts on it: no
    display at all, or an X display where Qt's xcb plugin cannot load (``load_xcb``, by
    default loading PySide6's libQt6XcbQpa as the dynamic loader would: only a real
    failure counts, a library bundled beside it is found as Qt finds it), naming the
    packages that are missing. None elsewhere, on Wayland, and for a platform set in
    QT_QPA_PLATFORM other than xcb (offscreen, vnc…)."""
    if not platform.startswith("linux"):
        return None
    qpa = env.get("QT_QPA_PLATFORM", "")
    if qpa and not qpa.startswith(("xcb", "wayland")):
        return None
    wayland = _wayland_socket(env)
    if not env.get("DISPLAY") and wayland is None:
        if env.get("WAYLAND_DISPLAY"):
            return (f"there is no display to open the window on: WAYLAND_DISPLAY names "
                    f"{env['WAYLAND_DISPLAY']!r}, which is not there (a variable left from "
                    "another session?), and DISPLAY is not set: start Iris Desktop in a "
                    "desktop session, or use the command line ('iris-desktop --help')")
        return ("there is no display to open the window on (neither DISPLAY nor "
                "WAYLAND_DISPLAY is set): start Iris Desktop in a desktop session, or use "
                "the command line ('iris-desktop --help')")
    if wayland is not None and not qpa.startswith("xcb"):
        return None  # (with its socket missing, Qt falls back to xcb: checked below)
    failure = (load_xcb or _load_xcb)()
    if failure is None:
        display = env.get("DISPLAY")
        if display and (x_answers or _x_answers)(display) is False:  # Qt aborted on it
            return (f"there is no display to open the window on: DISPLAY is {display!r}, but "
                    "no X server answers there (a variable left from another session, or a "
                    "server that refuses this user): start Iris Desktop in a desktop session, "
                    "or use the command line ('iris-desktop --help')")
        return None
    if find_library is None:
        from ctypes.util import find_library
    missing = [package for lib, package in XCB_LIBRARIES.items() if find_library(lib) is None]
    needed = ", ".join(missing) if missing else failure.split(":", 1)[0]
    install = f" (on Debian or Ubuntu: sudo apt-get install {' '.join(missing)})" if missing else ""
    return f"the window needs libraries your system lacks: {needed}{install}"


def _wayland_socket(env) -> str | None:
    """The Wayland compositor's socket WAYLAND_DISPLAY names (a name is under
    XDG_RUNTIME_DIR), if it is there; else None. A variable left from another session
    (sudo, su, ssh) named a socket that was not there: Qt fell back to xcb and aborted."""
    import os

    name = env.get("WAYLAND_DISPLAY")
    if not name:
        return None
    path = name if os.path.isabs(name) else os.path.join(env.get("XDG_RUNTIME_DIR") or "", name)
    return path if os.path.isabs(path) and os.path.exists(path) else None


#: how long the check waits for an X server to answer (a remote one may be slow)
X_ANSWER_S = 5.0


def _x_answers(display: str) -> bool | None:
    """Whether an X server answers at ``display`` (libxcb's connect, closed at once); None
    when that cannot be told here (no libxcb, or no answer within :data:`X_ANSWER_S`: Qt
    then tries itself). Before, a DISPLAY with no server behind it made Qt abort with
    advice to install libraries that were there."""
    import ctypes
    import ctypes.util
    import threading

    name = ctypes.util.find_library("xcb")
    if name is None:
        return None
    try:
        xcb = ctypes.CDLL(name)
    except OSError:
        return None
    xcb.xcb_connect.restype = ctypes.c_void_p
    xcb.xcb_connect.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    xcb.xcb_connection_has_error.argtypes = [ctypes.c_void_p]
    xcb.xcb_disconnect.argtypes = [ctypes.c_void_p]
    answer: list[bool] = []

    def connect() -> None:
        conn = xcb.xcb_connect(display.encode(), None)
        answer.append(xcb.xcb_connection_has_error(conn) == 0)
        xcb.xcb_disconnect(conn)

    worker = threading.Thread(target=connect, daemon=True)
    worker.start()
    worker.join(X_ANSWER_S)
    return answer[0] if answer else None


def _load_xcb() -> str | None:
    """Load Qt's xcb platform library as Qt would; None when it loads (or is not there to
    try), else the loader's error ("libxcb-icccm.so.4: cannot open shared object file…")."""
    import ctypes
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("PySide6")
    if spec is None or not spec.submodule_search_locations:
        return None
    library = Path(next(iter(spec.submodule_search_locations))) / "Qt" / "lib" / "libQt6XcbQpa.so.6"
    if not library.exists():
        return None
    try:
        ctypes.CDLL(str(library))
    except OSError as exc:
        return str(exc)
    return None


COMMANDS = {
    "import": import_,
    "export": export,
    "threads": threads,
    "delete": delete,
    "switch": switch,
    "context": context,
    "chat": chat,
    "models": models,
    "compact": compact,
    "config": config,
    "recover": recover,
    "rekey": rekey,
    "devices": devices,
    "gui": gui,
}
