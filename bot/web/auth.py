"""Who may use the web console, and protection against cross-site requests.

Access (DESIGN.md §3, ``ETHAN_CONSOLE_TOKEN``):

* Bound to a loopback address and reached under a loopback host name (``localhost``,
  ``127.0.0.1``, ``[::1]``): open, no token.
* Anything else: the token is required — ``Authorization: Bearer <token>``, or the cookie the
  login page sets (``HttpOnly; SameSite=Strict``; its value is an HMAC of the token, so
  changing the token logs everyone out). Without a valid one, API calls get 401 and pages
  redirect to ``/login``.
* A loopback bind reached under another host name (a reverse proxy, or a DNS-rebinding page
  in the operator's browser) is treated like a remote request: token required, or 403 when
  no token is configured. (``bot/config.py`` already refuses a non-loopback bind without a
  token.)

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

import hashlib
import hmac
import ipaddress
import time
from typing import Awaitable, Callable
from urllib.parse import quote, urlsplit

from aiohttp import web

COOKIE = "ethan_console"
COOKIE_MAX_AGE = 7 * 24 * 3600
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOGIN_FAILURES = 10          # per client address ...
LOGIN_WINDOW = 300.0         # ... per this many seconds, then 429

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


class ConsoleAuth:
    def __init__(self, *, token: str, loopback_bind: bool, clock=time.monotonic) -> None:
        self.token = token or ""
        self.loopback_bind = loopback_bind
        self.clock = clock
        self._failures: dict[str, list[float]] = {}
        self.session_value = (
            hmac.new(self.token.encode(), b"ethan-console-session-v1", hashlib.sha256).hexdigest()
            if self.token else ""
        )

    # -- who -------------------------------------------------------------------------
    def is_open(self, request: web.Request) -> bool:
        """No token needed: loopback bind, reached under a loopback host name."""
        return self.loopback_bind and is_loopback_name(host_name(request.headers.get("Host", "")))

    def has_token(self, request: web.Request) -> bool:
        if not self.token:
            return False
        auth = request.headers.get("Authorization", "")
        if auth[:7].lower() == "bearer ":
            return hmac.compare_digest(auth[7:].strip().encode(), self.token.encode())
        cookie = request.cookies.get(COOKIE, "")
        return bool(cookie) and hmac.compare_digest(cookie.encode(), self.session_value.encode())

    def allowed(self, request: web.Request) -> bool:
        return self.is_open(request) or self.has_token(request)

    def check_token(self, candidate: str) -> bool:
        return bool(self.token) and hmac.compare_digest((candidate or "").encode(), self.token.encode())

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

    def failed(self, client: str) -> None:
        self._failures.setdefault(client, []).append(self.clock())
        if len(self._failures) > 10_000:
            self._failures.clear()

    # -- wrappers --------------------------------------------------------------------
    def guard(self, handler: Handler, *, api: bool) -> Handler:
        """Access + cross-site checks around one console handler."""

        async def guarded(request: web.Request) -> web.StreamResponse:
            if not self.allowed(request):
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
                raise web.HTTPSeeOther("/login?next=" + quote(target, safe="/"))
            if request.method not in SAFE_METHODS:
                if not self.same_origin(request):
                    return secure_headers(web.json_response(
                        {"error": "cross-site request refused"}, status=403))
                if api and request.can_read_body and request.content_type != "application/json":
                    return secure_headers(web.json_response(
                        {"error": "send JSON (Content-Type: application/json)"}, status=415))
            resp = await handler(request)
            return secure_headers(resp)

        return guarded

    def cookie_kwargs(self, request: web.Request) -> dict:
        secure = request.secure or request.headers.get("X-Forwarded-Proto", "").lower() == "https"
        return dict(max_age=COOKIE_MAX_AGE, httponly=True, samesite="Strict", secure=secure, path="/")


def safe_next(value: str) -> str:
    """A local path to go to after login (never another site)."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    parts = urlsplit(value)
    if parts.scheme or parts.netloc:
        return "/"
    return value
