"""Layer 1: sessions — every conversation's history in SQLite, listable, searchable, resumable.

A *conversation* is a Lark chat (or a topic thread in it), named by
``memory.scope.conversation_key``; it has at most one *active* session. A session is
written to the database only together with its first user message, in one transaction,
so an empty session never reaches the database (the spec's lazy persistence).

Lifecycle (DESIGN.md §4): a session ends on ``/new`` (``close_active``), on resuming
another session (``resume``), after ``idle_timeout`` without messages (``append_user``
closes it on the way, ``close_idle`` sweeps), and on shutdown (``close_all``). Every
close is reported to the listeners registered with ``add_close_listener`` (the episodic
layer writes its episode there), after the closing transaction has committed.

Visibility: a user sees the sessions of the conversations they took part in, i.e. sent a
message in (table ``conversation_members``, kept by a trigger on ``messages``). In a
group, pass ``conv_key`` to ``search``/``list`` as well, so that a user's p2p history is
never shown to the group.

Search: ``search`` (memory/sessions/search.py: the FTS5 trigram index and its LIKE fallback).

Resolving and resuming: memory/sessions/resume.py; closing: memory/sessions/closing.py; the
values it returns: memory/sessions/records.py.
"""

from __future__ import annotations

import builtins
import inspect
import json
import logging
import random
import sqlite3
import time
from typing import Any, Awaitable, Callable, Iterable, Sequence

from storage import Database, DatabaseError, execute_last, fetch_all, serialize
from memory.sessions.closing import _close_active_sync, _close_one_sync, _close_sync, _close_where_sync, _session_row
from memory.sessions.records import (
    _MESSAGE_COLS,
    _MESSAGE_RETURNING,
    _SESSION_COLS,
    _SESSION_FIELDS,
    AppendResult,
    MessagesErased,
    SessionInfo,
    SessionNotFound,
    StoredAnswer,
    StoredMessage,
    _message,
    _session,
    make_title,
)
from memory.sessions.resume import _resolve_sync, _resume_sync
from memory.sessions.search import SCAN_LIMIT, SearchHit, search_sessions
from memory.scope import Scope
from memory.working.turns import MAX_ID

log = logging.getLogger(__name__)

DEFAULT_IDLE_TIMEOUT = 6 * 3600
_TAIL_ATTEMPTS = 16        # tries for a session id whose 4-hex tail no other session has
_ID_ATTEMPTS = 256

CloseListener = Callable[["SessionInfo"], "Awaitable[None] | None"]


# append_user's first statement: the conversation's open active session (NULLs when none) and
# whether the Lark message is stored already (dup_id), in one round trip.
_ACTIVE_OR_DUPLICATE_SQL = (
    f"SELECT {_SESSION_COLS}, (SELECT d.id FROM messages d WHERE d.lark_message_id = ? AND d.role = 'user'"
    " LIMIT 1) AS dup_id FROM (SELECT 1 AS one) x LEFT JOIN conversations c ON c.conv_key = ?"
    " LEFT JOIN sessions s ON s.id = c.active_session_id AND s.closed_at IS NULL"
)
# append_user's last statement: the conversation points at the session, and returns the
# session's row (each column a subquery: RETURNING names the upserted table's columns only).
_POINT_CONVERSATION_SQL = (
    "INSERT INTO conversations(conv_key, chat_id, thread_id, chat_type, active_session_id, updated_at) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(conv_key) DO UPDATE SET "
    "active_session_id = excluded.active_session_id, chat_type = excluded.chat_type, "
    "updated_at = excluded.updated_at RETURNING "
    + ", ".join(f"(SELECT s.{c} FROM sessions s WHERE s.id = ?) AS {c}" for c in _SESSION_FIELDS)
)
_MEMBER_SQL = "s.conv_key IN (SELECT conv_key FROM conversation_members WHERE user_id = ?)"


def _append_assistant_sync(
    conn: sqlite3.Connection, session_id: str, content: str, calls: str | None, now: float,
    reply_to: str | None, together: tuple[str, ...],
) -> StoredMessage:
    # One statement (the session's existence, the insert, the stored row), the unit's whole
    # transaction: on PostgreSQL one round trip, and this runs for every answer. The message it
    # replied to goes in lark_message_id (unique for user rows only): a redelivery of that
    # message replays this answer; another message it covered does not (``answer_of``).
    insert = ("INSERT INTO messages(session_id, role, content, tool_calls, lark_message_id, created_at)"
              " SELECT ?, 'assistant', ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM sessions WHERE id = ?)"
              f" RETURNING {_MESSAGE_RETURNING}")
    params = (session_id, content, calls, reply_to, now, session_id)
    row = (conn.execute(insert, params) if together else execute_last(conn, insert, params)).fetchone()
    if row is None:
        raise SessionNotFound(session_id)
    if together:
        # The other messages this answer answered (their turns failed after storing them) are
        # finished with it, in this unit: their redelivery must not ask the model again
        # (issue 45 N14). The reply to ``reply_to`` carries the answer; its own inbox row is
        # finished once that reply is delivered (bot/core/handler.py).
        marks = ",".join("?" * len(together))
        execute_last(conn, "UPDATE inbox SET status = 'done', note = ?, done_at = ?"
                           f" WHERE dedup_key IN ({marks}) AND status = 'pending'",
                     (f"answered with {reply_to or ''}"[:500], now, *(f"msg:{m}" for m in together)))
    return _message(row)


class SessionStore:
    def __init__(
        self,
        db: Database,
        *,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        if idle_timeout <= 0:
            raise ValueError("idle_timeout must be positive")
        self.db = db
        self.idle_timeout = float(idle_timeout)
        self.clock = clock
        self._rng = rng or random.SystemRandom()
        self._listeners: list[CloseListener] = []
        self.scan_limit = SCAN_LIMIT

    # -- listeners -----------------------------------------------------------------------
    def add_close_listener(self, fn: CloseListener) -> None:
        """``fn(session_info)`` (sync or async) runs after every close has committed.

        It is awaited by the closing call, so keep it short (enqueue work, don't do it);
        an exception in it is logged and never undoes or blocks the close.
        """
        self._listeners.append(fn)

    def remove_close_listener(self, fn: CloseListener) -> None:
        self._listeners = [f for f in self._listeners if f is not fn]

    async def _notify(self, closed: Iterable[SessionInfo]) -> None:
        for info in closed:
            for fn in list(self._listeners):
                try:
                    result = fn(info)
                    if inspect.isawaitable(result):
                        await result
                except Exception:  # a listener must not break the caller
                    log.exception("session close listener %r failed for %s", fn, info.id)

    # -- reads ---------------------------------------------------------------------------
    async def get(self, session_id: str) -> SessionInfo | None:
        row = await self.db.fetchone(f"SELECT {_SESSION_COLS} FROM sessions s WHERE s.id = ?", (session_id,))
        return _session(row) if row else None

    async def active(self, conv_key: str) -> SessionInfo | None:
        """The conversation's open session, if any (even when idle past the timeout:
        the next ``append_user`` or ``close_idle`` closes it)."""
        row = await self.db.fetchone(
            f"SELECT {_SESSION_COLS} FROM conversations c JOIN sessions s ON s.id = c.active_session_id "
            "WHERE c.conv_key = ? AND s.closed_at IS NULL",
            (conv_key,),
        )
        return _session(row) if row else None

    async def last_user_text(self, conv_key: str, sender_id: str) -> str | None:
        """What ``sender_id`` last said in the conversation's open session (None if nothing):
        the language a command answers in follows it."""
        row = await self.db.fetchone(
            "SELECT m.content FROM conversations c JOIN sessions s ON s.id = c.active_session_id"
            " JOIN messages m ON m.session_id = s.id"
            " WHERE c.conv_key = ? AND s.closed_at IS NULL AND m.sender_id = ? AND m.role = 'user'"
            " ORDER BY m.id DESC LIMIT 1",
            (conv_key, sender_id),
        )
        return row["content"] if row else None

    async def messages(
        self, session_id: str, after_id: int = 0, limit: int | None = None
    ) -> list[StoredMessage]:
        """Messages of a session in order, those with id > ``after_id``, at most ``limit``."""
        sql = f"SELECT {_MESSAGE_COLS} FROM messages m WHERE m.session_id = ? AND m.id > ? ORDER BY m.id"
        params: list[Any] = [session_id, after_id]
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        return [_message(r) for r in await self.db.fetchall(sql, params)]

    async def list(
        self, *, conv_key: str | None = None, user_id: str | None = None, limit: int | None = 20
    ) -> builtins.list[SessionInfo]:
        """Most recently active first; ``user_id`` restricts to sessions the user can see."""
        where, params = self._filters(conv_key, user_id)
        sql = f"SELECT {_SESSION_COLS} FROM sessions s WHERE {where} ORDER BY s.updated_at DESC, s.id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        return [_session(r) for r in await self.db.fetchall(sql, params)]

    @staticmethod
    def _filters(conv_key: str | None, user_id: str | None) -> tuple[str, builtins.list[Any]]:
        clauses, params = ["1=1"], []
        if conv_key is not None:
            clauses.append("s.conv_key = ?")
            params.append(conv_key)
        if user_id is not None:
            clauses.append(_MEMBER_SQL)
            params.append(user_id)
        return " AND ".join(clauses), params

    # -- writes: messages ----------------------------------------------------------------
    async def append_user(
        self,
        scope: Scope,
        content: str,
        *,
        sender_name: str = "",
        model: str = "",
        lark_message_id: str | None = None,
    ) -> AppendResult:
        """Store a user message in the conversation's active session (starting one if
        needed) and commit it before returning. A ``lark_message_id`` already stored
        returns the stored message with ``duplicate=True`` and writes nothing."""
        if not isinstance(content, str) or not content.strip():
            raise ValueError("empty message: nothing to store")
        now = self.clock()
        # One write transaction in the SQLite thread, one round trip: duplicate check, idle
        # close, session creation and the message itself (this runs for every message).
        result = await self.db.write(
            self._append_user_sync, scope, content, sender_name, model, lark_message_id, now
        )
        if result.closed is not None:
            await self._notify([result.closed])
        return result

    def _append_user_sync(
        self, conn: sqlite3.Connection, scope: Scope, content: str, sender_name: str, model: str,
        lark_message_id: str | None, now: float,
    ) -> AppendResult:
        conv_key = scope.conv_key
        # The conversation's active session is read, maybe closed or created, then written:
        # one unit per conversation at a time (replicas too); other conversations never wait.
        serialize(conn, "conversation", conv_key)
        closed: SessionInfo | None = None
        created = False
        row = conn.execute(_ACTIVE_OR_DUPLICATE_SQL, (lark_message_id, conv_key)).fetchone()
        if row["dup_id"] is not None:
            message = _message(conn.execute(f"SELECT {_MESSAGE_COLS} FROM messages m WHERE m.id = ?",
                                            (row["dup_id"],)).fetchone())
            return AppendResult(_session(_session_row(conn, message.session_id)), message,
                                created=False, duplicate=True, closed=None)

        current = _session(row) if row["id"] is not None else None
        if current is not None and now - current.updated_at > self.idle_timeout:
            closed = _close_sync(conn, current, now)
            current = None
        if current is None:
            session_id = self._new_id_sync(conn, now)
            conn.execute(
                "INSERT INTO sessions(id, title, model, conv_key, chat_id, thread_id, chat_type, owner_id, "
                "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (session_id, make_title(content), model, conv_key, scope.chat_id, scope.thread_id,
                 scope.chat_type, scope.user_id, now, now),
            )
            created = True
        else:
            session_id = current.id
            if model and not current.model:
                conn.execute("UPDATE sessions SET model = ? WHERE id = ?", (model, session_id))
        message = _message(conn.execute(
            "INSERT INTO messages(session_id, role, content, sender_id, sender_name, lark_message_id, created_at) "
            f"VALUES (?, 'user', ?, ?, ?, ?, ?) RETURNING {_MESSAGE_RETURNING}",
            (session_id, content, scope.user_id, sender_name, lark_message_id, now),
        ).fetchone())
        # The session as the message's triggers left it, read by the last statement (one round
        # trip fewer than a SELECT of its own), which ends the unit (its COMMIT goes with it).
        session = _session(execute_last(
            conn, _POINT_CONVERSATION_SQL,
            (conv_key, scope.chat_id, scope.thread_id, scope.chat_type, session_id, now)
            + (session_id,) * len(_SESSION_FIELDS),
        ).fetchone())
        return AppendResult(session, message, created=created, duplicate=False, closed=closed)

    async def append_assistant(
        self, session_id: str, content: str, *, tool_calls: Any | None = None,
        reply_to: str | None = None, together: Sequence[str] = (),
    ) -> StoredMessage:
        """Store the bot's reply in ``session_id`` (tool calls as JSON). ``reply_to``: the
        transport's id of the message it replies to; ``together``: the ids of the other
        messages it answered (read merged with that one), whose inbox rows are finished in the
        same transaction."""
        if not isinstance(content, str):
            raise TypeError("content must be a string")
        calls = None if tool_calls is None else json.dumps(tool_calls, ensure_ascii=False)
        return await self.db.write(_append_assistant_sync, session_id, content, calls, self.clock(),
                                   reply_to, tuple(together))

    async def answer_of(self, message: StoredMessage) -> StoredAnswer:
        """How ``message`` (a stored user message) was answered: the first answer after it, and
        whether it replied to this message or to a later one it was read together with; or,
        with none yet, the user messages stored after it. Read on a redelivery only."""
        rows = [_message(r) for r in await self.db.fetchall(
            f"SELECT {_MESSAGE_COLS} FROM messages m WHERE m.session_id = ? AND m.id > ? AND m.id <= COALESCE("
            "(SELECT MIN(a.id) FROM messages a WHERE a.session_id = ? AND a.id > ? AND a.role = 'assistant'),"
            " ?) ORDER BY m.id",
            (message.session_id, message.id, message.session_id, message.id, MAX_ID))]
        users = tuple(r for r in rows if r.role == "user" and r.tool_call_id is None)
        answer = rows[-1] if rows and rows[-1].role == "assistant" else None
        if answer is None:
            return StoredAnswer(None, False, users)
        # An answer stored before its reply was recorded on it: its own when nothing came between.
        own = (answer.lark_message_id == message.lark_message_id if answer.lark_message_id
               else not users)
        return StoredAnswer(answer, own)

    def _new_id_sync(self, conn: sqlite3.Connection, now: float) -> str:
        """``s_YYYYMMDD_HHMM_xxxx`` (local time, random hex). Unique; the tail is kept unique
        too while that is easy, so that short ids stay unambiguous."""
        stamp = time.strftime("%Y%m%d_%H%M", time.localtime(now))
        for attempt in range(_ID_ATTEMPTS):
            tail = f"{self._rng.getrandbits(16):04x}"
            session_id = f"s_{stamp}_{tail}"
            if attempt < _TAIL_ATTEMPTS:
                taken = conn.execute("SELECT 1 FROM sessions WHERE substr(id, -4) = ? LIMIT 1", (tail,)).fetchone()
            else:
                taken = conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if taken is None:
                return session_id
        raise DatabaseError("could not allocate a new session id (too many sessions this minute)")

    # -- writes: lifecycle ---------------------------------------------------------------
    async def close(self, session_id: str) -> SessionInfo | None:
        """Close a session; returns it, or None if it was already closed."""
        closed = await self.db.write(_close_one_sync, session_id, self.clock())
        if closed is not None:
            await self._notify([closed])
        return closed

    async def close_active(self, conv_key: str) -> SessionInfo | None:
        """``/new``: close the conversation's active session (the next message starts one)."""
        closed = await self.db.write(_close_active_sync, conv_key, self.clock())
        if closed is not None:
            await self._notify([closed])
        return closed

    async def close_idle(self) -> builtins.list[SessionInfo]:
        """Close every open session idle for longer than ``idle_timeout``."""
        now = self.clock()
        return await self._close_where("s.updated_at < ?", (now - self.idle_timeout,), now)

    async def close_all(self) -> builtins.list[SessionInfo]:
        """Shutdown: close every open session."""
        return await self._close_where("1=1", (), self.clock())

    async def _close_where(self, where: str, params: Sequence[Any], now: float) -> builtins.list[SessionInfo]:
        closed = await self.db.write(_close_where_sync, where, params, now)
        await self._notify(closed)
        return closed

    async def delete(self, session_id: str) -> bool:
        """Delete a session and its messages (no close notification)."""
        async with self.db.transaction() as tx:
            cur = await tx.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
            deleted = cur.rowcount > 0
            await cur.close()
        return deleted

    async def cleanup_empty(self) -> int:
        """Delete sessions that have no messages (run at start and at shutdown)."""
        async with self.db.transaction() as tx:
            cur = await tx.execute(
                "DELETE FROM sessions WHERE NOT EXISTS (SELECT 1 FROM messages m WHERE m.session_id = sessions.id)"
            )
            n = cur.rowcount
            await cur.close()
        return n

    async def delete_user_messages(self, user_id: str) -> MessagesErased:
        """Admin erase: remove the user's messages and the bot's replies to them (the
        assistant messages that follow one of their messages), drop sessions left without
        a user message, re-title and re-own the sessions that remain, forget membership."""
        if not user_id:
            raise ValueError("user_id is required")
        async with self.db.transaction() as tx:
            sids = [r[0] for r in await fetch_all(
                tx, "SELECT DISTINCT session_id FROM messages WHERE sender_id = ? AND role = 'user'", (user_id,)
            )]
            ids_json = json.dumps(sids)
            cur = await tx.execute(
                "DELETE FROM messages WHERE role = 'assistant' "
                "AND session_id IN (SELECT value FROM json_each(?)) "
                "AND (SELECT p.sender_id FROM messages p WHERE p.session_id = messages.session_id "
                "     AND p.role = 'user' AND p.id < messages.id ORDER BY p.id DESC LIMIT 1) = ?",
                (ids_json, user_id),
            )
            removed = cur.rowcount
            await cur.close()
            cur = await tx.execute("DELETE FROM messages WHERE sender_id = ? AND role = 'user'", (user_id,))
            removed += cur.rowcount
            await cur.close()
            cur = await tx.execute(
                "DELETE FROM sessions WHERE id IN (SELECT value FROM json_each(?)) AND NOT EXISTS "
                "(SELECT 1 FROM messages m WHERE m.session_id = sessions.id AND m.role = 'user')",
                (ids_json,),
            )
            sessions_removed = cur.rowcount
            await cur.close()
            remaining = await fetch_all(
                tx,
                "SELECT s.id, (SELECT m.content FROM messages m WHERE m.session_id = s.id AND m.role = 'user'"
                "  ORDER BY m.id LIMIT 1) AS first, (SELECT m.sender_id FROM messages m WHERE m.session_id = s.id"
                "  AND m.role = 'user' ORDER BY m.id LIMIT 1) AS sender "
                "FROM sessions s WHERE s.id IN (SELECT value FROM json_each(?))",
                (ids_json,),
            )
            for row in remaining:
                content, sender = row["first"] or "", row["sender"] or ""
                await tx.execute(
                    "UPDATE sessions SET title = ?, owner_id = CASE WHEN owner_id = ? THEN ? ELSE owner_id END "
                    "WHERE id = ?",
                    (make_title(content), user_id, sender, row["id"]),
                )
            await tx.execute("DELETE FROM conversation_members WHERE user_id = ?", (user_id,))
        return MessagesErased(messages=removed, sessions=sessions_removed)

    # -- resolve and resume --------------------------------------------------------------
    async def resolve(self, ref: str, *, user_id: str | None = None) -> SessionInfo:
        """A session by full id, unique tail (``d139``) or ``last`` (the most recently
        active session the user can see). Raises SessionNotFound / AmbiguousSession."""
        where, params = self._filters(None, user_id)
        return await self.db.read(_resolve_sync, ref, where, params)

    async def resume(self, conv_key: str, ref: str, *, user_id: str | None) -> SessionInfo:
        """Make a session the conversation's active one: close the current active session
        (listeners are notified), re-open the resumed one. ``ref`` as in ``resolve``;
        ``last`` means the most recent resumable session other than the active one.

        Resumable: the conversation's own sessions, if ``user_id`` took part in it (or is
        None: the operator); and in a one-person p2p chat, the p2p sessions the same user
        started in another p2p conversation of theirs (the session moves here). Anything
        else raises SessionNotFound, as an unknown id does."""
        resumed, closed = await self.db.write(_resume_sync, conv_key, ref, user_id, self.clock())
        if closed is not None:
            await self._notify([closed])
        return resumed

    # -- search (memory/sessions/search.py) ------------------------------------------------
    async def search(
        self,
        query: str,
        *,
        user_id: str | None = None,
        conv_key: str | None = None,
        limit: int = 20,
        method: str = "auto",
    ) -> builtins.list[SearchHit]:
        """Sessions whose messages or title contain ``query`` (literally), best first; see
        ``memory.sessions.search.search_sessions``. ``user_id``: only sessions of conversations
        the user took part in; ``conv_key``: only that conversation (pass both in a group)."""
        where, params = self._filters(conv_key, user_id)
        return await search_sessions(self.db, query, where=where, params=params, limit=limit, method=method,
                                     scan_limit=self.scan_limit, session_cols=_SESSION_COLS,
                                     to_session=_session)
