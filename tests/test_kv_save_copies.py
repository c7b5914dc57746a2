"""A KV state is written without being copied whole again: the save wrote
``MAGIC + header + tokens + state`` (one more copy of a state of tens of MB) and, when
sealed, joined the sealed chunks (another). Each such copy holds Python's lock, and the
window's thread waits meanwhile: the first pause of a chat switch, while the chat left is
saved (docs/benchmarks.md, "Switching threads"). Counted in bytes Python allocates
(tracemalloc), never timed; the file read back is the same."""

from __future__ import annotations

import os
import tracemalloc
from types import SimpleNamespace

import pytest

from iris_desktop.runtime.kv_store import KVStateStore, _read, can_seal, model_key
from iris_desktop.runtime.protocol import KVState

STATE = 16 << 20  # bytes


class Model:
    """What a save reads of a runtime: its identity, its size and its KV state."""

    identity = "a" * 64

    def __init__(self, data: bytes):
        self.state = KVState(list(range(300)), data)

    def describe(self):
        return SimpleNamespace(size_bytes=123)

    def kv_state(self) -> KVState:
        return self.state


def peak_of_save(store: KVStateStore, model: Model):
    tracemalloc.start()
    try:
        path = store.save(model, 1)
        return path, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("sealed", [False, pytest.param(True, marks=pytest.mark.skipif(
    not can_seal(), reason="no cryptography package: states are not sealed"))])
def test_a_save_copies_the_state_at_most_once(tmp_path, sealed):
    data = os.urandom(STATE)
    model = Model(data)
    store = KVStateStore(tmp_path / "kv", 1 << 30, secret=b"k" * 32 if sealed else None)
    path, peak = peak_of_save(store, model)
    # plain: no copy at all (was one); sealed: the one copy sealing needs, and its
    # sealed text (was two more: the concatenation and the chunks joined)
    assert peak < (0.25 if not sealed else 2.25) * STATE, peak / STATE
    tokens, state = _read(path, model_key(model), store.secret)
    assert tokens == model.state.tokens and state == data
