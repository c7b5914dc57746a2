"""``recover``: the databases set aside beside the history, put back or salvaged."""

from __future__ import annotations

import os
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
    from iris_desktop.core.store import StoreError, told_put_back
    from iris_desktop.core.store.recovery import acknowledge, remove_stale_work, set_aside_files
    from iris_desktop.paths import app_paths

    paths = app_paths(args.data_dir).ensure()
    db = paths.db_path
    key = _HistoryKey(paths)
    try:
        removed = remove_stale_work(db)  # a killed recover's copies of the history
        for leftover in removed:
            say(f"removed {leftover.name}: a copy of the history left by a recovery that did "
                "not finish", file=sys.stderr)
        finished = told_put_back(db)  # a put-back a kill cut off, finished just now
        if finished is not None:
            say(f"iris-desktop: {finished.describe()}", file=sys.stderr)
        if args.salvage:
            return _salvage_now(db, args, key)
        if args.file is None:
            files = set_aside_files(db)
            _list_set_aside(db, files, args.json, key)
            acknowledge(db, files)
            return EXIT_OK
        return _restore(db, args, overrides, key)
    except StoreError as exc:
        raise CliError(str(exc), EXIT_FAIL) from None


class _HistoryKey:
    """The keys of the encrypted files of this history (the current database, and those
    set aside from it, whose keys may be earlier ones), found without converting,
    writing or filing anything (``storage_key.find_key``: IRIS_STORAGE_PASSPHRASE, the
    keyring's keys for any of these files); on a terminal, a passphrase is asked when
    none opens a file (once while listing; ``ask_hard`` up to three times for the file
    to put back), and one entered is tried on the other files too."""

    def __init__(self, paths: Any):
        self.paths = paths
        self.entered: list[Any] = []
        self._found: dict[Path, Any] = {}
        self._asked = False

    def __call__(self, file: Path) -> Any:
        """The key that opens ``file``; None for a plain file, or when none opens it."""
        found = self.found(file)
        return found.key if found else None

    def found(self, file: Path, ask_hard: bool = False) -> Any:
        """``storage_key.Found`` (the key and where it came from) for an encrypted
        ``file``; None for a plain file, or when no key opens it."""
        from iris_desktop.core.store.cipher import is_encrypted
        from iris_desktop.storage_key import ATTEMPTS, find_key

        if is_encrypted(file) is not True:
            return None
        if file in self._found:
            return self._found[file]
        found = find_key(file, entered=self.entered)
        tries = ATTEMPTS if ask_hard else (0 if self._asked else 1)
        problem = None
        while found is None and tries > 0 and sys.stdin.isatty():
            tries -= 1
            self._asked = True
            key = _asked_key(file, problem)
            if key is None:
                break
            self.entered.append(key)
            found = find_key(file, entered=[key])
            problem = f"that passphrase does not open {file}"
        self._found[file] = found
        return found


def _asked_key(file: Path, problem: str | None) -> Any:
    from iris_desktop.core.store.cipher import Key

    text = _terminal_passphrase(file, False, problem)
    try:
        return Key.passphrase(text) if text else None
    except ValueError:  # a NUL character
        return None


def _no_key(file: Path) -> str:
    """Why an encrypted file cannot be opened, and what to do, in one clause."""
    from iris_desktop.core.store.cipher import available
    from iris_desktop.storage_key import PASSPHRASE_ENV

    if not available():
        return ("reading it needs the sqlcipher3 package, which is not installed; reinstall "
                "Iris Desktop")
    tried = (f"{PASSPHRASE_ENV} does not open it and " if os.environ.get(PASSPHRASE_ENV)
             else "")
    return (f"{tried}no key kept in the keyring opens it; set {PASSPHRASE_ENV} to the "
            "passphrase it was encrypted with (or run this on a terminal to be asked)")


def _encryption(file: Path, key: _HistoryKey) -> str:
    """"", or how an encrypted file is opened, for the listing."""
    from iris_desktop.core.store.cipher import is_encrypted

    if is_encrypted(file) is not True:
        return ""
    found = key.found(file)
    if found is None:
        return f"encrypted: {_no_key(file)}"
    return f"encrypted, opened with {found.source}"


def _list_set_aside(db: Path, files: list[Path], as_json: bool, key: _HistoryKey) -> None:
    import time

    from iris_desktop.core.store.cipher import is_encrypted
    from iris_desktop.core.store.recovery import SetAside, inspect_set_aside, rows_in_words

    def inspect(file: Path) -> tuple[SetAside, str]:
        how = _encryption(file, key)
        if how.startswith("encrypted:"):  # no key opens it: nothing to read
            stat = file.stat()
            return SetAside(file, stat.st_mtime, stat.st_size, {}, None), how
        return inspect_set_aside(file, key(file)), how

    found = [inspect(f) for f in files]
    current, current_how = (inspect(db) if db.exists() and db.stat().st_size else (None, ""))
    if current_how:  # beside an encrypted history, a plain copy is said to be one
        found = [(a, how or "not encrypted: delete it once it is no longer needed")
                 for a, how in found]

    def source(file: Path) -> str | None:
        opened = key.found(file)
        return opened.source if opened else None

    if as_json:
        print(dump_json({
            "database": str(db),
            "current_rows": current.rows or None if current else None,
            "current_encrypted": is_encrypted(db) is True,
            "set_aside": [{"name": a.path.name, "path": str(a.path), "set_aside_at": a.when,
                           "bytes": a.size, "rows": a.rows or None, "error": a.error,
                           "encrypted": is_encrypted(a.path) is True,
                           "key": source(a.path),
                           "key_problem": how[len("encrypted: "):] if how.startswith("encrypted:")
                           else None} for a, how in found],
        }, indent=2))
        return
    if not found:
        say(f"no set-aside databases beside {db}")
        return

    def rows(counts: dict[str, Any]) -> str:
        return ", ".join(f"{'?' if n is None else f'{n:,}'} {rows_in_words(table, n)}"
                         for table, n in counts.items())

    def held(aside: SetAside, how: str) -> str:
        if aside.error:
            text = f"cannot be opened ({aside.error})"
        elif not aside.rows:
            return how
        else:
            text = rows(aside.rows)
        return f"{text} ({how})" if how else text

    say(f"set-aside databases beside {db}, newest first:")
    for aside, how in found:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(aside.when))
        say(f"  {aside.path.name}  {when}  {aside.size / 1e6:,.1f} MB  {held(aside, how)}")
    say(f"the current database: {held(current, current_how) if current else 'none'}")
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


def _restore(db: Path, args, overrides, key: _HistoryKey) -> int:
    from iris_desktop.core.store.cipher import is_encrypted, is_sqlite
    from iris_desktop.core.store.recovery import restore, set_aside_files
    from iris_desktop.settings import load_settings
    from iris_desktop.storage_key import keep_key

    named = [f for f in set_aside_files(db) if f.name == args.file]
    file = named[0] if named else Path(args.file)
    if not file.is_file():
        raise CliError(f"no set-aside database {args.file} (see 'iris-desktop recover')")
    encrypted = is_encrypted(file) is True
    found = key.found(file, ask_hard=True) if encrypted else None
    if encrypted and found is None and not named:  # (before: "notes.txt is encrypted")
        raise CliError(f"{file} is not a database Iris set aside (see 'iris-desktop recover'), "
                       "nor a plain SQLite database, nor an encrypted one a key of this "
                       "history opens; nothing was changed", EXIT_FAIL)
    if not encrypted and not named and not is_sqlite(file):  # said before asking to put it back
        raise CliError(f"{file} is not a database Iris set aside (see 'iris-desktop recover'), "
                       "nor a SQLite database; nothing was changed", EXIT_FAIL)
    if encrypted and found is None:
        raise CliError(f"{file.name} is encrypted and cannot be put back yet: {_no_key(file)}, "
                       f"then run 'iris-desktop recover {file.name}' again; nothing was changed",
                       EXIT_FAIL)
    encrypt = bool(load_settings(key.paths.config_path, cli=overrides)["storage.encrypt"])
    decrypt = encrypted and not encrypt
    if not _confirm(f"Put back {file.name} in place of {db.name}"
                    f"{' (decrypted: storage.encrypt is off)' if decrypt else ''}? The current "
                    "one is set aside first, not deleted. Close Iris Desktop first.", args):
        return EXIT_OK
    moved = restore(db, file, found.key if found else None, decrypt=decrypt)
    if encrypted and not decrypt:
        keep_key(db, found.key)  # the copy has a salt of its own: its key is kept for it too
    how = ""
    if decrypt:
        how = (f", decrypted with {found.source} because storage.encrypt is off ({file.name} "
               "itself stays encrypted)")
    elif encrypted:
        how = f", encrypted, opened with {found.source}"
    elif encrypt:
        how = ", not encrypted: storage.encrypt is on, so Iris encrypts it at its next start"
    undo = (f"; the database it replaced is set aside as {moved[-1].name} ('iris-desktop "
            f"recover {moved[-1].name}' puts it back)" if moved else "")
    say(f"put back {file.name} as {db}{how}{undo}")
    return EXIT_OK


def _salvage_now(db: Path, args, key: _HistoryKey) -> int:
    from iris_desktop.core.store.cipher import is_encrypted
    from iris_desktop.core.store.recovery import SALVAGE_ASKED, acknowledge, salvage
    from iris_desktop.storage_key import keep_key

    if not db.exists() or not db.stat().st_size:
        raise CliError(f"there is no database at {db} to salvage", EXIT_FAIL)
    if not _confirm(f"Copy what can be read of {db.name} into a new database? The current one "
                    "is set aside, not deleted. Close Iris Desktop first.", args):
        return EXIT_OK
    opened = key.found(db, ask_hard=True)
    if opened is None and is_encrypted(db) is True:
        raise CliError(f"{db} is encrypted and cannot be salvaged yet: {_no_key(db)}; nothing "
                       "was changed", EXIT_FAIL)
    recovery = salvage(db, [SALVAGE_ASKED],
                       opened.key if opened else None)
    keep_key(db, opened.key if opened else None)  # the new database has a salt of its own
    acknowledge(db, [recovery.set_aside])
    say(recovery.describe())
    return EXIT_OK
