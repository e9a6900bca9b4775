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

V4 = """
-- Episodes index what was said (issue 19): the session's own turns beside the summary.
-- started_at / ended_at: the session's first and last message (episodes carry their dates).
ALTER TABLE episodes ADD COLUMN started_at REAL;
ALTER TABLE episodes ADD COLUMN ended_at REAL;
-- One row per chunk of the session's turns (a few consecutive lines, "speaker: text"), so a
-- long session is found by the part that matches and BM25's length normalisation works per
-- chunk. terms keep their repeats (term frequency), space-separated, one token per word.
CREATE TABLE episode_chunks (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    episode_id  INTEGER NOT NULL REFERENCES episodes(id) ON DELETE CASCADE,
    seq         INTEGER NOT NULL,
    text        TEXT NOT NULL,
    terms       TEXT NOT NULL DEFAULT '',
    UNIQUE (episode_id, seq)
);
CREATE VIRTUAL TABLE episode_chunks_fts USING fts5(
    terms, content='episode_chunks', content_rowid='id', tokenize='unicode61 remove_diacritics 2'
);
CREATE TRIGGER episode_chunks_ai AFTER INSERT ON episode_chunks BEGIN
    INSERT INTO episode_chunks_fts(rowid, terms) VALUES (new.id, new.terms);
END;
CREATE TRIGGER episode_chunks_ad AFTER DELETE ON episode_chunks BEGIN
    INSERT INTO episode_chunks_fts(episode_chunks_fts, rowid, terms) VALUES ('delete', old.id, old.terms);
END;
"""

# Version 9 is PostgreSQL's (the row count and token total its BM25 reads; FTS5 keeps both in
# its own structure record): nothing to do here, the version numbers stay the same on both.
V9 = """
SELECT 1;
"""

# Version 11 (issue 31): vectors for semantic recall (memory/episodes/vectors.py). Per episode and
# embedding model: the summary (seq -1) and each indexed line (seq = its place among the
# session's lines); float32 BLOBs in sqlite-vec's format. They go with the episode (cascade)
# and whenever its summary or turns change (the triggers: forget, redaction, a rewrite), so
# nothing forgotten survives as a vector; the background indexer embeds it again.
V11 = """
CREATE TABLE episode_vectors (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    episode_id  INTEGER NOT NULL REFERENCES episodes(id) ON DELETE CASCADE,
    seq         INTEGER NOT NULL,
    model       TEXT NOT NULL,
    dim         INTEGER NOT NULL,
    vec         BLOB NOT NULL,
    UNIQUE (episode_id, model, seq)
);
CREATE TRIGGER episode_vectors_summary AFTER UPDATE OF summary ON episodes BEGIN
    DELETE FROM episode_vectors WHERE episode_id = new.id;
END;
CREATE TRIGGER episode_vectors_turns AFTER DELETE ON episode_chunks BEGIN
    DELETE FROM episode_vectors WHERE episode_id = old.episode_id;
END;
"""
