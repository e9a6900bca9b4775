"""Lark events that are not new messages, handled from the same registry (bot/lark/events.py)
and the same inbox/mailbox path as messages: a recall, the bot joining or leaving a group, a
user opening the bot's p2p chat, a click on the bot's confirmation card.

The handler (bot/handler.py) knows no Lark: it asks ``LarkEvents`` first, which answers
False for messages (the handler's own job) and handles the rest, finishing the inbox row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from bot.inbound import LARK, Inbound
from memory.inbox import Inbox, InboxItem
from bot.lark import events
from bot.lark.cards import confirm_outcome_card
from bot.lark.events import Envelope
from bot.lark.openapi import LarkApiError
from bot.log import get_logger
from memory import audit, chat_events
from storage import Database
from memory.withdraw import withdraw_message

log = get_logger("ethan.lark.events")

INTRO = ("大家好，我是 Ethan，一个会记事的助手 👋\n"
         "• 在群里 @我 提问，我才会回答；私聊直接说就行。\n"
         "• 发 /help 看我能做什么（记忆、会话、模式）。\n"
         "• 隐私：我在群里学到的只用于群里；私聊里说的不会带到群里。发 /forget all 可删除你的记忆。\n\n"
         "Hi, I'm Ethan, an assistant with a memory. @mention me in this group to ask; /help lists "
         "what I do; what I learn in private stays private.")
GREETING = ("你好，我是 Ethan 👋 直接跟我说话就行；发 /help 看我能做什么。\n"
            "Hi, I'm Ethan — just talk to me; /help lists what I can do.")


@dataclass
class LarkEventDeps:
    inbox: Inbox
    db: Database
    sender: Any                     # LarkSender (None without Lark)
    api: Any                        # OpenApi (None without Lark)
    run_command: Callable[[Inbound, str], Awaitable[str | None]]
    bot_open_id: Callable[[], Awaitable[str]]
    recall_replies: bool = False


class LarkEvents:
    """``HandlerDeps.events`` for Lark: True when the item was a non-message event (handled)."""

    def __init__(self, deps: LarkEventDeps) -> None:
        self.d = deps
        self._left: set[str] | None = None    # chats the bot was removed from (memory/chat_events.py)

    async def __call__(self, item: InboxItem) -> bool:
        if item.event_type == events.MESSAGE_RECEIVE:
            # The common case decided from the stored type: the payload is parsed once, by the
            # decoder (not here too).
            if item.chat_id in await self._left_chats():
                await self._finish(item, "ignored", "bot removed from the chat")
                return True
            return False
        try:
            env = Envelope.model_validate(json.loads(item.payload))
            parsed = events.parse(env)
        except (ValueError, RecursionError):
            return False                     # the handler's decoder reports it
        if parsed is None:
            await self._finish(item, "ignored", "unhandled event type")
            return True
        spec, ev = parsed
        if spec.kind == "message":
            if item.chat_id in await self._left_chats():
                await self._finish(item, "ignored", "bot removed from the chat")
                return True
            return False
        bound = log.bind(event_id=item.event_id, event_type=spec.event_type, chat_id=item.chat_id,
                         message_id=item.message_id or "")
        try:
            await getattr(self, f"_on_{spec.kind}")(item, ev, bound)
        except LarkApiError as e:
            bound.warning("lark_event.failed", **e.log_fields())
            await self._finish(item, "failed", f"lark code {e.code}: {e.msg}")
        return True

    async def _left_chats(self) -> set[str]:
        # Read once per process, then kept current by this process's own join/leave events.
        if self._left is None:
            self._left = await chat_events.chats_left(self.d.db)
        return self._left

    async def _finish(self, item: InboxItem, status: str, note: str = "") -> None:
        await self.d.inbox.finish(item.id, status, note)

    # -- recall -----------------------------------------------------------------------------
    async def _on_recall(self, item: InboxItem, ev: events.RecalledEvent, bound: Any) -> None:
        got = await withdraw_message(self.d.db, ev.message_id, ev.chat_id)   # only that chat's message
        recalled_replies = 0
        if self.d.recall_replies and self.d.api is not None:
            for mid in got.reply_message_ids:
                try:
                    await self.d.api.request("DELETE", f"/open-apis/im/v1/messages/{mid}")
                    recalled_replies += 1
                except LarkApiError as e:   # already gone, or past Lark's recall window
                    bound.info("recall.reply_not_recalled", reply_message_id=mid, **e.log_fields())
        detail = json.dumps({**got.counts, "replies_recalled": recalled_replies}, sort_keys=True)
        await audit.record(self.d.db, "lark", "message.recalled", target=ev.message_id,
                           chat_id=ev.chat_id, detail=detail)
        bound.info("message.recalled", session_id=got.session_id, found=got.found,
                   replies_recalled=recalled_replies, **{f"n_{k}": v for k, v in got.counts.items()})
        await self._finish(item, "done", "recalled")

    # -- joining ----------------------------------------------------------------------------
    async def _on_joined(self, item: InboxItem, ev: events.ChatMemberBotEvent, bound: Any) -> None:
        (await self._left_chats()).discard(ev.chat_id)
        await chat_events.chat_rejoined(self.d.db, ev.chat_id)
        if self.d.sender is None:
            await self._finish(item, "ignored", "no Lark sender")
            return
        # uuid from the event: a redelivered join introduces once (Lark dedups on it).
        await self.d.sender.send(ev.chat_id, "text", {"text": INTRO}, uuid=f"intro-{item.event_id}"[:50])
        await chat_events.first_greeting(self.d.db, ev.chat_id, "group")
        bound.info("chat.joined", operator=ev.operator_id.open_id, name=ev.name[:64])
        await self._finish(item, "done", "introduced")

    async def _on_left(self, item: InboxItem, ev: events.ChatMemberBotEvent, bound: Any) -> None:
        # Nothing can be sent there any more; queued messages of that chat are dropped.
        (await self._left_chats()).add(ev.chat_id)
        await chat_events.chat_left(self.d.db, ev.chat_id)
        bound.info("chat.left", operator=ev.operator_id.open_id)
        await self._finish(item, "done", "removed from chat")

    async def _on_p2p_entered(self, item: InboxItem, ev: events.P2pEnteredEvent, bound: Any) -> None:
        if self.d.sender is None or not await chat_events.first_greeting(self.d.db, ev.chat_id, "p2p"):
            bound.info("chat.p2p_entered", greeted=False)
            await self._finish(item, "ignored", "greeted before")
            return
        await self.d.sender.send(ev.chat_id, "text", {"text": GREETING}, uuid=f"greet-{item.event_id}"[:50])
        bound.info("chat.p2p_entered", greeted=True, operator=ev.operator_id.open_id)
        await self._finish(item, "done", "greeted")

    # -- buttons ----------------------------------------------------------------------------
    async def _on_card_action(self, item: InboxItem, ev: events.CardActionEvent, bound: Any) -> None:
        value = ev.action.value or {}
        card_mid = ev.context.open_message_id
        clicker = ev.operator.open_id
        if value.get("ethan") not in ("confirm", "cancel") or not card_mid:
            await self._finish(item, "ignored", "not an Ethan button")
            return
        bound = bound.bind(user_id=clicker, card_message_id=card_mid)
        if clicker != value.get("user"):
            bound.info("card.refused", reason="not the user who asked", asked_by=value.get("user", ""))
            await audit.record(self.d.db, clicker, "card.confirm", target=str(value.get("cmd", ""))[:200],
                               chat_id=ev.context.open_chat_id, detail="not the user who asked",
                               allowed=False)
            await self._finish(item, "ignored", "click by another user")
            return
        outcome = "confirmed" if value["ethan"] == "confirm" else "cancelled"
        if not await chat_events.claim_card(self.d.db, card_mid, clicker, outcome):
            bound.info("card.already_decided")
            await self._finish(item, "ignored", "card already decided")
            return
        if outcome == "confirmed":
            cmd = str(value.get("cmd", ""))
            inbound = Inbound(transport=LARK, message_id=f"{card_mid}-confirm", chat_id=ev.context.open_chat_id,
                              chat_type=str(value.get("chat_type") or "p2p"), sender_id=clicker, text=cmd,
                              event_id=item.event_id)
            answer = await self.d.run_command(inbound, cmd) or ""
        else:
            answer = "已取消，什么都没有删除。 / Cancelled — nothing was deleted."
        bound.info("card.decided", outcome=outcome, command=str(value.get("cmd", ""))[:40])
        if self.d.api is not None:
            await self.d.api.request("PATCH", f"/open-apis/im/v1/messages/{card_mid}",
                                     json={"content": json.dumps(confirm_outcome_card(answer, outcome),
                                                                 ensure_ascii=False)})
        await self._finish(item, "done", outcome)
