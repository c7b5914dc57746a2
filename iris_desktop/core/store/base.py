"""What every part of the Store shares: its one connection, and transactions on it."""

from __future__ import annotations

import functools
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Self

import sqlite_utils


class Connected:
    """One open connection to the database, used by one thread at a time. The parts of
    :class:`~iris_desktop.core.store.Store` build on it; the Store opens it."""

    path: Path
    conn: sqlite3.Connection
    db: sqlite_utils.Database
    #: the last thread_speakers answer, with what it depends on
    _speakers: tuple[tuple, list[str]] | None

    # -- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        self.conn.close()

    @contextmanager
    def stopping_when(self, stale: Callable[[], bool], every: int = 1000) -> Iterator[None]:
        """The statements run inside look at ``stale()`` every ``every`` virtual-machine
        steps, and one found stale stops (sqlite3.OperationalError "interrupted"): a
        search the user has typed past (ui.background)."""
        self.conn.set_progress_handler(stale, every)
        try:
            yield
        finally:
            self.conn.set_progress_handler(None, 0)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """BEGIN IMMEDIATE … COMMIT; everything inside is atomic."""
        if self.conn.in_transaction:
            yield
            return
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            # SQLite has already rolled back after some errors (a full disk, an I/O error):
            # a second ROLLBACK would fail and hide the error that counts
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise
        try:
            self.conn.execute("COMMIT")
        except BaseException:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise

    @contextmanager
    def trial(self) -> Iterator[None]:
        """A change tried and always rolled back: try it, look, leave no trace. Outside a
        transaction it is one (BEGIN … ROLLBACK), inside one a savepoint. Before, it was a
        savepoint everywhere, and a savepoint's RELEASE outside a transaction is a COMMIT:
        on a full disk it failed and left the connection inside a transaction for good, so
        every later write of the process looked saved and was lost at its end (s67)."""
        if not self.conn.in_transaction:
            self.conn.execute("BEGIN")
            try:
                yield
            finally:
                if self.conn.in_transaction:  # (SQLite rolls back itself after some errors)
                    self.conn.execute("ROLLBACK")
            return
        self.conn.execute("SAVEPOINT trial")
        try:
            yield
        finally:
            self.conn.execute("ROLLBACK TO trial")
            self.conn.execute("RELEASE trial")


# -- is the process that wrote a row still running? ---------------------------------------
#
# A row that says "process <pid> is streaming this reply" (streams) or "is compacting this
# thread" (compaction_leases) also records when that process started (process_start). A
# pid is reused once its process is gone: a process with the same pid that started at
# another time is another process, and the writer is dead. Rows from before the start was
# recorded (NULL) fall back to the pid alone.


def process_start(pid: int) -> str | None:
    """When process ``pid`` started, as an opaque token that differs between two processes
    that had the same pid; None when it is gone or this OS does not tell."""
    if pid <= 0:
        return None
    try:
        if sys.platform.startswith("linux"):
            return _linux_start(pid)
        if os.name == "nt":
            return _windows_start(pid)
        return _ps_start(pid)
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


@functools.cache
def _own_start(pid: int) -> str | None:
    return process_start(pid)


def own_process() -> tuple[int, str | None]:
    """This process's pid and start, as a row records its writer."""
    pid = os.getpid()  # a forked child has its own
    return pid, _own_start(pid)


def _same_process(pid: int, started: str | None) -> bool:
    """Whether process ``pid`` is running and is the one that recorded ``started`` (its
    :func:`process_start` then; None: not recorded, the pid alone decides)."""
    if not _exists(pid):
        return False
    if started is None:
        return True
    now = process_start(pid)
    return now is None or now == started  # not told now: as before, the pid decides


def _alive(pid: int, started: str | None = None) -> bool:
    """Whether another process, ``pid`` started at ``started``, is still running (for the
    replies it streams: this process is only starting, so nothing of it streams yet)."""
    if pid == os.getpid():
        return False  # this process, or an earlier one that had its pid
    return _same_process(pid, started)


def _exists(pid: int) -> bool:
    if pid <= 0:  # 0 and negative numbers name process groups, not a process
        return False
    if os.name == "nt":
        return _windows_exists(pid)
    if sys.platform.startswith("linux"):
        try:  # a zombie (killed, not yet reaped by its parent) writes nothing any more
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                return False
        except (OSError, IndexError):
            pass  # gone, or hidden from us (hidepid): the signal below tells
    try:
        os.kill(pid, 0)  # signal 0: only asks (on Windows it would kill)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


@functools.cache
def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _linux_start(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    # "pid (comm) state ppid …": comm may hold spaces and parentheses, so split after the
    # last ")"; the fields after it start at field 3, and starttime (clock ticks after
    # boot) is field 22
    return f"{_boot_id()}:{stat.rsplit(')', 1)[1].split()[22 - 3]}"


def _ps_start(pid: int) -> str | None:
    """macOS and the BSDs: ``ps`` tells when a process started, to the second."""
    out = subprocess.run(["ps", "-o", "lstart=", "-p", str(pid)], capture_output=True, text=True,
                         timeout=10, env={**os.environ, "LC_ALL": "C"}, check=False)
    return " ".join(out.stdout.split()) or None


_PROCESS_QUERY_LIMITED_INFORMATION = 0x1000
_STILL_ACTIVE = 259


def _windows_exists(pid: int) -> bool:
    import ctypes
    from ctypes import wintypes

    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    kernel32.OpenProcess.restype = wintypes.HANDLE
    handle = kernel32.OpenProcess(_PROCESS_QUERY_LIMITED_INFORMATION, False, pid)
    if not handle:
        return ctypes.get_last_error() == 5  # ERROR_ACCESS_DENIED: it exists, not ours to see
    try:
        code = wintypes.DWORD()
        if not kernel32.GetExitCodeProcess(handle, ctypes.byref(code)):
            return True
        return code.value == _STILL_ACTIVE
    finally:
        kernel32.CloseHandle(handle)


def _windows_start(pid: int) -> str | None:
    import ctypes
    from ctypes import wintypes

    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    kernel32.OpenProcess.restype = wintypes.HANDLE
    handle = kernel32.OpenProcess(_PROCESS_QUERY_LIMITED_INFORMATION, False, pid)
    if not handle:
        return None
    try:
        created, exited, kernel, user = (wintypes.FILETIME() for _ in range(4))
        if not kernel32.GetProcessTimes(handle, ctypes.byref(created), ctypes.byref(exited),
                                        ctypes.byref(kernel), ctypes.byref(user)):
            return None
        return str(created.dwHighDateTime << 32 | created.dwLowDateTime)
    finally:
        kernel32.CloseHandle(handle)
