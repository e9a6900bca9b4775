"""The transport-neutral inbound message: who, where, what — and the ids its transport needs
to route the answer back.

Every interface has an adapter that only translates its own input into an ``Inbound``
(Lark's events: ``bot/lark/normalize.py``; the console playground, the terminal chat and the
``/chat`` Web API build theirs from their request). The handler, the commands and the agent
see nothing else, so a feature is written once for all interfaces, and none of them needs
Lark's wire format.

``conv_key`` (``memory.scope.conversation_key``) is the one name of a conversation:
sessions, hot and warm zones, dispatch mailboxes and modes all key off it. Each adapter picks
chat ids that cannot collide with another interface's (``oc_…`` from Lark, ``oc_console_…``,
``oc_cli_…``, ``api_…``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from bot.core.text import clean_text
from memory.scope import Scope, conversation_key

BOT_SENDER_TYPES = frozenset({"bot", "app"})
MAX_TEXT_CHARS = 20_000      # what the model reads of one message; the rest is cut (and said so)

# Which adapter made the message (and so whose Reply answers it).
LARK, CONSOLE, TERMINAL, WEB_API = "lark", "console", "terminal", "chat"
CHANNEL = {LARK: "lark", CONSOLE: "console", TERMINAL: "terminal", WEB_API: "/chat"}   # as audited


class NotAMessage(Exception):
    """Raised by a transport's decoder: the stored item is no message to answer (the reason)."""


@dataclass(frozen=True, slots=True)
class Attachment:
    """An image, file, voice message or video that came with the message (Lark: images, files,
    a merged forward, voice; video is still answered politely)."""

    kind: str                 # image | file | audio | video
    ref: str                  # the transport's handle to fetch it (Lark image_key/file_key, a URL)
    name: str = ""
    mime_type: str = ""
    size: int = 0             # bytes, 0 when unknown
    seconds: float = 0.0      # a voice message's declared length, 0 when unknown


@dataclass(frozen=True, slots=True)
class Mention:
    key: str                  # the placeholder in the transport's text ("@_user_1"), "" if none
    open_id: str              # the mentioned user's id in the transport
    name: str
    kind: str                 # user | bot | all


MATERIAL_KINDS = frozenset({"forward", "file", "document", "quoted", "group", "tool"})


@dataclass(frozen=True, slots=True)
class Material:
    """Text that came with a message but is not the sender's own words — a forwarded message,
    a file's or document's text, a quoted message, group discussion, a tool's result. It
    reaches the model fenced as data (``bot.agent.prompt.fence_material``) and is never a
    source of the sender's facts or profile (memory/text/untrusted.py)."""

    kind: str                 # one of MATERIAL_KINDS
    source: str = ""          # where it came from: a file name, a message id, a tool name
    author: str = ""          # who wrote it (display name), "" when unknown
    when: str = ""            # ISO time, "" when unknown
    text: str = ""


@dataclass(frozen=True, slots=True)
class Inbound:
    transport: str            # lark | console | terminal | chat
    message_id: str           # the transport's id: dedup, provenance, the reply's target
    chat_id: str
    chat_type: str            # p2p | group
    sender_id: str
    text: str                 # readable text, the bot's own mention stripped; "" when unreadable
    thread_id: str = ""       # a topic thread inside the chat (its own conversation)
    root_id: str = ""         # the thread's first message, when the transport says
    parent_id: str = ""       # the message this one replies to (quotes), when the transport says
    event_id: str = ""        # the transport's delivery id (Lark's event_id), for logs
    sender_type: str = "user"
    sender_name: str = ""
    # The sender belongs to the organisation the bot serves (Lark: the sender's tenant is the
    # event's). False where the transport cannot say, and for an external member of a shared
    # group: what the organisation shares (a document's organisation-wide link) is not theirs.
    sender_in_org: bool = False
    message_type: str = "text"   # the transport's type; anything but text/post has no text yet
    truncated: bool = False      # text was cut at the adapter's limit for the model
    attachments: tuple[Attachment, ...] = ()
    mentions: tuple[Mention, ...] = ()
    mentions_bot: bool = False
    mentions_all: bool = False
    create_time: float = 0.0     # seconds since epoch, as the transport reports
    content_error: str = ""      # why content could not be read, for the log
    material: tuple[Material, ...] = ()   # third-party text with the message (fenced as data)
    as_admin: bool = False       # /chat: the caller asked for admin rights explicitly
    language: str = ""           # zh | en: the user's, set by the handler (polite answers, post locale)

    @property
    def conv_key(self) -> str:
        return conversation_key(self.chat_id, self.thread_id)

    @property
    def from_bot(self) -> bool:
        return self.sender_type in BOT_SENDER_TYPES

    @property
    def in_thread(self) -> bool:
        return bool(self.thread_id)

    def admin(self, is_admin: Callable[[str], bool]) -> bool:
        """Admin rights for this message: the sender is in ETHAN_ADMINS and — over ``/chat``,
        where the token holder names any user — the request asked for them (``as_admin``)."""
        return is_admin(self.sender_id) and (self.transport != WEB_API or self.as_admin)

    def scope(self, *, is_admin: bool) -> Scope:
        return Scope(user_id=self.sender_id, chat_id=self.chat_id, chat_type=self.chat_type,
                     thread_id=self.thread_id, message_id=self.message_id, is_admin=is_admin)


def typed_message(*, transport: str, message_id: str, chat_id: str, sender_id: str, text: str,
                  chat_type: str = "p2p", thread_id: str = "", sender_name: str = "",
                  mentions: tuple[Mention, ...] = (), mentions_bot: bool = False,
                  now: float | None = None) -> Inbound:
    """A text message typed into one of Ethan's own interfaces (console, terminal, /chat),
    cleaned and cut like a Lark message's text."""
    text = clean_text(text)
    truncated = len(text) > MAX_TEXT_CHARS
    return Inbound(transport=transport, message_id=message_id, chat_id=chat_id, chat_type=chat_type,
                   sender_id=sender_id, text=text[:MAX_TEXT_CHARS] if truncated else text,
                   thread_id=thread_id, sender_name=sender_name, truncated=truncated,
                   mentions=mentions, mentions_bot=mentions_bot,
                   create_time=time.time() if now is None else now)
