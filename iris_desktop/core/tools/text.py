"""Text as the tools read and write it: output capped at :data:`.limits.MAX_OUTPUT_BYTES`
(:class:`CappedText`), binary files told apart, a file's lines for the search, and
``read_file``'s numbered lines, each cut at :data:`.limits.MAX_READ_LINE_BYTES`, read in
bounded memory however long a line is."""

from __future__ import annotations

import codecs
import io
import os
import threading
from collections.abc import Iterator

from iris_desktop.core.tools import limits
from iris_desktop.core.tools.limits import check_cancel


class CappedText:
    """Accumulates output up to ``MAX_OUTPUT_BYTES`` UTF-8 bytes, counting the rest.

    Memory stays bounded however much is written; :meth:`getvalue` appends the
    truncation marker when anything was dropped.
    """

    def __init__(self) -> None:
        self._cap = limits.MAX_OUTPUT_BYTES  # read at call time so tests can lower it
        self._parts: list[str] = []
        self._kept = 0
        self.total = 0

    def write(self, text: str) -> None:
        data = text.encode("utf-8", "replace")
        self.total += len(data)
        room = self._cap - self._kept
        if room <= 0:
            return
        if len(data) > room:
            # Cut on a byte boundary, then drop a split multi-byte character.
            text = data[:room].decode("utf-8", "ignore")
            data = text.encode("utf-8")
        self._parts.append(text)
        self._kept += len(data)

    def fits(self, text: str) -> bool:
        """Whether ``text`` would be kept whole."""
        return self._kept + len(text.encode("utf-8", "replace")) <= self._cap

    def getvalue(self) -> str:
        text = "".join(self._parts)
        if self.total > self._kept:
            text += f"\n[output truncated at {self._cap} bytes of {self.total}]"
        return text


def is_binary(head: bytes) -> bool:
    """Whether a file starting with ``head`` is binary: a NUL byte in its first 8 KiB."""
    return b"\0" in head[: limits.BINARY_SNIFF_BYTES]


def text_lines(fd: int) -> tuple[list[str], str | None]:
    """The lines of the open file ``fd`` if it is UTF-8 text, or ``([], reason)``: why it
    was skipped, ``"too_big"``, ``"unreadable"`` or ``"not_text"``. Leaves ``fd`` open."""
    try:
        if os.fstat(fd).st_size > limits.MAX_SEARCH_FILE_BYTES:
            return [], "too_big"
        with open(fd, "rb", closefd=False) as handle:
            data = handle.read(limits.MAX_SEARCH_FILE_BYTES + 1)
    except OSError:
        return [], "unreadable"
    if len(data) > limits.MAX_SEARCH_FILE_BYTES:  # it grew after fstat
        return [], "too_big"
    if is_binary(data):
        return [], "not_text"
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError:
        return [], "not_text"
    # Split on "\n" only, so line numbers agree with read_file.
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    if lines[-1] == "":
        lines.pop()
    return lines, None


def _capped_lines(
    handle: io.BufferedReader, cancel: threading.Event
) -> Iterator[tuple[bytes, int]]:
    """Each line of ``handle`` as (its first :data:`.limits.MAX_READ_LINE_BYTES` bytes, its
    length in bytes), both without the newline.

    Memory stays bounded however long a line is: past the cap, the line is read in chunks
    and only counted.
    """
    cap = limits.MAX_READ_LINE_BYTES
    while True:
        check_cancel(cancel)
        line = handle.readline(cap + 1)
        if not line:
            return
        length, piece = len(line), line
        while piece and not piece.endswith(b"\n"):  # longer than the cap, or the last line
            check_cancel(cancel)
            piece = handle.readline(limits.READ_CHUNK_BYTES)
            length += len(piece)
        if piece.endswith(b"\n"):
            length -= 1
        yield line[: min(cap, length)], length


def _shown_line(head: bytes, length: int, first: bool) -> str:
    """A line as read_file shows it, from :func:`_capped_lines`: the byte-order mark and a
    final carriage return dropped, a cut marked. Raises UnicodeDecodeError unless UTF-8."""
    if length > len(head):
        # Not final: the cut may split a character, whose first bytes are then left out.
        text = codecs.getincrementaldecoder("utf-8")().decode(head)
        text += f"… [line cut at {len(head):,} of {length:,} bytes]"
    else:
        text = head.decode("utf-8").removesuffix("\r")
    return text.removeprefix("\ufeff") if first else text


def numbered_lines(
    handle: io.BufferedReader, offset: int, limit: int, count_all: bool, cancel: threading.Event
) -> tuple[str, int, bool]:
    """Lines ``offset+1`` to ``offset+limit`` of ``handle``, numbered as read_file shows them.

    Returns (that text, the number of lines read, whether the end was reached). Reads no
    further than the last line shown unless ``count_all``. A line that would pass the
    output cap is not begun: the lines read end at the last one shown whole (the header
    said "lines 1-40000 of 40000" over 18,591 of them, with no offset to go on from).
    Raises UnicodeDecodeError when a shown line is not UTF-8.
    """
    body = CappedText()
    number = 0
    for number, (head, length) in enumerate(_capped_lines(handle, cancel), start=1):
        if offset < number <= offset + limit:
            line = f"{number:>6}\t{_shown_line(head, length, first=number == 1)}\n"
            if number > offset + 1 and not body.fits(line):  # (a first line is cut, marked)
                return body.getvalue(), number - 1, False
            body.write(line)
        if number == offset + limit and not count_all:
            return body.getvalue(), number, not handle.peek(1)
    return body.getvalue(), number, True
