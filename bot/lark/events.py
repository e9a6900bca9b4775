"""Lark event wire models, parsed once at the edge (schema 2.0, im.message.receive_v1).

Everything inside the bot works on the frozen ``Inbound`` dataclass built from these.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


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
