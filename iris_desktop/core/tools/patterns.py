"""The search pattern's guard: a pattern whose compiled form would take unbounded memory is
refused before the regex engine sees it (:func:`check_pattern`)."""

from __future__ import annotations

import re
import re._constants as _re_constants  # the parse tree's opcodes (sre_constants before 3.11)
import re._parser as _re_parser  # Python's own regex parser (sre_parse before 3.11)
from collections.abc import Iterator
from typing import Any

import regex

from iris_desktop.core.tools import limits
from iris_desktop.core.tools.limits import ToolError

_REPEATS = frozenset(
    op for op in (getattr(_re_constants, name, None)
                  for name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")) if op is not None
)
# a {m,n} as the regex module reads it: a count that is not one is a literal brace
_COUNTS = regex.compile(r"\{\s*(\d*)\s*(?:,\s*(\d*)\s*)?\}")


def check_pattern(pattern: str) -> None:
    """ToolError when compiling ``pattern`` would take unbounded memory: a repeat count over
    :data:`.limits.MAX_PATTERN_REPEAT`, or over :data:`.limits.MAX_PATTERN_SIZE` elements
    counted out.

    The pattern is read by Python's own ``re`` parser, whose syntax the regex module
    extends. A pattern only the regex module reads (``\\p{L}``, fuzzy matching) is judged
    from its text alone, more strictly: every count in it multiplied together, as if each
    repeat were nested in the one before.
    """
    if len(pattern) > limits.MAX_PATTERN_SIZE:
        raise ToolError(f"the pattern is {len(pattern):,} characters long; at most "
                        f"{limits.MAX_PATTERN_SIZE:,} are allowed")
    try:
        parsed = _re_parser.parse(pattern)
    except (re.error, RecursionError, OverflowError, ValueError, TypeError):
        parsed = None
    if parsed is not None:
        try:
            _pattern_size(parsed)
        except RecursionError:
            raise ToolError("the pattern is nested too deeply") from None
        return
    size = len(pattern)
    for match in _COUNTS.finditer(pattern):
        low, high = match.group(1), match.group(2)
        counts = [int(text) for text in (low, high) if text]
        if counts and max(counts) > limits.MAX_PATTERN_REPEAT:
            raise ToolError(_too_many_repeats(max(counts)))
        size *= max(int(low or 0), 1)
        if size > limits.MAX_PATTERN_SIZE:
            raise ToolError(_too_large_pattern())


def _pattern_size(items: Any) -> int:
    """How many elements a parsed pattern (``re._parser``'s tree) stands for, its repeats
    counted out; ToolError as soon as a count is over :data:`.limits.MAX_PATTERN_REPEAT`."""
    size = 0
    for op, value in items:
        if op in _REPEATS:
            low, high, body = value
            bound = low if high == _re_constants.MAXREPEAT else max(low, high)
            if bound > limits.MAX_PATTERN_REPEAT:
                raise ToolError(_too_many_repeats(bound))
            size += 1 + max(low, 1) * _pattern_size(body)
        else:
            size += 1 + sum(_pattern_size(sub) for sub in _parts(value))
        if size > limits.MAX_PATTERN_SIZE:
            raise ToolError(_too_large_pattern())
    return size


def _parts(value: Any) -> Iterator[Any]:
    """The sub-patterns inside one node's value (groups, branches, lookarounds…)."""
    if isinstance(value, _re_parser.SubPattern):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _parts(item)


def _too_many_repeats(count: int) -> str:
    return (f"the pattern has a repeat count of {count:,}, over the limit of "
            f"{limits.MAX_PATTERN_REPEAT:,} (the regex engine needs memory for every repeat)")


def _too_large_pattern() -> str:
    return (f"the pattern is too large once its repeats are counted out (over "
            f"{limits.MAX_PATTERN_SIZE:,} elements); use smaller counts or fewer nested repeats")
