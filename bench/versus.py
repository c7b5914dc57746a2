"""One benchmark, two commits, side by side in one run: the old and the new checkout take
turns (old, new, old, new …) so a drift in the machine's speed falls on both, and every
figure the benchmark prints is set against its twin.

    .venv/bin/python bench/versus.py --old 1c660e5 [--new HEAD] [--rounds 3] \\
        -- bench/context_build.py --repeat 10

``--same-script`` runs the new checkout's copy of the script on both sides (an option the
old copy lacks), when the script itself did not change in a way that matters.

Each commit is checked out once into a temporary git worktree and the benchmark runs there
with that checkout first on ``PYTHONPATH`` (its own ``iris_desktop`` and its own copy of
the benchmark script), with this virtual environment's Python, and ``../shared`` (the
corpus) linked beside it as it is beside this checkout. Lines that read the same
but for their numbers are paired; for each number the median over the rounds is printed,
old and new, with new/old. A figure that is a ratio the benchmark computed itself is the
better one to quote; the whole-run seconds are printed too.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: ``--any-exit``: a benchmark's nonzero exit (ui_latency's 2: a phase over its goal) is a
#: result like its figures, not the end of the comparison
ANY_EXIT = False
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def worktree(rev: str, into: Path) -> Path:
    path = into / rev.replace("/", "_")
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(path), rev],
                   check=True)
    return path


def run(checkout: Path, command: list[str], timeout: float) -> tuple[str, float]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    start = time.monotonic()
    done = subprocess.run([sys.executable, *command], cwd=checkout, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    seconds = time.monotonic() - start
    if done.returncode and not ANY_EXIT:
        sys.exit(f"{checkout.name}: {' '.join(command)} exited {done.returncode}:\n{done.stdout[-2000:]}")
    return done.stdout, seconds


def figures(output: str) -> dict[str, list[float]]:
    """line shape (numbers as #) → its numbers; a shape seen twice gets a counter; the
    line itself under ``("line", shape)``, to show which line a figure came from."""
    out: dict = {}
    for line in output.splitlines():
        numbers = NUMBER.findall(line)
        if not numbers:
            continue
        shape = NUMBER.sub("#", line.strip())
        key, n = shape, 1
        while key in out:
            n += 1
            key = f"{shape} [{n}]"
        out[key] = [float(x.replace(",", "")) for x in numbers]
        out["line", key] = line.strip()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="the commit to compare against")
    parser.add_argument("--new", default="HEAD")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--any-exit", action="store_true",
                        help="go on when the benchmark exits nonzero (a goal it reports missed)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per benchmark run")
    parser.add_argument("--same-script", action="store_true",
                        help="run the new checkout's copy of the benchmark script on both sides (for an "
                             "option the old copy lacks; the script must work with the old code)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="-- the benchmark script and its arguments, relative to the checkout")
    args = parser.parse_args()
    global ANY_EXIT
    ANY_EXIT = args.any_exit
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("name the benchmark after --")
    with tempfile.TemporaryDirectory(prefix="iris-versus-") as tmp:
        shared = REPO.parent / "shared"  # the corpus beside the checkout: beside each worktree too
        if shared.is_dir():
            (Path(tmp) / "shared").symlink_to(shared)
        trees = {"old": worktree(args.old, Path(tmp)), "new": worktree(args.new, Path(tmp))}
        try:
            if args.same_script:
                shutil.copyfile(trees["new"] / command[0], trees["old"] / command[0])
            runs: dict[str, list[dict[str, list[float]]]] = {"old": [], "new": []}
            seconds: dict[str, list[float]] = {"old": [], "new": []}
            for round_ in range(1, args.rounds + 1):
                for side in ("old", "new"):
                    output, took = run(trees[side], command, args.timeout)
                    runs[side].append(figures(output))
                    seconds[side].append(took)
                    print(f"--- round {round_}, {side} ({args.old if side == 'old' else args.new}), "
                          f"{took:.1f} s\n{output.rstrip()}", flush=True)
            report(runs, seconds, args.old, args.new, command)
        finally:
            for path in trees.values():
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)],
                               check=False)


def report(runs, seconds, old: str, new: str, command: list[str]) -> None:
    print(f"\n=== {' '.join(command)}: {old} (old) vs {new} (new), medians of "
          f"{len(seconds['old'])} alternating runs each")
    shapes = [s for s in runs["old"][0]
              if isinstance(s, str) and all(s in r for r in runs["old"] + runs["new"])]
    for shape in shapes:
        sizes = {len(r[shape]) for r in runs["old"] + runs["new"]}
        if len(sizes) != 1:
            continue
        olds = [statistics.median(r[shape][i] for r in runs["old"]) for i in range(sizes.pop())]
        news = [statistics.median(r[shape][i] for r in runs["new"]) for i in range(len(olds))]
        if olds == news:
            continue  # sizes, counts: the same on both sides
        pairs = ", ".join(f"{o:g} → {n:g}" + (f" ({n / o:.2f}×)" if o else "")
                          for o, n in zip(olds, news, strict=True) if o != n)
        print(f"{runs['old'][0]['line', shape]}\n    old → new: {pairs}")
    o, n = statistics.median(seconds["old"]), statistics.median(seconds["new"])
    print(f"whole run: {o:.1f} s → {n:.1f} s ({n / o:.2f}×)")


if __name__ == "__main__":
    main()
