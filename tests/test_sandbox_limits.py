"""Sandbox hardening: slow patterns, huge lines, Stop, and symlink races.

Each test reproduces a finding of the tool-sandbox security review. Limits are generous
and loops are bounded by counts, so a slow machine makes a test slower, never red.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from iris_desktop.core.tools import Sandbox, ToolResult, limits, worker

SECRET = "TOPSECRET-do-not-leak"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    (root / "notes.txt").write_text("hello\nneedle here\n", encoding="utf-8")
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(f"{SECRET}\n", encoding="utf-8")
    return outside


def _symlink_or_skip(tmp_path: Path) -> None:
    try:
        (tmp_path / "probe").symlink_to(tmp_path)
    except (OSError, NotImplementedError):
        pytest.skip(reason="symlinks are not available here")


# --- 1. a slow pattern cannot freeze the app --------------------------------------------

_SEARCH_WITH_TICKER = textwrap.dedent(
    """
    import json, sys, threading, time
    from iris_desktop.core.tools import Sandbox

    ticks, done = [], threading.Event()

    def tick():  # stands in for the GUI thread: it needs the GIL every 10 ms
        while not done.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.01)

    threading.Thread(target=tick, daemon=True).start()
    start = time.monotonic()
    result = Sandbox([sys.argv[1]]).run("search_files", {"pattern": sys.argv[2]})
    end = time.monotonic()
    done.set()
    during = [t for t in ticks if start <= t <= end]
    gaps = [b - a for a, b in zip([start, *during], [*during, end])]
    print(json.dumps({"ok": result.ok, "content": result.content,
                      "seconds": end - start, "longest_gap": max(gaps)}))
    """
)


@pytest.mark.parametrize(
    ("pattern", "says"),
    [
        (r"(a+)+$", ""),  # the review's reproduction; the regex engine may just answer it
        (r"(a|aa)+$", "simplify it"),  # exponential for the regex engine too: its limit acts
    ],
)
def test_catastrophic_pattern_is_bounded_and_other_threads_keep_running(
    tmp_path: Path, pattern: str, says: str
) -> None:
    folder = tmp_path / "a"
    folder.mkdir()
    # 27 "a"s took 10 s with `re`; each extra two multiply that by 4: 60 would take years.
    (folder / "f.txt").write_text("a" * 60 + "!\n", encoding="utf-8")
    # A subprocess, so that a search holding the GIL cannot stall this test's own clock.
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _SEARCH_WITH_TICKER, str(folder), pattern],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
            check=True,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"search_files with {pattern!r} ran for over 120 s")
    report = json.loads(proc.stdout)
    assert report["ok"], report["content"]
    assert report["content"].startswith("0 matches")
    assert says in report["content"]
    assert report["seconds"] < 60  # bounded by a per-line limit well under a second
    assert report["longest_gap"] < 5  # the ticker was never frozen for the whole search


def test_search_time_limit_cuts_short_and_says_so(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "SEARCH_TIME_LIMIT_S", 0.0)
    result = Sandbox([root]).run("search_files", {"pattern": "needle"})
    assert result.ok, result.content
    assert result.content.startswith("0 matches")
    assert "search cut short after" in result.content


class _StopAfter(threading.Event):
    """A cancel event that reads as set from check number ``set_from`` on, as if the user
    pressed Stop right then; counts its checks."""

    def __init__(self, set_from: int) -> None:
        super().__init__()
        self.checks = 0
        self._set_from = set_from

    def is_set(self) -> bool:
        self.checks += 1
        return self.checks >= self._set_from


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("search_files", {"pattern": "line"}),
        ("read_file", {"path": "many.txt", "limit": 10_000}),
        ("list_directory", {"path": "."}),
    ],
)
def test_stop_ends_a_file_tool_at_the_next_check(root: Path, name: str, arguments: dict) -> None:
    (root / "many.txt").write_text("line\n" * 5000, encoding="utf-8")
    for index in range(50):
        (root / f"file{index:02}.txt").write_text("line\n", encoding="utf-8")
    box = Sandbox([root])
    assert box.run(name, arguments, cancel=threading.Event()).ok  # never set: runs to the end

    cancel = _StopAfter(set_from=10)
    result = box.run(name, arguments, cancel=cancel)
    assert result == ToolResult(False, "error: stopped by the user before it finished")
    if name == "search_files" and worker._IN_WORKER:
        return  # the search ran in a forked worker: the checks were counted by its copy
    assert cancel.checks == 10  # it stopped at the first check that saw Stop


# --- 2. read_file memory stays bounded ----------------------------------------------------


def _peak_bytes(call: Callable[[], ToolResult]) -> tuple[ToolResult, int]:
    tracemalloc.start()
    try:
        result = call()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_read_file_on_a_huge_line_uses_little_memory(root: Path) -> None:
    big = root / "big.log"
    with big.open("wb") as handle:
        handle.write(b"log line\n" * 2000)
        handle.truncate(512 << 20)  # sparse: one 512 MB line of NUL bytes after line 2000
    box = Sandbox([root])

    result, peak = _peak_bytes(lambda: box.run("read_file", {"path": "big.log"}))
    assert result.ok, result.content
    assert peak < 50 << 20
    header = result.content.splitlines()[0]
    assert header == "big.log: lines 1-200 (file is 536,870,912 bytes; continue with offset=200)"

    result, peak = _peak_bytes(
        lambda: box.run("read_file", {"path": "big.log", "offset": 1999, "limit": 5})
    )
    assert result.ok, result.content
    assert peak < 50 << 20
    lines = result.content.splitlines()
    assert lines[0] == "big.log: lines 2000-2001 of 2001"
    assert lines[1] == "  2000\tlog line"
    cap = limits.MAX_READ_LINE_BYTES
    huge = (512 << 20) - 2000 * 9
    assert lines[2] == f"  2001\t{chr(0) * cap}… [line cut at {cap:,} of {huge:,} bytes]"


def test_long_line_is_cut_with_a_marker_and_the_rest_is_read(root: Path) -> None:
    cap = limits.MAX_READ_LINE_BYTES
    # A multi-byte character straddles the cut: it is left out, not turned into garbage.
    (root / "wide.txt").write_text("x" * (cap - 1) + "é" * 10 + "\nnext\n", encoding="utf-8")
    content = Sandbox([root]).run("read_file", {"path": "wide.txt"}).content
    assert content.splitlines() == [
        "wide.txt: lines 1-2 of 2",
        f"     1\t{'x' * (cap - 1)}… [line cut at {cap:,} of {cap + 19:,} bytes]",
        "     2\tnext",
    ]


# --- 3. symlink races cannot lead outside -------------------------------------------------

# Each race ends after this many swaps or calls, whichever comes first (the loops compete
# for the GIL, so either can starve the other); the old code leaked a few times in each.
RACE_SWAPS = 10_000
RACE_CALLS = 10_000

# Windows refuses to rename a name that the reading thread holds open, so the swapping
# thread cannot run there; tools/safe_files.py describes what Windows relies on instead.
races = pytest.mark.skipif(os.name == "nt", reason="Windows cannot swap names held open")


def _race(swap: Callable[[], None], call: Callable[[], ToolResult]) -> list[ToolResult]:
    """The results of ``call``, called over and over while another thread runs ``swap``."""
    failures: list[BaseException] = []
    done = threading.Event()

    def racer() -> None:
        try:
            for _ in range(RACE_SWAPS):
                if done.is_set():
                    return
                swap()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failures.append(exc)

    thread = threading.Thread(target=racer)
    thread.start()
    results = []
    while thread.is_alive() and len(results) < RACE_CALLS:
        results.append(call())
    done.set()
    thread.join()
    assert not failures, failures
    return results


def _swap_file_and_link(name: Path, target: Path) -> Callable[[], None]:
    """Each call atomically turns file ``name`` into a symlink to ``target``, or back (an
    even number of calls leaves the file in place)."""
    original, spare = name.with_name(".original"), name.with_name(".spare")
    os.link(name, original)

    def swap() -> None:
        if name.is_symlink():
            os.link(original, spare)
        else:
            os.symlink(target, spare)
        os.replace(spare, name)

    return swap


def _swap_folder_and_link(name: Path, target: Path) -> Callable[[], None]:
    """Each call turns folder ``name`` into a symlink to ``target``, or back (an even
    number of calls leaves the folder in place)."""
    stash = name.with_name(".stash")

    def swap() -> None:
        if name.is_symlink():
            name.unlink()
            stash.rename(name)
        else:
            name.rename(stash)
            name.symlink_to(target)

    return swap


@races
@pytest.mark.parametrize("tool, arguments, read", [
    ("read_file", {"path": "racy.txt"}, "harmless"),
    ("search_files", {"pattern": "TOPSECRET|harmless"}, "racy.txt:1: harmless"),
])
def test_a_file_swapped_for_an_outside_symlink_is_never_read(
    tmp_path: Path, root: Path, outside: Path, tool: str, arguments: dict, read: str
) -> None:
    _symlink_or_skip(tmp_path)
    racy = root / "racy.txt"
    racy.write_text("harmless\n", encoding="utf-8")
    box = Sandbox([root])
    results = _race(
        _swap_file_and_link(racy, outside / "secret.txt"),
        lambda: box.run(tool, arguments),
    )
    leaks = sum(SECRET in result.content for result in results)
    assert leaks == 0, f"{leaks} of {len(results)} calls of {tool} read the outside file"
    assert any(read in result.content for result in results)  # it did read in between


@races
def test_list_directory_never_lists_a_swapped_in_outside_folder(
    tmp_path: Path, root: Path, outside: Path
) -> None:
    _symlink_or_skip(tmp_path)
    (root / "racy").mkdir()
    (root / "racy" / "inside.txt").write_text("fine\n", encoding="utf-8")
    box = Sandbox([root])
    results = _race(
        _swap_folder_and_link(root / "racy", outside),
        lambda: box.run("list_directory", {"path": "racy"}),
    )
    leaks = sum("secret.txt" in result.content for result in results)
    assert leaks == 0, f"{leaks} of {len(results)} listings showed the outside folder"
    assert any("inside.txt" in result.content for result in results)


@races
@pytest.mark.parametrize("path", [".", "racy"])
def test_search_files_never_walks_into_a_swapped_in_outside_folder(
    tmp_path: Path, root: Path, outside: Path, path: str
) -> None:
    _symlink_or_skip(tmp_path)
    (root / "racy").mkdir()
    for index in range(20):
        (root / "racy" / f"{index}.txt").write_text("TOPSECRET-lookalike\n", encoding="utf-8")
        # The same names outside: a path looked up again after a swap finds the secret.
        (outside / f"{index}.txt").write_text(f"{SECRET}\n", encoding="utf-8")
    box = Sandbox([root])
    swap = _swap_folder_and_link(root / "racy", outside)
    results = _race(swap, lambda: box.run("search_files", {"pattern": "TOPSECRET", "path": path}))
    leaks = sum(SECRET in result.content for result in results)
    assert leaks == 0, f"{leaks} of {len(results)} searches read the outside folder"
    # the search still works once the folder is back: during the race a search in a
    # forked worker is slow enough that every one may meet a swap
    if (root / "racy").is_symlink():
        swap()
    after = box.run("search_files", {"pattern": "TOPSECRET", "path": path})
    assert "TOPSECRET-lookalike" in after.content and SECRET not in after.content


