"""What the store raises: a database that cannot be used, and one found damaged."""

from __future__ import annotations

from pathlib import Path


class StoreError(Exception):
    """The database cannot be used (corrupt, newer schema, not a database)."""


class DamagedDatabase(StoreError):
    """PRAGMA quick_check found damage; nothing was written to the file."""

    def __init__(self, path: Path, problems: list[str]):
        super().__init__(f"{path} is damaged: {problems[0]}")
        self.path = path
        self.problems = problems
