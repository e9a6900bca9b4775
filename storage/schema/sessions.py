V1 = """
-- Layer 1. A conversation is a Lark chat (plus thread/root id for topic threads);
-- it has at most one active session at a time.
CREATE TABLE conversations (
    conv_key          TEXT PRIMARY KEY,
    chat_id           TEXT NOT NULL,
    thread_id         TEXT NOT NULL DEFAULT '',
    chat_type         TEXT NOT NULL,          -- p2p | group | console | cli
    active_session_id TEXT REFERENCES sessions(id) ON DELETE SET NULL,
    updated_at        REAL NOT NULL
);
CREATE INDEX conversations_active ON conversations(active_session_id) WHERE active_session_id IS NOT NULL;

-- Who took part in a conversation (sent at least one message in it). Session search and
-- listing for a user read only conversations listed here; kept by the trigger messages_member.
CREATE TABLE conversation_members (
    user_id           TEXT NOT NULL,
    conv_key          TEXT NOT NULL,
    PRIMARY KEY (user_id, conv_key)
) WITHOUT ROWID;

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
    updated_at    REAL NOT NULL,              -- time of the last message (or of resuming)
    closed_at     REAL,                       -- NULL while the session is open
    message_count INTEGER NOT NULL DEFAULT 0, -- kept by triggers on messages
    user_turns    INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX sessions_conv ON sessions(conv_key, updated_at DESC);
CREATE INDEX sessions_updated ON sessions(updated_at DESC);
CREATE INDEX sessions_open ON sessions(updated_at) WHERE closed_at IS NULL;

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

-- Counters and last activity follow the messages, whoever writes them.
CREATE TRIGGER messages_count_ai AFTER INSERT ON messages BEGIN
    UPDATE sessions SET message_count = message_count + 1,
                        user_turns = user_turns + (new.role = 'user'),
                        updated_at = max(updated_at, new.created_at)
     WHERE id = new.session_id;
END;
CREATE TRIGGER messages_count_ad AFTER DELETE ON messages BEGIN
    UPDATE sessions SET message_count = message_count - 1,
                        user_turns = user_turns - (old.role = 'user')
     WHERE id = old.session_id;
END;
CREATE TRIGGER messages_member AFTER INSERT ON messages WHEN new.role = 'user' AND new.sender_id <> '' BEGIN
    INSERT OR IGNORE INTO conversation_members(user_id, conv_key)
    SELECT new.sender_id, conv_key FROM sessions WHERE id = new.session_id;
END;

-- Full-text search over message content (trigram: substrings of >= 3 characters, any script).
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

# Version 2: resolving a short id (`/resume d139`) looks sessions up by their last four
# characters through this index instead of scanning every id.
V2 = """
CREATE INDEX sessions_tail ON sessions(substr(id, -4));
"""
