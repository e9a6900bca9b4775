"""Acknowledge-after-store: a verified event is parsed once, committed to the inbox, and
only then handed to the dispatcher. Shared by the webhook route and the long connection.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from pydantic import ValidationError

from bot.dispatch import Dispatcher
from bot.inbox import STALE_SECONDS, Inbox
from bot.lark.events import MESSAGE_RECEIVE, Envelope, MessageEvent
from bot.lark.normalize import epoch_seconds
from bot.log import get_logger
from memory.scope import conversation_key

log = get_logger("ethan.intake")


@dataclass(frozen=True, slots=True)
class IntakeResult:
    status: str          # accepted | duplicate | ignored | invalid
    reason: str = ""


class Intake:
    def __init__(self, inbox: Inbox, dispatcher: Dispatcher, *, clock=time.time,
                 on_event: Callable[[str], None] | None = None) -> None:
        self.inbox = inbox
        self.dispatcher = dispatcher
        self.clock = clock
        self.on_event = on_event or (lambda status: None)

    async def accept(self, raw: str, body: dict) -> IntakeResult:
        result = await self._accept(raw, body)
        self.on_event(result.status)
        return result

    async def _accept(self, raw: str, body: dict) -> IntakeResult:
        try:
            env = Envelope.model_validate(body)
        except ValidationError as e:
            log.warning("event.invalid", error=str(e)[:200])
            return IntakeResult("invalid", "not a schema 2.0 event")
        bound = log.bind(event_id=env.header.event_id, event_type=env.header.event_type)
        if env.header.event_type != MESSAGE_RECEIVE:
            bound.info("event.ignored", reason="unhandled event type")
            return IntakeResult("ignored", "unhandled event type")
        try:
            msg = MessageEvent.model_validate(env.event).message
        except ValidationError as e:
            bound.warning("event.invalid", error=str(e)[:200])
            return IntakeResult("invalid", "message event without message")
        conv = conversation_key(msg.chat_id, msg.thread_id or "")
        create_time = epoch_seconds(msg.create_time) or epoch_seconds(env.header.create_time) or self.clock()
        stale = self.clock() - create_time > STALE_SECONDS
        item = await self.inbox.accept(
            event_id=env.header.event_id, message_id=msg.message_id, chat_id=msg.chat_id,
            conv_key=conv, create_time=create_time, payload=raw,
            status="ignored" if stale else "pending", note="older than 30 minutes" if stale else "",
        )
        bound = bound.bind(message_id=msg.message_id, chat_id=msg.chat_id)
        if item is None:
            bound.info("event.duplicate")
            return IntakeResult("duplicate")
        if stale:
            bound.info("event.ignored", reason="older than 30 minutes")
            return IntakeResult("ignored", "stale")
        if not self.dispatcher.submit(conv, item):
            # Shutting down: it stays pending in the inbox and is answered on next start.
            bound.info("event.deferred", reason="shutting down")
        else:
            bound.info("event.accepted")
        return IntakeResult("accepted")
