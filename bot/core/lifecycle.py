"""What Ethan does when something other than a new message happens in a chat — decided here,
once for every transport (issue 28: the adapter translates, the core decides).

A transport's adapter (Lark: bot/lark/events.py's registry, bot/lark/lifecycle.py) decodes its
event once into one of the neutral, frozen events below and carries out the few actions the
decisions need (``ChatActions``: say something, recall a message, settle a card). The handler
(bot/core/handler.py) routes an event here; ``HANDLERS`` is the one table from event type to what
is done with it (tests/bot/test_event_routing.py: every event the registry makes has a
handler, every handler an event).

The decisions:

* ``Recalled`` — the message leaves memory (memory/governance/withdraw.py), only that chat's message; the
  bot's answers to it are recalled at the transport too when ``recall_replies``
  (ETHAN_RECALL_REPLIES); audited.
* ``BotAdded`` — the chat counts as joined again; the group hears the introduction, once per
  event (the action's key comes from the event).
* ``BotRemoved`` — nothing can be sent there any more: queued messages of that chat are dropped
  (``chat_left``).
* ``P2pOpened`` — a user opening the bot's direct chat is greeted the first time only.
* ``ButtonClicked`` — a click on a destructive command's confirm/cancel card: only the user who
  asked may decide, a card is decided once, a confirmation runs the command as that user; a
  click on the /memory card's Forget / Correct: only its owner acts (bot/commands/memory_clicks.py).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol

from bot.core.inbound import Inbound
from bot.infra.log import get_logger
from bot.commands.memory_clicks import MEMORY, REFUSALS as MEMORY_REFUSALS, memory_clicked
from bot.core.reply import DeliveryError
from memory.governance import audit
from memory.sessions import chat_events
from memory.governance.withdraw import withdraw_message
from storage import Database

log = get_logger("ethan.lark.events")

INTRO = ("大家好，我是 Ethan，一个会记事的助手 👋\n"
         "• 在群里 @我 提问，我才会回答；私聊直接说就行。\n"
         "• 发 /help 看我能做什么（记忆、会话、模式）。\n"
         "• 隐私：我在群里学到的只用于群里；私聊里说的不会带到群里。发 /forget all 可删除你的记忆。\n\n"
         "Hi, I'm Ethan, an assistant with a memory. @mention me in this group to ask; /help lists "
         "what I do; what I learn in private stays private.")
GREETING = ("你好，我是 Ethan 👋 直接跟我说话就行；发 /help 看我能做什么。\n"
            "Hi, I'm Ethan — just talk to me; /help lists what I can do.")
CANCELLED = "已取消，什么都没有删除。 / Cancelled — nothing was deleted."
CONFIRM, CANCEL = "confirm", "cancel"      # the two buttons of a command's confirm card


# -- the neutral events ---------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Recalled:
    message_id: str
    chat_id: str


@dataclass(frozen=True, slots=True)
class BotAdded:
    chat_id: str
    operator_id: str = ""
    name: str = ""


@dataclass(frozen=True, slots=True)
class BotRemoved:
    chat_id: str
    operator_id: str = ""


@dataclass(frozen=True, slots=True)
class P2pOpened:
    chat_id: str
    operator_id: str = ""


@dataclass(frozen=True, slots=True)
class ButtonClicked:
    """A click on one of the bot's cards. ``button``: ``confirm`` / ``cancel`` for a command's
    confirm card, anything else (another app's card, a tool-confirm card — decided at intake,
    bot/tools/confirm.py) is not this table's."""

    card_message_id: str
    chat_id: str
    clicker: str
    button: str = ""
    asked_by: str = ""          # the user the card was sent to (the only one who may decide)
    command: str = ""           # the command a confirmation runs
    chat_type: str = "p2p"
    # the /memory card's buttons (button "memory", bot/commands/memory_clicks.py): forget | correct |
    # save | back, the item, and the text a Save submits
    op: str = ""
    item_kind: str = ""
    item_id: int = -1
    text: str = ""


ChatEvent = Recalled | BotAdded | BotRemoved | P2pOpened | ButtonClicked


class ChatActions(Protocol):
    """What the decisions need a transport to do. Raise ``DeliveryError`` when it refuses."""

    async def say(self, chat_id: str, text: str, *, key: str) -> None:
        """A message to the chat; ``key`` makes a redelivered event's message one message."""

    async def unsend(self, message_id: str) -> None:
        """Recall one of the bot's messages."""

    async def settle_card(self, card_message_id: str, answer: str, outcome: str) -> None:
        """Show a confirm card's outcome (``confirmed`` / ``cancelled``) and the answer on it."""

    async def show_memory_card(self, card_message_id: str, view: Any, *, chat_type: str, notice: str = "",
                               editing: Any = None) -> None:
        """Redraw a /memory card: the list (``view``: bot.commands.memory.MemoryView) with ``notice`` on
        top, or the item ``editing`` in its edit form."""


@dataclass
class LifecycleDeps:
    db: Database
    finish: Callable[..., Awaitable[None]]          # the inbox row's end: (id, status, note)
    run_command: Callable[[Inbound, str], Awaitable[str | None]]
    actions: ChatActions | None = None              # None: no transport to act in
    recall_replies: bool = False                    # ETHAN_RECALL_REPLIES
    transport: str = "lark"                         # the confirmed command's Inbound.transport
    confirm_ttl_s: float = 600.0                    # ETHAN_CONFIRM_CARD_MINUTES × 60 (bot/lark/card_clicks.py)


class Lifecycle:
    """The handler's ``events``: ``handle(item, event)`` decides and finishes the inbox row;
    ``chat_left(chat_id)`` says a chat's messages are no longer answered."""

    def __init__(self, deps: LifecycleDeps) -> None:
        self.d = deps
        self._left: set[str] | None = None    # chats the bot was removed from (memory/sessions/chat_events.py)

    async def chat_left(self, chat_id: str) -> bool:
        return chat_id in await self._left_chats()

    async def handle(self, item: Any, event: ChatEvent) -> None:
        bound = log.bind(event_id=item.event_id, event_type=item.event_type, chat_id=item.chat_id,
                         message_id=item.message_id or "")
        try:
            await HANDLERS[type(event)](self, item, event, bound)
        except DeliveryError as e:
            bound.warning("lark_event.failed", **e.fields)
            await self.d.finish(item.id, "failed", e.reason)

    async def _left_chats(self) -> set[str]:
        # Read once per process, then kept current by this process's own join/leave events.
        if self._left is None:
            self._left = await chat_events.chats_left(self.d.db)
        return self._left

    # -- recall -----------------------------------------------------------------------------
    async def recalled(self, item: Any, ev: Recalled, bound: Any) -> None:
        got = await withdraw_message(self.d.db, ev.message_id, ev.chat_id)   # only that chat's message
        recalled_replies = 0
        if self.d.recall_replies and self.d.actions is not None:
            for mid in got.reply_message_ids:
                try:
                    await self.d.actions.unsend(mid)
                    recalled_replies += 1
                except DeliveryError as e:   # already gone, or past the transport's recall window
                    bound.info("recall.reply_not_recalled", reply_message_id=mid, **e.fields)
        detail = json.dumps({**got.counts, "replies_recalled": recalled_replies}, sort_keys=True)
        await audit.record(self.d.db, self.d.transport, "message.recalled", target=ev.message_id,
                           chat_id=ev.chat_id, detail=detail)
        bound.info("message.recalled", session_id=got.session_id, found=got.found,
                   replies_recalled=recalled_replies, **{f"n_{k}": v for k, v in got.counts.items()})
        await self.d.finish(item.id, "done", "recalled")

    # -- joining ----------------------------------------------------------------------------
    async def added(self, item: Any, ev: BotAdded, bound: Any) -> None:
        (await self._left_chats()).discard(ev.chat_id)
        await chat_events.chat_rejoined(self.d.db, ev.chat_id)
        if self.d.actions is None:
            await self.d.finish(item.id, "ignored", "no Lark sender")
            return
        # The key from the event: a redelivered join introduces once.
        await self.d.actions.say(ev.chat_id, INTRO, key=f"intro-{item.event_id}")
        await chat_events.first_greeting(self.d.db, ev.chat_id, "group")
        bound.info("chat.joined", operator=ev.operator_id, name=ev.name[:64])
        await self.d.finish(item.id, "done", "introduced")

    async def removed(self, item: Any, ev: BotRemoved, bound: Any) -> None:
        # Nothing can be sent there any more; queued messages of that chat are dropped.
        (await self._left_chats()).add(ev.chat_id)
        await chat_events.chat_left(self.d.db, ev.chat_id)
        bound.info("chat.left", operator=ev.operator_id)
        await self.d.finish(item.id, "done", "removed from chat")

    async def p2p_opened(self, item: Any, ev: P2pOpened, bound: Any) -> None:
        if self.d.actions is None or not await chat_events.first_greeting(self.d.db, ev.chat_id, "p2p"):
            bound.info("chat.p2p_entered", greeted=False)
            await self.d.finish(item.id, "ignored", "greeted before")
            return
        await self.d.actions.say(ev.chat_id, GREETING, key=f"greet-{item.event_id}")
        bound.info("chat.p2p_entered", greeted=True, operator=ev.operator_id)
        await self.d.finish(item.id, "done", "greeted")

    # -- buttons ----------------------------------------------------------------------------
    async def clicked(self, item: Any, ev: ButtonClicked, bound: Any) -> None:
        card_mid, clicker = ev.card_message_id, ev.clicker
        if ev.button == MEMORY and card_mid:                # the /memory card (bot/commands/memory_clicks.py)
            note = await memory_clicked(self.d, item, ev, bound)
            await self.d.finish(item.id, "ignored" if note in MEMORY_REFUSALS else "done", note)
            return
        if ev.button not in (CONFIRM, CANCEL) or not card_mid:
            await self.d.finish(item.id, "ignored", "not an Ethan button")
            return
        bound = bound.bind(user_id=clicker, card_message_id=card_mid)
        outcome = "confirmed" if ev.button == CONFIRM else "cancelled"
        # Intake decided the click (bot/lark/card_clicks.py: the confirm-card ledger, the user
        # asked, the TTL, first click only) and finished every row but the deciding one. Checked
        # again here from the ledger — never from the button's value — for a row intake did not
        # decide (one stored by an older version).
        card = await chat_events.confirm_card(self.d.db, card_mid)
        if card is None or clicker != card.user_id:
            note = "not a card Ethan sent" if card is None else "click by another user"
            bound.info("card.refused", reason=note, asked_by=card.user_id if card else "")
            await audit.record(self.d.db, clicker, "card.confirm", target=ev.command[:200],
                               chat_id=ev.chat_id, detail=note, allowed=False)
            await self.d.finish(item.id, "ignored", note)
            return
        if card.outcome == chat_events.ASKED:
            if not await chat_events.claim_card(self.d.db, card_mid, clicker, outcome,
                                                sent_after=time.time() - self.d.confirm_ttl_s):
                bound.info("card.already_decided")
                await self.d.finish(item.id, "ignored", "card already decided or expired")
                return
        elif card.outcome != outcome:
            bound.info("card.already_decided")
            await self.d.finish(item.id, "ignored", "card already decided")
            return
        if outcome == "confirmed":
            inbound = Inbound(transport=self.d.transport, message_id=f"{card_mid}-confirm", chat_id=ev.chat_id,
                              chat_type=ev.chat_type or "p2p", sender_id=clicker, text=ev.command,
                              event_id=item.event_id)
            answer = await self.d.run_command(inbound, ev.command) or ""
        else:
            answer = CANCELLED
        bound.info("card.decided", outcome=outcome, command=ev.command[:40])
        if self.d.actions is not None:
            await self.d.actions.settle_card(card_mid, answer, outcome)
        await self.d.finish(item.id, "done", outcome)


HANDLERS: dict[type, Callable[[Lifecycle, Any, Any, Any], Awaitable[None]]] = {
    Recalled: Lifecycle.recalled,
    BotAdded: Lifecycle.added,
    BotRemoved: Lifecycle.removed,
    P2pOpened: Lifecycle.p2p_opened,
    ButtonClicked: Lifecycle.clicked,
}
"""Event type → what is done with it (a new message, ``Inbound``, is the handler's own)."""
