"""Lark event wire models and the event registry, parsed once at the edge (schema 2.0).

Everything inside the bot works on the frozen ``Inbound`` dataclass built from these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, field_validator

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
    event_type: str
    model: type[_Wire]
    route: Callable[[Any, Header], Routing]
    kind: str                    # message | recall | joined | left | p2p_entered | card_action


def _ms(value: str | None) -> float:
    from bot.lark.normalize import epoch_seconds
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


REGISTRY: dict[str, EventSpec] = {s.event_type: s for s in (
    EventSpec(MESSAGE_RECEIVE, MessageEvent, _route_message, "message"),
    EventSpec(MESSAGE_RECALLED, RecalledEvent, _route_recall, "recall"),
    EventSpec(BOT_ADDED, ChatMemberBotEvent, _route_chat, "joined"),
    EventSpec(BOT_DELETED, ChatMemberBotEvent, _route_chat, "left"),
    EventSpec(CHAT_DISBANDED, ChatMemberBotEvent, _route_chat, "left"),
    EventSpec(P2P_ENTERED, P2pEnteredEvent, _route_chat, "p2p_entered"),
    EventSpec(CARD_ACTION, CardActionEvent, _route_card, "card_action"),
)}
"""The one table of events Ethan handles (DESIGN.md §5): intake parses and routes with it,
the handler dispatches with it. A type not in it is acknowledged and ignored."""


def parse(env: Envelope) -> tuple[EventSpec, Any] | None:
    """The event's spec and parsed body; None for a type not in the registry. Raises
    pydantic's ValidationError when the body does not fit the type's model."""
    spec = REGISTRY.get(env.header.event_type)
    if spec is None:
        return None
    return spec, spec.model.model_validate(env.event)
