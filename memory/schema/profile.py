V1 = """
-- Layer 3: the user profile, stored as entries so each keeps its provenance;
-- the Markdown document is rendered from them in the spec's section order.
-- section: one of memory.profile.SECTIONS (validated there; the names are Chinese).
-- entry: one line, inert (angle brackets stored full-width).
CREATE TABLE profile_entries (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id       TEXT NOT NULL,
    section       TEXT NOT NULL,
    position      INTEGER NOT NULL,
    entry         TEXT NOT NULL,
    visibility    TEXT NOT NULL DEFAULT 'private' CHECK (visibility IN ('private', 'shared')),
    source        TEXT NOT NULL CHECK (source IN ('agent_proactive', 'consolidator', 'user_edit')),
    chat_id       TEXT NOT NULL DEFAULT '',
    message_id    TEXT NOT NULL DEFAULT '',
    created_at    REAL NOT NULL,
    updated_at    REAL NOT NULL
);
CREATE INDEX profile_user ON profile_entries(user_id, section, position);
"""
