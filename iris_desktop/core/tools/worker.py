"""The search's worker process: a search run in a forked child under an address-space
limit (:func:`in_worker`).

A regular expression can need far more memory than its text suggests (a repeat is written
out when it compiles; backtracking over a long line keeps a stack). The pattern is checked
first (:func:`.patterns.check_pattern`), and on Linux the search then runs in a child
forked for it, under an address-space limit of what the app already maps plus
:data:`.limits.SEARCH_MEMORY_BYTES`: an allocation over it fails there as a MemoryError, a
tool error, and the app itself never grows. The child only walks files and matches lines,
and leaves with os._exit. Elsewhere (macOS does not enforce RLIMIT_AS; Windows has no fork)
it runs on the calling thread.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable

from iris_desktop.core.tools import limits
from iris_desktop.core.tools.limits import OUT_OF_MEMORY, ToolError, check_cancel

try:
    import resource
except ImportError:  # Windows: no address-space limit, and the search runs in-thread
    resource = None  # type: ignore[assignment]

_WORKER_GRACE_S = 15.0
_MEMORY_EXIT = 86  # the child's exit code when even its report failed for lack of memory
_IN_WORKER = sys.platform.startswith("linux") and hasattr(os, "fork") and resource is not None


def in_worker(search: Callable[[], str], cancel: threading.Event) -> str:
    """``search()`` run in a memory-limited child process where the OS allows it (see above);
    its ToolError comes back as one. Cancelling ``cancel`` stops the child at once."""
    limit = limits.SEARCH_MEMORY_BYTES  # read at call time so tests can lower it
    pid = -1
    if _IN_WORKER:
        read_end, write_end = os.pipe()
        try:
            with warnings.catch_warnings():  # 3.12+ warns about forking a threaded process:
                warnings.simplefilter("ignore", DeprecationWarning)  # the child only searches
                pid = os.fork()
        except OSError:  # no process to spare: the pattern is checked, search here
            os.close(read_end)
            os.close(write_end)
    if pid < 0:
        try:
            return search()
        except MemoryError:
            raise ToolError("the search ran out of memory; simplify the pattern (nested or long "
                            "repeats, alternatives that overlap) or search fewer or smaller "
                            "files") from None
    if pid == 0:  # the child: never returns
        os.close(read_end)
        _run_child(search, write_end, limit)
    os.close(write_end)
    try:
        data = _read_child(read_end, cancel)
    finally:
        os.close(read_end)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _, status = os.waitpid(pid, 0)
    if data:
        kind, text = json.loads(data)
        if kind == "ok":
            return text
        raise ToolError(text)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == _MEMORY_EXIT:
        raise ToolError(OUT_OF_MEMORY.format(limit=limit >> 20))
    how = (f"was killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
           else f"ended with code {os.WEXITSTATUS(status)}")
    raise ToolError(f"the search process {how} before it finished (most likely for lack of "
                    "memory); simplify the pattern or narrow the path")


def _run_child(search: Callable[[], str], write_end: int, limit: int) -> None:
    code = 0
    try:
        try:
            with open("/proc/self/statm", encoding="ascii") as statm:
                mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            resource.setrlimit(resource.RLIMIT_AS, (mapped + limit, resource.RLIM_INFINITY))
            result = ["ok", search()]
        except ToolError as exc:
            result = ["error", str(exc)]
        except MemoryError:
            result = ["error", OUT_OF_MEMORY.format(limit=limit >> 20)]
        except Exception as exc:  # noqa: BLE001 - told as the tool's failure, like Sandbox.run
            result = ["error", f"search_files failed: {type(exc).__name__}: {exc}"]
        data = json.dumps(result).encode("utf-8", "replace")
        with open(write_end, "wb") as pipe:
            pipe.write(data)
    except MemoryError:
        code = _MEMORY_EXIT
    except BaseException:  # noqa: BLE001 - the child must never return into the app
        code = 1
    finally:
        os._exit(code)


def _read_child(read_end: int, cancel: threading.Event) -> bytes:
    """Everything the child writes, until it closes its end; ToolError once ``cancel`` is
    set, or when the child outlives the search's own time limit by far."""
    chunks: list[bytes] = []
    time_limit = limits.SEARCH_TIME_LIMIT_S
    deadline = time.monotonic() + time_limit + _WORKER_GRACE_S
    while True:
        check_cancel(cancel)
        if time.monotonic() > deadline:
            raise ToolError(f"the search did not finish within {time_limit:g} s and "
                            "was stopped; narrow the path or the pattern")
        ready, _, _ = select.select([read_end], [], [], 0.05)
        if ready:
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
