"""Who may use the web console, and protection against cross-site requests.

Access (DESIGN.md §3, ``ETHAN_CONSOLE_TOKEN``, ``ETHAN_TRUSTED_PROXIES``) is one decision, made
by :meth:`ConsoleAuth.middleware` for every request the server answers, so a route added later
(``POST /chat``, …) is covered without doing anything:

* Always open: ``POST /lark/events`` (Lark signs it, bot/lark/transport/webhook.py checks that),
  ``GET /healthz`` and ``GET /livez`` (probes), and what the login page itself needs (``/login``, ``/logout``,
  ``/static/…``). The built-in offline model (``/_offline``) answers only the process's own
  client, which sends a per-process key.
* A token is set: every other request needs it — ``Authorization: Bearer <token>``, or the
  cookie the login page sets (``HttpOnly; SameSite=Strict``; its value is an HMAC of the token,
  so changing the token logs everyone out) — whatever its Host header or address says. A
  reverse proxy on the same machine forwards ``Host: 127.0.0.1`` (nginx's default): with the
  old "loopback host name = open" rule, that gave everyone behind the proxy the console.
  Without a valid token, API calls (and ``/metrics``) get 401 and HTML pages redirect to
  ``/login``.
* No token (only allowed on a loopback bind, ``bot/infra/config/settings.py``): open only to a request that is
  local on every count — loopback Host name (a DNS-rebinding page sends its own), loopback
  client, and no forwarding header from a proxy we do not trust (a proxy in front means the
  real client is elsewhere). Otherwise 403, saying to set a token.

The client address is the TCP peer, unless the peer is in ``ETHAN_TRUSTED_PROXIES``: then
``Forwarded``/``X-Forwarded-For`` is read from the right, skipping trusted hops. Nobody else's
forwarding headers are believed (anyone can send them). Login throttling is keyed on that
address, and a correct token is always accepted — behind an untrusted proxy every client
shares one address, and ten wrong guesses must not lock the operator out.

Cross-site requests: every state-changing request (anything but GET/HEAD/OPTIONS) must come
from the console's own origin — ``Sec-Fetch-Site`` must not be ``cross-site``/``same-site``,
and ``Origin`` (or, without it, ``Referer``) must name the request's own host. Requests
without any of these headers are not from a browser and are allowed (they still need the
token). API writes with a body must be ``application/json``, which a cross-site form cannot
send. Refusals are 403.

Every console response carries a strict Content-Security-Policy (scripts and styles only from
``/static``, no inline script), ``X-Frame-Options: DENY``, ``nosniff``, and ``no-store``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import secrets
import time
from typing import Awaitable, Callable, Iterable
from urllib.parse import quote, urlsplit

from aiohttp import web

from bot.infra.log import get_logger

log = get_logger("ethan.web")

COOKIE = "ethan_console"
COOKIE_MAX_AGE = 7 * 24 * 3600
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOGIN_FAILURES = 10          # per client address ...
LOGIN_WINDOW = 300.0         # ... per this many seconds, then wrong guesses get 429 ...
LOGIN_TARPIT_S = 1.0         # ... after this delay (a correct token is still accepted)
OPEN_PATHS = frozenset({"/lark/events", "/healthz", "/livez", "/login", "/logout"})
OPEN_PREFIXES = ("/static/",)
OFFLINE_PREFIX = "/_offline/"
MACHINE_PATHS = frozenset({"/metrics", "/chat"})   # refused with 401, never a login redirect

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def secure_headers(resp: web.StreamResponse, *, cache: bool = False) -> web.StreamResponse:
    h = resp.headers
    h.setdefault("Content-Security-Policy", CSP)
    h.setdefault("X-Frame-Options", "DENY")
    h.setdefault("X-Content-Type-Options", "nosniff")
    h.setdefault("Referrer-Policy", "same-origin")
    h.setdefault("Cross-Origin-Opener-Policy", "same-origin")
    h.setdefault("Cross-Origin-Resource-Policy", "same-origin")
    if not cache:
        h.setdefault("Cache-Control", "no-store")
    return resp


def host_name(host_header: str) -> str:
    """The host part of a Host header ('[::1]:8080' -> '::1', 'a.b:80' -> 'a.b')."""
    h = (host_header or "").strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h[1:]
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def is_loopback_name(name: str) -> bool:
    if name in ("localhost",) or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _networks(values: Iterable[str]) -> tuple:
    return tuple(ipaddress.ip_network(v.strip(), strict=False) for v in values if v and v.strip())


def _address(value: str):
    """An IP address from a forwarding header's node ('1.2.3.4', '1.2.3.4:80', '[::1]:80',
    '"[2001:db8::1]"'), or None."""
    v = value.strip().strip('"')
    if v.startswith("["):
        v = v[1:v.find("]")] if "]" in v else v[1:]
    elif v.count(":") == 1:
        v = v.split(":", 1)[0]
    try:
        return ipaddress.ip_address(v)
    except ValueError:
        return None


def forwarded_chain(request: web.Request) -> list[str]:
    """The addresses a proxy says the request passed through, client first (``Forwarded``
    when present, else ``X-Forwarded-For``)."""
    chain: list[str] = []
    for value in request.headers.getall("Forwarded", []):
        for element in value.split(","):
            for pair in element.split(";"):
                k, _, v = pair.partition("=")
                if k.strip().lower() == "for":
                    chain.append(v.strip())
    if chain:
        return chain
    for value in request.headers.getall("X-Forwarded-For", []):
        chain.extend(p.strip() for p in value.split(",") if p.strip())
    return chain


def has_forwarding(request: web.Request) -> bool:
    h = request.headers
    return "Forwarded" in h or "X-Forwarded-For" in h or "X-Real-IP" in h


class ConsoleAuth:
    def __init__(self, *, token: str, loopback_bind: bool, trusted_proxies: Iterable[str] = (),
                 clock=time.monotonic) -> None:
        self.token = token or ""
        self.loopback_bind = loopback_bind
        self.trusted = _networks(trusted_proxies)
        self.clock = clock
        # The offline model's key: the process's own model client sends it, nobody else knows it.
        self.offline_key = "offline-" + secrets.token_urlsafe(24)
        self._failures: dict[str, list[float]] = {}
        self.session_value = (
            hmac.new(self.token.encode(), b"ethan-console-session-v1", hashlib.sha256).hexdigest()
            if self.token else ""
        )

    @classmethod
    def from_settings(cls, s) -> "ConsoleAuth":
        return cls(token=s.ethan_console_token, loopback_bind=s.host_is_loopback,
                   trusted_proxies=getattr(s, "ethan_trusted_proxies", ()))

    # -- who -------------------------------------------------------------------------
    def _is_trusted(self, address) -> bool:
        return address is not None and any(address in net for net in self.trusted)

    def peer_trusted(self, request: web.Request) -> bool:
        return self._is_trusted(_address(request.remote or ""))

    def client(self, request: web.Request) -> str:
        """The client's address: the TCP peer, or — when the peer is a trusted proxy — the
        right-most address in its forwarding header that is not itself a trusted proxy."""
        peer = request.remote or "?"
        if not self.peer_trusted(request):
            return peer
        chain = forwarded_chain(request)
        for hop in reversed(chain):
            addr = _address(hop)
            if not self._is_trusted(addr):
                return str(addr) if addr is not None else hop[:64]
        return str(_address(chain[0]) or chain[0][:64]) if chain else peer

    def is_open(self, request: web.Request) -> bool:
        """No token needed: no token configured, and the request is local on every count
        (loopback bind, loopback Host name, loopback client, no untrusted proxy in front)."""
        if self.token or not self.loopback_bind:
            return False
        if not is_loopback_name(host_name(request.headers.get("Host", ""))):
            return False
        if has_forwarding(request) and not self.peer_trusted(request):
            return False       # a proxy we do not know: the real client is somewhere else
        return is_loopback_name(self.client(request))

    @staticmethod
    def bearer(request: web.Request) -> str:
        auth = request.headers.get("Authorization", "")
        return auth[7:].strip() if auth[:7].lower() == "bearer " else ""

    def has_token(self, request: web.Request) -> bool:
        if not self.token:
            return False
        auth = request.headers.get("Authorization", "")
        if auth[:7].lower() == "bearer ":
            return _same(auth[7:].strip(), self.token)
        cookie = request.cookies.get(COOKIE, "")
        return bool(cookie) and _same(cookie, self.session_value)

    def allowed(self, request: web.Request) -> bool:
        return self.is_open(request) or self.has_token(request)

    def check_token(self, candidate: str) -> bool:
        return bool(self.token) and _same(candidate or "", self.token)

    def secure_request(self, request: web.Request) -> bool:
        if request.secure:
            return True
        return self.peer_trusted(request) and request.headers.get("X-Forwarded-Proto", "").lower() == "https"

    # -- the one access decision, for every route ------------------------------------
    @staticmethod
    def public(path: str) -> bool:
        return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)

    def refusal(self, request: web.Request, *, api: bool) -> web.StreamResponse:
        if api:
            if not self.token:
                return secure_headers(web.json_response(
                    {"error": "forbidden", "detail": "the console answers without a token only on "
                     "localhost; set ETHAN_CONSOLE_TOKEN to reach it under another host name"},
                    status=403))
            return secure_headers(web.json_response(
                {"error": "unauthorized", "detail": "send Authorization: Bearer <ETHAN_CONSOLE_TOKEN>"},
                status=401, headers={"WWW-Authenticate": 'Bearer realm="ethan-console"'}))
        if not self.token:
            return secure_headers(web.Response(
                status=403, content_type="text/plain",
                text="The Ethan console is open without a token only on localhost. "
                     "Set ETHAN_CONSOLE_TOKEN to use it under another host name.\n"))
        target = request.path_qs if request.method in SAFE_METHODS else "/"
        return secure_headers(web.Response(status=303, headers={"Location": "/login?next=" + quote(target, safe="/")}))

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if self.public(path):
            return await handler(request)
        if path.startswith(OFFLINE_PREFIX) or path == OFFLINE_PREFIX.rstrip("/"):
            auth = request.headers.get("Authorization", "")
            key = request.headers.get("X-Api-Key", "") or (auth[7:].strip() if auth[:7].lower() == "bearer " else "")
            if _same(key, self.offline_key):
                return await handler(request)
            return web.json_response({"type": "error", "error": {"type": "authentication_error",
                                      "message": "the offline model answers this process only"}}, status=401)
        if not self.allowed(request):
            if self.token and self.bearer(request):
                # A wrong bearer token: counted with the login form's wrong guesses (the same
                # address, the same window), logged, and past the limit slowed and refused 429.
                client = self.client(request)
                throttled = self.throttled(client)
                self.failed(client)
                n = len(self._failures.get(client, ()))
                if n <= LOGIN_FAILURES + 1 or n % 100 == 0:      # the first throttled one; a flood is not a log flood
                    log.warning("auth.bad_token", client=client, method=request.method, path=path,
                                failures=n, throttled=throttled)
                if throttled:
                    await self.tarpit()
                    return secure_headers(web.json_response(
                        {"error": "too many wrong tokens", "detail": f"wait {int(LOGIN_WINDOW)} s"},
                        status=429, headers={"Retry-After": str(int(LOGIN_WINDOW))}))
            # A browser's page view is sent to the login form; anything else gets 401 JSON.
            page = (request.method in SAFE_METHODS and not path.startswith("/api/")
                    and path not in MACHINE_PATHS
                    and "application/json" not in request.headers.get("Accept", ""))
            return self.refusal(request, api=not page)
        return await handler(request)

    # -- cross-site ------------------------------------------------------------------
    @staticmethod
    def same_origin(request: web.Request) -> bool:
        site = request.headers.get("Sec-Fetch-Site", "").lower()
        if site in ("cross-site", "same-site"):
            return False
        host = request.headers.get("Host", "").strip().lower()
        origin = request.headers.get("Origin")
        if origin is not None:
            if origin.strip().lower() == "null":
                return False
            return bool(host) and urlsplit(origin.strip()).netloc.lower() == host
        referer = request.headers.get("Referer")
        if referer:
            return bool(host) and urlsplit(referer.strip()).netloc.lower() == host
        return True          # not a browser: browsers send Origin on every cross-site write

    # -- login throttling ------------------------------------------------------------
    def throttled(self, client: str) -> bool:
        now = self.clock()
        recent = [t for t in self._failures.get(client, []) if now - t < LOGIN_WINDOW]
        self._failures[client] = recent
        return len(recent) >= LOGIN_FAILURES

    async def tarpit(self) -> None:
        """A wrong guess from a throttled address waits before its 429: guessing slows down,
        and nobody is locked out (a correct token is never delayed)."""
        await asyncio.sleep(LOGIN_TARPIT_S)

    def failed(self, client: str) -> None:
        self._failures.setdefault(client, []).append(self.clock())
        if len(self._failures) > 10_000:
            self._failures.clear()

    # -- wrappers --------------------------------------------------------------------
    def guard(self, handler: Handler, *, api: bool) -> Handler:
        """Access + cross-site checks around one console handler."""

        async def guarded(request: web.Request) -> web.StreamResponse:
            if not self.allowed(request):       # the middleware decided already; kept as a backstop
                return self.refusal(request, api=api)
            if request.method not in SAFE_METHODS:
                if not self.same_origin(request):
                    return secure_headers(web.json_response(
                        {"error": "cross-site request refused"}, status=403))
                if api and request.body_exists and request.content_type != "application/json":
                    return secure_headers(web.json_response(
                        {"error": "send JSON (Content-Type: application/json)"}, status=415))
            resp = await handler(request)
            return secure_headers(resp)

        return guarded

    def cookie_kwargs(self, request: web.Request) -> dict:
        secure = self.secure_request(request)
        return dict(max_age=COOKIE_MAX_AGE, httponly=True, samesite="Strict", secure=secure, path="/")


def safe_next(value: str) -> str:
    """A local path to go to after login (never another site)."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    parts = urlsplit(value)
    if parts.scheme or parts.netloc:
        return "/"
    return value


BODY_READ_TIMEOUT_S = 10.0    # a request body not complete this long after its headers: 408, closed


def read_body_within(seconds: float = BODY_READ_TIMEOUT_S, *, skip: frozenset = frozenset({"/lark/events"})):
    """A middleware reading every request body under a deadline before the handler runs
    (aiohttp has no body read timeout: 400 connections sending half a body and stalling
    were held open for good). /lark/events reads its own body, with the same deadline and
    its 1 MiB limit (bot/lark/transport/routes.py)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.can_read_body and request.path not in skip:
            try:
                async with asyncio.timeout(seconds):
                    await request.read()          # cached: request.json()/post() read it from memory
            except TimeoutError:
                resp = web.Response(status=408, text="request body not received in time\n")
                resp.force_close()
                return resp
            except web.HTTPRequestEntityTooLarge:
                # aiohttp's own answer is plain text; ours is the documented JSON error
                resp = web.json_response({"error": "the body is larger than 1 MiB"}, status=413)
                resp.force_close()           # the rest of the body is not read
                return resp
        return await handler(request)

    return middleware


def _same(candidate: str, secret: str) -> bool:
    """Constant-time equality of two strings of any characters (``hmac.compare_digest`` raises
    TypeError on non-ASCII ``str``: a token like 'pässword' was a 500)."""
    return hmac.compare_digest(candidate.encode("utf-8", "surrogatepass"), secret.encode("utf-8", "surrogatepass"))
