"""Runtime hook: let the windowed Windows build print when it runs as a command.

A ``--windowed`` app on Windows has no console, so PyInstaller leaves ``sys.stdout`` and
``sys.stderr`` as None and ``iris-desktop --self-test`` (or any CLI command) would print
nothing. When the app is started with arguments, use the standard handles it inherited
(a CI runner's pipes, a redirect), else attach to the console of the terminal it was
started from. Started from Explorer or the Start menu (no arguments) nothing changes.
Linux and macOS keep their stdout anyway.
"""

import sys


def _stream_from_std_handle(which: int):
    import ctypes
    import msvcrt
    import os

    kernel32 = ctypes.windll.kernel32
    kernel32.GetStdHandle.restype = ctypes.c_void_p
    handle = kernel32.GetStdHandle(which)
    if not handle or handle == ctypes.c_void_p(-1).value:
        return None
    try:
        fd = msvcrt.open_osfhandle(handle, os.O_WRONLY)
        return open(fd, "w", encoding="utf-8", errors="replace", buffering=1, closefd=False)  # noqa: SIM115
    except OSError:
        return None


def _attach_parent_console() -> None:
    if sys.platform != "win32" or len(sys.argv) < 2:
        return
    if sys.stdout is not None and sys.stderr is not None:
        return
    STD_OUTPUT_HANDLE, STD_ERROR_HANDLE = -11, -12
    if sys.stdout is None:
        sys.stdout = _stream_from_std_handle(STD_OUTPUT_HANDLE)
    if sys.stderr is None:
        sys.stderr = _stream_from_std_handle(STD_ERROR_HANDLE)
    if sys.stdout is not None and sys.stderr is not None:
        return
    import ctypes

    ATTACH_PARENT_PROCESS = -1
    if not ctypes.windll.kernel32.AttachConsole(ATTACH_PARENT_PROCESS):
        return
    try:
        if sys.stdout is None:
            sys.stdout = open("CONOUT$", "w", encoding="utf-8", errors="replace", buffering=1)  # noqa: SIM115
        if sys.stderr is None:
            sys.stderr = open("CONOUT$", "w", encoding="utf-8", errors="replace", buffering=1)  # noqa: SIM115
    except OSError:
        pass


_attach_parent_console()
