"""Which key opens the chat history (``storage.encrypt``), and converting the database
when the setting and the file disagree.

The key is, in this order: the passphrase in ``IRIS_STORAGE_PASSPHRASE`` (scripts, tests,
a computer without a keyring); the random 256-bit key kept in the OS keyring for this
database (made the first time the history is encrypted, when a keyring is there); else a
passphrase the user enters (the CLI asks on its terminal, the desktop app in a dialog).
A passphrase goes through SQLCipher's own KDF. Neither is ever written anywhere by Iris:
not in the settings, the log, the database or a message.

At start (:func:`prepare`, called by the host before it opens the database): with
``storage.encrypt`` on, a plain database is encrypted in place; with it off, an encrypted
one is decrypted (``core.store.cipher.convert``: a verified copy renamed over the
original). The threads' saved KV states, which hold the conversation too, are then
deleted (they were written with the other key, or none), and while the history is
encrypted they are encrypted with a key derived from the same secret (:func:`kv_key`).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from iris_desktop.core.store import StoreError
from iris_desktop.core.store.cipher import (
    Key,
    KeyChanged,
    KeyRejected,
    check_key,
    convert,
    file_salt,
    is_encrypted,
    replaced_since,
    tidy,
)
from iris_desktop.core.store.recovery import ASIDE_MARKS
from iris_desktop.keyring_secrets import (
    delete_secret,
    get_secret,
    keyring_present,
    read_secret,
    set_secret,
)
from iris_desktop.paths import AppPaths

log = logging.getLogger("iris.storage")

__all__ = [
    "KEYRING_SERVICE", "NEW_PASSPHRASE_ENV", "PASSPHRASE_ENV", "AskPassphrase", "Found",
    "Prepared", "change_key", "find_key",
    "follow_history", "keep_key", "kv_key", "prepare", "storage_note",
]

#: the environment variable that supplies the passphrase without asking
PASSPHRASE_ENV = "IRIS_STORAGE_PASSPHRASE"
#: the keyring service; the user name is "database <salt>" (or, before the file has one,
#: its path)
KEYRING_SERVICE = "iris-desktop-storage"
#: how many times a wrong passphrase may be entered again when asked
ATTEMPTS = 3

#: ``ask(path, new, problem)``: a passphrase for the history at ``path`` (``new``: one to
#: encrypt it with, to be confirmed), ``problem`` the last try's error; None: cancelled
AskPassphrase = Callable[[Path, bool, "str | None"], "str | None"]


@dataclass(frozen=True)
class Prepared:
    """What the host opens the database with: the key (None: plain), and whether it was
    converted now ("encrypted", "decrypted" or None)."""

    key: Key | None
    converted: str | None = None
    #: database copies set aside before (damaged, or replaced by a restore) that stay
    #: plain beside a history encrypted now
    plain_copies: tuple[str, ...] = ()


# -- the keyring ---------------------------------------------------------------------------


def _names(path: Path) -> list[str]:
    """The keyring's user names for the database at ``path``: its salt (which follows the
    file wherever the data folder moves), then its path (a key not yet filed by salt: the
    database was not encrypted yet)."""
    salt = file_salt(path)
    return ([f"database {salt.hex()}"] if salt else []) + [str(path.resolve())]


def _keyring_get(path: Path) -> bytes | None:
    """The raw key kept for ``path``; None when there is none, or no usable keyring."""
    found = _keyring_find(path)
    return found[0] if found else None


def _keyring_find(path: Path) -> tuple[bytes, str] | None:
    """(the raw key kept for ``path``, the name it is kept under), or None."""
    for name in _names(path):
        value = get_secret(KEYRING_SERVICE, name, f"the storage key of {name}")
        try:
            data = bytes.fromhex(value) if value else None
        except ValueError:
            data = None
        if data and len(data) == 32:
            return data, name
    return None


def _keyring_keep(path: Path, key: bytes) -> bool:
    """Keep ``key`` for the database at ``path`` (under its salt once it has one, the path
    forgotten then); False when there is no usable keyring."""
    name, *older = _names(path)
    try:
        set_secret(KEYRING_SERVICE, name, key.hex(), f"the storage key of {name}")
    except Exception:  # no usable keyring: set_secret said why in the log
        return False
    for name in older:
        _keyring_delete(name)
    return _keyring_get(path) == key


def _keyring_new(path: Path) -> bytes | None:
    """A new random 256-bit key kept in the keyring for ``path`` (read back to be sure);
    None when there is no usable keyring."""
    key = secrets.token_bytes(32)
    return key if _keyring_keep(path, key) else None


def _keyring_unreadable(path: Path) -> str | None:
    """Why the keyring that may hold the key of ``path`` cannot be read now (locked,
    broken), as a clause that says what to do; None when it can, or there is none."""
    why = read_secret(KEYRING_SERVICE, _names(path)[0], "the storage key")[1]
    if why is None:
        return None
    return (f"{why}: if Iris kept this history's key there (no passphrase was ever chosen "
            f"for it), unlock the keyring and start Iris again; else set {PASSPHRASE_ENV} or "
            "enter the passphrase")


def _no_key_kept(path: Path) -> str:
    """Why no key opened the history when the keyring could be read, as a clause: none is
    kept for it (the dialog asked for "its passphrase" of a history no passphrase was ever
    chosen for, and never said the keyring had nothing, or that there was no keyring).
    What the history was encrypted with (:func:`_kept_kind`) says which: a history
    encrypted with the keyring's key is never asked a passphrase (an audit: opened where
    the keyring could not be reached, such as an SSH session, it asked for "the
    passphrase it was encrypted with", though none was ever chosen)."""
    kind = _kept_kind(path)
    if kind == "passphrase":
        return f"it was encrypted with a passphrase: enter it, or set {PASSPHRASE_ENV}"
    if kind == "keyring" and not keyring_present():
        return ("its key is in your desktop keyring, which cannot be reached from this session "
                "(no passphrase was ever chosen for it): run Iris in your desktop session (or "
                "where that keyring is)")
    if kind == "keyring":
        return ("no key for it is kept in this computer's keyring, and no passphrase was ever "
                "chosen for it: its key is in the keyring of the computer and user account that "
                "encrypted it (a copy of the data folder alone cannot be opened elsewhere); run "
                "Iris there")
    if not keyring_present():
        return ("no keyring can be reached from this session (or it is not an Iris database): "
                f"if it was encrypted with a passphrase, enter it, or set {PASSPHRASE_ENV}; if "
                "Iris kept its key in your desktop keyring, run Iris in your desktop session")
    return ("no key for it is kept in this computer's keyring (its key is kept on another "
            "computer or user account, or it is not an Iris database): if it was encrypted "
            f"with a passphrase, enter it, or set {PASSPHRASE_ENV}")


def _kind_file(path: Path) -> Path:
    """Beside the history at ``path``, hidden: what it is encrypted with, "keyring" or
    "passphrase", and the file's salt (no secret: only which of the two to ask for)."""
    return path.with_name(f".{path.name}.key-kind")


def _kept_kind(path: Path) -> str | None:
    """"keyring" or "passphrase": what the history at ``path`` was encrypted with; None
    when that was not recorded (encrypted by an older Iris), or the record is of another
    file (its salt differs: a copy put back, a conversion cut off; a review found a stale
    record refused to ask for a passphrase the file did need)."""
    try:
        kind, _, salt = _kind_file(path).read_text(encoding="ascii").strip().partition(" ")
    except (OSError, UnicodeDecodeError):
        return None
    here = file_salt(path)
    if kind not in ("keyring", "passphrase") or here is None or salt != here.hex():
        return None
    return kind


def _keep_kind(path: Path, key: Key | None) -> None:
    """Record what the history at ``path`` is encrypted with (remove the record for a
    plain one): written when it is encrypted, or first opened by this version. Nothing
    when the file is not the one ``key`` was found to open (``Key.seen``: another process
    gave it a new key meanwhile, and recorded it itself)."""
    marker = _kind_file(path)
    try:
        salt = file_salt(path)
        if key is not None and key.seen is not None and salt != key.seen:
            return
        if key is None or salt is None:
            marker.unlink(missing_ok=True)
            return
        kind = "keyring" if key.kind == "raw" else "passphrase"
        if _kept_kind(path) == kind:
            return
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(f"{kind} {salt.hex()}\n")
    except OSError as exc:  # only the wording of a later question depends on it
        log.warning("could not record what %s is encrypted with: %s", path, exc)


def _keyring_delete(name: str) -> None:
    delete_secret(KEYRING_SERVICE, name, f"the storage key of {name}")


# -- deciding the key ----------------------------------------------------------------------


def _env_passphrase(env: Mapping[str, str]) -> Key | None:
    text = env.get(PASSPHRASE_ENV)
    if not text:
        return None
    try:
        return Key.passphrase(text)
    except ValueError:
        raise StoreError(f"{PASSPHRASE_ENV} is not a usable passphrase (it holds a NUL "
                         "character); set another") from None


def _asked(path: Path, new: bool, ask: AskPassphrase | None, problem: str | None) -> Key:
    if ask is None and new:
        raise StoreError(f"storage.encrypt is on but no keyring on this computer can keep a key "
                         f"for {path}: set {PASSPHRASE_ENV} or enter a passphrase (run Iris on a "
                         "terminal, or start the desktop app); nothing was changed")
    if ask is None and problem:  # a locked keyring: its key is likely there
        raise StoreError(f"{path} is encrypted and {problem}; nothing was changed")
    if ask is None:
        raise StoreError(f"{path} is encrypted and {_no_key_kept(path)} (run Iris on a terminal, or "
                         "start the desktop app, to be asked); nothing was changed")
    text = ask(path, new, problem)
    if not text and new:
        raise StoreError(f"no passphrase was given, so the history at {path} was neither encrypted "
                         "nor opened; choose one, or turn encryption off (iris-desktop config set "
                         "storage.encrypt false)")
    if not text:
        raise StoreError(f"no passphrase was given, so Iris did not open the history at {path}; "
                         "nothing was changed")
    try:
        return Key.passphrase(text)
    except ValueError:
        raise StoreError("that passphrase cannot be used (it holds a NUL character); "
                         "nothing was changed") from None


def _existing_key(path: Path, env: Mapping[str, str], ask: AskPassphrase | None,
                  seen: bytes | None = None) -> Key:
    """The key that opens the encrypted database at ``path``, checked. ``seen``: the
    file's salt before (a passphrase is not asked again once another file is there)."""
    key = _env_passphrase(env)
    if key is not None:
        try:
            check_key(path, key)  # a wrong passphrase in the environment is not asked again
        except KeyRejected:
            raw = _keyring_get(path)
            if raw is not None and _opens(path, Key.raw(raw)):  # a variable left from before
                raise KeyRejected(f"{PASSPHRASE_ENV} does not open the encrypted history at "
                                  f"{path}, but the key kept in this computer's keyring does: "
                                  f"unset {PASSPHRASE_ENV}; nothing was changed") from None
            raise
        return key
    raw = _keyring_get(path)
    problem = None
    if raw is not None:
        key = Key.raw(raw)
        try:
            check_key(path, key)
            if _keyring_find(path) != (raw, _names(path)[0]):
                _keyring_keep(path, raw)  # filed under the file's salt from now on
            return key
        except KeyRejected as exc:
            if ask is None:
                raise
            problem = str(exc)
    else:
        # a database a salvage or a restore wrote has a salt of its own: its key is the
        # one kept for a database set aside beside it (then filed under its salt too)
        for raw in _keyring_kin(path):
            if _opens(path, Key.raw(raw)):
                keep_key(path, Key.raw(raw))
                return Key.raw(raw)
        problem = _keyring_unreadable(path)
        if problem is None and _kept_kind(path) == "keyring":  # no passphrase to ask for
            raise StoreError(f"{path} is encrypted and {_no_key_kept(path)}; nothing was changed")
    for attempt in range(ATTEMPTS):
        key = _asked(path, False, ask, problem)
        try:
            check_key(path, key)
            return key
        except KeyRejected as exc:
            if attempt == ATTEMPTS - 1 or replaced_since(path, seen):
                raise
            problem = str(exc)
    raise AssertionError("unreachable")


def _new_key(path: Path, env: Mapping[str, str], ask: AskPassphrase | None) -> Key:
    """The key to encrypt the database at ``path`` with, for the first time."""
    key = _env_passphrase(env)
    if key is not None:
        return key
    raw = _keyring_get(path) or _keyring_new(path)
    if raw is not None:
        return Key.raw(raw)
    return _asked(path, True, ask, None)


# -- the key of one file: the history, or a database set aside from it ---------------------


@dataclass(frozen=True)
class Found:
    """The key that opens an encrypted file, and where it came from, in the user's words:
    ``IRIS_STORAGE_PASSPHRASE``, "the key kept in the keyring" or "the passphrase
    entered"."""

    key: Key
    source: str


def _opens(path: Path, key: Key) -> bool:
    try:
        check_key(path, key)
    except StoreError:  # the wrong key (or a file no key opens)
        return False
    return True


def _keyring_kin(path: Path) -> list[bytes]:
    """The raw keys the keyring keeps for the history beside ``path`` and the databases
    set aside from it (each a key of this history, perhaps an earlier one), without
    duplicates; nothing is filed or forgotten."""
    history = path
    for mark in ASIDE_MARKS:
        if mark in path.name:
            history = path.with_name(path.name.split(mark, 1)[0])
    files = [path, history, *sorted(_set_aside_beside(history))]
    found: list[bytes] = []
    for name in dict.fromkeys(n for f in files for n in _names(f)):
        value = get_secret(KEYRING_SERVICE, name, f"the storage key of {name}")
        try:
            data = bytes.fromhex(value) if value else None
        except ValueError:
            data = None
        if data and len(data) == 32 and data not in found:
            found.append(data)
    return found


def find_key(path: Path, env: Mapping[str, str] | None = None,
             entered: Sequence[Key] = ()) -> Found | None:
    """The key that opens the encrypted file at ``path`` (the history, or a database set
    aside beside it), found without writing, converting or filing anything: the
    passphrase in ``IRIS_STORAGE_PASSPHRASE``, then ``entered`` (passphrases the user
    typed), then the keys the keyring keeps for this file, the history and the other
    databases set aside beside it. None when none opens it."""
    env = os.environ if env is None else env
    passphrase = _env_passphrase(env)
    if passphrase is not None and _opens(path, passphrase):
        return Found(passphrase, PASSPHRASE_ENV)
    for key in entered:
        if _opens(path, key):
            return Found(key, "the passphrase entered")
    for raw in _keyring_kin(path):
        if _opens(path, Key.raw(raw)):
            return Found(Key.raw(raw), "the key kept in the keyring")
    return None


def _set_aside_beside(path: Path) -> list[Path]:
    """The encrypted databases set aside beside the history at ``path``."""
    return [p for p in path.parent.glob(f"{path.name}.*")
            if p.name[len(path.name):].startswith(ASIDE_MARKS)
            and not p.name.endswith(("-wal", "-shm", "-journal")) and is_encrypted(p) is True]


def _file_under_salt(path: Path, key: Key) -> None:
    salt = file_salt(path)
    if salt is not None:
        _file_under_salt_of(salt, key)


def _file_under_salt_of(salt: bytes, key: Key) -> None:
    name = f"database {salt.hex()}"
    if get_secret(KEYRING_SERVICE, name, f"the storage key of {name}") == key.secret.hex():
        return
    try:
        set_secret(KEYRING_SERVICE, name, key.secret.hex(), f"the storage key of {name}")
    except Exception:  # no usable keyring: set_secret said why in the log
        log.warning("the key of database %s could not be kept in the keyring", salt.hex())


def _keep_for_set_aside(path: Path, key: Key) -> None:
    """Keep the keyring's ``key`` under the salt of each database set aside beside the
    history at ``path`` that it opens, so that it outlives a new salt of the history's
    own file (a salvage, a restore)."""
    for aside in _set_aside_beside(path):
        if _opens(aside, key):
            _file_under_salt(aside, key)


def keep_key(path: Path, key: Key | None, salt: bytes | None = None) -> None:
    """After a salvage or a restore wrote the encrypted database at ``path`` with a key
    from the keyring: keep that key under the new file's salt, and under the salt of
    each database set aside beside it that it opens (no name is forgotten). Nothing for a
    passphrase (nothing of it is ever kept), a plain file, or a computer without a
    keyring. ``salt``: the file's, read through a connection this process has open to it
    (reading the file itself would close a descriptor of it, which drops the connection's
    POSIX locks)."""
    if key is None or key.kind != "raw":
        return
    if salt:
        _file_under_salt_of(salt, key)
    elif salt is None and is_encrypted(path) is True:
        _file_under_salt(path, key)
    _keep_for_set_aside(path, key)


def _drop_kv_states(paths: AppPaths, only_plain: bool = False) -> None:
    """The saved KV states were written under the other key (or none): delete them,
    overwritten first (a plain one holds the chat's tokens). ``only_plain``: the plain
    ones only, at every start of an encrypted history: a process killed after the switch
    to encryption and before the states were dropped left them, said nowhere, for good."""
    from iris_desktop.core.store.cipher import _shred
    from iris_desktop.runtime.kv_store import SEALED

    folder = paths.kv_cache_dir
    if not folder.is_dir():
        return
    for state in folder.glob("*.kv"):
        try:
            if only_plain:
                with open(state, "rb") as handle:
                    if handle.read(len(SEALED)) == SEALED:
                        continue
            _shred(state)
        except OSError as exc:  # another process's state in use, a file gone: next start
            log.warning("could not remove the saved state %s: %s", state, exc)


def prepare(paths: AppPaths, encrypt: bool | None, env: Mapping[str, str] | None = None,
            ask: AskPassphrase | None = None, step: Callable[[str], None] | None = None,
            seen: bytes | None = None) -> Prepared:
    """Decide the key for ``paths.db_path`` and convert the database when ``encrypt``
    (``storage.encrypt`` as set by the user) and the file disagree; None (the setting
    left at its default) keeps the history as it is: an encrypted one is never decrypted
    because a start lacked the setting (a desktop launcher without the shell's
    ``IRIS_STORAGE_ENCRYPT``). ``seen``: the history's salt noted before the start waited
    for another process's conversion, where the file changed meanwhile (a rekey: its key
    refused is then :class:`KeyChanged`); None: noted here. Raises StoreError
    (KeyRejected for a wrong key) saying what to do; the file is then unchanged."""
    env = os.environ if env is None else env
    path = paths.db_path
    tidy(path)
    state = is_encrypted(path)
    if state is True:
        key = _decided_key(path, env, ask, seen)
        if encrypt is not False:
            _drop_kv_states(paths, only_plain=True)
            _keep_kind(path, key)  # a history encrypted by an older Iris: from now on
            return Prepared(key)
        salt = file_salt(path)
        _drop_kv_states(paths)
        convert(path, key, None, step)
        _keep_kind(path, None)
        if key.kind == "raw":
            # the key stays filed under the encrypted file's salt: a copy of it (a backup,
            # a database set aside) still opens; only the name by path is forgotten
            _keep_for_set_aside(path, key)
            if salt:
                _file_under_salt_of(salt, key)
            _keyring_delete(str(path.resolve()))
        log.info("the chat history was decrypted (storage.encrypt is off)")
        return Prepared(None, "decrypted")
    if not encrypt:
        return Prepared(None)
    key = _new_key(path, env, ask)
    if state is None:  # a new database: created encrypted
        _keep_kind(path, key)
        return Prepared(key)
    _drop_kv_states(paths)  # before the switch: a kill after it left the plain ones
    convert(path, None, key, step)
    _keep_kind(path, key)
    if key.kind == "raw":
        _keyring_keep(path, key.secret)  # filed under the new file's salt
    log.info("the chat history was encrypted (storage.encrypt is on)")
    earlier = sorted(p.name for mark in ASIDE_MARKS for p in path.parent.glob(f"{path.name}{mark}*")
                     if not p.name.endswith(("-wal", "-shm")) and is_encrypted(p) is False)
    if earlier:  # copies set aside before: the user's to keep or delete (said at the switch)
        log.warning("%d database file(s) set aside earlier are not encrypted (%s); delete them "
                    "once they are no longer needed", len(earlier), ", ".join(earlier))
    return Prepared(key, "encrypted", tuple(earlier))


def _decided_key(path: Path, env: Mapping[str, str], ask: AskPassphrase | None,
                 before: bytes | None = None) -> Key:
    """:func:`_existing_key` of a start, which decides it without the conversion lock (a
    passphrase may be asked for minutes, and the lock would keep every other start and
    command out meanwhile): the key remembers the salt of the file it opened
    (``Key.seen``), so that a file another process put in its place meanwhile (``rekey``,
    a put-back) is said as that, here or when the start opens it (:class:`KeyChanged`),
    never as a wrong key or a damaged first page (before, a start beside a rekey said
    "the file's first page is damaged: 'iris-desktop recover' lists copies to put back").
    ``before``: the salt noted before the start waited for a rekey's lock (the file then
    found is already the new one; before, a start that waited said it was damaged)."""
    seen = file_salt(path) if before is None else before
    try:
        key = _existing_key(path, env, ask, seen)
        if replaced_since(path, seen):  # a rekey ended while it was asked: which file did it open?
            now = file_salt(path)
            check_key(path, key)  # (the new passphrase, typed after it: this one)
            if replaced_since(path, now):  # swapped again meanwhile
                raise KeyChanged(path)
            seen = now
    except KeyRejected:
        if replaced_since(path, seen):
            raise KeyChanged(path) from None
        raise
    return replace(key, seen=seen)


#: the environment variable that supplies the new passphrase of :func:`change_key`
NEW_PASSPHRASE_ENV = "IRIS_NEW_STORAGE_PASSPHRASE"


def change_key(paths: AppPaths, to: str, env: Mapping[str, str] | None = None,
               ask: AskPassphrase | None = None, step: Callable[[str], None] | None = None,
               again: str = "run 'iris-desktop rekey' again") -> Key:
    """Encrypt the encrypted history again with a new key (``iris-desktop rekey``):
    ``to`` "passphrase" (``IRIS_NEW_STORAGE_PASSPHRASE``, else ``ask(path, True, None)``),
    or "keyring", a new random key kept in this computer's keyring. The conversion is
    :func:`prepare`'s (a verified copy renamed over the original). A key from the keyring
    stays filed under the old file's salt, so copies made before (a backup, a database
    set aside) still open. Returns the new key; raises StoreError, the history unchanged,
    when it is not encrypted, the current key is not found, another process has it open,
    or the new key is the one it has."""
    from iris_desktop.core.store.cipher import no_conversion

    env = os.environ if env is None else env
    path = paths.db_path
    tidy(path)
    if is_encrypted(path) is not True:
        raise StoreError(f"the chat history at {path} is not encrypted, so it has no key to "
                         "change; to encrypt it: iris-desktop config set storage.encrypt true")
    # held throughout: a start or recover meanwhile says what this does (and one under
    # way is waited for 5 s, then said)
    # (``again``: how to retry, as a refusal says it: the window's own menu item there)
    with no_conversion(path, word="rekeying", then=f"{again} when it is done; nothing was "
                       "changed"):
        return _change_key(paths, to, env, ask, step, again)


def _change_key(paths: AppPaths, to: str, env: Mapping[str, str], ask: AskPassphrase | None,
                step: Callable[[str], None] | None, again: str) -> Key:
    """:func:`change_key`, with the conversion lock held."""
    from iris_desktop.core.store.holders import refuse_if_in_use

    path = paths.db_path
    refuse_if_in_use(path)
    old = _existing_key(path, env, ask)
    new = _rekey_target(path, to, env, ask)
    if new.kind == old.kind and new.secret == old.secret:
        raise StoreError(f"that passphrase is the one the history at {path} is encrypted with "
                         "now; nothing was changed")
    salt = file_salt(path)
    if old.kind == "raw":
        _keep_for_set_aside(path, old)
        _file_under_salt(path, old)
        if salt is None or get_secret(KEYRING_SERVICE, f"database {salt.hex()}",
                                      "the storage key") != old.secret.hex():
            raise StoreError("the keyring did not keep the current key under this history's "
                             "name (see the log), so its entry by path may not be replaced; "
                             "nothing was changed")
    by_path = str(path.resolve())
    if new.kind == "raw":  # kept before the switch, by path (the new salt is not known yet):
        _keyring_keep_as(by_path, new.secret)  # a kill after it finds it there
    _drop_kv_states(paths)  # sealed with a key derived from the old one
    try:
        convert(path, old, new, step, then=again)
    except BaseException:
        if new.kind == "raw" and file_salt(path) == salt:  # not switched: the new key opens
            _keyring_delete(by_path)  # nothing (every later start said it did not open it)
        raise
    _keep_kind(path, new)
    if new.kind == "raw":
        _keyring_keep(path, new.secret)  # filed under the new file's salt, the path forgotten
    log.info("the chat history's key was changed (now %s)", "the keyring's" if new.kind == "raw"
             else "a passphrase")
    return new


def _rekey_target(path: Path, to: str, env: Mapping[str, str], ask: AskPassphrase | None) -> Key:
    """The new key of :func:`change_key`."""
    if to == "keyring":
        if not keyring_present():
            raise StoreError("no keyring can be reached from this session to keep the new key "
                             "in; run this in your desktop session, or choose a passphrase "
                             "(--to passphrase); nothing was changed")
        return Key.raw(secrets.token_bytes(32))
    text = env.get(NEW_PASSPHRASE_ENV)
    if text is None and ask is None:
        raise StoreError(f"no new passphrase: set {NEW_PASSPHRASE_ENV}, or run this on a "
                         "terminal to be asked; nothing was changed")
    text = text if text is not None else ask(path, True, None)
    if not text:
        raise StoreError("no new passphrase was given (none typed, or the two typed differed "
                         "three times); nothing was changed")
    try:
        return Key.passphrase(text)
    except ValueError:
        raise StoreError("that passphrase cannot be used (it holds a NUL character); nothing "
                         "was changed") from None


def _keyring_keep_as(name: str, key: bytes) -> None:
    """Keep ``key`` under the keyring's user ``name``, read back; StoreError when the
    keyring cannot keep it."""
    try:
        set_secret(KEYRING_SERVICE, name, key.hex(), f"the storage key of {name}")
    except Exception:  # no usable keyring: set_secret said why in the log
        pass
    if get_secret(KEYRING_SERVICE, name, f"the storage key of {name}") != key.hex():
        raise StoreError("the keyring did not keep the new key (see the log); nothing was "
                         "changed")


def storage_note(prepared: Prepared, db_path: Path, config_path: Path, source: str) -> str | None:
    """What this start did to the history's encryption, in a sentence the CLI and the
    window show; None when it did nothing. ``source``: where storage.encrypt was set.
    When a one-run override (the command line, IRIS_STORAGE_ENCRYPT) went against the
    settings file, it says that the next start without it converts the history back
    (before, it advised setting in the file what the file already said)."""
    if prepared.converted is None:
        return None
    where = {"file": f"set in {config_path}", "env": "set by IRIS_STORAGE_ENCRYPT",
             "cli": "set on the command line"}.get(source, source)
    encrypted = prepared.converted == "encrypted"
    below = _setting_below(config_path, source)
    back = ""
    if below is not None and below[0] != encrypted:
        fix = ("iris-desktop config set storage.encrypt " + ("true" if encrypted else "false")
               if below[1] == "file" else
               f"set IRIS_STORAGE_ENCRYPT to {'true' if encrypted else 'false'}")
        back = (f" {config_path if below[1] == 'file' else 'IRIS_STORAGE_ENCRYPT'} still sets "
                f"it {'off' if encrypted else 'on'}, so the next start without that override "
                f"{'decrypts' if encrypted else 'encrypts'} it again; to keep it "
                f"{'encrypted' if encrypted else 'decrypted'}: {fix}.")
    if not encrypted:
        again = back or " To encrypt it again: iris-desktop config set storage.encrypt true."
        return (f"The chat history at {db_path} is no longer encrypted: storage.encrypt is off "
                f"({where}).{again}")
    plain = prepared.plain_copies
    left = (f" {len(plain)} {'copy' if len(plain) == 1 else 'copies'} of it set aside earlier "
            f"{'is' if len(plain) == 1 else 'are'} not encrypted ({', '.join(plain[:3])}"
            f"{', …' if len(plain) > 3 else ''}): 'iris-desktop recover' lists them; delete "
            "them once they are no longer needed.") if plain else ""
    kept = (" Its key is kept in this computer's keyring, not in the data folder: a copy of the "
            "data folder alone cannot be opened on another computer or user account."
            ) if prepared.key is not None and prepared.key.kind == "raw" else ""
    return (f"The chat history at {db_path} is now encrypted (storage.encrypt is on, "
            f"{where}).{back}{kept}{left}")


def _setting_below(config_path: Path, source: str) -> tuple[bool, str] | None:
    """storage.encrypt as the next start without this run's override (``source`` "cli"
    or "env") sets it, and where ("file" or "env"); None when nothing below sets it (it
    then follows the history as it is now) or there was no override."""
    if source not in ("cli", "env"):
        return None
    from iris_desktop.settings import load_settings

    below = load_settings(config_path, {} if source == "env" else None)
    if below.source("storage.encrypt") not in ("file", "env"):
        return None
    return bool(below["storage.encrypt"]), below.source("storage.encrypt")


def follow_history(settings: Any, db_path: Path | None = None, encrypted: bool | None = None) -> Any:
    """``settings`` (a :class:`~iris_desktop.settings.Settings`, changed in place) with
    ``storage.encrypt``, when nothing sets it, as the history is (``encrypted``, or read
    from the file at ``db_path``: only where no connection to it is open in this process):
    left unset the setting follows the file, so the dialog and ``config get`` say "on" for
    an encrypted history (source "history") and a start never decrypts it."""
    if encrypted is None:
        encrypted = db_path is not None and is_encrypted(db_path) is True
    if settings.source("storage.encrypt") == "default" and encrypted:
        settings.values["storage.encrypt"], settings.sources["storage.encrypt"] = True, "history"
    return settings


def kv_key(key: Key | None, salt: bytes) -> bytes | None:
    """The 256-bit key of the saved KV states, derived from the history's secret and its
    database's salt (``salt``): HKDF-SHA256 of the keyring's key, or of the key SQLCipher's
    KDF stretched a passphrase into (PBKDF2-HMAC-SHA512, 256,000 rounds, done once). None
    for a plain history."""
    if key is None:
        return None
    material = key.stretched(salt) if key.kind == "passphrase" else key.secret
    prk = hmac.new(salt, material, hashlib.sha256).digest()
    return hmac.new(prk, b"iris-desktop kv-state v1\x01", hashlib.sha256).digest()


def keep_memory_private() -> bool:
    """While the history is encrypted, this process's memory (which holds it in plain
    text) is not written to a core file nor readable by another process of the user's:
    Linux's PR_SET_DUMPABLE 0 (as ssh-agent and gpg-agent do; a piped core pattern such
    as systemd-coredump ignores the core-file limit), elsewhere on POSIX the core-file
    limit 0. Returns whether it was done (Windows: left to its error reporting)."""
    try:
        if sys.platform.startswith("linux"):
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            return libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
        if os.name == "posix":
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            return True
    except (OSError, ValueError, AttributeError):
        log.warning("could not keep this process from core dumps", exc_info=True)
    return False


#: prctl(2)'s option for "may this process be dumped (or attached to)"
PR_SET_DUMPABLE = 4
