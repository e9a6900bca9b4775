"""The console's JSON API (``/api/...``) and the reads and writes behind every console page.

Every memory read and write names the user in the path and goes to a store method that
filters by that user in SQL; nothing here takes a user id from anywhere else. The
playground feeds a real Lark event through the same intake, dispatcher, handler, agent and
memory as Lark does; only the reply object is the console's (registered in
``ethan.replies.waiting`` under the message id, claimed by ``EthanApp._make_reply``).

Endpoints are listed in docs/console.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import time
import uuid
from typing import Any

from aiohttp import web

from bot.log import get_logger
from memory.scope import Scope, conversation_key

log = get_logger("ethan.console")

USER_ID = re.compile(r"^[A-Za-z0-9_.:@-]{1,128}$")
PLAYGROUND_USER = re.compile(r"^ou_[A-Za-z0-9_-]{1,100}$")
MAX_NAME = 64
MAX_TEXT = 100_000
GROUP_CHAT_ID = "oc_console_group"
P2P_CHAT_PREFIX = "oc_console_p2p_"
EXTRA_WAIT = 15.0            # seconds beyond the reply deadline before the playground gives up
LIST_LIMIT = 200


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
# The playground
# --------------------------------------------------------------------------------------

class PlaygroundReply:
    """A Reply (bot/reply.py) that keeps what the agent gave it, for one HTTP request."""

    def __init__(self) -> None:
        self.done = asyncio.Event()
        self.text: str | None = None
        self.latest = ""
        self.partials = 0
        self.memory: dict | None = None
        self.tools: list[dict] | None = None     # filled only if the agent reports its tool calls
        self.working_shown = False
        self.started = time.monotonic()
        self.first_text_ms: int | None = None

    async def working(self) -> None:
        self.working_shown = True

    async def stream(self, text_so_far: str) -> None:
        self.partials += 1
        self.latest = text_so_far
        if self.first_text_ms is None:
            self.first_text_ms = int((time.monotonic() - self.started) * 1000)

    async def finish(self, text: str) -> None:
        self.text = text
        self.done.set()

    def show_tools(self, tools: Any) -> None:
        """Optional hook: the memory tools the model called for this answer (name, is_error, result)."""
        try:
            self.tools = [{"name": str(t.get("name", "")), "is_error": bool(t.get("is_error")),
                           "result": str(t.get("result", ""))[:500]} for t in tools]
        except Exception:  # noqa: BLE001
            self.tools = None

    def show_memory(self, blocks: Any) -> None:
        try:
            self.memory = blocks.as_dict()
        except Exception as e:  # noqa: BLE001 — the panel must never break a reply
            self.memory = {"error": f"{type(e).__name__}: {e}"[:200]}


def p2p_chat_id(user_id: str) -> str:
    return P2P_CHAT_PREFIX + re.sub(r"[^A-Za-z0-9_]", "_", user_id)


def build_event(*, user_id: str, text: str, chat: str, mention: bool, bot_open_id: str,
                message_id: str, now: float | None = None, bot_name: str = "Ethan") -> dict:
    """A schema 2.0 ``im.message.receive_v1`` event, as Lark would deliver it."""
    ms = str(int((now if now is not None else time.time()) * 1000))
    mentions = None
    content = text
    if chat == "group" and mention:
        mentions = [{"key": "@_user_1", "id": {"open_id": bot_open_id, "union_id": "", "user_id": ""},
                     "name": bot_name, "tenant_key": "console"}]
        content = "@_user_1 " + text
    return {
        "schema": "2.0",
        "header": {"event_id": "ev_console_" + uuid.uuid4().hex, "event_type": "im.message.receive_v1",
                   "create_time": ms, "token": "", "app_id": "console", "tenant_key": "console"},
        "event": {
            "sender": {"sender_id": {"open_id": user_id, "union_id": "", "user_id": ""},
                       "sender_type": "user", "tenant_key": "console"},
            "message": {
                "message_id": message_id, "root_id": "", "parent_id": "", "create_time": ms,
                "update_time": ms, "chat_id": p2p_chat_id(user_id) if chat == "p2p" else GROUP_CHAT_ID,
                "thread_id": "", "chat_type": chat, "message_type": "text",
                "content": json.dumps({"text": content}, ensure_ascii=False), "mentions": mentions,
                "user_agent": "ethan-console",
            },
        },
    }


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
    def __init__(self, ethan: Any) -> None:
        self.ethan = ethan
        self.names: dict[str, str] = {}      # display names chosen in the playground

    @property
    def m(self) -> Any:
        if self.ethan.memory is None:
            raise ApiError(503, "starting up; try again in a moment")
        return self.ethan.memory

    # -- users -------------------------------------------------------------------------
    async def users(self) -> list[dict]:
        """Everyone the bot knows of: from messages, facts, profile, rules and episodes."""
        db = self.m.db
        rows = await db.fetchall(
            "SELECT u.user_id AS user_id, MAX(u.last) AS last,"
            " (SELECT m.sender_name FROM messages m WHERE m.sender_id = u.user_id AND m.sender_name <> ''"
            "  ORDER BY m.id DESC LIMIT 1) AS name"
            " FROM ("
            "  SELECT sender_id AS user_id, MAX(created_at) AS last FROM messages"
            "   WHERE role = 'user' AND sender_id <> '' GROUP BY sender_id"
            "  UNION ALL SELECT user_id, MAX(updated_at) FROM facts GROUP BY user_id"
            "  UNION ALL SELECT user_id, MAX(updated_at) FROM profile_entries GROUP BY user_id"
            "  UNION ALL SELECT scope_id, MAX(created_at) FROM procedures WHERE scope = 'user' GROUP BY scope_id"
            "  UNION ALL SELECT user_id, MAX(timestamp) FROM episodes GROUP BY user_id"
            " ) u WHERE u.user_id <> '' GROUP BY u.user_id ORDER BY last DESC LIMIT ?",
            (1000,),
        )
        counts: dict[str, dict[str, int]] = {}
        for key, sql in (
            ("facts", "SELECT user_id AS u, COUNT(*) AS n FROM facts WHERE superseded_at IS NULL GROUP BY user_id"),
            ("procedures", "SELECT scope_id AS u, COUNT(*) AS n FROM procedures WHERE scope = 'user' GROUP BY scope_id"),
            ("profile", "SELECT user_id AS u, COUNT(*) AS n FROM profile_entries GROUP BY user_id"),
            ("episodes", "SELECT user_id AS u, COUNT(*) AS n FROM episodes GROUP BY user_id"),
            ("messages", "SELECT sender_id AS u, COUNT(*) AS n FROM messages WHERE role = 'user' GROUP BY sender_id"),
        ):
            for r in await db.fetchall(sql):
                counts.setdefault(r["u"], {})[key] = r["n"]
        out = []
        for r in rows:
            uid = r["user_id"]
            c = counts.get(uid, {})
            out.append({
                "id": uid, "name": self.names.get(uid) or r["name"] or "", "last_seen": r["last"],
                "facts": c.get("facts", 0), "procedures": c.get("procedures", 0),
                "profile_entries": c.get("profile", 0), "episodes": c.get("episodes", 0),
                "messages": c.get("messages", 0),
            })
        known = {u["id"] for u in out}
        for uid, name in self.names.items():
            if uid not in known:
                out.append({"id": uid, "name": name, "last_seen": None, "facts": 0, "procedures": 0,
                            "profile_entries": 0, "episodes": 0, "messages": 0})
        return out

    async def user(self, user_id: str) -> dict:
        check_user(user_id)
        for u in await self.users():
            if u["id"] == user_id:
                return u
        return {"id": user_id, "name": self.names.get(user_id, ""), "last_seen": None, "facts": 0,
                "procedures": 0, "profile_entries": 0, "episodes": 0, "messages": 0}

    # -- profile -----------------------------------------------------------------------
    async def profile(self, user_id: str) -> dict:
        check_user(user_id)
        doc = await self.m.profile.read_document(user_id)
        entries = await self.m.profile.list(user_id)
        return {"user_id": user_id, "document": doc, "version": _version(doc),
                "entries": [dataclasses.asdict(e) for e in entries]}

    async def save_profile(self, user_id: str, document: Any, base: Any = None) -> dict:
        from memory.profile import ProfileError

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
        if not await self.m.facts.delete(user_id, fact_id):
            raise ApiError(404, "no such fact for this user")
        log.info("console.fact_deleted", user_id=user_id, fact_id=fact_id)
        return {"deleted": fact_id}

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

    # -- sessions ----------------------------------------------------------------------
    async def sessions(self, user_id: str = "", query: str = "") -> list[dict]:
        from memory.sessions import EmptyQuery

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
        from memory.sessions import AmbiguousSession, SessionNotFound

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
        if not re.match(r"^[A-Za-z0-9_]{1,64}$", session_id or "") or not await self.m.sessions.delete(session_id):
            raise ApiError(404, "no such session")
        return {"deleted": session_id}

    # -- playground --------------------------------------------------------------------
    async def play(self, body: dict) -> tuple[int, dict]:
        ethan = self.ethan
        user_id = body.get("user_id")
        name = body.get("name", "")
        chat = body.get("chat", "p2p")
        mention = body.get("mention", True)
        text = body.get("text")
        if not isinstance(user_id, str) or not PLAYGROUND_USER.match(user_id):
            raise ApiError(400, "user_id must be an open_id: ou_ followed by letters, digits, _ or -")
        if not isinstance(name, str) or len(name) > MAX_NAME or "\n" in name:
            raise ApiError(400, f"name must be one line of at most {MAX_NAME} characters")
        if chat not in ("p2p", "group"):
            raise ApiError(400, "chat must be p2p or group")
        if not isinstance(mention, bool):
            raise ApiError(400, "mention must be true or false")
        if not isinstance(text, str) or not text.strip():
            raise ApiError(400, "text must be a non-empty string")
        if len(text) > MAX_TEXT:
            raise ApiError(413, f"text is longer than {MAX_TEXT} characters")
        if ethan.intake is None or ethan.closing or not ethan.ready:
            raise ApiError(503, "the bot is not accepting messages right now")
        name = name.strip()
        if name:
            self.names[user_id] = name
            remember = getattr(getattr(ethan, "names", None), "remember", None)
            if remember is not None:
                remember(user_id, name)
        try:
            bot_id = await asyncio.wait_for(ethan.bot_open_id(), 10)
        except asyncio.TimeoutError:
            raise ApiError(503, "the bot's identity (bot/v3/info) is not known yet") from None
        message_id = "om_console_" + uuid.uuid4().hex
        event = build_event(user_id=user_id, text=text, chat=chat, mention=mention, bot_open_id=bot_id,
                            message_id=message_id)
        raw = json.dumps(event, ensure_ascii=False)
        chat_id = event["event"]["message"]["chat_id"]
        reply = PlaygroundReply()
        ethan.replies.waiting[message_id] = reply
        started = time.monotonic()
        try:
            accepted = await ethan.intake.accept(raw, event)
            if accepted.status != "accepted":
                return 409, {"status": accepted.status, "reason": accepted.reason, "message_id": message_id}
            status, reason = await self._wait(reply, message_id)
        finally:
            ethan.replies.waiting.pop(message_id, None)
        session = None
        try:
            active = await self.m.sessions.active(conversation_key(chat_id))
            session = active.id if active else None
        except Exception:  # noqa: BLE001
            session = None
        out = {
            "status": status, "reason": reason, "text": reply.text, "memory": reply.memory, "tools": reply.tools,
            "message_id": message_id, "chat_id": chat_id, "chat_type": chat, "user_id": user_id,
            "session_id": session, "streamed_parts": reply.partials, "first_text_ms": reply.first_text_ms,
            "elapsed_ms": int((time.monotonic() - started) * 1000),
        }
        return (200 if status in ("answered", "ignored") else 504), out

    async def _wait(self, reply: PlaygroundReply, message_id: str) -> tuple[str, str]:
        deadline = time.monotonic() + float(getattr(self.ethan.settings, "ethan_reply_deadline", 60.0)) + EXTRA_WAIT
        while True:
            try:
                await asyncio.wait_for(reply.done.wait(), 0.2)
                return "answered", ""
            except asyncio.TimeoutError:
                pass
            row = await self.m.db.fetchone("SELECT status, note FROM inbox WHERE message_id = ?", (message_id,))
            if row is not None and row["status"] in ("ignored", "failed"):
                return "ignored", row["note"] or row["status"]
            if row is not None and row["status"] == "done":
                await asyncio.sleep(0)
                return ("answered", "") if reply.done.is_set() else ("ignored", "handled without a reply")
            if time.monotonic() > deadline:
                return "timeout", "no answer within the reply deadline"


def _version(document: str) -> str:
    import hashlib

    return hashlib.sha256(document.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------------------
# Routes
# --------------------------------------------------------------------------------------

def api_routes(data: ConsoleData) -> list[tuple[str, str, Any]]:
    """(method, path, handler) for every /api/ endpoint."""

    def handler(fn):
        async def wrapped(request: web.Request) -> web.Response:
            try:
                return await fn(request)
            except ApiError as e:
                return fail(e.status, e.message, **e.extra)
        return wrapped

    def uid(request: web.Request) -> str:
        return check_user(request.match_info["user_id"])

    async def users(request):
        return ok({"users": await data.users()})

    async def user(request):
        return ok(await data.user(uid(request)))

    async def profile_get(request):
        return ok(await data.profile(uid(request)))

    async def profile_put(request):
        body = await read_json(request)
        return ok(await data.save_profile(uid(request), body.get("document"), body.get("version")))

    async def facts_get(request):
        history = request.query.get("history", "") in ("1", "true", "yes")
        return ok({"user_id": uid(request), "facts": await data.facts(uid(request), history=history)})

    async def facts_post(request):
        return ok(await data.add_fact(uid(request), await read_json(request)), 201)

    async def fact_patch(request):
        return ok(await data.update_fact(uid(request), _int(request.match_info["fact_id"], "fact"),
                                         await read_json(request)))

    async def fact_delete(request):
        return ok(await data.delete_fact(uid(request), _int(request.match_info["fact_id"], "fact")))

    async def procedures_get(request):
        return ok({"user_id": uid(request), "procedures": await data.procedures(uid(request))})

    async def procedures_post(request):
        return ok(await data.add_procedure(uid(request), await read_json(request)), 201)

    async def procedure_delete(request):
        return ok(await data.delete_procedure(uid(request), _int(request.match_info["proc_id"], "rule")))

    async def episodes_get(request):
        return ok({"user_id": uid(request), "episodes": await data.episodes(uid(request), request.query.get("q", ""))})

    async def episode_delete(request):
        return ok(await data.delete_episode(uid(request), _int(request.match_info["episode_id"], "episode")))

    async def sessions_get(request):
        return ok({"sessions": await data.sessions(request.query.get("user", ""), request.query.get("q", ""))})

    async def session_get(request):
        return ok(await data.session(request.match_info["session_id"], request.query.get("user", "")))

    async def session_delete(request):
        return ok(await data.delete_session(request.match_info["session_id"]))

    async def playground(request):
        status, body = await data.play(await read_json(request))
        return ok(body, status)

    u = "/api/users/{user_id}"
    return [
        ("GET", "/api/users", handler(users)),
        ("GET", u, handler(user)),
        ("GET", u + "/profile", handler(profile_get)),
        ("PUT", u + "/profile", handler(profile_put)),
        ("GET", u + "/facts", handler(facts_get)),
        ("POST", u + "/facts", handler(facts_post)),
        ("PATCH", u + "/facts/{fact_id}", handler(fact_patch)),
        ("DELETE", u + "/facts/{fact_id}", handler(fact_delete)),
        ("GET", u + "/procedures", handler(procedures_get)),
        ("POST", u + "/procedures", handler(procedures_post)),
        ("DELETE", u + "/procedures/{proc_id}", handler(procedure_delete)),
        ("GET", u + "/episodes", handler(episodes_get)),
        ("DELETE", u + "/episodes/{episode_id}", handler(episode_delete)),
        ("GET", "/api/sessions", handler(sessions_get)),
        ("GET", "/api/sessions/{session_id}", handler(session_get)),
        ("DELETE", "/api/sessions/{session_id}", handler(session_delete)),
        ("POST", "/api/playground", handler(playground)),
    ]
