"""From an inbox item to an answer: parse, filter by Lark's rules, command or agent.

Runs inside the conversation's mailbox (bot/dispatch.py), so one conversation's
messages are handled in order. The inbox row is marked done only after the reply was
handed to the transport; a crash before that leaves it pending, to be answered on the
next start (with the same uuids, so Lark never shows a reply twice).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol

from pydantic import ValidationError

from bot.agent.agent import Agent, Turn, is_chinese
from bot.inbox import STALE_SECONDS, Inbox, InboxItem
from bot.lark.events import MESSAGE_RECEIVE, Envelope
from bot.lark.openapi import Category, LarkApiError
from bot.lark.normalize import Inbound, parse_event
from bot.log import get_logger
from bot.reply import Reply

log = get_logger("ethan.handler")

GIVE_UP = (Category.PERMISSION, Category.BAD_REQUEST)   # Lark will not take this answer later either

UNREADABLE = {
    "image": ("图片", "images"), "file": ("文件", "files"), "audio": ("语音", "voice messages"),
    "media": ("视频", "videos"), "sticker": ("表情包", "stickers"),
    "share_chat": ("群名片", "shared chats"), "share_user": ("个人名片", "shared contacts"),
    "interactive": ("卡片消息", "cards"), "location": ("位置", "locations"),
    "merge_forward": ("合并转发的消息", "forwarded message bundles"),
}
EMPTY_REPLY = {"zh": "我在～有什么可以帮你的？", "en": "I'm here — what can I do for you?"}


def unreadable_reply(message_type: str, *, chinese: bool = True) -> str:
    zh, en = UNREADABLE.get(message_type, ("这种消息", "this kind of message"))
    if chinese:
        return f"抱歉，我暂时还看不懂{zh}，可以用文字告诉我吗？"
    return f"Sorry, I can't read {en} yet — could you tell me in text?"


class CommandRunner(Protocol):
    async def run(self, inbound: Inbound, text: str) -> str | None:
        """The command's answer, or None when ``text`` is not a command."""


class NameResolver(Protocol):
    async def name(self, open_id: str) -> str: ...


@dataclass
class HandlerDeps:
    inbox: Inbox
    agent: Agent
    commands: CommandRunner
    make_reply: Callable[..., Reply]   # (inbound, *, resumed: an earlier run started it)
    bot_open_id: Callable[[], Awaitable[str]]   # waits until the bot's identity is known
    is_admin: Callable[[str], bool]
    respond_to_all: bool = False
    names: NameResolver | None = None
    on_ignored: Callable[[str], None] | None = None
    on_replied: Callable[[float], None] | None = None
    # An answer Lark did not take for a reason that may pass: hand the item back to be tried
    # again later in this process (returns the delay in s, or None when it will not be).
    retry_later: Callable[[InboxItem], float | None] | None = None


class MessageHandler:
    def __init__(self, deps: HandlerDeps, *, clock=time.time) -> None:
        self.d = deps
        self.clock = clock

    async def __call__(self, item: InboxItem) -> None:
        await self.handle(item)

    async def handle(self, item: InboxItem) -> None:
        d = self.d
        bound = log.bind(event_id=item.event_id, message_id=item.message_id or "", chat_id=item.chat_id)
        await d.inbox.start(item.id)
        try:
            # stdlib json, as at intake: pydantic's parser stops at depth 200 (an event intake took)
            envelope = Envelope.model_validate(json.loads(item.payload))
            if envelope.header.event_type != MESSAGE_RECEIVE:
                await self._ignore(item, "unhandled event type", bound)
                return
            bot_id = await d.bot_open_id()
            inbound = parse_event(envelope, bot_open_id=bot_id)
        except (ValidationError, ValueError, RecursionError) as e:
            bound.warning("event.unparseable", error=str(e)[:300])
            await d.inbox.finish(item.id, "failed", "unparseable event")
            return

        reason = self.skip_reason(inbound, bot_id)
        if reason:
            await self._ignore(item, reason, bound)
            return

        reply = d.make_reply(inbound, resumed=item.attempts > 0)
        started = time.monotonic()
        try:
            await self._answer(inbound, reply, bound)
            await d.inbox.finish(item.id, "done")
        except LarkApiError as e:
            # Delivery failed after the sender's retries; `reply.failed` already says why, with
            # the ids. Lark refused for good (permission, a bad request): recorded as failed, not
            # replayed at every start. Otherwise it stays pending and is tried again later (the
            # stored answer is replayed under the same uuid) until the 30-minute rule drops it.
            retry_in = None
            if e.category in GIVE_UP:
                await d.inbox.finish(item.id, "failed", f"lark code {e.code}: {e.msg}")
            elif d.retry_later is not None:
                retry_in = d.retry_later(item)
            bound.warning("reply.undelivered", code=e.code, category=e.category.value,
                          inbox="failed" if e.category in GIVE_UP else "pending", retry_in_s=retry_in)
            return
        except asyncio.CancelledError:
            # Cancelled at the shutdown deadline after the answer was delivered (e.g. while the
            # "typing" reaction was being removed): record it, or the restart would answer again.
            if getattr(reply, "delivered_as", None):
                await d.inbox.finish(item.id, "done", "delivered; cancelled after")
            raise
        if d.on_replied is not None:
            d.on_replied(time.monotonic() - started)

    async def _answer(self, inbound: Inbound, reply: Any, bound: Any) -> None:
        d = self.d
        chinese = is_chinese(inbound.text) or not inbound.text
        if inbound.text == "" and inbound.message_type not in ("text", "post"):
            await reply.finish(unreadable_reply(inbound.message_type, chinese=True))
        elif inbound.content_error:
            bound.warning("event.bad_content", error=inbound.content_error)
            await reply.finish(unreadable_reply(inbound.message_type, chinese=True))
        elif not inbound.text:
            await reply.finish(EMPTY_REPLY["zh" if chinese else "en"])
        else:
            answer = await d.commands.run(inbound, inbound.text)
            if answer is not None:
                await reply.finish(answer)
                bound.info("command.answered", command=inbound.text.split()[0][:32])
            else:
                name = ""
                if inbound.chat_type != "p2p" and d.names is not None:
                    name = await d.names.name(inbound.sender_id)
                turn = Turn(scope=inbound.scope(is_admin=d.is_admin(inbound.sender_id)),
                            text=inbound.text, sender_name=name,
                            lark_message_id=inbound.message_id, truncated=inbound.truncated)
                await d.agent.respond(turn, reply)

    def skip_reason(self, inbound: Inbound, bot_id: str) -> str:
        """Lark's rules for what the bot answers (DESIGN.md §5); '' means answer."""
        if inbound.from_bot or (inbound.sender_id and inbound.sender_id == bot_id):
            return "sent by a bot"
        if not inbound.sender_id:
            return "no sender"
        if inbound.create_time and self.clock() - inbound.create_time > STALE_SECONDS:
            return "older than 30 minutes"
        if inbound.chat_type != "p2p":
            addressed = inbound.mentions_bot or (self.d.respond_to_all and inbound.mentions_all)
            if not addressed:
                return "group message not addressed to the bot"
        return ""

    async def _ignore(self, item: InboxItem, reason: str, bound: Any) -> None:
        bound.info("event.ignored", reason=reason)
        await self.d.inbox.finish(item.id, "ignored", reason)
        if self.d.on_ignored is not None:
            self.d.on_ignored(reason)
