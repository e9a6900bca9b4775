"""Layer 2's rows and sizes, as both its readers see them: the working-memory view
(memory/working/view.py) and consolidation's store (memory/working/consolidation_store.py).

A *turn* is one user message and the assistant message(s) stored after it, up to the next user
message (a tool result is not a user message). ``MemoryConfig`` holds the layer's sizes; the
readers (``read_turns``, ``read_last_message``, ``read_warm``, ``read_meta``) are plain
functions a unit of work composes (``Database.read``: several SELECTs in one round trip).
They live here so that neither reader imports the other (tests/test_layers.py: no module
cycle): the view reads consolidation's record, and consolidation reads these rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from storage import Connection

GROUP_CHAT_TYPES = frozenset({"group"})
MAX_ID = 2**63 - 1              # above every message id (a 64-bit integer on both engines)


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    hot_size: int = 10          # turns always replayed verbatim (more while compression is due)
    compress_batch: int = 5     # turns per warm summary
    warm_capacity: int = 20     # warm turns absorbed before cold extraction + fold
    # Estimated tokens of replayed turns before a backlog (turns beyond hot_size +
    # compress_batch - 1, only there when consolidation is behind) is trimmed from the oldest.
    replay_budget: int = 24_000

    def __post_init__(self) -> None:
        if self.hot_size < 1 or self.compress_batch < 1 or self.warm_capacity < 1 or self.replay_budget < 1:
            raise ValueError("MemoryConfig sizes must be >= 1")


@dataclass(slots=True)
class Message:
    id: int
    role: str
    content: str
    sender_id: str = ""
    sender_name: str = ""
    lark_message_id: str = ""


@dataclass(slots=True)
class Turn:
    """One user message and the assistant answer(s) after it."""

    user: Message | None
    assistant: list[Message] = field(default_factory=list)

    @property
    def first_id(self) -> int:
        return self.user.id if self.user else self.assistant[0].id

    @property
    def last_id(self) -> int:
        return self.assistant[-1].id if self.assistant else self.user.id  # type: ignore[union-attr]

    @property
    def user_text(self) -> str:
        return self.user.content if self.user else ""

    @property
    def assistant_text(self) -> str:
        return "\n\n".join(m.content for m in self.assistant if m.content)

    @property
    def sender_id(self) -> str:
        return self.user.sender_id if self.user else ""

    @property
    def sender_name(self) -> str:
        return self.user.sender_name if self.user else ""

    @property
    def answered(self) -> bool:
        return bool(self.assistant)


@dataclass(frozen=True, slots=True)
class WarmSummary:
    id: int
    first_msg_id: int
    last_msg_id: int
    turns: int
    summary: str
    model: str


@dataclass(frozen=True, slots=True)
class SessionMeta:
    id: str
    conv_key: str
    chat_id: str
    thread_id: str
    chat_type: str
    closed_at: float | None

    @property
    def is_group(self) -> bool:
        return self.chat_type in GROUP_CHAT_TYPES


def _message(row: Any) -> Message:
    return Message(
        id=row["id"], role=row["role"], content=row["content"] or "",
        sender_id=row["sender_id"] or "", sender_name=row["sender_name"] or "",
        lark_message_id=row["lark_message_id"] or "",
    )


# -- plain functions run in a unit of work (Database.read / Database.write) -----------------
# They take the unit's connection and never touch the event loop.

def read_meta(conn: Connection, session_id: str) -> SessionMeta | None:
    row = conn.execute(
        "SELECT id, conv_key, chat_id, thread_id, chat_type, closed_at FROM sessions WHERE id = ?",
        (session_id,),
    ).fetchone()
    return session_meta(row) if row is not None else None


def session_meta(row: Any) -> SessionMeta:
    """A row with the sessions columns ``read_meta`` selects (also ``read_state_and_meta``'s)."""
    return SessionMeta(row["id"], row["conv_key"], row["chat_id"], row["thread_id"], row["chat_type"], row["closed_at"])


def read_warm(conn: Connection, session_id: str, upto_id: int | None = None) -> list[WarmSummary]:
    """Unfolded warm rows in order (optionally only those ending at or before upto_id)."""
    rows = conn.execute(
        "SELECT id, first_msg_id, last_msg_id, turns, summary, model FROM warm_summaries"
        " WHERE session_id = ? AND folded = 0 AND last_msg_id <= ? ORDER BY id",
        (session_id, MAX_ID if upto_id is None else upto_id),
    ).fetchall()
    return [WarmSummary(r["id"], r["first_msg_id"], r["last_msg_id"], r["turns"], r["summary"], r["model"])
            for r in rows]


def read_last_message(conn: Connection, session_id: str) -> Message | None:
    row = conn.execute(
        "SELECT id, role, content, sender_id, sender_name, lark_message_id FROM messages"
        " WHERE session_id = ? ORDER BY id DESC LIMIT 1",
        (session_id,),
    ).fetchone()
    return _message(row) if row else None


def read_message_rows(conn: Connection, session_id: str, after_id: int, before_id: int) -> list[Any]:
    """The rows of the messages in (after_id, before_id), in order (what ``group_turns`` reads)."""
    return conn.execute(
        "SELECT id, role, content, sender_id, sender_name, lark_message_id, tool_call_id FROM messages"
        " WHERE session_id = ? AND id > ? AND id < ? ORDER BY id",
        (session_id, after_id, before_id),
    ).fetchall()


def is_turn_start(row: Any) -> bool:
    """A user message that is not a tool result."""
    return row["role"] == "user" and row["tool_call_id"] is None


def group_turns(rows: list[Any]) -> list[Turn]:
    """Message rows (in order) as turns: each starts at a user message; a tool result is no turn."""
    turns: list[Turn] = []
    for row in rows:
        if is_turn_start(row):
            turns.append(Turn(user=_message(row)))
        elif row["role"] == "assistant":
            if not turns:
                turns.append(Turn(user=None))
            turns[-1].assistant.append(_message(row))
    return turns


def read_turns(conn: Connection, session_id: str, after_id: int, before_id: int) -> list[Turn]:
    """The turns made of the messages in (after_id, before_id)."""
    return group_turns(read_message_rows(conn, session_id, after_id, before_id))
