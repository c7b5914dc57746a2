"""Files attached to a message: read as text, checked, and stored with the message.

An attached file becomes part of the user message the model reads: the typed text, then
each file as a block ``<file name="notes.md">…</file>``. So the engine counts, prunes,
summarizes, searches and recalls it like any text, a file too large for any budget is
refused like a paste that is, and an export and an import keep it. The message also
carries ``attachments``, what the transcript shows instead of the blocks: a chip per file
with its name, size and tokens, and where the typed text ends.

Only text is accepted (plain text, Markdown, source code, CSV, JSON…): UTF-8, no NUL
byte. Anything else is refused with one sentence that says what was read.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iris_desktop.tokens import Message

#: the largest file read at all (the budget usually refuses far smaller ones first)
MAX_ATTACHMENT_BYTES = 8 * 1024 * 1024
#: what a file looks like to the model: ``<file name="…">`` + text + ``</file>``
OPEN, CLOSE = "<file name={name}>\n", "\n</file>"


class AttachmentError(ValueError):
    """A file that cannot be attached; the message names it and says why."""


@dataclass(frozen=True)
class Attachment:
    name: str
    text: str

    @property
    def size(self) -> int:
        return len(self.text.encode("utf-8"))

    def block(self) -> str:
        """The file as the model reads it."""
        return OPEN.format(name=json.dumps(self.name, ensure_ascii=False)) + self.text + CLOSE


def read_attachment(path: str | Path, limit: int = MAX_ATTACHMENT_BYTES) -> Attachment:
    """A text file to attach; AttachmentError for a folder, an unreadable or too large
    file, or one that is not UTF-8 text (a NUL byte, other bytes)."""
    path = Path(path)
    try:
        if path.is_dir():
            raise AttachmentError(f"{path.name} is a folder; attach a file")
        size = path.stat().st_size
        if size > limit:
            raise AttachmentError(f"{path.name} is {size:,} bytes, more than the {limit:,} a file "
                                  "may have to be attached")
        data = path.read_bytes()
    except OSError as exc:
        raise AttachmentError(f"cannot read {path.name} ({exc.strerror or exc})") from None
    if b"\0" in data:
        raise AttachmentError(f"{path.name} is not a text file (binary data at byte "
                              f"{data.index(0):,}); attach text: plain text, Markdown, source "
                              "code, CSV or JSON")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise AttachmentError(f"{path.name} is not UTF-8 text (byte {exc.start:,}); attach "
                              "text: plain text, Markdown, source code, CSV or JSON") from None
    return Attachment(path.name, text.replace("\r\n", "\n"))


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
    transcript shows; a message without files is its text and no chips."""
    content = message.get("content")
    text = content if isinstance(content, str) else ""
    meta: Any = message.get("attachments")
    if not isinstance(meta, dict) or not isinstance(meta.get("files"), list):
        return text, []
    chars = meta.get("text_chars")
    typed = text[:chars] if isinstance(chars, int) and 0 <= chars <= len(text) else text
    chips = [(str(f.get("name", "file")), int(f.get("tokens", f.get("bytes", 0)) or 0))
             for f in meta["files"] if isinstance(f, dict)]
    return typed, chips
