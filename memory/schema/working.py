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
CREATE INDEX warm_session ON warm_summaries(session_id, id);

CREATE TABLE consolidation_state (
    session_id        TEXT PRIMARY KEY REFERENCES sessions(id) ON DELETE CASCADE,
    compressed_upto   INTEGER NOT NULL DEFAULT 0,   -- last messages.id compressed into warm
    extracted_upto    INTEGER NOT NULL DEFAULT 0,   -- last messages.id whose facts were extracted
    rolling_summary   TEXT NOT NULL DEFAULT '',
    warm_turns        INTEGER NOT NULL DEFAULT 0,   -- turns absorbed since the last extraction
    failures          INTEGER NOT NULL DEFAULT 0,
    next_attempt_at   REAL NOT NULL DEFAULT 0,
    updated_at        REAL NOT NULL DEFAULT 0
);
"""
