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

V12 = """
-- Every message a fact was learned from (issue 32): repeating a fact adds a row here instead of
-- moving facts.chat_id/message_id (which keep the first learning), so recalling one of several
-- sources leaves the fact, and recalling the last removes it. visibility: where that source
-- was (a private fact repeated in a group is shared; when the group source is recalled and
-- only private ones remain, it is private again). Facts from before v12 get their one row.
CREATE TABLE fact_messages (
    fact_id     INTEGER NOT NULL REFERENCES facts(id) ON DELETE CASCADE,
    message_id  TEXT NOT NULL,
    chat_id     TEXT NOT NULL DEFAULT '',
    visibility  TEXT NOT NULL DEFAULT 'private' CHECK (visibility IN ('private', 'shared')),
    learned_at  REAL NOT NULL,
    PRIMARY KEY (fact_id, message_id)
);
CREATE INDEX fact_messages_message ON fact_messages(message_id);
INSERT INTO fact_messages(fact_id, message_id, chat_id, visibility, learned_at)
    SELECT id, message_id, chat_id, visibility, updated_at FROM facts WHERE message_id <> '';
"""
