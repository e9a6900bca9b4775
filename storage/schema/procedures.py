V1 = """
-- Behaviour rules. scope 'user' (scope_id = open_id) or 'chat' (scope_id = chat_id, admins only).
CREATE TABLE procedures (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    scope         TEXT NOT NULL CHECK (scope IN ('user', 'chat')),
    scope_id      TEXT NOT NULL,
    rule          TEXT NOT NULL,
    context       TEXT NOT NULL DEFAULT '',
    norm          TEXT NOT NULL,
    visibility    TEXT NOT NULL DEFAULT 'shared' CHECK (visibility IN ('private', 'shared')),
    created_by    TEXT NOT NULL,
    chat_id       TEXT NOT NULL DEFAULT '',
    message_id    TEXT NOT NULL DEFAULT '',
    created_at    REAL NOT NULL
);
CREATE UNIQUE INDEX procedures_unique ON procedures(scope, scope_id, norm);
"""
