"""The ``run_shell`` tool: a command the user approved, run in its own process group so a
timeout kills everything it started, its exit code and output reported."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from iris_desktop.core.tools.limits import ToolError
from iris_desktop.core.tools.text import CappedText


def check_command(command: str, confirm: Callable[[str], bool] | None) -> None:
    """ToolError unless ``command`` is not blank and ``confirm(command)`` returned ``True``."""
    if not command.strip():
        raise ToolError("command must not be empty")
    if confirm is None or confirm(command) is not True:
        raise ToolError(f"the user refused to run: {command}")


#: what a command never inherits: the history's passphrase (``env`` printed it into the
#: tool result, which goes to the model, a server and the history, and into exports)
PRIVATE_ENV = ("IRIS_STORAGE_PASSPHRASE",)


def command_env() -> dict[str, str]:
    """This process's environment, less :data:`PRIVATE_ENV`."""
    return {name: value for name, value in os.environ.items()
            if name.upper() not in PRIVATE_ENV}


def run_shell(command: str, cwd: Path, timeout_s: float) -> str:
    """Run ``command`` (approved) in ``cwd``; its exit code, stdout and stderr. A command
    that ran is a result whatever its exit code; one that outlives ``timeout_s`` is killed,
    with everything it started, and is a ToolError with what it wrote so far."""
    # Own process group, so a timeout kills the commands the shell started too;
    # otherwise a surviving child keeps the pipes open and the wait never ends.
    group: dict[str, Any] = (
        {"start_new_session": True}
        if os.name == "posix"
        else {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP}
    )
    try:
        with subprocess.Popen(
            command,
            shell=True,
            cwd=cwd,
            env=command_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            **group,
        ) as proc:
            try:
                stdout, stderr = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _kill_tree(proc)
                try:
                    stdout, stderr = proc.communicate(timeout=5)
                except subprocess.TimeoutExpired:
                    stdout, stderr = b"", b""
                raise ToolError(
                    f"command timed out after {timeout_s:g} s and was stopped: "
                    f"{command}\n" + _output(None, stdout, stderr)
                ) from None
    except OSError as exc:
        raise ToolError(f"cannot run {command!r}: {exc.strerror or exc}") from None
    return _output(proc.returncode, stdout, stderr)


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """Kill the shell and everything it started (its own process group / job tree)."""
    try:
        if os.name == "posix":
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            subprocess.run(
                ["taskkill", "/F", "/T", "/PID", str(proc.pid)],
                capture_output=True,
                check=False,
            )
    except (OSError, subprocess.SubprocessError):
        pass
    proc.kill()


def _output(code: int | None, stdout: bytes | None, stderr: bytes | None) -> str:
    out = CappedText()
    if code is not None:
        out.write(f"exit code: {code}\n")
    out_text, err_text = _decode(stdout), _decode(stderr)
    if out_text:
        out.write("stdout:\n" + out_text.rstrip("\n") + "\n")
    if err_text:
        out.write("stderr:\n" + err_text.rstrip("\n") + "\n")
    if not out_text and not err_text:
        out.write("(no output)\n")
    return out.getvalue().rstrip("\n")


def _decode(data: bytes | None) -> str:
    # Process output is not a file the user asked to see verbatim: replace, don't refuse.
    return (data or b"").decode("utf-8", "replace")
