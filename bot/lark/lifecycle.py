"""Lark's side of the handler's decode and of the chat's lifecycle: this adapter translates and
acts; the core (bot/core/lifecycle.py) decides.

* ``LarkDecoder`` — the handler's ``decode``: an inbox item → the neutral event, from the event
  the intake decoded (``InboxItem.event``) or, for a row read back from the database, from one
  decode of its payload (bot/lark/events.py). A message becomes ``Inbound`` (a topic-mode
  group's topic is its thread); a recall, a join or leave, a p2p chat opened, a card click
  become bot/core/lifecycle.py's events.
* ``LarkActions`` — ``bot.core.lifecycle.ChatActions`` over the Open API: a text message with a uuid,
  recalling a message, patching a confirm card or the /memory card; Lark's errors become ``DeliveryError``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Awaitable, Callable

from bot.core.inbound import Inbound, NotAMessage
from bot.lark import events
from bot.lark.outbound.cards import confirm_outcome_card
from bot.lark.openapi.client import LarkApiError
from bot.core.reply import DeliveryError


def decoded(item: Any) -> events.LarkEvent | None:
    """The item's Lark event: the one the intake decoded, else its payload decoded now. None for
    a type not in the registry; ``ValueError`` / ``RecursionError`` for a payload that does not parse."""
    return item.event if item.event is not None else events.decode(item.payload)


class LarkDecoder:
    """The handler's ``decode`` for Lark: an inbox item → ``Inbound`` or a bot/core/lifecycle.py event.

    Raises ``NotAMessage`` for a type not in the registry, ``ValueError`` (pydantic's
    ``ValidationError`` is one) or ``RecursionError`` for a payload that does not parse."""

    def __init__(self, bot_open_id: Callable[[], Awaitable[str]],
                 is_topic_chat: Callable[[str], Awaitable[bool]] | None = None) -> None:
        self.bot_open_id = bot_open_id
        self.is_topic_chat = is_topic_chat     # bot/lark/openapi/chats.py; None: no topic groups known

    async def __call__(self, item: Any) -> Any:
        ev = decoded(item)
        if ev is None:
            raise NotAMessage("unhandled event type")
        if not ev.is_message:
            return ev.translate()
        inbound: Inbound = ev.translate(await self.bot_open_id())
        if (not inbound.thread_id and inbound.chat_type == "group"
                and self.is_topic_chat is not None and await self.is_topic_chat(inbound.chat_id)):
            # A topic-mode group names a topic by its first message (a reply's root_id, or the
            # message itself when it starts one), no thread_id: the topic is the conversation
            # (and the memory session), as a thread is.
            inbound = replace(inbound, thread_id=inbound.root_id or inbound.message_id)
        return inbound


def _refused(e: LarkApiError) -> DeliveryError:
    return DeliveryError(f"lark code {e.code}: {e.msg}", permanent=True, **e.log_fields())


class LarkActions:
    """``bot.core.lifecycle.ChatActions`` for Lark."""

    def __init__(self, sender: Any, api: Any) -> None:
        self.sender = sender          # bot/lark/outbound/__init__.py LarkSender
        self.api = api                # bot/lark/openapi/client.py OpenApi

    async def say(self, chat_id: str, text: str, *, key: str) -> None:
        # The key as the message's uuid: Lark drops a second message with it.
        try:
            await self.sender.send(chat_id, "text", {"text": text}, uuid=key[:50])
        except LarkApiError as e:
            raise _refused(e) from e

    async def unsend(self, message_id: str) -> None:
        try:
            await self.api.request("DELETE", f"/open-apis/im/v1/messages/{message_id}")
        except LarkApiError as e:
            raise _refused(e) from e

    async def settle_card(self, card_message_id: str, answer: str, outcome: str) -> None:
        try:
            await self.api.request("PATCH", f"/open-apis/im/v1/messages/{card_message_id}",
                                   json={"content": json.dumps(confirm_outcome_card(answer, outcome),
                                                               ensure_ascii=False)})
        except LarkApiError as e:
            raise _refused(e) from e

    async def show_memory_card(self, card_message_id: str, view: Any, *, chat_type: str, notice: str = "",
                               editing: Any = None) -> None:
        from bot.lark.outbound.memory_card import edit_card, memory_card

        card = (edit_card(view, editing, chat_type=chat_type) if editing is not None
                else memory_card(view, chat_type=chat_type, notice=notice))
        try:
            await self.api.request("PATCH", f"/open-apis/im/v1/messages/{card_message_id}",
                                   json={"content": json.dumps(card, ensure_ascii=False)})
        except LarkApiError as e:
            raise _refused(e) from e
