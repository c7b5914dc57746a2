"""What every part of the Store shares: its one connection, and transactions on it."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Self

import sqlite_utils


class Connected:
    """One open connection to the database, used by one thread at a time. The parts of
    :class:`~iris_desktop.core.store.Store` build on it; the Store opens it."""

    path: Path
    conn: sqlite3.Connection
    db: sqlite_utils.Database
    #: the last thread_speakers answer, with what it depends on
    _speakers: tuple[tuple, list[str]] | None

    # -- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """BEGIN IMMEDIATE … COMMIT; everything inside is atomic."""
        if self.conn.in_transaction:
            yield
            return
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    @contextmanager
    def trial(self) -> Iterator[None]:
        """A savepoint that is always rolled back: try a change, look, leave no trace."""
        self.conn.execute("SAVEPOINT trial")
        try:
            yield
        finally:
            self.conn.execute("ROLLBACK TO trial")
            self.conn.execute("RELEASE trial")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # this process is only starting: nothing of it is streaming yet
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True
