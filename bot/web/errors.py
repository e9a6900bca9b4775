"""Storage failures on the web routes: a clear 503, not a 500 with a traceback.

A console or ``/chat`` request that meets a database error (SQLite's write lock held past the
busy timeout by another process, a full disk, PostgreSQL restarting) answers 503 with
``Retry-After`` — a JSON ``{"error": …}`` for API and machine callers, a short text for pages —
and logs one ``web.storage_error`` line with the method, path and error. Nothing is
half-written: every store write is one transaction. ``/lark/events`` has its own answer (its
own 503, which Lark retries: bot/lark/transport/webhook.py) and is left alone.
"""

from __future__ import annotations

import logging
from typing import Awaitable, Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from bot.infra.log import get_logger
from storage import is_database_error

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


class _MalformedRequests(logging.Filter):
    """aiohttp answers a request it cannot parse (raw UTF-8 in the query string, a header line
    without a colon, a header over 8 KiB) with 400 itself, then logs the parser's exception
    at ERROR with a traceback. That is a client's mistake, not ours: one ``http.malformed``
    line instead, and nothing at ERROR."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError) and 400 <= (exc.code or 400) < 500:
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else ""
            log.info("http.malformed", status=exc.code or 400, error=type(exc).__name__,
                     detail=str(exc.message or "")[:120], remote=str(remote))
            return False
        return True


_FILTER = _MalformedRequests()


def quiet_malformed_requests() -> None:
    """Install the filter on aiohttp's server logger (once; idempotent)."""
    logger = logging.getLogger("aiohttp.server")
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
