"""The tools' limits and fixed messages, and how a tool says no: :class:`ToolError`,
:class:`ToolResult` and :func:`check_cancel`.

The other modules read a limit as ``limits.NAME`` when they use it, never as a copied
binding, so a test that lowers one here is heard everywhere.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

MAX_OUTPUT_BYTES = 1 << 20
"""Hard cap on one tool output, in UTF-8 bytes (the marker comes on top)."""
DEFAULT_READ_LIMIT = 200
MAX_READ_LINE_BYTES = 4096
"""read_file shows at most this many bytes of a line, then marks the cut and its length."""
LINE_COUNT_MAX_BYTES = 8 << 20
"""read_file counts the lines of files up to this size; of larger ones it gives the size."""
READ_CHUNK_BYTES = 1 << 20
MAX_SEARCH_MATCHES = 200
SEARCH_TIME_LIMIT_S = 20.0
"""A search stops after this long and says it was cut short."""
REGEX_LINE_TIME_LIMIT_S = 0.5
"""A pattern that takes longer on one line (catastrophic backtracking) stops the search."""
MAX_PATTERN_REPEAT = 10_000
"""A search pattern may repeat something at most this many times (``x{10000}``)."""
MAX_PATTERN_SIZE = 20_000
"""A search pattern may stand for at most this many elements once its repeats are counted
out (``(ab){3}`` is six): the regex engine writes each one out when it compiles, at about
600 bytes apiece, so ``a{1000000000}`` would need hundreds of gigabytes."""
MAX_SEARCH_FILES = 50_000
MAX_SEARCH_FILE_BYTES = 16 << 20
MAX_MATCH_LINE_CHARS = 400
BINARY_SNIFF_BYTES = 8192
SEARCH_MEMORY_BYTES = 1 << 30
"""The memory a search may take on top of what the app maps already (Linux)."""

NO_ROOTS = "no folders are allowed yet; add one in tools.allowed_paths"
SHELL_DISABLED = "run_shell is disabled (tools.shell = false)"
STOPPED = "stopped by the user before it finished"
OUT_OF_MEMORY = (
    "the search needed more memory than the {limit} MB it may use; simplify the pattern "
    "(nested or long repeats, alternatives that overlap) or search fewer or smaller files"
)


class ToolError(Exception):
    """A refusal or failure; the message is shown to the model and the user."""


@dataclass(frozen=True)
class ToolResult:
    """Outcome of one tool call. ``ok`` is False only for refusals and failures."""

    ok: bool
    content: str


def check_cancel(cancel: threading.Event) -> None:
    """ToolError (:data:`STOPPED`) once ``cancel`` is set."""
    if cancel.is_set():
        raise ToolError(STOPPED)
