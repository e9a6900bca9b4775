V1 = """
-- Cold zone: durable facts, always owned by one user (open_id).
-- visibility: 'private' = learned in a p2p chat, injected only in that user's p2p chat;
--             'shared'  = learned in a group or entered by the user, injected wherever they speak.
CREATE TABLE facts (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id       TEXT NOT NULL,
    content       TEXT NOT NULL,
    norm          TEXT NOT NULL,              -- normalised form for reinforcement matching
    category      TEXT NOT NULL CHECK (category IN ('preference', 'decision', 'knowledge', 'correction')),
    confidence    REAL NOT NULL,
    source        TEXT NOT NULL CHECK (source IN ('consolidator', 'agent_proactive', 'user_edit')),
    visibility    TEXT NOT NULL DEFAULT 'private' CHECK (visibility IN ('private', 'shared')),
    chat_id       TEXT NOT NULL DEFAULT '',
    message_id    TEXT NOT NULL DEFAULT '',
    created_at    REAL NOT NULL,
    last_accessed REAL NOT NULL,
    hit_count     INTEGER NOT NULL DEFAULT 0,
    superseded_at REAL,
    superseded_by INTEGER
);
CREATE INDEX facts_rank ON facts(user_id, superseded_at, confidence DESC, last_accessed DESC);
CREATE INDEX facts_norm ON facts(user_id, norm);
"""
