"""Files attached to a message: read as text, checked, and stored with the message.

An attached file becomes part of the user message the model reads: the typed text, then
each file as a block ``<file name="notes.md">…</file>``. So the engine counts, prunes,
summarizes, searches and recalls it like any text, a file too large for any budget is
refused like a paste that is, and an export and an import keep it. The message also
carries ``attachments``, what the transcript shows instead of the blocks: a chip per file
with its name, size and tokens, and where the typed text ends.

Only text is accepted (plain text, Markdown, source code, CSV, JSON…): UTF-8, no NUL
byte, from a regular file (a device such as ``/dev/zero`` or a named pipe is refused by its
type, never read). A file that is not UTF-8 but reads as Windows-1252 text (what older
Notepad and Excel save on Windows; Latin-1 is read the same way) is read as that, and
said (:func:`windows_1252`, :attr:`Attachment.read_as`). Anything else is refused with one
sentence that says what was read (a UTF-16 or UTF-32 file, by its byte-order mark, as
that). Line endings become ``\\n``
(Windows' CRLF and the old Mac's lone CR alike), as for ``chat --file``
(:func:`message_text` reads both).
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iris_desktop.files import NotAFileError, TooLargeError, read_regular_file
from iris_desktop.tokens import Message

#: the largest file read at all (the budget usually refuses far smaller ones first)
MAX_ATTACHMENT_BYTES = 8 * 1024 * 1024
#: what a file looks like to the model: ``<file name="…">`` + text + ``</file>``
OPEN, CLOSE = "<file name={name}>\n", "\n</file>"


#: the most files one message's ``attachments`` record may list, and the longest name
MAX_FILES = 1000
MAX_NAME_CHARS = 255
#: what a file's block adds to its tokens besides its text: its name (escaped, up to six
#: bytes a character) and the tags, a token being at least a byte
_BLOCK_TOKENS = 6 * MAX_NAME_CHARS + 64


class AttachmentError(ValueError):
    """A file that cannot be attached; the message names it and says why."""


class NotTextError(ValueError):
    """Bytes that are not text; the message says what they are, as a clause ("not
    UTF-8 text (byte 5)"); ``encoded``: the encoding a byte-order mark names, else None;
    ``eight_bit``: bytes with no byte-order mark that are not UTF-8 (they may be text in
    an older 8-bit encoding: :func:`windows_1252`)."""

    def __init__(self, clause: str, encoded: str | None = None, eight_bit: bool = False,
                 at: int = 0) -> None:
        super().__init__(clause)
        self.encoded = encoded
        self.eight_bit = eight_bit
        self.at = at  # (eight_bit: the first byte that is not UTF-8)


#: byte-order marks of UTF-16 and UTF-32 (UTF-32's first: its little-endian mark starts
#: with UTF-16's), and the codec each names
_OTHER_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32", "utf-32-le"), (b"\x00\x00\xfe\xff", "UTF-32", "utf-32-be"),
               (b"\xff\xfe", "UTF-16", "utf-16-le"), (b"\xfe\xff", "UTF-16", "utf-16-be"))


def decode_text(data: bytes, *, nul: bool = True) -> str:
    """The text of a file's bytes, without a byte-order mark: UTF-8, or UTF-16 or UTF-32
    where a byte-order mark says so (Windows PowerShell's ``>`` and older Notepad's
    "Unicode" write UTF-16: such a file was refused, "save the file as UTF-8");
    NotTextError for a NUL character unless ``nul``, or bytes that are not that text."""
    for bom, name, codec in _OTHER_BOMS:
        if data.startswith(bom):
            try:
                text = data[len(bom):].decode(codec)
            except UnicodeDecodeError as exc:
                raise NotTextError(f"not {name} text, though it starts as {name} does (byte "
                                   f"{exc.start + len(bom):,})", name) from None
            if not nul and "\0" in text:
                raise NotTextError(f"not a text file (binary data at character {text.index(chr(0)):,})")
            return text
    if not nul and b"\0" in data:
        raise NotTextError(f"not a text file (binary data at byte {data.index(0):,})")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotTextError(f"not UTF-8 text (byte {exc.start:,})", eight_bit=True,
                           at=exc.start) from None
    return text[1:] if text.startswith("\ufeff") else text  # a byte-order mark is no content


#: the encoding a file that is not UTF-8 may be read in, as the user is told it
WINDOWS_1252 = "Windows-1252"
#: Windows-1252 as a table of 256 characters: the five bytes it leaves undefined (0x81,
#: 0x8D, 0x8F, 0x90, 0x9D) read as Latin-1 reads them, so that every byte is a character
_CP1252 = "".join(bytes([b]).decode("cp1252", "ignore") or chr(b) for b in range(256))
#: the characters no text holds (binary data read as text): C0 controls but tab, line
#: feed, form feed and carriage return; DEL; the five undefined bytes (C1 controls)
_CONTROLS = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f\x81\x8d\x8f\x90\x9d]")
#: at most this share of a file read as Windows-1252 may be :data:`_CONTROLS`. Measured
#: on the 511 files of a Linux install's 121,659 that hold no NUL and are not UTF-8 (all
#: text: 0–7.7%, the most Shift-JIS XML), a densely coloured terminal log (6.9%); binary
#: files with their NUL bytes taken out: 9% at the least, median 13–23% (PNG, gzip,
#: shared libraries, .pyc); random bytes 13%. (What slips under it is most often caught
#: by :data:`MAX_HIGH_RUNS`: half of binary bytes are above 0x7F.)
MAX_CONTROLS = 0.10
#: a character of UTF-8 (or CESU-8's halves) written out whole: bytes that hold several
#: are a UTF-8 file with damage, not Windows-1252 (where such pairs are rare: "Ã©")
_UTF8_CHARACTER = re.compile(rb"[\xc2-\xdf][\x80-\xbf]|\xe0[\xa0-\xbf][\x80-\xbf]|"
                             rb"[\xe1-\xef][\x80-\xbf]{2}|\xf0[\x90-\xbf][\x80-\xbf]{2}|"
                             rb"[\xf1-\xf3][\x80-\xbf]{3}|\xf4[\x80-\x8f][\x80-\xbf]{2}")
#: four or more bytes above 0x7F in a row: the words of another script's encoding
#: (Windows-1251's Russian, Shift-JIS, GBK, Greek, Hebrew), not Windows-1252's accents
_HIGH_RUN = re.compile(rb"[\x80-\xff]{4,}")
#: at most this share of the bytes above 0x7F may be in such runs. Measured on chardet's
#: and charset_normalizer's test files: Latin scripts (Windows-1250/1252/1254, ISO 8859-1,
#: -2, -9) 0–2%; Cyrillic, Greek, Hebrew, Arabic, Thai, Chinese, Japanese, Korean 29–100%
MAX_HIGH_RUNS = 0.10
_ASCII = bytes(range(0x80))


def windows_1252(data: bytes) -> str | None:
    """The text of ``data`` (bytes that are not UTF-8 and start with no byte-order mark)
    read as Windows-1252, each byte a character; None where they do not look like such
    text: UTF-8 with damage (half or more of its bytes above 0x7F in whole UTF-8
    characters: "— Zürich" beside two Windows-1252 apostrophes was read as "â€” ZÃ¼rich";
    or a UTF-8 byte-order mark), another script's 8-bit encoding (:data:`MAX_HIGH_RUNS`) or
    binary data (:data:`MAX_CONTROLS`)."""
    high = len(data.translate(None, _ASCII))
    if not high or data.startswith(b"\xef\xbb\xbf") or damaged_utf8(data):
        return None
    if sum(map(len, _HIGH_RUN.findall(data))) > MAX_HIGH_RUNS * high:
        return None
    text = codecs.charmap_decode(data, "strict", _CP1252)[0]
    if len(_CONTROLS.findall(text)) > MAX_CONTROLS * len(text):
        return None
    return text


def damaged_utf8(data: bytes) -> bool:
    """Whether bytes that are not UTF-8 are UTF-8 text with a few stray bytes in it: half
    or more of their bytes above 0x7F are in whole UTF-8 characters, or a UTF-8
    byte-order mark starts them."""
    high = len(data.translate(None, _ASCII))
    return data.startswith(b"\xef\xbb\xbf") or (
        high > 0 and 2 * sum(map(len, _UTF8_CHARACTER.findall(data))) >= high)


def read_message_text(data: bytes) -> tuple[str, str | None]:
    """:func:`message_text`, and None; or, for bytes that are not UTF-8 but read as
    Windows-1252 text (:func:`windows_1252`, no NUL byte), that text, its line endings
    ``\\n``, and :data:`WINDOWS_1252`: the caller says it was read so."""
    try:
        return message_text(data), None
    except NotTextError as exc:
        if not exc.eight_bit or b"\0" in data:
            raise
        if damaged_utf8(data):
            line = data.count(b"\n", 0, exc.at) + 1
            raise NotTextError(  # (it said "not UTF-8 text (byte 232); attach text: … Markdown")
                f"UTF-8 text with a few bytes that are not (the first on line {line:,}), perhaps "
                "pasted from another program; save it again as UTF-8 in your editor", "UTF-8") from None
        text = windows_1252(data)
        if text is None:
            raise
        return text.replace("\r\n", "\n").replace("\r", "\n"), WINDOWS_1252


def read_as(encoding: str) -> str:
    """What a user is told of a file read in ``encoding``, as a clause."""
    return f"read as {encoding}: it is not UTF-8"


def message_text(data: bytes) -> str:
    """The text a file gives a message (an attached file, ``chat --file``): UTF-8 text
    without a NUL byte (:func:`decode_text`), its line endings ``\\n`` (CRLF and a lone
    CR alike); NotTextError for anything else. Before: ``--file`` sent a NUL that
    ``--attach`` refused, and both kept a lone CR."""
    return decode_text(data, nul=False).replace("\r\n", "\n").replace("\r", "\n")


@dataclass(frozen=True)
class Attachment:
    name: str
    text: str
    #: the encoding the file was read in where it was not UTF-8 (:data:`WINDOWS_1252`)
    encoding: str | None = None

    @property
    def read_as(self) -> str | None:
        """What the user is told of how the file was read, as a clause ("read as
        Windows-1252: it is not UTF-8"); None for UTF-8 (and UTF-16, by its mark)."""
        return read_as(self.encoding) if self.encoding else None

    @property
    def size(self) -> int:
        return len(self.text.encode("utf-8"))

    def block(self) -> str:
        """The file as the model reads it."""
        return OPEN.format(name=json.dumps(self.name, ensure_ascii=False)) + self.text + CLOSE


def read_attachment(path: str | Path, limit: int = MAX_ATTACHMENT_BYTES) -> Attachment:
    """A text file to attach; AttachmentError for a folder or anything else that is not a
    regular file, an unreadable or too large file, or one that is not text (a NUL byte,
    bytes that are neither UTF-8 nor Windows-1252 text: :func:`read_message_text`)."""
    path = Path(path)
    # (`.`, `..` and `/` have no name of their own: "--attach:  is a folder")
    name = path.name if path.name not in ("", ".", "..") else path.resolve().name or str(path)
    try:
        data = read_regular_file(path, limit)
    except NotAFileError as exc:
        if exc.kind == "a folder":
            raise AttachmentError(f"{name} is a folder; attach a file") from None
        raise AttachmentError(f"{name} is {exc.kind}, not a regular file; attach a "
                              "file") from None
    except TooLargeError as exc:
        if exc.size is None:
            raise AttachmentError(f"{name} grew past the {limit:,} bytes a file may have "
                                  "to be attached while it was read") from None
        raise AttachmentError(f"{name} is {exc.size:,} bytes, more than the {limit:,} a "
                              "file may have to be attached") from None
    except OSError as exc:
        raise AttachmentError(f"cannot read {name} ({exc.strerror or exc})") from None
    try:
        text, encoding = read_message_text(data)
    except NotTextError as exc:
        fix = "" if exc.encoded else "; attach text: plain text, Markdown, source code, CSV or JSON"
        raise AttachmentError(f"{name} is {exc}{fix}") from None
    return Attachment(name, text, encoding)


def with_attachments(text: str, attachments: Sequence[Attachment],
                     tokens: Sequence[int] | None = None) -> Message:
    """The user message for ``text`` with ``attachments``: the model's text (typed text,
    then each file's block) and, for the transcript, each file's name, size and tokens
    (``tokens``: counted by the caller's counter, or None)."""
    if not attachments:
        return {"role": "user", "content": text}
    content = model_text(text, attachments)
    files = [{"name": a.name, "bytes": a.size, **({"tokens": int(t)} if t is not None else {})}
             for a, t in zip(attachments, tokens or [None] * len(attachments), strict=True)]
    return {"role": "user", "content": content,
            "attachments": {"text_chars": len(text), "files": files}}


def model_text(text: str, attachments: Sequence[Attachment]) -> str:
    """What the model reads of a message with files (the engine counts a draft so)."""
    blocks = [a.block() for a in attachments]
    return "\n\n".join([text, *blocks]) if text.strip() else "\n\n".join(blocks)


def shown(message: Message) -> tuple[str, list[tuple[str, int]]]:
    """(the typed text, [(file name, tokens or bytes)]) of a stored message, what the
    transcript shows; a message without files is its text and no chips. A record that
    is not what :func:`with_attachments` writes (stored before imports checked it) shows
    what it can: never an exception."""
    content = message.get("content")
    text = content if isinstance(content, str) else ""
    meta: Any = message.get("attachments")
    if not isinstance(meta, dict) or not isinstance(meta.get("files"), list):
        return text, []
    chars = meta.get("text_chars")
    typed = text[:chars] if _count(chars) is not None and chars <= len(text) else text
    chips = []
    for f in meta["files"][:MAX_FILES]:
        if not isinstance(f, dict):
            continue
        name = f.get("name")
        name = name[:MAX_NAME_CHARS] if isinstance(name, str) and name else "file"
        size = _count(f.get("tokens"))
        chips.append((name, size if size is not None else _count(f.get("bytes")) or 0))
    return typed, chips


def edited(message: Message, text: str) -> Message:
    """The user message ``text`` that replaces the stored ``message`` in an edit, with the
    files ``message`` carried (an edit changed the typed text and dropped them: the model
    no longer read the file, and nothing said so). A message without files, or a record
    :func:`with_attachments` could not have written, gives the plain text."""
    content, meta = message.get("content"), message.get("attachments")
    chars = meta.get("text_chars") if isinstance(meta, dict) else None
    if (not isinstance(content, str) or not isinstance(meta.get("files") if meta else None, list)
            or _count(chars) is None or chars > len(content) or not meta["files"]):
        return {"role": "user", "content": text}
    blocks = content[chars:].lstrip("\n")
    return {"role": "user", "content": f"{text}\n\n{blocks}" if text.strip() else blocks,
            "attachments": {"text_chars": len(text), "files": meta["files"]}}


def _count(value: Any) -> int | None:
    """``value`` when it is a count (an int ≥ 0, not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


def record_problem(meta: Any, content: Any) -> str | None:
    """What is wrong with a message's ``attachments`` record for its ``content`` (the
    text the model reads), as a clause ("file 2 has no name"); None when it is a record
    :func:`with_attachments` could have written: ``text_chars`` within the text, and for
    each file (at most MAX_FILES) a name (at most MAX_NAME_CHARS characters, neither '/'
    nor NUL: what a file system allows), its bytes (at most MAX_ATTACHMENT_BYTES, all of
    them together within the text) and optionally its tokens."""
    if not isinstance(meta, dict):
        return f"it is {_kind(meta)}, not an object"
    if set(meta) != {"text_chars", "files"}:
        return "it must hold exactly 'text_chars' and 'files'"
    if not isinstance(content, str):
        return "the message's content is not text"
    chars = _count(meta["text_chars"])
    if chars is None or chars > len(content):
        return f"'text_chars' must be a whole number from 0 to {len(content):,}, the length " \
               "of the message's text"
    files = meta["files"]
    if not isinstance(files, list) or not 1 <= len(files) <= MAX_FILES:
        return f"'files' must be a list of 1 to {MAX_FILES:,} files"
    total = 0
    for n, f in enumerate(files, start=1):
        if not isinstance(f, dict):
            return f"file {n} is {_kind(f)}, not an object"
        if not {"name", "bytes"} <= set(f) <= {"name", "bytes", "tokens"}:
            return f"file {n} must hold 'name', 'bytes' and optionally 'tokens', nothing else"
        name = f["name"]
        if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME_CHARS:
            return f"file {n}'s name must be text of 1 to {MAX_NAME_CHARS} characters"
        if "/" in name or "\0" in name:  # no file's name can hold either
            return f"file {n}'s name holds a '/' or a NUL, which no file name can"
        size = _count(f["bytes"])
        if size is None or size > MAX_ATTACHMENT_BYTES:
            return f"file {n}'s 'bytes' must be a whole number from 0 to {MAX_ATTACHMENT_BYTES:,}"
        total += size
        if "tokens" in f:
            tokens = _count(f["tokens"])
            if tokens is None or tokens > size + _BLOCK_TOKENS:
                return f"file {n}'s 'tokens' must be a whole number from 0 to {size + _BLOCK_TOKENS:,}"
    if total > len(content.encode("utf-8", "surrogatepass")):
        return f"its files add up to {total:,} bytes, more than the message's text holds"
    return None


def _kind(value: Any) -> str:
    """A JSON value's kind, as a sentence names it."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    return {dict: "an object", list: "a list", str: "a string", int: "a number",
            float: "a number"}.get(type(value), type(value).__name__)
