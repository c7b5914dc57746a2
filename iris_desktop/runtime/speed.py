"""Why a reply comes slowly, in the words the status bar adds to its rate.

A newcomer who saw "Generating… 0.3 tok/s" had no way to tell why: the computer was busy
with other work, and nothing said so. Below :data:`SLOW_RATE` (slower than people read:
about 5 tokens a second) the rate is followed by its likely cause (the window's status bar; the CLI's stderr on a
terminal, after the reply), from what can be known
without guessing:

- **a server** writes at its own pace: that is said, nothing local is blamed;
- **other programs on the processor**: the one-minute load average (POSIX only) above the
  processors the computer has plus one. A reply's own threads count in the load too (one per
  physical core at most), so a load that high means other work is competing with them;
- **a model large for the computer**: the file's speed class (``runtime.recommend``'s
  rule, bytes per physical core) is "slow": a smaller one writes faster;
- else it is only said to be slow (a GPU that holds the whole model is not blamed; one
  that holds some layers leaves the rest to the cores, which are judged as above).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from typing import Any

from iris_desktop.runtime.cpu import physical_cores
from iris_desktop.runtime.recommend import speed_class

#: tokens a second under which a reply is called slow (people read about 4 words, some 5
#: tokens, a second; the bundled model writes 15–25 on two idle cores)
SLOW_RATE = 2.0


@functools.cache
def _cores() -> int:
    return physical_cores()


def _load() -> float | None:
    """The one-minute load average, or None where the system has none (Windows)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def busy_processor(load: float | None = None, processors: int | None = None) -> str:
    """"other programs are using the processor (load 9.8 on 2)" where the one-minute load
    is at least the processors plus one, else "" (also where the system has no load
    average); ``load`` and ``processors`` are this computer's unless given (tests)."""
    load = _load() if load is None else load
    processors = processors or os.cpu_count() or 1
    if load is not None and load >= processors + 1:
        return f"other programs are using the processor (load {load:.1f} on {processors})"
    return ""


def per_second(rate: float) -> str:
    """A rate as the status bar says it: "6.2 tok/s"; "< 0.1 tok/s" under 0.05 (it read
    "0.0 tok/s", as if nothing came)."""
    return f"{rate:.1f} tok/s" if rate >= 0.05 else "< 0.1 tok/s"


def _whole_on_gpu(device: str) -> bool:
    """Whether the device words ("GPU: <name> · 28/29 layers") say a GPU holds every layer;
    one that holds some of them leaves the rest to the processor's cores."""
    layers = re.search(r"(\d+)/(\d+) layers", device)
    return device.startswith("GPU") and (layers is None or layers.group(1) == layers.group(2))


def slow_words(rate: float | None, facts: Mapping[str, Any] | None, *,
               load: float | None = None, processors: int | None = None,
               cores: int | None = None) -> str:
    """"slow: <why>" for a rate under :data:`SLOW_RATE` tokens a second, else "".
    ``facts`` are the model's (``ModelFacts`` as a dict); ``load``, ``processors`` and
    ``cores`` are this computer's unless given (tests)."""
    if not rate or rate >= SLOW_RATE:
        return ""
    facts = facts or {}
    if facts.get("where", "local") != "local":
        return "slow: the server writes at this pace"
    busy = busy_processor(load, processors)
    if busy:
        return f"slow: {busy}"
    on_gpu = _whole_on_gpu(str(facts.get("device", "")))
    cores = cores or _cores()
    size = int(facts.get("size_bytes") or 0)
    if size and speed_class(size, cores, on_gpu) == "slow":
        return (f"slow: this model is large for {cores} processor cores; "
                "a smaller one writes faster")
    return "slow on this computer now"
