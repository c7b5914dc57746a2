"""The chats of a data export still in the zip archive it is downloaded as (ChatGPT's,
Claude's): the ``conversations.json`` inside, read without unpacking anything to disk
(no name in the archive is ever a path written to), and never more than the import limit
of it, whatever the archive's headers claim. ChatGPT's exports since early 2026 split the
chats into ``conversations-000.json``, ``conversations-001.json``…: those are read in turn,
in the archive or in its unzipped folder (:func:`folder_shards`), and joined into one list.
"""

from __future__ import annotations

import json
import re
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from iris_desktop.core.conversation import MAX_IMPORT_BYTES, ConversationFormatError
from iris_desktop.core.foreign_text import cesu8

#: the file ChatGPT's and Claude's data exports hold the chats in
EXPORT_NAME = "conversations.json"
#: a newer ChatGPT export's parts: conversations-000.json, conversations-001.json…
SHARD = re.compile(r"conversations-(\d+)\.json")
#: how much is read first, to see that it begins as JSON does
PREFIX_BYTES = 64 * 1024
#: chat JSON compresses 5 to 20 times; a member packed far tighter is a zip bomb (500 MB of
#: spaces in a 500 kB archive took a gigabyte of memory before it was refused)
MAX_RATIO = 200


def _refuse_a_bomb(path: Path, info: zipfile.ZipInfo) -> None:
    if info.file_size > 16 * PREFIX_BYTES and info.file_size > MAX_RATIO * max(info.compress_size, 1):
        raise ConversationFormatError(
            f"{path}: its {EXPORT_NAME} would unpack to {info.file_size:,} bytes from "
            f"{info.compress_size:,}, over {MAX_RATIO} times its packed size, which no chat "
            "export is (a zip bomb?); nothing was unpacked")


def zipped_export(path: Path) -> str | None:
    """The text of the ``conversations.json`` in a zip archive (ChatGPT's and Claude's
    exports are downloaded so), read without unpacking anything to disk and never more
    than MAX_IMPORT_BYTES of it; None for a file that is not a zip archive."""
    try:
        if not path.is_file():
            return None  # a device or a pipe: read_text_file says so, never blocking
        with open(path, "rb") as handle:
            if handle.read(4) != b"PK\x03\x04":
                return None
        with zipfile.ZipFile(path) as archive:
            inside = sorted((i for i in archive.infolist() if not i.is_dir()
                             and PurePosixPath(i.filename).name == EXPORT_NAME),
                            key=lambda i: len(i.filename))
            if not inside:
                return _zipped_shards(path, archive)
            if inside[0].file_size > MAX_IMPORT_BYTES:
                raise ConversationFormatError(f"{path}: its {EXPORT_NAME} is larger than the "
                                              f"limit of {MAX_IMPORT_BYTES:,} bytes")
            _refuse_a_bomb(path, inside[0])
            with archive.open(inside[0]) as member:
                head = member.read(PREFIX_BYTES)
                if head and head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] not in (b"[", b"{"):
                    raise ConversationFormatError(
                        f"{path}: its {EXPORT_NAME} does not begin like a chat export (JSON "
                        "starting with [ or {); nothing was read further")
                data = head + member.read(MAX_IMPORT_BYTES + 1 - len(head))
    except ConversationFormatError:
        raise
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError,
            OSError) as exc:  # damaged, encrypted, an unknown compression, unreadable
        raise ConversationFormatError(f"{path}: a zip archive Iris cannot read ({exc}); unzip "
                                      f"it and import its {EXPORT_NAME}") from None
    if len(data) > MAX_IMPORT_BYTES:
        raise ConversationFormatError(f"{path}: its {EXPORT_NAME} is larger than the limit of "
                                      f"{MAX_IMPORT_BYTES:,} bytes")
    return _text(path, EXPORT_NAME, data)


def _text(path: Path, name: str, data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        text = cesu8(data)  # (an emoji as two encoded UTF-16 halves: the emoji)
        if text is None:
            raise ConversationFormatError(f"{path}: its {name} is not UTF-8 text (byte "
                                          f"{exc.start})") from None
    return text[1:] if text.startswith("\ufeff") else text


def _too_large(path: Path, sizes: list[int]) -> None:
    if sum(sizes) > MAX_IMPORT_BYTES:
        raise ConversationFormatError(f"{path}: its conversations-*.json files are larger than "
                                      f"the limit of {MAX_IMPORT_BYTES:,} bytes together")


def _zipped_shards(path: Path, archive: zipfile.ZipFile) -> str:
    """The chats of a newer ChatGPT export's conversations-NNN.json members, as one list
    (each member checked as a conversations.json is: its size, its packing, its text)."""
    shards = sorted((i for i in archive.infolist() if not i.is_dir()
                     and SHARD.fullmatch(PurePosixPath(i.filename).name)),
                    key=lambda i: (len(PurePosixPath(i.filename).parts), i.filename))
    shards = [i for i in shards if PurePosixPath(i.filename).parent
              == PurePosixPath(shards[0].filename).parent] if shards else []
    if not shards:
        raise ConversationFormatError(
            f"{path}: a zip archive with no {EXPORT_NAME} (nor conversations-000.json…) in it; "
            "unzip it and import the chat file it holds")
    _too_large(path, [i.file_size for i in shards])
    texts = []
    for info in shards:
        _refuse_a_bomb(path, info)
        with archive.open(info) as member:
            data = member.read(MAX_IMPORT_BYTES + 1)
        texts.append((PurePosixPath(info.filename).name, _text(path, info.filename, data)))
    _too_large(path, [len(text) for _, text in texts])
    return joined(path, texts)


def folder_shards(folder: Path, read: Callable[[Path, int], str]) -> str | None:
    """The chats of an unzipped newer ChatGPT export (``folder``/conversations-NNN.json,
    each read by ``read(file, limit)``), as one list; None when it has none."""
    try:
        files = sorted((f for f in folder.iterdir() if SHARD.fullmatch(f.name) and f.is_file()),
                       key=lambda f: f.name)
        sizes = [f.stat().st_size for f in files]
    except OSError:
        return None
    if not files:
        return None
    _too_large(folder, sizes)
    texts = [(f.name, read(f, MAX_IMPORT_BYTES)) for f in files]
    _too_large(folder, [len(text) for _, text in texts])
    return joined(folder, texts)


class Joined(str):
    """The chats of several shards joined into one JSON list (:func:`joined`); ``parts``:
    each shard's name and where its chats lie in the text, so that a shard that is not
    valid JSON is named (:func:`bad_shard`), not the conversations.json it does not have."""

    parts: tuple[tuple[str, int, int], ...] = ()


def joined(path: Path, texts: list[tuple[str, str]]) -> Joined:
    """One JSON list of the chats of ``texts`` (name, text), each a JSON list of chats."""
    pieces: list[str] = []
    parts: list[tuple[str, int, int]] = []
    at = 1  # (after the "[")
    for name, text in texts:
        body = text.lstrip("\ufeff").strip()
        if not (body.startswith("[") and body.endswith("]")):
            raise ConversationFormatError(f"{path}: its {name} is not a list of chats (JSON "
                                          "between [ and ])")
        inner = body[1:-1].strip()
        if inner:
            at += 1 if pieces else 0  # (the comma before it)
            parts.append((name, at, at + len(inner)))
            pieces.append(inner)
            at += len(inner)
    out = Joined("[" + ",".join(pieces) + "]")
    out.parts = tuple(parts)
    return out


def bad_shard(text: str) -> str | None:
    """'its conversations-004.json is not valid JSON (…)' for the first shard of a
    :class:`Joined` text that does not parse alone; None when each does (or ``text`` was
    not joined)."""
    for name, start, end in getattr(text, "parts", ()):
        try:
            json.loads("[" + text[start:end] + "]")
        except ValueError as exc:
            why = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
            return f"its {name} is not valid JSON ({why})"
    return None
