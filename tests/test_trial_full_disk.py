"""A change tried and rolled back (``Store.trial``: compaction's check of a summary before
it is saved) on a full disk leaves no transaction open. It was a savepoint, whose RELEASE
outside a transaction is a COMMIT: the full disk failed it, the connection stayed inside
a transaction for good, and every later write of the process looked saved to it and was
lost when it closed (the s67 lease audit: 8 messages read, 5 in the file)."""

from __future__ import annotations

from test_compaction import chat_thread

from iris_desktop.core.store import Store

from support.faults import full_disk


def test_a_trial_on_a_full_disk_leaves_no_transaction_and_loses_nothing(tmp_path):
    with full_disk(tmp_path, "8m") as disk:
        store = Store(disk.path / "iris.db")
        try:
            thread = chat_thread(store)
            before = len(store.messages(thread))
            store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # (no room left in the log)
            disk.fill()
            with store.trial():
                store.conn.execute("INSERT INTO threads(title, created_at, updated_at) "
                                   "VALUES ('tried', 0, 0)")
            assert not store.conn.in_transaction  # before: True, for good
            disk.free()
            store.add_message(thread, {"role": "user", "content": "written after the trial"})
        finally:
            store.close()
        again = Store(disk.path / "iris.db")
        try:
            texts = [m["content"] for m in again.messages(thread)]
            assert len(texts) == before + 1 and texts[-1] == "written after the trial"
            assert "tried" not in [t["title"] for t in again.threads()]
        finally:
            again.close()


def test_a_trial_inside_a_transaction_is_a_savepoint(tmp_path):
    store = Store(tmp_path / "iris.db")
    try:
        with store.transaction():
            store.conn.execute("INSERT INTO threads(title, created_at, updated_at) VALUES ('kept', 0, 0)")
            with store.trial():
                store.conn.execute("INSERT INTO threads(title, created_at, updated_at) "
                                   "VALUES ('tried', 0, 0)")
            assert store.conn.in_transaction
        assert [t["title"] for t in store.threads()] == ["kept"]
    finally:
        store.close()
