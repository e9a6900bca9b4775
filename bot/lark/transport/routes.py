"""POST /lark/events: verify, store, then acknowledge (DESIGN.md §5).

Refused requests get 401 with an empty body and malformed ones 400 — never 500, which
Lark retries. Bodies over 1 MiB are refused with 413 before they are read in full.
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from bot.lark.transport import webhook
from bot.lark.intake import Intake
from bot.infra.log import get_logger

log = get_logger("ethan.webhook")

MAX_BODY = 1024 * 1024
BODY_READ_TIMEOUT_S = 10.0     # Lark sends a whole event at once; a body stalled this long is not Lark
# Lark waits 3 s for the answer, then delivers again. A store that has not finished by this
# (the database away, its pool waiting for a connection) answers 503 in time; the store goes
# on in the background — if it lands after all, Lark's redelivery is a duplicate (200, one
# answer), so answering 503 early never loses or doubles a message.
STORE_DEADLINE_S = 2.5


def make_handler(intake: Intake, *, encrypt_key: str, verification_token: str,
                 on_refused=lambda reason: None):
    late: set[asyncio.Task] = set()      # stores answered 503 and still running: kept, never dropped

    def _settled(task: asyncio.Task) -> None:
        late.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("webhook.late_store_failed", error=f"{type(task.exception()).__name__}: {task.exception()}"[:200])

    async def lark_events(request: web.Request) -> web.Response:
        if request.content_length is not None and request.content_length > MAX_BODY:
            on_refused("too large")
            return web.Response(status=413)
        try:
            async with asyncio.timeout(BODY_READ_TIMEOUT_S):
                body = await _read_limited(request)
        except _TooLarge:
            on_refused("too large")
            return web.Response(status=413)
        except TimeoutError:
            # Half a body, then nothing (slow loris): answered and closed, not held open.
            on_refused("timeout")
            resp = web.Response(status=408)
            resp.force_close()
            return resp
        try:
            verified = webhook.verify(request.headers, body, encrypt_key=encrypt_key,
                                      verification_token=verification_token)
        except webhook.Refused as e:
            log.warning("webhook.refused", reason=str(e), remote=request.remote)
            on_refused("refused")
            return web.Response(status=401)
        except webhook.Malformed as e:
            log.warning("webhook.malformed", reason=str(e), remote=request.remote)
            on_refused("malformed")
            return web.Response(status=400)
        if verified.kind == "challenge":
            return web.json_response({"challenge": verified.body["challenge"]})
        if verified.kind == "v1":
            # An app still subscribed to a v1 event: acknowledged, or Lark retries it four times
            # over seven hours; one line tells the operator to switch it to v2.0 in the console.
            ev = verified.body.get("event")
            log.info("webhook.v1_event_ignored", uuid=str(verified.body.get("uuid", ""))[:64],
                     event_type=str(ev.get("type", "") if isinstance(ev, dict) else "")[:64])
            return web.json_response({"code": 0, "msg": "ignored"})
        store = asyncio.ensure_future(intake.accept(verified.raw, verified.body))
        done, _ = await asyncio.wait({store}, timeout=STORE_DEADLINE_S)
        if not done:
            late.add(store)
            store.add_done_callback(_settled)
            log.warning("webhook.store_slow", waited_s=STORE_DEADLINE_S)
            return web.Response(status=503)
        try:
            result = store.result()
        except NotAccepting:
            # Stopping: not stored, so Lark must deliver it again (to the next process).
            log.info("webhook.deferred", reason="stopping")
            return web.Response(status=503)
        except Exception:
            # The event is not stored: a 503 tells Lark to deliver it again later.
            log.exception("webhook.store_failed")
            return web.Response(status=503)
        if result.response is not None:
            # A card click: Lark shows this body's toast and card (within its 3 s).
            return web.json_response(result.response)
        return web.json_response({"code": 0, "msg": result.status})

    return lark_events


class _TooLarge(Exception):
    pass


class NotAccepting(Exception):
    """The bot is stopping: the event is refused (503) and Lark redelivers it later."""


async def _read_limited(request: web.Request) -> bytes:
    chunks, size = [], 0
    async for chunk in request.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > MAX_BODY:
            raise _TooLarge()
        chunks.append(chunk)
    return b"".join(chunks)


__all__ = ["make_handler", "MAX_BODY", "json"]
