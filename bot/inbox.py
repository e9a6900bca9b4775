"""The inbox: every accepted Lark event is committed here before it is acknowledged.

It is also the dedup store that survives restarts: ``event_id`` and ``message_id``
are both unique, so a redelivery (same event) or a re-send under a new event id
(same message) is recognised for as long as rows are kept (24 h > Lark's 8 h rule).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from memory.db import Database

KEEP_SECONDS = 24 * 3600
STALE_SECONDS = 30 * 60


@dataclass(frozen=True, slots=True)
class InboxItem:
    id: int
    event_id: str
    message_id: str | None
    chat_id: str
    conv_key: str
    create_time: float
    received_at: float
    payload: str
    status: str
    attempts: int


class Inbox:
    def __init__(self, db: Database, *, clock=time.time) -> None:
        self.db = db
        self.clock = clock

    async def accept(
        self, *, event_id: str, message_id: str | None, chat_id: str, conv_key: str,
        create_time: float, payload: str, status: str = "pending", note: str = "",
    ) -> InboxItem | None:
        """Store the event; None when it (or its message) was seen before."""
        now = self.clock()
        async with self.db.transaction() as tx:
            cur = await tx.execute(
                "INSERT OR IGNORE INTO inbox(event_id, message_id, chat_id, conv_key, create_time,"
                " received_at, payload, status, note) VALUES (?,?,?,?,?,?,?,?,?)",
                (event_id, message_id, chat_id, conv_key, create_time, now, payload, status, note),
            )
            if cur.rowcount == 0:
                return None
            rowid = cur.lastrowid
        return InboxItem(rowid, event_id, message_id, chat_id, conv_key, create_time, now,
                         payload, status, 0)

    async def get(self, item_id: int) -> InboxItem | None:
        row = await self.db.fetchone("SELECT * FROM inbox WHERE id = ?", (item_id,))
        return _item(row) if row else None

    async def start(self, item_id: int) -> None:
        await self.db.execute("UPDATE inbox SET attempts = attempts + 1 WHERE id = ?", (item_id,))

    async def finish(self, item_id: int, status: str, note: str = "") -> None:
        await self.db.execute(
            "UPDATE inbox SET status = ?, note = ?, done_at = ? WHERE id = ?",
            (status, note[:500], self.clock(), item_id),
        )

    async def pending(self, *, max_age: float = STALE_SECONDS) -> list[InboxItem]:
        """Acknowledged but unanswered events young enough to answer, oldest first."""
        cutoff = self.clock() - max_age
        rows = await self.db.fetchall(
            "SELECT * FROM inbox WHERE status = 'pending' AND create_time >= ? ORDER BY id",
            (cutoff,),
        )
        return [_item(r) for r in rows]

    async def expire_stale(self, *, max_age: float = STALE_SECONDS) -> int:
        """Pending events too old to answer now are marked ignored (logged by the caller)."""
        cutoff = self.clock() - max_age
        return await self.db.execute(
            "UPDATE inbox SET status = 'ignored', note = 'stale at restart', done_at = ?"
            " WHERE status = 'pending' AND create_time < ?",
            (self.clock(), cutoff),
        )

    async def prune(self, *, keep: float = KEEP_SECONDS) -> int:
        return await self.db.execute(
            "DELETE FROM inbox WHERE status != 'pending' AND received_at < ?", (self.clock() - keep,)
        )

    async def counts(self) -> dict[str, int]:
        rows = await self.db.fetchall("SELECT status, COUNT(*) AS n FROM inbox GROUP BY status")
        return {r["status"]: r["n"] for r in rows}


def _item(row) -> InboxItem:
    return InboxItem(row["id"], row["event_id"], row["message_id"], row["chat_id"], row["conv_key"],
                     row["create_time"], row["received_at"], row["payload"], row["status"],
                     row["attempts"])
