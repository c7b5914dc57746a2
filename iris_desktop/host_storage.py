"""The history's key at a start (the host's first step), with this process's memory kept
private while the history is encrypted; :mod:`.storage_key` decides the key."""

from __future__ import annotations

from collections.abc import Mapping

from iris_desktop.core.store.cipher import check_place, file_salt, is_encrypted, no_conversion
from iris_desktop.paths import AppPaths
from iris_desktop.storage_key import AskPassphrase, Prepared, keep_memory_private, prepare


def prepare_privately(paths: AppPaths, wanted: bool | None, env: Mapping[str, str] | None,
                      ask: AskPassphrase | None) -> Prepared:
    """:func:`~.storage_key.prepare` (``wanted``: ``storage.encrypt`` as set, None at its
    default), with :func:`~.storage_key.keep_memory_private` before the passphrase is asked
    and the key derived when the setting or the file says encrypted, and after it when the
    history it decided on is encrypted all the same: a put-back a kill cut off, finished
    by prepare, put an encrypted history where there was none or a plain one (before,
    that start left its memory dumpable). The history's salt is noted before the wait for
    another process's conversion: a start that waited for a rekey is told the history got
    a new key meanwhile (:class:`~.core.store.cipher.KeyChanged`), not that its first page
    is damaged (before, the salt was noted after the wait: already the new file's). Raises
    StoreError as prepare does, and for a history's place that holds no file
    (:func:`~.core.store.cipher.check_place`: a folder, a named pipe, a loop)."""
    db = paths.db_path
    check_place(db)  # a folder or a named pipe there is said, and nothing waits on a pipe
    private = wanted or (wanted is None and is_encrypted(db) is True)
    if private:
        keep_memory_private()
    seen = file_salt(db)  # the file before the wait: a rekey may put another in its place
    with no_conversion(db):
        pass  # another process's encryption or decryption finishes before the decision
    if file_salt(db) == seen:
        seen = None  # the same file: prepare notes it (after a put-back it finishes)
    prepared = prepare(paths, wanted, env, ask, seen=seen)
    if prepared.key is not None and not private:
        keep_memory_private()
    return prepared
