"""``ethan session list|show|delete|search``: the stored sessions (layer 1), for an operator.

The table of sessions, one session's messages and tool round trips, deletion after a question
(and what it removed: ``deleted_counts``), the full-text search; the id of a session resolved
from its last characters or ``last``. Apart from the other subcommands: one command family.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from bot.core.text import ambiguous_session, short, when
from bot.infra.cli.runner import EXIT_FAIL, EXIT_OK, SHOW_CHARS, CliError, _open, _user
from bot.infra.config import Settings

def _when(ts: float | None, *, seconds: bool = False) -> str:
    return when(ts, "%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M", empty="-")


def _width(text: str) -> int:
    import unicodedata

    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _pad(text: str, width: int) -> str:
    return text + " " * max(0, width - _width(text))


async def _resolve(store: Any, ref: str, user: str | None):
    from memory.sessions.records import AmbiguousSession, SessionNotFound

    try:
        return await store.resolve(ref, user_id=user)
    except AmbiguousSession as e:
        raise CliError(ambiguous_session(ref, e, empty_time="-")) from None
    except SessionNotFound:
        who = f" of {user}" if user else ""
        if (ref or "").strip().lower() == "last":
            raise CliError(f"ethan: there is no session{who} yet") from None
        raise CliError(f"ethan: no session{who} matches {ref!r} (see: ethan session list)") from None


def _chat_label(s: Any) -> str:
    return f"{s.chat_type} {s.chat_id}" + (f"#{s.thread_id}" if s.thread_id else "")


# --------------------------------------------------------------------------------------
# ethan session …
# --------------------------------------------------------------------------------------

async def _session_list(settings: Settings, args: argparse.Namespace) -> int:
    from memory.sessions.store import SessionStore

    user = _user(args.user) if args.user is not None else None
    db = await _open(settings)
    try:
        sessions = await SessionStore(db).list(user_id=user, limit=args.limit)
    finally:
        await db.close()
    if not sessions:
        print("no sessions" + (f" for {user}" if user else ""))
        return EXIT_OK
    rows = [("ID", "UPDATED", "MSGS", "CHAT", "TITLE")]
    for s in sessions:
        rows.append((s.id + ("" if s.closed_at else " *"), _when(s.updated_at), str(s.message_count),
                     short(_chat_label(s), 40), short(s.title, 40)))
    widths = [max(_width(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        cells = [_pad(r[0], widths[0]), _pad(r[1], widths[1]), r[2].rjust(widths[2]), _pad(r[3], widths[3]), r[4]]
        print("  ".join(cells).rstrip())
    if any(s.closed_at is None for s in sessions):
        print("(* open: the conversation's current session)")
    return EXIT_OK


async def _session_show(settings: Settings, args: argparse.Namespace) -> int:
    from memory.sessions.store import SessionStore

    user = _user(args.user) if args.user is not None else None
    db = await _open(settings)
    try:
        store = SessionStore(db)
        s = await _resolve(store, args.id, user)
        messages = await store.messages(s.id)
    finally:
        await db.close()
    print(f"session  {s.id}")
    print(f"title    {s.title}")
    print(f"chat     {_chat_label(s)}")
    print(f"owner    {s.owner_id}")
    print(f"model    {s.model or '-'}")
    print(f"created  {_when(s.created_at, seconds=True)}")
    print(f"updated  {_when(s.updated_at, seconds=True)}")
    print(f"status   {'open' if s.closed_at is None else 'closed ' + _when(s.closed_at, seconds=True)}")
    print(f"messages {s.message_count} ({s.user_turns} from users)")
    print()
    for m in messages:
        who = m.role
        if m.role == "user" and (m.sender_name or m.sender_id):
            who += f" ({m.sender_name or m.sender_id})"
        for b in m.tool_calls or ():    # the tool round trips that led to this answer (neutral shape)
            if isinstance(b, dict) and b.get("type") == "tool_use":
                args = json.dumps(b.get("input") or {}, ensure_ascii=False)
                print(f"    → tool {b.get('name')}({short(args, SHOW_CHARS)})")
            elif isinstance(b, dict) and b.get("type") == "tool_result":
                mark = "error" if b.get("is_error") else "result"
                print(f"    ← {mark}: {short(str(b.get('content', '')), SHOW_CHARS)}")
        print(f"[{_when(m.created_at, seconds=True)}] {who}: {short(m.content, SHOW_CHARS)}")
    return EXIT_OK


async def _session_delete(settings: Settings, args: argparse.Namespace) -> int:
    from memory.sessions.store import SessionStore

    user = _user(args.user) if args.user is not None else None
    if (args.id or "").strip().lower() == "last":
        raise CliError("ethan: name the session to delete by its id (not 'last')")
    db = await _open(settings)
    try:
        store = SessionStore(db)
        s = await _resolve(store, args.id, user)
        if not args.yes:
            question = (f"Delete session {s.id} “{short(s.title, 40)}” ({s.message_count} messages)? "
                        "This cannot be undone. [y/N] ")
            answer = await asyncio.to_thread(_ask, question)
            if answer not in ("y", "yes"):
                print("not deleted")
                return EXIT_FAIL
        from memory.governance.erase import delete_session

        counts = await delete_session(db, s.id)
    finally:
        await db.close()
    if counts is None:
        raise CliError(f"ethan: session {s.id} was already gone", EXIT_FAIL)
    print(f"deleted session {s.id} ({deleted_counts(counts)})")
    return EXIT_OK


def deleted_counts(c: dict[str, int]) -> str:
    """What a session's deletion removed, for whoever deleted it."""
    return (f"{c['messages']} messages, {c['episodes']} episodes, {c['summaries']} summaries, "
            f"{c['facts']} facts and {c.get('profile_entries', 0)} profile entries learned only there")


def _ask(question: str) -> str:
    sys.stderr.write(question)
    sys.stderr.flush()
    line = sys.stdin.readline()
    if not line:
        sys.stderr.write("\n")
    return line.strip().lower()


async def _session_search(settings: Settings, args: argparse.Namespace) -> int:
    from memory.sessions.store import SessionStore

    user = _user(args.user) if args.user is not None else None
    query = " ".join(args.query).strip()
    if not query:
        raise CliError("ethan: empty query: type a word or phrase to search for")
    db = await _open(settings)
    try:
        try:
            hits = await SessionStore(db).search(query, user_id=user, limit=args.limit)
        except ValueError as e:
            raise CliError(f"ethan: {e}") from None
    finally:
        await db.close()
    if not hits:
        print(f"no session matches {query!r}")
        return EXIT_OK
    for h in hits:
        s = h.session
        print(f"{s.id}  {_when(s.updated_at)}  {short(s.title, 40)}")
        print(f"    {h.snippet}" + (f"  ({h.matches} messages)" if h.matches > 1 else ""))
    return EXIT_OK


SESSION_ACTIONS = {"list": _session_list, "show": _session_show, "delete": _session_delete,
                   "search": _session_search}
