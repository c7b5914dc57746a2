"""A large export is read beside the window: its JSON an item at a time, its values kept
out of the garbage collector's walks (``core.big_json``).

Before, ``json.loads`` read a whole ChatGPT export in one call, and the collector walked
its millions of new objects again and again meanwhile: the window beside the import
stood still for seconds (a 50 MB export: a 2.8 s pause, docs/benchmarks.md). What can be
counted is counted here: the values (the same as ``json.loads``'s, the same errors), the
turns another thread gets while an export is read, and the collector's full walks."""

from __future__ import annotations

import gc
import json
import sys
import threading

import pytest

from iris_desktop.core import big_json
from iris_desktop.core.foreign import import_conversations, load_conversations
from iris_desktop.core.store import Store

from support.helpers import chatgpt_export

SAME = ['[]', ' [ ] ', '[1]', '[ 1 , "a" , {"b": [2, null]} ]\n', '{"a": [1, 2]}', '"text"',
        '12', '[NaN, Infinity, -0.0, 1e400]', '[[], {}, [[[]]]]', '\t[\r\n"é\\u00e9"\n]\t']
WRONG = ['[', '[1,]', '[1 2]', '[1] x', '[,1]', '[1,,2]', '', '   ', ']', '[1]]', '[{"a" 1}]',
         '["\x00"]', '[1]\x00']


@pytest.mark.parametrize("text", SAME)
def test_it_reads_what_json_loads_reads(text):
    assert big_json.parse(text) == json.loads(text)


@pytest.mark.parametrize("text", WRONG)
def test_it_refuses_what_json_loads_refuses(text):
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        big_json.parse(text)


def test_too_deep_for_json_loads_is_read_all_the_same():
    """Past json.loads' depth (a RecursionError before, "nested too deeply") the text is
    read by the iterative reader (session 66: LibreChat's recursive export); a top-level
    array as item by item, so deeper items too."""
    value = big_json.parse("[" + "[" * 100_000 + "]" * 100_001)
    depth = 0
    while value:
        value, depth = value[0], depth + 1
    assert depth == 100_000


def export(tmp_path, chats: int):
    """A ChatGPT-shaped export of ``chats`` short conversations (about 1 KB each)."""
    return chatgpt_export(tmp_path, chats, answer_padding=400)


def test_the_window_s_thread_gets_turns_while_an_export_is_read(tmp_path):
    """The other thread (the window's) counts its turns while the import's thread reads:
    one json.loads over the file gave it none from start to end."""
    path = export(tmp_path, 20_000)
    reading, done, turns = threading.Event(), threading.Event(), [0]

    text = path.read_text()

    def read() -> None:
        reading.set()
        try:
            with big_json.kept_apart():
                big_json.parse(text)
        finally:
            done.set()

    was = sys.getswitchinterval()
    sys.setswitchinterval(0.0001)  # turns every 0.1 ms: many, however fast the machine
    try:
        text_read = threading.Thread(target=read)
        text_read.start()
        reading.wait()
        while not done.is_set():
            turns[0] += 1
            done.wait(0.0001)
        text_read.join()
    finally:
        sys.setswitchinterval(was)
    assert turns[0] >= 100, turns  # json.loads over the file: 2 to 21 (its call's ends)


def test_the_collector_never_walks_the_export_while_it_is_read_and_stored(tmp_path):
    path = export(tmp_path, 30_000)
    walks: list[tuple[str, int]] = []  # each full walk: when, and how many objects it walked
    phase = ["read"]

    def heard(stage: str, info: dict) -> None:
        if stage == "start" and info["generation"] == 2:
            walks.append((phase[0], len(gc.get_objects(generation=2))))

    gc.collect()
    gc.callbacks.append(heard)
    try:
        loaded = load_conversations(path)
        assert gc.get_freeze_count() == 0  # nothing stays frozen after the read
        phase[0] = "store"
        with Store(tmp_path / "iris.db") as store:
            imported = import_conversations(store, loaded)
    finally:
        gc.callbacks.remove(heard)
    assert len(loaded.chats) == 30_000 and len(imported.ids) == 30_000
    assert gc.get_freeze_count() == 0
    # a walk may happen, but never over the export: 30,000 chats are over 300,000 objects
    # parsed and 60,000 messages made (before: six walks while read, the last over 620,000)
    assert max((size for _, size in walks), default=0) < 30_000, walks
