V1 = """
-- Layer 3: the user profile, stored as entries so each keeps its provenance;
-- the Markdown document is rendered from them in the spec's section order.
-- section: one of memory.profile.store.SECTIONS (validated there; the names are Chinese).
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

V8 = """
-- Which sessions taught a profile entry (like fact_sources for facts), so deleting a session
-- removes the entries learned only from it (DESIGN.md §4). Entries from before v8 have no
-- rows, and an entry the user typed (source 'user_edit') is theirs: both stay.
CREATE TABLE profile_sources (
    entry_id    INTEGER NOT NULL REFERENCES profile_entries(id) ON DELETE CASCADE,
    session_id  TEXT NOT NULL,
    PRIMARY KEY (entry_id, session_id)
);
CREATE INDEX profile_sources_session ON profile_sources(session_id);
"""
