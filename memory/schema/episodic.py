V1 = """
-- Layer 4: one keyworded summary per finished session (>= 2 user turns), per user.
CREATE TABLE episodes (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id       TEXT NOT NULL,
    session_id    TEXT NOT NULL,
    chat_id       TEXT NOT NULL DEFAULT '',
    chat_type     TEXT NOT NULL DEFAULT '',
    visibility    TEXT NOT NULL DEFAULT 'private' CHECK (visibility IN ('private', 'shared')),
    summary       TEXT NOT NULL,
    keywords      TEXT NOT NULL DEFAULT '[]',  -- JSON list
    model         TEXT NOT NULL DEFAULT '',
    turn_count    INTEGER NOT NULL,
    timestamp     REAL NOT NULL,
    UNIQUE (user_id, session_id)
);
CREATE INDEX episodes_user ON episodes(user_id, timestamp DESC);

CREATE VIRTUAL TABLE episodes_fts USING fts5(
    summary, keywords, content='episodes', content_rowid='id', tokenize='trigram'
);
CREATE TRIGGER episodes_ai AFTER INSERT ON episodes BEGIN
    INSERT INTO episodes_fts(rowid, summary, keywords) VALUES (new.id, new.summary, new.keywords);
END;
CREATE TRIGGER episodes_ad AFTER DELETE ON episodes BEGIN
    INSERT INTO episodes_fts(episodes_fts, rowid, summary, keywords) VALUES ('delete', old.id, old.summary, old.keywords);
END;
CREATE TRIGGER episodes_au AFTER UPDATE ON episodes BEGIN
    INSERT INTO episodes_fts(episodes_fts, rowid, summary, keywords) VALUES ('delete', old.id, old.summary, old.keywords);
    INSERT INTO episodes_fts(rowid, summary, keywords) VALUES (new.id, new.summary, new.keywords);
END;
"""
