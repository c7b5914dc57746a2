"""The ``run_shell`` tool: a command the user approved, run in its own process group so a
timeout or Stop kills everything it started, its exit code and output reported."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from iris_desktop.core.tools import limits
from iris_desktop.core.tools.limits import STOPPED, ToolError
from iris_desktop.core.tools.text import CappedText


def check_command(command: str, confirm: Callable[[str], bool] | None) -> None:
    """ToolError unless ``command`` is not blank and ``confirm(command)`` returned ``True``.
    ``confirm`` may raise ToolError itself, saying why no one answered (nobody could be
    asked, the window closed): "the user refused" was said of questions never asked."""
    if not command.strip():
        raise ToolError("command must not be empty")
    if confirm is None:
        raise ToolError(f"nobody could be asked to approve it, so it did not run: {command}")
    if confirm(command) is not True:
        raise ToolError(f"the user refused to run: {command}")


#: what a command never inherits: the history's passphrase (``env`` printed it into the
#: tool result, which goes to the model, a server and the history, and into exports), and
#: the hub's tokens (an audit found HF_TOKEN in a tool result)
PRIVATE_ENV = ("IRIS_STORAGE_PASSPHRASE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",
               "HUGGINGFACE_TOKEN")


def command_env() -> dict[str, str]:
    """This process's environment, less :data:`PRIVATE_ENV`."""
    return {name: value for name, value in os.environ.items()
            if name.upper() not in PRIVATE_ENV}


#: how often a running command is checked for Stop, in seconds
POLL_S = 0.1
#: of the output cap, what stderr keeps for itself however much stdout wrote (a noisy
#: command's error message was lost once stdout filled the cap)
STDERR_SHARE = 8
#: how long the pipes may take to close once the command's process group is killed
KILL_GRACE_S = 0.5


def run_shell(command: str, cwd: Path, timeout_s: float,
              cancel: threading.Event | None = None) -> str:
    """Run ``command`` (approved) in ``cwd``; its exit code, stdout and stderr. A command
    that ran is a result whatever its exit code; one that outlives ``timeout_s``, or is
    stopped (``cancel`` set: the turn's Stop), is killed with everything it started, and
    is a ToolError with what it wrote so far. Output is read as it comes and kept up to
    the tools' cap (stdout and stderr each their share), the rest only counted: memory
    stays bounded however much a command writes (a 1.5 GB output took 7.5 GB before). A
    command is never left running: an interrupt (Ctrl+C, quitting) kills it too, and what
    it left in the background is killed once it ends; only a process that left its group
    (``setsid``) can outlive it, and the result then says so."""
    # Own process group, so a timeout kills the commands the shell started too;
    # otherwise a surviving child keeps the pipes open and the wait never ends.
    group: dict[str, Any] = (
        {"start_new_session": True}
        if os.name == "posix"
        else {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP}
    )
    cancel = cancel or threading.Event()
    try:
        proc = subprocess.Popen(command, shell=True, cwd=cwd, env=command_env(),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, **group)
    except OSError as exc:
        raise ToolError(f"cannot run {command!r}: {exc.strerror or exc}") from None
    cap = limits.MAX_OUTPUT_BYTES
    out, err = _Drain(proc.stdout, cap), _Drain(proc.stderr, cap)
    deadline = time.monotonic() + timeout_s
    ended = None

    def running() -> bool:  # the shell, or anything it started that holds its output
        return not _exited(proc) or out.is_alive() or err.is_alive()

    try:
        while running():
            if cancel.is_set():
                ended = STOPPED
            elif time.monotonic() >= deadline:
                ended = f"command timed out after {timeout_s:g} s and was stopped"
            if ended:
                break
            out.join(POLL_S)
    finally:
        # Always, even once the shell has exited: a job it left in the background
        # (``sleep 99 >/dev/null &``) ran on after the call returned. The shell is not
        # reaped yet, so its group's number cannot have passed to another process.
        _kill_tree(proc)
        proc.wait()
        # A process that left the group (setsid) may hold the pipes for ever: the call
        # comes back now, not after waiting on each pipe in turn.
        detached = not _joined((out, err), KILL_GRACE_S)
    if detached:
        ended = f"{ended or 'command ended'}; a process it detached may still run"
    if ended is not None:
        raise ToolError(f"{ended}: {command}\n" + _output(None, out, err))
    return _output(proc.returncode, out, err)


def _exited(proc: subprocess.Popen[bytes]) -> bool:
    """Whether the shell has exited, without reaping it where the system allows (its
    process group's number stays its own until :func:`_kill_tree` has run)."""
    if proc.returncode is not None or not hasattr(os, "waitid"):
        return proc.poll() is not None
    try:
        flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
        return os.waitid(os.P_PID, proc.pid, flags) is not None
    except ChildProcessError:  # reaped already
        return proc.poll() is not None


def _joined(drains: Sequence[threading.Thread], grace_s: float) -> bool:
    """Whether every one of ``drains`` ended within ``grace_s`` seconds in all."""
    until = time.monotonic() + grace_s
    for drain in drains:
        drain.join(max(0.0, until - time.monotonic()))
    return not any(drain.is_alive() for drain in drains)


class _Drain(threading.Thread):
    """Reads one of a command's pipes to its end, keeping its first ``keep`` bytes and
    counting the rest."""

    def __init__(self, pipe, keep: int) -> None:
        super().__init__(daemon=True)
        self.pipe, self.keep = pipe, keep
        self.data = bytearray()
        self.total = 0
        self.start()

    def run(self) -> None:
        with self.pipe:
            while chunk := self.pipe.read1(1 << 16):
                self.total += len(chunk)
                room = self.keep - len(self.data)
                if room > 0:
                    self.data += chunk[:room]

    def text(self, limit: int) -> str:
        """What was read, its first ``limit`` bytes, marked where cut."""
        data = bytes(self.data[:limit])
        # Process output is not a file the user asked to see verbatim: replace, don't refuse.
        text = data.decode("utf-8", "replace")
        if self.total > len(data):
            text += f"\n[output truncated at {len(data)} bytes of {self.total}]"
        return text


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


def _output(code: int | None, out: _Drain, err: _Drain) -> str:
    text = CappedText()
    if code is not None:
        text.write(f"exit code: {code}\n")
    cap = limits.MAX_OUTPUT_BYTES - 256  # room for the labels and the marks
    err_room = min(err.total, cap // STDERR_SHARE)  # stdout's flood never hides the error
    out_text = out.text(cap - err_room)
    err_text = err.text(max(err_room, cap - len(out_text.encode("utf-8", "replace"))))
    if out_text:
        text.write("stdout:\n" + out_text.rstrip("\n") + "\n")
    if err_text:
        text.write("stderr:\n" + err_text.rstrip("\n") + "\n")
    if not out_text and not err_text:
        text.write("(no output)\n")
    return text.getvalue().rstrip("\n")
