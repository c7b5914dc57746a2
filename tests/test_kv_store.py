"""Each thread keeps its KV state on disk: restored, the next request evaluates only what
is new; a corrupt, truncated or foreign file is deleted, never loaded; disk use is
bounded; a prefill warms the cache and gives way to a cancel."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from iris_desktop.generation import GenerationRequest
from iris_desktop.runtime.kv_store import KVStateStore
from iris_desktop.runtime.model import PREFILL_CHUNK_TOKENS, LocalModel

SYSTEM = {"role": "system", "content": "You are Iris, a helpful assistant."}


def conversation(turns: int) -> list[dict]:
    out = [SYSTEM]
    for i in range(turns):
        out += [{"role": "user", "content": f"Tell me fact number {i} about the ocean."},
                {"role": "assistant", "content": f"Fact {i}: the ocean covers most of Earth."}]
    return out


@pytest.fixture(scope="module")
def model(model_path):
    m = LocalModel.load(model_path, n_ctx=4096)
    yield m
    m.close()


def test_a_restored_thread_evaluates_only_what_is_new(model, tmp_path):
    store = KVStateStore(tmp_path / "kv", 256 * 2**20)
    history = conversation(12)
    stats = model.prefill(history).run()
    assert stats.evaluated_tokens > 300 and not stats.stopped
    path = store.save(model, 7)
    assert path is not None and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    model.llm.reset()  # another thread's prompt took the cache
    restored = store.restore(model, 7)
    assert restored.tokens == stats.prompt_tokens
    nxt = [*history, {"role": "user", "content": "And one more?"}]
    generation = model.stream(GenerationRequest(nxt, max_tokens=1, temperature=0))
    generation.text()
    new = generation.stats
    assert new.reused_tokens >= stats.prompt_tokens - 4  # only the new message is evaluated
    assert new.evaluated_tokens < 40


def test_corrupt_truncated_and_foreign_states_are_deleted_not_loaded(model, tmp_path):
    store = KVStateStore(tmp_path / "kv", 256 * 2**20)
    model.prefill(conversation(3)).run()
    for damage in ("flip", "truncate", "foreign"):
        path = store.save(model, 1)
        data = bytearray(path.read_bytes())
        if damage == "flip":
            data[-100] ^= 0xFF
        elif damage == "truncate":
            data = data[: len(data) // 2]
        else:
            data = data.replace(b'"model": "', b'"model": "x', 1)
        path.write_bytes(bytes(data))
        before = model.kv_tokens()
        assert store.restore(model, 1).tokens == 0
        assert not path.exists() and model.kv_tokens() == before  # the cache is untouched


def test_disk_use_is_bounded_least_recently_used_first(model, tmp_path):
    model.prefill(conversation(6)).run()
    one = KVStateStore(tmp_path / "probe", 2**30).save(model, 0).stat().st_size
    store = KVStateStore(tmp_path / "kv", int(one * 2.5))  # room for two
    for thread in (1, 2):
        store.save(model, thread)
    store.restore(model, 1)  # thread 1 was used since: thread 2 is now the oldest
    store.save(model, 3)
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "kv").glob("*.kv")) == ["1", "3"]
    assert sum(p.stat().st_size for p in (tmp_path / "kv").glob("*.kv")) <= one * 2.5
    off = KVStateStore(tmp_path / "off", 0)
    assert off.save(model, 1) is None and off.restore(model, 1).tokens == 0


def test_a_prefill_gives_way_to_a_cancel_and_keeps_what_it_did(model):
    model.llm.reset()
    long = conversation(60)
    cancel = threading.Event()
    work = model.prefill(long, cancel=cancel)
    seen = []
    for done, total in work:  # progress after each batch
        seen.append((done, total))
        cancel.set()  # the draft changed (or a send came) after the first batch
    stats = work.stats
    assert seen and seen[0][1] == stats.prompt_tokens and seen[0][0] < stats.prompt_tokens
    assert stats.stopped and 0 < stats.evaluated_tokens < stats.prompt_tokens
    # a prefill goes in small pieces (a stop drops only the piece under way): the first
    # piece is kept whole, not a full 512-token batch
    assert stats.evaluated_tokens == PREFILL_CHUNK_TOKENS < model.llm.n_batch
    assert len(model.kv_tokens()) == stats.evaluated_tokens
    again = model.prefill(long).run()  # continues from there
    assert again.reused_tokens >= stats.evaluated_tokens - 1 and not again.stopped

    # closing a prefill early stops it the same way
    model.llm.reset()
    work = model.prefill(long)
    next(work)
    work.close()
    assert work.stats.stopped and work.stats.evaluated_tokens < work.stats.prompt_tokens


def test_a_state_is_renamed_into_place_only_once_closed_where_files_lock_on_open(tmp_path, monkeypatch):
    """Windows (no fcntl) cannot rename a file that is still open (WinError 32): there the
    temporary file is closed before it replaces the state."""
    from iris_desktop import files
    from iris_desktop.runtime import kv_store

    handles = []
    real_fdopen, real_replace = os.fdopen, os.replace

    def fdopen(fd, *args, **kwargs):
        handles.append(real_fdopen(fd, *args, **kwargs))
        return handles[-1]

    def replace(src, dst):
        if any(not h.closed for h in handles):
            raise PermissionError(32, "The process cannot access the file because it is being used")
        real_replace(src, dst)

    monkeypatch.setattr(files, "fcntl", None)
    monkeypatch.setattr(os, "fdopen", fdopen)
    monkeypatch.setattr(os, "replace", replace)
    target = tmp_path / "kv" / "state.bin"
    kv_store._write_private(target, b"state")
    assert target.read_bytes() == b"state" and handles and handles[0].closed
    assert not list(target.parent.glob(".*.tmp")) and not list(target.parent.glob(".*.iris-tmp"))


def test_a_huge_file_in_place_of_a_state_is_refused_without_being_read(model, tmp_path):
    """Before: a 3 GB file where a thread's state belongs was read whole. A file larger
    than the cache may hold was never written by Iris: refused by its size, deleted."""
    import tracemalloc

    store = KVStateStore(tmp_path / "kv", 64 << 20)
    path = store.path_for(model, 7)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:  # sparse: 3 GB on paper, nothing on disk
        handle.truncate(3 << 30)
    tracemalloc.start()
    try:
        assert store.restore(model, 7).tokens == 0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20 and not path.exists()


def test_a_lower_limit_in_preferences_holds_at_once_and_zero_keeps_none(model, tmp_path):
    """Before (an audit): "Disk space for resuming chats" set to 0 in Preferences wrote
    the chat's KV state (the conversation, as the model holds it) at the next quit all
    the same: the limit was read only when a model loaded. Now new settings in force
    set it at once, and 0 deletes the states already kept."""
    from dataclasses import replace as replaced

    from iris_desktop.host import Host

    with Host(tmp_path / "data", {}, runtime=model) as host:
        host.load_model()
        model.prefill(conversation(4)).run()
        assert host.cache.store.save(model, 1) is not None
        kept = list(host.paths.kv_cache_dir.glob("*.kv"))
        assert len(kept) == 1
        values = {**host.settings.values, "model.kv_cache_mb": 0}
        host.settings = replaced(host.settings, values=values)  # what the window does on OK
        assert list(host.paths.kv_cache_dir.glob("*.kv")) == []
        assert host.cache.store.save(model, 1) is None
