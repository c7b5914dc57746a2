"""A damaged GGUF header is called damaged, and a file cut short truncated: the header
reader names the cause the user can act on (download again vs. the file is corrupt)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from iris_desktop.runtime.gguf import GGUFError, read_gguf_info

from support.gguf_fixtures import tiny_metadata, write_gguf


def garbled(path: Path, at: int, data: bytes, size: int = 0) -> Path:
    """A tiny valid GGUF with ``data`` written over it at byte ``at``, then grown with
    zeros to ``size`` bytes (a full-size download whose header bytes went bad)."""
    write_gguf(path, tiny_metadata())
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data)
    if size:
        os.truncate(path, size)
    return path


def test_a_garbled_key_length_in_a_full_size_file_is_corrupt_not_truncated(tmp_path):
    """Before: "truncated: the header ends early while reading a metadata key (needs byte
    7818421948897766972, the file ends at byte 491400064)" for a complete file whose first
    key's length was random bytes: the user would download it again for nothing."""
    path = garbled(tmp_path / "kv.gguf", 24, struct.pack("<Q", 7818421948897766940), 1 << 20)
    with pytest.raises(GGUFError) as err:
        read_gguf_info(path)
    assert str(err.value) == (f"{path}: corrupt: the header is damaged (the length of a metadata "
                              f"key runs to byte 7,818,421,948,897,766,972, far past the end of "
                              f"the file at byte 1,048,576)")


def test_a_garbled_string_array_is_corrupt(tmp_path):
    metadata = {**tiny_metadata(), "tokenizer.ggml.merges": ["a b", "c d"]}
    path = write_gguf(tmp_path / "merges.gguf", metadata)
    raw = bytearray(path.read_bytes())
    first = raw.index(b"\x03\x00\x00\x00\x00\x00\x00\x00a b")  # the first merge's length
    raw[first:first + 8] = struct.pack("<Q", 1 << 50)
    path.write_bytes(bytes(raw))
    with pytest.raises(GGUFError, match=r"corrupt: the header is damaged \(the length of the array "
                                        r"'tokenizer.ggml.merges' runs to byte "):
        read_gguf_info(path)


def test_a_header_cut_short_is_still_truncated(tmp_path):
    """A plausible length that the file ends inside: the file was cut short."""
    path = write_gguf(tmp_path / "cut.gguf", tiny_metadata())
    raw = path.read_bytes()
    template_at = raw.index(b"{% for m")
    path.write_bytes(raw[:template_at + 10])
    with pytest.raises(GGUFError, match=r"truncated: the header ends early while reading the value "
                                        r"of 'tokenizer.chat_template' \(needs byte "):
        read_gguf_info(path)
