"""The web console: the chat playground and the memory pages, on the bot's own aiohttp server.

Pages are rendered on the server from ``bot/web/templates`` (every value HTML-escaped unless
it is ``Markup`` built here from escaped parts), with one small script
(``/static/console.js``) for the playground and the edit/delete buttons, which call the JSON
API (``bot/web/api.py``). No build step, nothing from a CDN.

    /                                   playground
    /users                              everyone known (messages, facts, profile, rules, episodes)
    /users/{id}/profile                 「我的画像」: view and edit the whole profile document
    /users/{id}/facts                   facts: edit, delete, add (?history=1 with superseded ones)
    /users/{id}/procedures              rules: delete, add
    /users/{id}/episodes                episodes: list, search (?q=), delete
    /users/{id}/reminders               reminders: list (next time in the user's zone, deliveries), cancel
    /sessions?user=&q=                  sessions: list, search; /sessions/{id} to read one
    /login, /logout                     only when a token is needed (bot/web/auth.py)

Access and cross-site protection: ``bot/web/auth.py``.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from aiohttp import web

from bot.llm.health import problem_setting
from bot.infra.log import get_logger
from bot.core.text import when
from bot.web.api import api_routes
from bot.web.chat import WebChat
from bot.web.data import ApiError, ConsoleData, ConsoleDeps, check_user
from bot.web.playground import Playground
from bot.web.auth import ConsoleAuth, COOKIE, safe_next, secure_headers

log = get_logger("ethan.console")

HERE = Path(__file__).parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"
STATIC_TYPES = {".css": "text/css", ".js": "text/javascript", ".svg": "image/svg+xml", ".png": "image/png",
                ".ico": "image/x-icon"}
CONSOLE_KEY = web.AppKey("console", ConsoleData)
CATEGORIES = ("knowledge", "preference", "decision", "correction")
TABS = (("profile", "我的画像"), ("facts", "Facts"), ("procedures", "Rules"), ("episodes", "Episodes"),
        ("reminders", "Reminders"), ("sessions", "Sessions"))


# --------------------------------------------------------------------------------------
# Rendering: escaped by default
# --------------------------------------------------------------------------------------

class Markup(str):
    """HTML that is already safe (built from escaped parts)."""


def esc(value: Any) -> Markup:
    if isinstance(value, Markup):
        return value
    return Markup(html.escape("" if value is None else str(value), quote=True))


def join(parts) -> Markup:
    return Markup("".join(esc(p) for p in parts))


def tag(name: str, content: Any = "", **attrs: Any) -> Markup:
    rendered = []
    for k, v in attrs.items():
        if v is None or v is False:
            continue
        k = k.rstrip("_").replace("_", "-")
        rendered.append(f" {k}" if v is True else f' {k}="{esc(v)}"')
    return Markup(f"<{name}{''.join(rendered)}>{esc(content)}</{name}>")


_PLACEHOLDER = re.compile(r"{{\s*(\w+)\s*}}")
_templates: dict[str, str] = {}


def render(_template: str, /, **ctx: Any) -> Markup:
    text = _templates.get(_template)
    if text is None:
        text = _templates[_template] = (TEMPLATES / _template).read_text(encoding="utf-8")
    return Markup(_PLACEHOLDER.sub(lambda m: esc(ctx[m.group(1)]), text))


def fmt_time(ts: Any) -> str:
    return when(ts, empty="—")




def user_url(user_id: str, tab: str = "profile") -> str:
    return f"/users/{quote(user_id, safe='')}/{tab}"


def table(headers: list[str], rows: list[Markup], *, empty: str, cls: str = "") -> Markup:
    if not rows:
        return tag("p", empty, class_="empty")
    head = join(tag("th", h, scope="col") for h in headers)
    return Markup(f'<div class="table-wrap"><table class="data {esc(cls)}"><thead><tr>{head}</tr></thead>'
                  f"<tbody>{join(rows)}</tbody></table></div>")


def cell(label: str, content: Any, cls: str = "") -> Markup:
    return tag("td", content, data_label=label, class_=cls or None)


# --------------------------------------------------------------------------------------
# Pages
# --------------------------------------------------------------------------------------

class Pages:
    def __init__(self, deps: ConsoleDeps, data: ConsoleData, auth: ConsoleAuth) -> None:
        self.d = deps
        self.data = data
        self.auth = auth

    def page(self, request: web.Request, *, title: str, page: str, content: Markup, section: str,
             status: int = 200) -> web.Response:
        allowed = self.auth.allowed(request)
        nav = join(
            tag("a", label, href=href, aria_current="page" if key == section else None)
            for key, label, href in (("playground", "Playground", "/"), ("users", "Memory", "/users"),
                                     ("sessions", "Sessions", "/sessions"))
        ) if allowed else Markup("")
        account: Markup = Markup("")
        if allowed and not self.auth.is_open(request):
            account = Markup('<form method="post" action="/logout" class="logout">'
                             '<button type="submit" class="link">Sign out</button></form>')
        badge = Markup("")
        if self.d.offline_model:
            badge = tag("span", "offline model", class_="badge offline",
                        title="No model configured (ANTHROPIC_API_KEY, OPENAI_API_KEY or OPENAI_BASE_URL):"
                              " answers come from the built-in offline model")
        problem = self.d.model_problem()
        if problem:
            # a wrong key, an unknown model, an unreachable endpoint: visible on every page
            badge = tag("span", f"model unusable: {problem_setting(problem)}", class_="badge unusable",
                        title=problem, role="status")
        body = render("base.html", title=title, page=page, nav=nav, account=account, badge=badge, content=content)
        return web.Response(text=body, status=status, content_type="text/html", charset="utf-8")

    async def userbar(self, user_id: str, tab: str) -> Markup:
        users = await self.data.users()
        if not any(u["id"] == user_id for u in users):
            users.insert(0, {"id": user_id, "name": self.data.names.get(user_id, "")})
        options = join(
            tag("option", f"{u['name']} · {u['id']}" if u.get("name") else u["id"], value=u["id"],
                selected=u["id"] == user_id)
            for u in users
        )
        name = next((u.get("name") for u in users if u["id"] == user_id), "") or ""
        tabs = join(
            tag("a", label, href=(f"/sessions?{urlencode({'user': user_id})}" if key == "sessions" else user_url(user_id, key)),
                aria_current="page" if key == tab else None)
            for key, label in TABS
        )
        return render("userbar.html", options=options, tab=tab, tabs=tabs, user_id=user_id,
                      display=name or "User")

    # -- playground ----------------------------------------------------------------------
    async def playground(self, request: web.Request) -> web.Response:
        users = await self.data.users()
        options = join(tag("option", u.get("name") or "", value=u["id"]) for u in users)
        offline = Markup("")
        if self.d.offline_model:
            offline = Markup("Answers come from the built-in <strong>offline model</strong> "
                             "(no model configured: <code>ANTHROPIC_API_KEY</code>, <code>OPENAI_API_KEY</code> "
                             "or <code>OPENAI_BASE_URL</code>): deterministic, marked <code>[offline]</code>, "
                             "and it calls the same memory tools.")
        content = render("playground.html", user_id="ou_console_demo", name="Demo", user_options=options,
                         offline_hint=offline)
        return self.page(request, title="Playground", page="playground", content=content, section="playground")

    # -- users ---------------------------------------------------------------------------
    async def users(self, request: web.Request) -> web.Response:
        users = await self.data.users()
        rows = []
        for u in users:
            link = tag("a", u.get("name") or u["id"], href=user_url(u["id"]))
            ident = Markup(f"<br><code class='small'>{esc(u['id'])}</code>") if u.get("name") else Markup("")
            rows.append(tag("tr", join([
                cell("User", Markup(f"{link}{ident}"), "wrap"),
                cell("Last seen", fmt_time(u.get("last_seen"))),
                cell("Messages", u["messages"], "num"),
                cell("Facts", tag("a", u["facts"], href=user_url(u["id"], "facts")), "num"),
                cell("Rules", tag("a", u["procedures"], href=user_url(u["id"], "procedures")), "num"),
                cell("Profile", tag("a", u["profile_entries"], href=user_url(u["id"], "profile")), "num"),
                cell("Episodes", tag("a", u["episodes"], href=user_url(u["id"], "episodes")), "num"),
            ])))
        content = render("users.html", count=len(users),
                         table=table(["User", "Last seen", "Messages", "Facts", "Rules", "Profile", "Episodes"],
                                     rows, empty="Nobody yet. Say hello in the playground."))
        return self.page(request, title="Users", page="users", content=content, section="users")

    async def pick(self, request: web.Request) -> web.Response:
        user = request.query.get("user", "").strip()
        tab = request.query.get("tab", "profile")
        if tab not in dict(TABS):
            tab = "profile"
        try:
            check_user(user)
        except ApiError:
            raise web.HTTPSeeOther("/users")
        if tab == "sessions":
            raise web.HTTPSeeOther("/sessions?" + urlencode({"user": user}))
        raise web.HTTPSeeOther(user_url(user, tab))

    async def user_root(self, request: web.Request) -> web.Response:
        raise web.HTTPSeeOther(user_url(check_user(request.match_info["user_id"])))

    # -- profile -------------------------------------------------------------------------
    async def profile(self, request: web.Request) -> web.Response:
        uid = check_user(request.match_info["user_id"])
        prof = await self.data.profile(uid)
        rows = [tag("tr", join([
            cell("Section", e["section"]),
            cell("Entry", e["entry"], "wrap"),
            cell("Source", tag("span", e["source"], class_=f"pill src-{e['source']}")),
            cell("Visibility", e["visibility"]),
            cell("Updated", fmt_time(e["updated_at"])),
        ])) for e in prof["entries"]]
        entries = table(["Section", "Entry", "Source", "Visibility", "Updated"], rows,
                        empty="No entries yet.")
        content = render("profile.html", userbar=await self.userbar(uid, "profile"), user_id=uid,
                         version=prof["version"], document=prof["document"], entries=entries)
        return self.page(request, title="我的画像", page="profile", content=content, section="users")

    # -- facts ---------------------------------------------------------------------------
    async def facts(self, request: web.Request) -> web.Response:
        uid = check_user(request.match_info["user_id"])
        history = request.query.get("history", "") in ("1", "true", "yes")
        facts = await self.data.facts(uid, history=history)
        rows = []
        for f in facts:
            superseded = f.get("superseded_at") is not None
            actions = Markup("") if superseded else Markup(
                '<button type="button" data-action="edit-fact">Edit</button> '
                '<button type="button" class="danger" data-action="delete-fact">Delete</button>')
            status = (tag("span", f"superseded by #{f.get('superseded_by') or '—'}", class_="pill muted")
                      if superseded else Markup(""))
            rows.append(tag("tr", join([
                cell("Fact", Markup(f'<span class="fact-content">{esc(f["content"])}</span> {status}'), "wrap"),
                cell("Category", tag("span", f["category"], class_=f"pill cat-{f['category']}")),
                cell("Confidence", f"{f['confidence']:.2f}", "num"),
                cell("Source", tag("span", f["source"], class_=f"pill src-{f['source']}")),
                cell("Visibility", f["visibility"]),
                cell("Last accessed", fmt_time(f["last_accessed"])),
                cell("", actions, "actions"),
            ]), data_id=f["id"], data_category=f["category"], data_confidence=f["confidence"],
                class_="superseded" if superseded else None))
        active = sum(1 for f in facts if f.get("superseded_at") is None)
        link = (tag("a", "Hide superseded history", href=user_url(uid, "facts")) if history
                else tag("a", "Show superseded history", href=user_url(uid, "facts") + "?history=1"))
        content = render(
            "facts.html", userbar=await self.userbar(uid, "facts"), user_id=uid, count=active,
            category_options=join(tag("option", c, value=c) for c in CATEGORIES),
            table=table(["Fact", "Category", "Confidence", "Source", "Visibility", "Last accessed", ""], rows,
                        empty="No facts yet.", cls="facts"),
            history_link=link)
        return self.page(request, title="Facts", page="facts", content=content, section="users")

    # -- procedures ----------------------------------------------------------------------
    async def procedures(self, request: web.Request) -> web.Response:
        uid = check_user(request.match_info["user_id"])
        procs = await self.data.procedures(uid)
        rows = [tag("tr", join([
            cell("Rule", p["rule"], "wrap"),
            cell("Context", p["context"] or "—", "wrap"),
            cell("Set in", p["chat_id"] or "console"),
            cell("Created", fmt_time(p["created_at"])),
            cell("", Markup('<button type="button" class="danger" data-action="delete-rule">Delete</button>'), "actions"),
        ]), data_id=p["id"]) for p in procs]
        content = render("procedures.html", userbar=await self.userbar(uid, "procedures"), user_id=uid,
                         count=len(procs),
                         table=table(["Rule", "Context", "Set in", "Created", ""], rows, empty="No rules yet."))
        return self.page(request, title="Rules", page="procedures", content=content, section="users")

    # -- episodes ------------------------------------------------------------------------
    async def episodes(self, request: web.Request) -> web.Response:
        uid = check_user(request.match_info["user_id"])
        query = request.query.get("q", "")
        eps = await self.data.episodes(uid, query)
        items = []
        for e in eps:
            keywords = join(tag("span", k, class_="chip") for k in e["keywords"])
            session = tag("a", f"session …{e['session_id'][-4:]}",
                          href=f"/sessions/{quote(e['session_id'], safe='')}?{urlencode({'user': uid})}")
            items.append(tag("li", Markup(
                f'<div class="ep-head"><span>{esc(fmt_time(e["timestamp"]))}</span> · '
                f'<span>{esc(e["turn_count"])} turns</span> · <span>{esc(e["chat_type"] or "chat")}</span> · {session}'
                f'<button type="button" class="danger small" data-action="delete-episode">Delete</button></div>'
                f'<p class="ep-summary">{esc(e["summary"])}</p><div class="chips">{keywords}</div>'),
                class_="episode", data_id=e["id"]))
        lst = (Markup(f'<ul class="episodes">{join(items)}</ul>') if items
               else tag("p", "No matching episodes." if query else "No episodes yet: one is written when a session "
                        "with at least two turns ends (/new, idle, shutdown).", class_="empty"))
        content = render("episodes.html", userbar=await self.userbar(uid, "episodes"), user_id=uid,
                         user_id_url=quote(uid, safe=""), query=query, list=lst)
        return self.page(request, title="Episodes", page="episodes", content=content, section="users")

    # -- reminders -----------------------------------------------------------------------
    async def reminders(self, request: web.Request) -> web.Response:
        uid = check_user(request.match_info["user_id"])
        jobs = await self.data.reminders(uid)
        rows = []
        for j in jobs:
            last = j["deliveries"][0] if j["deliveries"] else None
            cancel = (tag("button", "Cancel", type="button", class_="danger small", data_action="cancel-reminder")
                      if j["state"] == "active" else "")
            rows.append(tag("tr", join([
                cell("Id", f"#{j['id']}", "num"), cell("Next", j["next_local"] or "—"),
                cell("Repeats", j["rrule"] or "once"), cell("Text", j["text"]),
                cell("Chat", f"{j['chat_type']} …{j['chat_id'][-6:]}"), cell("State", j["state"]),
                cell("Last", f"{last['status']} {fmt_time(last['due_at'])}" if last else "—"),
                cell("", cancel)]), data_id=j["id"]))
        content = render("reminders.html", userbar=await self.userbar(uid, "reminders"),
                         table=table(["Id", "Next", "Repeats", "Text", "Chat", "State", "Last", ""], rows,
                                     empty="No reminders: they are set in chat (\"提醒我明天九点…\")."))
        return self.page(request, title="Reminders", page="reminders", content=content, section="users")

    # -- sessions ------------------------------------------------------------------------
    async def sessions(self, request: web.Request) -> web.Response:
        uid = request.query.get("user", "").strip()
        query = request.query.get("q", "")
        if uid:
            check_user(uid)
        found = await self.data.sessions(uid, query)
        rows = []
        for s in found:
            href = f"/sessions/{quote(s['id'], safe='')}" + (f"?{urlencode({'user': uid})}" if uid else "")
            title = tag("a", s["title"] or "(untitled)", href=href)
            snippet = tag("div", s["snippet"], class_="snippet") if s.get("snippet") else Markup("")
            rows.append(tag("tr", join([
                cell("Session", Markup(f"{title}{snippet}<code class='small'>{esc(s['id'])}</code>"), "wrap"),
                cell("Chat", f"{s['chat_type']} · {s['chat_id']}"),
                cell("Messages", s["message_count"], "num"),
                cell("Updated", fmt_time(s["updated_at"])),
                cell("State", tag("span", "open" if s["is_open"] else "closed",
                                  class_="pill " + ("open" if s["is_open"] else "muted"))),
            ])))
        userbar = await self.userbar(uid, "sessions") if uid else Markup("")
        scope = (f"of {uid}" if uid else "all users") + (f" · matching “{query}”" if query else "")
        content = render("sessions.html", userbar=userbar, user_id=uid, query=query, scope=scope,
                         table=table(["Session", "Chat", "Messages", "Updated", "State"], rows,
                                     empty="No matching sessions." if query else "No sessions yet."))
        return self.page(request, title="Sessions", page="sessions", content=content,
                         section="users" if uid else "sessions")

    async def session(self, request: web.Request) -> web.Response:
        uid = request.query.get("user", "").strip()
        sid = request.match_info["session_id"]
        try:
            detail = await self.data.session(sid, uid)
        except ApiError as e:
            if e.status != 404:
                raise
            content = tag("section", tag("p", e.message, class_="empty"), class_="card")
            return self.page(request, title="Session", page="session", content=content, section="sessions",
                             status=404)
        s = detail["session"]
        meta = join(Markup(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>") for k, v in (
            ("id", s["id"]), ("chat", f"{s['chat_type']} · {s['chat_id']}" + (f" · thread {s['thread_id']}" if s["thread_id"] else "")),
            ("started by", s["owner_id"]), ("model", s["model"] or "—"), ("created", fmt_time(s["created_at"])),
            ("updated", fmt_time(s["updated_at"])), ("closed", fmt_time(s["closed_at"]) if s["closed_at"] else "open"),
            ("turns", s["user_turns"]),
        ))
        ctx = detail["context"]
        if "error" in ctx:
            context = tag("p", ctx["error"], class_="error")
        else:
            context = Markup(
                f'<dl class="meta-grid"><dt>hot turns (replayed verbatim)</dt><dd>{esc(ctx["hot_turns"])}</dd>'
                f'<dt>not replayed (backlog over budget)</dt><dd>{esc(ctx["pending"])}</dd>'
                f'<dt>warm summaries</dt><dd>{esc(ctx["warm_rows"])} ({esc(ctx["warm_turns"])} turns)</dd></dl>'
                f'<h3>[对话摘要] <span class="muted">summary</span></h3>'
                f'<pre class="mem">{esc(ctx["summary"] or "—")}</pre>'
                f'<h3>[长期记忆] <span class="muted">long-term</span></h3>'
                f'<pre class="mem">{esc(ctx["long_term"] or "—")}</pre>')
        msgs = []
        for m in detail["messages"]:
            who = "Ethan" if m["role"] == "assistant" else (
                m["sender_name"] or self.data.names.get(m["sender_id"]) or m["sender_id"] or "user")
            msgs.append(tag("li", Markup(
                f'<div class="who">{esc(who)} <span class="muted">{esc(fmt_time(m["created_at"]))}</span></div>'
                f'<div class="text">{esc(m["content"])}</div>'), class_=f"msg {m['role']}"))
        back = "/sessions" + (f"?{urlencode({'user': uid})}" if uid else "")
        content = render("session.html", userbar=await self.userbar(uid, "sessions") if uid else Markup(""),
                         title=s["title"] or "(untitled)", meta=meta, context=context, messages=join(msgs),
                         count=len(msgs), session_id=s["id"], back=back)
        return self.page(request, title="Session", page="session", content=content,
                         section="users" if uid else "sessions")

    # -- login ---------------------------------------------------------------------------
    async def login_form(self, request: web.Request, *, error: str = "", status: int = 200) -> web.Response:
        if self.auth.allowed(request) and not error:
            raise web.HTTPSeeOther(safe_next(request.query.get("next", "/")))
        content = render("login.html", next=safe_next(request.query.get("next", "/")),
                         error=tag("p", error, class_="error") if error else Markup(""))
        resp = self.page(request, title="Sign in", page="login", content=content, section="", status=status)
        return secure_headers(resp)

    async def login(self, request: web.Request) -> web.Response:
        if not self.auth.same_origin(request):
            return secure_headers(web.Response(status=403, text="cross-site request refused"))
        client = self.auth.client(request)     # the peer, or what a trusted proxy says
        form = await request.post()
        token = form.get("token", "")
        if not isinstance(token, str) or not self.auth.check_token(token):
            # A correct token is always accepted (above): the throttle only slows wrong guesses,
            # so nobody sharing the operator's address (a proxy) can lock the operator out.
            throttled = self.auth.throttled(client)
            self.auth.failed(client)
            if throttled:
                log.warning("console.login_throttled", client=client)
                await self.auth.tarpit()
                return await self.login_form(request, error="Too many attempts; wait a few minutes.", status=429)
            log.warning("console.login_failed", client=client)
            return await self.login_form(request, error="That token is not right.", status=401)
        log.info("console.login", client=client)
        nxt = form.get("next", "/")
        resp = web.HTTPSeeOther(safe_next(nxt if isinstance(nxt, str) else "/"))
        resp.set_cookie(COOKIE, self.auth.session_value, **self.auth.cookie_kwargs(request))
        secure_headers(resp)
        raise resp

    async def logout(self, request: web.Request) -> web.Response:
        if not self.auth.same_origin(request):
            return secure_headers(web.Response(status=403, text="cross-site request refused"))
        resp = web.HTTPSeeOther("/login" if self.auth.token else "/")
        resp.del_cookie(COOKIE, path="/")
        raise resp


async def static(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    path = STATIC / name
    if "/" in name or name.startswith(".") or path.suffix not in STATIC_TYPES or not path.is_file():
        raise web.HTTPNotFound()
    resp = web.Response(body=path.read_bytes(), content_type=STATIC_TYPES[path.suffix],
                        charset="utf-8" if path.suffix in (".css", ".js", ".svg") else None,
                        headers={"Cache-Control": "no-cache"})
    return secure_headers(resp, cache=True)


def setup_console(web_app: web.Application, deps: ConsoleDeps) -> None:
    """Register the console pages, the JSON API, /chat, the static files and the login routes."""
    auth = deps.auth       # the app's middleware shares it (one access decision for every route)
    data = ConsoleData(deps.memory)
    pages = Pages(deps, data, auth)
    web_app[CONSOLE_KEY] = data

    def page(fn):
        async def wrapped(request: web.Request) -> web.StreamResponse:
            try:
                return await fn(request)
            except ApiError as e:
                content = tag("section", tag("p", e.message, class_="error"), class_="card")
                return pages.page(request, title="Error", page="error", content=content, section="",
                                  status=e.status)
        return auth.guard(wrapped, api=False)

    r = web_app.router
    r.add_get("/", page(pages.playground))
    r.add_get("/users", page(pages.users))
    r.add_get("/users/pick", page(pages.pick))
    r.add_get("/users/{user_id}", page(pages.user_root))
    r.add_get("/users/{user_id}/profile", page(pages.profile))
    r.add_get("/users/{user_id}/facts", page(pages.facts))
    r.add_get("/users/{user_id}/procedures", page(pages.procedures))
    r.add_get("/users/{user_id}/episodes", page(pages.episodes))
    r.add_get("/users/{user_id}/reminders", page(pages.reminders))
    r.add_get("/users/{user_id}/sessions", page(
        lambda req: _redirect("/sessions?" + urlencode({"user": check_user(req.match_info["user_id"])}))))
    r.add_get("/sessions", page(pages.sessions))
    r.add_get("/sessions/{session_id}", page(pages.session))
    r.add_get("/login", pages.login_form)
    r.add_post("/login", pages.login)
    r.add_post("/logout", pages.logout)
    r.add_get("/static/{name}", static)
    for method, path, handler in api_routes(data, Playground(deps, data), WebChat(deps, data)):
        r.add_route(method, path, auth.guard(handler, api=True))

    async def api_not_found(request: web.Request) -> web.Response:
        return web.json_response({"error": "no such API endpoint"}, status=404)

    r.add_route("*", "/api/{tail:.*}", auth.guard(api_not_found, api=True))


async def _redirect(location: str) -> web.Response:
    raise web.HTTPSeeOther(location)
