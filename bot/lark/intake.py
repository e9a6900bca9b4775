"""Acknowledge-after-store: a verified event is decoded once (bot/lark/events.py), committed to
the inbox, and only then handed to the dispatcher with its decoded event (``InboxItem.event``:
the handler does not parse it again). Shared by the webhook route and the long connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from pydantic import ValidationError

from bot.delivery.dispatcher import Dispatcher
from bot.delivery.inbox_store import STALE_SECONDS, Inbox
from bot.lark import events
from bot.lark.events import Envelope
from bot.lark.card_clicks import tool_click_response
from bot.lark.normalize import has_surrogates, scrub
from bot.infra.log import get_logger

log = get_logger("ethan.intake")


@dataclass(frozen=True, slots=True)
class IntakeResult:
    status: str          # accepted | duplicate | ignored | invalid
    reason: str = ""
    # The body Lark shows for a card click (toast, updated card): the webhook's HTTP response,
    # the long connection's response-frame data (bot/lark/card_clicks.py). None: nothing to show.
    response: dict | None = None


QUIET_GAP_S = 0.005      # no acknowledgement for this long: the burst is over
MAX_HOLD_S = 1.0         # a conversation's work waits at most this long behind acknowledgements


class Intake:
    def __init__(self, inbox: Inbox, dispatcher: Dispatcher, *, clock=time.time,
                 on_event: Callable[[str], None] | None = None,
                 on_recall: Callable[[str, str], Awaitable[int]] | None = None,
                 on_tool_click: Callable[[str, str, bool], str] | None = None,
                 on_card_click: Callable[[Any, str], Awaitable[Any]] | None = None) -> None:
        self.inbox = inbox
        self.dispatcher = dispatcher
        self.clock = clock
        self.on_event = on_event or (lambda status: None)
        # A recall cancels its message's pending answer at once: in its mailbox the recall
        # would wait behind the very message it cancels.
        self.on_recall = on_recall
        # A click on a tool-confirm card decides at once (bot/tools/confirm.py): the turn that
        # waits for it holds the chat's mailbox. The row is still handled (and ignored) in order.
        self.on_tool_click = on_tool_click
        # A click on a confirm card is decided here and answered in the callback's response
        # (toast + updated card within Lark's 3 s; bot/lark/card_clicks.py); a refused, repeated
        # or late click is finished at once, only the deciding click goes on to the mailbox.
        self.on_card_click = on_card_click
        self._active = 0
        self._last_done = 0.0
        self._idle: asyncio.Event | None = None
        self._watcher: asyncio.Task | None = None

    async def accept(self, raw: str, body: dict) -> IntakeResult:
        self._active += 1
        try:
            result = await self._accept(raw, body)
        finally:
            self._active -= 1
            self._last_done = time.monotonic()
        self.on_event(result.status)
        return result

    def _busy(self) -> bool:
        return self._active > 0 or time.monotonic() - self._last_done < QUIET_GAP_S

    async def quiet(self, max_hold: float = MAX_HOLD_S) -> None:
        """Acknowledge first, answer later: hold new conversation work while a burst of events
        is being acknowledged (an event in flight, or one within the last 5 ms), for at most
        ``max_hold``. On one event loop, every step of an answer delays the acknowledgements
        queued behind it; Lark's 3 s limit is hard, a reply's latency is not."""
        if not self._busy():
            return
        if self._watcher is None:
            self._idle = asyncio.Event()
            self._watcher = asyncio.get_running_loop().create_task(self._watch(self._idle), name="intake-quiet")
        assert self._idle is not None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._idle.wait(), max_hold)

    async def _watch(self, idle: asyncio.Event) -> None:
        """One watcher (not one poller per waiting job) opens the gate once the burst is over."""
        try:
            while self._busy():
                await asyncio.sleep(QUIET_GAP_S)
            idle.set()
        finally:
            self._watcher = None

    async def _accept(self, raw: str, body: dict) -> IntakeResult:
        if has_surrogates(raw):
            # Stored and handled without lone surrogates (UTF-8 cannot carry them; the handler
            # refused such a row and the user heard nothing).
            try:
                body = scrub(body)
                raw = json.dumps(body, ensure_ascii=False)
            except RecursionError:
                log.warning("event.invalid", error="nested too deep")
                return IntakeResult("invalid", "nested too deep")
        try:
            env = Envelope.model_validate(body)
        except ValidationError as e:
            log.warning("event.invalid", error=str(e)[:200])
            return IntakeResult("invalid", "not a schema 2.0 event")
        bound = log.bind(event_id=env.header.event_id, event_type=env.header.event_type)
        try:
            decoded = events.decode_envelope(env)
        except ValidationError as e:
            bound.warning("event.invalid", error=str(e)[:200])
            return IntakeResult("invalid", "event body does not fit its type")
        if decoded is None:
            bound.info("event.ignored", reason="unhandled event type")
            return IntakeResult("ignored", "unhandled event type")
        spec, ev = decoded.spec, decoded.body
        r = spec.route(ev, env.header)
        create_time = r.create_time or self.clock()
        # Only messages go stale: a recall or a click is about something already stored.
        stale = decoded.is_message and self.clock() - create_time > STALE_SECONDS
        item = await self.inbox.accept(
            event_id=env.header.event_id, message_id=r.message_id, chat_id=r.chat_id,
            conv_key=r.conv_key, create_time=create_time, payload=raw,
            status="ignored" if stale else "pending", note="older than 30 minutes" if stale else "",
            event_type=spec.event_type, dedup_key=r.dedup_key,
        )
        conv = r.conv_key
        bound = bound.bind(message_id=r.message_id or "", chat_id=r.chat_id)
        if item is None:
            bound.info("event.duplicate")
            return IntakeResult("duplicate")
        if stale:
            bound.info("event.ignored", reason="older than 30 minutes")
            return IntakeResult("ignored", "stale")
        shown = None
        if spec.event_type == events.CARD_ACTION and self.on_tool_click is not None:
            value = ev.action.value or {}
            if value.get("ethan") in ("tool_confirm", "tool_cancel"):
                clicker = ev.operator.open_id
                outcome = self.on_tool_click(str(value.get("token", "")), clicker,
                                             value.get("ethan") == "tool_confirm")
                bound.info("tool.confirm_click", outcome=outcome, user_id=clicker,
                           asked_by=str(value.get("user", "")))
                shown = tool_click_response(outcome)
        if spec.event_type == events.CARD_ACTION and self.on_card_click is not None:
            decision = await self.on_card_click(ev, env.header.event_id)
            if decision is not None:
                shown = decision.response
                if not decision.acts:
                    await self.inbox.finish(item.id, "ignored", decision.note)
                    return IntakeResult("ignored", decision.note, shown)
        if spec.event_type == events.MESSAGE_RECALLED and self.on_recall is not None and r.message_id:
            if await self.on_recall(r.message_id, r.chat_id):
                bound.info("event.recall_cancelled_reply")
        item = dataclasses.replace(item, event=decoded)    # decoded once: the handler takes it as is
        if self.inbox.conversations and not item.held:
            # Replicas: another replica works this conversation and answers the row in order.
            bound.info("event.accepted", conversation="held by another replica")
        elif not self.dispatcher.submit(conv, item):
            # Shutting down: it stays pending in the inbox and is answered on next start.
            bound.info("event.deferred", reason="shutting down")
        else:
            bound.info("event.accepted")
        return IntakeResult("accepted", response=shown)
