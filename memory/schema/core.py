V1 = """
-- Lark events committed before they are acknowledged ("acknowledged means stored").
-- Doubles as the restart-proof dedup store: event_id and message_id are both unique.
CREATE TABLE inbox (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id      TEXT NOT NULL UNIQUE,
    message_id    TEXT UNIQUE,
    chat_id       TEXT NOT NULL DEFAULT '',
    conv_key      TEXT NOT NULL DEFAULT '',
    create_time   REAL NOT NULL,            -- when Lark says the message was sent (s)
    received_at   REAL NOT NULL,
    payload       TEXT NOT NULL,            -- the decrypted event JSON
    status        TEXT NOT NULL DEFAULT 'pending'
                  CHECK (status IN ('pending', 'done', 'ignored', 'failed')),
    attempts      INTEGER NOT NULL DEFAULT 0,
    done_at       REAL,
    note          TEXT
);
CREATE INDEX inbox_pending ON inbox(status, received_at);

-- Outbound messages: one row per logical send, keyed by the uuid Lark dedups on.
CREATE TABLE outbox (
    uuid          TEXT PRIMARY KEY,
    chat_id       TEXT NOT NULL,
    reply_to      TEXT,                      -- the triggering message_id
    lark_message_id TEXT,
    kind          TEXT NOT NULL,             -- text | post | card
    status        TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'sent', 'failed')),
    created_at    REAL NOT NULL,
    sent_at       REAL,
    error         TEXT
);

-- Per user per conversation: work assistant or companion (陪伴) mode.
CREATE TABLE modes (
    user_id       TEXT NOT NULL,
    conv_key      TEXT NOT NULL,
    mode          TEXT NOT NULL CHECK (mode IN ('work', 'companion')),
    updated_at    REAL NOT NULL,
    PRIMARY KEY (user_id, conv_key)
);

-- Every admin action: who, what, when, target.
CREATE TABLE audit (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    at            REAL NOT NULL,
    actor         TEXT NOT NULL,
    action        TEXT NOT NULL,
    target        TEXT NOT NULL DEFAULT '',
    chat_id       TEXT NOT NULL DEFAULT '',
    detail        TEXT NOT NULL DEFAULT '',
    allowed       INTEGER NOT NULL DEFAULT 1
);
"""

# The CardKit card entity behind a card reply, so a reply processed again after a crash
# finishes the card the user already sees instead of sending a second one.
V3 = """
ALTER TABLE outbox ADD COLUMN card_id TEXT;
CREATE INDEX outbox_created ON outbox(created_at);
"""
