V1 = """
-- Layer 2, per session: the warm zone and what consolidation has done.
-- Progress is recorded here so a restart derives pending work again:
-- nothing is compressed twice or skipped.
CREATE TABLE warm_summaries (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id    TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    first_msg_id  INTEGER NOT NULL,
    last_msg_id   INTEGER NOT NULL,
    turns         INTEGER NOT NULL,
    summary       TEXT NOT NULL,
    model         TEXT NOT NULL DEFAULT '',
    folded        INTEGER NOT NULL DEFAULT 0,  -- 1 once folded into the rolling summary
    created_at    REAL NOT NULL
);
CREATE INDEX warm_session ON warm_summaries(session_id, folded, id);
-- one warm row per compressed range, even if two workers raced
CREATE UNIQUE INDEX warm_range ON warm_summaries(session_id, first_msg_id);

CREATE TABLE consolidation_state (
    session_id        TEXT PRIMARY KEY REFERENCES sessions(id) ON DELETE CASCADE,
    compressed_upto   INTEGER NOT NULL DEFAULT 0,   -- last messages.id compressed into warm
    extracted_upto    INTEGER NOT NULL DEFAULT 0,   -- last messages.id whose facts were extracted
    rolling_summary   TEXT NOT NULL DEFAULT '',     -- warm summaries folded after extraction
    warm_turns        INTEGER NOT NULL DEFAULT 0,   -- turns absorbed since the last extraction
    episode_upto      INTEGER NOT NULL DEFAULT 0,   -- last messages.id covered by the episode
                                                    -- (set also when no episode was due: < 2 turns)
    failures          INTEGER NOT NULL DEFAULT 0,   -- consecutive failed attempts
    next_attempt_at   REAL NOT NULL DEFAULT 0,      -- backoff: no attempt before this time
    last_error        TEXT NOT NULL DEFAULT '',
    updated_at        REAL NOT NULL DEFAULT 0
);
CREATE INDEX consolidation_retry ON consolidation_state(next_attempt_at) WHERE failures > 0;

-- Extraction results committed together with extracted_upto and applied afterwards
-- (facts, profile entries); a row is deleted once applied, so a crash in between
-- re-applies at most that one row (facts reinforce, never duplicate).
CREATE TABLE consolidation_writes (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id    TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    kind          TEXT NOT NULL CHECK (kind IN ('fact', 'psych')),
    user_id       TEXT NOT NULL,
    payload       TEXT NOT NULL,                -- JSON: scope fields + content
    created_at    REAL NOT NULL
);
CREATE INDEX consolidation_writes_session ON consolidation_writes(session_id, id);
"""
