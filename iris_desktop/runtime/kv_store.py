"""Each thread keeps its KV state: the evaluated prompt prefix of a thread, saved to disk
when the user leaves it (or quits) and restored on return, so a long thread never has
to be evaluated cold again, across restarts and in a new ``iris-desktop chat`` process.

One file per thread and model (``<thread>-<model id>.kv``, 0600) in a private folder:

    MAGIC | header length (u32) | header (JSON) | tokens (int32 × n) | llama.cpp state

The header names the model (its identity: a hash of the GGUF header, the file size,
and the weights file as loaded: its modification time and inode), the number of tokens,
and the sha256 of the tokens and of the state. A file is restored only when all of them
match: a corrupt, truncated or foreign file is deleted, never handed to llama.cpp (a bad
state blob could crash it). The state is what the runtime's ``kv_state()`` gives (for
llama.cpp its per-sequence copy of the KV cache: the keys and values only, no logits),
and only a runtime whose ``capabilities.kv_state`` says so has one. Disk use is bounded
by ``model.kv_cache_mb`` (whole files, from the moment a store is made): the least
recently used files go first. A chat saves a state only once a request of its own has
filled the cache (:class:`ThreadCache`): what another chat left there is never saved
under its name.

A file is written by Iris's one atomic writer (:mod:`iris_desktop.files`): a hidden
temporary file beside it, locked while it is written, fsynced, renamed into place. A save
killed mid-write leaves a file nobody holds: such leftovers are deleted when a store opens
and before each save's eviction, and one still being written counts against the limit.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from iris_desktop.files import atomic_output, clean_leftovers

from .protocol import KVState, Runtime

log = logging.getLogger("iris.runtime.kv")

MAGIC = b"IRIS-KV1"
#: a header larger than this is not ours
MAX_HEADER_BYTES = 4096
#: what a file holds beyond its state: magic, header, tokens (4 bytes each, at most a
#: window's worth) and the sealing's framing; a file larger than the cache's limit plus
#: this was never written by Iris, and is refused before it is read
MAX_FILE_OVERHEAD = 64 << 20


@dataclass
class Restored:
    tokens: int  # how many prompt tokens are now in the KV cache
    path: Path | None = None


def model_key(model: Runtime) -> str:
    """Who may read a saved state: the same GGUF (its header hash and size) and the same
    weights file (its ``weights_stamp``: a file replaced by other weights with the same
    header and size, as a re-quantization of the same recipe is, has another)."""
    key = f"{model.identity[:24]}-{model.describe().size_bytes}"
    stamp = getattr(model, "weights_stamp", "")
    return f"{key}-{stamp}" if stamp else key


class KVStateStore:
    """Saved KV states under ``folder``, at most ``limit_bytes`` in all (LRU)."""

    def __init__(self, folder: Path, limit_bytes: int, secret: bytes | None = None):
        self.folder = Path(folder)
        self.limit_bytes = max(0, int(limit_bytes))
        #: the files' 256-bit AES-GCM key while the history is encrypted (None: plain)
        self.secret = secret
        # a limit lowered (or set to 0) while Iris was closed holds from the start
        self._evict(keep=None)

    def clean_leftovers(self) -> int:
        """Delete the temporary files of saves that were killed mid-write; returns the bytes
        of those still being written (by this or another live process)."""
        found = clean_leftovers(self.folder, ".*.tmp")  # .*.tmp: an older Iris's name
        for path in found.removed:
            log.info("deleted %s, left by a KV save that did not finish", path.name)
        return found.held_bytes

    @property
    def enabled(self) -> bool:
        return self.limit_bytes > 0

    def set_limit(self, limit_bytes: int) -> None:
        """A new limit, in force at once: the least recently used files beyond it go now
        (0: every saved state, the user asking that none be kept)."""
        self.limit_bytes = max(0, int(limit_bytes))
        self._evict(keep=None)

    def path_for(self, model: Runtime, thread_id: int) -> Path:
        return self.folder / f"{int(thread_id)}-{model_key(model)}.kv"

    # -- saving --

    def save(self, model: Runtime, thread_id: int, owner: str = "",
             inherited: list[int] | None = None) -> Path | None:
        """Write the model's current KV prefix as ``thread_id``'s state (replacing the old
        one atomically), then evict the least recently used files beyond the limit. None
        when off, or when there is nothing to save or it does not fit the limit.
        ``owner`` names the chat it belongs to (the host's thread identity: a new chat
        that gets a deleted one's id has another), and only a restore for the same owner
        takes it. ``inherited``: what the cache held from another chat when this one was
        entered with nothing restored; a cache that still holds only (a start of) those
        tokens has nothing of this chat's and is not saved under its name."""
        if not self.enabled:
            return None
        state = model.kv_state()
        if state is None or not state.tokens:
            return None
        if inherited is not None and state.tokens == inherited[:len(state.tokens)]:
            log.info("thread %s: the KV cache holds only another chat's tokens; not saved", thread_id)
            return None
        tokens, blob = state.tokens, state.data
        if len(blob) > self.limit_bytes:
            return None
        header = json.dumps({
            "version": 1, "model": model_key(model), "owner": owner, "n_tokens": len(tokens),
            "tokens_sha256": hashlib.sha256(_pack(tokens)).hexdigest(),
            "state_bytes": len(blob), "state_sha256": hashlib.sha256(blob).hexdigest(),
        }).encode()
        path = self.path_for(model, thread_id)
        # written in parts: each copy of a state (tens of MB) holds Python's lock, and the
        # window's thread waits meanwhile (a chat switch's first pause)
        parts = _sealed_parts(MAGIC + struct.pack("<I", len(header)) + header + _pack(tokens),
                              blob, self.secret)
        if sum(len(part) for part in parts) > self.limit_bytes:  # the whole file counts
            return None
        _write_private(path, parts)
        self._evict(keep=path)
        log.info("saved the KV state of thread %s: %d tokens, %.1f MB", thread_id, len(tokens),
                 len(blob) / 1e6)
        return path

    def _evict(self, keep: Path | None) -> None:
        """Delete the least recently used files beyond the limit (never ``keep``). A file
        another process removes meanwhile (its own eviction, a deleted chat) is skipped."""
        total = self.clean_leftovers()  # a save still being written elsewhere takes room too
        found = []
        for path in self.folder.glob("*.kv"):
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            found.append((st.st_mtime, st.st_size, path))
        for _, size, path in sorted(found, key=lambda f: f[0], reverse=True):
            if path != keep and total + size > self.limit_bytes:
                path.unlink(missing_ok=True)
                log.info("evicted %s (the KV cache is limited to %d MB)", path.name,
                         self.limit_bytes // 2**20)
                continue
            total += size

    # -- restoring --

    def restore(self, model: Runtime, thread_id: int, owner: str = "") -> Restored:
        """Load ``thread_id``'s saved state into the model's KV cache if it is sound, made
        by this model and saved for ``owner`` (see :meth:`save`); any other file there is
        deleted. Returns how many tokens the cache then holds from it (0: nothing
        restored, the cache is as it was)."""
        path = self.path_for(model, thread_id)
        if not self.enabled or not path.is_file():
            return Restored(0)
        try:
            size = path.stat().st_size
            if size > self.limit_bytes + MAX_FILE_OVERHEAD:  # never one of ours: not read
                raise ValueError(f"{size:,} bytes, more than the KV cache may hold")
            tokens, blob = _read(path, model_key(model), self.secret, owner)
            n_ctx = model.describe().n_ctx
            if n_ctx and len(tokens) >= n_ctx:
                raise ValueError(f"{len(tokens)} tokens, and the model's context (model.n_ctx) "
                                 f"holds {n_ctx}")
        except FileNotFoundError:  # removed meanwhile by another process: start cold
            log.info("%s was removed while it was being restored; the chat starts cold", path.name)
            return Restored(0)
        except (OSError, ValueError) as exc:
            log.warning("%s: not a usable KV state (%s); deleted", path.name, exc)
            path.unlink(missing_ok=True)
            return Restored(0)
        if not model.restore_kv_state(KVState(tokens, blob)):
            log.warning("%s: llama.cpp refused the KV state; deleted", path.name)
            path.unlink(missing_ok=True)
            return Restored(0)
        try:
            os.utime(path)  # most recently used
        except FileNotFoundError:  # evicted by another process meanwhile: what was read stands
            log.info("%s was removed while it was being restored", path.name)
        return Restored(len(tokens), path)

    def forget(self, thread_id: int) -> None:
        """Delete every saved state of a thread (it was deleted)."""
        self.forget_in(self.folder, thread_id)

    @staticmethod
    def forget_in(folder: Path, thread_id: int) -> None:
        """Delete every saved state of a thread in ``folder``, with no store made (making
        one applies a limit)."""
        for path in Path(folder).glob(f"{int(thread_id)}-*.kv"):
            path.unlink(missing_ok=True)


def _pack(tokens: list[int]) -> bytes:
    return struct.pack(f"<{len(tokens)}i", *tokens)


def _read(path: Path, key: str, secret: bytes | None = None, owner: str = ""
          ) -> tuple[list[int], bytes]:
    """(tokens, state) of a file that passes every check; raises ValueError."""
    data = _unseal(path.read_bytes(), secret)
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 4:
        raise ValueError("not a KV state file")
    (length,) = struct.unpack_from("<I", data, len(MAGIC))
    if length > MAX_HEADER_BYTES:
        raise ValueError("header too large")
    start = len(MAGIC) + 4
    try:
        header = json.loads(data[start:start + length])
    except RecursionError:
        raise ValueError("header nested too deeply") from None
    _check_header(header)
    if header["model"] != key:
        raise ValueError("saved by another model")
    if header.get("owner", "") != owner:
        raise ValueError("saved for another chat")
    n = header["n_tokens"]
    token_bytes = data[start + length:start + length + 4 * n]
    blob = data[start + length + 4 * n:]
    if len(token_bytes) != 4 * n or len(blob) != header["state_bytes"]:
        raise ValueError("truncated")
    if hashlib.sha256(token_bytes).hexdigest() != header["tokens_sha256"] or \
            hashlib.sha256(blob).hexdigest() != header["state_sha256"]:
        raise ValueError("checksum mismatch")
    return list(struct.unpack(f"<{n}i", token_bytes)), blob


#: each header field and the type it must have
_HEADER_FIELDS = {"version": int, "model": str, "n_tokens": int, "tokens_sha256": str,
                  "state_bytes": int, "state_sha256": str}


def _check_header(header: object) -> None:
    """ValueError unless ``header`` is a JSON object with every field, of its type (counts
    not negative): a file with any other header is set aside like a corrupt one."""
    if not isinstance(header, dict):
        raise ValueError(f"header is a JSON {type(header).__name__}, not an object")
    for name, kind in _HEADER_FIELDS.items():
        value = header.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(f"header field {name!r} is missing or not a {kind.__name__}")
        if kind is int and value < 0:
            raise ValueError(f"header field {name!r} is negative")
    if header["version"] != 1:
        raise ValueError(f"header version {header['version']} is not 1")


def _write_private(path: Path, parts: bytes | list[bytes | memoryview]) -> None:
    from iris_desktop.paths import make_private_dir

    make_private_dir(path.parent)
    parts = [parts] if isinstance(parts, bytes) else parts
    with atomic_output(path) as handle:
        for part in parts:
            handle.write(part)


class ThreadCache:
    """Which thread's prompt prefix is in the model's KV cache: entering another thread
    saves the current one's state and restores the new one's, so each keeps its own.
    Used by the thread that owns the model (the GUI's model thread, the CLI)."""

    def __init__(self, store: KVStateStore, model: Runtime,
                 owner_of: Callable[[int], str | None] | None = None):
        self.store = store
        self.model = model
        #: the chat a thread id names now (None: deleted); without it, the id alone
        self.owner_of = owner_of or str
        self.thread_id: int | None = None
        #: the tokens the cache held from another chat when ``thread_id`` was entered with
        #: nothing restored (None: its own state was restored): until a request of this
        #: chat's replaces them, they are not its to save
        self.inherited: list[int] | None = None

    @property
    def usable(self) -> bool:
        """Only a runtime that can save its KV cache has one to keep (a local model)."""
        return self.store.enabled and self.model.capabilities.kv_state

    def enter(self, thread_id: int | None) -> int:
        """Make ``thread_id`` the cached thread; returns the tokens restored (0 if none)."""
        if thread_id == self.thread_id or not self.usable:
            self.thread_id = thread_id
            return 0
        self.leave()
        self.thread_id = thread_id
        if thread_id is None:
            return 0
        owner = self.owner_of(thread_id)
        restored = self.store.restore(self.model, thread_id, owner).tokens if owner is not None else 0
        if not restored:  # the cache still holds the chat before (or a deleted one)
            self.inherited = self._cached_tokens()
        return restored

    def leave(self) -> None:
        """Save the cached thread's state (the app quits, or another thread comes)."""
        if self.thread_id is not None and self.usable:
            self._save(self.thread_id)
        self.thread_id = None
        self.inherited = None

    def _cached_tokens(self) -> list[int]:
        """The tokens in the model's KV cache now (a local model lists them without copying
        the state)."""
        listed = getattr(self.model, "kv_tokens", None)
        if callable(listed):
            return list(listed())
        state = self.model.kv_state()
        return list(state.tokens) if state is not None else []

    def _save(self, thread_id: int) -> None:
        """Save the state of a chat that still exists: one deleted meanwhile (by another
        process, too) gets no file, and one deleted while it was written loses it again,
        so no state of a deleted chat stays on disk for a new chat with its id."""
        owner = self.owner_of(thread_id)
        try:
            if owner is not None:
                self.store.save(self.model, thread_id, owner, self.inherited)
        except OSError as exc:  # a full disk must not stop the app: the cache is optional
            log.warning("could not save the KV state of thread %s: %s", thread_id, exc)
        if owner is None or self.owner_of(thread_id) != owner:
            self.store.forget(thread_id)


# -- encryption (storage.encrypt) ----------------------------------------------------------

#: an encrypted state file: SEALED | nonce prefix (8) | chunks of u32 length + AES-GCM text
SEALED = b"IRIS-KVE"
#: plaintext bytes per AES-GCM chunk (each has its own nonce and tag)
SEAL_CHUNK = 64 * 2**20


def can_seal() -> bool:
    """Whether state files can be encrypted (the ``cryptography`` package is there)."""
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: F401
    except ImportError:
        return False
    return True


def _seal(data: bytes, secret: bytes | None) -> bytes:
    """``data`` encrypted with AES-256-GCM under ``secret`` (unchanged when None): in
    chunks, each authenticated with its index and whether it is the last, so a file cut
    short or reordered never decrypts."""
    return b"".join(_sealed_parts(data, b"", secret))


def _sealed_parts(head: bytes, blob: bytes, secret: bytes | None) -> list[bytes | memoryview]:
    """:func:`_seal` of ``head + blob``, as the parts of the file in order (not joined:
    no copy of a whole state more than sealing needs; none at all when plain)."""
    if secret is None:
        return [head, blob]
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    data = memoryview(head + blob)  # (one copy: the chunks below are views of it)
    aead, prefix = AESGCM(secret), os.urandom(8)
    parts: list[bytes | memoryview] = [SEALED, prefix]
    count = max(1, -(-len(data) // SEAL_CHUNK))
    for index in range(count):
        chunk = data[index * SEAL_CHUNK:(index + 1) * SEAL_CHUNK]
        label = struct.pack(">I?", index, index == count - 1)
        text = aead.encrypt(prefix + label[:4], chunk, SEALED + label)
        parts += [struct.pack("<I", len(text)), text]
    return parts


def _unseal(data: bytes, secret: bytes | None) -> bytes:
    """What :func:`_seal` sealed; raises ValueError for a file of the other kind (plain
    while the history is encrypted, or the reverse), a wrong key or a damaged file."""
    if secret is None:
        if data.startswith(SEALED):
            raise ValueError("encrypted, and the history is not")
        return data
    if not data.startswith(SEALED):
        raise ValueError("not encrypted, and the history is")
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    aead, prefix = AESGCM(secret), data[len(SEALED):len(SEALED) + 8]
    out, at, index = [], len(SEALED) + 8, 0
    while True:
        if at + 4 > len(data):
            raise ValueError("truncated")
        (length,) = struct.unpack_from("<I", data, at)
        text = data[at + 4:at + 4 + length]
        if len(text) != length:
            raise ValueError("truncated")
        at += 4 + length
        last = at == len(data)
        label = struct.pack(">I?", index, last)
        try:
            out.append(aead.decrypt(prefix + label[:4], text, SEALED + label))
        except InvalidTag:
            raise ValueError("cannot be decrypted with the history's key") from None
        if last:
            return b"".join(out)
        index += 1
