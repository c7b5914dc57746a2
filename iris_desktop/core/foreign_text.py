"""Text another app wrote not quite as UTF-8, repaired where the meaning is certain
(:mod:`iris_desktop.core.foreign` reads exports through it):

- CESU-8 (MySQL's ``utf8mb3`` dumps, Java's modified UTF-8): a character past U+FFFF (an
  emoji) written as its two UTF-16 halves, three bytes each. Strict UTF-8 refuses those
  bytes, and so refused the whole export; they are decoded to the character they stand
  for (:func:`read_text`, :func:`cesu8`).
- Windows-1252 (or Latin-1) text, which an attached file may be
  (:func:`.attachments.windows_1252`), is not imported: its refusal says what it looks
  like and how to import it (:func:`read_text`). (A wrong guess would store every chat of
  an export garbled, and the import would have to say it read the file so.)
- A lone half of a UTF-16 surrogate pair (``"\\ud83d"`` in the JSON, an emoji cut in two
  by the app): no text, it cannot be stored, and it refused the whole export. It becomes
  U+FFFD (�), and a pair of halves the character (:func:`mended`, :func:`mend_chat`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from iris_desktop.core.attachments import NotTextError, decode_text, windows_1252
from iris_desktop.core.conversation import ConversationFormatError, read_text_file
from iris_desktop.files import read_regular_file

#: the bytes of a refused file looked at to say it looks like Windows-1252 text (its first
#: lines: decoding all of a 512 MB file to word the refusal took 2.5 GB)
_LOOKED_AT = 1 << 20
#: what stands for a character that is not there
REPLACEMENT = "\ufffd"


def mended(text: str) -> tuple[str, int]:
    """``text`` with each pair of UTF-16 halves joined into its character and each lone
    half replaced by U+FFFD; also how many lone halves were replaced."""
    try:
        text.encode("utf-8")
        return text, 0  # (the usual case: one pass in C)
    except UnicodeEncodeError:
        pass
    whole = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return whole, whole.count(REPLACEMENT) - text.count(REPLACEMENT)


def mend_value(value: Any) -> tuple[Any, int]:
    """``value`` (a message: dicts, lists, strings) with every string :func:`mended`, in
    place where it is a dict or a list; also how many halves were replaced."""
    if isinstance(value, str):
        return mended(value)
    replaced = 0
    if isinstance(value, dict):
        for key, item in value.items():
            value[key], n = mend_value(item)
            replaced += n
    elif isinstance(value, list):
        for i, item in enumerate(value):
            value[i], n = mend_value(item)
            replaced += n
    return value, replaced


def mend_chat(messages: list[Any] | None) -> int:
    """Mend every message of a chat in place; how many lone halves were replaced."""
    return mend_value(messages)[1] if messages else 0


def cesu8(data: bytes) -> str | None:
    """The text of ``data`` read as UTF-8 in which characters past U+FFFF may be written
    as two encoded UTF-16 halves (CESU-8), the halves joined into the character; None
    when other bytes are not UTF-8 either."""
    try:
        text = data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return None
    text = mended(text)[0]
    return text[1:] if text.startswith("\ufeff") else text


def read_text(path: Path, limit: int) -> str:
    """:func:`~iris_desktop.core.conversation.read_text_file`, and a CESU-8 file read as
    :func:`cesu8` reads it where UTF-8 refuses it (that refusal stands for other bytes,
    and says how to import a file of Windows-1252 text: :func:`.attachments.windows_1252`);
    a JSON file over ``limit`` read without its lines' indentation where that fits
    (:func:`squeezed`)."""
    try:
        return read_text_file(path, limit)
    except ConversationFormatError as exc:
        text = squeezed(path, limit)  # (None unless a JSON file over the limit that fits squeezed)
        if text is not None:
            return text
        if "not UTF-8 text" not in str(exc):
            raise
        try:
            data = read_regular_file(path, limit)
        except (OSError, ValueError):
            raise exc from None
        text = cesu8(data)
        head = data[:_LOOKED_AT]  # (enough to say what it looks like: not a copy of it all)
        head = head[:head.rfind(b"\n") + 1 or None] if len(data) > _LOOKED_AT else head
        if text is None and b"\0" not in data and windows_1252(head) is not None:
            raise ConversationFormatError(f"{exc}: it looks like Windows-1252 text; open it "
                                          "in a text editor, save it as UTF-8 and import that "
                                          "copy") from None
        if text is None:
            raise
        return text


#: a line's end and the indentation of the next: outside JSON strings in valid JSON (a
#: string holds no raw line break), so taking it out leaves the same JSON. In a file that is
#: not valid JSON it could join a string's raw line break: :func:`_quotes_closed` checks that
#: no line leaves a string open first.
_INDENT = re.compile(rb"\r?\n[ \t]*")
#: the largest file :func:`squeezed` reads
SQUEEZE_MAX_BYTES = 8 << 30
_CHUNK = 1 << 24


class Squeezed(str):
    """A JSON file's text read without its line breaks and indentation (:func:`squeezed`):
    its errors are said without the lines and columns of this text, which are not the
    file's (:func:`~iris_desktop.core.conversation.json_error` looks for ``squeezed``)."""

    squeezed = True


def _quotes_closed(lines: bytes) -> bool:
    """Does every line of ``lines`` close each string it opens (an even number of quotes
    that are not escaped)? Where every line does, no line break :data:`_INDENT` takes out
    is inside a string of the JSON read without them (its strings are the same), so a
    file that is not JSON (a string with a raw line break) is not made JSON by it. In
    C, a few passes: a chunk's lines are not walked one by one."""
    bare = lines.replace(b"\\\\", b"").replace(b'\\"', b"")  # (escaped backslashes, then quotes)
    # its quotes and line breaks alone, each line's pairs of quotes taken out: a quote left
    # is a line's odd one
    return b'"' not in bare.translate(None, _NOT_QUOTES).replace(b'""', b"")


#: every byte but a quote and a line break
_NOT_QUOTES = bytes(b for b in range(256) if b not in b'"\n')


def _indented(head: bytes) -> bool:
    """Does ``head`` (a file's first chunk) start as JSON written over several lines: an
    object or array whose first line is not a JSON value by itself (JSONL's is: joined,
    its lines are no JSON)?"""
    head = head.removeprefix(b"\xef\xbb\xbf").lstrip()
    if not head.startswith((b"{", b"[")):
        return False
    try:
        json.loads(head.split(b"\n", 1)[0])
    except (ValueError, RecursionError):
        return True
    return False


def squeezed(path: Path, limit: int) -> Squeezed | None:
    """The text of a JSON file over ``limit`` bytes read without its line breaks and
    indentation, if that fits ``limit``; None when it does not, when the file is not
    JSON in UTF-8 (UTF-16's line breaks are two bytes), is JSONL (its first line a JSON
    value by itself: joined, its lines are no JSON), has a line that leaves a string open
    (not JSON: the squeeze would join that string's line break), is not over ``limit``
    (it is read as it is) or is over :data:`SQUEEZE_MAX_BYTES`.
    LibreChat's "recursive" export (its default) nests each reply inside the message
    before it and indents each level, so the file grows with the square of the chat's
    length: 4,000 messages of 600 characters were 580 MB, over the import's limit, of
    which the JSON itself is 3 MB. Read in chunks of 16 MiB, each cut at a line break."""
    try:
        if not limit < path.stat().st_size <= SQUEEZE_MAX_BYTES:
            return None
        parts: list[bytes] = []
        kept, carry = 0, b""
        with path.open("rb") as file:
            while chunk := file.read(_CHUNK):
                chunk = carry + chunk
                cut = chunk.rfind(b"\n")
                if not parts and (cut < 0 or not _indented(chunk)):
                    return None  # (a first line over a chunk: not an indented file)
                chunk, carry = (chunk[:cut], chunk[cut:]) if cut >= 0 else (b"", chunk)
                if not _quotes_closed(chunk):
                    return None
                parts.append(_INDENT.sub(b"", chunk))
                kept += len(parts[-1])
                if kept + len(carry) > limit + _CHUNK:  # (a line longer than a chunk: carried)
                    return None
        if not _quotes_closed(carry):
            return None
        parts.append(_INDENT.sub(b"", carry))
        if sum(map(len, parts)) > limit:
            return None
        data = b"".join(parts)
        del parts
        text = decode_text(data)
        del data
        return Squeezed(text)
    except (OSError, NotTextError):
        return None
