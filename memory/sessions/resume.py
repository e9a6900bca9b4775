"""Finding a session by what a user types (``resolve``: a full id, a unique tail, ``last``) and
resuming it: which sessions a conversation may resume, and the move of a p2p session.

Resuming: a conversation may resume (a) any of its own sessions, provided the user took
part in the conversation, or (b) in a p2p chat, a p2p session the same user started in
another p2p conversation of theirs; such a session moves to the resuming conversation.
Nothing else (never a group session into a p2p chat, never a p2p session into a group).

Apart from the store because these are the visibility rules of Layer 1's one cross-conversation
operation; ``SessionStore.resolve`` and ``SessionStore.resume`` run them in the database thread.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any, Sequence

from storage import serialize
from memory.scope import PRIVATE_CHAT_TYPES
from memory.sessions.closing import _active_sync, _close_sync
from memory.sessions.records import _SESSION_COLS, AmbiguousSession, SessionInfo, SessionNotFound, _session
from memory.sessions.search import like_pattern

MAX_CANDIDATES = 10        # candidates carried by AmbiguousSession
_REF_RE = re.compile(r"^[a-z0-9_]+$")


def _resolve_sync(
    conn: sqlite3.Connection, ref: str, where: str, params: Sequence[Any],
    exclude: str | None = None,
) -> SessionInfo:
    norm = (ref or "").strip().lower()
    if not norm:
        raise SessionNotFound(ref, "which session? give an id, its last characters, or 'last'")
    params = list(params)
    if exclude is not None:
        where += " AND s.id <> ?"
        params.append(exclude)
    if norm == "last":
        row = conn.execute(
            f"SELECT {_SESSION_COLS} FROM sessions s WHERE {where} "
            "ORDER BY s.updated_at DESC, s.id DESC LIMIT 1", params,
        ).fetchone()
        if row is None:
            raise SessionNotFound(ref, "no earlier session to resume")
        return _session(row)
    if not _REF_RE.match(norm):
        raise SessionNotFound(ref)
    row = conn.execute(
        f"SELECT {_SESSION_COLS} FROM sessions s WHERE s.id = ? AND {where}", [norm, *params]).fetchone()
    if row is not None:
        return _session(row)
    suffix = like_pattern(norm)[:-1]   # '%tail': ends with the ref
    if len(norm) >= 4:
        tail_sql = "substr(s.id, -4) = ? AND s.id LIKE ? ESCAPE '\\'"
        tail_params: list[Any] = [norm[-4:], suffix]
    else:
        tail_sql, tail_params = "s.id LIKE ? ESCAPE '\\'", [suffix]
    rows = conn.execute(
        f"SELECT {_SESSION_COLS} FROM sessions s WHERE {tail_sql} AND {where} "
        "ORDER BY s.updated_at DESC, s.id DESC LIMIT ?", [*tail_params, *params, MAX_CANDIDATES + 1],
    ).fetchall()
    if not rows:
        raise SessionNotFound(ref)
    if len(rows) == 1:
        return _session(rows[0])
    total = len(rows)
    if total > MAX_CANDIDATES:
        count = conn.execute(
            f"SELECT COUNT(*) FROM sessions s WHERE {tail_sql} AND {where}", [*tail_params, *params]
        ).fetchone()
        total = count[0]
    raise AmbiguousSession(ref, [_session(r) for r in rows[:MAX_CANDIDATES]], total)


def _resume_sync(conn: sqlite3.Connection, conv_key: str, ref: str, user_id: str | None,
                 now: float) -> tuple[SessionInfo, SessionInfo | None]:
    """SessionStore.resume in the SQLite thread: (the resumed session, the one it closed)."""
    serialize(conn, "conversation", conv_key)
    conv = conn.execute("SELECT * FROM conversations WHERE conv_key = ?", (conv_key,)).fetchone()
    current = _active_sync(conn, conv_key)
    clauses: list[str] = []
    params: list[Any] = []
    same_ok = user_id is None or conn.execute(
        "SELECT 1 FROM conversation_members WHERE user_id = ? AND conv_key = ?", (user_id, conv_key)
    ).fetchone() is not None
    if same_ok:
        clauses.append("s.conv_key = ?")
        params.append(conv_key)
    cross_ok = (
        user_id is not None and conv is not None and conv["chat_type"] in PRIVATE_CHAT_TYPES
        and conn.execute(
            "SELECT 1 FROM conversation_members WHERE conv_key = ? AND user_id <> ? LIMIT 1", (conv_key, user_id)
        ).fetchone() is None
    )
    if cross_ok:
        clauses.append(
            "(s.chat_type = ? AND s.owner_id = ? AND "
            "s.conv_key IN (SELECT conv_key FROM conversation_members WHERE user_id = ?))"
        )
        params += [conv["chat_type"], user_id, user_id]
    where = "(" + " OR ".join(clauses) + ")" if clauses else "0"
    exclude = current.id if current is not None and (ref or "").strip().lower() == "last" else None
    target = _resolve_sync(conn, ref, where, params, exclude)
    if current is not None and current.id == target.id:
        return current, None
    closed = _close_sync(conn, current, now) if current is not None else None
    if target.conv_key != conv_key:   # the user's own p2p session moving into this p2p chat
        conn.execute(
            "UPDATE conversations SET active_session_id = NULL WHERE active_session_id = ?", (target.id,)
        )
        conn.execute(
            "UPDATE sessions SET conv_key = ?, chat_id = ?, thread_id = ?, chat_type = ? WHERE id = ?",
            (conv_key, conv["chat_id"], conv["thread_id"], conv["chat_type"], target.id),
        )
    conn.execute("UPDATE sessions SET closed_at = NULL, updated_at = ? WHERE id = ?", (now, target.id))
    conn.execute(
        "INSERT INTO conversations(conv_key, chat_id, thread_id, chat_type, active_session_id, updated_at) "
        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(conv_key) DO UPDATE SET "
        "active_session_id = excluded.active_session_id, updated_at = excluded.updated_at",
        (conv_key, target.chat_id, target.thread_id, target.chat_type, target.id, now),
    )
    resumed = _session(conn.execute(f"SELECT {_SESSION_COLS} FROM sessions s WHERE s.id = ?", (target.id,)).fetchone())
    return resumed, closed
