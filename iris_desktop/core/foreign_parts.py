"""What every reader of another app's chats shares (:mod:`iris_desktop.core.foreign` and
the readers beside it): a chat, the tally of what was left out, a usable title, a tree's
messages."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from iris_desktop.core.foreign_tree import Node, tree
from iris_desktop.tokens import Message


class Chat(NamedTuple):
    title: str | None
    messages: list[Message]
    #: the chat's own system prompt (an Iris export's; other apps' are not read)
    system_prompt: str | None = None


@dataclass
class Tally:
    """What was left out of the whole file."""
    images: int = 0
    files: int = 0
    tools: int = 0
    empty: int = 0
    #: files beside the one imported that could not be read (a Jan thread.json), and why
    unread: list[str] = field(default_factory=list)
    #: messages on branches Iris cannot show beside the active one (``_untangle``)
    unshown: int = 0

    def notes(self) -> list[str]:
        notes = [f"{problem}: the thread's title and instructions were left out."
                 for problem in self.unread]
        media = [count(self.images, "image"), count(self.files, "other file")]
        media = [m for m, n in zip(media, (self.images, self.files)) if n]
        if media:
            verb = "was" if self.images + self.files == 1 else "were"
            notes.append(f"{' and '.join(media)} {verb} left out: Iris imports text only.")
        if self.tools:
            verb = "was" if self.tools == 1 else "were"
            notes.append(f"{count(self.tools, 'tool step')} (web searches, code runs, image "
                         f"generation) {verb} left out; the replies that used them are kept.")
        if self.unshown:
            verb = "was" if self.unshown == 1 else "were"
            notes.append(f"{count(self.unshown, 'message')} on branches that start with a "
                         f"different role than the active one {verb} left out: Iris shows "
                         "alternatives of one role side by side.")
        if self.empty:
            verb = "was" if self.empty == 1 else "were"
            notes.append(f"{count(self.empty, 'chat')} with no text message {verb} skipped.")
        return notes


def count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def usable_title(value: Any) -> str | None:
    """A usable title: text that can be stored (else the first user message names it)."""
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return value.strip()


def tree_messages(nodes: dict[Hashable, Node], active: Hashable | None, system: str | None = None,
          tally: Tally | None = None) -> list[Message]:
    """:func:`~iris_desktop.core.foreign_tree.tree`, what it left out counted in ``tally``."""
    messages, left_out = tree(nodes, active, system)
    if tally is not None:
        tally.unshown += left_out
    return messages


def hashable(value: Any) -> Hashable:
    return value if isinstance(value, (str, int)) and not isinstance(value, bool) else repr(value)
