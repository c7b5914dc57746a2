"""Each chat of another app's export, converted on its own (:class:`Converting`, for
:mod:`iris_desktop.core.foreign`): what can be mended is (halves of UTF-16 surrogate
pairs: :mod:`.foreign_text`), and a chat that cannot be read as it is (a message that is
not an object, a value of the wrong kind, a message Iris cannot store) is skipped, named
in the import's sentence, while the export's other chats are imported. Before, one such
chat refused the whole export. A file of one chat, or one none of whose chats can be
read, is still refused, in the sentence of its first unreadable chat; a skipped chat is
never stored in part (chats are converted and checked before anything is written)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from iris_desktop.core.conversation import ConversationFormatError, validate_messages
from iris_desktop.core.foreign_parts import Chat, SkippedChat, Tally, from_app, usable_title
from iris_desktop.core.foreign_text import mend_chat

#: what a converter raises on a value of a kind it did not expect
SURPRISES = (TypeError, AttributeError, KeyError, IndexError, ValueError)
#: the skipped chats the import's sentence names; the rest are counted
NAMED = 3


def a(fmt: str) -> str:
    """'an Open WebUI export', 'an LM Studio conversation', 'a ChatGPT export'."""
    return f"{'an' if fmt[0] in 'AEIOU' or fmt.startswith('LM ') else 'a'} {fmt}"


def unexpected(fmt: str, exc: Exception) -> str:
    return f"looks like {a(fmt)} but a value is not of the expected kind ({type(exc).__name__})"


def clipped(title: str, limit: int = 40) -> str:
    return title if len(title) <= limit else title[: limit - 1] + "…"


def short(title: str, limit: int = 40) -> str:
    return repr(clipped(title, limit))


def raw_title(item: Any) -> str | None:
    """A chat's title as its app wrote it (ChatGPT's and Open WebUI's ``title``,
    Claude's and LM Studio's ``name``, llama.cpp's ``conv.name``), to name it when it
    cannot be read."""
    if not isinstance(item, dict):
        return None
    chat = item.get("chat") if isinstance(item.get("chat"), dict) else {}
    conv = item.get("conv") if isinstance(item.get("conv"), dict) else {}  # llama.cpp's
    for value in (item.get("title"), item.get("name"), chat.get("title"), conv.get("name")):
        if usable_title(value):
            return usable_title(value)
    return None


def skipped_said(skipped: Sequence[str]) -> str:
    """'skipped 1 (“Trip plans”: its messages are not objects)': the chats skipped whole,
    each with why (the first :data:`NAMED`, the rest counted); '' for none."""
    if not skipped:
        return ""
    shown = "; ".join(s.rstrip(".") for s in skipped[:NAMED])
    more = len(skipped) - NAMED
    return f"skipped {len(skipped):,} ({shown}{f'; and {more:,} more' if more > 0 else ''})"


class Converting:
    """The chats of one file as they are converted (:meth:`add`): ``chats`` read,
    ``tally`` what was left out of them and of the chats with no text, ``skipped`` the
    chats skipped (its ``skipped``: "“title”: why", ``empty``: no text), ``failed`` the
    full sentence each unreadable chat would have refused the file with."""

    def __init__(self, path: Path, fmt: str, total: int, names: Sequence[str | None] = ()):
        self.path, self.fmt, self.total, self.names = path, fmt, total, names
        self.tally, self.skipped = Tally(), Tally()
        self.chats: list[Chat] = []
        self.failed: list[str] = []

    def add(self, number: int, convert: Callable[[Tally], Chat | None]) -> None:
        """Chat ``number`` (from 1): converted, mended, checked, and kept or skipped."""
        where = f"{self.path}: chat {number}" if self.total > 1 else str(self.path)
        own = Tally()
        try:
            chat = convert(own)
        except SkippedChat as exc:
            self.skipped.skipped.append(f"{self._name(number)}: {exc}")
            return
        except ConversationFormatError as exc:
            return self._fail(number, None, where, str(exc))
        except SURPRISES as exc:  # named by its chat, not only by the file
            return self._fail(number, None, where, unexpected(self.fmt, exc))
        except RecursionError:
            return self._fail(number, None, where, f"nested too deeply to be {a(self.fmt)}")
        if chat is None or not any(m.get("role") != "system" for m in chat.messages):
            self.tally.add(own)
            self.skipped.empty += 1  # (a chat's system prompt alone is no conversation)
            return
        label = f"{where} ({short(chat.title)})" if chat.title else where
        try:
            validate_messages(chat.messages, lambda i: f"message {i + 1}")
        except ConversationFormatError:
            own.mended += mend_chat(chat.messages)  # (only then: no walk for the rest)
            try:
                if not own.mended:
                    raise
                validate_messages(chat.messages, lambda i: f"message {i + 1}")
            except ConversationFormatError as again:
                return self._fail(number, chat.title, label, str(again))
            mend_chat(chat.before)
        self.tally.add(own)
        self.chats.append(from_app(chat, self.fmt)._replace(tally=own))  # (its replies: the app's)

    def _fail(self, number: int, title: str | None, where: str, why: str) -> None:
        self.failed.append(f"{where}: {why}")
        self.skipped.skipped.append(f"{self._name(number, title)}: {why}")

    def _name(self, number: int, title: str | None = None) -> str:
        title = title or (self.names[number - 1] if number <= len(self.names) else None)
        return f"“{clipped(title)}”" if title else f"chat {number}"

    def refusal(self) -> str | None:
        """Why the file is refused when no chat of it is left: its first unreadable chat's
        sentence (None: none was unreadable; the chats had no text, or were skipped)."""
        return self.failed[0] if self.failed and not self.chats else None
