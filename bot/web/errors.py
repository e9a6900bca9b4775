"""Storage failures on the web routes: a clear 503, not a 500 with a traceback.

A console or ``/chat`` request that meets a database error (SQLite's write lock held past the
busy timeout by another process, a full disk, PostgreSQL restarting) answers 503 with
``Retry-After`` — a JSON ``{"error": …}`` for API and machine callers, a short text for pages —
and logs one ``web.storage_error`` line with the method, path and error. Nothing is
half-written: every store write is one transaction. ``/lark/events`` has its own answer (its
own 503, which Lark retries: bot/lark/webhook.py) and is left alone.
"""

from __future__ import annotations

from typing import Awaitable, Callable

from aiohttp import web

from bot.log import get_logger
from memory.db import is_database_error

log = get_logger("ethan.web")

RETRY_AFTER_S = 5
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def storage_errors(*, skip: frozenset = frozenset({"/lark/events"})):
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in skip:
            return await handler(request)
        try:
            return await handler(request)
        except Exception as e:
            if not is_database_error(e):
                raise
            log.warning("web.storage_error", method=request.method, path=request.path,
                        error=f"{type(e).__name__}: {e}"[:300])
            headers = {"Retry-After": str(RETRY_AFTER_S)}
            if request.path.startswith("/api/") or request.path in ("/chat", "/metrics"):
                return web.json_response({"error": "storage is unavailable right now; try again shortly"},
                                         status=503, headers=headers)
            return web.Response(status=503, text="Storage is unavailable right now; try again shortly.\n",
                                headers=headers)

    return middleware
