"""The reads and writes behind every console page and its JSON API (routes: bot/web/api.py).

Every memory read and write names the user in the path and goes to a store method that
filters by that user in SQL; nothing here takes a user id from anywhere else.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from aiohttp import web

from bot.agent.agent import Memory
from bot.delivery.direct import Conversations
from bot.infra.log import get_logger
from bot.web.auth import ConsoleAuth
from memory.governance.forget import forget_fact
from memory.scope import Scope
from memory.governance.stats import KnownUser, Stats

log = get_logger("ethan.console")

USER_ID = re.compile(r"^[A-Za-z0-9_.:@-]{1,128}$")
MAX_TEXT = 100_000
LIST_LIMIT = 200


@dataclass
class ConsoleDeps:
    """What the console, its API and /chat use of the running bot."""

    memory: Callable[[], Memory | None]      # None while starting (the HTTP server opens first)
    conversations: Conversations            # where the playground and /chat send messages
    bot_open_id: Callable[[], Awaitable[str]]
    auth: ConsoleAuth                       # who may use it (ETHAN_CONSOLE_TOKEN): bot/web/auth.py
    offline_model: bool = False
    # the start-up check's or the last failed turn's line naming the setting to fix ("" = fine)
    model_problem: Callable[[], str | None] = lambda: None
    is_admin: Callable[[str], bool] = lambda _open_id: False   # ETHAN_ADMINS (/chat "as_admin")


class ApiError(Exception):
    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.extra = extra


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def ok(value: Any, status: int = 200) -> web.Response:
    return web.json_response(value, status=status, dumps=_dumps)


def fail(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status, dumps=_dumps)


def check_user(user_id: str) -> str:
    if not isinstance(user_id, str) or not USER_ID.match(user_id):
        raise ApiError(400, "not a user id (an open_id such as ou_…)")
    return user_id


def _int(value: str, what: str) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ApiError(404, f"no such {what}") from None
    if n < 0 or n > 2**62:
        raise ApiError(404, f"no such {what}")
    return n


async def read_json(request: web.Request) -> dict:
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError, RecursionError):   # nested 100k deep: 400, not a 500
        raise ApiError(400, "the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body


def console_scope(user_id: str) -> Scope:
    """The scope of an edit the user makes themselves in the console (their own memory)."""
    return Scope(user_id=user_id, chat_id="", chat_type="p2p")


# --------------------------------------------------------------------------------------
# Reads and writes shared by the pages and the API
# --------------------------------------------------------------------------------------

def _asdict(obj: Any) -> dict:
    return dataclasses.asdict(obj)


def fact_dict(f: Any) -> dict:
    return _asdict(f)


def session_dict(s: Any) -> dict:
    d = _asdict(s)
    d["tail"] = s.id[-4:]
    d["is_open"] = s.closed_at is None
    return d


def episode_dict(e: Any) -> dict:
    d = dataclasses.asdict(e)
    d.pop("matched", None)
    return d


class ConsoleData:
    def __init__(self, memory: Callable[[], Memory | None]) -> None:
        self._memory = memory
        self.names: dict[str, str] = {}      # display names chosen in the playground

    @property
    def m(self) -> Memory:
        memory = self._memory()
        if memory is None:
            raise ApiError(503, "starting up; try again in a moment")
        return memory

    # -- users -------------------------------------------------------------------------
    async def users(self) -> list[dict]:
        """Everyone the bot knows of: from messages, facts, profile, rules and episodes."""
        out = [self._user_dict(u.id, u) for u in await Stats(self.m.db).known_users()]
        known = {u["id"] for u in out}
        out.extend(self._user_dict(uid, None) for uid in self.names if uid not in known)
        return out

    async def user(self, user_id: str) -> dict:
        check_user(user_id)
        return self._user_dict(user_id, await Stats(self.m.db).known_user(user_id))

    def _user_dict(self, user_id: str, u: KnownUser | None) -> dict:
        if u is None:
            return {"id": user_id, "name": self.names.get(user_id, ""), "last_seen": None, "facts": 0,
                    "procedures": 0, "profile_entries": 0, "episodes": 0, "messages": 0}
        return {"id": u.id, "name": self.names.get(u.id) or u.name, "last_seen": u.last_seen,
                "facts": u.facts, "procedures": u.procedures, "profile_entries": u.profile_entries,
                "episodes": u.episodes, "messages": u.messages}

    # -- profile -----------------------------------------------------------------------
    async def profile(self, user_id: str) -> dict:
        check_user(user_id)
        doc = await self.m.profile.read_document(user_id)
        entries = await self.m.profile.list(user_id)
        return {"user_id": user_id, "document": doc, "version": _version(doc),
                "entries": [dataclasses.asdict(e) for e in entries]}

    async def save_profile(self, user_id: str, document: Any, base: Any = None) -> dict:
        from memory.profile.store import ProfileError

        check_user(user_id)
        if not isinstance(document, str):
            raise ApiError(400, "document must be text (the whole Markdown profile)")
        if base is not None:
            current = await self.m.profile.read_document(user_id)
            if base != _version(current):
                raise ApiError(409, "the profile changed since you opened it (the bot may have learned "
                               "something); your text was not saved — reload, then apply your edit again",
                               document=current, version=_version(current))
        try:
            result = await self.m.profile.write_document(user_id, document)
        except ProfileError as e:
            raise ApiError(400, "the profile was not saved", reason=str(e)) from None
        saved = await self.profile(user_id)
        saved.update(kept=result.kept, added=result.added, removed=result.removed)
        log.info("console.profile_saved", user_id=user_id, kept=result.kept, added=result.added,
                 removed=result.removed)
        return saved

    # -- facts -------------------------------------------------------------------------
    async def facts(self, user_id: str, *, history: bool = False) -> list[dict]:
        check_user(user_id)
        return [fact_dict(f) for f in await self.m.facts.list(user_id, include_superseded=history)]

    async def add_fact(self, user_id: str, body: dict) -> dict:
        check_user(user_id)
        content, category = body.get("content"), body.get("category", "knowledge")
        if not isinstance(content, str) or not isinstance(category, str):
            raise ApiError(400, "content and category must be text")
        try:
            write = await self.m.facts.add(console_scope(user_id), content, category, source="user_edit")
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        return {"fact": fact_dict(write.fact), "action": write.action, "superseded": list(write.superseded)}

    async def update_fact(self, user_id: str, fact_id: int, body: dict) -> dict:
        check_user(user_id)
        allowed = {"content", "category", "confidence", "visibility"}
        unknown = set(body) - allowed
        if unknown:
            raise ApiError(400, f"unknown field(s): {', '.join(sorted(unknown))}; editable: {', '.join(sorted(allowed))}")
        if not body:
            raise ApiError(400, "nothing to change")
        try:
            fact = await self.m.facts.update(user_id, fact_id, **body)
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        if fact is None:
            raise ApiError(404, "no such fact for this user")
        return {"fact": fact_dict(fact)}

    async def delete_fact(self, user_id: str, fact_id: int) -> dict:
        check_user(user_id)
        # the fact and its statement in episodes, summaries and profile (memory/governance/forget.py)
        counts = await forget_fact(self.m.db, user_id, fact_id)
        if counts is None:
            raise ApiError(404, "no such fact for this user")
        log.info("console.fact_deleted", user_id=user_id, fact_id=fact_id, **counts)
        return {"deleted": fact_id, "counts": counts}

    # -- procedures --------------------------------------------------------------------
    async def procedures(self, user_id: str) -> list[dict]:
        check_user(user_id)
        return [p.to_dict() for p in await self.m.procedures.list(user_id)]

    async def add_procedure(self, user_id: str, body: dict) -> dict:
        check_user(user_id)
        rule, context = body.get("rule"), body.get("context", "")
        if not isinstance(rule, str) or not isinstance(context, str):
            raise ApiError(400, "rule and context must be text")
        try:
            proc, created = await self.m.procedures.add(console_scope(user_id), rule, context)
        except (ValueError, PermissionError) as e:
            raise ApiError(400, str(e)) from None
        return {"procedure": proc.to_dict(), "created": created}

    async def delete_procedure(self, user_id: str, proc_id: int) -> dict:
        check_user(user_id)
        try:
            deleted = await self.m.procedures.delete(console_scope(user_id), proc_id)
        except PermissionError as e:
            raise ApiError(403, str(e)) from None
        if not deleted:
            raise ApiError(404, "no such rule for this user")
        return {"deleted": proc_id}

    # -- episodes ----------------------------------------------------------------------
    async def episodes(self, user_id: str, query: str = "") -> list[dict]:
        check_user(user_id)
        store = self.m.episodes
        query = (query or "").strip()[:200]
        found = await store.search(user_id, query, limit=50) if query else await store.list(user_id, limit=LIST_LIMIT)
        return [episode_dict(e) for e in found]

    async def delete_episode(self, user_id: str, episode_id: int) -> dict:
        check_user(user_id)
        if not await self.m.episodes.delete(user_id, episode_id):
            raise ApiError(404, "no such episode for this user")
        return {"deleted": episode_id}

    # -- reminders ---------------------------------------------------------------------
    async def reminders(self, user_id: str) -> list[dict]:
        """The user's reminders (active first, then recent finished ones), with their next time
        in the user's zone and the last deliveries."""
        from memory.schedules.recurrence import local_iso
        from memory.schedules.store import ScheduleStore

        check_user(user_id)
        store = ScheduleStore(self.m.db)
        out = []
        for j in await store.for_owner(user_id, active_only=False, limit=LIST_LIMIT):
            d = _asdict(j)
            d["next_local"] = local_iso(j.next_due, j.tz) if j.next_due is not None else ""
            d["deliveries"] = [_asdict(x) for x in await store.deliveries(j.id, limit=5)]
            out.append(d)
        return out

    async def cancel_reminder(self, user_id: str, job_id: int) -> dict:
        from memory.schedules.store import ScheduleStore

        check_user(user_id)
        if not await ScheduleStore(self.m.db).cancel(job_id, owner_id=user_id):    # this user's only
            raise ApiError(404, "no active reminder with this id for this user")
        log.info("reminder.cancelled", schedule_id=job_id, user_id=user_id, chat_id="", via="console")
        return {"cancelled": job_id}

    # -- sessions ----------------------------------------------------------------------
    async def sessions(self, user_id: str = "", query: str = "") -> list[dict]:
        from memory.sessions.search import EmptyQuery

        user = check_user(user_id) if user_id else None
        query = (query or "").strip()[:200]
        store = self.m.sessions
        if query:
            try:
                hits = await store.search(query, user_id=user, limit=50)
            except EmptyQuery:
                hits = []
            except ValueError as e:
                raise ApiError(400, str(e)) from None
            out = []
            for h in hits:
                d = session_dict(h.session)
                d.update(snippet=h.snippet, matches=h.matches, message_id=h.message_id)
                out.append(d)
            return out
        return [session_dict(s) for s in await store.list(user_id=user, limit=LIST_LIMIT)]

    async def session(self, session_id: str, user_id: str = "") -> dict:
        from memory.sessions.records import AmbiguousSession, SessionNotFound

        if not re.match(r"^[A-Za-z0-9_]{1,64}$", session_id or ""):
            raise ApiError(404, "no such session")
        store = self.m.sessions
        if user_id:
            check_user(user_id)
            try:
                info = await store.resolve(session_id, user_id=user_id)
            except (SessionNotFound, AmbiguousSession):
                info = None
            if info is not None and info.id != session_id:
                info = None
        else:
            info = await store.get(session_id)
        if info is None:
            raise ApiError(404, "no such session" + (" for this user" if user_id else ""))
        messages = await store.messages(info.id)
        context: dict[str, Any] = {}
        try:
            view = await self.m.working.view(info.id)
            context = {"long_term": view.long_term, "summary": view.summary, "hot_turns": len(view.hot_turns),
                       "pending": view.pending, "warm_turns": view.warm_turns, "warm_rows": view.warm_rows}
        except Exception as e:  # noqa: BLE001 — the messages are still worth showing
            context = {"error": f"{type(e).__name__}: {e}"[:200]}
        return {"session": session_dict(info), "messages": [_asdict(m) for m in messages], "context": context}

    async def delete_session(self, session_id: str) -> dict:
        from memory.governance.erase import delete_session

        counts = await delete_session(self.m.db, session_id) if re.match(r"^[A-Za-z0-9_]{1,64}$",
                                                                          session_id or "") else None
        if counts is None:
            raise ApiError(404, "no such session")
        return {"deleted": session_id, "removed": counts}


def _version(document: str) -> str:
    import hashlib

    return hashlib.sha256(document.encode()).hexdigest()[:16]
