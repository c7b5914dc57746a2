"""The database schema: the migrations that build it, one schema version each.

A migration only ever adds (tables, columns, indexes, triggers): messages are
append-only, and a database written by an older Iris opens in a newer one. The schema
version is SQLite's ``user_version``; :class:`~iris_desktop.core.store.Store` applies
the missing migrations at open, each in its own transaction.
"""

from __future__ import annotations

import sqlite3

MIGRATIONS: tuple[str, ...] = (
    # 1: the base schema
    """
    CREATE TABLE threads (
        id INTEGER PRIMARY KEY,
        title TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        thread_id INTEGER NOT NULL REFERENCES threads(id) ON DELETE CASCADE,
        turn INTEGER NOT NULL,
        role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant', 'tool')),
        content TEXT,
        content_is_json INTEGER NOT NULL DEFAULT 0,
        tool_calls TEXT,
        tool_call_id TEXT,
        name TEXT,
        extra TEXT,
        status TEXT NOT NULL DEFAULT 'complete'
            CHECK (status IN ('complete', 'streaming', 'interrupted', 'error')),
        created_at REAL NOT NULL
    );
    CREATE INDEX messages_thread ON messages(thread_id, id);
    CREATE INDEX messages_thread_turn ON messages(thread_id, role, id);
    CREATE TABLE token_counts (
        message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
        counter TEXT NOT NULL,
        tokens INTEGER NOT NULL,
        PRIMARY KEY (message_id, counter)
    ) WITHOUT ROWID;
    CREATE TABLE summaries (
        id INTEGER PRIMARY KEY,
        thread_id INTEGER NOT NULL REFERENCES threads(id) ON DELETE CASCADE,
        prev_id INTEGER REFERENCES summaries(id),
        first_message_id INTEGER NOT NULL,
        covers_through_id INTEGER NOT NULL,
        first_turn INTEGER NOT NULL,
        last_turn INTEGER NOT NULL,
        fields TEXT NOT NULL,
        text TEXT NOT NULL,
        tokens INTEGER NOT NULL,
        counter TEXT NOT NULL,
        path TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    CREATE INDEX summaries_thread ON summaries(thread_id, id);
    CREATE TABLE compaction_events (
        id INTEGER PRIMARY KEY,
        thread_id INTEGER NOT NULL REFERENCES threads(id) ON DELETE CASCADE,
        created_at REAL NOT NULL,
        trigger TEXT NOT NULL,
        outcome TEXT NOT NULL,
        path TEXT,
        turns_archived INTEGER,
        messages_archived INTEGER,
        tokens_before INTEGER,
        tokens_after INTEGER,
        kept_turns INTEGER,
        summary_tokens INTEGER,
        duration_s REAL,
        error TEXT,
        summary_id INTEGER REFERENCES summaries(id)
    );
    CREATE INDEX compaction_events_thread ON compaction_events(thread_id, id);
    CREATE TABLE requests (
        id INTEGER PRIMARY KEY,
        thread_id INTEGER NOT NULL REFERENCES threads(id) ON DELETE CASCADE,
        created_at REAL NOT NULL,
        model TEXT,
        window INTEGER,
        counter TEXT,
        summary_id INTEGER,
        predicted_prompt_tokens INTEGER,
        prompt_tokens INTEGER,
        completion_tokens INTEGER,
        reused_tokens INTEGER,
        evaluated_tokens INTEGER,
        time_to_first_token_s REAL,
        tokens_per_s REAL,
        duration_s REAL,
        finish_reason TEXT
    );
    CREATE INDEX requests_thread ON requests(thread_id, id);
    """,
    # 2: full-text search over message text
    """
    CREATE VIRTUAL TABLE messages_fts USING fts5(
        content, content='messages', content_rowid='id', tokenize='unicode61'
    );
    CREATE TRIGGER messages_fts_ai AFTER INSERT ON messages BEGIN
        INSERT INTO messages_fts(rowid, content) VALUES (new.id, coalesce(new.content, ''));
    END;
    CREATE TRIGGER messages_fts_au AFTER UPDATE OF content ON messages BEGIN
        INSERT INTO messages_fts(messages_fts, rowid, content)
            VALUES ('delete', old.id, coalesce(old.content, ''));
        INSERT INTO messages_fts(rowid, content) VALUES (new.id, coalesce(new.content, ''));
    END;
    CREATE TRIGGER messages_fts_ad AFTER DELETE ON messages BEGIN
        INSERT INTO messages_fts(messages_fts, rowid, content)
            VALUES ('delete', old.id, coalesce(old.content, ''));
    END;
    INSERT INTO messages_fts(messages_fts) VALUES ('rebuild');
    """,
    # 3: which process is streaming a reply, so that a crash can be told from a live writer
    """
    CREATE TABLE streams (
        message_id INTEGER PRIMARY KEY REFERENCES messages(id) ON DELETE CASCADE,
        pid INTEGER NOT NULL,
        started_at REAL NOT NULL
    );
    CREATE INDEX messages_streaming ON messages(id) WHERE status = 'streaming';
    """,
    # 4: when a message was written, as ISO 8601 with its UTC offset (the writer's local
    # day), NULL when unknown (an import without timestamps): summaries and recall date
    # facts from it, never from the text's layout
    """
    ALTER TABLE messages ADD COLUMN sent_at TEXT;
    CREATE INDEX messages_thread_name ON messages(thread_id, name);
    """,
    # 5: who is compacting a thread: one process at a time (a lease that expires, and
    # that is free as soon as its process is gone)
    """
    CREATE TABLE compaction_leases (
        thread_id INTEGER PRIMARY KEY REFERENCES threads(id) ON DELETE CASCADE,
        token TEXT NOT NULL,
        pid INTEGER NOT NULL,
        acquired_at REAL NOT NULL,
        expires_at REAL NOT NULL
    );
    """,
    # 6: messages by when they were written, for recall of a question that names a date
    """
    CREATE INDEX messages_thread_sent ON messages(thread_id, sent_at);
    """,
    # 7: one vector per message for semantic recall (core.semantic), by embedding model;
    # IF NOT EXISTS: before this migration the semantic index created the table itself
    """
    CREATE TABLE IF NOT EXISTS message_vectors (
        message_id INTEGER PRIMARY KEY REFERENCES messages(id) ON DELETE CASCADE,
        model TEXT NOT NULL,
        vector BLOB NOT NULL
    );
    """,
    # 8: branches. A message has a parent (a regenerated reply or an edited user message
    # is a new message beside the one it replaces, never a change to it); a thread has a
    # head, the newest message of its active branch, and thread_paths holds that branch's
    # messages (the path from the first message to the head), so that every read of the
    # engine is one join away from "the active branch only". A request names the message
    # it answered and the reply it made. A thread may have its own system prompt.
    """
    ALTER TABLE messages ADD COLUMN parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE;
    ALTER TABLE threads ADD COLUMN head_id INTEGER REFERENCES messages(id) ON DELETE SET NULL;
    ALTER TABLE threads ADD COLUMN system_prompt TEXT;
    ALTER TABLE requests ADD COLUMN head_id INTEGER;
    ALTER TABLE requests ADD COLUMN reply_id INTEGER;
    CREATE TABLE thread_paths (
        thread_id INTEGER NOT NULL REFERENCES threads(id) ON DELETE CASCADE,
        message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
        PRIMARY KEY (thread_id, message_id)
    ) WITHOUT ROWID;
    UPDATE messages SET parent_id = (SELECT max(p.id) FROM messages p
                                     WHERE p.thread_id = messages.thread_id AND p.id < messages.id);
    INSERT INTO thread_paths(thread_id, message_id) SELECT thread_id, id FROM messages;
    UPDATE threads SET head_id = (SELECT max(id) FROM messages WHERE thread_id = threads.id);
    CREATE INDEX messages_parent ON messages(parent_id, role);
    CREATE INDEX requests_reply ON requests(reply_id);
    """,
    # 9: a writer's pid is reused once it is gone: a stream and a compaction lease also
    # record when their process started (base.process_start, an opaque token; NULL in rows
    # written before), so that a later process given the same pid is not taken for it
    """
    ALTER TABLE streams ADD COLUMN pid_start TEXT;
    ALTER TABLE compaction_leases ADD COLUMN pid_start TEXT;
    """,
    # 10: a cached token count always counts the text stored now. A reply still being
    # written has none (its count would go stale with the next second's text), a change
    # of a message's text drops its counts, and the replies' counts cached before this
    # rule (the GUI cached partial replies: 5 tokens for a 60-token reply) are dropped
    # to be counted again on the next read
    """
    CREATE TRIGGER IF NOT EXISTS token_counts_not_streaming BEFORE INSERT ON token_counts
    WHEN (SELECT status FROM messages WHERE id = new.message_id) = 'streaming'
    BEGIN
        SELECT RAISE(IGNORE);
    END;
    CREATE TRIGGER IF NOT EXISTS token_counts_text_changed AFTER UPDATE OF role, content, content_is_json,
        tool_calls, tool_call_id, name, status ON messages
    BEGIN
        DELETE FROM token_counts WHERE message_id = new.id;
    END;
    DELETE FROM token_counts WHERE message_id IN (SELECT id FROM messages WHERE role = 'assistant');
    """,
    # 11: a message may hold a vector from each embedding model: when the embedder changes
    # (all-MiniLM-L6-v2 → bge-small-en-v1.5), recall keeps searching the old vectors until
    # the new ones are complete, and only then are the old ones dropped (core.semantic)
    """
    CREATE TABLE message_vectors_by_model (
        message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
        model TEXT NOT NULL,
        vector BLOB NOT NULL,
        PRIMARY KEY (message_id, model)
    ) WITHOUT ROWID;
    INSERT INTO message_vectors_by_model(message_id, model, vector)
        SELECT message_id, model, vector FROM message_vectors;
    DROP TABLE message_vectors;
    ALTER TABLE message_vectors_by_model RENAME TO message_vectors;
    """,
    # 12: which messages hold a model's vector, without the vectors: the key order of
    # message_vectors keeps each 1.5 KB vector beside its key, so "has this message a
    # vector?" read a page of vectors per message (the first search of a 100k-message
    # thread spent 400 ms finding where its vectors end; by this index 70 ms), and a count
    # of one model's vectors read them all
    """
    CREATE INDEX message_vectors_model ON message_vectors(model, message_id);
    """,
    # 13: who is answering in a thread: one turn at a time, whichever process runs it (the
    # window and a CLI command, two commands). Two turns at once put the second question
    # before the first reply, and each reply under the newest message, out of order for
    # good. A lease as compaction's: it expires, and is free once its process is gone
    """
    CREATE TABLE IF NOT EXISTS turn_leases (
        thread_id INTEGER PRIMARY KEY REFERENCES threads(id) ON DELETE CASCADE,
        token TEXT NOT NULL,
        pid INTEGER NOT NULL,
        pid_start TEXT,
        acquired_at REAL NOT NULL,
        expires_at REAL NOT NULL
    );
    """,
    # 14: the unsent draft of each chat, in the history (encrypted with it, gone with its
    # chat whoever deletes it, never another chat's that is given the same id); it was in
    # ui-state.ini, in plain text. ``key``: the chat's id, 0 for a chat not begun
    """
    CREATE TABLE IF NOT EXISTS drafts (
        key INTEGER PRIMARY KEY,
        thread_id INTEGER REFERENCES threads(id) ON DELETE CASCADE,
        text TEXT NOT NULL,
        saved_at REAL NOT NULL
    );
    """,
    # 15: the files attached to a draft, kept with it (a restart or a crash lost them):
    # a JSON list of {"name", "text"}, NULL when none. And the head of the branch a
    # compaction ran on, so a branch's inspector and reasons show its own compactions
    """
    ALTER TABLE drafts ADD COLUMN files TEXT;
    ALTER TABLE compaction_events ADD COLUMN head_id INTEGER;
    """,
    # 16: a chat's id and a message's id are never given again once deleted. Without
    # AUTOINCREMENT SQLite gives max(id) + 1, so deleting the newest chat gave its id to
    # the next chat made (by any process): a window that showed the deleted chat showed the
    # new one as if it were the same, and sent its draft there. ``id_marks`` holds the
    # highest id each table has had, kept by a trigger whichever process deletes a chat,
    # and a new chat or message takes max(max(id), mark) + 1 (``messages.next_id``).
    # AUTOINCREMENT would mean rebuilding the messages table (its FTS index and every
    # reference), minutes for a long history. A database whose ids were reused before
    # keeps them; the rule holds from the first delete after this step
    """
    CREATE TABLE IF NOT EXISTS id_marks (
        name TEXT PRIMARY KEY,
        high INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE TRIGGER IF NOT EXISTS threads_id_mark BEFORE DELETE ON threads BEGIN
        INSERT INTO id_marks(name, high) SELECT 'threads', coalesce(max(id), 0) FROM threads WHERE 1
            ON CONFLICT(name) DO UPDATE SET high = max(high, excluded.high);
        INSERT INTO id_marks(name, high) SELECT 'messages', coalesce(max(id), 0) FROM messages WHERE 1
            ON CONFLICT(name) DO UPDATE SET high = max(high, excluded.high);
    END;
    """,
    # 17: every column that refers to a message, a summary or a chat has an index it
    # leads: a deleted message's ON DELETE CASCADE (or SET NULL) looks up the rows that
    # refer to it, and without one SQLite read all of thread_paths (and threads) once per
    # deleted message: a 1,000-message chat beside 150,000 messages took 12 s to delete, a
    # 50,000-message one 14 minutes (with the index: 0.4 s and 5 s)
    """
    CREATE INDEX IF NOT EXISTS thread_paths_message ON thread_paths(message_id);
    CREATE INDEX IF NOT EXISTS threads_head ON threads(head_id);
    CREATE INDEX IF NOT EXISTS summaries_prev ON summaries(prev_id);
    CREATE INDEX IF NOT EXISTS compaction_events_summary ON compaction_events(summary_id);
    CREATE INDEX IF NOT EXISTS drafts_thread ON drafts(thread_id);
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


def _split_sql(script: str) -> list[str]:
    """Split a migration into statements, keeping trigger bodies whole."""
    statements: list[str] = []
    buffer = ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                statements.append(buffer.strip())
            buffer = ""
    if buffer.strip():
        statements.append(buffer.strip())
    return statements
