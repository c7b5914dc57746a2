"""Saved KV states that are damaged: a header of the wrong shape is set aside, and a save
killed mid-write leaves nothing behind. The real bundled model, real files, real processes."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from iris_desktop.runtime.kv_store import MAGIC, KVStateStore, model_key

ROOT = Path(__file__).resolve().parent.parent
POSIX = os.name == "posix"


# --- a KV file of the wrong shape, a save killed mid-write ------------------------------


@pytest.fixture(scope="module")
def kv_model(model_path):
    from iris_desktop.runtime.model import LocalModel

    model = LocalModel.load(model_path, n_ctx=2048)
    model.prefill([{"role": "system", "content": "You are Iris."},
                   {"role": "user", "content": "Tell me about the sea."}]).run()
    yield model
    model.close()


def _with_header(path: Path, header: bytes) -> None:
    data = path.read_bytes()
    (length,) = struct.unpack_from("<I", data, len(MAGIC))
    rest = data[len(MAGIC) + 4 + length:]
    path.write_bytes(MAGIC + struct.pack("<I", len(header)) + header + rest)


@pytest.mark.parametrize("header", [
    b"[]", b"1", b'"text"', b"null", b"{}", b"[" * 2000 + b"]" * 2000,
    b'{"version": 1, "model": "M", "n_tokens": "7", "tokens_sha256": "", '
    b'"state_bytes": 1, "state_sha256": ""}',
    b'{"version": 1, "model": "M", "n_tokens": -3, "tokens_sha256": "", '
    b'"state_bytes": 1, "state_sha256": ""}',
    b'{"version": 1, "model": ["M"], "n_tokens": 1, "tokens_sha256": "", '
    b'"state_bytes": 1, "state_sha256": ""}',
    b"\xff\xfe not text",
])
def test_a_kv_file_whose_header_has_the_wrong_shape_is_set_aside(kv_model, tmp_path, header):
    """Valid JSON that is not the header's object (``[]``) broke every chat on the thread:
    now any header problem is handled like a corrupt file, and the chat starts cold."""
    store = KVStateStore(tmp_path / "kv", 64 << 20)
    path = store.save(kv_model, 5)
    header = header.replace(b'"M"', json.dumps(model_key(kv_model)).encode())
    _with_header(path, header)
    before = kv_model.kv_tokens()
    assert store.restore(kv_model, 5).tokens == 0
    assert not path.exists() and kv_model.kv_tokens() == before
    assert store.save(kv_model, 5) is not None and store.restore(kv_model, 5).tokens > 0


_WRITER = """
    import os, sys, time
    from pathlib import Path
    from iris_desktop import files
    tmp, fd = files._open_locked(Path(sys.argv[1]), 0o600)  # as a save opens it
    os.write(fd, b"x" * int(sys.argv[2]))
    print(tmp, flush=True)
    time.sleep(600)
"""


@pytest.mark.skipif(not POSIX, reason="flock")
def test_a_kv_save_killed_mid_write_leaves_nothing_behind(kv_model, tmp_path):
    """A save killed mid-write left a hidden .tmp file that was never removed nor counted
    (13.1 MB against an 8 MB limit after five kills). Its writer holds a lock while it
    writes: while it lives, its file counts against the limit; once it is killed, the
    next store to open deletes it."""
    folder = tmp_path / "kv"
    probe = KVStateStore(tmp_path / "probe", 1 << 30).save(kv_model, 0).stat().st_size
    store = KVStateStore(folder, int(probe * 2.5))  # room for two states
    store.save(kv_model, 1)
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_WRITER), str(folder / "2-x.kv"),
                               str(probe)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        tmp = Path(writer.stdout.readline().strip())
        assert tmp.parent == folder and tmp.name.startswith(".2-x.kv.")
        # alive: not deleted, and counted: a second saved state no longer fits beside it
        assert KVStateStore(folder, int(probe * 2.5)).clean_leftovers() == probe
        assert tmp.exists()
        store.save(kv_model, 3)
        assert [p.name.split("-")[0] for p in folder.glob("*.kv")] == ["3"]
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    assert tmp.exists()  # what a kill -9 leaves
    stale = folder / ".4-y.kv.999999.tmp"  # from a crash before locks were taken
    stale.write_bytes(b"y" * 1000)
    reopened = KVStateStore(folder, int(probe * 2.5))  # a start cleans up
    assert not tmp.exists() and not stale.exists()
    assert reopened.save(kv_model, 1) is not None
    assert sorted(p.name.split("-")[0] for p in folder.glob("*.kv")) == ["1", "3"]
    assert not list(folder.glob(".*.tmp")) and not list(folder.glob(".*.iris-tmp"))
