"""What the store raises: a database that cannot be used, one found damaged, and a chat
that is not there (deleted, perhaps by another process, since it was read)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


class StoreError(Exception):
    """The database cannot be used (corrupt, newer schema, not a database)."""


class DamagedDatabase(StoreError):
    """PRAGMA quick_check found damage; nothing was written to the file."""

    def __init__(self, path: Path, problems: list[str]):
        super().__init__(f"{path} is damaged: {problems[0]}")
        self.path = path
        self.problems = problems


class ThreadGone(KeyError):
    """No chat with this id: never made, or deleted since (by another window or command,
    or by this one). A ``KeyError``, as a lookup that misses is."""

    def __init__(self, thread_id: int):
        super().__init__(f"no thread {thread_id}")
        self.thread_id = thread_id

    def __str__(self) -> str:  # the sentence, not a KeyError's quoted key
        return str(self.args[0])


def busy_sentence(holder: dict[str, Any], not_done: str = "Not sent",
                  instead: str = ", or write in another chat") -> str:
    """Why something does not happen in a chat another process is answering in
    (``holder``: the turn lease's row)."""
    since = max(0, round(time.time() - holder["acquired_at"]))
    return (f"{not_done}: this chat is answering in another Iris window or command (process "
            f"{holder['pid']}, for {since} s); wait until it finishes{instead}")


class ThreadBusy(RuntimeError):
    """Another window or command is answering in the chat: its branch stays as it is (a
    switch under a reply being written hid the question and its reply on another branch)."""

    def __init__(self, holder: dict[str, Any]):
        super().__init__(busy_sentence(holder, "Not switched", ""))
        self.holder = holder
