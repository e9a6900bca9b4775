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

# Deduplication keyed on the event (DESIGN.md §5): message_id is no longer unique — a recall
# (or any later event) about a stored message must not be dropped as its duplicate. The
# unique dedup_key is "<kind>:<message_id>" ("msg:om_…" for a new message, "recall:om_…"),
# NULL for events deduplicated by event_id alone. SQLite cannot drop a UNIQUE constraint in
# place, so the table is rebuilt; existing rows keep their ids and become "msg:" keys. No
# index on message_id: lookups by it are rare (erase, the terminal), the writes are every event.
# card_confirmations: a destructive command's card acts on its first click only.
# chat_greetings: the p2p chats already greeted (bot_p2p_chat_entered_v1 greets once; the
# inbox forgets after 24 h, this does not).
V5 = """
CREATE TABLE inbox_v4 (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id      TEXT NOT NULL UNIQUE,
    event_type    TEXT NOT NULL DEFAULT 'im.message.receive_v1',
    message_id    TEXT,
    dedup_key     TEXT UNIQUE,
    chat_id       TEXT NOT NULL DEFAULT '',
    conv_key      TEXT NOT NULL DEFAULT '',
    create_time   REAL NOT NULL,
    received_at   REAL NOT NULL,
    payload       TEXT NOT NULL,
    status        TEXT NOT NULL DEFAULT 'pending'
                  CHECK (status IN ('pending', 'done', 'ignored', 'failed')),
    attempts      INTEGER NOT NULL DEFAULT 0,
    done_at       REAL,
    note          TEXT
);
INSERT INTO inbox_v4(id, event_id, event_type, message_id, dedup_key, chat_id, conv_key, create_time,
                     received_at, payload, status, attempts, done_at, note)
    SELECT id, event_id, 'im.message.receive_v1', message_id,
           CASE WHEN message_id IS NULL THEN NULL ELSE 'msg:' || message_id END,
           chat_id, conv_key, create_time, received_at, payload, status, attempts, done_at, note
    FROM inbox;
DROP TABLE inbox;
ALTER TABLE inbox_v4 RENAME TO inbox;
CREATE INDEX inbox_pending ON inbox(status, received_at);
CREATE TABLE chat_greetings (
    chat_id       TEXT PRIMARY KEY,
    kind          TEXT NOT NULL,             -- p2p | group
    at            REAL NOT NULL
);
-- A confirm/cancel card is answered once: the first click's outcome, keyed by the card message.
CREATE TABLE card_confirmations (
    card_message_id TEXT PRIMARY KEY,
    user_id       TEXT NOT NULL,
    outcome       TEXT NOT NULL,             -- confirmed | cancelled
    at            REAL NOT NULL
);
"""

# chats_left: the chats the bot was removed from (im.chat.member.bot.deleted_v1), so a restart
# or another replica does not answer messages still queued there; a re-add deletes the row.
V6 = """
CREATE TABLE chats_left (
    chat_id       TEXT PRIMARY KEY,
    at            REAL NOT NULL
);
"""

# Replicas on one database (DESIGN.md §7, docs/reliability.md "Replicas"). Each inbox row has
# an owner (the replica that accepted or claimed it) and a lease the owner's heartbeat renews;
# another replica may claim the row only when it is unowned or its lease expired. One
# conversation is worked by one replica at a time (conversation_leases, same rule), and one
# session's consolidation by one worker (consolidation_claims). A partial index finds a
# conversation's pending rows without touching the answered ones.
V7 = """
ALTER TABLE inbox ADD COLUMN owner TEXT;
ALTER TABLE inbox ADD COLUMN lease_until REAL NOT NULL DEFAULT 0;
CREATE INDEX inbox_open ON inbox(conv_key, id) WHERE status = 'pending';
CREATE TABLE conversation_leases (
    conv_key      TEXT PRIMARY KEY,
    owner         TEXT NOT NULL,
    lease_until   REAL NOT NULL
);
CREATE TABLE consolidation_claims (
    session_id    TEXT PRIMARY KEY,
    owner         TEXT NOT NULL,
    lease_until   REAL NOT NULL
);
"""
