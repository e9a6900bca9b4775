V1 = """
-- Layer 4: one keyworded summary per finished session (>= 2 user turns), per user.
-- terms: the episode's search words (jieba search mode + English words, stop words out),
-- space-separated, so FTS5's unicode61 tokenizer sees one token per word (two-character
-- Chinese words included, which a trigram index cannot match).
CREATE TABLE episodes (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id       TEXT NOT NULL,
    session_id    TEXT NOT NULL,
    chat_id       TEXT NOT NULL DEFAULT '',
    chat_type     TEXT NOT NULL DEFAULT '',
    visibility    TEXT NOT NULL DEFAULT 'private' CHECK (visibility IN ('private', 'shared')),
    summary       TEXT NOT NULL,
    keywords      TEXT NOT NULL DEFAULT '[]',  -- JSON list, at most 8
    terms         TEXT NOT NULL DEFAULT '',    -- search words, space-separated
    model         TEXT NOT NULL DEFAULT '',
    turn_count    INTEGER NOT NULL,
    timestamp     REAL NOT NULL,
    UNIQUE (user_id, session_id)
);
CREATE INDEX episodes_user ON episodes(user_id, timestamp DESC);

CREATE VIRTUAL TABLE episodes_fts USING fts5(
    terms, content='episodes', content_rowid='id', tokenize='unicode61 remove_diacritics 2'
);
CREATE TRIGGER episodes_ai AFTER INSERT ON episodes BEGIN
    INSERT INTO episodes_fts(rowid, terms) VALUES (new.id, new.terms);
END;
CREATE TRIGGER episodes_ad AFTER DELETE ON episodes BEGIN
    INSERT INTO episodes_fts(episodes_fts, rowid, terms) VALUES ('delete', old.id, old.terms);
END;
CREATE TRIGGER episodes_au AFTER UPDATE OF terms ON episodes BEGIN
    INSERT INTO episodes_fts(episodes_fts, rowid, terms) VALUES ('delete', old.id, old.terms);
    INSERT INTO episodes_fts(rowid, terms) VALUES (new.id, new.terms);
END;
"""
