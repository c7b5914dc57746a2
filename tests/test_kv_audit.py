"""An audit of the saved KV states: a chat's state holds only that chat's tokens, the limit
holds from the start, a file removed by another process meanwhile is no failure, and a
state is only for the weights it was made with."""

from __future__ import annotations

import json
import logging
import pathlib
import shutil

import pytest

from iris_desktop.core.events import CacheStatus, TurnDone, TurnFailed
from iris_desktop.host import Host
from iris_desktop.runtime.kv_store import KVStateStore
from iris_desktop.runtime.protocol import Capabilities, KVState
from iris_desktop.stop import StopEvent

from support.fakes import ScriptedRuntime

SECRET = "My bank PIN is 8642 and my password is zebra-tulip."
OVERRIDES = {"context.recall_semantic": "false"}


class LiveCache(ScriptedRuntime):
    """A local model's KV cache as far as saving it goes: a request the model reads
    replaces the cache with its prompt (its tokens: the characters of the prompt's text,
    the state: the text); one stopped before the model reads it leaves it as it was."""

    capabilities = Capabilities(kv_state=True)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cached = ""

    def _stream(self, result, messages, max_tokens, cancel, deadline, progress=None):
        if cancel is None or not cancel.is_set():
            self.cached = json.dumps(messages)
        yield from super()._stream(result, messages, max_tokens, cancel, deadline, progress)

    def kv_state(self) -> KVState | None:
        return KVState([ord(c) for c in self.cached], self.cached.encode()) if self.cached else None

    def restore_kv_state(self, state: KVState) -> bool:
        self.cached = state.data.decode()
        return True


def holding(folder: pathlib.Path, words: str) -> list[str]:
    """The state files in ``folder`` whose bytes hold ``words``."""
    return [p.name for p in folder.glob("*.kv") if words.encode() in p.read_bytes()]


def turn(host: Host, thread: int | None, text: str, cancel=None) -> list:
    events = list(host.send(thread, text, cancel))
    assert isinstance(events[-1], TurnDone) and not [e for e in events if isinstance(e, TurnFailed)]
    return events


@pytest.mark.parametrize("mode", ["entered", "stopped", "deleted-while-open"])
def test_a_chat_with_nothing_evaluated_saves_no_copy_of_the_chat_before(tmp_path, mode):
    """Before (an audit): in chat A the user gave a PIN, opened a new chat B and left it
    again with nothing evaluated for it (just looked at it, or pressed Stop before the
    model read the prompt): leaving B saved the model's cache, still A's conversation,
    as B's state. Returning to B said "Restored N tokens of this chat", and once A was
    deleted B's file still held A's words. Now a chat entered with nothing restored saves
    a state only once a request of its own has replaced what the cache held."""
    runtime = LiveCache(["OK."] * 6)
    with Host(tmp_path / "data", OVERRIDES, runtime=runtime, compact=False) as host:
        host.load_model()
        kv = host.paths.kv_cache_dir
        a = turn(host, None, SECRET)[0].thread_id
        if mode == "deleted-while-open":
            host.delete_thread(a)  # the open chat: its tokens stay in the model's cache
            b = host.create_thread("B")
            host.open_thread(b)
            host.leave_thread()
            assert holding(kv, "8642") == []
            return
        b = host.create_thread("B")
        if mode == "entered":
            host.open_thread(b)
        else:
            stop = StopEvent()
            stop.set()
            list(host.send(b, "What is the capital of France?", stop))
        host.open_thread(a)  # leaving B
        assert list(kv.glob(f"{b}-*.kv")) == []
        assert host.open_thread(b) == 0  # nothing of B's is said to be restored
        host.open_thread(a)
        host.delete_thread(a)
        host.leave_thread()
        assert holding(kv, "8642") == []
        # a turn of B's own is saved as ever
        turn(host, b, "Name a colour.")
        host.leave_thread()
        assert [p.name.split("-")[0] for p in kv.glob("*.kv")] == [str(b)]


def test_a_real_chat_left_without_a_turn_keeps_none_of_the_deleted_chats_words(tmp_path, model_path):
    """The same with the bundled model (its cache listed by ``kv_tokens``): chat B,
    entered and left without a turn, got chat A's tokens as its state, and they outlived
    A's deletion."""
    overrides = {"model.path": str(model_path), "model.n_ctx": "2048", "model.max_tokens": "4",
                 "model.temperature": "0", "context.summarizer": "extractive"}
    with Host(tmp_path / "data", overrides) as host:
        host.load_model()
        kv = host.paths.kv_cache_dir
        a = turn(host, None, SECRET)[0].thread_id
        b = host.create_thread("B")
        host.open_thread(b)
        host.open_thread(a)  # leaving B: nothing of B's to save
        assert list(kv.glob(f"{b}-*.kv")) == []
        host.delete_thread(a)
        host.leave_thread()
        assert list(kv.glob("*.kv")) == []


def test_a_limit_lowered_while_iris_was_closed_holds_at_the_next_start(tmp_path):
    """Before: ``model.kv_cache_mb = 0`` (or a lower limit) written while Iris was closed
    was never applied: the saved states, copies of the conversations, stayed on disk for
    good. Now a store applies its limit when it is made: 0 removes every state; deleting
    a chat still removes its own states only."""
    data = tmp_path / "data"
    with Host(data, OVERRIDES, runtime=LiveCache(["OK."] * 4), compact=False) as host:
        host.load_model()
        first = turn(host, None, SECRET)[0].thread_id
        second = turn(host, None, "Name a colour.")[0].thread_id
        third = turn(host, None, "Name a fruit.")[0].thread_id
        host.delete_thread(third)  # no store with a limit of 0 is made for it
        kv = host.paths.kv_cache_dir
        assert sorted(p.name.split("-")[0] for p in kv.glob("*.kv")) == sorted([str(first), str(second)])
    sizes = sorted(p.stat().st_size for p in kv.glob("*.kv"))
    KVStateStore(kv, sizes[-1])  # room for one: the least recently used goes
    assert [p.name.split("-")[0] for p in kv.glob("*.kv")] == [str(second)]
    with Host(data, {**OVERRIDES, "model.kv_cache_mb": "0"}, runtime=LiveCache([]), compact=False) as host:
        host.load_model()
        assert list(kv.glob("*.kv")) == []


def _two_saved(tmp_path, runtime):
    host = Host(tmp_path / "data", OVERRIDES, runtime=runtime, compact=False)
    host.load_model()
    a = turn(host, None, "Hi from A")[0].thread_id
    turn(host, None, "Hi from B")  # leaving A saves its state
    return host, a


def test_a_state_removed_by_another_process_while_it_is_restored_does_not_fail_the_turn(
        tmp_path, caplog):
    """Before: another process evicting the state while it was restored failed the turn
    ("The turn failed: No such file or directory", from marking it recently used). Now
    what was read stands; a file gone before it is read starts the chat cold, quietly."""
    runtime = LiveCache(["OK."] * 6)
    host, a = _two_saved(tmp_path, runtime)
    try:
        path = host.cache.store.path_for(runtime, a)
        assert path.exists()
        real = runtime.restore_kv_state

        def restore_while_evicted(state):
            path.unlink()  # the other process's eviction
            return real(state)

        runtime.restore_kv_state = restore_while_evicted
        events = turn(host, a, "Hi again")
        assert [e.done for e in events if isinstance(e, CacheStatus) and e.state == "restored"]
        runtime.restore_kv_state = real
        # gone between the check and the read: a cold start and no warning
        b = host.cache.thread_id
        host.leave_thread()
        gone = host.cache.store.path_for(runtime, b)
        real_stat = pathlib.Path.stat

        def stat(self, *args, **kwargs):
            if self == gone:
                gone.unlink(missing_ok=True)
            return real_stat(self, *args, **kwargs)

        with caplog.at_level(logging.INFO, "iris.runtime.kv"):
            pathlib.Path.stat = stat
            try:
                assert host.open_thread(b) == 0
            finally:
                pathlib.Path.stat = real_stat
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    finally:
        host.close()


def test_a_file_removed_elsewhere_between_listing_and_reading_is_skipped(tmp_path, monkeypatch, caplog):
    """Before: a state file another process removed between the folder's listing and its
    stat raised FileNotFoundError out of the eviction: from the settings setter (a Qt
    slot) when the limit was lowered, and from a save, logged as "could not save the KV
    state" though it was saved. Now such a file is skipped."""
    runtime = LiveCache(["OK."] * 6)
    host, a = _two_saved(tmp_path, runtime)
    try:
        folder = host.paths.kv_cache_dir
        real_glob = pathlib.Path.glob

        def glob(self, pattern):
            found = list(real_glob(self, pattern))
            if self == folder and pattern == "*.kv":
                for path in found:
                    path.unlink(missing_ok=True)  # the other process's eviction
            return iter(found)

        monkeypatch.setattr(pathlib.Path, "glob", glob)
        values = {**host.settings.values, "model.kv_cache_mb": 1}
        from dataclasses import replace
        host.settings = replace(host.settings, values=values)  # what the window does on OK
        with caplog.at_level(logging.INFO, "iris.runtime.kv"):
            saved = host.cache.store.save(runtime, a, host._thread_owner(a))
        assert saved is not None
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    finally:
        host.close()


def test_a_state_longer_than_the_context_is_set_aside_for_that_cause(tmp_path, caplog):
    """Before: a state of more tokens than ``model.n_ctx`` now holds (lowered since it was
    saved) was handed to the model, and when refused the log blamed llama.cpp. Now it is
    set aside before, the log naming the context."""
    store = KVStateStore(tmp_path / "kv", 2**20)
    wide = LiveCache([], n_ctx=8192)
    wide.cached = "x" * 600
    assert store.save(wide, 1) is not None
    narrow = LiveCache([], n_ctx=512)
    with caplog.at_level(logging.INFO, "iris.runtime.kv"):
        assert store.restore(narrow, 1).tokens == 0
    assert not narrow.cached and not list((tmp_path / "kv").glob("*.kv"))
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "model.n_ctx" in text and "llama.cpp" not in text


def test_the_limit_counts_the_whole_file_not_only_the_state(tmp_path):
    """Before: only the state's bytes were compared with the limit, so a file with its
    header and tokens beyond it was written and kept. Now the whole file must fit."""
    runtime = LiveCache([])
    runtime.cached = "y" * 1000
    limit = len(runtime.cached) + 100  # the state fits, its 4-byte tokens do not
    store = KVStateStore(tmp_path / "kv", limit)
    assert store.save(runtime, 1) is None
    assert list((tmp_path / "kv").glob("*.kv")) == []


def test_a_state_of_other_weights_with_the_same_header_and_size_is_not_restored(
        tmp_path, base_model_path):
    """Before: the key of a saved state was the GGUF header's hash and the file size, so
    a model file replaced by other weights with the same header and size (a new upload of
    the same recipe) restored the old weights' state. Now the key also names the file as
    loaded (modification time, inode): an unchanged file keeps its states across loads,
    a rewritten one does not."""
    from iris_desktop.runtime.model import LocalModel

    path = tmp_path / "model.gguf"
    shutil.copyfile(base_model_path, path)
    store = KVStateStore(tmp_path / "kv", 2**30)
    with LocalModel.load(path, n_ctx=512) as model:
        model.prefill([{"role": "user", "content": "Tell me about the sea."}]).run()
        assert store.save(model, 1) is not None
    with LocalModel.load(path, n_ctx=512) as model:  # unchanged: restored
        assert store.restore(model, 1).tokens > 0
        store.save(model, 1)
    size = path.stat().st_size
    with open(path, "r+b") as fh:  # other weights, the same header and size
        fh.seek(size - 4096)
        block = fh.read(64)
        fh.seek(size - 4096)
        fh.write(bytes(b ^ 0x11 for b in block))
    assert path.stat().st_size == size
    with LocalModel.load(path, n_ctx=512) as model:
        assert store.restore(model, 1).tokens == 0
