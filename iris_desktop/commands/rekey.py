"""``rekey``: the encrypted history encrypted again with a new key, a passphrase or a new
key kept in the keyring (before, a history encrypted with the keyring's key could not be
moved to another computer: its key never left that keyring)."""

from __future__ import annotations

import sys
from pathlib import Path

from iris_desktop.commands.common import EXIT_FAIL, EXIT_OK, CliError, say


def rekey(args, overrides) -> int:
    """Change the history's key (``storage_key.change_key``): the current one from
    IRIS_STORAGE_PASSPHRASE, the keyring or the terminal; the new passphrase from
    IRIS_NEW_STORAGE_PASSPHRASE or asked twice on the terminal."""
    from iris_desktop.core.store import StoreError
    from iris_desktop.paths import app_paths
    from iris_desktop.storage_key import PASSPHRASE_ENV, change_key

    paths = app_paths(args.data_dir).ensure()
    ask = _ask if sys.stdin.isatty() else None
    try:
        key = change_key(paths, args.to, ask=ask)
    except StoreError as exc:
        raise CliError(str(exc), EXIT_FAIL) from None
    if key.kind == "raw":
        say(f"The chat history at {paths.db_path} is now encrypted with a new key kept in this "
            "computer's keyring (no passphrase opens it; the old key stays there for copies "
            "made before).")
    else:
        say(f"The chat history at {paths.db_path} is now encrypted with the new passphrase: "
            f"Iris asks for it at each start (or set {PASSPHRASE_ENV} to it); with it the data "
            "folder opens on any computer. Copies made before keep their old key.")
    return EXIT_OK


def _ask(path: Path, new: bool, problem: str | None) -> str | None:
    """The current passphrase (``new`` False) or the new one, asked twice, on the
    terminal, unechoed; None when none is given."""
    from iris_desktop.commands.common import _terminal_passphrase

    return _terminal_passphrase(path, new, problem, ("Current passphrase of the encrypted "
                                                     "history at", "New passphrase for"))
