"""``recover``: the databases set aside beside the history, put back or salvaged."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from iris_desktop.commands.common import (
    EXIT_FAIL,
    EXIT_OK,
    CliError,
    _terminal_passphrase,
    dump_json,
    say,
)

# -- set-aside databases ------------------------------------------------------------------


def recover(args, overrides) -> int:
    """List the databases set aside beside the history (and mark them shown), put one
    back (``FILE``: the current database is set aside first, never deleted), or copy
    what can be read of the current one into a new database (``--salvage``). Works on
    the files directly: the current database is not opened (nor checked, nor salvaged)
    to list or restore."""
    from iris_desktop.core.store import StoreError
    from iris_desktop.core.store.recovery import acknowledge, remove_stale_work, set_aside_files
    from iris_desktop.paths import app_paths

    paths = app_paths(args.data_dir).ensure()
    db = paths.db_path
    key = _HistoryKey(paths)
    try:
        if args.salvage:
            return _salvage_now(db, args, key)
        removed = remove_stale_work(db)  # a killed recover's copies of the history
        for leftover in removed:
            say(f"removed {leftover.name}: a copy of the history left by a recovery that did "
                "not finish", file=sys.stderr)
        if args.file is None:
            files = set_aside_files(db)
            _list_set_aside(db, files, args.json, key)
            acknowledge(db, files)
            return EXIT_OK
        return _restore(db, args, key)
    except StoreError as exc:
        raise CliError(str(exc), EXIT_FAIL) from None


class _HistoryKey:
    """The key of an encrypted file of this history (the current database, or one set
    aside from it: the same key), found as the host finds it (IRIS_STORAGE_PASSPHRASE,
    the keyring, or asked on a terminal) the first time one is needed; None for a plain
    file."""

    def __init__(self, paths: Any):
        self.paths = paths
        self._key: Any = None

    def __call__(self, file: Path) -> Any:
        from iris_desktop.core.store.cipher import is_encrypted
        from iris_desktop.storage_key import prepare

        if is_encrypted(file) is not True:
            return None
        if self._key is None:
            # the current database's own state: prepare() then converts nothing
            ask = _terminal_passphrase if sys.stdin.isatty() else None
            self._key = prepare(self.paths, is_encrypted(self.paths.db_path) is True,
                                ask=ask).key
        return self._key


def _list_set_aside(db: Path, files: list[Path], as_json: bool, key: _HistoryKey) -> None:
    import time

    from iris_desktop.core.store.recovery import inspect_set_aside

    found = [inspect_set_aside(f, key(f)) for f in files]
    current = inspect_set_aside(db, key(db)) if db.exists() and db.stat().st_size else None
    if as_json:
        print(dump_json({
            "database": str(db),
            "current_rows": current.rows if current else None,
            "set_aside": [{"name": a.path.name, "path": str(a.path), "set_aside_at": a.when,
                           "bytes": a.size, "rows": a.rows, "error": a.error} for a in found],
        }, indent=2))
        return
    if not found:
        say(f"no set-aside databases beside {db}")
        return

    def rows(counts: dict[str, Any]) -> str:
        return ", ".join(f"{'?' if n is None else f'{n:,}'} {table.replace('_', ' ')}"
                         for table, n in counts.items())

    say(f"set-aside databases beside {db}, newest first:")
    for aside in found:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(aside.when))
        held = f"cannot be opened ({aside.error})" if aside.error else rows(aside.rows)
        say(f"  {aside.path.name}  {when}  {aside.size / 1e6:,.1f} MB  {held}")
    say(f"the current database: {rows(current.rows) if current else 'empty'}")
    say("put one back with 'iris-desktop recover NAME' (the current database is set aside "
        "first, never deleted)")


def _confirm(question: str, args) -> bool:
    """--yes, or the user's yes on a terminal; without a terminal nobody can say yes."""
    if args.yes:
        return True
    if not sys.stdin.isatty():
        raise CliError("nothing was changed: add --yes (nobody to ask)")
    try:
        answer = input(f"{question} [y/N] ")
    except EOFError:
        answer = ""
    if answer.strip().lower() in ("y", "yes"):
        return True
    say("iris-desktop: nothing was changed", file=sys.stderr)
    return False


def _restore(db: Path, args, key: _HistoryKey) -> int:
    from iris_desktop.core.store.recovery import restore, set_aside_files

    named = [f for f in set_aside_files(db) if f.name == args.file]
    file = named[0] if named else Path(args.file)
    if not file.is_file():
        raise CliError(f"no set-aside database {args.file} (see 'iris-desktop recover')")
    if not _confirm(f"Put back {file.name} in place of {db.name}? The current one is set aside "
                    "first, not deleted. Close Iris Desktop first.", args):
        return EXIT_OK
    moved = restore(db, file, key(file))
    undo = (f"; the database it replaced is set aside as {moved[-1].name} ('iris-desktop "
            f"recover {moved[-1].name}' puts it back)" if moved else "")
    say(f"put back {file.name} as {db}{undo}")
    return EXIT_OK


def _salvage_now(db: Path, args, key: _HistoryKey) -> int:
    from iris_desktop.core.store.recovery import acknowledge, salvage

    if not db.exists() or not db.stat().st_size:
        raise CliError(f"there is no database at {db} to salvage", EXIT_FAIL)
    if not _confirm(f"Copy what can be read of {db.name} into a new database? The current one "
                    "is set aside, not deleted. Close Iris Desktop first.", args):
        return EXIT_OK
    recovery = salvage(db, ["salvage asked for with 'iris-desktop recover --salvage'"], key(db))
    acknowledge(db, [recovery.set_aside])
    say(recovery.describe())
    return EXIT_OK
