# Reminders and scheduled messages (memory/schedules/store.py). A job is one-shot (rrule '') or
# recurring (an RFC 5545 RRULE over a local dtstart in the owner's zone); next_due is the
# UTC epoch of its next occurrence, NULL once none is left. A replica claims a due job with a
# lease (claim_owner, lease_until) as inbox rows are claimed; each occurrence leaves one row
# in schedule_deliveries (its primary key makes a second record of it impossible).
V10 = """
CREATE TABLE schedules (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    owner_id      TEXT NOT NULL,
    session_id    TEXT NOT NULL DEFAULT '',
    chat_id       TEXT NOT NULL,
    chat_type     TEXT NOT NULL CHECK (chat_type IN ('p2p', 'group')),
    text          TEXT NOT NULL,
    use_model     INTEGER NOT NULL DEFAULT 0,
    tz            TEXT NOT NULL,
    dtstart       TEXT NOT NULL,
    rrule         TEXT NOT NULL DEFAULT '',
    next_due      REAL,
    state         TEXT NOT NULL DEFAULT 'active'
                  CHECK (state IN ('active', 'done', 'cancelled', 'stopped')),
    claim_owner   TEXT,
    lease_until   REAL NOT NULL DEFAULT 0,
    created_at    REAL NOT NULL,
    updated_at    REAL NOT NULL,
    note          TEXT NOT NULL DEFAULT ''
);
CREATE INDEX schedules_due ON schedules(next_due) WHERE state = 'active';
CREATE INDEX schedules_owner ON schedules(owner_id, state);
CREATE INDEX schedules_chat ON schedules(chat_id, state);
CREATE TABLE schedule_deliveries (
    schedule_id   INTEGER NOT NULL REFERENCES schedules(id) ON DELETE CASCADE,
    due_at        REAL NOT NULL,
    status        TEXT NOT NULL CHECK (status IN ('sent', 'late', 'skipped', 'failed')),
    at            REAL NOT NULL,
    lark_message_id TEXT NOT NULL DEFAULT '',
    detail        TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (schedule_id, due_at)
);
"""
