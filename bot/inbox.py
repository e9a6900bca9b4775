"""The inbox: every accepted Lark event is committed here before it is acknowledged.

It is also the dedup store that survives restarts: ``event_id`` and ``dedup_key`` (the
event's kind and the message it is about: ``msg:om_…``, ``recall:om_…``) are both unique,
so a redelivery (same event) or a re-send under a new event id (same message) is recognised
for as long as rows are kept (24 h > Lark's 8 h rule), while a later, different event about
the same message (its recall) is not mistaken for a duplicate.
"""

from __future__ import annotations

import asyncio
import sqlite3
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
    event_type: str = "im.message.receive_v1"   # the transport's event type (the registry's key)


class Inbox:
    def __init__(self, db: Database, *, clock=time.time) -> None:
        self.db = db
        self.clock = clock
        self._batch: list[tuple[tuple, asyncio.Future]] = []
        self._flusher: asyncio.Task | None = None

    async def accept(
        self, *, event_id: str, message_id: str | None, chat_id: str, conv_key: str,
        create_time: float, payload: str, status: str = "pending", note: str = "",
        event_type: str = "im.message.receive_v1", dedup_key: str | None = "",
    ) -> InboxItem | None:
        """Store the event (committed when this returns); None when it (or its message) was
        seen before.

        Group commit: events arriving while an earlier commit is on its way to the SQLite
        thread are committed together, in arrival order, in one transaction and one round
        trip — under a burst (Lark redelivering after an outage, a busy group) the cost per
        acknowledgement falls instead of every event queueing for its own BEGIN … COMMIT."""
        if dedup_key == "":     # the caller did not say: a new message's key
            dedup_key = f"msg:{message_id}" if message_id else None
        row = (event_id, message_id, chat_id, conv_key, create_time, self.clock(), payload, status, note,
               event_type, dedup_key)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._batch.append((row, future))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush())
        rowid = await future
        if rowid is None:
            return None
        return InboxItem(rowid, event_id, message_id, chat_id, conv_key, create_time, row[5],
                         payload, status, 0, event_type)

    async def _flush(self) -> None:
        try:
            while self._batch:
                batch, self._batch = self._batch, []
                try:
                    ids = await self.db.write(_insert_rows, [row for row, _ in batch])
                except BaseException as e:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(e if isinstance(e, Exception) else RuntimeError("inbox closed"))
                    if not isinstance(e, Exception):
                        raise
                    continue
                for (_, future), rowid in zip(batch, ids):
                    if future.done():
                        continue
                    if isinstance(rowid, Exception):
                        future.set_exception(rowid)     # -> webhook.store_failed, 503: not "duplicate"
                    else:
                        future.set_result(rowid)
        finally:
            self._flusher = None

    async def start(self, item_id: int) -> bool:
        """Count an attempt; False when the row is no longer pending (a recall cancelled it
        while it waited in its mailbox)."""
        return await self.db.execute(
            "UPDATE inbox SET attempts = attempts + 1 WHERE id = ? AND status = 'pending'", (item_id,)) > 0

    async def finish(self, item_id: int, status: str, note: str = "") -> None:
        await self.db.execute("UPDATE inbox SET status = ?, note = ?, done_at = ? WHERE id = ?",
                              (status, note[:500], self.clock(), item_id))

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

def _insert_rows(conn, rows: list[tuple]) -> list[int | None]:
    """In the SQLite thread: insert each row unless its event or message is known.

    ``ON CONFLICT DO NOTHING`` skips only uniqueness conflicts (the duplicates); ``INSERT OR
    IGNORE`` also swallowed NOT NULL and CHECK failures, so a NaN create_time (stored as NULL)
    made a new message look like a duplicate and vanish."""
    out: list[int | None | Exception] = []
    for row in rows:
        try:
            cur = conn.execute(
                "INSERT INTO inbox(event_id, message_id, chat_id, conv_key, create_time,"
                " received_at, payload, status, note, event_type, dedup_key)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING", row)
        except sqlite3.IntegrityError as e:
            # This row only (SQLite undoes the one statement): the rest of the group commits.
            out.append(e)
            continue
        out.append(cur.lastrowid if cur.rowcount else None)
    return out


def _item(row) -> InboxItem:
    return InboxItem(row["id"], row["event_id"], row["message_id"], row["chat_id"], row["conv_key"],
                     row["create_time"], row["received_at"], row["payload"], row["status"],
                     row["attempts"], row["event_type"])
