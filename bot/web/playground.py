"""The console playground: a message typed as any user, in a p2p chat or the console's group,
answered by the same dispatcher, handler, commands, agent and memory as Lark's messages.

The adapter only translates: the request becomes a neutral ``Inbound`` (bot/core/inbound.py) and
the answer arrives in this request's own ``PlaygroundReply`` (bot/core/reply.py's interface), whose
outcome ``Conversations.ask`` awaits. No Lark event is made up and nothing goes to the inbox.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from typing import Any

from bot.delivery.direct import NotAccepting
from bot.core.inbound import CONSOLE, Mention, typed_message
from bot.infra.log import get_logger
from bot.core.reply import Capability, ReplyBase
from bot.web.data import MAX_TEXT, ApiError, ConsoleData, ConsoleDeps

log = get_logger("ethan.console")

PLAYGROUND_USER = re.compile(r"^ou_[A-Za-z0-9_-]{1,100}$")
MAX_NAME = 64
GROUP_CHAT_ID = "oc_console_group"
P2P_CHAT_PREFIX = "oc_console_p2p_"
BOT_NAME = "Ethan"


class PlaygroundReply(ReplyBase):
    """A Reply (bot/core/reply.py) that keeps what the agent gave it, for one HTTP request."""

    capabilities = frozenset({Capability.MEMORY_PANEL, Capability.TOOL_PANEL})   # the memory panel

    def __init__(self) -> None:
        self.text: str | None = None
        self.latest = ""
        self.partials = 0
        self.memory: dict | None = None
        self.tools: list[dict] | None = None     # filled only if the agent reports its tool calls
        self.working_shown = False
        self.started = time.monotonic()
        self.first_text_ms: int | None = None

    async def working(self) -> None:
        self.working_shown = True

    async def stream(self, text_so_far: str) -> None:
        self.partials += 1
        self.latest = text_so_far
        if self.first_text_ms is None:
            self.first_text_ms = int((time.monotonic() - self.started) * 1000)

    async def finish(self, text: str) -> None:
        self.text = text

    def show_tools(self, tools: Any) -> None:
        """The memory tools the model called for this answer (name, is_error, result)."""
        try:
            self.tools = [{"name": str(t.get("name", "")), "is_error": bool(t.get("is_error")),
                           "result": str(t.get("result", ""))[:500]} for t in tools]
        except Exception:  # noqa: BLE001
            self.tools = None

    def show_memory(self, blocks: Any) -> None:
        try:
            self.memory = blocks.as_dict()
        except Exception as e:  # noqa: BLE001 — the panel must never break a reply
            self.memory = {"error": f"{type(e).__name__}: {e}"[:200]}


def p2p_chat_id(user_id: str) -> str:
    return P2P_CHAT_PREFIX + re.sub(r"[^A-Za-z0-9_]", "_", user_id)


class Playground:
    def __init__(self, deps: ConsoleDeps, data: ConsoleData) -> None:
        self.d = deps
        self.data = data

    async def play(self, body: dict) -> tuple[int, dict]:
        user_id = body.get("user_id")
        name = body.get("name", "")
        chat = body.get("chat", "p2p")
        mention = body.get("mention", True)
        text = body.get("text")
        if not isinstance(user_id, str) or not PLAYGROUND_USER.match(user_id):
            raise ApiError(400, "user_id must be an open_id: ou_ followed by letters, digits, _ or -")
        if not isinstance(name, str) or len(name) > MAX_NAME or "\n" in name:
            raise ApiError(400, f"name must be one line of at most {MAX_NAME} characters")
        if chat not in ("p2p", "group"):
            raise ApiError(400, "chat must be p2p or group")
        if not isinstance(mention, bool):
            raise ApiError(400, "mention must be true or false")
        if not isinstance(text, str) or not text.strip():
            raise ApiError(400, "text must be a non-empty string")
        if len(text) > MAX_TEXT:
            raise ApiError(413, f"text is longer than {MAX_TEXT} characters")
        name = name.strip()
        if name:
            self.data.names[user_id] = name
        try:
            bot_id = await asyncio.wait_for(self.d.bot_open_id(), 10)
        except asyncio.TimeoutError:
            raise ApiError(503, "the bot's identity (bot/v3/info) is not known yet") from None
        addressed = chat == "group" and mention
        inbound = typed_message(
            transport=CONSOLE, message_id="om_console_" + uuid.uuid4().hex,
            chat_id=p2p_chat_id(user_id) if chat == "p2p" else GROUP_CHAT_ID, chat_type=chat,
            sender_id=user_id, sender_name=name, text=text,
            mentions=(Mention("@_user_1", bot_id, BOT_NAME, "bot"),) if addressed else (),
            mentions_bot=addressed)
        reply = PlaygroundReply()
        started = time.monotonic()
        try:
            outcome = await self.d.conversations.ask(inbound, reply)
        except NotAccepting:
            raise ApiError(503, "the bot is not accepting messages right now") from None
        session = None
        try:
            active = await self.data.m.sessions.active(inbound.conv_key)
            session = active.id if active else None
        except Exception:  # noqa: BLE001
            session = None
        status = outcome.status if outcome.status in ("answered", "ignored") else "timeout"
        out = {
            "status": status, "reason": outcome.reason, "text": reply.text, "memory": reply.memory,
            "tools": reply.tools, "message_id": inbound.message_id, "chat_id": inbound.chat_id,
            "chat_type": chat, "user_id": user_id, "session_id": session, "streamed_parts": reply.partials,
            "first_text_ms": reply.first_text_ms, "elapsed_ms": int((time.monotonic() - started) * 1000),
        }
        return (200 if status in ("answered", "ignored") else 504), out
