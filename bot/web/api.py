"""The console's JSON API (``/api/...``) and the Web API ``POST /chat``: routes only.

The reads and writes are bot/web/data.py's, the playground bot/web/playground.py's, /chat
bot/web/chat.py's. Access checks wrap every route (bot/web/console.py, bot/web/auth.py).
Endpoints are listed in docs/console.md.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from bot.web.chat import WebChat
from bot.web.data import ApiError, ConsoleData, _int, check_user, fail, ok, read_json
from bot.web.playground import Playground


def api_routes(data: ConsoleData, playground: Playground, chat: WebChat) -> list[tuple[str, str, Any]]:
    """(method, path, handler) for every /api/ endpoint and /chat."""

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

    async def reminders_get(request):
        return ok({"user_id": uid(request), "reminders": await data.reminders(uid(request))})

    async def reminder_delete(request):
        return ok(await data.cancel_reminder(uid(request), _int(request.match_info["job_id"], "reminder")))

    async def sessions_get(request):
        return ok({"sessions": await data.sessions(request.query.get("user", ""), request.query.get("q", ""))})

    async def session_get(request):
        return ok(await data.session(request.match_info["session_id"], request.query.get("user", "")))

    async def session_delete(request):
        return ok(await data.delete_session(request.match_info["session_id"]))

    async def play(request):
        status, body = await playground.play(await read_json(request))
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
        ("GET", u + "/reminders", handler(reminders_get)),
        ("DELETE", u + "/reminders/{job_id}", handler(reminder_delete)),
        ("GET", "/api/sessions", handler(sessions_get)),
        ("GET", "/api/sessions/{session_id}", handler(session_get)),
        ("DELETE", "/api/sessions/{session_id}", handler(session_delete)),
        ("POST", "/api/playground", handler(play)),
        ("POST", "/chat", chat.handle),
    ]
