V1 = """
-- Cold zone: durable facts, always owned by one user (open_id).
-- visibility: 'private' = learned in a p2p chat, injected only in that user's p2p chat;
--             'shared'  = learned in a group or entered by the user, injected wherever they speak.
-- A superseded fact is kept (superseded_at, superseded_by = the fact that replaced it; the
-- replacing fact may itself be deleted later). chat_id/message_id: where it was last learned.
CREATE TABLE facts (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id       TEXT NOT NULL,
    content       TEXT NOT NULL,
    norm          TEXT NOT NULL,              -- similarity.normalise(content), for reinforcement
    category      TEXT NOT NULL CHECK (category IN ('preference', 'decision', 'knowledge', 'correction')),
    confidence    REAL NOT NULL CHECK (confidence >= 0 AND confidence <= 1),
    source        TEXT NOT NULL CHECK (source IN ('consolidator', 'agent_proactive', 'user_edit')),
    visibility    TEXT NOT NULL DEFAULT 'private' CHECK (visibility IN ('private', 'shared')),
    chat_id       TEXT NOT NULL DEFAULT '',
    message_id    TEXT NOT NULL DEFAULT '',
    created_at    REAL NOT NULL,
    updated_at    REAL NOT NULL,
    last_accessed REAL NOT NULL,
    hit_count     INTEGER NOT NULL DEFAULT 0, -- times the fact was learned again (reinforced)
    superseded_at REAL,
    superseded_by INTEGER
);
-- Injection in p2p (top), eviction (scanned backwards) and active counts: only active rows.
CREATE INDEX facts_active ON facts(user_id, confidence DESC, last_accessed DESC)
    WHERE superseded_at IS NULL;
-- Injection outside p2p reads shared rows only, still in rank order.
CREATE INDEX facts_active_shared ON facts(user_id, confidence DESC, last_accessed DESC)
    WHERE superseded_at IS NULL AND visibility = 'shared';
-- Listing with history, delete_all.
CREATE INDEX facts_user ON facts(user_id, created_at);
"""

V4 = """
-- Which sessions a fact was learned (or re-learned) from, so deleting a session removes the
-- facts learned only from it (DESIGN.md §4). Facts from before v4 have no rows: kept.
CREATE TABLE fact_sources (
    fact_id     INTEGER NOT NULL REFERENCES facts(id) ON DELETE CASCADE,
    session_id  TEXT NOT NULL,
    PRIMARY KEY (fact_id, session_id)
);
CREATE INDEX fact_sources_session ON fact_sources(session_id);
"""
