"""The audit table: every admin action (and every refused attempt), who, what, when, target.

Rows are append-only; nothing in Ethan updates or deletes them — not even an erase
(``memory/governance/erase.py``): the audit row of ``/reset user`` names the erased user's open_id,
and it is the one place that id remains, on purpose, so an operator can account for who
erased whom and when. Detail is free text kept short; it never carries message content.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from storage import Database

MAX_DETAIL_CHARS = 500


@dataclass(frozen=True, slots=True)
class AuditRecord:
    id: int
    at: float
    actor: str
    action: str
    target: str
    chat_id: str
    detail: str
    allowed: bool


def _record(row: Any) -> AuditRecord:
    return AuditRecord(id=row["id"], at=row["at"], actor=row["actor"], action=row["action"],
                       target=row["target"], chat_id=row["chat_id"], detail=row["detail"],
                       allowed=bool(row["allowed"]))


class AuditLog:
    def __init__(self, db: Database, *, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.clock = clock

    async def record(self, actor: str, action: str, target: str = "", chat_id: str = "",
                     detail: str = "", allowed: bool = True, channel: str = "") -> int:
        """Append one row; returns its id. ``channel``: how the actor reached Ethan when it is not
        Lark itself (``/chat``: an operator's token speaking for ``actor``), kept in ``detail``."""
        if channel and channel != "lark":
            detail = f"[channel: {channel}] {detail}".strip()
        return await self.db.execute(
            "INSERT INTO audit(at, actor, action, target, chat_id, detail, allowed) VALUES (?,?,?,?,?,?,?)",
            (self.clock(), actor or "", action, target or "", chat_id or "",
             (detail or "")[:MAX_DETAIL_CHARS], 1 if allowed else 0),
        )

    async def recent(self, limit: int = 50, *, actor: str | None = None) -> list[AuditRecord]:
        """Newest first (optionally one actor's)."""
        if actor is None:
            rows = await self.db.fetchall(
                "SELECT * FROM audit ORDER BY id DESC LIMIT ?", (max(0, int(limit)),))
        else:
            rows = await self.db.fetchall(
                "SELECT * FROM audit WHERE actor = ? ORDER BY id DESC LIMIT ?", (actor, max(0, int(limit))))
        return [_record(r) for r in rows]


async def record(db: Database, actor: str, action: str, target: str = "", chat_id: str = "",
                 detail: str = "", allowed: bool = True) -> int:
    """Shorthand for ``AuditLog(db).record(...)``."""
    return await AuditLog(db).record(actor, action, target, chat_id, detail, allowed)
