"""Lark event wire models and the event registry: an event is decoded once (schema 2.0).

``decode(body)`` parses and validates an event (pydantic, at the edge) into a frozen
``LarkEvent``: its registry spec, header and typed body. The intake decodes what Lark sends and
hands the decoded event on with the inbox row (``InboxItem.event``); a row read back from the
database (after a restart, from another replica) is decoded once when it is handled. Nothing
parses the payload again: the handler's decoder (bot/lark/lifecycle.py) translates the
decoded event into the neutral one the core works on — ``Inbound`` for a message (``spec.event``
says which), a bot/core/lifecycle.py event otherwise — with the spec's ``translate``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from bot.core import lifecycle as core
from bot.core.inbound import Inbound
from bot.lark.normalize import epoch_seconds, message_inbound
from memory.scope import conversation_key


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class UserId(_Wire):
    open_id: str = ""
    union_id: str = ""
    user_id: str | None = ""


class Sender(_Wire):
    sender_id: UserId = Field(default_factory=UserId)
    sender_type: str = ""
    tenant_key: str = ""


class Mention(_Wire):
    key: str = ""
    id: UserId = Field(default_factory=UserId)
    name: str = ""
    mentioned_type: str = ""


class Message(_Wire):
    message_id: str
    root_id: str | None = ""
    parent_id: str | None = ""
    create_time: str = "0"
    chat_id: str
    thread_id: str | None = ""
    chat_type: str = "p2p"
    message_type: str = "text"
    content: str = ""
    mentions: list[Mention] | None = None


class MessageEvent(_Wire):
    sender: Sender = Field(default_factory=Sender)
    message: Message


class Header(_Wire):
    event_id: str
    event_type: str
    create_time: str = "0"
    token: str = ""
    app_id: str = ""
    tenant_key: str = ""


class Envelope(_Wire):
    """A schema 2.0 event; ``event`` stays a dict until its type is known."""

    schema_: str = Field("", alias="schema")
    header: Header
    event: dict = Field(default_factory=dict)


MESSAGE_RECEIVE = "im.message.receive_v1"
MESSAGE_RECALLED = "im.message.recalled_v1"
BOT_ADDED = "im.chat.member.bot.added_v1"
BOT_DELETED = "im.chat.member.bot.deleted_v1"
CHAT_DISBANDED = "im.chat.disbanded_v1"     # the group was dissolved: as if the bot left
P2P_ENTERED = "im.chat.access_event.bot_p2p_chat_entered_v1"
CARD_ACTION = "card.action.trigger"


class RecalledEvent(_Wire):
    message_id: str
    chat_id: str = ""
    recall_time: str = "0"
    recall_type: str = ""


class ChatMemberBotEvent(_Wire):
    """bot.added_v1 / bot.deleted_v1 (lark_oapi P2ImChatMemberBotAddedV1Data); also
    im.chat.disbanded_v1 (P2ImChatDisbandedV1Data: the same chat_id / operator_id / name)."""
    chat_id: str
    operator_id: UserId = Field(default_factory=UserId)
    name: str = ""
    external: bool = False


class P2pEnteredEvent(_Wire):
    chat_id: str
    operator_id: UserId = Field(default_factory=UserId)
    last_message_id: str = ""


class CardOperator(_Wire):
    open_id: str = ""
    user_id: str | None = ""


class CardAction(_Wire):
    value: dict = Field(default_factory=dict)
    tag: str = ""
    name: str = ""                                        # the button's name (a form's submit)
    form_value: dict = Field(default_factory=dict)        # a form's inputs by name, on submit

    @field_validator("form_value", mode="before")
    @classmethod
    def _no_form(cls, v: object) -> object:
        return v if isinstance(v, dict) else {}

    @field_validator("value", mode="before")
    @classmethod
    def _foreign_value(cls, v: object) -> object:
        # Another app's (or an old-style) card may send ``value`` as a string: not one of
        # Ethan's buttons, so an empty value — ignored quietly, not an invalid event.
        return v if isinstance(v, dict) else {}


class CardContext(_Wire):
    open_message_id: str = ""
    open_chat_id: str = ""


class CardActionEvent(_Wire):
    """card.action.trigger (lark_oapi P2CardActionTriggerData): a click on the bot's card."""
    operator: CardOperator = Field(default_factory=CardOperator)
    token: str = ""
    action: CardAction = Field(default_factory=CardAction)
    context: CardContext = Field(default_factory=CardContext)


@dataclass(frozen=True, slots=True)
class Routing:
    """Where an event goes: the inbox row's ids and the mailbox that handles it in order."""

    chat_id: str
    conv_key: str
    message_id: str | None       # the message it is about (None: not about one)
    dedup_key: str | None        # unique per *event about* something; None: event_id alone
    create_time: float           # s; 0 when the event does not say


@dataclass(frozen=True, slots=True)
class EventSpec:
    """One row of the registry: how an event type is parsed (``model``), where it goes
    (``route``) and what it becomes inside (``translate`` → an ``event``: the neutral type the
    core's handler table, bot/core/lifecycle.py ``HANDLERS``, or the handler's message path takes)."""

    event_type: str
    model: type[_Wire]
    route: Callable[[Any, Header], Routing]
    event: type                  # Inbound | a bot.core.lifecycle event
    translate: Callable[..., Any]   # (body, header, bot_open_id) -> event


@dataclass(frozen=True, slots=True)
class LarkEvent:
    """One Lark event, decoded: the spec of its type, its header and its validated body."""

    spec: EventSpec
    header: Header
    body: Any                    # the spec's model, frozen

    @property
    def is_message(self) -> bool:
        return self.spec.event is Inbound

    @property
    def in_thread(self) -> bool:
        """A message posted in a thread (its answers go there too)."""
        return self.is_message and bool(self.body.message.thread_id)

    def translate(self, bot_open_id: str = "") -> Any:
        return self.spec.translate(self.body, self.header, bot_open_id)


def _ms(value: str | None) -> float:
    return epoch_seconds(value)


def _route_message(ev: MessageEvent, h: Header) -> Routing:
    msg = ev.message
    return Routing(msg.chat_id, conversation_key(msg.chat_id, msg.thread_id or ""), msg.message_id,
                   f"msg:{msg.message_id}", _ms(msg.create_time) or _ms(h.create_time))


def _route_recall(ev: RecalledEvent, h: Header) -> Routing:
    # The recalled message's own conversation is not in the event (no thread id): the chat's
    # mailbox is close enough — the handler finds the message's session by its id.
    # Deduplicated per (message, chat): a recall naming the wrong chat is refused by the
    # handler and must not swallow the real one.
    return Routing(ev.chat_id, conversation_key(ev.chat_id, ""), ev.message_id,
                   f"recall:{ev.message_id}:{ev.chat_id}", _ms(h.create_time))


def _route_chat(ev: Any, h: Header) -> Routing:
    return Routing(ev.chat_id, conversation_key(ev.chat_id, ""), None, None, _ms(h.create_time))


def _route_card(ev: CardActionEvent, h: Header) -> Routing:
    chat = ev.context.open_chat_id
    # One row per click (the token is per click); a redelivered click is the same event_id.
    return Routing(chat, conversation_key(chat, ""), ev.context.open_message_id or None, None,
                   _ms(h.create_time))


# -- translation: Lark's body → the neutral event (the adapter translates, the core decides) --

def _message(ev: MessageEvent, h: Header, bot_open_id: str) -> Inbound:
    return message_inbound(h, ev, bot_open_id=bot_open_id)


def _recalled(ev: RecalledEvent, h: Header, _bot: str) -> core.Recalled:
    return core.Recalled(message_id=ev.message_id, chat_id=ev.chat_id)


def _added(ev: ChatMemberBotEvent, h: Header, _bot: str) -> core.BotAdded:
    return core.BotAdded(chat_id=ev.chat_id, operator_id=ev.operator_id.open_id, name=ev.name)


def _removed(ev: ChatMemberBotEvent, h: Header, _bot: str) -> core.BotRemoved:
    return core.BotRemoved(chat_id=ev.chat_id, operator_id=ev.operator_id.open_id)


def _p2p(ev: P2pEnteredEvent, h: Header, _bot: str) -> core.P2pOpened:
    return core.P2pOpened(chat_id=ev.chat_id, operator_id=ev.operator_id.open_id)


def _clicked(ev: CardActionEvent, h: Header, _bot: str) -> core.ButtonClicked:
    # Ethan's confirm card carries {"ethan": confirm|cancel, "user": asker, "cmd": …, "chat_type": …}
    # (bot/lark/outbound/cards.py); any other value is a button the core does not decide.
    # The /memory card's buttons carry {"ethan": "memory", "op", "kind", "id", "user", "chat_type"};
    # its Save submits the form's input as action.form_value["text"] (bot/lark/outbound/memory_card.py).
    # "user" and "chat_type" are what the click claims: the card ledger decides (bot/commands/memory_clicks.py).
    value = ev.action.value or {}
    try:
        item_id = int(value.get("id", -1))
    except (TypeError, ValueError):
        item_id = -1
    return core.ButtonClicked(
        card_message_id=ev.context.open_message_id, chat_id=ev.context.open_chat_id,
        clicker=ev.operator.open_id, button=str(value.get("ethan") or ""),
        asked_by=str(value.get("user") or ""), command=str(value.get("cmd") or ""),
        chat_type=str(value.get("chat_type") or "p2p"), op=str(value.get("op") or "")[:16],
        item_kind=str(value.get("kind") or "")[:16], item_id=item_id,
        text=str((ev.action.form_value or {}).get("text") or "")[:2000])


REGISTRY: dict[str, EventSpec] = {s.event_type: s for s in (
    EventSpec(MESSAGE_RECEIVE, MessageEvent, _route_message, Inbound, _message),
    EventSpec(MESSAGE_RECALLED, RecalledEvent, _route_recall, core.Recalled, _recalled),
    EventSpec(BOT_ADDED, ChatMemberBotEvent, _route_chat, core.BotAdded, _added),
    EventSpec(BOT_DELETED, ChatMemberBotEvent, _route_chat, core.BotRemoved, _removed),
    EventSpec(CHAT_DISBANDED, ChatMemberBotEvent, _route_chat, core.BotRemoved, _removed),
    EventSpec(P2P_ENTERED, P2pEnteredEvent, _route_chat, core.P2pOpened, _p2p),
    EventSpec(CARD_ACTION, CardActionEvent, _route_card, core.ButtonClicked, _clicked),
)}
"""The one table of events Ethan handles (DESIGN.md §5): intake decodes and routes with it, the
handler's decoder translates with it, and the core's ``HANDLERS`` handles each ``event`` type
(tests/bot/test_event_routing.py). A type not in it is acknowledged and ignored."""


def decode(body: dict | str) -> LarkEvent | None:
    """The event decoded once: ``body`` is the verified JSON (a dict) or the stored payload (a
    str, parsed here with stdlib json: pydantic's parser stops at depth 200, an event intake
    took). None for a type not in the registry. Raises ``ValueError`` (pydantic's
    ``ValidationError`` is one) or ``RecursionError`` for an event that does not fit."""
    if isinstance(body, str):
        body = json.loads(body)
    return decode_envelope(Envelope.model_validate(body))


def decode_envelope(env: Envelope) -> LarkEvent | None:
    """``decode`` past the envelope (the intake logs a body that does not fit with its ids)."""
    spec = REGISTRY.get(env.header.event_type)
    if spec is None:
        return None
    return LarkEvent(spec, env.header, spec.model.model_validate(env.event))
