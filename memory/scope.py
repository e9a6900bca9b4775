"""Whose memory a request may read or write, fixed by the event, never by the model.

``conversation_key`` is the one function that names a conversation; everything
per-conversation (sessions, hot and warm zones, dispatch mailboxes, modes) keys off it.
"""

from __future__ import annotations

from dataclasses import dataclass

PRIVATE_CHAT_TYPES = frozenset({"p2p"})


def conversation_key(chat_id: str, thread_id: str = "") -> str:
    """A chat, or a topic thread inside it, is one conversation."""
    return f"{chat_id}#{thread_id}" if thread_id else chat_id


@dataclass(frozen=True, slots=True)
class Scope:
    user_id: str            # the speaking user's open_id
    chat_id: str
    chat_type: str          # p2p | group
    thread_id: str = ""
    message_id: str = ""    # the Lark message that caused the write (provenance)
    is_admin: bool = False

    @property
    def conv_key(self) -> str:
        return conversation_key(self.chat_id, self.thread_id)

    @property
    def is_private(self) -> bool:
        """True where the user's private (p2p-learned) memory may be shown."""
        return self.chat_type in PRIVATE_CHAT_TYPES

    @property
    def new_visibility(self) -> str:
        """Visibility for memory learned here: p2p-learned memory stays private."""
        return "private" if self.is_private else "shared"

    def visible_sql(self, column: str = "visibility") -> str:
        """SQL predicate for rows this scope may read (always combined with the owner filter)."""
        return "1=1" if self.is_private else f"{column} = 'shared'"
