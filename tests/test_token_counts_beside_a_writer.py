"""A request is built while another connection writes to the history (the window's meter
counting the same chat on its database thread, another Iris process): the engine reads
the branch newest first through a lazy cursor and caches the counts it makes between two
of its batches. Once another connection had committed since that read began, SQLite
refused the cache at once ("database is locked", SQLITE_BUSY_SNAPSHOT: no busy wait can
help), and the turn failed: a send right after opening a long imported chat, while the
meter still counted it, said "The turn failed". Now the counts serve the request and are
cached another time. A real SQLite file, two real connections."""

from __future__ import annotations

from iris_desktop.core.config import ContextParams
from iris_desktop.core.engine import ContextEngine
from iris_desktop.core.store import Store
from iris_desktop.tokens import HeuristicCounter


class WriterMeanwhile(HeuristicCounter):
    """Counts as the heuristic does; its first count of a history message lets another
    connection commit (as the meter's thread does while the model's thread reads)."""

    def __init__(self, other: Store):
        super().__init__()
        self.other, self.wrote = other, 0

    def count_message(self, message):
        if not self.wrote and "long imported chat" in str(message.get("content")):
            self.other.create_thread("written by another connection meanwhile")
            self.wrote += 1
        return super().count_message(message)


def test_a_request_is_built_when_another_connection_writes_while_it_reads(tmp_path):
    store, other = Store(tmp_path / "iris.db"), Store(tmp_path / "iris.db")
    try:
        thread = store.create_thread("long")
        store.add_messages(thread, [{"role": "user" if i % 2 == 0 else "assistant",
                                     "content": f"line {i} of a long imported chat"} for i in range(600)])
        counter = WriterMeanwhile(other)
        request = ContextEngine(store, counter, ContextParams(window=4096)).build(thread, draft="And now?")
        assert counter.wrote == 1  # (the other connection did write in the middle of the read)
        assert request.included_ids and request.predicted_prompt_tokens > 0
        # the counts of the batch read beside the writer were not cached; a later read caches them
        again = ContextEngine(store, HeuristicCounter(), ContextParams(window=4096)).build(thread, draft="And now?")
        assert again.included_ids == request.included_ids
        assert store.conn.execute("SELECT count(*) FROM token_counts").fetchone()[0] > 0
    finally:
        store.close()
        other.close()


def test_the_connection_writes_again_once_the_request_is_built(tmp_path, caplog):
    """The engine's lazy read of the branch stayed open after the request was built while
    anything still referred to it (here the log record of the busy cache, as pytest keeps
    it; a traceback, a reference cycle): its snapshot held, and once another connection
    had committed, SQLite refused every write of this one ("database is locked",
    SQLITE_BUSY_SNAPSHOT), a turn's reply and its lease included. The read is closed when
    the request is built."""
    import logging

    caplog.set_level(logging.INFO)
    store, other = Store(tmp_path / "iris.db"), Store(tmp_path / "iris.db")
    try:
        thread = store.create_thread("long")
        store.add_messages(thread, [{"role": "user" if i % 2 == 0 else "assistant",
                                     "content": f"line {i} of a long imported chat"} for i in range(600)])
        ContextEngine(store, WriterMeanwhile(other), ContextParams(window=4096)).build(thread, draft="And now?")
        assert any("not saved now" in r.getMessage() for r in caplog.records)  # (the record is held)
        reply = store.add_message(thread, {"role": "assistant", "content": "written after the build"})
        assert store.messages_by_id([reply])[reply]["content"] == "written after the build"
    finally:
        store.close()
        other.close()
