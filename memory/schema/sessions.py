V1 = """
-- Layer 1. A conversation is a Lark chat (plus thread/root id for topic threads);
-- it has at most one active session at a time.
CREATE TABLE conversations (
    conv_key          TEXT PRIMARY KEY,
    chat_id           TEXT NOT NULL,
    thread_id         TEXT NOT NULL DEFAULT '',
    chat_type         TEXT NOT NULL,          -- p2p | group | console | cli
    active_session_id TEXT,
    updated_at        REAL NOT NULL
);

CREATE TABLE sessions (
    id            TEXT PRIMARY KEY,           -- s_YYYYMMDD_HHMM_xxxx
    title         TEXT NOT NULL DEFAULT '',
    model         TEXT NOT NULL DEFAULT '',
    conv_key      TEXT NOT NULL,
    chat_id       TEXT NOT NULL,
    thread_id     TEXT NOT NULL DEFAULT '',
    chat_type     TEXT NOT NULL,
    owner_id      TEXT NOT NULL,              -- open_id of whoever started it
    created_at    REAL NOT NULL,
    updated_at    REAL NOT NULL,
    closed_at     REAL
);
CREATE INDEX sessions_conv ON sessions(conv_key, updated_at DESC);
CREATE INDEX sessions_updated ON sessions(updated_at DESC);

CREATE TABLE messages (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id    TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    role          TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
    content       TEXT NOT NULL,
    tool_calls    TEXT,
    tool_call_id  TEXT,
    sender_id     TEXT NOT NULL DEFAULT '',
    sender_name   TEXT NOT NULL DEFAULT '',
    lark_message_id TEXT,
    created_at    REAL NOT NULL
);
CREATE INDEX messages_session ON messages(session_id, id);
CREATE INDEX messages_sender ON messages(sender_id, session_id);
-- A Lark message is stored once, however often it is delivered.
CREATE UNIQUE INDEX messages_lark_user ON messages(lark_message_id) WHERE role = 'user' AND lark_message_id IS NOT NULL;

CREATE VIRTUAL TABLE messages_fts USING fts5(
    content, content='messages', content_rowid='id', tokenize='trigram'
);
CREATE TRIGGER messages_ai AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER messages_ad AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
END;
CREATE TRIGGER messages_au AFTER UPDATE OF content ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
"""
