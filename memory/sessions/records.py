"""Layer 1's values: a session, a stored message and what the store's calls return, its two
errors, and how a database row becomes each (the column lists the store's SQL selects).

Apart from the store because every reader of sessions (commands, the console, the terminal,
erase, search) needs these shapes and none of the store's SQL.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

TITLE_CHARS = 40


# -- values ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SessionInfo:
    id: str
    title: str
    model: str
    conv_key: str
    chat_id: str
    thread_id: str
    chat_type: str
    owner_id: str
    created_at: float
    updated_at: float
    closed_at: float | None
    message_count: int
    user_turns: int

    @property
    def is_open(self) -> bool:
        return self.closed_at is None

    @property
    def tail(self) -> str:
        """The short id users type (`/resume d139`)."""
        return self.id[-4:]


@dataclass(frozen=True, slots=True)
class StoredMessage:
    id: int
    session_id: str
    role: str                 # user | assistant
    content: str
    tool_calls: Any | None    # parsed JSON, as given to append_assistant
    tool_call_id: str | None
    sender_id: str
    sender_name: str
    lark_message_id: str | None
    created_at: float


@dataclass(frozen=True, slots=True)
class AppendResult:
    session: SessionInfo
    message: StoredMessage
    created: bool             # the session was started by this message
    duplicate: bool           # lark_message_id was already stored; nothing was written
    closed: SessionInfo | None  # the idle session closed on the way (already notified)


@dataclass(frozen=True, slots=True)
class StoredAnswer:
    """How a message stored earlier stands (``answer_of``): a redelivered message is answered
    from this, never by asking the model a second time.

    An answer covers every user message between the answer before it and itself: a turn
    reads the unanswered messages before its own (a turn that failed after storing its
    message, answered later) merged with it, so one answer can answer several messages."""

    answer: StoredMessage | None    # the answer that covered the message, if there is one yet
    own: bool                       # it replied to this message: replay it (same uuid)
    # No answer yet: the user messages stored after this one (their turns failed too); an
    # answer to this message reads them as well, so it covers them.
    later: tuple[StoredMessage, ...] = ()


@dataclass(frozen=True, slots=True)
class MessagesErased:
    messages: int             # messages removed (the user's, and the replies to them)
    sessions: int             # sessions removed because no user message was left


# -- errors ------------------------------------------------------------------------------
class SessionNotFound(LookupError):
    def __init__(self, ref: str, detail: str = "") -> None:
        self.ref = ref
        super().__init__(detail or f"no session matches {ref!r}")


class AmbiguousSession(LookupError):
    def __init__(self, ref: str, candidates: Sequence[SessionInfo], total: int | None = None) -> None:
        self.ref = ref
        self.candidates = list(candidates)
        self.total = total if total is not None else len(self.candidates)
        ids = ", ".join(c.id for c in self.candidates)
        more = f" and {self.total - len(self.candidates)} more" if self.total > len(self.candidates) else ""
        super().__init__(f"{ref!r} matches {self.total} sessions: {ids}{more}; type more of the id")


# -- helpers -----------------------------------------------------------------------------
def make_title(content: str) -> str:
    """The first 40 characters of the first user message, whitespace collapsed."""
    return " ".join(content.split())[:TITLE_CHARS]


_SESSION_COLS = (
    "s.id, s.title, s.model, s.conv_key, s.chat_id, s.thread_id, s.chat_type, s.owner_id, "
    "s.created_at, s.updated_at, s.closed_at, s.message_count, s.user_turns"
)
_MESSAGE_COLS = (
    "m.id, m.session_id, m.role, m.content, m.tool_calls, m.tool_call_id, m.sender_id, "
    "m.sender_name, m.lark_message_id, m.created_at"
)
_MESSAGE_RETURNING = _MESSAGE_COLS.replace("m.", "")     # the same columns, as INSERT … RETURNING names them
_SESSION_FIELDS = [c.strip()[2:] for c in _SESSION_COLS.split(",")]


def _session(row: Any) -> SessionInfo:
    return SessionInfo(
        id=row["id"], title=row["title"], model=row["model"], conv_key=row["conv_key"],
        chat_id=row["chat_id"], thread_id=row["thread_id"], chat_type=row["chat_type"],
        owner_id=row["owner_id"], created_at=row["created_at"], updated_at=row["updated_at"],
        closed_at=row["closed_at"], message_count=row["message_count"], user_turns=row["user_turns"],
    )


def _message(row: Any) -> StoredMessage:
    tool_calls = row["tool_calls"]
    return StoredMessage(
        id=row["id"], session_id=row["session_id"], role=row["role"], content=row["content"],
        tool_calls=json.loads(tool_calls) if tool_calls is not None else None,
        tool_call_id=row["tool_call_id"], sender_id=row["sender_id"],
        sender_name=row["sender_name"], lark_message_id=row["lark_message_id"],
        created_at=row["created_at"],
    )
