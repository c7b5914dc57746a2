"""The chats of a data export still in the zip archive it is downloaded as (ChatGPT's,
Claude's): the ``conversations.json`` inside, read without unpacking anything to disk
(no name in the archive is ever a path written to), and never more than the import limit
of it, whatever the archive's headers claim.
"""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path, PurePosixPath

from iris_desktop.core.conversation import MAX_IMPORT_BYTES, ConversationFormatError

#: the file ChatGPT's and Claude's data exports hold the chats in
EXPORT_NAME = "conversations.json"
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
                raise ConversationFormatError(
                    f"{path}: a zip archive with no {EXPORT_NAME} in it; unzip it and import "
                    "the chat file it holds")
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
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConversationFormatError(f"{path}: its {EXPORT_NAME} is not UTF-8 text (byte "
                                      f"{exc.start})") from None
    return text[1:] if text.startswith("\ufeff") else text
