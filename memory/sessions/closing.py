"""Closing sessions: the units that end a conversation's active session, run in the database
thread by ``SessionStore`` (``close``, ``close_active``, ``close_idle``, ``close_all``, the idle
close on ``append_user``) and by a resume (the session it replaces).

Apart from the store so that the store and memory/sessions/resume.py share them without
importing each other.
"""

from __future__ import annotations

import builtins
import sqlite3
from typing import Any, Sequence

from storage import serialize
from memory.sessions.records import _SESSION_COLS, SessionInfo, SessionNotFound, _session


# Plain functions run in the SQLite thread by Database.read/write (one round trip each).
def _session_row(conn: sqlite3.Connection, session_id: str) -> Any:
    return conn.execute(f"SELECT {_SESSION_COLS} FROM sessions s WHERE s.id = ?", (session_id,)).fetchone()


def _active_sync(conn: sqlite3.Connection, conv_key: str) -> SessionInfo | None:
    row = conn.execute(
        f"SELECT {_SESSION_COLS} FROM conversations c JOIN sessions s ON s.id = c.active_session_id "
        "WHERE c.conv_key = ? AND s.closed_at IS NULL",
        (conv_key,),
    ).fetchone()
    return _session(row) if row else None


def _close_sync(conn: sqlite3.Connection, session: SessionInfo, now: float) -> SessionInfo:
    serialize(conn, "conversation", session.conv_key)   # against an append choosing this session
    conn.execute("UPDATE sessions SET closed_at = ? WHERE id = ?", (now, session.id))
    conn.execute(
        "UPDATE conversations SET active_session_id = NULL, updated_at = ? WHERE active_session_id = ?",
        (now, session.id),
    )
    return _session(_session_row(conn, session.id))


def _close_one_sync(conn: sqlite3.Connection, session_id: str, now: float) -> SessionInfo | None:
    row = _session_row(conn, session_id)
    if row is None:
        raise SessionNotFound(session_id)
    session = _session(row)
    return _close_sync(conn, session, now) if session.is_open else None


def _close_active_sync(conn: sqlite3.Connection, conv_key: str, now: float) -> SessionInfo | None:
    current = _active_sync(conn, conv_key)
    return _close_sync(conn, current, now) if current is not None else None


def _close_where_sync(
    conn: sqlite3.Connection, where: str, params: Sequence[Any], now: float
) -> builtins.list[SessionInfo]:
    rows = conn.execute(
        f"SELECT {_SESSION_COLS} FROM sessions s WHERE s.closed_at IS NULL AND {where} ORDER BY s.updated_at",
        params,
    ).fetchall()
    return [_close_sync(conn, _session(r), now) for r in rows]
